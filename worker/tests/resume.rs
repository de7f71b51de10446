//! Migration's promise on the worker's side: a request resumed after any number of the tokens another worker
//! produced continues exactly as the uninterrupted one, token for token and byte for byte (the sampler positioned
//! after them, the grammar and its closing, the detokenizer and the stop matcher advanced over them silently),
//! and its finish counts every output token once.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use serde_json::json;
use zl_wire::message::ThinkBudget;
use zl_worker::engine::{EngineCore, Event, Request};
use zl_worker::fetch;
use zl_worker::kv::window::KvLayout;
use zl_worker::model::gguf;
use zl_worker::sampling::Sampling;
use zl_worker::scheduler::SchedulerConfig;

fn engine() -> (EngineCore, zl_grammar::Engine) {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let model = gguf::load(&path).unwrap();
    let grammar = zl_grammar::Engine::new(&model.tokenizer).unwrap();
    (
        EngineCore::on_device(model, Default::default(), KvLayout::full(1024), 16, SchedulerConfig::default()).unwrap(),
        grammar,
    )
}

/// The prompt of `user`'s message after zl chat's default system prompt.
fn chat(engine: &EngineCore, user: &str) -> Vec<u32> {
    common::chat_prompt(&engine.model().tokenizer, "You are a helpful assistant.", user)
}

/// One run: each token with the text its event released, and the finish (reason, stop sequence, its text,
/// input and output tokens).
type Run = (Vec<(u32, String)>, String);

/// A case's request (grammars compile per request).
type MakeRequest<'a> = Box<dyn Fn(&zl_grammar::Engine) -> Request + 'a>;

fn run(engine: &mut EngineCore, request: Request) -> Run {
    engine.add(1, request).unwrap();
    let (mut tokens, mut finish) = (Vec::new(), String::new());
    for _ in 0..10_000 {
        if !engine.has_work() {
            break;
        }
        for event in engine.step() {
            match event {
                Event::Token { token, text, .. } => tokens.push((token, text)),
                Event::Prompt { .. } => {}
                Event::Finished { reason, stop_sequence, text, input_tokens, output_tokens, .. } => {
                    finish = format!("{reason:?} {stop_sequence:?} {text:?} in {input_tokens} out {output_tokens}");
                }
            }
        }
    }
    assert!(!engine.has_work());
    (tokens, finish)
}

#[test]
fn a_request_resumed_after_any_of_its_tokens_continues_byte_for_byte() {
    let (mut e, grammars) = engine();
    let story = chat(&e, "Repeat this text exactly, twice: the lazy dog sleeps in the warm sun all day long.");
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"]});
    let grammar = zl_grammar::json_schema(&schema).unwrap();
    let city = chat(&e, "Give a city and its population as JSON.");
    let mut thinking = city.clone();
    thinking.extend(e.model().tokenizer.encode("<think>\n").unwrap());
    let close = e.model().tokenizer.encode("\n</think>\n\n").unwrap();
    let base = Request {
        stop_sequences: vec!["warm sun".into()],
        speculate: 4,
        ..Request::new(story.clone(), Sampling { temperature: 0.8, top_p: 0.95, top_k: 40, seed: 99 }, 48)
    };
    // A sampled request constrained by the schema, with no speculation (constrained requests do not draft).
    let schema = |g: &zl_grammar::Engine, prompt: &[u32], seed, max_tokens, think| Request {
        prompt: prompt.to_vec(),
        sampling: Sampling { temperature: 1.0, top_p: 1.0, top_k: 0, seed },
        stop_sequences: vec![],
        max_tokens,
        speculate: 0,
        think,
        constraint: Some(g.start(&grammar).unwrap()),
        ..base.clone()
    };
    let cases: Vec<(&str, MakeRequest<'_>)> = vec![
        // Seeded sampling, speculation, a stop sequence that may end it mid-text.
        ("seeded with a stop sequence", Box::new(|_| base.clone())),
        (
            "greedy to max_tokens",
            Box::new(|_| Request {
                sampling: Sampling::greedy(),
                stop_sequences: vec![],
                max_tokens: 10,
                ..base.clone()
            }),
        ),
        // A JSON schema with few tokens to spare: the closing the grammar forces near the end must be the same.
        ("a JSON schema near its limit", Box::new(|g| schema(g, &city, 5, 20, None))),
        // A thinking section closed by its budget, then the schema: the replay wakes the grammar where it woke.
        (
            "a thinking budget, then a JSON schema",
            Box::new(|g| {
                let budget = ThinkBudget { budget: 5, end: "</think>".into(), close: close.clone() };
                schema(g, &thinking, 7, 40, Some(budget))
            }),
        ),
    ];
    for (what, make) in &cases {
        let (whole, finish) = run(&mut e, make(&grammars));
        let n = whole.len();
        assert!(n >= 4, "{what}: {n} tokens");
        eprintln!("{what}: {n} tokens, {finish}");
        for k in [1, n / 2, n - 1, n] {
            let resume: Vec<u32> = whole[..k].iter().map(|(t, _)| *t).collect();
            let (rest, resumed_finish) = run(&mut e, Request { resume, ..make(&grammars) });
            assert_eq!(rest, whole[k..], "{what}: resumed after {k} of {n} tokens");
            assert_eq!(resumed_finish, finish, "{what}: the finish after {k} of {n}");
        }
    }
    // More tokens to resume after than the request allows is refused.
    let err = e.add(2, Request { resume: vec![1; 49], ..base.clone() }).unwrap_err();
    assert!(err.to_string().contains("exceed max_tokens"), "{err}");
}
