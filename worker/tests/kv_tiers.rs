//! The KV cache's lower tiers on the bundled model: blocks evicted from a small hot pool come back from host memory
//! and give the same bytes as computing them again; the disk tier outlives its engine (a restart), a flipped byte
//! in one of its files is recomputed rather than served, another cache scope finds nothing of a prefix in any
//! tier, and neither tier grows past its bound under a load that overfills both.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use zl_worker::engine::{EngineCore, Event, Request};
use zl_worker::fetch;
use zl_worker::kv::dtype::KvDtype;
use zl_worker::kv::tier::Namespace;
use zl_worker::kv::tier::store::{TierConfig, Tiers};
use zl_worker::kv::window::KvLayout;
use zl_worker::model::gguf;
use zl_worker::sampling::Sampling;
use zl_worker::scheduler::SchedulerConfig;

const BS: usize = 16;

/// An engine on the bundled model with a hot pool of `blocks` blocks, and tiers as `tiers` says.
fn engine(blocks: usize, tiers: Option<TierConfig>) -> (EngineCore, Option<Arc<Tiers>>) {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let model = gguf::load(&path).unwrap();
    let mut core =
        EngineCore::on_device(model, Default::default(), KvLayout::full(blocks), BS, SchedulerConfig::default())
            .unwrap();
    let tiers = tiers.map(|config| {
        let ns = Namespace::new(&[7; 32], KvDtype::F16, BS, "test");
        let payload = core.tier_block_bytes().unwrap();
        let (t, _) = Tiers::open(ns, BS, payload, &config, "test").unwrap();
        core.attach_tiers(t.clone()).unwrap();
        t
    });
    (core, tiers)
}

/// A prompt of about `words` words on `topic`.
fn prompt(e: &EngineCore, topic: &str, words: usize) -> Vec<u32> {
    let text: Vec<String> = (0..words).map(|i| format!("{topic}{}", i % 17)).collect();
    common::chat_prompt(&e.model().tokenizer, "You are a helpful assistant.", &text.join(" "))
}

/// A greedy answer of `max` tokens and the prompt tokens served from a cache.
fn answer(e: &mut EngineCore, prompt: &[u32], salt: Option<u64>, max: u32) -> (Vec<u32>, u32) {
    let req = Request {
        cache_salt: salt,
        ..Request::new(prompt.to_vec(), Sampling { temperature: 0.0, top_p: 1.0, top_k: 0, seed: 1 }, max)
    };
    e.add(1, req).unwrap();
    let (mut out, mut cached) = (Vec::new(), None);
    for _ in 0..10_000 {
        if !e.has_work() {
            break;
        }
        for ev in e.step() {
            match ev {
                Event::Token { token, .. } => out.push(token),
                Event::Finished { cached_input_tokens, .. } => cached = Some(cached_input_tokens),
                Event::Prompt { .. } => {}
            }
        }
    }
    (out, cached.expect("finished"))
}

/// Whole blocks of `prompt` that a prefix cache can serve (the last token is always computed).
fn shareable(prompt: &[u32]) -> u32 {
    ((prompt.len() - 1) / BS * BS) as u32
}

#[test]
fn evicted_prefixes_come_back_from_host_memory_and_answers_stay_byte_identical() {
    // A hot pool of 40 blocks (640 tokens): each conversation's history pushes the others' out.
    let (mut plain, _) = engine(40, None);
    let (mut tiered, tiers) = engine(40, Some(TierConfig { host_bytes: 64 << 20, disk: None }));
    let tiers = tiers.unwrap();
    let topics = ["apple", "river", "engine", "violin"];
    let prompts: Vec<Vec<u32>> = topics.iter().map(|t| prompt(&plain, t, 120)).collect();
    for round in 0..2 {
        for (i, p) in prompts.iter().enumerate() {
            let (a, cached_plain) = answer(&mut plain, p, None, 8);
            let (b, cached_tiered) = answer(&mut tiered, p, None, 8);
            assert_eq!(a, b, "round {round}, conversation {i}: the same greedy answer with tiers on");
            if round == 1 {
                assert!(cached_plain < shareable(p), "the small hot pool alone lost conversation {i}'s prefix");
                assert_eq!(cached_tiered, shareable(p), "conversation {i}'s prefix came back whole");
            }
        }
    }
    assert!(tiers.bytes().0 > 0 && tiers.bytes().0 <= 64 << 20);
    // The worker's picture for the orchestrators: every prefix block, hot or (offloaded) in host memory.
    use zl_worker::kv::pool::KvEvent;
    use zl_worker::kv::tier::Tier;
    let snapshot = tiered.kv_snapshot();
    let held = |h: &u64| {
        snapshot.iter().find_map(|e| match *e {
            KvEvent::Stored(s) if s == *h => Some(None),
            KvEvent::Offloaded(s, tier) if s == *h => Some(Some(tier)),
            _ => None,
        })
    };
    let first = zl_common::block_hash::block_hashes(&prompts[0], BS);
    assert!(first.iter().all(|h| held(h).is_some()), "a block kept in host memory is still announced");
    let last = zl_common::block_hash::block_hashes(&prompts[3], BS);
    assert!(first.iter().any(|h| held(h) == Some(Some(Tier::Host))), "the oldest history was offloaded to host memory");
    assert!(last.iter().all(|h| held(h) == Some(None)), "the newest history is still hot");
}

fn disk_config(dir: &Path, disk_mb: u64) -> Option<TierConfig> {
    Some(TierConfig { host_bytes: 32 << 20, disk: Some((dir.to_path_buf(), disk_mb << 20)) })
}

#[test]
fn the_disk_tier_outlives_its_engine_and_a_flipped_byte_is_recomputed_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let (mut first, tiers) = engine(256, disk_config(dir.path(), 256));
    let p = prompt(&first, "harbour", 150);
    let (answer_first, cached) = answer(&mut first, &p, Some(11), 8);
    assert_eq!(cached, 0);
    assert!(tiers.unwrap().flush(Duration::from_secs(30)), "the writer caught up");
    drop(first);
    // A restart on the same directory: the prefix is read back (as the worker does while the request waits).
    let (mut second, tiers) = engine(256, disk_config(dir.path(), 256));
    let tiers = tiers.unwrap();
    assert_eq!(tiers.prefetch(&p, Some(11)), shareable(&p) as usize / BS);
    let (answer_second, cached) = answer(&mut second, &p, Some(11), 8);
    assert_eq!((answer_second.as_slice(), cached), (answer_first.as_slice(), shareable(&p)));
    drop((second, tiers));
    // Flip one byte in the third block's file: the first two come back, the rest is computed, the answer the same.
    let hashes = zl_common::block_hash::salted_block_hashes(&p, BS, Some(11));
    let ns = Namespace::new(&[7; 32], KvDtype::F16, BS, "test");
    let file = dir.path().join(ns.hex()).join(format!("{:016x}.kvb", hashes[2]));
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let (mut third, tiers) = engine(256, disk_config(dir.path(), 256));
    let tiers = tiers.unwrap();
    assert_eq!(tiers.prefetch(&p, Some(11)), 2);
    assert!(!file.exists(), "the bad file is removed");
    let (answer_third, cached) = answer(&mut third, &p, Some(11), 8);
    assert_eq!((answer_third.as_slice(), cached), (answer_first.as_slice(), 2 * BS as u32));
    // The blocks computed again were written again: the next restart finds the whole prefix.
    assert!(tiers.flush(Duration::from_secs(30)));
    drop((third, tiers));
    let (_, tiers) = engine(256, disk_config(dir.path(), 256));
    assert_eq!(tiers.unwrap().prefetch(&p, Some(11)), shareable(&p) as usize / BS, "the tier mended itself");
}

#[test]
fn another_cache_scope_finds_nothing_in_any_tier() {
    let dir = tempfile::tempdir().unwrap();
    let (mut e, tiers) = engine(48, disk_config(dir.path(), 256));
    let tiers = tiers.unwrap();
    let p = prompt(&e, "secret", 100);
    answer(&mut e, &p, Some(1), 4);
    // Push the prefix out of the hot pool (into host memory), and onto disk.
    for t in ["filler", "other"] {
        let q = prompt(&e, t, 100);
        answer(&mut e, &q, Some(1), 4);
    }
    assert!(tiers.flush(Duration::from_secs(30)));
    for salt in [None, Some(2)] {
        assert_eq!(tiers.prefetch(&p, salt), 0, "scope {salt:?} reads nothing from disk");
        assert_eq!(answer(&mut e, &p, salt, 4).1, 0, "scope {salt:?} is served nothing of scope 1's prefix");
    }
    assert_eq!(answer(&mut e, &p, Some(1), 4).1, shareable(&p), "its own scope gets it back");
}

#[test]
fn host_memory_and_disk_stay_within_their_bounds_when_overfilled() {
    let dir = tempfile::tempdir().unwrap();
    // A block of the bundled model is 368,640 bytes: 2 MiB of host memory holds 5, 4 MiB of disk 11.
    let config = TierConfig { host_bytes: 2 << 20, disk: Some((dir.path().to_path_buf(), 4 << 20)) };
    let (mut e, tiers) = engine(40, Some(config));
    let tiers = tiers.unwrap();
    for i in 0..12 {
        let p = prompt(&e, &format!("load{i}x"), 60);
        answer(&mut e, &p, None, 2);
        let (host, disk) = tiers.bytes();
        assert!(host <= 2 << 20 && disk <= 4 << 20, "{host} bytes in host memory, {disk} on disk");
    }
    assert!(tiers.flush(Duration::from_secs(30)));
    let on_disk: u64 = walk(dir.path());
    assert!(on_disk <= 4 << 20 && on_disk > 2 << 20, "{on_disk} bytes of files");
    assert!(tiers.bytes().0 > 1 << 20, "host memory was used");
}

fn walk(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() { walk(&e.path()) } else { e.metadata().unwrap().len() }
        })
        .sum()
}
