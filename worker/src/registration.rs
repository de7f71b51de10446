//! How a worker makes itself known: registration, heartbeats carrying load, KV-cache events, deregistration.
//!
//! [`Discovery`] is the seam; [`DirectDiscovery`] talks to the orchestrators over the cluster's QUIC RPC, to a
//! fixed list (`--discovery static`) or to the passing orchestrators Consul lists (`--discovery consul`, where the
//! worker also registers its own service: `consul_report.rs`).
//!
//! A registration is a replicated write (any orchestrator forwards it to the Raft leader), so one would do; the
//! worker still registers through every orchestrator it reports to, because a registration also resets that
//! orchestrator's soft state for it (a restarted worker numbers its reports from 1 again), and a re-registration
//! is idempotent. Load and KV events are soft state kept per orchestrator, so they always go to every one.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zl_common::sync::lock;
use zl_proto::quic::{CallError, Client};
use zl_wire::message::{DeregisterWorker, ErrorCode, KvCacheEvents, LoadReport, Message, NodeId, RegisterWorker, Role};

use crate::engine::{EngineHandle, Published};
use crate::kv::pool::KvEvent;
use crate::kv::tier::Tier;

/// Where a worker announces itself.
pub trait Discovery: Send + Sync + 'static {
    /// Publish the registration (where needed), the load report and the KV events. Returns `true` when some
    /// receiver missed events or has just (re)registered, so the next heartbeat should carry a full KV snapshot.
    fn heartbeat(
        &self,
        registration: &RegisterWorker,
        load: &LoadReport,
        kv: &[KvCacheEvents],
    ) -> impl Future<Output = bool> + Send;

    /// Leave: no new requests will be routed here.
    fn deregister(&self, worker: &NodeId, reason: &str) -> impl Future<Output = ()> + Send;
}

/// Deadline of a registration or deregistration: a replicated write, which waits for the Raft leader (an
/// election takes a second or two).
const WRITE_TIMEOUT: Duration = Duration::from_secs(6);

/// Deadline of a load report or KV-event call, which an orchestrator answers in microseconds: a report later
/// than this is stale anyway, and the next one is due.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1);

/// Direct registration with the orchestrators. Each orchestrator's beats run on their own: one that is dead,
/// frozen or slow to commit a registration (an election) skips its beats while its call is in flight, and never
/// delays the others' reports past their heartbeat timeout. The set of orchestrators is fixed (`--orchestrator`)
/// or follows discovery ([`DirectDiscovery::set_orchestrators`]).
pub struct DirectDiscovery {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    peers: Mutex<BTreeMap<SocketAddr, Peer>>,
    /// What the orchestrators' last answer said: hand the running requests over (`zl admin drain --migrate`).
    hand_over: tokio::sync::watch::Sender<bool>,
}

/// What the reporter knows of one orchestrator.
#[derive(Clone, Copy, Debug, Default)]
struct Peer {
    /// It acknowledged this worker's registration.
    registered: bool,
    /// A beat to it is in flight.
    busy: bool,
    /// It missed KV events (or just registered us): the next heartbeat must carry a full snapshot.
    resync: bool,
}

impl std::fmt::Debug for DirectDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectDiscovery").field("orchestrators", &self.orchestrators()).finish_non_exhaustive()
    }
}

impl DirectDiscovery {
    /// Talk to these orchestrators with this client.
    pub fn new(client: Client, orchestrators: Vec<SocketAddr>) -> Self {
        let peers = Mutex::new(orchestrators.into_iter().map(|a| (a, Peer::default())).collect());
        DirectDiscovery { inner: Arc::new(Inner { client, peers, hand_over: tokio::sync::watch::Sender::new(false) }) }
    }

    /// Whether the orchestrators ask this worker to hand its running requests over (an operator drained it with
    /// `--migrate`), as their answers to its load reports say; changes as they do.
    pub fn hand_over_requests(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.hand_over.subscribe()
    }

    /// Report to these orchestrators from now on: new ones get a registration first, gone ones are dropped
    /// (a beat in flight to one finishes on its own).
    pub fn set_orchestrators(&self, orchestrators: &[SocketAddr]) {
        let mut peers = lock(&self.inner.peers);
        peers.retain(|a, _| orchestrators.contains(a));
        for &a in orchestrators {
            peers.entry(a).or_default();
        }
    }

    /// How many orchestrators have acknowledged this worker's registration.
    pub fn registered_with(&self) -> usize {
        lock(&self.inner.peers).values().filter(|p| p.registered).count()
    }

    /// The orchestrators reported to.
    pub fn orchestrators(&self) -> Vec<SocketAddr> {
        lock(&self.inner.peers).keys().copied().collect()
    }
}

impl Inner {
    async fn call(&self, to: SocketAddr, msg: Message) -> Result<Message, CallError> {
        let deadline = match msg {
            Message::RegisterWorker(_) | Message::DeregisterWorker(_) => WRITE_TIMEOUT,
            _ => REPORT_TIMEOUT,
        };
        self.client.call_within(deadline, to, Role::Orchestrator, msg).await
    }

    fn set_registered(&self, to: SocketAddr, value: bool) {
        if let Some(peer) = lock(&self.peers).get_mut(&to) {
            peer.registered = value;
        }
    }

    fn is_registered(&self, to: SocketAddr) -> bool {
        lock(&self.peers).get(&to).is_some_and(|p| p.registered)
    }

    /// One orchestrator's heartbeat; `true` when it needs a snapshot.
    async fn beat(
        &self,
        to: SocketAddr,
        registration: &RegisterWorker,
        load: &LoadReport,
        kv: &[KvCacheEvents],
    ) -> bool {
        let mut resync = false;
        if !self.is_registered(to) {
            match self.call(to, Message::RegisterWorker(registration.clone())).await {
                Ok(Message::Ack(_)) => {
                    tracing::info!(orchestrator = %to, "registered");
                    metrics::counter!("zl_worker_registrations_total").increment(1);
                    self.set_registered(to, true);
                    resync = true;
                }
                other => {
                    tracing::warn!(orchestrator = %to, outcome = ?other.err(), "registration failed; retrying");
                    return true;
                }
            }
        }
        let mut messages = vec![Message::LoadReport(load.clone())];
        messages.extend(kv.iter().cloned().map(Message::KvCacheEvents));
        for msg in messages {
            let load_report = matches!(msg, Message::LoadReport(_));
            match self.call(to, msg).await {
                Ok(Message::Ack(ack)) => {
                    if load_report {
                        self.hand_over.send_if_modified(|h| std::mem::replace(h, ack.hand_over) != ack.hand_over);
                    }
                }
                Err(CallError::Remote(e)) if e.code == ErrorCode::NotFound => {
                    // The orchestrator lost our registration (it restarted): register again next beat.
                    tracing::warn!(orchestrator = %to, "the orchestrator does not know this worker; re-registering");
                    self.set_registered(to, false);
                    return true;
                }
                other => {
                    tracing::warn!(orchestrator = %to, outcome = ?other.err(), "heartbeat failed");
                    metrics::counter!("zl_worker_heartbeat_failures_total").increment(1);
                    return true;
                }
            }
        }
        resync
    }
}

impl Discovery for DirectDiscovery {
    async fn heartbeat(&self, registration: &RegisterWorker, load: &LoadReport, kv: &[KvCacheEvents]) -> bool {
        let mut resync = false;
        let mut due = Vec::new();
        {
            let mut peers = lock(&self.inner.peers);
            for (&to, peer) in peers.iter_mut() {
                resync |= std::mem::take(&mut peer.resync);
                if peer.busy {
                    // Its last beat is still in flight: it misses this report and these KV events.
                    resync = true;
                    continue;
                }
                peer.busy = true;
                due.push(to);
            }
        }
        for to in due {
            let (inner, registration, load, kv) = (self.inner.clone(), registration.clone(), load.clone(), kv.to_vec());
            tokio::spawn(async move {
                let missed = inner.beat(to, &registration, &load, &kv).await;
                if let Some(peer) = lock(&inner.peers).get_mut(&to) {
                    peer.busy = false;
                    peer.resync |= missed;
                }
            });
        }
        resync
    }

    async fn deregister(&self, worker: &NodeId, reason: &str) {
        let inner = &self.inner;
        let leave = self.orchestrators().into_iter().map(|to| async move {
            let msg = Message::DeregisterWorker(DeregisterWorker { worker_id: worker.clone(), reason: reason.into() });
            match inner.call(to, msg).await {
                Ok(_) => tracing::info!(orchestrator = %to, "deregistered"),
                Err(e) => tracing::warn!(orchestrator = %to, error = %e, "deregistration failed"),
            }
            inner.set_registered(to, false);
        });
        futures_util::future::join_all(leave).await;
    }
}

/// One model's engine, as the reporter sees it.
#[derive(Clone, Debug)]
pub struct ReportedModel {
    /// Model id.
    pub id: String,
    /// Its engine.
    pub engine: EngineHandle,
}

/// The worker's load across its models: queue and running sequences and KV blocks summed, fragmentation weighted
/// by blocks in use.
pub fn load_report(worker: &NodeId, sequence: u64, published: &[Published]) -> LoadReport {
    let mut report = LoadReport {
        worker_id: worker.clone(),
        sequence,
        queue_depth: 0,
        running_sequences: 0,
        kv_blocks_used: 0,
        kv_blocks_free: 0,
        fragmentation_ratio: 0.0,
        tokens_per_second: 0.0,
        vram_total_bytes: 0,
        vram_free_bytes: 0,
        queued_prefill_blocks: 0,
        adapters: vec![],
    };
    // Models on one GPU see the same device memory: the first one's figures speak for the worker.
    if let Some((free, total)) = published.iter().find_map(|p| p.stats.device_memory) {
        (report.vram_free_bytes, report.vram_total_bytes) = (free, total.max(free));
    }
    let mut weighted = 0f64;
    for p in published {
        report.queue_depth += p.stats.waiting as u32;
        report.running_sequences += p.stats.running as u32;
        report.queued_prefill_blocks += p.stats.queued_prefill_blocks as u32;
        report.tokens_per_second += p.tokens_per_second.max(0.0);
        if let Some(kv) = p.stats.kv {
            report.kv_blocks_used += (kv.used + kv.cached) as u32;
            report.kv_blocks_free += kv.free as u32;
            weighted += f64::from(kv.fragmentation) * kv.used as f64;
        }
    }
    let used: f64 = published.iter().filter_map(|p| p.stats.kv).map(|kv| kv.used as f64).sum();
    if used > 0.0 {
        report.fragmentation_ratio = (weighted / used).clamp(0.0, 1.0) as f32;
    }
    report
}

/// A model's pending KV events as a message (`None` when there is nothing to say).
pub fn kv_message(worker: &NodeId, sequence: u64, model: &str, published: &Published) -> Option<KvCacheEvents> {
    if published.kv_events.is_empty() && !published.resync {
        return None;
    }
    // Each block's last event in the batch is where it stands (the lists are applied as sets); a block first
    // stored and finally evicted within one batch never needs to reach the orchestrator.
    let mut last: HashMap<u64, (bool, KvEvent)> = HashMap::new();
    let mut order = Vec::new();
    for &ev in &published.kv_events {
        let h = match ev {
            KvEvent::Stored(h) | KvEvent::Evicted(h) | KvEvent::Offloaded(h, _) => h,
        };
        match last.get_mut(&h) {
            Some(entry) => entry.1 = ev,
            None => {
                last.insert(h, (matches!(ev, KvEvent::Stored(_)), ev));
                order.push(h);
            }
        }
    }
    let (mut stored, mut evicted, mut host, mut disk) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for h in order {
        match last[&h] {
            (_, KvEvent::Stored(_)) => stored.push(h),
            (true, KvEvent::Evicted(_)) => {}
            (false, KvEvent::Evicted(_)) => evicted.push(h),
            (_, KvEvent::Offloaded(_, Tier::Host)) => host.push(h),
            (_, KvEvent::Offloaded(_, Tier::Disk)) => disk.push(h),
        }
    }
    Some(KvCacheEvents {
        worker_id: worker.clone(),
        sequence,
        model: model.to_owned(),
        stored,
        evicted,
        cleared: published.resync,
        host,
        disk,
    })
}

/// The first sequence number of a process started at `now`: its microseconds since the epoch (reports come every
/// few hundred milliseconds, so a later process always starts above an earlier one's last).
fn sequence_base(now: std::time::SystemTime) -> u64 {
    now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Heartbeat every `interval` until `stop` turns true: load report and KV events to every orchestrator, a full
/// snapshot after any (re)registration or missed heartbeat.
pub async fn run_reporter<D: Discovery>(
    discovery: &D,
    registration: RegisterWorker,
    models: Vec<ReportedModel>,
    adapters: std::sync::Arc<crate::adapters::AdapterCache>,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // Sequences start from this process's start time (microseconds since the epoch), so a restarted worker's
    // reports are newer than anything its previous process sent: an orchestrator that did not see it register
    // again (a follower) would otherwise drop them as stale until the count caught up, and show (and route on)
    // the dead process's last load.
    let start = sequence_base(std::time::SystemTime::now());
    let load_seq = AtomicU64::new(start);
    let kv_seq = AtomicU64::new(start);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        let published: Vec<Published> = models.iter().map(|m| m.engine.published(true)).collect();
        let worker = &registration.worker_id;
        let load = LoadReport {
            adapters: adapters.resident(),
            ..load_report(worker, load_seq.fetch_add(1, Ordering::Relaxed) + 1, &published)
        };
        let kv: Vec<KvCacheEvents> = models
            .iter()
            .zip(&published)
            .filter_map(|(m, p)| kv_message(worker, kv_seq.fetch_add(1, Ordering::Relaxed) + 1, &m.id, p))
            .collect();
        if discovery.heartbeat(&registration, &load, &kv).await {
            for m in &models {
                let _ = m.engine.request_resync();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_process_starts_its_sequences_above_an_earlier_ones() {
        let t0 = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        // A process that reported every 250 ms for a year, then one started a second later.
        let earlier_last = sequence_base(t0) + 4 * 86_400 * 365;
        let later_first = sequence_base(t0 + std::time::Duration::from_secs(86_400 * 365 + 1)) + 1;
        assert!(later_first > earlier_last);
    }
    use crate::engine::EngineStats;
    use crate::kv::pool::KvStats;

    fn published(waiting: usize, running: usize, used: usize, free: usize, frag: f32) -> Published {
        Published {
            stats: EngineStats {
                waiting,
                running,
                kv: Some(KvStats {
                    total: used + free,
                    used,
                    cached: 0,
                    free,
                    prefix_lookups: 0,
                    prefix_hits: 0,
                    fragmentation: frag,
                }),
                prefill_tokens: 0,
                queued_prefill_blocks: 0,
                device_memory: None,
            },
            tokens_per_second: 10.0,
            kv_events: vec![],
            resync: false,
        }
    }

    #[test]
    fn load_is_summed_and_fragmentation_weighted() {
        let id = NodeId::new("w1").unwrap();
        let r = load_report(&id, 7, &[published(1, 2, 30, 70, 0.5), published(0, 1, 10, 90, 0.1)]);
        assert_eq!((r.queue_depth, r.running_sequences, r.kv_blocks_used, r.kv_blocks_free), (1, 3, 40, 160));
        assert!((r.fragmentation_ratio - 0.4).abs() < 1e-6);
        assert_eq!(r.sequence, 7);
        assert_eq!(r.tokens_per_second, 20.0);
        assert_eq!((r.vram_total_bytes, r.vram_free_bytes), (0, 0));
        let mut gpu = published(0, 1, 10, 90, 0.1);
        gpu.stats.device_memory = Some((30, 80));
        let r = load_report(&id, 8, &[gpu]);
        assert_eq!((r.vram_total_bytes, r.vram_free_bytes), (80, 30));
    }

    #[test]
    fn kv_messages_net_out_short_lived_blocks_and_mark_snapshots() {
        let id = NodeId::new("w1").unwrap();
        let mut p = published(0, 0, 0, 10, 0.0);
        assert!(kv_message(&id, 1, "m", &p).is_none());
        p.kv_events = vec![KvEvent::Stored(1), KvEvent::Stored(2), KvEvent::Evicted(1), KvEvent::Evicted(9)];
        let m = kv_message(&id, 2, "m", &p).unwrap();
        assert_eq!((m.stored, m.evicted, m.cleared), (vec![2], vec![9], false));
        // Offloaded to a tier: where each block stands last.
        p.kv_events = vec![
            KvEvent::Offloaded(2, Tier::Host),
            KvEvent::Offloaded(2, Tier::Disk),
            KvEvent::Offloaded(3, Tier::Host),
            KvEvent::Stored(4),
            KvEvent::Offloaded(4, Tier::Disk),
            KvEvent::Offloaded(5, Tier::Disk),
            KvEvent::Evicted(5),
        ];
        let m = kv_message(&id, 3, "m", &p).unwrap();
        assert_eq!((m.stored, m.evicted, m.host, m.disk), (vec![], vec![5], vec![3], vec![2, 4]));
        p.kv_events.clear();
        p.resync = true;
        let m = kv_message(&id, 3, "m", &p).unwrap();
        assert!(m.cleared && m.stored.is_empty(), "an empty snapshot still clears");
    }
}
