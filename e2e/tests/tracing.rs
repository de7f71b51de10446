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
    let data = dir.path().join("data");
    // Export checks the chain against the orchestrators' committed head: the frontend commits it within a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let export = loop {
        let out = zl_e2e::zl(&["audit", "export", "--data-dir", data.to_str().unwrap(), chain.to_str().unwrap()]);
        let export = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && export.contains(rid) {
            break export;
        }
        assert!(std::time::Instant::now() < deadline, "{}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(200));
    };
    let record: serde_json::Value =
        serde_json::from_str(export.lines().find(|l| l.contains(rid)).expect("the request's audit record")).unwrap();
    assert_eq!(record["trace_id"], TRACE);
    assert!(up.terminate(Duration::from_secs(30)));
}

/// A stand-in OpenTelemetry collector: accepts OTLP/HTTP posts on 127.0.0.1 and keeps their bodies.
fn collector() -> (std::net::SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = bodies.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let kept = kept.clone();
            std::thread::spawn(move || {
                let mut writer = conn.try_clone().unwrap();
                let mut reader = BufReader::new(conn);
                // One request after another on the connection, until the exporter closes it.
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line.trim().is_empty() {
                            break;
                        }
                        if let Some((k, v)) = line.split_once(':')
                            && k.eq_ignore_ascii_case("content-length")
                        {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0u8; length.min(64 << 20)];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    kept.lock().unwrap().push(String::from_utf8_lossy(&body).into_owned());
                    let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if writer.write_all(ok.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, bodies)
}

#[test]
fn spans_go_to_an_otlp_collector_under_the_requests_trace() {
    let (addr, bodies) = collector();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://{addr}");
    let (mut up, http, _) = zl_up(dir.path(), "data", KEY, &[], &[("ZL_OTLP_ENDPOINT", &endpoint)]);
    const OTEL_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    let r = ask(http, &[("traceparent", &format!("00-{OTEL_TRACE}-b7ad6b7169203331-01"))]);
    assert_eq!(r.status, 200, "{}", r.body);
    // Every tier exports its span of the request under the client's trace id (batches leave every 5 s).
    let deadline = Instant::now() + Duration::from_secs(60);
    for service in ["zl-frontend", "zl-orchestrator", "zl-worker"] {
        loop {
            let found = bodies.lock().unwrap().iter().any(|b| b.contains(service) && b.contains(OTEL_TRACE));
            if found {
                break;
            }
            assert!(Instant::now() < deadline, "{service} exported no span of trace {OTEL_TRACE}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // The orchestrator's and the worker's spans are children of the frontend's: their parent is its span id.
    let spans: Vec<serde_json::Value> = bodies
        .lock()
        .unwrap()
        .iter()
        .filter_map(|b| serde_json::from_str::<serde_json::Value>(b).ok())
        .flat_map(|v| {
            let mut out = Vec::new();
            for rs in v["resourceSpans"].as_array().cloned().unwrap_or_default() {
                for ss in rs["scopeSpans"].as_array().cloned().unwrap_or_default() {
                    out.extend(ss["spans"].as_array().cloned().unwrap_or_default());
                }
            }
            out
        })
        .filter(|s| s["traceId"] == OTEL_TRACE)
        .collect();
    let span =
        |name: &str| spans.iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no {name} span: {spans:?}"));
    let request = span("request");
    assert_eq!(request["parentSpanId"], "b7ad6b7169203331", "the client's span is the frontend's parent");
    assert_eq!(span("route")["parentSpanId"], request["spanId"]);
    assert_eq!(span("generate")["parentSpanId"], request["spanId"]);
    // The worker's time splits into the prompt (with any wait in the batch) and the answer.
    assert_eq!(span("prefill")["parentSpanId"], span("generate")["spanId"]);
    assert_eq!(span("decode")["parentSpanId"], span("generate")["spanId"]);
    assert!(up.terminate(Duration::from_secs(30)));
}
