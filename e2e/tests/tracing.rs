//! One id follows a request through every tier: a W3C `traceparent` sent to the frontend comes back as
//! `x-zl-trace-id` and appears in the frontend's, the orchestrator's and the worker's log lines for that request
//! (with `ZL_LOG` at debug for our crates); a request without one gets a fresh trace id.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::time::{Duration, Instant};

use zl_e2e::{request, zl_up};

const KEY: &str = "sk-zl-tracing-test-key-0123456789ab";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn ask(addr: std::net::SocketAddr, extra: &[(&str, &str)]) -> zl_e2e::HttpResponse {
    let body = serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": 4, "temperature": 0.7,
        "messages": [{"role": "user", "content": "Say hi."}]})
    .to_string();
    let mut headers = vec![("x-api-key", KEY)];
    headers.extend_from_slice(extra);
    request(addr, "POST", "/v1/messages", &headers, &body).expect("the frontend answers")
}

fn log_has(logs: &Path, name: &str, needle: &str) -> bool {
    std::fs::read_to_string(logs.join(format!("{name}.log"))).is_ok_and(|t| t.contains(needle))
}

#[test]
fn a_traceparent_is_followed_through_every_tier() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("ZL_LOG", "info,zl_frontend=debug,zl_orchestrator=debug,zl_worker=debug")];
    let (mut up, http, state) = zl_up(dir.path(), "data", KEY, &[], &env);
    let logs = Path::new(state["logs"].as_str().unwrap()).to_owned();

    let r = ask(http, &[("traceparent", &format!("00-{TRACE}-00f067aa0ba902b7-01"))]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-zl-trace-id"), Some(TRACE));
    let deadline = Instant::now() + Duration::from_secs(15);
    for tier in ["frontend-0", "orchestrator-0", "worker-0"] {
        while !log_has(&logs, tier, TRACE) {
            assert!(Instant::now() < deadline, "{tier}'s log never named trace {TRACE}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // The worker's lines for it carry the request id too.
    let worker = std::fs::read_to_string(logs.join("worker-0.log")).unwrap();
    let rid = r.header("request-id").unwrap();
    assert!(worker.lines().any(|l| l.contains(TRACE) && l.contains(rid) && l.contains("finished")), "{worker}");

    // Without a traceparent (or with a malformed one) the frontend starts a trace of its own.
    let a = ask(http, &[]);
    let b = ask(http, &[("traceparent", "00-zzz-1-01")]);
    for r in [&a, &b] {
        let id = r.header("x-zl-trace-id").unwrap();
        assert!(id.len() == 32 && id.bytes().all(|c| c.is_ascii_hexdigit()) && id != TRACE, "{id}");
    }
    assert_ne!(a.header("x-zl-trace-id"), b.header("x-zl-trace-id"));

    // The request's audit record carries the trace id too.
    let chain = Path::new(state["audit_dir"].as_str().unwrap()).join("frontend-0");
    let out = zl_e2e::zl(&["audit", "export", chain.to_str().unwrap()]);
    let export = String::from_utf8_lossy(&out.stdout);
    let record: serde_json::Value =
        serde_json::from_str(export.lines().find(|l| l.contains(rid)).expect("the request's audit record")).unwrap();
    assert_eq!(record["trace_id"], TRACE);
    assert!(up.terminate(Duration::from_secs(30)));
}
