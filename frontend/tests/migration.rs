//! Migration at the frontend, against a scripted upstream: a worker that dies or stalls mid-answer is replaced
//! by another that resumes after the tokens already sent; the client sees one whole answer (streamed or complete,
//! both APIs) and the usage once; every request carries a seed; `--migration-limit 0` turns it off.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use common::{WorkerMode, harness, harness_with, header, hello, json_of, text};
use serde_json::json;
use zl_frontend::gateway::GatewayConfig;
use zl_wire::message::NodeId;

#[tokio::test]
async fn a_worker_dying_mid_answer_is_replaced_by_one_resuming_after_the_tokens_sent() {
    for stream in [true, false] {
        let h = harness();
        *h.fake.mode.lock().unwrap() = WorkerMode::FirstWorkerDiesMidStream;
        let resp = h.anthropic(hello(json!({"stream": stream, "temperature": 0.7}))).await;
        assert_eq!(resp.status(), StatusCode::OK);
        if stream {
            // The headers went out with w1's admission; the text is whole and in order, once.
            assert_eq!(header(&resp, "x-zl-worker"), "w1");
            let body = text(resp).await;
            let deltas: Vec<&str> = body.matches("\"text_delta\",\"text\":\"").collect();
            assert_eq!(deltas.len(), 3, "{body}");
            assert!(
                body.contains("\"text\":\"Hello\"")
                    && body.contains("\"text\":\" wor\"")
                    && body.contains("\"text\":\"ld\"")
            );
            assert!(body.contains("\"output_tokens\":3") && body.contains("message_stop"), "{body}");
            assert!(!body.contains("event: error"), "{body}");
        } else {
            let v = json_of(resp).await;
            assert_eq!(v["content"][0]["text"], "Hello world");
            assert_eq!(v["usage"]["output_tokens"], 3);
        }
        let rec = h.fake.recorded.lock().unwrap();
        assert_eq!(rec.routes[1].excluded_workers, vec![NodeId::new("w1").unwrap()]);
        let (first, second) = (&rec.generates[0], &rec.generates[1]);
        assert_eq!((first.0.as_str(), second.0.as_str()), ("w1.local:7100", "w2.local:7100"));
        assert_eq!(second.1.resume_tokens, vec![7], "resumed after the one token w1 sent");
        // No seed from the client: the frontend drew one, and the resumed request samples with the same.
        assert!(first.1.sampling.seed.is_some());
        assert_eq!(first.1.sampling.seed, second.1.sampling.seed);
        assert_eq!(first.1.prompt, second.1.prompt);
    }
}

#[tokio::test]
async fn a_worker_that_stalls_is_treated_as_failed_past_the_bound() {
    let config = GatewayConfig { stall_timeout: Duration::from_millis(300), ..GatewayConfig::default() };
    let h = harness_with(config, 1024 * 1024);
    *h.fake.mode.lock().unwrap() = WorkerMode::FirstWorkerStalls;
    let started = std::time::Instant::now();
    let resp = h.openai(json!({"model": common::MODEL, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(json_of(resp).await["choices"][0]["message"]["content"], "Hello world");
    assert!(started.elapsed() >= Duration::from_millis(300), "moved before the bound");
    assert_eq!(h.fake.recorded.lock().unwrap().generates[1].1.resume_tokens, vec![7]);
}

#[tokio::test]
async fn with_migration_off_a_stream_ends_with_an_error_event() {
    let config = GatewayConfig { migration_limit: 0, ..GatewayConfig::default() };
    let h = harness_with(config, 1024 * 1024);
    *h.fake.mode.lock().unwrap() = WorkerMode::FirstWorkerDiesMidStream;
    let body = text(h.anthropic(hello(json!({"stream": true}))).await).await;
    assert!(body.contains("event: error") && !body.contains("message_stop"), "{body}");
    assert_eq!(h.fake.recorded.lock().unwrap().generates.len(), 1);
}

#[tokio::test]
async fn an_answer_longer_than_the_tokens_held_is_not_moved() {
    let config = GatewayConfig { migration_max_tokens: 0, ..GatewayConfig::default() };
    let h = harness_with(config, 1024 * 1024);
    *h.fake.mode.lock().unwrap() = WorkerMode::FirstWorkerDiesMidStream;
    let body = text(h.anthropic(hello(json!({"stream": true}))).await).await;
    assert!(body.contains("event: error"), "{body}");
    assert_eq!(h.fake.recorded.lock().unwrap().generates.len(), 1);
}

#[tokio::test]
async fn the_audit_record_names_every_worker_and_the_seed_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let h = common::harness_audited(dir.path());
    *h.fake.mode.lock().unwrap() = WorkerMode::FirstWorkerDiesMidStream;
    let resp = h.anthropic(hello(json!({"stream": true, "temperature": 0.9}))).await;
    assert!(text(resp).await.contains("message_stop"));
    let sent_seed = h.fake.recorded.lock().unwrap().generates[0].1.sampling.seed;
    let mut records = Vec::new();
    zl_node::audit::verify_dir(dir.path(), None, false, |r| records.push(r.clone())).unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!((r.worker.as_str(), r.migrated_to.clone()), ("w1", vec!["w2".to_owned()]));
    assert_eq!((r.status, r.output_tokens), (200, 3));
    assert_eq!(r.seed, sent_seed, "the seed the answer was sampled with");
}

/// The only worker dies mid-answer and comes back (its supervisor restarts it in about 1.5 s): the migration
/// waits for it, bounded, and the answer goes on there; with no wait it ends with an error event.
#[tokio::test]
async fn a_lone_workers_restart_is_waited_for() {
    let h = common::harness();
    *h.fake.mode.lock().unwrap() = WorkerMode::LoneWorkerRestarts;
    let body = text(h.anthropic(hello(json!({"stream": true}))).await).await;
    assert!(body.contains("message_stop") && !body.contains("event: error"), "{body}");
    let generates = h.fake.recorded.lock().unwrap().generates.clone();
    assert_eq!(generates.len(), 2);
    assert!(generates.iter().all(|(endpoint, _)| endpoint.starts_with("w1")), "the same worker, back");
    assert_eq!(generates[1].1.resume_tokens.len(), 1, "resumed after the token already sent");

    let config = GatewayConfig { migration_wait: Duration::ZERO, ..GatewayConfig::default() };
    let h = common::harness_with(config, 1024 * 1024);
    *h.fake.mode.lock().unwrap() = WorkerMode::LoneWorkerRestarts;
    let body = text(h.anthropic(hello(json!({"stream": true}))).await).await;
    assert!(body.contains("event: error"), "{body}");
}

#[tokio::test]
async fn the_prompts_logprobs_reach_the_client_once_when_a_worker_dies_while_sending_them() {
    for stream in [false, true] {
        let h = harness();
        *h.fake.mode.lock().unwrap() = WorkerMode::FirstWorkerDiesDuringPromptLogprobs;
        let body = json!({"model": common::MODEL, "prompt": "one two three four five", "max_tokens": 3,
            "echo": true, "logprobs": 2, "stream": stream});
        let resp = h.post_json("/v1/completions", body).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let columns: Vec<serde_json::Value> = if stream {
            let body = text(resp).await;
            body.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
                .filter_map(|v| v["choices"][0]["logprobs"]["token_logprobs"].as_array().cloned())
                .flatten()
                .collect()
        } else {
            let v = json_of(resp).await;
            v["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap().clone()
        };
        // Read once the answer is whole (a stream's body is the generation).
        let rec_prompt = {
            let rec = h.fake.recorded.lock().unwrap();
            assert_eq!(rec.generates.len(), 2, "moved to w2");
            // Nothing was output before the failure: w2 is asked for the prompt's log-probabilities again.
            assert!(rec.generates[1].1.prompt_logprobs && rec.generates[1].1.resume_tokens.is_empty());
            match &rec.generates[0].1.prompt {
                zl_wire::message::Prompt::Tokens(t) => t.len(),
                other => panic!("{other:?}"),
            }
        };
        // Every prompt position once (the first with none), then the three output tokens.
        assert_eq!(columns.len(), rec_prompt + 3, "stream {stream}: {columns:?}");
        assert!(columns[0].is_null());
        assert!(columns[1..].iter().all(|v| v.as_f64() == Some(-0.25)), "{columns:?}");
    }
}
