//! Tenant isolation through a real `zl up` cluster (docs/api.md, "Isolation"): two projects share the bundled
//! model's worker, yet neither sees the other through a cache. Project B sending project A's greedy request gets
//! no response-cache hit, and B sending A's long system prompt with a new question reads no cached prompt tokens
//! (`cache_read_input_tokens` 0) where A itself reads them; once an admin puts both projects in one cache group,
//! they share both caches.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use zl_e2e::{request, up_admin, up_projects, zl_up};

const KEY: &str = "sk-zl-isolation-test-key-0123456789";
const KEY_A: &str = "sk-zl-isolation-alpha-0123456789abc";
const KEY_B: &str = "sk-zl-isolation-beta-0123456789abcd";

/// A's confidential document: a system prompt of a few hundred tokens.
fn document() -> String {
    let mut doc = String::from("You are the assistant of Alpha Corp. Confidential briefing follows.\n");
    for i in 0..24 {
        doc.push_str(&format!(
            "Clause {i}: the merger with Vega closes in quarter {} at price {}.\n",
            i % 4 + 1,
            40 + i
        ));
    }
    doc
}

/// Ask greedily; the response's cache header and `usage.cache_read_input_tokens`.
fn ask(http: SocketAddr, model: &str, key: &str, question: &str) -> (String, u64) {
    let body = serde_json::json!({"model": model, "max_tokens": 4, "temperature": 0, "system": document(),
        "messages": [{"role": "user", "content": question}]})
    .to_string();
    let r = request(http, "POST", "/v1/messages", &[("x-api-key", key)], &body).expect("the frontend answers");
    assert_eq!(r.status, 200, "{}", r.body);
    let json: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let cached = json["usage"]["cache_read_input_tokens"].as_u64().expect("usage.cache_read_input_tokens");
    (r.header("x-zl-cache").unwrap_or_default().to_owned(), cached)
}

#[test]
fn projects_share_no_cache_unless_an_admin_groups_them() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, http, state) = zl_up(dir.path(), "data", KEY, &[], &[]);
    let data = dir.path().join("data");
    let model = state["model"].as_str().unwrap().to_owned();
    up_projects(&data, http, &[("alpha", "ka", KEY_A), ("beta", "kb", KEY_B)]);

    // A's own traffic: its prompt's prefix blocks are cached on the worker, its greedy answer in the frontend.
    let (cache, _) = ask(http, &model, KEY_A, "When does the merger close?");
    assert_eq!(cache, "miss");
    let (cache, cached) = ask(http, &model, KEY_A, "At what price?");
    eprintln!("A, second question: {cached} cached prompt tokens");
    assert_eq!(cache, "miss");
    assert!(cached >= 200, "A reads its own cached prefix: {cached} tokens");

    // B: A's exact request is no hit, and A's document as a prefix reads nothing cached: no oracle on A's prompt.
    let (cache, cached) = ask(http, &model, KEY_B, "When does the merger close?");
    eprintln!("B, A's request: x-zl-cache {cache}, {cached} cached prompt tokens");
    assert_eq!(cache, "miss", "B got A's cached answer");
    assert_eq!(cached, 0, "B read {cached} of A's cached prompt tokens");
    let (_, cached) = ask(http, &model, KEY_B, "Who is the buyer?");
    assert!(cached >= 200, "B's own prefix is cached for B: {cached}");
    assert_eq!(ask(http, &model, KEY_A, "When does the merger close?").0, "hit", "A's own answer");

    // An admin puts both projects in one cache group: they share both caches from then on.
    up_admin(&data, &["cache-group", "alpha", "partners"]);
    up_admin(&data, &["cache-group", "beta", "partners"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    loop {
        // A new question each round, so that only the group's prefix can be cached for it.
        n += 1;
        let question = format!("Summarise clause {n}.");
        let (_, _) = ask(http, &model, KEY_A, &question);
        if ask(http, &model, KEY_B, &question).0 == "hit" {
            break;
        }
        assert!(Instant::now() < deadline, "the cache group never took effect at the frontend");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (cache, cached) = ask(http, &model, KEY_B, "Name the other company.");
    eprintln!("B in the group, a new question: {cached} cached prompt tokens (after {n} rounds)");
    assert_eq!(cache, "miss");
    assert!(cached >= 200, "B reads the group's cached prefix: {cached}");

    // Operator-chosen secrets are stored keyed with the cluster's pepper: the Raft log and snapshots on disk hold
    // no bare SHA-256 of them (no offline dictionary attack on a copy of the data directory).
    let (mut keyed, mut bare) = (0, 0);
    let needles = [KEY_A, KEY_B].map(zl_common::keys::secret_sha256);
    let mut dirs = vec![data.clone()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                let text = String::from_utf8_lossy(&bytes);
                keyed += text.matches(zl_common::keys::KEYED_PREFIX).count();
                bare += needles.iter().filter(|n| text.contains(n.as_str())).count();
            }
        }
    }
    assert!(keyed > 0, "no keyed secret hash in the data directory");
    assert_eq!(bare, 0, "a bare SHA-256 of an operator's secret is on disk");
}
