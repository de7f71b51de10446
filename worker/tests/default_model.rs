//! The engine on the bundled default model (SmolLM2-135M-Instruct, Q4_1): correct answers, batch invariance,
//! cancellation. The model is fetched into the cache by scripts/test (or here, once, if missing).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::sync::OnceLock;

use zl_text::ChatMessage;

mod common;

use zl_worker::device::Device;
use zl_worker::engine::{EngineCore, Event, Request};
use zl_worker::fetch;
use zl_worker::kv::window::KvLayout;
use zl_worker::model::{LoadedModel, gguf};
use zl_worker::sampling::Sampling;
use zl_worker::scheduler::SchedulerConfig;

fn model_path() -> std::path::PathBuf {
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    PATH.get_or_init(|| fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap()).clone()
}

fn load() -> LoadedModel {
    gguf::load(&model_path()).unwrap()
}

/// On the CPU, or on the device `ZL_TEST_DEVICE` names (scripts/gpu-check runs these tests on a GPU).
fn engine() -> EngineCore {
    let device = Device::from_env("ZL_TEST_DEVICE").unwrap();
    EngineCore::on_device(load(), device, KvLayout::full(512), 16, SchedulerConfig::default()).unwrap()
}

fn chat(engine: &EngineCore, user: &str) -> Vec<u32> {
    // zl chat's default system prompt. Without one the GGUF's template injects SmolLM's own ("You are a helpful AI
    // assistant named SmolLM, ..."), after which this 135M model answers the France question with French
    // landmarks, on the float reference path too.
    common::chat_prompt(&engine.model().tokenizer, "You are a helpful assistant.", user)
}

#[test]
fn greedy_answer_names_paris() {
    let mut e = engine();
    let prompt = chat(&e, "What is the capital of France?");
    e.add(1, Request::new(prompt, Sampling::greedy(), 24)).unwrap();
    let out = common::run_all(&mut e);
    let text = &out[&1].1;
    assert!(text.contains("Paris"), "answer was {text:?}");
}

#[test]
fn a_request_gets_the_same_tokens_alone_and_in_a_batch_of_sixteen() {
    let target = |e: &EngineCore| Request {
        prompt: chat(e, "Write a short poem about the sea."),
        sampling: Sampling { temperature: 0.8, top_p: 0.95, top_k: 50, seed: 1234 },
        max_tokens: 20,
        stop_sequences: vec![],
        // Logprobs too: bit-identical logits give bit-identical log-probabilities.
        logprobs: true,
        top_logprobs: 4,
        prompt_logprobs: false,
        think: None,
        penalties: None,
        speculate: 0,
        constraint: None,
        cache_salt: None,
        resume: vec![],
        adapter: None,
    };
    let mut alone = engine();
    let req = target(&alone);
    alone.add(0, req).unwrap();
    let solo = common::run_all(&mut alone).remove(&0).unwrap().0;

    let mut busy = engine();
    let topics = ["cats", "the moon", "rust", "bread", "rain", "chess", "maps", "tea"];
    for i in 1..=16u64 {
        let prompt = chat(&busy, &format!("Tell me {} facts about {}.", i, topics[i as usize % topics.len()]));
        let sampling = Sampling { temperature: 0.5 + (i as f32) / 40.0, top_p: 0.9, top_k: 0, seed: i };
        busy.add(i, Request::new(prompt, sampling, 8 + i as u32)).unwrap();
    }
    let req = target(&busy);
    busy.add(0, req).unwrap();
    let batched = common::run_all(&mut busy).remove(&0).unwrap().0;
    assert_eq!(solo, batched, "batching changed the tokens");
}

#[test]
fn cancelling_returns_every_block_to_the_pool() {
    let mut e = engine();
    let prompt = chat(&e, "Count from one to one hundred.");
    e.add(7, Request::new(prompt, Sampling::greedy(), 200)).unwrap();
    for _ in 0..3 {
        e.step();
    }
    let before = e.stats().kv.unwrap();
    assert!(before.used > 0);
    e.cancel(7);
    let after = e.stats().kv.unwrap();
    assert_eq!(after.used, 0);
    assert_eq!(after.free + after.cached, after.total);
    assert!(!e.has_work());
}

#[test]
fn the_tokenizer_a_frontend_rebuilds_from_the_card_matches_the_workers() {
    let model = load();
    let tok = &model.tokenizer;
    let again = zl_text::TextTokenizer::from_parts(&tok.to_parts().unwrap()).unwrap();
    for text in ["What is the capital of France?", "  spaces, digits 12345 and ünïcödé 中文 👍\n\ttabs", ""] {
        let messages = [ChatMessage { role: "user".into(), content: text.into() }];
        let prompt = tok.render_chat(&messages).unwrap();
        assert_eq!(again.render_chat(&messages).unwrap(), prompt);
        assert_eq!(again.encode(&prompt).unwrap(), tok.encode(&prompt).unwrap(), "{prompt:?}");
    }
    assert_eq!(again.stop_ids, tok.stop_ids);
}

/// Each sequence's output events in order (token, log-probability, text; how it ended), and its draft counts.
type Transcript = (HashMap<u64, Vec<String>>, HashMap<u64, (u32, u32)>);

/// Every output event of a run, in order, per sequence: tokens, texts and how it ended (draft counts aside).
fn transcript(engine: &mut EngineCore) -> Transcript {
    let (mut out, mut drafts): Transcript = Default::default();
    for _ in 0..10_000 {
        if !engine.has_work() {
            break;
        }
        for ev in engine.step() {
            match ev {
                Event::Token { seq, token, logprob, text } => {
                    out.entry(seq).or_default().push(format!("{token} {logprob:?} {text:?}"))
                }
                Event::Prompt { seq, start, tokens, logprobs } => {
                    out.entry(seq).or_default().push(format!("prompt {start} {tokens:?} {logprobs:?}"))
                }
                Event::Finished {
                    seq,
                    reason,
                    stop_sequence,
                    text,
                    output_tokens,
                    draft_tokens,
                    accepted_draft_tokens,
                    ..
                } => {
                    out.entry(seq).or_default().push(format!("{reason:?} {stop_sequence:?} {text:?} {output_tokens}"));
                    drafts.insert(seq, (draft_tokens, accepted_draft_tokens));
                }
            }
        }
    }
    assert!(!engine.has_work(), "engine did not finish");
    (out, drafts)
}

/// A request whose answer repeats its prompt: prompt lookup drafts well.
fn copy_request(engine: &EngineCore, sampling: Sampling, max_tokens: u32, speculate: usize) -> Request {
    let text = "The quick brown fox jumps over the lazy dog. The lazy dog sleeps in the warm sun all day long.";
    Request {
        stop_sequences: vec!["all day long.\n\n\n".into()],
        logprobs: true,
        top_logprobs: 3,
        speculate,
        ..Request::new(chat(engine, &format!("Repeat this text exactly, twice: {text}")), sampling, max_tokens)
    }
}

#[test]
fn draft_counts_stay_consistent_after_prefix_cache_hits() {
    // "Say 11." answers "11." and ends: a second run starts from cached blocks, so its last prefill chunk is short
    // and its tokens once looked like accepted drafts to the verifier (and the worker sent an invalid Finish).
    let mut e = engine();
    for (round, speculate) in [(0u64, 0), (1, 0), (2, 8), (3, 8)] {
        e.add(round, Request { speculate, max_tokens: 4, ..copy_request(&e, Sampling::greedy(), 4, 0) }).unwrap();
        let prompt = chat(&e, "Say 11.");
        e.add(10 + round, Request { prompt, speculate, ..copy_request(&e, Sampling::greedy(), 4, 0) }).unwrap();
        let (_, drafts) = transcript(&mut e);
        for (seq, (drafted, accepted)) in drafts {
            assert!(accepted <= drafted, "seq {seq}: {accepted} of {drafted}");
            if speculate == 0 {
                assert_eq!((drafted, accepted), (0, 0), "seq {seq}");
            }
        }
    }
}

#[test]
fn predictive_streaming_changes_no_byte_of_the_output_alone_or_batched() {
    let seeded = Sampling { temperature: 0.7, top_p: 0.95, top_k: 40, seed: 99 };
    for sampling in [Sampling::greedy(), seeded] {
        // Alone: without speculation, then with it.
        let run_alone = |speculate| {
            let mut e = engine();
            let req = Request { prompt_logprobs: true, ..copy_request(&e, sampling, 64, speculate) };
            e.add(0, req).unwrap();
            transcript(&mut e)
        };
        let (plain, none) = run_alone(0);
        let (predicted, drafts) = run_alone(8);
        assert_eq!(none[&0], (0, 0));
        assert_eq!(plain[&0], predicted[&0], "{sampling:?}: speculation changed the output");
        let (drafted, accepted) = drafts[&0];
        assert!(accepted > 0 && accepted <= drafted, "{sampling:?}: {accepted} of {drafted} drafts accepted");

        // Batched: speculating and plain sequences side by side, with short limits that end inside a draft.
        let mut e = engine();
        for i in 0..6u64 {
            let req = copy_request(&e, sampling, 64 - 9 * i as u32, if i % 2 == 0 { 8 } else { 0 });
            e.add(i, Request { prompt_logprobs: i < 3, ..req }).unwrap();
        }
        let (batched, _) = transcript(&mut e);
        for i in 0..6u64 {
            let mut alone = engine();
            let req = copy_request(&alone, sampling, 64 - 9 * i as u32, 0);
            alone.add(0, Request { prompt_logprobs: i < 3, ..req }).unwrap();
            assert_eq!(transcript(&mut alone).0[&0], batched[&i], "{sampling:?}: sequence {i} differs in the batch");
        }
    }
}
