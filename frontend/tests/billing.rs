//! Usage is counted, billed and audited from what was delivered however an answer ends: its finish, the client
//! going away mid-stream or mid-answer, or a worker failing past what migration can mend.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use common::{Harness, WorkerMode, harness_audited, hello, text};
use http_body_util::BodyExt;
use serde_json::json;
use zl_common::audit::AuditRecord;

fn records(dir: &std::path::Path) -> Vec<AuditRecord> {
    let mut records = Vec::new();
    zl_node::audit::verify_dir(dir, None, false, |r| records.push(r.clone())).unwrap();
    records
}

/// (output tokens, milli-units) this frontend counted so far, as its next report to the orchestrators says.
fn counted(h: &Harness) -> (u64, u64) {
    let report = h.gateway.reporter().ledger.lock().unwrap().report(None, 1, 1);
    report.usage.iter().fold((0, 0), |(t, u), d| (t + d.output_tokens, u + d.milli_units))
}

/// Reads `n` frames of a streamed answer, then drops it (the client closes the socket).
async fn read_then_leave(resp: axum::http::Response<axum::body::Body>, n: usize) {
    let mut body = resp.into_body();
    for _ in 0..n {
        body.frame().await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_billed_and_audited_for_what_it_got() {
    for openai in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let h = harness_audited(dir.path());
        *h.fake.mode.lock().unwrap() = WorkerMode::Endless;
        // The tiny test model's context is 64 tokens.
        let body = hello(json!({"stream": true, "max_tokens": 40}));
        let resp = if openai { h.openai(body).await } else { h.anthropic(body).await };
        read_then_leave(resp, 20).await;
        let r = &records(dir.path())[0];
        assert!(r.output_tokens >= 10, "openai {openai}: {r:?}");
        assert!(r.billing_unit > 0.0, "the delivered text is billed: {r:?}");
        assert_eq!(r.stop_reason, "client_disconnected");
        let (tokens, units) = counted(&h);
        assert_eq!(tokens, u64::from(r.output_tokens));
        assert_eq!(units, (f64::from(r.billing_unit) * 1000.0).round() as u64, "the ledger bills the same units");
    }
}

#[tokio::test]
async fn a_client_that_leaves_a_complete_answer_is_billed_for_what_was_generated() {
    let dir = tempfile::tempdir().unwrap();
    let h = harness_audited(dir.path());
    *h.fake.mode.lock().unwrap() = WorkerMode::Endless;
    let left = tokio::time::timeout(Duration::from_millis(300), h.anthropic(hello(json!({"max_tokens": 40}))));
    assert!(left.await.is_err(), "the endless answer is still running when the client leaves");
    let r = &records(dir.path())[0];
    assert!(r.output_tokens > 0 && r.billing_unit > 0.0, "{r:?}");
    assert_eq!(r.stop_reason, "client_disconnected");
    assert!(counted(&h).1 > 0);
}

#[tokio::test]
async fn a_worker_failing_past_migration_bills_what_was_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let h = harness_audited(dir.path());
    *h.fake.mode.lock().unwrap() = WorkerMode::DiesMidStream;
    let body = text(h.anthropic(hello(json!({"stream": true}))).await).await;
    assert!(body.contains("event: error"), "{body}");
    let r = &records(dir.path())[0];
    assert_eq!((r.output_tokens, r.stop_reason.as_str()), (1, "error"), "{r:?}");
    assert!(r.billing_unit > 0.0);
    assert_eq!(counted(&h).0, 1);
}
