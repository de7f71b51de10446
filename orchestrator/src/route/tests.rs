use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use zl_wire::message::{ComputePool, KvCacheEvents, LoadReport, NodeId, RouteHint, RouteRequest};

use super::*;
use crate::load::{LoadSettings, LoadView};
use crate::state::{Command, RoutingState, WorkerSpec, hex};

fn id(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

fn sha(n: u8) -> String {
    hex(&[n; 32])
}

struct World {
    state: RoutingState,
    load: LoadView,
    now: Instant,
    index: u64,
    seq: u64,
}

impl World {
    fn new() -> Self {
        World {
            state: RoutingState::default(),
            load: LoadView::new(LoadSettings::default()),
            now: Instant::now(),
            index: 0,
            seq: 0,
        }
    }

    fn apply(&mut self, cmd: Command) {
        self.index += 1;
        self.state.apply(self.index, &cmd).unwrap();
    }

    fn worker(&mut self, name: &str, model: &str, version: u8, pool: ComputePool) {
        let spec = WorkerSpec {
            device_class: pool,
            max_running_sequences: 8,
            kv_dtype: "f16".into(),
            kv_bytes_per_token: 0,
            ..crate::state::tests::spec(name, model, version)
        };
        self.apply(Command::RegisterWorker(spec));
        self.report(name, 0, 0);
    }

    fn report(&mut self, name: &str, queue: u32, running: u32) {
        self.report_prefill(name, queue, running, 0);
    }

    /// A report with `prefill_blocks` of prompt work waiting.
    fn report_prefill(&mut self, name: &str, queue: u32, running: u32, prefill_blocks: u32) {
        self.report_with(name, queue, running, prefill_blocks, &[]);
    }

    /// A report with prompt work waiting and `adapters` resident.
    fn report_with(&mut self, name: &str, queue: u32, running: u32, prefill_blocks: u32, adapters: &[&str]) {
        self.seq += 1;
        self.load.report(
            LoadReport {
                worker_id: id(name),
                sequence: self.seq,
                queue_depth: queue,
                running_sequences: running,
                kv_blocks_used: 0,
                kv_blocks_free: 1000,
                fragmentation_ratio: 0.0,
                tokens_per_second: 0.0,
                vram_total_bytes: 0,
                vram_free_bytes: 0,
                queued_prefill_blocks: prefill_blocks,
                adapters: adapters.iter().map(|a| a.to_string()).collect(),
            },
            self.now,
        );
    }

    fn cache(&mut self, name: &str, model: &str, blocks: &[u64]) {
        self.cache_in(name, model, blocks, &[], &[]);
    }

    /// KV events saying `name` holds `hot` in its KV cache, `host` in its host-memory tier, `disk` on disk.
    fn cache_in(&mut self, name: &str, model: &str, hot: &[u64], host: &[u64], disk: &[u64]) {
        self.seq += 1;
        let ev = KvCacheEvents {
            worker_id: id(name),
            sequence: self.seq,
            model: model.into(),
            stored: hot.to_vec(),
            evicted: vec![],
            cleared: false,
            host: host.to_vec(),
            disk: disk.to_vec(),
        };
        self.load.kv_events(&ev, self.now);
    }

    fn route(&self, req: &RouteRequest, policy: &dyn Policy) -> Result<RouteDecision, RouteError> {
        decide(&self.state, &self.load, req, policy, self.now, &mut Scratch::default()).map(|(d, _)| d)
    }
}

fn req(model: &str) -> RouteRequest {
    RouteRequest {
        request_id: "req-1".into(),
        model: model.into(),
        prompt_tokens: 100,
        max_tokens: 100,
        block_hashes: vec![],
        session_id: None,
        hint: RouteHint::None,
        input_semantic_weight: 0.5,
        excluded_workers: vec![],
        trace_id: String::new(),
        prefer_fallback: false,
        project: String::new(),
    }
}

#[test]
fn unknown_models_unhealthy_draining_and_excluded_workers() {
    let mut w = World::new();
    assert_eq!(w.route(&req("m"), &LeastLoaded), Err(RouteError::UnknownModel("m".into())));
    w.worker("w1", "m", 1, ComputePool::Cpu);
    w.worker("w2", "m", 1, ComputePool::Cpu);
    assert!(w.route(&req("m"), &LeastLoaded).is_ok());
    w.apply(Command::SetDrain { id: id("w1"), draining: true, migrate: false });
    let mut r = req("m");
    assert_eq!(w.route(&r, &LeastLoaded).unwrap().worker_id, id("w2"));
    r.excluded_workers = vec![id("w2")];
    assert_eq!(w.route(&r, &LeastLoaded), Err(RouteError::NoWorker("m".into())));
    // w2's heartbeats stop: it is no longer a candidate.
    w.apply(Command::SetDrain { id: id("w1"), draining: false, migrate: false });
    w.now += Duration::from_secs(2);
    w.report("w1", 0, 0);
    w.now += Duration::from_millis(500);
    assert_eq!(w.route(&req("m"), &LeastLoaded).unwrap().worker_id, id("w1"));
}

/// A model whose every worker stopped (deregistered) still exists: no capacity (a 529 clients retry), not an
/// unknown model (a 404 they do not), through an alias too; a name never registered stays unknown.
#[test]
fn a_model_whose_workers_all_left_has_no_capacity_rather_than_no_existence() {
    let mut w = World::new();
    w.worker("w1", "m", 1, ComputePool::Cpu);
    w.apply(Command::SetAlias { alias: "default".into(), target: Some("m".into()) });
    w.apply(Command::DeregisterWorker { id: id("w1") });
    assert_eq!(w.route(&req("m"), &LeastLoaded), Err(RouteError::NoWorker("m".into())));
    assert_eq!(w.route(&req("default"), &LeastLoaded), Err(RouteError::NoWorker("default".into())));
    assert_eq!(w.route(&req("typo"), &LeastLoaded), Err(RouteError::UnknownModel("typo".into())));
}

#[test]
fn aliases_fallbacks_and_the_decision_fields() {
    let mut w = World::new();
    w.worker("w1", "big", 3, ComputePool::Gpu);
    w.worker("w2", "small", 4, ComputePool::Cpu);
    w.apply(Command::SetAlias { alias: "default".into(), target: Some("big".into()) });
    w.apply(Command::SetFallback { model: "big".into(), chain: vec!["small".into()] });
    let d = w.route(&req("default"), &LeastLoaded).unwrap();
    assert_eq!((d.model.as_str(), d.endpoint.as_str()), ("big", "w1:7100"));
    assert_eq!(d.weights_sha256, [3; 32]);
    assert!(d.reason.starts_with("least-loaded: "), "{}", d.reason);
    assert!((0.0..=1.0).contains(&d.predicted_billing_unit));
    // The big model's only worker fails this request: the fallback serves it.
    let mut r = req("default");
    r.excluded_workers = vec![id("w1")];
    let d = w.route(&r, &LeastLoaded).unwrap();
    assert_eq!(d.model, "small");
    assert!(d.reason.contains("fallback from big"), "{}", d.reason);
    // A degraded frontend asks for the fallback first; the model itself still serves when the fallback cannot.
    let mut r = req("default");
    r.prefer_fallback = true;
    let d = w.route(&r, &LeastLoaded).unwrap();
    assert_eq!(d.model, "small");
    assert!(d.reason.contains("preferred"), "{}", d.reason);
    r.excluded_workers = vec![id("w2")];
    assert_eq!(w.route(&r, &LeastLoaded).unwrap().model, "big");
}

#[test]
fn pools_follow_cost_hints_pins_and_saturation() {
    let t = crate::state::PoolThresholds::default();
    let mut r = req("m");
    r.prompt_tokens = 8000;
    r.max_tokens = 4000;
    assert_eq!(pool_for_cost(predicted_cost(&r, 1.0), &t), ComputePool::Gpu);
    r.prompt_tokens = 10;
    r.max_tokens = 10;
    assert_eq!(pool_for_cost(predicted_cost(&r, 0.1), &t), ComputePool::Cpu);
    assert_eq!(pool_for_cost(predicted_cost(&r, 0.8), &t), ComputePool::Hybrid);

    let mut w = World::new();
    w.worker("g1", "m", 1, ComputePool::Gpu);
    w.worker("c1", "m", 1, ComputePool::Cpu);
    let mut r = req("m");
    r.input_semantic_weight = 0.0;
    assert_eq!(w.route(&r, &LeastLoaded).unwrap().compute_pool, ComputePool::Cpu);
    r.hint = RouteHint::LowLatency;
    assert_eq!(w.route(&r, &LeastLoaded).unwrap().compute_pool, ComputePool::Gpu);
    // The cpu pool saturates (queue of a full batch): the request moves to the next pool.
    r.hint = RouteHint::None;
    w.report("c1", 8, 8);
    assert_eq!(w.route(&r, &LeastLoaded).unwrap().compute_pool, ComputePool::Gpu);
    // An operator pin to cpu is honoured even then: the answer is "saturated", not another pool.
    w.apply(Command::PinPool { model: "m".into(), pool: Some(ComputePool::Cpu) });
    assert_eq!(w.route(&r, &LeastLoaded), Err(RouteError::Saturated("m".into())));
    w.apply(Command::PinPool { model: "m".into(), pool: None });
    w.report("g1", 8, 8);
    assert_eq!(w.route(&r, &LeastLoaded), Err(RouteError::Saturated("m".into())));
}

#[test]
fn canary_weights_split_deterministically_and_pins_win() {
    let mut w = World::new();
    w.worker("v1", "m", 1, ComputePool::Cpu);
    w.worker("v2", "m", 2, ComputePool::Cpu);
    w.apply(Command::SetCanary { model: "m".into(), weights: BTreeMap::from([(sha(1), 90), (sha(2), 10)]) });
    let mut to_v2 = 0;
    for i in 0..2000 {
        let mut r = req("m");
        r.request_id = format!("req-{i}");
        let first = w.route(&r, &LeastLoaded).unwrap();
        assert_eq!(w.route(&r, &LeastLoaded).unwrap().worker_id, first.worker_id, "same request, same version");
        if first.worker_id == id("v2") {
            to_v2 += 1;
        }
    }
    assert!((140..=260).contains(&to_v2), "about 10% of 2000 should go to the canary, got {to_v2}");
    w.apply(Command::PinVersion { model: "m".into(), weights_sha256: Some(sha(2)) });
    for i in 0..50 {
        let mut r = req("m");
        r.request_id = format!("req-{i}");
        assert_eq!(w.route(&r, &LeastLoaded).unwrap().worker_id, id("v2"));
    }
    // The canary version's worker is excluded: the other version in the split takes it.
    w.apply(Command::PinVersion { model: "m".into(), weights_sha256: None });
    let mut r = req("m");
    r.excluded_workers = vec![id("v2")];
    for i in 0..50 {
        r.request_id = format!("req-{i}");
        assert_eq!(w.route(&r, &LeastLoaded).unwrap().worker_id, id("v1"));
    }
}

#[test]
fn least_loaded_and_round_robin() {
    let mut w = World::new();
    for name in ["w1", "w2", "w3"] {
        w.worker(name, "m", 1, ComputePool::Cpu);
    }
    w.report("w1", 2, 4);
    w.report("w2", 0, 6);
    w.report("w3", 0, 2);
    assert_eq!(w.route(&req("m"), &LeastLoaded).unwrap().worker_id, id("w3"));
    let rr = RoundRobin::default();
    let picks: Vec<NodeId> = (0..6).map(|_| w.route(&req("m"), &rr).unwrap().worker_id).collect();
    assert_eq!(picks, [id("w1"), id("w2"), id("w3"), id("w1"), id("w2"), id("w3")]);
}

#[test]
fn prefix_aware_prefers_cached_prefixes_unless_busy() {
    let mut w = World::new();
    for name in ["w1", "w2", "w3"] {
        w.worker(name, "m", 1, ComputePool::Cpu);
    }
    w.cache("w2", "m", &[1, 2, 3, 4, 5, 6, 7, 8]);
    w.cache("w3", "m", &[1, 2]);
    let mut r = req("m");
    r.block_hashes = (1..=10).collect();
    let d = w.route(&r, &PrefixAware::default()).unwrap();
    assert_eq!(d.worker_id, id("w2"));
    assert!(d.reason.contains("8 of 10 prompt blocks cached"), "{}", d.reason);
    // w2 gets busy: 2 queued + 4 running cost 24 blocks, more than the 8 it saves.
    w.report("w2", 2, 4);
    assert_eq!(w.route(&r, &PrefixAware::default()).unwrap().worker_id, id("w3"));
    // The same blocks cached for another model do not count.
    let mut other = r.clone();
    other.model = "m2".into();
    w.worker("w4", "m2", 1, ComputePool::Cpu);
    assert_eq!(w.route(&other, &PrefixAware::default()).unwrap().worker_id, id("w4"));
}

#[test]
fn prefix_aware_spreads_new_prefixes_and_keeps_each_together() {
    let mut w = World::new();
    for i in 0..4 {
        w.worker(&format!("w{i}"), "m", 1, ComputePool::Cpu);
    }
    // Idle workers, nothing cached: 64 new documents (first block hash d) go everywhere, none on one worker more
    // than twice its share, and each document's requests all go to one worker.
    let route = |w: &World, doc: u64, question: u64| {
        let mut r = req("m");
        r.block_hashes = vec![doc * 1000, doc * 1000 + 1, 7_000_000 + question];
        w.route(&r, &PrefixAware::default()).unwrap().worker_id
    };
    let mut per_worker: BTreeMap<NodeId, usize> = BTreeMap::new();
    for doc in 1..=64 {
        let first = route(&w, doc, 0);
        assert!((1..5).all(|q| route(&w, doc, q) == first), "document {doc} split");
        *per_worker.entry(first).or_default() += 1;
    }
    assert_eq!(per_worker.len(), 4, "{per_worker:?}");
    assert!(per_worker.values().all(|&n| n <= 32), "{per_worker:?}");
    // A prompt under one block has no prefix: its request id spreads such requests too.
    let spread: std::collections::HashSet<NodeId> = (0..40)
        .map(|i| {
            let mut r = req("m");
            r.request_id = format!("req-{i}");
            w.route(&r, &PrefixAware::default()).unwrap().worker_id
        })
        .collect();
    assert_eq!(spread.len(), 4);
}

#[test]
fn session_affinity_is_sticky_and_moves_only_the_leavers_sessions() {
    let mut w = World::new();
    for i in 0..5 {
        w.worker(&format!("w{i}"), "m", 1, ComputePool::Cpu);
    }
    let route = |w: &World, s: usize| {
        let mut r = req("m");
        r.session_id = Some(format!("session-{s}"));
        w.route(&r, &SessionAffinity).unwrap().worker_id
    };
    let before: Vec<NodeId> = (0..200).map(|s| route(&w, s)).collect();
    assert_eq!(before, (0..200).map(|s| route(&w, s)).collect::<Vec<_>>());
    let used: std::collections::HashSet<&NodeId> = before.iter().collect();
    assert_eq!(used.len(), 5, "sessions spread over every worker");
    w.apply(Command::DeregisterWorker { id: id("w2") });
    for (s, prev) in before.iter().enumerate() {
        let now = route(&w, s);
        if *prev != id("w2") {
            assert_eq!(&now, prev, "session {s} moved although its worker stayed");
        } else {
            assert_ne!(now, id("w2"));
        }
    }
    // Without a session id it is least-loaded.
    let d = w.route(&req("m"), &SessionAffinity).unwrap();
    assert!(d.reason.contains("no session id"), "{}", d.reason);
}

#[test]
fn every_policy_has_a_name() {
    for name in POLICY_NAMES {
        assert_eq!(policy_by_name(name).unwrap().name(), *name);
    }
    assert!(policy_by_name("random").is_none());
}

#[test]
fn a_burst_between_two_reports_spreads_and_a_report_takes_over_from_the_in_flight_count() {
    for policy in [&LeastLoaded as &dyn Policy, &PrefixAware::default()] {
        let mut w = World::new();
        for name in ["w1", "w2", "w3"] {
            w.worker(name, "m", 1, ComputePool::Cpu);
        }
        // Nine requests in a millisecond: every worker's report still says idle, the routes counted in flight.
        let mut counts = BTreeMap::new();
        for i in 0..9 {
            let r = RouteRequest { request_id: format!("req-{i}"), ..req("m") };
            let d = w.route(&r, policy).unwrap();
            w.load.routed(&d.worker_id, w.now, 0);
            *counts.entry(d.worker_id.to_string()).or_insert(0) += 1;
        }
        assert_eq!(counts.values().copied().collect::<Vec<_>>(), vec![3, 3, 3], "{}: {counts:?}", policy.name());
        // A report received past the margin counts them itself: the in-flight count is gone, what it says rules.
        let slot = w.load.slot_of(&id("w1")).unwrap();
        assert_eq!(w.load.in_flight(slot, w.now), (3, 0));
        w.now += crate::load::ROUTE_COVERED_AFTER;
        w.report("w1", 0, 3);
        assert_eq!(w.load.in_flight(slot, w.now), (0, 0));
        // Routes never covered by a report (a worker gone quiet) are forgotten.
        let slot2 = w.load.slot_of(&id("w2")).unwrap();
        w.now += crate::load::ROUTE_FORGOTTEN_AFTER;
        assert_eq!(w.load.in_flight(slot2, w.now), (0, 0));
    }
}

#[test]
fn in_flight_routes_fill_a_worker_before_it_reports_a_queue() {
    let mut w = World::new();
    w.worker("w1", "m", 1, ComputePool::Cpu);
    // 8 slots, 8 waiting at most: 16 routes in flight saturate it (no report has said so yet).
    for i in 0..16 {
        let d = w.route(&RouteRequest { request_id: format!("r{i}"), ..req("m") }, &LeastLoaded).unwrap();
        w.load.routed(&d.worker_id, w.now, 0);
    }
    assert_eq!(w.route(&req("m"), &LeastLoaded), Err(RouteError::Saturated("m".into())));
}

#[test]
fn a_hot_prefix_leaves_its_worker_when_the_prefill_waiting_there_costs_more_than_recomputing() {
    let mut w = World::new();
    w.worker("w1", "m", 1, ComputePool::Cpu);
    w.worker("w2", "m", 1, ComputePool::Cpu);
    let blocks: Vec<u64> = (1..=10).collect();
    w.cache("w1", "m", &blocks[..8]);
    let r = RouteRequest { block_hashes: blocks.clone(), ..req("m") };
    let policy = PrefixAware::default();
    // Idle, w1 holds 8 of 10 blocks: 2 against 10.
    assert_eq!(w.route(&r, &policy).unwrap().worker_id, id("w1"));
    // Its report says 20 blocks of prompts wait there (one running sequence): 2 * 2 + 20 + 4 = 28 against 10 (its
    // own blocks count twice on a worker with prompt work waiting).
    w.report_prefill("w1", 0, 1, 20);
    assert_eq!(w.route(&r, &policy).unwrap().worker_id, id("w2"));
    // The v1 cost saw only the sequence: 2 + 4 = 6 against 10, and the request queued behind the 20 blocks.
    let v1 = policy_by_name("prefix-aware-v1").unwrap();
    assert_eq!(w.route(&r, v1.as_ref()).unwrap().worker_id, id("w1"));
    // But not to a worker that is busy too: there its own 10 blocks count twice (they take compute its own queue
    // waits for). w1: 2 * 2 + 20 + 4 = 28; w2 with 10 blocks waiting: 2 * 10 + 10 = 30 (it would be 20 if counted
    // once), so the request stays with its prefix.
    w.report_prefill("w2", 0, 0, 10);
    assert_eq!(w.route(&r, &policy).unwrap().worker_id, id("w1"));
    w.report_prefill("w2", 0, 0, 7);
    assert_eq!(w.route(&r, &policy).unwrap().worker_id, id("w2"), "27 against 28: the queue there is short enough");
    w.report_prefill("w2", 0, 0, 0);
    // The same from routes this orchestrator handed out since the last report: a burst of a new 10-block document
    // goes where it is not queued behind itself.
    let mut w = World::new();
    w.worker("w1", "m", 1, ComputePool::Cpu);
    w.worker("w2", "m", 1, ComputePool::Cpu);
    let doc = RouteRequest { block_hashes: (100..110).collect(), ..req("m") };
    let (first, uncached) = decide(&w.state, &w.load, &doc, &policy, w.now, &mut Scratch::default()).unwrap();
    assert_eq!(uncached, 10);
    w.load.routed(&first.worker_id, w.now, uncached);
    let second = w.route(&doc, &policy).unwrap();
    assert_ne!(second.worker_id, first.worker_id, "the second waits behind the first's 10 blocks there");
    assert_eq!(w.route(&doc, v1.as_ref()).unwrap().worker_id, first.worker_id, "v1 piles the burst up");
}

#[test]
fn a_prompt_routed_to_a_worker_counts_as_cached_there_before_its_events_arrive() {
    let mut w = World::new();
    w.worker("w1", "m", 1, ComputePool::Cpu);
    w.worker("w2", "m", 1, ComputePool::Cpu);
    let policy = PrefixAware::default();
    let doc = |i: u64| RouteRequest { block_hashes: (100..110).chain([200 + i]).collect(), ..req("m") };
    let first = w.route(&doc(0), &policy).unwrap();
    let other = if first.worker_id == id("w1") { "w2" } else { "w1" };
    // Its report has covered the route (one running sequence), its KV events have not come yet.
    w.report(first.worker_id.as_str(), 0, 1);
    w.report(other, 0, 0);
    // Unpredicted: 11 blocks + 4 there against 11 elsewhere, so the next question about the document recomputes it.
    assert_eq!(w.route(&doc(1), &policy).unwrap().worker_id, id(other));
    // Predicted (what the orchestrator records with each route): 1 + 4 against 11; it follows its document.
    w.load.predict_cached(&first.worker_id, "m", &doc(0).block_hashes, w.now);
    assert_eq!(w.route(&doc(1), &policy).unwrap().worker_id, first.worker_id);
}

/// Adapter `tuned` over `m`, owned by `project` (empty: every project's).
fn add_tuned(w: &mut World, project: &str) {
    let spec = crate::state::AdapterSpec {
        name: "tuned".into(),
        base: "m".into(),
        path: "tuned".into(),
        sha256: sha(7),
        project: project.into(),
        shared: false,
    };
    w.apply(Command::AddAdapter(spec));
}

/// Two workers of `m` and adapter `tuned` over it, owned by project acme.
fn adapter_world() -> World {
    let mut w = World::new();
    w.worker("w1", "m", 1, ComputePool::Cpu);
    w.worker("w2", "m", 1, ComputePool::Cpu);
    add_tuned(&mut w, "acme");
    w
}

#[test]
fn prefix_aware_weighs_a_cold_adapter_load_against_queued_work_and_counts_routed_loads() {
    let mut w = adapter_world();
    let policy = PrefixAware::default();
    let ask = RouteRequest { project: "acme".into(), ..req("tuned") };
    // Resident on w2, busy but with nothing queued: kept there however many run (every policy).
    w.report_with("w2", 0, 7, 0, &["tuned"]);
    let d = w.route(&ask, &policy).unwrap();
    assert_eq!(d.worker_id, id("w2"));
    assert!(d.reason.contains("cost 28.0") && d.reason.contains("adapter tuned resident"), "{}", d.reason);
    // Queued there: every worker is a candidate. One queued and one running (8) against a load on an idle w1
    // (16): still w2.
    w.report_with("w2", 1, 1, 0, &["tuned"]);
    let d = w.route(&ask, &policy).unwrap();
    assert_eq!(d.worker_id, id("w2"), "{}", d.reason);
    // One queued and five running (24) outweigh the load (16): the adapter spreads to w1.
    w.report_with("w2", 1, 5, 0, &["tuned"]);
    let d = w.route(&ask, &policy).unwrap();
    assert_eq!(d.worker_id, id("w1"));
    assert!(d.reason.contains("cost 16.0") && d.reason.contains("loads there (cold)"), "{}", d.reason);
    // A request on it routed to w1: until reports cover it, w1 counts as loading it (no second cold load), for
    // two seconds whatever the reports say meanwhile.
    w.load.routed_adapter(&id("w1"), crate::hash::stable_hash("tuned"), w.now);
    w.report_with("w1", 0, 4, 0, &[]);
    let d = w.route(&ask, &policy).unwrap();
    assert_eq!(d.worker_id, id("w1"), "{}", d.reason);
    assert!(d.reason.contains("cost 16.0") && d.reason.contains("loading there"), "{}", d.reason);
    w.now += crate::load::ROUTE_FORGOTTEN_AFTER;
    w.report_with("w1", 0, 4, 0, &[]);
    w.report_with("w2", 1, 5, 0, &["tuned"]);
    assert_eq!(w.route(&ask, &policy).unwrap().worker_id, id("w2"), "forgotten: cold on w1 again (16 + 16 > 24)");
    // The base's requests never pay for an adapter.
    assert_eq!(w.route(&req("m"), &policy).unwrap().worker_id, id("w1"));
}

#[test]
fn requests_on_an_adapter_go_only_to_cpu_workers_whose_kernels_apply_it() {
    let mut w = World::new();
    w.worker("g1", "m", 1, ComputePool::Gpu);
    add_tuned(&mut w, "");
    let ask = RouteRequest { hint: RouteHint::LowLatency, ..req("tuned") };
    // The base on a GPU only: no worker can apply the adapter.
    assert_eq!(w.route(&ask, &PrefixAware::default()), Err(RouteError::NoWorker("tuned".into())));
    w.worker("c1", "m", 1, ComputePool::Cpu);
    for policy in [&PrefixAware::default() as &dyn Policy, &LeastLoaded, &RoundRobin::default()] {
        assert_eq!(w.route(&ask, policy).unwrap().worker_id, id("c1"), "{}", policy.name());
        let base = RouteRequest { hint: RouteHint::LowLatency, ..req("m") };
        assert_eq!(w.route(&base, policy).unwrap().worker_id, id("g1"), "the base still prefers the GPU");
    }
}

#[test]
fn an_adapter_routes_to_its_base_where_it_is_resident_until_that_queues_and_only_for_its_projects() {
    let mut w = adapter_world();
    let ask = |project: &str, model: &str| RouteRequest { project: project.into(), ..req(model) };
    // Another project: no such model.
    assert_eq!(w.route(&ask("beta", "tuned"), &LeastLoaded), Err(RouteError::UnknownModel("tuned".into())));
    // Cold everywhere: the base's workers, the adapter in the decision.
    let d = w.route(&ask("acme", "m:tuned"), &LeastLoaded).unwrap();
    assert_eq!(d.model, "m");
    let a = d.adapter.clone().unwrap();
    assert_eq!((a.name.as_str(), a.path.as_str(), a.sha256), ("tuned", "tuned", [7; 32]));
    assert!(d.reason.contains("adapter tuned loads there (cold)"), "{}", d.reason);
    // Resident on w2, which is busier than w1 but has nothing queued: w2.
    w.report_with("w2", 0, 3, 0, &["tuned"]);
    let d = w.route(&ask("acme", "tuned"), &LeastLoaded).unwrap();
    assert_eq!(d.worker_id, id("w2"));
    assert!(d.reason.contains("adapter tuned resident"), "{}", d.reason);
    // The base alone still goes to the less loaded w1.
    assert_eq!(w.route(&ask("acme", "m"), &LeastLoaded).unwrap().worker_id, id("w1"));
    // Once w2 queues, the adapter spreads: least-loaded picks w1, where it will load.
    w.report_with("w2", 2, 3, 0, &["tuned"]);
    let d = w.route(&ask("acme", "tuned"), &LeastLoaded).unwrap();
    assert_eq!(d.worker_id, id("w1"));
}

#[test]
fn a_prefix_in_a_workers_lower_tiers_is_priced_between_a_hot_hit_and_a_recomputation() {
    let mut w = World::new();
    for name in ["w1", "w2", "w3"] {
        w.worker(name, "m", 1, ComputePool::Cpu);
    }
    let prompt: Vec<u64> = (1..=40).collect();
    // w1 keeps the whole prefix on disk, w2 nothing: the disk's copy beats recomputing 40 blocks.
    w.cache_in("w1", "m", &[], &[], &prompt);
    let mut r = req("m");
    r.block_hashes = prompt.clone();
    let d = w.route(&r, &PrefixAware::default()).unwrap();
    assert_eq!(d.worker_id, id("w1"), "{}", d.reason);
    assert!(d.reason.contains("40 on disk"), "{}", d.reason);
    // w3 keeps it in host memory: cheaper than a read from disk.
    w.cache_in("w3", "m", &[], &prompt, &[]);
    assert_eq!(w.route(&r, &PrefixAware::default()).unwrap().worker_id, id("w3"));
    // w2 takes it into its KV cache (hot): cheapest of all.
    w.cache("w2", "m", &prompt);
    assert_eq!(w.route(&r, &PrefixAware::default()).unwrap().worker_id, id("w2"));
    // The same block moving down w2's tiers changes its place, not whether it is held; evicted, it is gone.
    w.cache_in("w2", "m", &[], &[], &prompt);
    assert_eq!(w.route(&r, &PrefixAware::default()).unwrap().worker_id, id("w3"));
    let costs = |w: &World| {
        let mut out = FxHashMap::default();
        w.load.prefix_overlap("m", &prompt, &mut out);
        let slot = w.load.slot_of(&id("w2")).unwrap();
        out.get(&slot).copied().unwrap_or_default()
    };
    assert_eq!((costs(&w).blocks, costs(&w).disk), (40, 40));
    w.seq += 1;
    let gone = KvCacheEvents {
        worker_id: id("w2"),
        sequence: w.seq,
        model: "m".into(),
        stored: vec![],
        evicted: prompt.clone(),
        cleared: false,
        host: vec![],
        disk: vec![],
    };
    w.load.kv_events(&gone, w.now);
    assert_eq!(costs(&w).blocks, 0);
}
