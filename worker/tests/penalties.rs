//! Penalties, `logit_bias`, `min_p` and thinking budgets through the engine on the bundled model: applied as
//! specified, and a request samples the same tokens alone and in a batch with others (penalized or not).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;

use zl_wire::message::{Penalties, ThinkBudget};
use zl_worker::engine::{EngineCore, Request};
use zl_worker::fetch;
use zl_worker::kv::window::KvLayout;
use zl_worker::model::{LoadedModel, load};
use zl_worker::sampling::Sampling;
use zl_worker::scheduler::SchedulerConfig;

mod common;

fn model() -> LoadedModel {
    load(&fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap()).unwrap()
}

fn run(requests: Vec<Request>) -> Vec<(Vec<u32>, String)> {
    let mut engine =
        EngineCore::on_device(model(), Default::default(), KvLayout::full(512), 16, SchedulerConfig::default())
            .unwrap();
    let n = requests.len();
    for (i, r) in requests.into_iter().enumerate() {
        engine.add(i as u64, r).unwrap();
    }
    let mut out = common::run_all(&mut engine);
    (0..n as u64).map(|i| out.remove(&i).unwrap_or_default()).collect()
}

fn prompt(user: &str) -> Vec<u32> {
    common::chat_prompt(&model().tokenizer, "You are a helpful assistant.", user)
}

#[test]
fn penalties_apply_and_are_batch_invariant() {
    // A raw prompt greedy decoding continues by repeating it.
    let p = model().tokenizer.encode("cat cat cat cat cat cat cat cat cat cat cat cat").unwrap();
    let sampled = Sampling { temperature: 0.9, top_p: 0.95, top_k: 0, seed: 5 };
    let penalized = |sampling| Request {
        penalties: Some(Penalties { frequency: 1.5, presence: 0.5, min_p: 0.05, logit_bias: vec![] }),
        ..Request::new(p.clone(), sampling, 24)
    };
    let plain = run(vec![Request::new(p.clone(), Sampling::greedy(), 24)]).remove(0);
    let greedy = run(vec![penalized(Sampling::greedy())]).remove(0);
    // Greedy repeats " cat"; penalized greedy cannot keep choosing the same tokens.
    let most = |tokens: &[u32]| {
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for &t in tokens {
            *counts.entry(t).or_default() += 1;
        }
        counts.into_values().max().unwrap_or(0)
    };
    assert!(most(&greedy.0) < most(&plain.0), "penalized {:?} vs plain {:?}", greedy.1, plain.1);
    // Alone and in a batch with plain and other penalized requests: the same tokens.
    let alone = run(vec![penalized(sampled)]).remove(0);
    let batch = run(vec![
        Request::new(prompt("Name a colour."), sampled, 16),
        penalized(sampled),
        penalized(Sampling { seed: 6, ..sampled }),
        Request::new(p.clone(), Sampling::greedy(), 24),
    ]);
    assert_eq!(batch[1], alone);
    assert_eq!(batch[3], plain);
}

#[test]
fn a_logit_bias_forces_and_forbids_tokens() {
    let p = prompt("What is the capital of France?");
    let plain = run(vec![Request::new(p.clone(), Sampling::greedy(), 8)]).remove(0);
    let first = plain.0[0];
    let forbidden = run(vec![Request {
        penalties: Some(Penalties { logit_bias: vec![(first, -100.0)], ..Default::default() }),
        ..Request::new(p.clone(), Sampling::greedy(), 8)
    }])
    .remove(0);
    assert!(!forbidden.0.contains(&first), "{:?}", forbidden.0);
    let forced = run(vec![Request {
        penalties: Some(Penalties { logit_bias: vec![(1000, 100.0)], ..Default::default() }),
        ..Request::new(p, Sampling { temperature: 1.0, top_p: 1.0, top_k: 0, seed: 9 }, 5)
    }])
    .remove(0);
    assert_eq!(forced.0, vec![1000; 5]);
}

#[test]
fn a_thinking_budget_closes_the_section_once_and_only_when_spent() {
    let m = model();
    let close = m.tokenizer.encode("\n</think>\n\n").unwrap();
    let mut p = prompt("Think about France.");
    p.extend(m.tokenizer.encode("<think>\n").unwrap());
    let budget = |b| Request {
        think: Some(ThinkBudget { budget: b, end: "</think>".into(), close: close.clone() }),
        ..Request::new(p.clone(), Sampling::greedy(), 20)
    };
    let (tokens, text) = run(vec![budget(6)]).remove(0);
    assert_eq!(&tokens[6..6 + close.len()], &close[..], "{text:?}");
    assert_eq!(text.matches("</think>").count(), 1, "{text:?}");
    // Alone and batched with an unbudgeted request: the same.
    let batch = run(vec![Request::new(p.clone(), Sampling::greedy(), 20), budget(6)]);
    assert_eq!(batch[1].0, tokens);
    // A budget larger than the answer changes nothing.
    let plain = run(vec![Request::new(p.clone(), Sampling::greedy(), 20)]).remove(0);
    assert_eq!(run(vec![budget(100)]).remove(0), plain);
}

#[test]
fn a_grammar_constrains_only_the_answer_after_the_thinking_section() {
    let m = model();
    let grammars = zl_grammar::Engine::new(&m.tokenizer).unwrap();
    let close = m.tokenizer.encode("\n</think>\n\n").unwrap();
    let mut p = prompt("Think about France, then answer in JSON.");
    p.extend(m.tokenizer.encode("<think>\n").unwrap());
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": false
    });
    let grammar = zl_grammar::json_schema(&schema).unwrap();
    let constrained = |sampling| Request {
        think: Some(ThinkBudget { budget: 6, end: "</think>".into(), close: close.clone() }),
        constraint: Some(grammars.start(&grammar).unwrap()),
        ..Request::new(p.clone(), sampling, 96)
    };
    let plain = run(vec![Request::new(p.clone(), Sampling::greedy(), 96)]).remove(0);
    // Sampled hot, the string runs on until the grammar's closing ends it, required key included.
    let hot = Sampling { temperature: 2.0, top_p: 1.0, top_k: 0, seed: 3 };
    for (tokens, text) in run(vec![constrained(Sampling::greedy()), constrained(hot)]) {
        // The section is the model's own until its budget closes it (greedy: as unconstrained decoding writes it).
        assert_eq!(&tokens[6..6 + close.len()], &close[..], "{text:?}");
        // The answer after it is the grammar's: the schema's object, complete.
        let (_, answer) = text.split_once("</think>\n\n").unwrap();
        let v: serde_json::Value = serde_json::from_str(answer).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v["city"].is_string() && v["population"].is_number(), "{text:?}");
    }
    let greedy = run(vec![constrained(Sampling::greedy())]).remove(0);
    assert_eq!(&greedy.0[..6], &plain.0[..6], "{:?}", greedy.1);
}
