//! A project budget held across three frontends: under concurrent load through all of them the project's usage
//! never passes the budget (each frontend admits only within the allotment it leased from the orchestrators), a
//! request past it gets a 429 naming the budget and its reset, the usage ledger counts every token, and a
//! frontend killed while holding a lease loses at most that lease.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use zl_e2e::{admin, certs_more, http, request, small_cluster, start_frontend_args};

const KEY: &str = "sk-zl-budget-test-key-p-0123456789";
const KEY_B: &str = "sk-zl-budget-test-key-b-0123456789";
const KEY_C: &str = "sk-zl-budget-test-key-c-0123456789";
/// Reports every 200 ms; a lease is a tenth of a budget and is charged 3 s after its frontend's last report.
const FE: &[&str] = &["--report-interval-ms", "200", "--lease-fraction", "0.1", "--lease-s", "3"];

/// One request; `Some(tokens used)` when answered, `None` when refused for the budget.
fn ask(http: SocketAddr, key: &str, n: u64) -> Option<u64> {
    let body = serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": format!("Say something about the number {n}.")}]})
    .to_string();
    let r = request(http, "POST", "/v1/messages", &[("x-api-key", key), ("x-zl-cache", "bypass")], &body).unwrap();
    match r.status {
        200 => {
            let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            Some(v["usage"]["input_tokens"].as_u64().unwrap() + v["usage"]["output_tokens"].as_u64().unwrap())
        }
        429 => {
            assert!(r.body.contains("budget of") && r.body.contains("resets at"), "{}", r.body);
            // For people an RFC 3339 time, for machines the epoch beside it.
            assert!(r.body.contains("Z (unix time "), "{}", r.body);
            assert!(r.header("retry-after").is_some_and(|s| s.parse::<u64>().unwrap() > 0));
            None
        }
        other => panic!("unexpected {other}: {}", r.body),
    }
}

/// Load through `frontends` (two clients each) until every client has been refused for a second on end (five
/// report intervals: leases other frontends return have come back by then); the tokens the answers used.
fn exhaust(frontends: &[SocketAddr], key: &'static str) -> u64 {
    let used = Arc::new(AtomicU64::new(0));
    let counter = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..frontends.len() * 2)
        .map(|t| {
            let (used, counter, fe) = (used.clone(), counter.clone(), frontends[t % frontends.len()]);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(300);
                let mut refused_since: Option<Instant> = None;
                while refused_since.is_none_or(|t| t.elapsed() < Duration::from_secs(1)) {
                    assert!(Instant::now() < deadline, "the budget was never exhausted");
                    match ask(fe, key, counter.fetch_add(1, Ordering::Relaxed)) {
                        Some(t) => {
                            used.fetch_add(t, Ordering::Relaxed);
                            refused_since = None;
                        }
                        None => {
                            refused_since.get_or_insert_with(Instant::now);
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    used.load(Ordering::Relaxed)
}

/// `zl admin usage --json` for a project: (tokens in its usage rows, the budget's spent and committed figures).
fn usage(tls: &std::path::Path, orch: SocketAddr, project: &str) -> (u64, f64, f64) {
    let out = admin(tls, orch, &["usage", "--project", project, "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let tokens = v["usage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["input_tokens"].as_u64().unwrap() + r["output_tokens"].as_u64().unwrap())
        .sum();
    let b = &v["budgets"][0];
    // Times for machines (the epoch) and for people (RFC 3339, UTC), in the JSON and in the table.
    let utc = b["resets_at_utc"].as_str().unwrap_or_default();
    assert!(utc.len() == 20 && utc.ends_with('Z') && b["resets_at"].as_u64().is_some(), "{b}");
    let table = admin(tls, orch, &["usage", "--project", project]);
    assert!(table.contains("HOUR (UTC)") && table.contains(&format!("resets at {utc}, unix time")), "{table}");
    (tokens, b["spent"].as_f64().unwrap(), b["committed"].as_f64().unwrap())
}

fn wait_for_key(frontends: &[SocketAddr], key: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for fe in frontends {
        while http(*fe, "GET", "/v1/models", &[("x-api-key", key)], "").map(|r| r.0) != Some(200) {
            assert!(Instant::now() < deadline, "{fe} never accepted the key");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn three_frontends_hold_one_budget_and_a_dead_one_loses_at_most_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path();
    let cluster = small_cluster(tls, &["w1"], &[], FE, KEY);
    certs_more(tls, &[("frontend", "fe-1"), ("frontend", "fe-2")]);
    let (_fe1, http1) = start_frontend_args(tls, "fe-1", &[cluster.orch.quic], FE);
    let (mut fe2, http2) = start_frontend_args(tls, "fe-2", &[cluster.orch.quic], FE);
    let frontends = [cluster.http, http1, http2];
    let orch = cluster.orch.admin;

    // Project b: 1500 tokens a month, spent through all three frontends at once.
    admin(tls, orch, &["project", "b"]);
    admin(tls, orch, &["keys", "create", "kb", "--project", "b", "--secret", KEY_B]);
    admin(tls, orch, &["budget", "b", "--metric", "tokens", "--period", "month", "--limit", "1500"]);
    wait_for_key(&frontends, KEY_B);
    let used = exhaust(&frontends, KEY_B);
    eprintln!("project b: {used} tokens used of 1500");
    assert!(used <= 1500, "the three frontends together used {used} tokens of a 1500-token budget");
    // What is left is less than one request's worst case (under 60 tokens here) per frontend: nothing stranded.
    assert!(used >= 1500 - 3 * 60, "the budget was usable to its end: {used}");
    // Every answered token is in the ledger, and the ledger's spend is within the budget.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (tokens, spent, _) = usage(tls, orch, "b");
        if tokens == used {
            assert!(spent <= 1500.0, "spent {spent}");
            break;
        }
        assert!(Instant::now() < deadline, "the ledger counts {tokens} tokens, the answers {used}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Project c: 2000 tokens; the third frontend takes a lease (200 tokens), serves a little, and is killed.
    admin(tls, orch, &["project", "c"]);
    admin(tls, orch, &["keys", "create", "kc", "--project", "c", "--secret", KEY_C]);
    admin(tls, orch, &["budget", "c", "--metric", "tokens", "--period", "month", "--limit", "2000"]);
    wait_for_key(&frontends, KEY_C);
    let mut before = 0;
    for n in 0..2 {
        before += ask(http2, KEY_C, n).expect("within the budget");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while usage(tls, orch, "c").0 < before {
        assert!(Instant::now() < deadline, "fe-2's usage was never reported");
        std::thread::sleep(Duration::from_millis(100));
    }
    let held = usage(tls, orch, "c");
    assert!(held.2 > held.1, "fe-2 holds an unused lease: {held:?}");
    fe2.0.kill().unwrap();
    fe2.0.wait().unwrap();
    // After the lease time the orchestrators charge the dead frontend's lease; nothing stays outstanding.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (tokens, spent) = loop {
        let (tokens, spent, committed) = usage(tls, orch, "c");
        if (committed - spent).abs() < 0.5 {
            break (tokens, spent);
        }
        assert!(Instant::now() < deadline, "the dead frontend's lease never expired");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(tokens, before);
    let lost = spent - before as f64;
    eprintln!("project c: fe-2 used {before}, lost {lost} with its lease");
    assert!(lost > 0.0 && lost <= 200.0, "a dead frontend loses at most its lease (200): lost {lost}");
    // The two survivors can spend what is left, and no more.
    let more = exhaust(&frontends[..2], KEY_C);
    eprintln!("project c: the survivors used {more} more");
    assert!(before + more <= 2000 - lost as u64, "used {before} + {more} with {lost} lost of 2000");
    assert!(before + more + lost as u64 >= 2000 - 2 * 60, "the rest was usable: {before} + {more} + {lost} lost");
}

#[test]
fn a_keys_rate_limit_is_shared_by_three_frontends() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path();
    let cluster = small_cluster(tls, &["w1"], &[], FE, KEY);
    certs_more(tls, &[("frontend", "fe-1"), ("frontend", "fe-2")]);
    let (_fe1, http1) = start_frontend_args(tls, "fe-1", &[cluster.orch.quic], FE);
    let (_fe2, http2) = start_frontend_args(tls, "fe-2", &[cluster.orch.quic], FE);
    let frontends = [cluster.http, http1, http2];
    // 12 requests a minute for the key, however many frontends serve it (each would allow 12 on its own).
    admin(tls, cluster.orch.admin, &["project", "r", "--rpm", "12", "--tpm", "5000"]);
    admin(tls, cluster.orch.admin, &["keys", "create", "kr", "--project", "r", "--secret", KEY_B]);
    wait_for_key(&frontends, KEY_B);
    let started = Instant::now();
    let (mut served, mut limited, mut least_remaining) = (0u64, 0u64, u64::MAX);
    let mut tokens_limit = String::new();
    for n in 0..36 {
        let body = serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": format!("Hi {n}")}]})
        .to_string();
        let r = request(frontends[n % 3], "POST", "/v1/messages", &[("x-api-key", KEY_B)], &body).unwrap();
        match r.status {
            200 => {
                served += 1;
                let remaining = r.header("anthropic-ratelimit-requests-remaining").unwrap().parse::<u64>().unwrap();
                least_remaining = least_remaining.min(remaining);
                tokens_limit = r.header("anthropic-ratelimit-tokens-limit").unwrap_or_default().to_owned();
            }
            429 => {
                assert!(r.body.contains("shared by every frontend"), "{}", r.body);
                assert!(r.header("retry-after").is_some());
                limited += 1;
            }
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    // A token bucket of 12 a minute allows 12 at once plus what refills while the requests run.
    let refill = (12.0 * started.elapsed().as_secs_f64() / 60.0).ceil() as u64;
    eprintln!("rate limit: {served} served, {limited} refused, refill allowance {refill}");
    assert!(served <= 12 + refill, "{served} served of a 12-per-minute limit across three frontends");
    assert!(served >= 12, "the limit itself was usable: {served}");
    assert_eq!(served + limited, 36);
    // The rate-limit headers speak for the cluster: after a dozen requests through three frontends, what is left
    // is near zero (one frontend's own bucket would still show 8 of 12).
    assert!(least_remaining <= 3, "anthropic-ratelimit-requests-remaining fell only to {least_remaining}");
    // The tokens headers name the tightest token limit: the project's 5,000 a minute, not the key's defaults.
    assert_eq!(tokens_limit, "5000");
}
