//! A mixture-of-experts model served by the whole local cluster: `zl up --model` with a Mixtral-style GGUF file
//! (random weights, 8 experts, 2 per token, SmolLM2's tokenizer and chat template; written by
//! `scripts/arch_models.py` with PyPI's `gguf`, as llama.cpp's converter lays it out), answered through the
//! frontend streamed and whole, the same bytes for the same seeded request, and its prefix reused.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::process::Command;

use zl_e2e::{http_stream, request, zl_up};

const KEY: &str = "sk-zl-moe-test-key-0123456789abcdef";

/// The bundled model's file (its tokenizer is copied into the random-weight one).
fn bundled() -> String {
    let out = Command::new(zl_e2e::bin("zl-worker")).arg("fetch-default-model").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn ask(http: SocketAddr, body: &serde_json::Value) -> (u16, serde_json::Value, String) {
    let headers = [("x-api-key", KEY), ("x-zl-cache", "bypass")];
    let r = request(http, "POST", "/v1/messages", &headers, &body.to_string()).expect("the frontend answers");
    let json = serde_json::from_str(&r.body).unwrap_or(serde_json::Value::Null);
    (r.status, json, r.body)
}

#[test]
fn zl_up_serves_a_mixture_of_experts_file_streamed_and_whole_the_same_for_the_same_seed() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/arch_models.py");
    let out = Command::new(zl_e2e::python()).arg(script).arg(bundled()).arg(&models).arg("mixtral").output().unwrap();
    assert!(out.status.success(), "arch_models.py: {}", String::from_utf8_lossy(&out.stderr));
    let file = models.join("mixtral.gguf");
    let model = format!("mixtral-test={}", file.display());
    let (_up, http, state) = zl_up(dir.path(), "data", KEY, &["--model", &model], &[]);
    assert_eq!(state["model"], "mixtral-test", "{state}");

    let body = serde_json::json!({
        "model": "mixtral-test", "max_tokens": 24, "temperature": 0.8, "metadata": {"user_id": "moe"},
        "messages": [{"role": "user", "content": "Tell me about the experts in this room."}],
    });
    let mut seeded = body.clone();
    seeded["seed"] = serde_json::json!(7);
    let (status, first, raw) = ask(http, &seeded);
    assert_eq!(status, 200, "{raw}");
    let tokens = first["usage"]["output_tokens"].as_u64().unwrap();
    assert!((1..=24).contains(&tokens), "{first}");
    let text = first["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(!text.is_empty(), "{first}");
    // The same seeded request: the same bytes (a second run reuses the cached prompt prefix, which must not
    // change the answer).
    let (status, again, raw) = ask(http, &seeded);
    assert_eq!(status, 200, "{raw}");
    assert_eq!(again["content"][0]["text"].as_str().unwrap(), text);

    // Streamed: the Anthropic event sequence, ending with message_stop, the same text again.
    let mut streamed = seeded.clone();
    streamed["stream"] = serde_json::json!(true);
    let headers = [("x-api-key", KEY), ("x-zl-cache", "bypass")];
    let mut s = http_stream(http, "POST", "/v1/messages", &headers, &streamed.to_string()).expect("a stream");
    assert_eq!(s.status, 200);
    let events = s.rest();
    assert!(events.contains("event: message_start") && events.contains("event: message_stop"), "{events}");
    let deltas: String = events
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| v["delta"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(deltas, text);
}
