//! The KV cache's disk tier through a real `zl up` cluster (`--kv-host-mb`, `--kv-disk-mb`): a project's long system
//! prompt, computed once, is read back from the worker's disk tier after the worker is killed and restarted (its
//! hot pool empty), for that project only; another project sending the same document reads nothing of it; and once
//! every block file of the tier has a flipped byte, the restarted worker computes the prompt again (the same greedy
//! answer) and counts the bad files instead of serving them. Once an admin puts A in a cache group with C, C reads
//! the group's prefix from the restarted worker's disk and B, outside the group, still reads nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use zl_e2e::{metric_sum, metrics, pids, read_state, request, signal, up_projects, wait_restarted, zl_up};

const KEY: &str = "sk-zl-kv-tiers-admin-key-0123456789";
const KEY_A: &str = "sk-zl-kv-tiers-alpha-0123456789abcd";
const KEY_B: &str = "sk-zl-kv-tiers-beta-0123456789abcdef";
const KEY_C: &str = "sk-zl-kv-tiers-gamma-0123456789abcde";

/// A's document: a system prompt of several hundred tokens.
fn document() -> String {
    let mut doc = String::from("You are the archivist of the Alpha harbour. The ledger follows.\n");
    for i in 0..30 {
        doc.push_str(&format!("Entry {i}: the ship Vega {} unloaded {} crates of copper.\n", i % 7, 12 + 3 * i));
    }
    doc
}

/// Ask greedily (past the response cache); the answer's text and `usage.cache_read_input_tokens`. Retries
/// (bounded) while the worker restarts.
fn ask(http: SocketAddr, key: &str, question: &str) -> (String, u64) {
    let body = serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": 8, "temperature": 0,
        "system": document(), "messages": [{"role": "user", "content": question}]})
    .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = request(http, "POST", "/v1/messages", &[("x-api-key", key), ("x-zl-cache", "bypass")], &body);
        if let Some(r) = r.filter(|r| r.status == 200) {
            let json: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            let text = json["content"][0]["text"].as_str().unwrap_or_default().to_owned();
            return (text, json["usage"]["cache_read_input_tokens"].as_u64().expect("cache_read_input_tokens"));
        }
        assert!(Instant::now() < deadline, "no answer while the worker restarted");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Kill worker-0 (SIGKILL) and wait until `zl up` has restarted it.
fn restart_worker(data: &Path) {
    let old = pids(&read_state(data)).into_iter().find(|(n, _)| n == "worker-0").unwrap().1;
    signal(old, "-KILL");
    wait_restarted(data, "worker-0", old);
}

/// Every block file of the workers' disk tiers under `data/kv`.
fn block_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(block_files(&path));
        } else if path.extension().is_some_and(|e| e == "kvb") {
            out.push(path);
        }
    }
    out
}

#[test]
fn a_restarted_worker_serves_a_project_its_prefix_from_disk_and_recomputes_a_damaged_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, http, _) = zl_up(dir.path(), "data", KEY, &["--kv-host-mb", "64", "--kv-disk-mb", "256"], &[]);
    let data = dir.path().join("data");
    up_projects(&data, http, &[("alpha", "ka", KEY_A), ("beta", "kb", KEY_B), ("gamma", "kc", KEY_C)]);

    let (first, cached) = ask(http, KEY_A, "How many crates did entry 3 unload?");
    assert_eq!(cached, 0, "nothing cached yet");
    // The blocks are written through to disk by the worker's writer thread: wait (bounded) until they are there.
    let deadline = Instant::now() + Duration::from_secs(20);
    while block_files(&data.join("kv")).len() < 10 {
        assert!(Instant::now() < deadline, "the disk tier holds {} blocks", block_files(&data.join("kv")).len());
        std::thread::sleep(Duration::from_millis(100));
    }

    restart_worker(&data);
    // B, the same document after the restart: nothing of A's from the disk tier (nor from anywhere).
    let (_, cached) = ask(http, KEY_B, "How many crates did entry 3 unload?");
    assert_eq!(cached, 0, "B read {cached} of A's cached prompt tokens");
    // A: its prefix comes back from disk (the restarted worker's hot pool held nothing of it).
    let (again, cached) = ask(http, KEY_A, "How many crates did entry 3 unload?");
    eprintln!("A after the restart: {cached} cached prompt tokens");
    assert!(cached >= 300, "A's prefix came back from the disk tier: {cached} tokens");
    assert_eq!(again, first, "the same greedy answer from the disk tier's blocks");

    // Damage every block file, then restart: A's prompt is computed again, the answer unchanged.
    restart_worker(&data);
    let files = block_files(&data.join("kv"));
    assert!(!files.is_empty());
    for f in &files {
        let mut bytes = std::fs::read(f).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x20;
        std::fs::write(f, bytes).unwrap();
    }
    let (damaged, cached) = ask(http, KEY_A, "How many crates did entry 3 unload?");
    assert_eq!(cached, 0, "a damaged block was served");
    assert_eq!(damaged, first);
    let state = read_state(&data);
    let worker = state["workers"][0]["metrics"].as_str().unwrap().parse().unwrap();
    let bad = metric_sum(&metrics(worker).unwrap_or_default(), "zl_worker_kv_tier_corrupt_total");
    assert!(bad >= 1.0, "the bad file was counted: {bad}");

    // A and C in one cache group (a new question each round until the frontend applies it, C reading A's prefix).
    zl_e2e::up_admin(&data, &["cache-group", "alpha", "partners"]);
    zl_e2e::up_admin(&data, &["cache-group", "gamma", "partners"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in 0.. {
        let question = format!("How many crates did entry {n} unload?");
        ask(http, KEY_A, &question);
        if ask(http, KEY_C, &question).1 >= 300 {
            break;
        }
        assert!(Instant::now() < deadline, "the cache group never took effect");
    }
    // After a restart, the group's prefix is on disk only: C reads it, B (outside the group) nothing.
    restart_worker(&data);
    let (_, cached) = ask(http, KEY_B, "Which ship came last?");
    assert_eq!(cached, 0, "B read {cached} of the group's cached prompt tokens");
    let (_, cached) = ask(http, KEY_C, "Which ship came last?");
    assert!(cached >= 300, "C reads the group's prefix from the disk tier: {cached} tokens");
}
