//! A worker's adapter cache: loads on first use under the adapter root (SHA-256 checked), keeps at most
//! `--max-adapters` (and `--adapter-memory-mb`), evicts the least recently used idle one, never one a running sequence holds, and refuses
//! paths outside the root.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::lora::{random_updates, write_peft};
use zl_wire::message::{AdapterRef, ErrorCode};
use zl_worker::adapters::{AdapterCache, AdapterSettings, ForModel};
use zl_worker::model::llama::LlamaConfig;
use zl_worker::model::lora::Target;

fn config() -> LlamaConfig {
    LlamaConfig {
        hidden: 32,
        intermediate: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        vocab: 16,
        rms_eps: 1e-5,
        rope_theta: 10_000.0,
        context_length: 64,
        ..Default::default()
    }
}

/// A PEFT adapter in `root/name`; its registry reference.
fn adapter(root: &Path, name: &str, seed: u64) -> AdapterRef {
    let dir = root.join(name);
    write_peft(&dir, &random_updates(&config(), &[Target::Q, Target::Down], 2, seed, 0.1), 4.0, false);
    let digest =
        ring::digest::digest(&ring::digest::SHA256, &std::fs::read(dir.join("adapter_model.safetensors")).unwrap());
    AdapterRef { name: name.into(), path: name.into(), sha256: digest.as_ref().try_into().unwrap() }
}

#[tokio::test]
async fn adapters_load_once_evict_the_idle_least_recently_used_and_stay_inside_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let refs: Vec<AdapterRef> = (0..3).map(|i| adapter(&root, &format!("a{i}"), i)).collect();
    let cache = Arc::new(AdapterCache::new(AdapterSettings { root: Some(root.clone()), max: 2, max_bytes: 0 }));
    let cfg = config();
    let base = ForModel { id: "m", config: &cfg, family: "llama" };

    let a0 = cache.get(base, &refs[0]).await.unwrap();
    assert!(Arc::ptr_eq(&a0.adapter, &cache.get(base, &refs[0]).await.unwrap().adapter), "loaded once");
    assert_eq!(a0.key, zl_common::block_hash::adapter_key(&refs[0].sha256));
    let a1 = cache.get(base, &refs[1]).await.unwrap();
    drop(a1);
    // a0 is in use (held here); a1 is idle: loading a2 evicts a1, not a0.
    cache.get(base, &refs[2]).await.unwrap();
    assert_eq!(cache.resident(), ["a0", "a2"]);
    drop(a0);
    // Now a0 is idle and least recently used.
    cache.get(base, &refs[1]).await.unwrap();
    assert_eq!(cache.resident(), ["a1", "a2"]);

    // A file that does not match its registered SHA-256, a path out of the root, a missing one.
    let wrong = AdapterRef { sha256: [0; 32], ..refs[0].clone() };
    let e = cache.get(base, &wrong).await.unwrap_err();
    assert!(e.code == ErrorCode::InvalidRequest && e.message.contains("SHA-256"), "{e:?}");
    adapter(dir.path(), "outside", 9);
    let escape = AdapterRef { path: "../outside".into(), ..refs[0].clone() };
    assert!(cache.get(base, &escape).await.unwrap_err().message.contains("outside the adapter root"));
    let missing = AdapterRef { path: "nope".into(), ..refs[0].clone() };
    assert_eq!(cache.get(base, &missing).await.unwrap_err().code, ErrorCode::NotFound);
    // An adapter for another shape is refused by name.
    let wide = LlamaConfig { hidden: 64, ..config() };
    let other = ForModel { id: "m2", config: &wide, family: "llama" };
    assert!(cache.get(other, &refs[0]).await.unwrap_err().message.contains("another model"));
    // A memory cap of one adapter's size keeps one, however many the count allows.
    let one = cache.get(base, &refs[1]).await.unwrap().adapter.memory_bytes();
    let small = Arc::new(AdapterCache::new(AdapterSettings { root: Some(root.clone()), max: 8, max_bytes: one }));
    for r in &refs {
        small.get(base, r).await.unwrap();
    }
    assert_eq!(small.resident(), ["a2"]);
    // Without a root, nothing is served.
    let none = Arc::new(AdapterCache::new(AdapterSettings { root: None, max: 2, max_bytes: 0 }));
    assert!(none.get(base, &refs[0]).await.unwrap_err().message.contains("--adapter-root"));
}
