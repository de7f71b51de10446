//! A project's `max_concurrent` holds fleet-wide (docs/audit.md, "Per-minute rate limits"): its slots are leased
//! from the orchestrators like the shared rate limits, so two frontends together admit no more requests in flight
//! than the limit, and a slot comes back when its request ends.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use zl_e2e::{admin, certs_more, http_stream, request, small_cluster, start_frontend_args, wait_for_key};

const KEY: &str = "sk-zl-concurrency-test-0123456789ab";

fn body(max_tokens: u32, stream: bool) -> String {
    serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0.8,
        "stream": stream, "messages": [{"role": "user", "content": "Write a very long story about the sea."}]})
    .to_string()
}

#[test]
fn two_frontends_together_admit_no_more_than_the_projects_concurrency_limit() {
    let dir = tempfile::tempdir().unwrap();
    let c = small_cluster(dir.path(), &["w0"], &[], &[], KEY);
    certs_more(dir.path(), &[("frontend", "fe-1")]);
    let (_fe1, second) = start_frontend_args(dir.path(), "fe-1", &[c.orch.quic], &[]);
    wait_for_key(second, KEY);
    admin(dir.path(), c.orch.admin, &["project", "p", "--concurrent", "1"]);

    // One long generation streams through the first frontend and holds the project's only slot; the second
    // frontend refuses the project's next request (once both have synced the limit, and the slot a request of the
    // round before held has come back through the reports: a bounded wait).
    let headers = [("x-api-key", KEY)];
    let deadline = Instant::now() + Duration::from_secs(30);
    let refusal = loop {
        assert!(Instant::now() < deadline, "the second frontend kept admitting past the fleet-wide limit of 1");
        let mut stream = http_stream(c.http, "POST", "/v1/messages", &headers, &body(2000, true)).unwrap();
        if stream.status == 429 {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        assert_eq!(stream.status, 200);
        let mut seen = String::new();
        while !seen.contains("content_block_delta") {
            seen.push_str(&stream.next_piece().expect("the stream continues"));
        }
        let r = request(second, "POST", "/v1/messages", &headers, &body(4, false)).unwrap();
        if r.status == 429 {
            break r;
        }
        assert_eq!(r.status, 200, "{}", r.body);
        drop(stream);
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(refusal.body.contains("rate_limit_error") && refusal.body.contains("in flight"), "{}", refusal.body);
    assert!(refusal.header("retry-after").is_some());

    // Once no request holds the slot, the second frontend gets it (bounded: its lease comes with a report).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = request(second, "POST", "/v1/messages", &headers, &body(4, false)).unwrap();
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(Instant::now() < deadline, "the slot never came back: {}", r.body);
        std::thread::sleep(Duration::from_millis(200));
    }
}
