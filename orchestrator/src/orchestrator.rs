//! One orchestrator node: its replicated routing state with the Raft group that writes it, its soft load view and
//! its routing policy. The RPC faces in `api/` call into it; it knows nothing of them.
//!
//! Writes become [`Command`]s committed to the routing state through [`Orchestrator::commit`], always through the
//! orchestrators' Raft group ([`crate::raft`]). Soft reports go to the load view. Route decisions read both under
//! read locks and never wait on a write for long: writes are rare (registrations) or tiny (a report).

use std::cell::RefCell;
use std::sync::RwLock;
use std::time::Instant;

use zl_common::sync::{read, write};
use zl_wire::message::{
    AdapterInfo, ApiKeyEntry, ErrorCode, FrontendGrant, FrontendReport, KvCacheEvents, LoadReport, ModelInfo, NodeId,
    ProjectQuota, RegisterWorker, RouteRequest, StateSync, WireError,
};

use crate::enroll::Enroller;
use crate::ledger::ReportEntry;
use crate::load::{Accepted, LoadSettings, LoadView};
use crate::raft::replica::ConsensusError;
use crate::raft::{CommitError, Group, GroupConfig, SharedState};
use crate::route::{self, Policy, RouteError, Scratch};
use crate::state::{Command, ModelVersion, RoutingState, WorkerSpec, hex};

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Counts of workers by state, for metrics and the admin API.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    /// Reporting within the heartbeat timeout and not draining.
    pub healthy: usize,
    /// Registered but silent.
    pub unhealthy: usize,
    /// Draining.
    pub draining: usize,
}

/// A registered worker as the admin API shows it.
#[derive(Clone, Debug)]
pub struct WorkerView {
    /// Its registration and drain flag.
    pub entry: crate::state::WorkerEntry,
    /// Reporting within the heartbeat timeout.
    pub healthy: bool,
    /// Its newest load report and that report's age.
    pub load: Option<(LoadReport, std::time::Duration)>,
}

/// One orchestrator node.
pub struct Orchestrator {
    state: SharedState,
    group: Group,
    load: RwLock<LoadView>,
    policy: Box<dyn Policy>,
    /// Until then this node's soft view may lack workers that are alive (they report every 250 ms): a route
    /// that finds no healthy worker is [`RouteError::WarmingUp`], so the frontend asks another orchestrator.
    warm_at: Instant,
    /// This node's id (named in route decisions, for the audit record).
    node_id: String,
    /// The CA it signs enrolled nodes' certificates with, when given one.
    enroller: std::sync::OnceLock<Enroller>,
    /// Each project's bounds of stored responses, when the operator set them (`stored.rs`).
    pub(crate) response_bounds: std::sync::OnceLock<crate::state::responses::Bounds>,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator").field("policy", &self.policy.name()).finish_non_exhaustive()
    }
}

impl Orchestrator {
    /// Open this node's Raft storage, start its group (which replays the log into the routing state) and serve
    /// with `policy` over a fresh load view.
    pub fn start(
        node_id: &str,
        policy: Box<dyn Policy>,
        load: LoadSettings,
        group: GroupConfig,
    ) -> Result<Self, ConsensusError> {
        let state = SharedState::default();
        let group = Group::start(group, state.clone())?;
        // Two heartbeat timeouts: every live worker has reported by then, even one whose connection to this
        // address must first notice that the process behind it was replaced.
        let warm_at = Instant::now() + load.heartbeat_timeout * 2;
        Ok(Orchestrator {
            state,
            group,
            load: RwLock::new(LoadView::new(load)),
            policy,
            warm_at,
            node_id: node_id.to_owned(),
            enroller: std::sync::OnceLock::new(),
            response_bounds: std::sync::OnceLock::new(),
        })
    }

    /// The routing policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// The Raft group that writes this node's routing state.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Wait until this node has applied every write committed before the call (linearizable admin reads).
    pub async fn read_barrier(&self) -> Result<(), CommitError> {
        self.group.read_barrier().await
    }

    /// Sign enrolling nodes' certificates with `enroller` from now on (once; later calls are ignored).
    pub fn enable_enrollment(&self, enroller: Enroller) {
        let _ = self.enroller.set(enroller);
    }

    /// A node's certificate request, from `peer` (authenticated): checked, signed, committed, then answered.
    pub async fn enroll(
        &self,
        peer_role: zl_wire::message::Role,
        peer_id: &str,
        req: &zl_wire::message::CertificateRequest,
    ) -> Result<zl_wire::message::CertificateIssued, WireError> {
        let renewal = Enroller::authorize(peer_role, peer_id, req)?;
        let enroller = self.enroller.get().ok_or_else(|| {
            WireError::new(ErrorCode::Unavailable, "this orchestrator does not enroll nodes (no --enroll-ca-key)")
        })?;
        // A worker this node hears from runs now, registered or not (a static one between its registrations): its
        // id is taken whatever the replicated state says yet.
        // One lock at a time (routes take the state's, then the load's).
        let running = || read(&self.load).latest(&req.node_id).is_some();
        let enrolled = || read(&self.state.0).enrolled().get("worker", req.node_id.as_str()).is_some();
        if !renewal && req.role == zl_wire::message::Role::Worker && !enrolled() && running() {
            metrics::counter!("zl_enrollments_total", "outcome" => "refused").increment(1);
            tracing::warn!(node = %req.node_id, by = %peer_id, "enrollment refused: a worker with this id is running");
            return Err(WireError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "enrollment refused: worker {} is running (its load reports reach this orchestrator)",
                    req.node_id
                ),
            ));
        }
        let (signed, entry) = enroller.sign(req, renewal, unix_ms())?;
        let outcome = if renewal { "renewed" } else { "enrolled" };
        if let Err(e) = self.commit(&Command::Enroll(entry)).await {
            if let CommitError::Unavailable(_) | CommitError::NotAccepted(_) = e {
                let mut err = WireError::new(ErrorCode::Overloaded, format!("enrollment not committed: {e}"));
                err.retry_after_ms = route::RETRY_AFTER_MS;
                return Err(err);
            }
            metrics::counter!("zl_enrollments_total", "outcome" => "refused").increment(1);
            tracing::warn!(role = %req.role, node = %req.node_id, by = %peer_id, error = %e, "enrollment refused");
            return Err(WireError::new(ErrorCode::PermissionDenied, format!("enrollment refused: {e}")));
        }
        metrics::counter!("zl_enrollments_total", "outcome" => outcome).increment(1);
        tracing::info!(role = %req.role, node = %req.node_id, by = %peer_id, outcome, "node certificate issued");
        Ok(zl_wire::message::CertificateIssued { cert_pem: signed.cert_pem, not_after_ms: signed.not_after_ms })
    }

    /// Commit a command to the routing state; returns its log index once it is applied on this node.
    pub async fn commit(&self, cmd: &Command) -> Result<u64, CommitError> {
        let result = self.group.commit(cmd).await;
        let outcome = match &result {
            Ok(_) => "applied",
            Err(CommitError::Command(_) | CommitError::Remote(_)) => "rejected",
            Err(CommitError::Unavailable(_) | CommitError::NotAccepted(_)) => "unavailable",
        };
        metrics::counter!("zl_state_commands_total", "kind" => cmd.kind(), "outcome" => outcome).increment(1);
        metrics::gauge!("zl_state_applied_index").set(read(&self.state.0).applied_index() as f64);
        result
    }

    /// Run `f` over the current routing state.
    pub fn with_state<T>(&self, f: impl FnOnce(&RoutingState) -> T) -> T {
        f(&read(&self.state.0))
    }

    /// Decide a route now.
    pub fn route(&self, request: &RouteRequest) -> Result<zl_wire::message::RouteDecision, RouteError> {
        let started = Instant::now();
        let result = {
            let state = read(&self.state.0);
            let load = read(&self.load);
            SCRATCH.with(|s| route::decide(&state, &load, request, self.policy.as_ref(), started, &mut s.borrow_mut()))
        };
        let result = match result {
            Err(RouteError::NoWorker(model)) if started < self.warm_at && self.unheard_of(&model, started) => {
                Err(RouteError::WarmingUp(model))
            }
            other => other,
        };
        // In flight until the worker's next report counts it (the card probe, with no prompt, is no request).
        if let Ok((d, uncached)) = &result
            && request.prompt_tokens > 0
        {
            let mut load = write(&self.load);
            load.routed(&d.worker_id, started, *uncached);
            load.predict_cached(&d.worker_id, &d.model, &request.block_hashes, started);
            if let Some(a) = &d.adapter {
                load.routed_adapter(&d.worker_id, crate::hash::stable_hash(&a.name), started);
            }
        }
        let result = result.map(|(d, _)| d);
        let elapsed = started.elapsed();
        let outcome = match &result {
            Ok(_) => "routed",
            Err(RouteError::UnknownModel(_)) => "unknown_model",
            Err(RouteError::NoWorker(_)) => "no_worker",
            Err(RouteError::Saturated(_)) => "saturated",
            Err(RouteError::WarmingUp(_)) => "warming_up",
        };
        metrics::counter!("zl_route_decisions_total", "policy" => self.policy.name(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!("zl_route_decision_seconds").record(elapsed.as_secs_f64());
        result.map(|mut d| {
            d.decision_nanos = elapsed.as_nanos() as u64;
            d.orchestrator_id.clone_from(&self.node_id);
            d
        })
    }

    /// Whether this node may answer frontends' syncs and reports now: it must vote (a learner still catching up, or
    /// a member removed from the group, holds an old state), and once past its warm-up it must have heard from the
    /// workers (before that, a count of zero healthy workers would be its ignorance, not the cluster's). Otherwise
    /// the frontend asks another orchestrator.
    pub fn check_serving(&self, now: Instant) -> Result<(), WireError> {
        if !self.group.votes() {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                "this orchestrator is not a voter of its group (joining, or removed): ask another",
            ));
        }
        let unheard = || {
            let state = read(&self.state.0);
            let load = read(&self.load);
            state.workers().iter().any(|(id, w)| !w.draining && load.healthy(id, now).is_none())
        };
        if now < self.warm_at && unheard() {
            return Err(WireError::new(
                ErrorCode::Unavailable,
                "this orchestrator has just started and has not heard from every worker yet: ask another",
            ));
        }
        Ok(())
    }

    /// Whether a registered, non-draining worker serving `model` has not reported to this node (yet).
    fn unheard_of(&self, model: &str, now: Instant) -> bool {
        let state = read(&self.state.0);
        let load = read(&self.load);
        let target = state.resolve_alias(model);
        state.workers().iter().any(|(id, w)| {
            !w.draining && w.spec.models.iter().any(|m| m.id == target) && load.healthy(id, now).is_none()
        })
    }

    /// Register (or re-register) a worker. A re-registration starts its soft state afresh: a restarted worker
    /// numbers its reports from 1 again.
    pub async fn register(&self, r: &RegisterWorker) -> Result<u64, CommitError> {
        let spec = WorkerSpec {
            id: r.worker_id.clone(),
            endpoint: r.endpoint.clone(),
            device_class: r.device_class,
            models: r
                .models
                .iter()
                .map(|m| ModelVersion {
                    id: m.id.clone(),
                    weights_sha256: hex(&m.weights_sha256),
                    context_length: m.context_length,
                    family: m.family.clone(),
                    weights_bytes: m.weights_bytes,
                    embedding_dims: m.embedding_dims,
                })
                .collect(),
            kv_block_size: r.kv_block_size,
            kv_blocks_total: r.kv_blocks_total,
            max_running_sequences: r.max_running_sequences,
            kv_dtype: r.kv_dtype.clone(),
            kv_bytes_per_token: r.kv_bytes_per_token,
        };
        let index = self.commit(&Command::RegisterWorker(spec)).await?;
        write(&self.load).forget(&r.worker_id);
        tracing::info!(worker = %r.worker_id, endpoint = %r.endpoint, models = r.models.len(), "worker registered");
        Ok(index)
    }

    /// Remove a worker and its soft state.
    pub async fn deregister(&self, id: &NodeId) -> Result<u64, CommitError> {
        let index = self.commit(&Command::DeregisterWorker { id: id.clone() }).await?;
        write(&self.load).forget(id);
        tracing::info!(worker = %id, "worker deregistered");
        Ok(index)
    }

    /// Take discovery's newest list of workers (id, every check passing): see [`LoadView::apply_discovery`]. The
    /// replicated registrations are not touched: they change only through commands.
    pub fn apply_discovery(&self, listed: impl IntoIterator<Item = (NodeId, bool)>, now: Instant) {
        let listed: crate::hash::FxHashMap<NodeId, bool> = listed.into_iter().collect();
        let held = listed.values().filter(|ok| !**ok).count();
        let gone = write(&self.load).apply_discovery(listed, now);
        metrics::gauge!("zl_discovery_workers_held").set(held as f64);
        for id in gone {
            tracing::info!(worker = %id, "worker left consul and is silent: its soft state is forgotten");
        }
    }

    /// Every registered worker with its soft state.
    pub fn worker_views(&self, now: Instant) -> Vec<WorkerView> {
        let state = read(&self.state.0);
        let load = read(&self.load);
        state
            .workers()
            .values()
            .map(|entry| {
                let id = &entry.spec.id;
                let latest = load.latest(id).cloned();
                WorkerView {
                    entry: entry.clone(),
                    healthy: load.healthy(id, now).is_some(),
                    load: latest.zip(load.age(id, now)),
                }
            })
            .collect()
    }

    /// Why a worker unknown here is refused: NotFound (the worker registers again) from a voter; Unavailable from a
    /// node still joining its group, whose state may simply not have the registration yet: a re-registration would
    /// start the worker's soft state afresh on every orchestrator, and frontends would briefly see no healthy worker.
    fn unknown_worker(&self, why: &str) -> WireError {
        if self.group.votes() {
            WireError::new(ErrorCode::NotFound, why)
        } else {
            WireError::new(ErrorCode::Unavailable, "this orchestrator is joining its group: report to the others")
        }
    }

    fn registered(&self, id: &NodeId) -> bool {
        read(&self.state.0).workers().contains_key(id)
    }

    /// Apply a load report from a registered worker.
    pub fn load_report(&self, report: LoadReport, now: Instant) -> Result<Accepted, WireError> {
        if !self.registered(&report.worker_id) {
            return Err(self.unknown_worker("register before reporting load"));
        }
        Ok(write(&self.load).report(report, now))
    }

    /// Apply KV-cache events from a registered worker.
    pub fn kv_events(&self, events: &KvCacheEvents, now: Instant) -> Result<Accepted, WireError> {
        if !self.registered(&events.worker_id) {
            return Err(self.unknown_worker("register before sending KV events"));
        }
        Ok(write(&self.load).kv_events(events, now))
    }

    /// Forget soft state of workers silent past `forget_after`, and of workers no longer registered; update the
    /// worker gauges. Run about once a second.
    pub fn sweep(&self, now: Instant) -> WorkerCounts {
        write(&self.load).sweep(now);
        let (counts, oldest) = self.counts(now);
        let load = read(&self.load);
        metrics::gauge!("zl_workers", "state" => "healthy").set(counts.healthy as f64);
        metrics::gauge!("zl_workers", "state" => "unhealthy").set(counts.unhealthy as f64);
        metrics::gauge!("zl_workers", "state" => "draining").set(counts.draining as f64);
        metrics::gauge!("zl_soft_state_age_seconds").set(oldest);
        metrics::gauge!("zl_cached_prefix_blocks").set(load.cached_blocks() as f64);
        counts
    }

    /// Workers by state, and the age of the oldest newest report (seconds).
    fn counts(&self, now: Instant) -> (WorkerCounts, f64) {
        let state = read(&self.state.0);
        let load = read(&self.load);
        let mut counts = WorkerCounts::default();
        let mut oldest = 0f64;
        for (id, w) in state.workers() {
            if w.draining {
                counts.draining += 1;
            } else if load.healthy(id, now).is_some() {
                counts.healthy += 1;
            } else {
                counts.unhealthy += 1;
            }
            if let Some(age) = load.age(id, now) {
                oldest = oldest.max(age.as_secs_f64());
            }
        }
        (counts, oldest)
    }

    /// Workers by state now.
    pub fn worker_counts(&self, now: Instant) -> WorkerCounts {
        self.counts(now).0
    }

    /// Commit a frontend's report (usage, budget leases, audit head) and answer with its budget allotments and
    /// the cluster's health signals.
    pub async fn frontend_report(
        &self,
        frontend: &NodeId,
        report: FrontendReport,
        now: Instant,
    ) -> Result<FrontendGrant, CommitError> {
        let now_ms = unix_ms();
        let projects: Vec<String> = report.asks.iter().map(|a| a.project.clone()).collect();
        let report = ReportEntry::from(report);
        let rate_asks = report.rate_asks.clone();
        let refused = |ledger: &crate::ledger::Ledger| {
            ledger.head_records.get(frontend.as_str()).and_then(|r| r.refused.as_ref()).map_or(0, |r| r.count)
        };
        let refused_before = refused(read(&self.state.0).ledger());
        let cmd = Command::FrontendReport { frontend: frontend.to_string(), now_ms, report };
        let applied_index = self.commit(&cmd).await?;
        let state = read(&self.state.0);
        let load = read(&self.load);
        let ledger = state.ledger();
        if refused(ledger) > refused_before {
            // A head that contradicts the committed chain: a rewritten or lost chain, or an impostor.
            metrics::counter!("zl_ledger_audit_heads_refused_total").increment(1);
            let last = ledger.head_records.get(frontend.as_str()).and_then(|r| r.refused.clone()).unwrap_or_default();
            tracing::error!(
                %frontend,
                refused_seq = last.last.seq,
                refused_hash = %last.last.hash,
                committed_seq = ledger.heads.get(frontend.as_str()).map_or(0, |h| h.head.seq),
                "audit head refused: it contradicts the chain committed for this frontend"
            );
        }
        metrics::counter!("zl_ledger_reports_total").increment(1);
        metrics::gauge!("zl_ledger_usage_hours").set(ledger.usage.len() as f64);
        metrics::gauge!("zl_ledger_rate_buckets").set(ledger.rates.len() as f64);
        metrics::gauge!("zl_ledger_audit_heads").set(ledger.heads.len() as f64);
        let mut grant = FrontendGrant {
            applied_index,
            grants: state.ledger().grants(frontend.as_str(), now_ms, projects.iter().map(String::as_str)),
            leader: self.group.status().leader.is_some(),
            rate_grants: state.ledger().rate_grants(frontend.as_str(), &rate_asks),
            audit_head: ledger
                .heads
                .get(frontend.as_str())
                .and_then(|h| Some((h.head.seq, zl_common::keys::parse_hex32(&h.head.hash)?))),
            ..FrontendGrant::default()
        };
        for (id, w) in state.workers().iter().filter(|(_, w)| !w.draining) {
            if let Some((report, _)) = load.healthy(id, now) {
                grant.capacity += w.spec.max_running_sequences;
                grant.running += report.running_sequences;
                grant.waiting += report.queue_depth;
            }
        }
        Ok(grant)
    }

    /// What frontends cache: keys, quotas and the models some non-draining worker serves or some worker once
    /// registered (aliases listed under their own names). Lists are left out when the caller already holds `known_index`; the count of healthy,
    /// non-draining workers (soft state) is always current.
    pub fn state_sync(&self, known_index: u64, now: Instant) -> StateSync {
        let state = read(&self.state.0);
        let load = read(&self.load);
        // While this node warms up (just started: alive workers may not have reported to it yet), a registered
        // worker it has not heard from counts as serving, as routing treats it (`WarmingUp`: ask another
        // orchestrator): a frontend that syncs from it must not call the cluster unavailable (529) meanwhile.
        let warming = now < self.warm_at;
        let serving = state
            .workers()
            .iter()
            .filter(|(id, w)| !w.draining && (warming || load.healthy(id, now).is_some()))
            .count();
        let mut sync = StateSync {
            applied_index: state.applied_index(),
            unchanged: known_index != 0 && known_index == state.applied_index(),
            serving_workers: serving as u32,
            billing_weights: {
                let w = state.billing_weights();
                Some([w.input, w.output, w.context])
            },
            ..StateSync::default()
        };
        if sync.unchanged {
            return sync;
        }
        sync.keys = state
            .keys()
            .values()
            .map(|k| ApiKeyEntry {
                key_id: k.key_id.clone(),
                secret_sha256: k.secret_sha256.clone(),
                project: k.project.clone(),
                regions: k.regions.clone(),
            })
            .collect();
        sync.projects = state
            .projects()
            .iter()
            .map(|(name, q)| {
                let ledger = state.ledger();
                ProjectQuota {
                    project: name.clone(),
                    requests_per_minute: q.requests_per_minute,
                    tokens_per_minute: q.tokens_per_minute,
                    max_concurrent: q.max_concurrent,
                    input_tokens_per_minute: q.input_tokens_per_minute,
                    output_tokens_per_minute: q.output_tokens_per_minute,
                    priority: ledger.priority.get(name).copied().unwrap_or(1),
                    budget: ledger.budgets.get(name).map(crate::ledger::BudgetSpec::wire),
                    content_key: ledger
                        .data_keys
                        .get(name)
                        .and_then(|k| Some((k.key_id.clone(), zl_common::keys::unhex(&k.key)?))),
                    cache_group: state.cache_group(name).unwrap_or_default().to_owned(),
                }
            })
            .collect();
        let info = |m: &crate::state::ModelVersion| ModelInfo {
            id: m.id.clone(),
            weights_sha256: route::sha_bytes(&m.weights_sha256),
            context_length: m.context_length,
            family: m.family.clone(),
            weights_bytes: m.weights_bytes,
            embedding_dims: m.embedding_dims,
        };
        // The versions non-draining workers serve first; then the models with no serving worker now, which still
        // exist: their requests get a retryable 529 from routing.
        let serving = state.workers().values().filter(|w| !w.draining).flat_map(|w| &w.spec.models);
        let mut models = std::collections::BTreeMap::new();
        for m in serving.chain(state.known_models().values()) {
            models.entry(m.id.clone()).or_insert_with(|| info(m));
        }
        for alias in state.aliases().keys() {
            if let Some(target) = models.get(state.resolve_alias(alias)).cloned() {
                models.insert(alias.clone(), ModelInfo { id: alias.clone(), ..target });
            }
        }
        sync.models = models.into_values().collect();
        sync.adapters = state
            .adapters()
            .all()
            .map(|a| AdapterInfo {
                name: a.name.clone(),
                base: a.base.clone(),
                project: a.project.clone(),
                shared: a.shared,
                sha256: route::sha_bytes(&a.sha256),
            })
            .collect();
        sync
    }
}

/// This orchestrator's clock in unix milliseconds: what a command it proposes is stamped with (the state machine
/// never reads a clock; replicas apply the proposer's time).
pub use zl_common::calendar::unix_ms;
