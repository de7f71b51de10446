//! Log-probabilities on the bundled model: the prompt's (every position after the first, once, recomputed after
//! nothing) and the output's, with the most likely alternatives; the values the model's log-softmax gives before
//! any sampling transform, within 1e-3 of the float reference path's, and unchanged by a grammar mask.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use zl_worker::engine::{EngineCore, Event, Logprob, Request};
use zl_worker::fetch;
use zl_worker::kv::window::KvLayout;
use zl_worker::model::{LoadedModel, Precision, load_with};
use zl_worker::sampling::Sampling;
use zl_worker::scheduler::SchedulerConfig;

mod common;

/// What one request reported: its prompt's log-probabilities (from position 1) and its output tokens'.
#[derive(Debug, Default)]
struct Report {
    prompt: Vec<(u32, Logprob)>,
    output: Vec<(u32, Logprob)>,
    text: String,
}

fn run(model: LoadedModel, requests: Vec<Request>, chunk: usize) -> Vec<Report> {
    let config = SchedulerConfig { prefill_chunk: chunk, ..SchedulerConfig::default() };
    let mut engine = EngineCore::on_device(model, Default::default(), KvLayout::full(256), 16, config).unwrap();
    let n = requests.len();
    for (i, r) in requests.into_iter().enumerate() {
        engine.add(i as u64, r).unwrap();
    }
    let mut out: Vec<Report> = (0..n).map(|_| Report::default()).collect();
    for _ in 0..10_000 {
        if !engine.has_work() {
            break;
        }
        for ev in engine.step() {
            match ev {
                Event::Prompt { seq, start, tokens, logprobs } => {
                    let r = &mut out[seq as usize];
                    assert_eq!(start as usize, r.prompt.len() + 1, "prompt positions in order, each once");
                    r.prompt.extend(tokens.into_iter().zip(logprobs));
                }
                Event::Token { seq, token, logprob, text } => {
                    let r = &mut out[seq as usize];
                    r.output.push((token, logprob.expect("asked for")));
                    r.text.push_str(&text);
                }
                Event::Finished { .. } => {}
            }
        }
    }
    assert!(!engine.has_work(), "engine did not finish");
    out
}

fn request(prompt: &[u32], top: u8) -> Request {
    Request {
        logprobs: true,
        top_logprobs: top,
        prompt_logprobs: true,
        ..Request::new(prompt.to_vec(), Sampling::greedy(), 8)
    }
}

/// The largest difference between two reports' log-probabilities, relative to their size where it exceeds 1 (a
/// token of probability 1e-7 has a log-probability near -16, where the 16-bit activations' rounding moves the
/// fourth significant digit), and the largest difference between their probabilities.
fn max_difference(a: &[(u32, Logprob)], b: &[(u32, Logprob)]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold((0.0f32, 0.0f32), |(log, p), (x, y)| {
        assert_eq!(x.0, y.0, "same tokens");
        let (lx, ly) = (x.1.logprob, y.1.logprob);
        ((log.max((lx - ly).abs() / lx.abs().max(1.0))), p.max((lx.exp() - ly.exp()).abs()))
    })
}

#[test]
fn prompt_and_output_logprobs_match_the_float_reference() {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let native = load_with(&path, Precision::Native).unwrap();
    let prompt =
        common::chat_prompt(&native.tokenizer, "You are a helpful assistant.", "What is the capital of France?");
    let float = load_with(&path, Precision::Float).unwrap();
    // Chunks of 16: the prompt's positions come from several steps.
    let native = run(native, vec![request(&prompt, 5)], 16).remove(0);
    let float = run(float, vec![request(&prompt, 5)], 16).remove(0);
    assert_eq!(native.prompt.len(), prompt.len() - 1);
    assert_eq!(native.prompt.iter().map(|p| p.0).collect::<Vec<_>>(), prompt[1..]);
    assert!(!native.output.is_empty());
    assert!(native.text.contains("Paris"), "{:?}", native.text);
    let (log, p) = max_difference(
        &[&native.prompt[..], &native.output[..]].concat(),
        &[&float.prompt[..], &float.output[..]].concat(),
    );
    eprintln!(
        "largest difference from the float path: log-probability {log:.2e} (relative past 1), probability {p:.2e}"
    );
    assert!(log <= 1e-3 && p <= 1e-3, "log-probability {log}, probability {p}");
    for (token, lp) in native.prompt.iter().chain(&native.output) {
        assert!(lp.logprob <= 0.0);
        assert_eq!(lp.top.len(), 5);
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1), "most likely first");
        let mass: f32 = lp.top.iter().map(|t| t.1.exp()).sum();
        assert!(mass <= 1.0 + 1e-4, "{mass}");
        // The token is among the alternatives exactly when it is at least as likely as the last of them.
        if lp.logprob > lp.top[4].1 {
            assert!(lp.top.iter().any(|t| t.0 == *token && t.1 == lp.logprob));
        }
    }
    // Greedy: every output token is the most likely one.
    assert!(native.output.iter().all(|(t, lp)| lp.top[0].0 == *t && lp.top[0].1 == lp.logprob));
}

#[test]
fn logprobs_are_the_same_alone_batched_and_in_other_chunks() {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let model = || load_with(&path, Precision::Native).unwrap();
    let m = model();
    let prompts: Vec<Vec<u32>> = ["Name a colour.", "Count to five.", "What is two plus two?"]
        .iter()
        .map(|q| common::chat_prompt(&m.tokenizer, "You are a helpful assistant.", q))
        .collect();
    let alone: Vec<Report> = prompts.iter().map(|p| run(model(), vec![request(p, 2)], 256).remove(0)).collect();
    // Batched, in small chunks, the same prompt twice (the second finds the first's blocks cached and must not use
    // them: its prompt is computed whole).
    let mut batch: Vec<Request> = prompts.iter().map(|p| request(p, 2)).collect();
    batch.push(request(&prompts[0], 2));
    let batched = run(m, batch, 16);
    for (i, a) in alone.iter().enumerate() {
        assert_eq!(format!("{:?}", a.prompt), format!("{:?}", batched[i].prompt), "prompt {i}");
        assert_eq!(format!("{:?}", a.output), format!("{:?}", batched[i].output), "output {i}");
    }
    assert_eq!(format!("{:?}", alone[0].prompt), format!("{:?}", batched[3].prompt));
}

#[test]
fn a_grammar_mask_does_not_change_the_logprobs_reported() {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let m = load_with(&path, Precision::Native).unwrap();
    let prompt = common::chat_prompt(&m.tokenizer, "You are a helpful assistant.", "Say yes or no.");
    let grammar = zl_grammar::Engine::new(&m.tokenizer).unwrap();
    let free = run(load_with(&path, Precision::Native).unwrap(), vec![request(&prompt, 3)], 256).remove(0);
    // Forced to answer "no": the first token's reported value is the model's, not the mask's (which makes it 0).
    let constrained = Request { constraint: Some(grammar.start("start: \"no\"").unwrap()), ..request(&prompt, 3) };
    let forced = run(m, vec![constrained], 256).remove(0);
    assert_eq!(format!("{:?}", free.prompt), format!("{:?}", forced.prompt));
    let (token, first) = &forced.output[0];
    assert!(first.logprob < -1e-3, "the mask's certainty leaked into the logprob: {first:?}");
    assert_eq!(free.output[0].1.top, first.top, "the alternatives are the model's");
    if let Some(alt) = first.top.iter().find(|t| t.0 == *token) {
        assert_eq!(alt.1, first.logprob);
    }
}
