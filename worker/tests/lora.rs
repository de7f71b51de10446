//! LoRA adapters on the bundled model: seeded random adapters (rank 8 and 16, alpha 16 and 32, every projection)
//! written in PEFT's format, loaded over the base and applied at run time, against the same adapter merged into
//! the float weights (`W + alpha / r * B A`): the same greedy answers to the question set, logits within 1e-3 of
//! their scale, perplexity within 0.5%. And a batch mixing the base and four adapters gives every request the
//! tokens it gets alone, with one prompt shared by all (so a prefix cached for one adapter is never another's).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;

use common::lora::{random_updates, write_peft};
use common::{logits, logits_with, max_diff};
use zl_worker::engine::{EngineCore, Event, Request, RequestAdapter};
use zl_worker::eval::{answers, perplexity};
use zl_worker::fetch;
use zl_worker::model::llama::{KvDtype, Tuned};
use zl_worker::model::lora::{LoraAdapter, Target};
use zl_worker::model::lora_load::{self, Base};
use zl_worker::model::{LoadedModel, Precision, gguf, load_with, lora_merge};
use zl_worker::sampling::Sampling;

/// A seeded adapter over every projection, written as PEFT and loaded for `model`.
fn adapter(model: &LoadedModel, rank: usize, alpha: f32, seed: u64) -> LoraAdapter {
    let dir = tempfile::tempdir().unwrap();
    let updates = random_updates(model.llama.config(), &Target::ALL, rank, seed, 0.06);
    write_peft(dir.path(), &updates, alpha, false);
    let base = Base { config: model.llama.config(), family: &model.family };
    lora_load::load(dir.path(), base).unwrap().adapter
}

#[test]
fn an_adapter_applied_at_run_time_answers_as_its_merged_model() {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let base = load_with(&path, Precision::Float).unwrap();
    let lora = adapter(&base, 8, 16.0, 11);
    let mut merged = load_with(&path, Precision::Float).unwrap();
    lora_merge::merge(&mut merged.llama, &lora).unwrap();
    let tuned = Tuned { llama: &base.llama, adapter: Some(&lora) };

    // Logits on a chat prompt: the adapter moves them, and run time agrees with merged.
    let prompt = answers::prompt(&base.tokenizer, None, answers::QUESTIONS[0]).unwrap();
    let want = logits(&merged.llama, &prompt);
    let (moved, _) = max_diff(&want, &logits(&base.llama, &prompt));
    let (diff, scale) = max_diff(&logits_with(&base.llama, Some(&lora), &prompt), &want);
    eprintln!("logits: the adapter moves them by up to {moved}; run time vs merged {diff} (largest {scale})");
    assert!(moved > 0.5, "the adapter barely changes the logits ({moved})");
    assert!(diff < 1e-3 * scale, "run time vs merged: {diff}");

    // The question set under every system prompt: the same greedy answers, token for token; and the adapter
    // changes many of them.
    let prompts: Vec<Vec<u32>> = answers::SYSTEM_PROMPTS
        .iter()
        .flat_map(|s| answers::QUESTIONS.iter().map(|q| answers::prompt(&base.tokenizer, *s, q).unwrap()))
        .collect();
    let stop = &base.tokenizer.stop_ids;
    let (got, reference) =
        (answers::greedy(tuned, &prompts, 20, stop), answers::greedy(&merged.llama, &prompts, 20, stop));
    let differ: Vec<usize> = (0..prompts.len()).filter(|&i| got[i] != reference[i]).collect();
    for &i in &differ {
        let text = |t: &[u32]| base.tokenizer.decode(t).unwrap();
        eprintln!("question {i}\n  run time: {:?}\n  merged:   {:?}", text(&got[i]), text(&reference[i]));
    }
    assert!(differ.is_empty(), "{} of {} answers differ", differ.len(), prompts.len());
    let plain = answers::greedy(&base.llama, &prompts, 20, stop);
    let changed = (0..prompts.len()).filter(|&i| plain[i] != reference[i]).count();
    eprintln!("the adapter changes {changed} of {} answers", prompts.len());
    assert!(changed >= 10, "the adapter changes only {changed} answers");

    // Perplexity over three chunks of the corpus.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/eval/corpus.md")).unwrap();
    let tokens = base.tokenizer.encode(&text).unwrap();
    let tokens = &tokens[..tokens.len().min(3 * 256)];
    let bos = gguf::bos_token(&path).unwrap();
    let run_time = perplexity(tuned, tokens, 256, bos, KvDtype::F16).unwrap();
    let reference = perplexity(&merged.llama, tokens, 256, bos, KvDtype::F16).unwrap();
    eprintln!("perplexity: run time {run_time:?}, merged {reference:?}");
    assert!((run_time.value / reference.value - 1.0).abs() < 0.005, "{run_time:?} vs {reference:?}");
}

#[test]
fn a_batch_mixing_the_base_and_four_adapters_gives_each_request_its_tokens_alone() {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let model = load_with(&path, Precision::Native).unwrap();
    let adapters: Vec<Arc<LoraAdapter>> = [(8, 16.0, 21), (16, 32.0, 22), (8, 32.0, 23), (16, 16.0, 24)]
        .into_iter()
        .map(|(rank, alpha, seed)| Arc::new(adapter(&model, rank, alpha, seed)))
        .collect();
    let prompt =
        answers::prompt(&model.tokenizer, Some("You are a helpful assistant."), answers::QUESTIONS[6]).unwrap();
    // Request i runs with adapter i % 5 (0: the base), all on the same prompt.
    let choice = |i: usize| (i % 5).checked_sub(1).map(|a| &adapters[a]);
    let stop = model.tokenizer.stop_ids.clone();
    let alone: Vec<Vec<u32>> = (0..5)
        .map(|i| {
            let tuned = Tuned { llama: &model.llama, adapter: choice(i).map(|a| &**a) };
            answers::greedy(tuned, std::slice::from_ref(&prompt), 16, &stop).remove(0)
        })
        .collect();
    let distinct: std::collections::HashSet<_> = alone.iter().collect();
    assert!(distinct.len() >= 4, "the adapters hardly change the answer: {alone:?}");

    let mut engine = EngineCore::new(model, 256, 16, Default::default()).unwrap();
    for i in 0..16 {
        let adapter = choice(i).map(|a| RequestAdapter { adapter: a.clone(), key: i as u64 % 5 });
        engine.add(i as u64, Request { adapter, ..Request::new(prompt.clone(), Sampling::greedy(), 16) }).unwrap();
    }
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 16];
    let mut widest = 0;
    while engine.has_work() {
        let events = engine.step();
        widest = widest.max(engine.stats().running);
        for ev in events {
            if let Event::Token { seq, token, .. } = ev {
                got[seq as usize].push(token);
            }
        }
    }
    assert!(widest >= 8, "the requests never ran together ({widest} at most)");
    for (i, tokens) in got.iter().enumerate() {
        // The engine does not emit the stop token greedy() leaves out.
        assert_eq!(tokens, &alone[i % 5], "request {i} (adapter {})", i % 5);
    }
}
