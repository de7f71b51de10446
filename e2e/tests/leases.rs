//! Leased limits admit up to the limit, not far below it, with the chart's defaults (a lease is 5% of a limit,
//! reports every second): a burst spread over two frontends gets what a budget or a per-minute limit allows
//! (within a stated tolerance), a project's concurrency slot comes back as soon as its request ends, and a request
//! refused by one limit takes nothing from the others.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::Duration;

use zl_e2e::{admin, certs_more, http, http_stream, request, small_cluster, start_frontend_args};

const KEY: &str = "sk-zl-lease-test-key-0123456789abcd";

fn body(n: usize, max_tokens: u32) -> String {
    serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": format!("Say something about the number {n}.")}]})
    .to_string()
}

/// `n` requests at once, alternating between `frontends`: each answer's status and tokens used.
fn burst(frontends: &[SocketAddr], key: &'static str, n: usize, max_tokens: u32) -> Vec<(u16, u64)> {
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let fe = frontends[i % frontends.len()];
            std::thread::spawn(move || {
                let headers = [("x-api-key", key), ("x-zl-cache", "bypass")];
                let r = request(fe, "POST", "/v1/messages", &headers, &body(i, max_tokens)).unwrap();
                let tokens = match r.status {
                    200 => {
                        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
                        v["usage"]["input_tokens"].as_u64().unwrap() + v["usage"]["output_tokens"].as_u64().unwrap()
                    }
                    429 => {
                        eprintln!("429: {}", r.body);
                        0
                    }
                    other => panic!("unexpected {other}: {}", r.body),
                };
                (r.status, tokens)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn wait_for_key(frontends: &[SocketAddr]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for fe in frontends {
        while http(*fe, "GET", "/v1/models", &[("x-api-key", KEY)], "").map(|r| r.0) != Some(200) {
            assert!(std::time::Instant::now() < deadline, "{fe} never accepted the key");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Until both frontends have heard of the project's new limits (a sync, then a report's answer).
fn settle() {
    std::thread::sleep(Duration::from_millis(2500));
}

/// A cluster of one worker and two frontends (the chart's defaults: 5% leases, a report a second), serving `KEY`
/// of project `p`, with `quota` set on it: the cluster, the second frontend and both frontends' addresses.
fn two_frontends(dir: &std::path::Path, quota: &[&str]) -> (zl_e2e::SmallCluster, zl_e2e::Proc, [SocketAddr; 2]) {
    let cluster = small_cluster(dir, &["w1"], &[], &[], KEY);
    certs_more(dir, &[("frontend", "fe-1")]);
    let (fe1, second) = start_frontend_args(dir, "fe-1", &[cluster.orch.quic], &[]);
    let frontends = [cluster.http, second];
    wait_for_key(&frontends);
    admin(dir, cluster.orch.admin, quota);
    settle();
    (cluster, fe1, frontends)
}

#[test]
fn a_burst_over_two_frontends_gets_the_per_minute_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, _fe1, frontends) = two_frontends(dir.path(), &["project", "p", "--rpm", "10"]);
    // 10 requests a minute for the project, 40 at once over two frontends: 9 or 10 admitted.
    let answers = burst(&frontends, KEY, 40, 1);
    let admitted = answers.iter().filter(|(s, _)| *s == 200).count();
    eprintln!("rpm 10: {admitted} of 40 admitted");
    assert!((9..=10).contains(&admitted), "{admitted} of 40 admitted under a limit of 10 a minute");
}

/// Three clients per frontend, each sending ten requests one after another whatever the answers: a load spread
/// over both frontends and over time.
fn spread(frontends: &[SocketAddr; 2], key: &'static str, max_tokens: u32) -> Vec<(u16, u64)> {
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let fe = frontends[t % 2];
            std::thread::spawn(move || {
                (0..10)
                    .map(|i| {
                        let headers = [("x-api-key", key), ("x-zl-cache", "bypass")];
                        let r = request(fe, "POST", "/v1/messages", &headers, &body(t * 100 + i, max_tokens)).unwrap();
                        match r.status {
                            200 => {
                                let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
                                let u = &v["usage"];
                                (200, u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap())
                            }
                            429 => (429, 0),
                            other => panic!("unexpected {other}: {}", r.body),
                        }
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
}

#[test]
fn a_load_spread_over_two_frontends_gets_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = ["budget", "p", "--metric", "tokens", "--period", "day", "--limit", "1500"];
    let (_cluster, _fe1, frontends) = two_frontends(dir.path(), &budget);
    // A daily budget of 1,500 tokens, 60 requests of about 47 tokens each from six clients over two frontends: at
    // least 90% of the budget is used, never more than all of it.
    let answers = spread(&frontends, KEY, 8);
    let admitted = answers.iter().filter(|(s, _)| *s == 200).count();
    let spent: u64 = answers.iter().map(|(_, t)| t).sum();
    eprintln!("budget 1500: {admitted} of 60 admitted, {spent} tokens");
    assert!(spent <= 1500, "{spent} tokens spent of a 1,500-token budget");
    assert!(spent >= 1350, "{admitted} of 60 admitted, {spent} tokens: under 90% of the 1,500-token budget");
}

#[test]
fn a_concurrency_slot_comes_back_when_its_request_ends_and_refusals_cost_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path();
    let cluster = small_cluster(tls, &["w1"], &[], &[], KEY);
    admin(tls, cluster.orch.admin, &["project", "p", "--rpm", "10", "--concurrent", "1"]);
    settle();
    // Sequential requests, each ended before the next: every one fits both limits.
    let mut statuses = Vec::new();
    for i in 0..8 {
        let headers = [("x-api-key", KEY), ("x-zl-cache", "bypass")];
        let r = request(cluster.http, "POST", "/v1/messages", &headers, &body(i, 2)).unwrap();
        if r.status != 200 {
            eprintln!("request {i}: {} {}", r.status, r.body);
        }
        statuses.push(r.status);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(statuses, [200; 8], "sequential requests under --rpm 10 --concurrent 1");

    // Two a minute: requests refused for the concurrency slot take nothing from the per-minute allowance, so the
    // second request that runs is admitted after any number of refusals.
    admin(tls, cluster.orch.admin, &["project", "p", "--rpm", "2", "--concurrent", "1"]);
    std::thread::sleep(Duration::from_secs(61));
    // A long streamed answer holds the project's only slot from its first event until its last.
    let long_body = serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": 96, "temperature": 0,
        "stream": true, "messages": [{"role": "user", "content": "Write a long story about the sea."}]})
    .to_string();
    let headers = [("x-api-key", KEY), ("x-zl-cache", "bypass")];
    let mut long = http_stream(cluster.http, "POST", "/v1/messages", &headers, &long_body).unwrap();
    assert_eq!(long.status, 200, "the long request is admitted");
    let mut refused = 0;
    for i in 0..5 {
        let r = request(cluster.http, "POST", "/v1/messages", &headers, &body(2000 + i, 2)).unwrap();
        assert_eq!(r.status, 429, "the slot is held: {}", r.body);
        refused += 1;
    }
    let rest = long.rest();
    assert!(rest.contains("message_stop"), "{rest}");
    assert!(refused >= 1, "the slot was held while the long request ran");
    let headers = [("x-api-key", KEY), ("x-zl-cache", "bypass")];
    let after = request(cluster.http, "POST", "/v1/messages", &headers, &body(3000, 2)).unwrap();
    assert_eq!(after.status, 200, "the second request of the minute, after {refused} refusals: {}", after.body);
}
