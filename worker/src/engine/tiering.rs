//! How a step moves blocks between the hot pool and the lower tiers (`crate::kv::tier`): blocks the step's
//! scheduling evicted are copied to host memory before the forward pass writes over them (unless host memory holds
//! them already), blocks admitted sequences took back are written into their new places, and blocks that filled
//! are written through to the disk tier (by its writer thread). Also what the orchestrators are told: a block
//! leaves the worker's picture only when neither the hot pool nor a tier holds it.

use std::time::Instant;

use zl_common::block_hash::BlockHash;

use crate::engine::backend::Backend;
use crate::kv::pool::{BlockId, BlockPool, KvEvent};
use crate::kv::tier::store::Tiers;
use crate::kv::tier::{Shared, Tier, TierBlock};

/// Before the forward pass: keep the evicted blocks, then write the restored ones (`found` holds their copies).
pub(super) fn exchange(
    tiers: &Tiers,
    backend: &mut Backend,
    pool: &mut BlockPool,
    restores: &[(BlockId, BlockHash)],
    found: &[Shared],
) {
    for s in pool.take_spilled() {
        if !tiers.in_host(s.hash) {
            let payload = backend.export(s.id).into_boxed_slice();
            tiers.keep(TierBlock { hash: s.hash, tokens: s.tokens, payload });
        }
    }
    if restores.is_empty() {
        return;
    }
    let started = Instant::now();
    for &(id, hash) in restores {
        let copy = found.iter().rev().find(|b| b.hash == hash).expect("a restored block was found in a tier");
        backend.import(id, &copy.payload);
    }
    tiers.restored(restores.len(), started.elapsed().as_secs_f64());
}

/// After the step: the blocks that filled (computed, not taken back from a tier), written through to the disk tier.
/// One the disk tier holds already was computed because its copy could not be used (a bad file, a read that took
/// too long): it is written again, which mends a damaged file.
pub(super) fn write_through(tiers: &Tiers, backend: &Backend, pool: &mut BlockPool) {
    let filled = pool.take_filled();
    if !tiers.has_disk() {
        return;
    }
    for (id, hash, tokens) in filled {
        tiers.persist(TierBlock { hash, tokens, payload: backend.export(id).into_boxed_slice() });
    }
}

/// The best place a block is held: the pool, host memory, disk; `None` when nothing holds it.
fn best(tiers: &Tiers, pool: &BlockPool, h: BlockHash) -> Option<Option<Tier>> {
    if pool.holds(h) {
        Some(None)
    } else if tiers.in_host(h) {
        Some(Some(Tier::Host))
    } else if tiers.on_disk(h) {
        Some(Some(Tier::Disk))
    } else {
        None
    }
}

/// The pool's events as the orchestrators should see them with tiers: a block evicted from the pool that a tier
/// keeps is offloaded there (routing prices it between a hit and a recomputation); a block that left a tier is
/// offloaded to the next one, or evicted once nothing holds it.
pub(super) fn events(tiers: &Tiers, pool: &mut BlockPool) -> Vec<KvEvent> {
    let mut events: Vec<KvEvent> = pool
        .drain_events()
        .into_iter()
        .map(|e| match e {
            KvEvent::Evicted(h) => match best(tiers, pool, h) {
                Some(Some(tier)) => KvEvent::Offloaded(h, tier),
                _ => e,
            },
            other => other,
        })
        .collect();
    for h in tiers.drain_left() {
        match best(tiers, pool, h) {
            None => events.push(KvEvent::Evicted(h)),
            Some(Some(Tier::Disk)) => events.push(KvEvent::Offloaded(h, Tier::Disk)),
            // Still in the pool or in host memory: the best place it is held has not changed.
            Some(_) => {}
        }
    }
    tiers.record();
    events
}

/// The most blocks a snapshot names: what one orchestrator indexes per worker (its `max_blocks_per_worker`), 8 MiB
/// of hashes, inside a frame. A disk tier holding more is served whole but announced in part.
pub(super) const SNAPSHOT_MAX: usize = 1 << 20;

/// Every block the worker holds, each at the best place it is held, for a full snapshot: the pool's, then host
/// memory's, then the disk's, at most [`SNAPSHOT_MAX`].
pub(super) fn snapshot(tiers: &Tiers, pool: &BlockPool) -> Vec<KvEvent> {
    let mut events: Vec<KvEvent> = pool.indexed_hashes().into_iter().map(KvEvent::Stored).collect();
    tiers.drain_left();
    let (mut host, mut disk) = (Vec::new(), Vec::new());
    for h in tiers.hashes() {
        match best(tiers, pool, h) {
            Some(Some(Tier::Host)) => host.push(KvEvent::Offloaded(h, Tier::Host)),
            Some(Some(Tier::Disk)) => disk.push(KvEvent::Offloaded(h, Tier::Disk)),
            _ => {}
        }
    }
    events.extend(host);
    events.extend(disk);
    events.truncate(SNAPSHOT_MAX);
    events
}

/// Blocks a snapshot would name now (the pool's size counts whole).
pub(super) fn snapshot_size(tiers: &Tiers, pool_blocks: usize) -> usize {
    let (host, disk) = tiers.blocks();
    (pool_blocks + host + disk).min(SNAPSHOT_MAX)
}
