//! Grammar-constrained decoding on the bundled model: the output matches the grammar whatever the sampling, and a
//! constrained request gives the same tokens alone and in a batch of sixteen.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::run_ended;
use serde_json::{Value, json};
use zl_text::ChatMessage;
use zl_worker::engine::{EngineCore, Request};
use zl_worker::fetch;
use zl_worker::kv::window::KvLayout;
use zl_worker::model::gguf;
use zl_worker::sampling::Sampling;
use zl_worker::scheduler::SchedulerConfig;

fn engine() -> (EngineCore, zl_grammar::Engine) {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let model = gguf::load(&path).unwrap();
    let grammar = zl_grammar::Engine::new(&model.tokenizer).unwrap();
    // On the CPU, or on the device `ZL_TEST_DEVICE` names (scripts/gpu-check).
    let device = zl_worker::device::Device::from_env("ZL_TEST_DEVICE").unwrap();
    (EngineCore::on_device(model, device, KvLayout::full(2048), 16, SchedulerConfig::default()).unwrap(), grammar)
}

fn request(engine: &EngineCore, grammars: &zl_grammar::Engine, user: &str, grammar: &str, seed: u64) -> Request {
    let tok = &engine.model().tokenizer;
    let messages = [
        ChatMessage { role: "system".into(), content: "You are a helpful assistant. Answer in JSON.".into() },
        ChatMessage { role: "user".into(), content: user.into() },
    ];
    Request {
        prompt: tok.encode(&tok.render_chat(&messages).unwrap()).unwrap(),
        sampling: if seed == 0 {
            Sampling::greedy()
        } else {
            Sampling { temperature: 1.0, top_p: 1.0, top_k: 0, seed }
        },
        max_tokens: 256,
        stop_sequences: vec![],
        logprobs: false,
        top_logprobs: 0,
        prompt_logprobs: false,
        think: None,
        penalties: None,
        speculate: 4,
        constraint: Some(grammars.start(grammar).unwrap()),
        cache_salt: None,
        resume: vec![],
        adapter: None,
    }
}

#[test]
fn json_schema_output_parses_and_matches_across_seeds() {
    let (mut e, g) = engine();
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "population": {"type": "integer", "minimum": 0},
            "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
            "capital": {"type": "boolean"}
        },
        "required": ["city", "population", "capital"],
        "additionalProperties": false
    });
    let grammar = zl_grammar::json_schema(&schema).unwrap();
    for seed in 0..8u64 {
        e.add(seed, request(&e, &g, "Describe Paris as a JSON object.", &grammar, seed)).unwrap();
    }
    for (seed, (_, text, ended)) in run_ended(&mut e) {
        assert!(ended, "seed {seed} ran out of tokens: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|err| panic!("seed {seed}: {err}: {text}"));
        eprintln!("seed {seed}: {text}");
        assert!(v["city"].is_string() && v["population"].is_u64() && v["capital"].is_boolean(), "{text}");
        assert!(
            v.as_object().unwrap().keys().all(|k| ["city", "population", "landmarks", "capital"].contains(&k.as_str()))
        );
    }
}

#[test]
fn a_forced_tool_call_is_well_formed() {
    let (mut e, g) = engine();
    let tools = [zl_grammar::ToolSpec {
        name: "get_weather".into(),
        schema: json!({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}),
    }];
    let grammar = zl_grammar::tool_calls(&tools, false, false).unwrap();
    e.add(1, request(&e, &g, "What is the weather in Paris?", &grammar, 0)).unwrap();
    let out = run_ended(&mut e);
    let text = &out[&1].1;
    eprintln!("{text}");
    let body = text.strip_prefix("<tool_call>\n").and_then(|t| t.strip_suffix("\n</tool_call>")).expect(text);
    let call: Value = serde_json::from_str(body).unwrap();
    assert_eq!(call["name"], "get_weather");
    assert!(call["arguments"]["city"].is_string());
    assert!(["celsius", "fahrenheit"].contains(&call["arguments"]["unit"].as_str().unwrap()));
}

#[test]
fn constrained_tokens_are_the_same_alone_and_in_a_batch_of_sixteen() {
    let (mut e, g) = engine();
    let grammar = zl_grammar::json_schema(&json!({"type": "object", "properties": {"answer": {"type": "string", "maxLength": 60}}, "required": ["answer"]})).unwrap();
    e.add(1, request(&e, &g, "What is the capital of France?", &grammar, 7)).unwrap();
    let alone = run_ended(&mut e).remove(&1).unwrap();
    for seq in 0..16u64 {
        // Others differ in prompt, seed and grammar; sequence 5 is the one run alone.
        let (user, seed) = if seq == 5 { ("What is the capital of France?", 7) } else { ("Name a colour.", seq + 100) };
        let grammar = if seq % 2 == 0 { zl_grammar::json_object() } else { grammar.clone() };
        let grammar = if seq == 5 {
            zl_grammar::json_schema(&json!({"type": "object", "properties": {"answer": {"type": "string", "maxLength": 60}}, "required": ["answer"]})).unwrap()
        } else {
            grammar
        };
        e.add(seq, request(&e, &g, user, &grammar, seed)).unwrap();
    }
    let batch = run_ended(&mut e);
    assert_eq!(batch[&5].0, alone.0, "alone: {} / batched: {}", alone.1, batch[&5].1);
}
