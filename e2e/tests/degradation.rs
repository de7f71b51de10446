//! Degradation levels on real processes: a worker with three sequence slots is saturated by long streams; the
//! frontend's `x-zl-health` goes `degraded` (low-priority projects shed with 529 and `retry-after`, normal ones
//! capped in `max_tokens`, high ones served) and then `unavailable` (everything refused at once), and back to
//! `healthy` when the streams end.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use zl_e2e::{
    HttpStream, admin, certs, http, http_stream, metric_sum, metrics, request, start_frontend_args, start_orchestrator,
    start_worker_args,
};

const HIGH: &str = "sk-zl-degrade-high-0123456789abcdef";
const NORMAL: &str = "sk-zl-degrade-normal-0123456789abcd";
const LOW: &str = "sk-zl-degrade-low-0123456789abcdefg";

fn body(max_tokens: u32, stream: bool) -> String {
    // Writing out a thousand numbers keeps the model going for as long as max_tokens lets it.
    serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0,
        "stream": stream, "messages": [{"role": "user", "content": "Write the numbers from 1 to 1000 separated by commas."}]})
    .to_string()
}

fn ask(http: SocketAddr, key: &str, max_tokens: u32) -> zl_e2e::HttpResponse {
    let headers = [("x-api-key", key), ("x-zl-cache", "bypass")];
    request(http, "POST", "/v1/messages", &headers, &body(max_tokens, false)).unwrap()
}

/// A long stream that holds a sequence slot until dropped.
fn hold(http: SocketAddr) -> HttpStream {
    let headers = [("x-api-key", HIGH), ("x-zl-cache", "bypass")];
    let mut s = http_stream(http, "POST", "/v1/messages", &headers, &body(1500, true)).unwrap();
    if s.status != 200 {
        let status = s.status;
        panic!("{status}: {}", s.rest());
    }
    assert!(s.next_piece().is_some());
    s
}

fn wait_for(http: SocketAddr, level: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = request(http, "GET", "/readyz", &[], "").unwrap();
        if r.header("x-zl-health") == Some(level) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "x-zl-health never became {level}: {:?} {}",
            r.header("x-zl-health"),
            r.body
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn saturation_degrades_then_makes_unavailable_and_recovery_heals() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path();
    certs(tls, &[("orchestrator", "orch-0"), ("frontend", "fe-0"), ("admin", "ops"), ("worker", "w1")]);
    let orch = start_orchestrator(tls, "orch-0", &[]);
    let _worker = start_worker_args(
        tls,
        "w1",
        &[orch.quic],
        (zl_e2e::free_udp(), zl_e2e::free_tcp()),
        &["--max-running", "3", "--kv-memory-mb", "256"],
    );
    let fe_args = [
        "--report-interval-ms",
        "200",
        "--degraded-load",
        "0.6",
        "--unavailable-load",
        "1.3",
        "--degraded-shed",
        "low",
        "--degraded-max-tokens",
        "3",
    ];
    let (_fe, http_addr) = start_frontend_args(tls, "fe-0", &[orch.quic], &fe_args);
    let deadline = Instant::now() + Duration::from_secs(240);
    while metric_sum(&metrics(orch.metrics).unwrap_or_default(), "zl_workers{state=\"healthy\"}") < 1.0 {
        assert!(Instant::now() < deadline, "the worker never became healthy");
        std::thread::sleep(Duration::from_millis(200));
    }
    for (project, class, key) in [("hi", "high", HIGH), ("mid", "normal", NORMAL), ("lo", "low", LOW)] {
        admin(tls, orch.admin, &["project", project]);
        admin(tls, orch.admin, &["priority", project, class]);
        admin(tls, orch.admin, &["keys", "create", project, "--project", project, "--secret", key]);
    }
    while http(http_addr, "GET", "/v1/models", &[("x-api-key", LOW)], "").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "the cluster never served");
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_for(http_addr, "healthy");
    assert_eq!(ask(http_addr, LOW, 2).status, 200, "healthy: every class is served");

    // Two long streams take two of the three slots: load 0.67, degraded.
    let held = [hold(http_addr), hold(http_addr)];
    wait_for(http_addr, "degraded");
    let shed = ask(http_addr, LOW, 2);
    assert_eq!(shed.status, 529, "{}", shed.body);
    assert!(shed.body.contains("overloaded_error") && shed.body.contains("degraded"), "{}", shed.body);
    assert!(shed.header("retry-after").is_some());
    let capped = ask(http_addr, NORMAL, 50);
    assert_eq!(capped.status, 200, "{}", capped.body);
    let v: serde_json::Value = serde_json::from_str(&capped.body).unwrap();
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() <= 3, "normal requests are capped: {v}");
    assert_eq!(v["stop_reason"], "max_tokens");
    let high = ask(http_addr, HIGH, 5);
    assert_eq!(high.status, 200, "the high class is served in full: {}", high.body);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&high.body).unwrap()["usage"]["output_tokens"], 5);

    // Two more: all three slots run and one waits, load 1.33, unavailable; every class is refused at once.
    wait_for(http_addr, "degraded");
    let more = [hold(http_addr), hold(http_addr)];
    wait_for(http_addr, "unavailable");
    for key in [HIGH, NORMAL, LOW] {
        let r = ask(http_addr, key, 2);
        assert_eq!(r.status, 529, "{}", r.body);
        assert!(r.body.contains("unavailable"), "{}", r.body);
    }

    // The streams end: healthy again, and the low class is served.
    drop((held, more));
    wait_for(http_addr, "healthy");
    assert_eq!(ask(http_addr, LOW, 2).status, 200);
    let readyz = request(http_addr, "GET", "/readyz", &[], "").unwrap();
    assert!(readyz.body.contains("\"level\":\"healthy\""), "{}", readyz.body);
}
