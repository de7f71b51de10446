//! The soft load view: what workers report about themselves a few times a second (load, and which KV blocks they
//! hold). Not replicated: each orchestrator keeps the newest report per worker, and after a restart rebuilds the
//! view from the next reports within seconds.
//!
//! Pure and clock-free: every method that depends on time takes `now`, so tests drive missed heartbeats and late
//! reports with an injected clock. Bounded: reports are accepted only for registered workers (the caller checks),
//! each worker's block set is capped, and workers silent for longer than `forget_after` are dropped by
//! [`LoadView::sweep`].

use std::time::{Duration, Instant};

use zl_wire::message::{KvCacheEvents, LoadReport, NodeId};

use crate::hash::{FxHashMap, model_tag};

/// Health and size settings.
#[derive(Clone, Copy, Debug)]
pub struct LoadSettings {
    /// A worker whose last report is older than this is unhealthy: no new requests go to it.
    pub heartbeat_timeout: Duration,
    /// A worker silent for this long is forgotten (its load and cached blocks dropped).
    pub forget_after: Duration,
    /// Cached block hashes kept per worker; events beyond it are ignored until evictions make room.
    pub max_blocks_per_worker: usize,
}

impl Default for LoadSettings {
    fn default() -> Self {
        LoadSettings {
            heartbeat_timeout: Duration::from_secs(1),
            forget_after: Duration::from_secs(600),
            max_blocks_per_worker: 1 << 20,
        }
    }
}

/// What happened to a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// Applied.
    Yes,
    /// Older than one already applied (reordered or late); ignored.
    Stale,
}

#[derive(Debug)]
struct Soft {
    id: NodeId,
    slot: u32,
    last_seen: Instant,
    load: Option<LoadReport>,
    load_at: Option<Instant>,
    kv_sequence: Option<u64>,
    /// (model tag, block hash) pairs held, each with the best place it is held ([`HOT`], [`HOST`], [`DISK`]).
    blocks: FxHashMap<(u64, u64), u8>,
    /// Discovery lists it as not passing (its Consul check critical, or in maintenance): no routes.
    held: bool,
    /// When this orchestrator routed requests to it that its newest report may not count yet (in-flight), oldest
    /// first, each with the prompt blocks it will have to compute there.
    routed: std::collections::VecDeque<(Instant, u32)>,
    /// LoRA adapters (their [`crate::hash::stable_hash`]) this orchestrator routed requests for to it, with when:
    /// the worker loads one when the request arrives, so it counts as resident there for
    /// [`ROUTE_FORGOTTEN_AFTER`] whatever the reports say meanwhile (a burst for a cold adapter loads it once).
    adapters_routed: std::collections::VecDeque<(Instant, u64)>,
    /// Blocks of prompts routed to it that no KV event has reported yet (predicted to be cached there once their
    /// prefill runs), with when they were routed: a burst sharing a new prefix finds it where its first request
    /// went, rather than recomputing it elsewhere before the worker's events arrive.
    predicted: FxHashMap<(u64, u64), Instant>,
    /// The predictions in the order they were made (a block predicted again appears twice; the map has its
    /// newest time), so expiry looks only at the oldest ones instead of the whole map on every route.
    predicted_order: std::collections::VecDeque<(Instant, (u64, u64))>,
}

/// A report received this long after a route counts it (the route's answer, the frontend's call to the worker and
/// the worker's admission take milliseconds within a region).
pub const ROUTE_COVERED_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// An in-flight route no report has covered is forgotten after this long (its request may never have reached the
/// worker).
pub const ROUTE_FORGOTTEN_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// A routed prompt's blocks count as cached on its worker for this long without a KV event confirming them (its
/// prefill may wait behind a queue; a request that never ran is forgotten after it).
pub const PREDICTION_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// In-flight routes held per worker at most (a burst beyond it saturates the worker anyway).
const MAX_ROUTED: usize = 4096;

/// Adapters remembered as routed per worker at most (more than a worker keeps loaded).
const MAX_ADAPTERS_ROUTED: usize = 64;

/// The load view.
#[derive(Debug, Default)]
pub struct LoadView {
    settings: LoadSettings,
    /// Worker id to slot.
    by_id: FxHashMap<NodeId, u32>,
    /// Each worker's soft state, by slot (slots are reused after a worker is forgotten).
    slots: Vec<Option<Soft>>,
    free_slots: Vec<u32>,
    /// Changes whenever a worker gains or loses a slot, so callers may cache id-to-slot lookups.
    generation: u64,
    /// (model tag, block hash) to the slots of workers holding it, each with where it holds it.
    prefix: FxHashMap<(u64, u64), Vec<(u32, u8)>>,
    /// Discovery's newest list of workers (`--discovery consul`): id to whether every check passes. `None`
    /// without such a list.
    discovered: Option<FxHashMap<NodeId, bool>>,
}

/// A block held in a worker's KV cache (or predicted to be).
pub const HOT: u8 = 0;
/// A block a worker keeps in its host-memory tier: taken back at a copy's cost.
pub const HOST: u8 = 1;
/// A block a worker keeps on its disk tier only: read back, then taken back.
pub const DISK: u8 = 2;

/// How much of a prompt's leading blocks a worker holds, and where.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overlap {
    /// Leading blocks held anywhere.
    pub blocks: u32,
    /// Of those, in its host-memory tier.
    pub host: u32,
    /// Of those, on its disk tier only.
    pub disk: u32,
}

/// A process-wide unique generation number.
pub(crate) fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl LoadView {
    /// An empty view.
    pub fn new(settings: LoadSettings) -> Self {
        LoadView { settings, ..LoadView::default() }
    }

    /// The settings.
    pub fn settings(&self) -> &LoadSettings {
        &self.settings
    }

    fn soft(&mut self, id: &NodeId, now: Instant) -> &mut Soft {
        let slot = match self.by_id.get(id) {
            Some(&slot) => slot,
            None => {
                let slot = self.free_slots.pop().unwrap_or_else(|| {
                    self.slots.push(None);
                    (self.slots.len() - 1) as u32
                });
                self.slots[slot as usize] = Some(Soft {
                    id: id.clone(),
                    slot,
                    last_seen: now,
                    load: None,
                    load_at: None,
                    kv_sequence: None,
                    blocks: FxHashMap::default(),
                    held: self.discovered.as_ref().is_some_and(|d| d.get(id) == Some(&false)),
                    routed: Default::default(),
                    adapters_routed: Default::default(),
                    predicted: FxHashMap::default(),
                    predicted_order: Default::default(),
                });
                self.by_id.insert(id.clone(), slot);
                self.generation = next_generation();
                slot
            }
        };
        self.slots[slot as usize].as_mut().expect("a mapped slot holds its worker")
    }

    /// Changes whenever a worker gains or loses a slot (unique across views).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A worker's slot.
    pub fn slot_of(&self, id: &NodeId) -> Option<u32> {
        self.by_id.get(id).copied()
    }

    /// Apply a load report (also the worker's heartbeat).
    pub fn report(&mut self, report: LoadReport, now: Instant) -> Accepted {
        let soft = self.soft(&report.worker_id, now);
        if soft.load.as_ref().is_some_and(|l| l.sequence >= report.sequence) {
            return Accepted::Stale;
        }
        soft.last_seen = now;
        soft.load = Some(report);
        soft.load_at = Some(now);
        // The report counts what the worker had received: every route older than the margin.
        while soft.routed.front().is_some_and(|&(at, _)| at + ROUTE_COVERED_AFTER <= now) {
            soft.routed.pop_front();
        }
        Accepted::Yes
    }

    /// This orchestrator routed a request to `worker` at `now`, with `prefill_blocks` of its prompt to compute
    /// there: until a report covers it, it counts as one more sequence and that much prefill work, so a burst
    /// routed between two reports spreads instead of piling onto one worker.
    pub fn routed(&mut self, worker: &NodeId, now: Instant, prefill_blocks: u32) {
        let Some(&slot) = self.by_id.get(worker) else { return };
        let Some(soft) = self.slots[slot as usize].as_mut() else { return };
        while soft.routed.front().is_some_and(|&(at, _)| at + ROUTE_FORGOTTEN_AFTER <= now)
            || soft.routed.len() >= MAX_ROUTED
        {
            soft.routed.pop_front();
        }
        soft.routed.push_back((now, prefill_blocks));
    }

    /// This orchestrator routed a request on the adapter whose name hashes to `adapter` to `worker` at `now`.
    pub fn routed_adapter(&mut self, worker: &NodeId, adapter: u64, now: Instant) {
        let Some(&slot) = self.by_id.get(worker) else { return };
        let Some(soft) = self.slots[slot as usize].as_mut() else { return };
        soft.adapters_routed.retain(|&(at, a)| at + ROUTE_FORGOTTEN_AFTER > now && a != adapter);
        if soft.adapters_routed.len() >= MAX_ADAPTERS_ROUTED {
            soft.adapters_routed.pop_front();
        }
        soft.adapters_routed.push_back((now, adapter));
    }

    /// Whether this orchestrator routed a request on `adapter` to the worker in `slot` within
    /// [`ROUTE_FORGOTTEN_AFTER`] of `now` (it is loading there, or loaded).
    pub fn adapter_routed(&self, slot: u32, adapter: u64, now: Instant) -> bool {
        let Some(Some(soft)) = self.slots.get(slot as usize) else { return false };
        soft.adapters_routed.iter().any(|&(at, a)| a == adapter && at + ROUTE_FORGOTTEN_AFTER > now)
    }

    /// This orchestrator routed a prompt of `model` with these chained block `hashes` to `worker` at `now`: its blocks
    /// count as held there (for [`LoadView::prefix_overlap`]) until a KV event confirms them, or for
    /// [`PREDICTION_KEPT_FOR`]. Dynamo's router predicts the same way.
    pub fn predict_cached(&mut self, worker: &NodeId, model: &str, hashes: &[u64], now: Instant) {
        let Some(&slot) = self.by_id.get(worker) else { return };
        self.expire_predictions(slot, now);
        let cap = self.settings.max_blocks_per_worker;
        let tag = model_tag(model);
        let Some(soft) = self.slots[slot as usize].as_mut() else { return };
        let mut added = Vec::new();
        for &h in hashes {
            let key = (tag, h);
            if soft.blocks.contains_key(&key) || soft.blocks.len() + soft.predicted.len() >= cap {
                continue;
            }
            soft.predicted_order.push_back((now, key));
            if soft.predicted.insert(key, now).is_none() {
                added.push(key);
            }
        }
        for key in added {
            self.prefix.entry(key).or_default().push((slot, HOT));
        }
    }

    /// Drop the worker's predictions older than [`PREDICTION_KEPT_FOR`].
    fn expire_predictions(&mut self, slot: u32, now: Instant) {
        let Some(Some(soft)) = self.slots.get_mut(slot as usize) else { return };
        let mut gone = Vec::new();
        while let Some(&(at, key)) = soft.predicted_order.front() {
            if at + PREDICTION_KEPT_FOR > now {
                break;
            }
            soft.predicted_order.pop_front();
            // Gone only if this was its newest prediction and no event has confirmed or removed it since.
            if soft.predicted.get(&key) == Some(&at) {
                soft.predicted.remove(&key);
                gone.push(key);
            }
        }
        for key in gone {
            self.unindex(key, slot);
        }
    }

    /// Requests routed to the worker in `slot` that its newest report does not count yet (at `now`), and their
    /// prompt blocks to compute.
    pub fn in_flight(&self, slot: u32, now: Instant) -> (u32, u32) {
        let Some(Some(soft)) = self.slots.get(slot as usize) else { return (0, 0) };
        soft.routed
            .iter()
            .rev()
            .take_while(|&&(at, _)| at + ROUTE_FORGOTTEN_AFTER > now)
            .fold((0, 0), |(n, blocks), &(_, b)| (n + 1, blocks + b))
    }

    /// Apply KV-cache events.
    pub fn kv_events(&mut self, events: &KvCacheEvents, now: Instant) -> Accepted {
        let cap = self.settings.max_blocks_per_worker;
        let tag = model_tag(&events.model);
        let soft = self.soft(&events.worker_id, now);
        if soft.kv_sequence.is_some_and(|s| s >= events.sequence) {
            return Accepted::Stale;
        }
        soft.kv_sequence = Some(events.sequence);
        soft.last_seen = now;
        let slot = soft.slot;
        let mut removed = Vec::new();
        if events.cleared {
            soft.blocks.retain(|&(t, h), _| {
                let keep = t != tag;
                if !keep {
                    removed.push((t, h));
                }
                keep
            });
            soft.predicted.retain(|&(t, h), _| {
                let keep = t != tag;
                if !keep {
                    removed.push((t, h));
                }
                keep
            });
        }
        for &h in &events.evicted {
            // An evicted block is gone whether it was reported or predicted.
            if soft.blocks.remove(&(tag, h)).is_some() | soft.predicted.remove(&(tag, h)).is_some() {
                removed.push((tag, h));
            }
        }
        // Where each block stands now: held (or predicted) already, only its place changes.
        let mut placed = Vec::new();
        let lists = [(&events.stored, HOT), (&events.host, HOST), (&events.disk, DISK)];
        for (hashes, tier) in lists {
            for &h in hashes {
                let key = (tag, h);
                let was_predicted = soft.predicted.remove(&key).is_some();
                let known = soft.blocks.contains_key(&key) || was_predicted;
                if !known && soft.blocks.len() >= cap {
                    continue;
                }
                if soft.blocks.insert(key, tier) != Some(tier) {
                    placed.push((key, tier));
                }
            }
        }
        for key in removed {
            self.unindex(key, slot);
        }
        for (key, tier) in placed {
            let holders = self.prefix.entry(key).or_default();
            match holders.iter_mut().find(|(s, _)| *s == slot) {
                Some(holder) => holder.1 = tier,
                None => holders.push((slot, tier)),
            }
        }
        Accepted::Yes
    }

    fn unindex(&mut self, key: (u64, u64), slot: u32) {
        if let Some(holders) = self.prefix.get_mut(&key) {
            holders.retain(|&(s, _)| s != slot);
            if holders.is_empty() {
                self.prefix.remove(&key);
            }
        }
    }

    /// Drop everything known about a worker (deregistered, or forgotten).
    pub fn forget(&mut self, id: &NodeId) {
        if let Some(slot) = self.by_id.remove(id) {
            if let Some(soft) = self.slots[slot as usize].take() {
                for key in soft.blocks.into_keys().chain(soft.predicted.into_keys()) {
                    self.unindex(key, slot);
                }
            }
            self.free_slots.push(slot);
            self.generation = next_generation();
        }
    }

    /// Take discovery's newest list of workers: id to whether every check of it passes. A worker listed as not
    /// passing (its check critical, or in maintenance) gets no routes whatever its heartbeats say. One that was
    /// listed and no longer is (deregistered: Consul removed it after its check stayed critical, or it left) is
    /// forgotten, unless it still reports (the agent restarted and it has not registered again yet). Workers
    /// never listed (registered directly) are unaffected. Returns the forgotten.
    pub fn apply_discovery(&mut self, listed: FxHashMap<NodeId, bool>, now: Instant) -> Vec<NodeId> {
        let fresh = self.fresh_since(now);
        let before = self.discovered.take().unwrap_or_default();
        let mut gone = Vec::new();
        for soft in self.slots.iter_mut().flatten() {
            soft.held = listed.get(&soft.id) == Some(&false);
            let reporting = soft.load_at.is_some_and(|at| fresh.is_none_or(|f| at >= f));
            if before.contains_key(&soft.id) && !listed.contains_key(&soft.id) && !reporting {
                gone.push(soft.id.clone());
            }
        }
        for id in &gone {
            self.forget(id);
        }
        self.discovered = Some(listed);
        gone
    }

    /// Forget workers silent for longer than `forget_after`; returns how many.
    pub fn sweep(&mut self, now: Instant) -> usize {
        let stale: Vec<NodeId> = self
            .slots
            .iter()
            .flatten()
            .filter(|s| now.saturating_duration_since(s.last_seen) > self.settings.forget_after)
            .map(|s| s.id.clone())
            .collect();
        for id in &stale {
            self.forget(id);
        }
        for slot in 0..self.slots.len() as u32 {
            self.expire_predictions(slot, now);
        }
        stale.len()
    }

    /// A worker's newest load, if it reported within the heartbeat timeout, with its prefix-index slot.
    pub fn healthy(&self, id: &NodeId, now: Instant) -> Option<(&LoadReport, u32)> {
        let slot = self.slot_of(id)?;
        Some((self.healthy_slot(slot, now)?, slot))
    }

    /// [`LoadView::healthy`] by slot.
    pub fn healthy_slot(&self, slot: u32, now: Instant) -> Option<&LoadReport> {
        self.healthy_since(slot, self.fresh_since(now))
    }

    /// Reports at or after this instant are fresh (`None`: every report is, the clock is younger than the timeout).
    pub fn fresh_since(&self, now: Instant) -> Option<Instant> {
        now.checked_sub(self.settings.heartbeat_timeout)
    }

    /// A slot's load if its newest report is at or after `since` (from [`LoadView::fresh_since`]): one comparison,
    /// for the per-candidate loop of a route decision.
    pub fn healthy_since(&self, slot: u32, since: Option<Instant>) -> Option<&LoadReport> {
        let soft = self.slots.get(slot as usize)?.as_ref()?;
        if soft.held {
            return None;
        }
        let at = soft.load_at?;
        if since.is_some_and(|since| at < since) {
            return None;
        }
        soft.load.as_ref()
    }

    /// A worker's newest load report, however old.
    pub fn latest(&self, id: &NodeId) -> Option<&LoadReport> {
        self.slots[self.slot_of(id)? as usize].as_ref()?.load.as_ref()
    }

    /// Age of a worker's newest load report.
    pub fn age(&self, id: &NodeId, now: Instant) -> Option<Duration> {
        let soft = self.slots[self.slot_of(id)? as usize].as_ref()?;
        Some(now.saturating_duration_since(soft.load_at?))
    }

    /// For each worker slot, how many leading blocks of `hashes` (a prompt's chained block hashes for `model`) it
    /// holds, and how many of those in its lower tiers; only slots with at least one are set. Walks the prompt once,
    /// stopping when no worker holds the next block: cost proportional to the matched prefix times its holders, not
    /// to the number of workers.
    pub fn prefix_overlap(&self, model: &str, hashes: &[u64], out: &mut FxHashMap<u32, Overlap>) {
        out.clear();
        let tag = model_tag(model);
        for (i, &h) in hashes.iter().enumerate() {
            let Some(holders) = self.prefix.get(&(tag, h)) else { break };
            let mut advanced = false;
            for &(slot, tier) in holders {
                let o = out.entry(slot).or_default();
                if o.blocks == i as u32 {
                    o.blocks += 1;
                    o.host += u32::from(tier == HOST);
                    o.disk += u32::from(tier == DISK);
                    advanced = true;
                }
            }
            if !advanced {
                break;
            }
        }
        out.retain(|_, o| o.blocks > 0);
    }

    /// Workers with any soft state.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no worker has soft state.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Cached (model, block) entries across all workers.
    pub fn cached_blocks(&self) -> usize {
        self.slots.iter().flatten().map(|s| s.blocks.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    fn load(worker: &str, sequence: u64, queue: u32) -> LoadReport {
        LoadReport {
            worker_id: id(worker),
            sequence,
            queue_depth: queue,
            running_sequences: 1,
            kv_blocks_used: 10,
            kv_blocks_free: 90,
            fragmentation_ratio: 0.1,
            tokens_per_second: 50.0,
            vram_total_bytes: 0,
            vram_free_bytes: 0,
            queued_prefill_blocks: 0,
            adapters: vec![],
        }
    }

    fn events(worker: &str, sequence: u64, stored: &[u64], evicted: &[u64], cleared: bool) -> KvCacheEvents {
        KvCacheEvents {
            worker_id: id(worker),
            sequence,
            model: "m".into(),
            stored: stored.to_vec(),
            evicted: evicted.to_vec(),
            cleared,
            host: vec![],
            disk: vec![],
        }
    }

    #[test]
    fn routed_prompts_count_as_cached_until_events_confirm_them_or_they_expire() {
        let t0 = Instant::now();
        let mut v = LoadView::new(LoadSettings::default());
        v.report(load("w1", 1, 0), t0);
        v.report(load("w2", 1, 0), t0);
        let slot = |v: &LoadView, w: &str| v.slot_of(&id(w)).unwrap();
        let overlap = |v: &LoadView, hashes: &[u64]| {
            let mut out = FxHashMap::default();
            v.prefix_overlap("m", hashes, &mut out);
            out.into_iter().map(|(s, o): (u32, Overlap)| (s, o.blocks)).collect::<FxHashMap<u32, u32>>()
        };
        // w1 holds block 1 by its events; a prompt 1, 2, 3 routed there: all three count as held at once.
        v.kv_events(&events("w1", 1, &[1], &[], false), t0);
        v.predict_cached(&id("w1"), "m", &[1, 2, 3], t0);
        assert_eq!(overlap(&v, &[1, 2, 3, 4]), FxHashMap::from_iter([(slot(&v, "w1"), 3)]));
        // Another model's prompt with the same hashes is not: predictions are per model, like events.
        let mut other = FxHashMap::default();
        v.prefix_overlap("other", &[1, 2, 3], &mut other);
        assert!(other.is_empty());
        // Its events confirm block 2 and evict block 3; then the predictions expire: 1 and 2 stay, indexed once.
        v.kv_events(&events("w1", 2, &[2], &[3], false), t0);
        assert_eq!(overlap(&v, &[1, 2, 3]), FxHashMap::from_iter([(slot(&v, "w1"), 2)]));
        v.predict_cached(&id("w2"), "m", &[7, 8], t0 + Duration::from_secs(5));
        v.report(load("w1", 2, 0), t0 + PREDICTION_KEPT_FOR);
        v.report(load("w2", 2, 0), t0 + PREDICTION_KEPT_FOR);
        v.sweep(t0 + PREDICTION_KEPT_FOR);
        assert_eq!(overlap(&v, &[1, 2, 3]), FxHashMap::from_iter([(slot(&v, "w1"), 2)]));
        assert_eq!(v.prefix[&(model_tag("m"), 2)], vec![(slot(&v, "w1"), HOT)]);
        // w2's prediction is younger: still there, until it too expires.
        assert_eq!(overlap(&v, &[7, 8]), FxHashMap::from_iter([(slot(&v, "w2"), 2)]));
        v.sweep(t0 + Duration::from_secs(5) + PREDICTION_KEPT_FOR);
        assert!(overlap(&v, &[7, 8]).is_empty());
        // A worker forgotten takes its predictions with it.
        v.predict_cached(&id("w2"), "m", &[9], t0 + Duration::from_secs(16));
        v.forget(&id("w2"));
        assert!(overlap(&v, &[9]).is_empty() && !v.prefix.contains_key(&(model_tag("m"), 9)));
    }

    #[test]
    fn missed_heartbeats_make_a_worker_unhealthy_and_late_reports_are_ignored() {
        let t0 = Instant::now();
        let settings = LoadSettings { heartbeat_timeout: Duration::from_secs(3), ..LoadSettings::default() };
        let mut v = LoadView::new(settings);
        assert_eq!(v.report(load("w1", 5, 2), t0), Accepted::Yes);
        assert_eq!(v.healthy(&id("w1"), t0 + Duration::from_secs(2)).unwrap().0.queue_depth, 2);
        // A report that arrives late (older sequence) changes nothing.
        assert_eq!(v.report(load("w1", 4, 9), t0 + Duration::from_secs(1)), Accepted::Stale);
        assert_eq!(v.healthy(&id("w1"), t0 + Duration::from_secs(2)).unwrap().0.queue_depth, 2);
        // No heartbeat for longer than the timeout: unhealthy; the next report heals it.
        assert!(v.healthy(&id("w1"), t0 + Duration::from_millis(3001)).is_none());
        v.report(load("w1", 6, 0), t0 + Duration::from_secs(4));
        assert!(v.healthy(&id("w1"), t0 + Duration::from_secs(4)).is_some());
        // Silent for longer than forget_after: dropped entirely.
        assert_eq!(v.sweep(t0 + Duration::from_secs(700)), 1);
        assert!(v.is_empty());
    }

    #[test]
    fn prefix_overlap_counts_leading_blocks_per_worker() {
        let t0 = Instant::now();
        let mut v = LoadView::new(LoadSettings::default());
        v.kv_events(&events("w1", 1, &[10, 11, 12], &[], false), t0);
        v.kv_events(&events("w2", 1, &[10, 12], &[], false), t0);
        let s1 = v.soft(&id("w1"), t0).slot;
        let s2 = v.soft(&id("w2"), t0).slot;
        let mut out = FxHashMap::default();
        v.prefix_overlap("m", &[10, 11, 12, 13], &mut out);
        assert_eq!(out.get(&s1).map(|o| o.blocks), Some(3));
        assert_eq!(out.get(&s2).map(|o| o.blocks), Some(1), "w2 lacks block 11, so block 12 does not count");
        v.prefix_overlap("other-model", &[10], &mut out);
        assert!(out.is_empty(), "blocks of another model never match");
        // Evictions and a clear remove blocks from the index.
        v.kv_events(&events("w1", 2, &[], &[11], false), t0);
        v.prefix_overlap("m", &[10, 11], &mut out);
        assert_eq!(out.get(&s1).map(|o| o.blocks), Some(1));
        v.kv_events(&events("w2", 2, &[20], &[], true), t0);
        v.prefix_overlap("m", &[10], &mut out);
        assert_eq!(out.get(&s2), None);
        // Stale events are ignored; forgetting a worker empties its part of the index.
        assert_eq!(v.kv_events(&events("w2", 1, &[10], &[], false), t0), Accepted::Stale);
        v.forget(&id("w1"));
        v.prefix_overlap("m", &[10], &mut out);
        assert!(out.is_empty());
        assert_eq!(v.cached_blocks(), 1);
    }

    #[test]
    fn block_sets_are_capped() {
        let t0 = Instant::now();
        let settings = LoadSettings { max_blocks_per_worker: 3, ..LoadSettings::default() };
        let mut v = LoadView::new(settings);
        v.kv_events(&events("w1", 1, &[1, 2, 3, 4, 5], &[], false), t0);
        assert_eq!(v.cached_blocks(), 3);
        v.kv_events(&events("w1", 2, &[6], &[1], false), t0);
        assert_eq!(v.cached_blocks(), 3);
    }

    #[test]
    fn discovery_holds_failing_workers_and_forgets_deregistered_silent_ones() {
        let t0 = Instant::now();
        let mut v = LoadView::new(LoadSettings::default());
        for w in ["w1", "w2", "w3"] {
            v.report(load(w, 1, 0), t0);
        }
        let list = |entries: &[(&str, bool)]| entries.iter().map(|&(w, ok)| (id(w), ok)).collect();
        // w2's check is critical: no routes, though it reports; w3 was never listed (registered directly).
        assert!(v.apply_discovery(list(&[("w1", true), ("w2", false)]), t0).is_empty());
        assert!(v.healthy(&id("w1"), t0).is_some());
        assert!(v.healthy(&id("w2"), t0).is_none());
        assert!(v.healthy(&id("w3"), t0).is_some());
        // The hold survives a re-registration (which starts the soft state afresh) and lifts when it passes.
        v.forget(&id("w2"));
        v.report(load("w2", 1, 0), t0);
        assert!(v.healthy(&id("w2"), t0).is_none());
        assert!(v.apply_discovery(list(&[("w1", true), ("w2", true)]), t0).is_empty());
        assert!(v.healthy(&id("w2"), t0).is_some());
        // Deregistered: w1 still reports (its agent restarted), so it stays; w2 went silent, so it is forgotten.
        let later = t0 + Duration::from_secs(5);
        v.report(load("w1", 2, 0), later);
        assert_eq!(v.apply_discovery(list(&[]), later), vec![id("w2")]);
        assert!(v.healthy(&id("w1"), later).is_some());
        assert!(v.latest(&id("w2")).is_none());
        assert!(v.latest(&id("w3")).is_some(), "never listed, so never forgotten by discovery");
    }
}
