//! Tenants do not see each other through shared caches (docs/api.md, "Isolation"): the response cache and the KV
//! prefix chain are scoped per project unless an admin puts projects in one cache group, and an answer is cached
//! under the weights version that actually served it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Instant;

use axum::body::Body;
use common::{KEY, MODEL, harness, json_of, post, sync_state, text};
use serde_json::{Value, json};
use zl_common::keys::secret_sha256;
use zl_wire::message::{ApiKeyEntry, ProjectQuota};

const KEY_B: &str = "sk-zl-test-key-of-beta";

/// Two projects, `acme` (key [`KEY`]) and `beta` (key [`KEY_B`]), each in `groups`' cache group where given.
fn two_projects(index: u64, groups: [&str; 2]) -> zl_wire::message::StateSync {
    let mut sync = sync_state(index);
    sync.keys.push(ApiKeyEntry {
        key_id: "key-b".into(),
        secret_sha256: secret_sha256(KEY_B),
        project: "beta".into(),
        regions: vec![],
    });
    sync.projects = ["acme", "beta"]
        .into_iter()
        .zip(groups)
        .map(|(p, g)| ProjectQuota { project: p.into(), cache_group: g.into(), ..ProjectQuota::default() })
        .collect();
    sync
}

/// `POST /v1/messages` with `key` and `body`.
fn messages(key: &str, body: impl Into<Body>) -> axum::http::Request<Body> {
    post("/v1/messages", ()).header("x-api-key", key).body(body.into()).unwrap()
}

/// A small request, sampled (not cacheable).
fn hello() -> String {
    json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}).to_string()
}

/// A greedy request long enough for several KV blocks (the fake's block size is 4).
fn greedy() -> Value {
    json!({"model": MODEL, "max_tokens": 4, "temperature": 0, "system": "secret plans",
        "messages": [{"role": "user", "content": "hello world"}]})
}

async fn ask(h: &common::Harness, key: &str) -> String {
    let req = messages(key, greedy().to_string());
    let resp = h.send(req).await;
    let status = resp.status();
    let cache = resp.headers().get("x-zl-cache").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let body = text(resp).await;
    assert_eq!(status, 200, "{body}");
    cache
}

#[tokio::test]
async fn one_project_never_hits_another_projects_cache() {
    let h = harness();
    h.cluster.apply(two_projects(1, ["", ""]), Instant::now());
    assert_eq!(ask(&h, KEY).await, "miss");
    assert_eq!(ask(&h, KEY_B).await, "miss", "beta sent acme's greedy prompt: no hit");
    assert_eq!(ask(&h, KEY).await, "hit");
    assert_eq!(ask(&h, KEY_B).await, "hit", "beta's own answer");

    // Each project's prompt went to the worker salted with its own scope, and routed by salted block hashes: no
    // block hash of one is a block hash of the other, so neither prefix-aware routing nor the worker's prefix cache
    // (and `cache_read_input_tokens`) can tell one tenant about the other's prompt.
    let recorded = h.fake.recorded.lock().unwrap();
    let (a, b) = (&recorded.generates[0].1, &recorded.generates[1].1);
    assert_eq!(a.prompt, b.prompt);
    assert_ne!(a.cache_salt, 0);
    assert_ne!(a.cache_salt, b.cache_salt);
    assert_eq!(a.cache_salt, zl_common::block_hash::cache_salt("project:acme"));
    let (ra, rb) = (&recorded.routes[0].block_hashes, &recorded.routes[1].block_hashes);
    assert!(ra.len() >= 4, "the prompt spans several blocks: {}", ra.len());
    assert!(ra.iter().all(|h| !rb.contains(h)));
}

#[tokio::test]
async fn projects_in_one_cache_group_share() {
    let h = harness();
    h.cluster.apply(two_projects(1, ["team", "team"]), Instant::now());
    assert_eq!(ask(&h, KEY).await, "miss");
    assert_eq!(ask(&h, KEY_B).await, "hit", "an admin put both projects in cache group `team`");
    // Taking beta out of the group gives it its own caches again.
    h.cluster.apply(two_projects(2, ["team", ""]), Instant::now());
    assert_eq!(ask(&h, KEY_B).await, "miss");
    let recorded = h.fake.recorded.lock().unwrap();
    assert_eq!(recorded.generates[0].1.cache_salt, zl_common::block_hash::cache_salt("group:team"));
    assert_eq!(recorded.generates[1].1.cache_salt, zl_common::block_hash::cache_salt("project:beta"));
}

#[tokio::test]
async fn an_answer_is_cached_under_the_version_that_served_it() {
    let h = harness();
    h.cluster.apply(two_projects(1, ["", ""]), Instant::now());
    // A canary: the route serves another version than the model card names. Its answer must not become the
    // card's version's cached answer.
    *h.fake.served_weights.lock().unwrap() = [0xcd; 32];
    assert_eq!(ask(&h, KEY).await, "miss");
    assert_eq!(ask(&h, KEY).await, "miss", "stored as the canary's answer, not the card's");
    // Served by the card's version, the answer is cached and found again.
    *h.fake.served_weights.lock().unwrap() = [0xab; 32];
    assert_eq!(ask(&h, KEY).await, "miss");
    assert_eq!(ask(&h, KEY).await, "hit");
}

fn count(key: &str) -> axum::http::Request<Body> {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello world"}]});
    post("/v1/messages/count_tokens", ()).header("x-api-key", key).body(Body::from(body.to_string())).unwrap()
}

#[tokio::test]
async fn count_tokens_is_admitted_like_a_generation_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let h = common::harness_audited(dir.path());
    let mut sync = two_projects(1, ["", ""]);
    // beta's key may only be served in region `elsewhere`; acme may make one request a minute.
    sync.keys[1].regions = vec!["elsewhere".into()];
    sync.projects[0].requests_per_minute = 1;
    h.cluster.apply(sync, Instant::now());

    let bound = h.send(count(KEY_B)).await;
    assert_eq!(bound.status(), 403, "data residency holds for count_tokens: {}", text(bound).await);
    let first = h.send(count(KEY)).await;
    assert_eq!(first.status(), 200);
    assert!(json_of(first).await["input_tokens"].as_u64().unwrap() > 0);
    let second = h.send(count(KEY)).await;
    assert_eq!(second.status(), 429, "the key's request limit counts count_tokens too");
    assert!(second.headers().contains_key("retry-after"));

    // Each call, refusals included, left an audit record.
    let mut records = Vec::new();
    zl_node::audit::verify_dir(dir.path(), None, false, |r| records.push(r.clone())).unwrap();
    let statuses: Vec<(u16, &str, u32)> =
        records.iter().map(|r| (r.status, r.key_id.as_str(), r.input_tokens)).collect();
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    assert_eq!((statuses[0].0, statuses[0].1), (403, "key-b"));
    assert_eq!((statuses[1].0, statuses[1].1), (200, "key-1"));
    assert!(statuses[1].2 > 0, "the counted tokens are recorded");
    assert_eq!(statuses[2].0, 429);
}

#[tokio::test]
async fn a_worker_cannot_charge_more_than_the_request_allowed() {
    let h = harness();
    h.cluster.apply(two_projects(1, ["", ""]), Instant::now());
    *h.fake.claimed_usage.lock().unwrap() = Some((1_000_000, 1_000_000));
    let resp = h.send(messages(KEY, hello())).await;
    assert_eq!(resp.status(), 200);
    let usage = json_of(resp).await["usage"].clone();
    assert_eq!(usage["output_tokens"], 4, "capped at max_tokens: {usage}");
    let prompt = h.fake.recorded.lock().unwrap().generates[0].1.prompt.clone();
    let zl_wire::message::Prompt::Tokens(tokens) = prompt else { panic!("tokens") };
    assert_eq!(usage["input_tokens"], tokens.len(), "capped at the prompt the frontend sent: {usage}");
}

#[tokio::test]
async fn a_key_over_its_limit_is_refused_before_its_body_is_read() {
    let h = harness();
    let mut sync = two_projects(1, ["", ""]);
    sync.projects[0].requests_per_minute = 1;
    h.cluster.apply(sync, Instant::now());
    assert_eq!(h.send(messages(KEY, greedy().to_string())).await.status(), 200);
    // A body that never arrives: were it read before admission, this would hang.
    let never = futures_util::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
    let req = messages(KEY, Body::from_stream(never));
    let resp = tokio::time::timeout(std::time::Duration::from_secs(5), h.send(req)).await.expect("answered at once");
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    // Another key is not affected.
    assert_eq!(h.send(messages(KEY_B, greedy().to_string())).await.status(), 200);
}

#[tokio::test]
async fn an_answer_comes_only_from_the_worker_the_route_named() {
    let h = harness();
    h.cluster.apply(two_projects(1, ["", ""]), Instant::now());
    // Another worker's process answers at w1's address (a stale address, or a node speaking with its tier's
    // certificate): its answer is not taken, the request is routed again, to w2.
    *h.fake.impostor_at_w1.lock().unwrap() = Some("w9".into());
    let resp = h.send(messages(KEY, hello())).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-zl-worker").unwrap(), "w2");
    let recorded = h.fake.recorded.lock().unwrap();
    assert_eq!(recorded.routes.len(), 2, "routed again without w1");
    assert_eq!(recorded.routes[1].excluded_workers.iter().map(|w| w.as_str()).collect::<Vec<_>>(), vec!["w1"]);
}
