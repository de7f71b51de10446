//! `zl up` keeps its cluster across restarts: the projects, keys, quotas, budgets and usage an operator created,
//! and the API key it generated, are all there after Ctrl-C and a new `zl up` on the same data dir; the banner says
//! so; `zl up --fresh` starts over (the old keys get 401).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

const SECRET: &str = "sk-zl-e2e-restart-acme-0123456789";

/// `zl ARGS` against the cluster in `data`, as a user types it (`--data-dir` after the subcommand).
fn zl(data: &Path, args: &[&str]) -> String {
    let (sub, rest) = args.split_first().unwrap();
    let out = Command::new(zl_e2e::bin("zl"))
        .arg(sub)
        .args(["--data-dir", data.to_str().unwrap()])
        .args(rest)
        .env_remove("ZL_DATA_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "zl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ask(http: SocketAddr, key: &str) -> zl_e2e::HttpResponse {
    let body = serde_json::json!({"model": "smollm2-135m-instruct", "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": "Name a colour."}]})
    .to_string();
    zl_e2e::request(http, "POST", "/v1/messages", &[("x-api-key", key), ("x-zl-cache", "bypass")], &body).unwrap()
}

/// The first answer of `key` that is not a 401: the frontend learns keys created a moment ago at its next sync.
fn ask_synced(http: SocketAddr, key: &str) -> zl_e2e::HttpResponse {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = ask(http, key);
        if r.status != 401 || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Tokens in `acme`'s usage rows, and its budget.
fn usage(data: &Path) -> (u64, Value) {
    let v: Value = serde_json::from_str(zl(data, &["admin", "usage", "--project", "acme", "--json"]).trim()).unwrap();
    let rows = v["usage"].as_array().unwrap();
    let tokens = rows.iter().map(|r| r["input_tokens"].as_u64().unwrap() + r["output_tokens"].as_u64().unwrap()).sum();
    (tokens, v["budgets"][0].clone())
}

/// The banner's `state` line, once the banner is complete.
fn state_line(dir: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = std::fs::read_to_string(dir.join("data.out")).unwrap_or_default();
        if out.contains("Ctrl-C stops the cluster") {
            return out.lines().map(str::trim).find(|l| l.starts_with("state ")).expect("a state line").to_owned();
        }
        assert!(Instant::now() < deadline, "no banner: {out}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn zl_up_keeps_its_cluster_across_restarts_and_fresh_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // No --api-key: zl up generates one, and must keep it.
    let (mut up, http, state) = zl_e2e::zl_up(dir.path(), "data", "", &[], &[]);
    let api_key = state["api_key"].as_str().unwrap().to_owned();
    assert!(state_line(dir.path()).starts_with("state     new"), "{}", state_line(dir.path()));
    zl(&data, &["admin", "project", "acme", "--tpm", "5000"]);
    zl(&data, &["admin", "keys", "create", "acme-app", "--project", "acme", "--secret", SECRET]);
    zl(&data, &["admin", "budget", "acme", "--limit", "100000", "--period", "month"]);
    let first = ask_synced(http, SECRET);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("anthropic-ratelimit-tokens-limit"), Some("5000"));
    // The frontend reports usage to the ledger every few seconds; wait until it is there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let used = loop {
        let (tokens, _) = usage(&data);
        if tokens > 0 {
            break tokens;
        }
        assert!(Instant::now() < deadline, "the request never showed in the usage ledger");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(up.terminate(Duration::from_secs(60)), "zl up stops cleanly");

    // A restart: everything is there, the banner says so.
    let (mut up, http, state) = zl_e2e::zl_up(dir.path(), "data", "", &[], &[]);
    assert_eq!(state["api_key"].as_str().unwrap(), api_key, "the generated API key is kept");
    let line = state_line(dir.path());
    assert!(line.starts_with("state     kept in") && line.contains("--fresh"), "{line}");
    for key in [SECRET, api_key.as_str()] {
        let r = ask_synced(http, key);
        assert_eq!(r.status, 200, "{key}: {}", r.body);
    }
    assert_eq!(ask(http, SECRET).header("anthropic-ratelimit-tokens-limit"), Some("5000"), "the quota is kept");
    let keys = zl(&data, &["admin", "keys", "list"]);
    assert!(keys.contains("acme-app") && keys.contains("local"), "{keys}");
    let (tokens, budget) = usage(&data);
    assert!(tokens >= used, "usage before the restart is kept: {tokens} < {used}");
    assert_eq!(budget["limit"].as_f64(), Some(100000.0), "{budget}");
    // zl audit verify checks the chain across both runs against the kept heads.
    zl(&data, &["audit", "verify"]);
    assert!(up.terminate(Duration::from_secs(60)), "zl up stops cleanly");

    // --fresh: a new cluster, the old keys refused.
    let (mut up, http, state) = zl_e2e::zl_up(dir.path(), "data", "", &["--fresh"], &[]);
    let new_key = state["api_key"].as_str().unwrap().to_owned();
    assert_ne!(new_key, api_key);
    assert!(state_line(dir.path()).starts_with("state     new"), "{}", state_line(dir.path()));
    assert_eq!(ask(http, SECRET).status, 401);
    assert_eq!(ask(http, &api_key).status, 401);
    assert_eq!(ask_synced(http, &new_key).status, 200);
    let keys = zl(&data, &["admin", "keys", "list"]);
    assert!(!keys.contains("acme-app"), "{keys}");
    assert!(up.terminate(Duration::from_secs(60)), "zl up stops cleanly");
}
