//! Route decisions: pure functions over (replicated state, load view, request).
//!
//! 1. **Models**: the requested name after alias resolution, then its fallback chain, in order.
//! 2. **Versions**: a pinned version only; else a canary split picks one version by weight, deterministically
//!    from the request id (a retry of the same request lands on the same version), with the split's other
//!    versions after it; else any version.
//! 3. **Candidates**: workers serving that model version that are registered, not draining, healthy (reported
//!    within the heartbeat timeout) and not excluded by the request (workers that already failed it); above
//!    1,024 workers of a model, a sample of them (`sample.rs`).
//! 4. **Pool**: the request's predicted cost picks a pool (see [`predicted_cost`]); an operator pin or a client
//!    hint reorders the pools tried; a pool whose candidates are all saturated (queue at least a full batch) is
//!    skipped for the next.
//! 5. **Policy**: one of the pluggable policies (one file each) picks among the pool's candidates and says why.
//!
//! No IO, no clock reads (the caller passes `now`), no allocation beyond a few small vectors.

mod least_loaded;
mod prefix_aware;
mod round_robin;
mod sample;
mod session_affinity;

use std::time::Instant;

use zl_common::billing::predicted_billing_unit;
use zl_wire::message::{AdapterRef, ComputePool, LoadReport, RouteDecision, RouteHint, RouteRequest};

use crate::hash::{FxHashMap, stable_hash};
use crate::load::LoadView;
use crate::state::{ModelVersion, PoolThresholds, RoutingState, WorkerEntry};

pub use least_loaded::LeastLoaded;
pub use prefix_aware::PrefixAware;
pub use round_robin::RoundRobin;
pub use session_affinity::SessionAffinity;

/// A worker that may serve the request.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// Its registration.
    pub worker: &'a WorkerEntry,
    /// The model version it would serve.
    pub model: &'a ModelVersion,
    /// Its newest load report.
    pub load: &'a LoadReport,
    /// Leading blocks of the prompt it holds: in its KV cache or its lower tiers.
    pub prefix_blocks: u32,
    /// Of those, how many it keeps in host memory and how many on disk only (taken back at a copy's or a read's
    /// cost rather than free).
    pub prefix_tiers: (u32, u32),
    /// Requests routed to it that its newest report does not count yet (this orchestrator's routes since).
    pub in_flight: u32,
    /// Their prompt blocks to compute there.
    pub in_flight_blocks: u32,
    /// [`stable_hash`] of its id.
    pub id_hash: u64,
    /// Whether the request's LoRA adapter is there.
    pub adapter: AdapterFit,
}

/// Where a request's LoRA adapter stands on a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterFit {
    /// The request names no adapter.
    None,
    /// Loaded there (its report lists it).
    Resident,
    /// A request on it was routed there since: loading, or loaded.
    Routed,
    /// Not there: the worker would read and check its file first (a cold load).
    Cold,
}

impl AdapterFit {
    /// Whether the adapter is (or is being) loaded there.
    pub fn warm(self) -> bool {
        matches!(self, AdapterFit::Resident | AdapterFit::Routed)
    }

    /// The route reason's words for it.
    fn describe(self) -> &'static str {
        match self {
            AdapterFit::None => "",
            AdapterFit::Resident => "resident",
            AdapterFit::Routed => "loading there (routed since its last report)",
            AdapterFit::Cold => "loads there (cold)",
        }
    }
}

impl Candidate<'_> {
    /// Its sequences (running, waiting) as they will be once the in-flight requests arrive: they run while slots
    /// are free and wait after.
    pub fn sequences(&self) -> (u32, u32) {
        let max = self.worker.spec.max_running_sequences;
        let all = self.load.running_sequences + self.load.queue_depth + self.in_flight;
        if self.in_flight == 0 {
            return (self.load.running_sequences, self.load.queue_depth);
        }
        (all.min(max.max(self.load.running_sequences)), all.saturating_sub(max.max(self.load.running_sequences)))
    }
}

/// A policy's choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Pick {
    /// Position in the candidate list.
    pub index: usize,
    /// Why, for the decision's `reason`.
    pub reason: String,
}

/// A routing policy: picks one of a non-empty list of candidates (all in one pool, all with capacity, sorted by
/// worker id).
pub trait Policy: Send + Sync {
    /// Its name, as configured and in metrics.
    fn name(&self) -> &'static str;
    /// The choice.
    fn pick(&self, request: &RouteRequest, candidates: &[Candidate<'_>]) -> Pick;
}

/// The candidate with the lowest score, and that score; ties go to the earlier (lower worker id) candidate.
pub(crate) fn lowest(candidates: &[Candidate<'_>], score: impl Fn(&Candidate<'_>) -> f64) -> (usize, f64) {
    let mut best = (0, f64::INFINITY);
    for (i, c) in candidates.iter().enumerate() {
        let s = score(c);
        if s < best.1 {
            best = (i, s);
        }
    }
    best
}

/// The policies by name: `least-loaded`, `prefix-aware`, `session-affinity`, `round-robin`, and `prefix-aware-v1`
/// (the prefix-aware cost before it counted queued work, for comparisons).
pub fn policy_by_name(name: &str) -> Option<Box<dyn Policy>> {
    Some(match name {
        "least-loaded" => Box::new(LeastLoaded),
        "prefix-aware" => Box::new(PrefixAware::default()),
        "prefix-aware-v1" => Box::new(PrefixAware { predicted_work: false, ..PrefixAware::default() }),
        "session-affinity" => Box::new(SessionAffinity),
        "round-robin" => Box::new(RoundRobin::default()),
        _ => return None,
    })
}

/// Every policy name, for `--help` and errors.
pub const POLICY_NAMES: &[&str] =
    &["least-loaded", "prefix-aware", "session-affinity", "round-robin", "prefix-aware-v1"];

/// Why no route was found.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RouteError {
    /// No registered worker serves the model (after aliases and fallbacks), and no alias names it.
    #[error("model {0:?} is not served by this cluster")]
    UnknownModel(String),
    /// Workers serve (or once served) the model but none is healthy, registered, not draining and not excluded.
    #[error("no healthy worker serves {0:?} right now")]
    NoWorker(String),
    /// Every pool that may serve the request is saturated.
    #[error("every worker for {0:?} is at capacity")]
    Saturated(String),
    /// No worker looks healthy to this orchestrator, but it started too recently to have heard from them all:
    /// another orchestrator should answer.
    #[error("this orchestrator has just started and has not heard from the workers serving {0:?} yet")]
    WarmingUp(String),
}

/// Suggested client back-off when no route is found.
pub const RETRY_AFTER_MS: u32 = 1000;

/// Tokens a request's size is measured against for its predicted cost.
pub const COST_SIZE_TOKENS: f32 = 8192.0;

/// A request's predicted cost in [0, 1]: the mean of its size (`(prompt_tokens + max_tokens) / 8192`, capped at 1)
/// and its predicted billing unit.
pub fn predicted_cost(request: &RouteRequest, predicted_unit: f32) -> f32 {
    let size = ((request.prompt_tokens as f32 + request.max_tokens as f32) / COST_SIZE_TOKENS).min(1.0);
    (0.5 * size + 0.5 * predicted_unit).clamp(0.0, 1.0)
}

/// The pool a cost maps to.
pub fn pool_for_cost(cost: f32, t: &PoolThresholds) -> ComputePool {
    if cost >= t.gpu {
        ComputePool::Gpu
    } else if cost >= t.hybrid {
        ComputePool::Hybrid
    } else {
        ComputePool::Cpu
    }
}

/// Pools in the order they are tried.
pub fn pool_order(preferred: ComputePool, hint: RouteHint, pinned: Option<ComputePool>) -> Vec<ComputePool> {
    use ComputePool::{Cpu, Gpu, Hybrid};
    if let Some(pin) = pinned {
        return vec![pin];
    }
    match hint {
        RouteHint::LowLatency => vec![Gpu, Hybrid, Cpu],
        RouteHint::LowCost => vec![Cpu, Hybrid, Gpu],
        RouteHint::None => match preferred {
            Gpu => vec![Gpu, Hybrid, Cpu],
            Hybrid => vec![Hybrid, Gpu, Cpu],
            Cpu => vec![Cpu, Hybrid, Gpu],
        },
    }
}

/// Whether a worker can take another request without queueing more than a full batch, counting the requests
/// routed to it that its report does not count yet.
pub fn has_capacity(worker: &WorkerEntry, load: &LoadReport, in_flight: u32) -> bool {
    let max = worker.spec.max_running_sequences;
    let waiting =
        (load.running_sequences + load.queue_depth + in_flight).saturating_sub(max.max(load.running_sequences));
    waiting.max(load.queue_depth) < max
}

/// Version preferences for a model: pinned, canary order, or any.
fn versions(state: &RoutingState, model: &str, request_id: &str) -> Vec<Option<String>> {
    if let Some(pin) = state.pin(model) {
        return vec![Some(pin.to_owned())];
    }
    let Some(split) = state.canary(model) else { return vec![None] };
    let total: u64 = split.values().map(|&w| u64::from(w)).sum();
    let mut point = stable_hash(request_id) % total.max(1);
    let mut picked = None;
    for (sha, &w) in split {
        if point < u64::from(w) {
            picked = Some(sha.clone());
            break;
        }
        point -= u64::from(w);
    }
    let mut order: Vec<Option<String>> = picked.iter().cloned().map(Some).collect();
    let mut rest: Vec<(&String, &u32)> =
        split.iter().filter(|(sha, w)| Some(*sha) != picked.as_ref() && **w > 0).collect();
    rest.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    order.extend(rest.into_iter().map(|(sha, _)| Some(sha.clone())));
    order
}

/// Reusable scratch space, so a decision allocates little.
#[derive(Debug, Default)]
pub struct Scratch {
    overlap: FxHashMap<u32, crate::load::Overlap>,
    /// Load-view slot of each worker in the state's index, valid for the two generations below: rebuilt only when
    /// a worker is registered, removed, or gains or loses soft state, so a decision does no string hashing.
    slots: Vec<Option<u32>>,
    /// The inverse: each load slot's worker index.
    slot_worker: FxHashMap<u32, usize>,
    generations: (u64, u64),
    /// The workers a decision over a large fleet visits ([`sample::visit`]).
    visit: Vec<(usize, usize)>,
}

impl Scratch {
    fn slots(&mut self, state: &RoutingState, load: &LoadView) -> &[Option<u32>] {
        let generations = (state.index().generation, load.generation());
        if self.generations != generations || self.slots.len() != state.index().workers.len() {
            self.slots = state.index().workers.iter().map(|w| load.slot_of(&w.spec.id)).collect();
            self.slot_worker = self.slots.iter().enumerate().filter_map(|(wi, s)| Some(((*s)?, wi))).collect();
            self.generations = generations;
        }
        &self.slots
    }
}

/// Decide a route, and the prompt blocks the chosen worker will have to compute (those it does not hold): what the
/// caller counts in flight there ([`LoadView::routed`]). `decision_nanos` is left 0 for the caller, which owns the
/// clock.
pub fn decide(
    state: &RoutingState,
    load: &LoadView,
    request: &RouteRequest,
    policy: &dyn Policy,
    now: Instant,
    scratch: &mut Scratch,
) -> Result<(RouteDecision, u32), RouteError> {
    // A model id that names an adapter the project may use runs on its base (never a fallback: the adapter is
    // that base's).
    let adapter = state.adapters().resolve(&request.model, &request.project);
    let resolved = state.resolve_alias(adapter.map_or(&request.model, |a| &a.base)).to_owned();
    let mut chain = vec![resolved.clone()];
    if adapter.is_none() {
        chain.extend(state.fallback(&resolved).iter().map(|m| state.resolve_alias(m).to_owned()));
    }
    if request.prefer_fallback && chain.len() > 1 {
        // Degraded: the fallbacks first, the model itself last.
        chain.rotate_left(1);
    }
    let weights = state.billing_weights();
    let unit = predicted_billing_unit(weights, request.input_semantic_weight.clamp(0.0, 1.0));
    let cost = predicted_cost(request, unit);
    let preferred = pool_for_cost(cost, state.pool_thresholds());
    let index = state.index();
    let mut known = false;
    let mut saturated = false;
    for model in &chain {
        let Some(servers) = index.by_model.get(model) else { continue };
        known = true;
        load.prefix_overlap(model, &request.block_hashes, &mut scratch.overlap);
        scratch.slots(state, load);
        let key = match (&request.session_id, request.block_hashes.first()) {
            (Some(s), _) => stable_hash(s),
            (None, Some(&h)) => h,
            (None, None) => stable_hash(&request.request_id),
        };
        sample::visit(servers, &scratch.overlap, &scratch.slot_worker, key, &mut scratch.visit);
        // A sample first (large fleets only); a pool it has no candidate in is scanned whole.
        let lists: [&[(usize, usize)]; 2] =
            if scratch.visit.is_empty() { [servers, &[]] } else { [&scratch.visit, servers] };
        let fresh = load.fresh_since(now);
        for version in versions(state, model, &request.request_id) {
            // One pass over the model's workers per pool tried (usually one): the pool test comes first, so workers
            // of other pools cost a comparison. Candidates stay in worker-id order.
            let mut in_pool: Vec<Candidate<'_>> = Vec::with_capacity(lists[0].len());
            for pool in pool_order(preferred, request.hint, state.pool_pin(model)) {
                in_pool.clear();
                for list in lists {
                    if !in_pool.is_empty() {
                        break;
                    }
                    for &(wi, mi) in list {
                        let worker = &index.workers[wi];
                        if worker.spec.device_class != pool || worker.draining {
                            continue;
                        }
                        // Adapters run on the CPU kernels: a GPU or hybrid worker would refuse the request.
                        if adapter.is_some() && pool != ComputePool::Cpu {
                            continue;
                        }
                        let mv = &worker.spec.models[mi];
                        if version.as_ref().is_some_and(|v| *v != mv.weights_sha256)
                            || request.excluded_workers.contains(&worker.spec.id)
                        {
                            continue;
                        }
                        let Some(slot) = scratch.slots[wi] else { continue };
                        let Some(report) = load.healthy_since(slot, fresh) else { continue };
                        let (in_flight, in_flight_blocks) = load.in_flight(slot, now);
                        if !has_capacity(worker, report, in_flight) {
                            saturated = true;
                            continue;
                        }
                        let overlap = scratch.overlap.get(&slot).copied().unwrap_or_default();
                        let id_hash = index.id_hashes[wi];
                        let fit = match adapter {
                            None => AdapterFit::None,
                            Some(a) if report.adapters.contains(&a.name) => AdapterFit::Resident,
                            Some(a) if load.adapter_routed(slot, stable_hash(&a.name), now) => AdapterFit::Routed,
                            Some(_) => AdapterFit::Cold,
                        };
                        in_pool.push(Candidate {
                            worker,
                            model: mv,
                            load: report,
                            prefix_blocks: overlap.blocks,
                            prefix_tiers: (overlap.host, overlap.disk),
                            in_flight,
                            in_flight_blocks,
                            id_hash,
                            adapter: fit,
                        });
                    }
                }
                if in_pool.is_empty() {
                    continue;
                }
                if adapter.is_some() {
                    prefer_resident(&mut in_pool);
                }
                let pick = policy.pick(request, &in_pool);
                let chosen = in_pool[pick.index];
                let mut reason = format!("{}: {}; pool {} (cost {cost:.2})", policy.name(), pick.reason, pool.name());
                if let Some(a) = adapter {
                    reason.push_str(&format!("; adapter {} {}", a.name, chosen.adapter.describe()));
                }
                if *model != resolved {
                    let why = if request.prefer_fallback { " (preferred: the frontend is degraded)" } else { "" };
                    reason.push_str(&format!("; fallback from {resolved}{why}"));
                }
                let uncached = (request.block_hashes.len() as u32).saturating_sub(chosen.prefix_blocks);
                let decision = RouteDecision {
                    request_id: request.request_id.clone(),
                    worker_id: chosen.worker.spec.id.clone(),
                    endpoint: chosen.worker.spec.endpoint.clone(),
                    model: model.clone(),
                    weights_sha256: sha_bytes(&chosen.model.weights_sha256),
                    compute_pool: pool,
                    predicted_billing_unit: unit,
                    reason,
                    decision_nanos: 0,
                    orchestrator_id: String::new(),
                    adapter: adapter.map(|a| AdapterRef {
                        name: a.name.clone(),
                        path: a.path.clone(),
                        sha256: sha_bytes(&a.sha256),
                    }),
                };
                return Ok((decision, uncached));
            }
        }
    }
    // A model that some worker once registered exists: while none serves it (stopped, restarting, draining) it
    // has no capacity, which a client retries, rather than being unknown, which it does not.
    if !known && !chain.iter().any(|m| state.known_models().contains_key(m)) {
        return Err(RouteError::UnknownModel(request.model.clone()));
    }
    if saturated {
        return Err(RouteError::Saturated(request.model.clone()));
    }
    Err(RouteError::NoWorker(request.model.clone()))
}

/// Keep only the candidates where the request's adapter is (or is being) loaded, when one of them can start the
/// request now (nothing waiting there): an adapter sticks to where it is loaded until that queues, then spreads
/// (loading it costs a worker a read and a check of its file; `prefix-aware` then weighs that load against the
/// work queued where it is loaded).
fn prefer_resident(candidates: &mut Vec<Candidate<'_>>) {
    if candidates.iter().any(|c| c.adapter.warm() && c.sequences().1 == 0) {
        candidates.retain(|c| c.adapter.warm());
    }
}

/// Hex SHA-256 (as stored in the state) to bytes; zeros if malformed (never, for stored values).
pub(crate) fn sha_bytes(hex: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = hex.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()).unwrap_or(0);
    }
    out
}

#[cfg(test)]
mod tests;
