//! The replicated routing state: a deterministic state machine.
//!
//! Every change is a [`Command`], applied in log order by [`RoutingState::apply`]; the same commands in the same
//! order give the same state on every orchestrator (no clocks, no randomness, no hash-map iteration order: maps
//! are `BTreeMap`s). A rejected command leaves the state untouched but still advances the applied index, so
//! every node rejects it identically. The Raft group (`raft/`) replicates exactly these commands and
//! snapshots exactly this state ([`RoutingState::snapshot`]).
//!
//! What is here is what every orchestrator must agree on: who may serve what, how model names resolve, keys and
//! quotas, and the billing and pool policy. Load is soft state and lives in [`crate::load`].

mod adapters;
mod admin_log;
mod command;
mod enrolled;
pub mod responses;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use zl_common::billing::BillingWeights;
use zl_wire::message::{ComputePool, NodeId};

use crate::ledger::Ledger;

pub use adapters::{Adapters, MAX_ADAPTERS};
pub use admin_log::{ADMIN_LOG_ENTRIES, AdminEntry, AdminLog};
pub use command::{AdapterSpec, Command, CommandError, EnrollEntry};
pub use enrolled::{Enrolled, Enrollment, MAX_ENROLLED};

use command::{check_name, check_regions, check_secret_hash, check_sha, invalid};

/// Upper bounds that keep the state, and every snapshot, finite whatever clients send.
pub mod limits {
    /// Registered workers.
    pub const MAX_WORKERS: usize = 10_000;
    /// Aliases, pins, canaries, fallbacks, pool pins: each.
    pub const MAX_MODEL_RULES: usize = 10_000;
    /// API keys.
    pub const MAX_KEYS: usize = 100_000;
    /// Projects.
    pub const MAX_PROJECTS: usize = 10_000;
    /// Versions in one canary split, entries in one fallback chain.
    pub const MAX_LIST: usize = 16;
    /// Alias hops followed when resolving a name.
    pub const MAX_ALIAS_DEPTH: usize = 8;
    /// Bytes in a model id, alias, key id or project name.
    pub const MAX_NAME: usize = 128;
    /// Raft members bound to orchestrators (a group is 1 to 7 voters; ids of removed members stay bound).
    pub const MAX_MEMBERS: usize = 1024;
}

/// One model version a worker serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelVersion {
    /// Model id as clients name it.
    pub id: String,
    /// SHA-256 of the weights, lowercase hex: the version.
    pub weights_sha256: String,
    /// Context window in tokens.
    pub context_length: u32,
    /// Architecture family.
    pub family: String,
    /// Memory its weights take on the worker, bytes (0: not reported; absent from states written before it was).
    #[serde(default)]
    pub weights_bytes: u64,
    /// An embedding model: the width of its vectors (0: a generative model; absent from older states).
    #[serde(default)]
    pub embedding_dims: u32,
}

/// What a worker registers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// Stable worker id.
    pub id: NodeId,
    /// host:port of its QUIC endpoint.
    pub endpoint: String,
    /// The pool it serves.
    pub device_class: ComputePool,
    /// Models served.
    pub models: Vec<ModelVersion>,
    /// Tokens per KV block.
    pub kv_block_size: u32,
    /// KV blocks in its pool.
    pub kv_blocks_total: u32,
    /// Concurrent sequences before it queues.
    pub max_running_sequences: u32,
    /// How its KV cache stores keys and values ("f16", "q8", "q4"; empty from workers before protocol 1.7).
    #[serde(default)]
    pub kv_dtype: String,
    /// Bytes one token's keys and values take (0: not said).
    #[serde(default)]
    pub kv_bytes_per_token: u32,
}

/// A registered worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerEntry {
    /// As registered.
    pub spec: WorkerSpec,
    /// Draining workers finish what they run and get no new requests.
    pub draining: bool,
    /// Drained with `--migrate`: told (on its load reports' answers) to hand its running requests over.
    #[serde(default)]
    pub hand_over: bool,
}

/// Per-project limits; 0 means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// Requests per minute.
    pub requests_per_minute: u32,
    /// Input plus output tokens per minute.
    pub tokens_per_minute: u32,
    /// Requests in flight.
    pub max_concurrent: u32,
    /// Input tokens per minute.
    #[serde(default)]
    pub input_tokens_per_minute: u32,
    /// Output tokens per minute.
    #[serde(default)]
    pub output_tokens_per_minute: u32,
}

/// An API key: only the SHA-256 of its secret is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKey {
    /// Public key id (shown in logs and the admin API).
    pub key_id: String,
    /// SHA-256 of the secret, lowercase hex.
    pub secret_sha256: String,
    /// Project the key bills to.
    pub project: String,
    /// Data residency: the regions whose frontends may serve it (docs/regions.md); empty for any region.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
}

/// Compute-pool thresholds on a request's predicted cost in [0, 1].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolThresholds {
    /// Cost at or above which a request goes to the gpu pool.
    pub gpu: f32,
    /// Cost at or above which (and below `gpu`) a request goes to the hybrid pool; below it, cpu.
    pub hybrid: f32,
}

impl Default for PoolThresholds {
    fn default() -> Self {
        PoolThresholds { gpu: 0.7, hybrid: 0.3 }
    }
}

/// Index for route decisions: rebuilt whenever the worker set changes (rare), read on every decision (often).
#[derive(Clone, Debug, Default)]
pub struct RouteIndex {
    /// Unique per rebuild, so callers may cache lookups keyed by it.
    pub generation: u64,
    /// Registered workers in id order.
    pub workers: Vec<WorkerEntry>,
    /// `hash::stable_hash` of each worker's id, in the same order.
    pub id_hashes: Vec<u64>,
    /// Model id to (position in `workers`, position of the model in the worker's list).
    pub by_model: HashMap<String, Vec<(usize, usize)>>,
}

/// The replicated routing state.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RoutingState {
    applied_index: u64,
    workers: BTreeMap<NodeId, WorkerEntry>,
    /// Every model a worker has registered, with the version last registered: a model whose workers are all
    /// stopped, draining or not yet back still exists (a retryable 529 while it has no capacity, never a 404).
    #[serde(default)]
    known_models: BTreeMap<String, ModelVersion>,
    aliases: BTreeMap<String, String>,
    pins: BTreeMap<String, String>,
    canaries: BTreeMap<String, BTreeMap<String, u32>>,
    fallbacks: BTreeMap<String, Vec<String>>,
    pool_pins: BTreeMap<String, ComputePool>,
    keys: BTreeMap<String, ApiKey>,
    projects: BTreeMap<String, Quota>,
    /// Projects an admin put in a cache group (the others keep their caches to themselves).
    #[serde(default)]
    cache_groups: BTreeMap<String, String>,
    /// Operators' writes and reads of secrets, with who made them.
    #[serde(default)]
    admin_log: AdminLog,
    /// Nodes that enrolled for a certificate of their own.
    #[serde(default)]
    enrolled: Enrolled,
    /// Raft id -> the orchestrator (certificate node id) that is that member, as each member bound itself.
    #[serde(default)]
    members: BTreeMap<u64, String>,
    /// Registered LoRA adapters.
    #[serde(default)]
    adapters: Adapters,
    billing_weights: BillingWeights,
    pool_thresholds: PoolThresholds,
    #[serde(default)]
    ledger: Ledger,
    /// Stored Responses API responses.
    #[serde(default)]
    responses: responses::Responses,
    #[serde(skip)]
    index: RouteIndex,
    /// Key id by secret hash, so verifying a secret is one lookup, not a scan.
    #[serde(skip)]
    keys_by_secret: HashMap<String, String>,
}

impl PartialEq for RoutingState {
    fn eq(&self, other: &Self) -> bool {
        self.snapshot() == other.snapshot()
    }
}

impl RoutingState {
    /// Apply the command at log position `index`. On error the state is unchanged (the index still advances).
    pub fn apply(&mut self, index: u64, cmd: &Command) -> Result<(), CommandError> {
        self.applied_index = self.applied_index.max(index);
        let result = self.apply_inner(cmd);
        // An operator's write rebuilds what its command would.
        let cmd = match cmd {
            Command::Admin { command, .. } => command,
            cmd => cmd,
        };
        if result.is_ok()
            && matches!(cmd, Command::RegisterWorker(_) | Command::DeregisterWorker { .. } | Command::SetDrain { .. })
        {
            self.rebuild_index();
        }
        if result.is_ok()
            && matches!(
                cmd,
                Command::CreateKey(_)
                    | Command::EnsureKey(_)
                    | Command::RevokeKey { .. }
                    | Command::SetKeyRegions { .. }
            )
        {
            self.rebuild_key_index();
        }
        result
    }

    fn apply_inner(&mut self, cmd: &Command) -> Result<(), CommandError> {
        match cmd {
            Command::RegisterWorker(spec) => {
                Self::check_spec(spec)?;
                if !self.workers.contains_key(&spec.id) && self.workers.len() >= limits::MAX_WORKERS {
                    return Err(CommandError::Limit("workers"));
                }
                // A re-registration (a restarted worker) keeps the operator's drain flag.
                let (draining, hand_over) =
                    self.workers.get(&spec.id).map_or((false, false), |w| (w.draining, w.hand_over));
                self.workers.insert(spec.id.clone(), WorkerEntry { spec: spec.clone(), draining, hand_over });
                self.enrolled.saw("worker", spec.id.as_str(), self.applied_index);
                for m in &spec.models {
                    if self.known_models.len() < limits::MAX_MODEL_RULES || self.known_models.contains_key(&m.id) {
                        self.known_models.insert(m.id.clone(), m.clone());
                    }
                }
            }
            Command::DeregisterWorker { id } => {
                self.workers.remove(id).ok_or_else(|| CommandError::NotFound(format!("worker {id}")))?;
            }
            Command::SetDrain { id, draining, migrate } => {
                let w = self.workers.get_mut(id).ok_or_else(|| CommandError::NotFound(format!("worker {id}")))?;
                w.draining = *draining;
                w.hand_over = *draining && *migrate;
            }
            Command::SetAlias { alias, target } => {
                check_name("alias", alias)?;
                match target {
                    None => {
                        self.aliases.remove(alias).ok_or_else(|| CommandError::NotFound(format!("alias {alias}")))?;
                    }
                    Some(target) => {
                        check_name("target", target)?;
                        Self::room(&self.aliases, alias, "aliases")?;
                        // Refuse cycles and chains longer than the resolver follows.
                        let mut at = target.as_str();
                        for _ in 0..limits::MAX_ALIAS_DEPTH {
                            if at == alias {
                                return Err(invalid("target", format!("{alias} -> {target} makes a cycle")));
                            }
                            match self.aliases.get(at) {
                                Some(next) => at = next,
                                None => break,
                            }
                        }
                        if self.aliases.contains_key(at) {
                            return Err(invalid("target", "alias chain too long"));
                        }
                        self.aliases.insert(alias.clone(), target.clone());
                    }
                }
            }
            Command::PinVersion { model, weights_sha256 } => {
                check_name("model", model)?;
                if let Some(sha) = weights_sha256 {
                    check_sha("weights_sha256", sha)?;
                }
                Self::set_rule(&mut self.pins, model, weights_sha256.as_ref(), "pins")?;
            }
            Command::SetCanary { model, weights } => {
                check_name("model", model)?;
                let split = (!weights.is_empty()).then_some(weights);
                if split.is_some() {
                    if weights.len() > limits::MAX_LIST {
                        return Err(CommandError::Limit("versions in a canary split"));
                    }
                    for sha in weights.keys() {
                        check_sha("weights", sha)?;
                    }
                    if weights.values().all(|&w| w == 0) {
                        return Err(invalid("weights", "at least one weight must be positive"));
                    }
                }
                Self::set_rule(&mut self.canaries, model, split, "canaries")?;
            }
            Command::SetFallback { model, chain } => {
                check_name("model", model)?;
                let fallback = (!chain.is_empty()).then_some(chain);
                if fallback.is_some() {
                    if chain.len() > limits::MAX_LIST {
                        return Err(CommandError::Limit("fallback chain entries"));
                    }
                    for m in chain {
                        check_name("chain", m)?;
                        if m == model {
                            return Err(invalid("chain", "a model cannot fall back to itself"));
                        }
                    }
                }
                Self::set_rule(&mut self.fallbacks, model, fallback, "fallbacks")?;
            }
            Command::PinPool { model, pool } => {
                check_name("model", model)?;
                Self::set_rule(&mut self.pool_pins, model, pool.as_ref(), "pool pins")?;
            }
            Command::CreateKey(key) => {
                check_name("key_id", &key.key_id)?;
                check_secret_hash(&key.secret_sha256)?;
                check_name("project", &key.project)?;
                if self.keys.contains_key(&key.key_id) {
                    return Err(CommandError::Exists(format!("key {}", key.key_id)));
                }
                if self.keys.len() >= limits::MAX_KEYS {
                    return Err(CommandError::Limit("keys"));
                }
                if !self.projects.contains_key(&key.project) {
                    return Err(CommandError::NotFound(format!("project {}", key.project)));
                }
                check_regions(&key.regions)?;
                self.keys.insert(key.key_id.clone(), key.clone());
            }
            Command::EnsureKey(key) => {
                let Some(existing) = self.keys.get_mut(&key.key_id) else {
                    return self.apply_inner(&Command::CreateKey(key.clone()));
                };
                check_secret_hash(&key.secret_sha256)?;
                check_regions(&key.regions)?;
                if existing.project != key.project {
                    let why = format!("key {} bills to project {}; revoke it first", key.key_id, existing.project);
                    return Err(invalid("project", why));
                }
                existing.secret_sha256.clone_from(&key.secret_sha256);
                existing.regions.clone_from(&key.regions);
            }
            Command::RevokeKey { key_id } => {
                self.keys.remove(key_id).ok_or_else(|| CommandError::NotFound(format!("key {key_id}")))?;
            }
            Command::SetKeyRegions { key_id, regions } => {
                check_regions(regions)?;
                let key = self.keys.get_mut(key_id).ok_or_else(|| CommandError::NotFound(format!("key {key_id}")))?;
                key.regions = regions.clone();
            }
            Command::SetProject { name, quota } => {
                check_name("name", name)?;
                if !self.projects.contains_key(name) && self.projects.len() >= limits::MAX_PROJECTS {
                    return Err(CommandError::Limit("projects"));
                }
                self.projects.insert(name.clone(), *quota);
            }
            Command::SetBillingWeights(w) => {
                if !w.is_valid() {
                    return Err(invalid("billing weights", "each must be finite and in [0, 1]"));
                }
                self.billing_weights = *w;
            }
            Command::SetPoolThresholds(t) => {
                let ok =
                    t.gpu.is_finite() && t.hybrid.is_finite() && 0.0 <= t.hybrid && t.hybrid <= t.gpu && t.gpu <= 1.0;
                if !ok {
                    return Err(invalid("pool thresholds", "need 0 <= hybrid <= gpu <= 1"));
                }
                self.pool_thresholds = *t;
            }
            Command::SetBudget { project, budget } => {
                self.project_exists(project)?;
                if budget.is_some_and(|b| b.limit == 0) {
                    return Err(invalid("budget", "the limit must be at least 1 (clear the budget instead)"));
                }
                self.ledger.set_budget(project, *budget);
            }
            Command::SetCacheGroup { project, group } => {
                self.project_exists(project)?;
                match group {
                    Some(g) => {
                        check_name("cache group", g)?;
                        self.cache_groups.insert(project.clone(), g.clone());
                    }
                    None => {
                        self.cache_groups.remove(project);
                    }
                }
            }
            Command::SetPriority { project, class } => {
                self.project_exists(project)?;
                if *class > 2 {
                    return Err(invalid("class", "0 (high), 1 (normal) or 2 (low)"));
                }
                self.ledger.priority.insert(project.clone(), *class);
            }
            Command::SetDataKey { project, key } => {
                self.project_exists(project)?;
                check_name("key_id", &key.key_id)?;
                check_sha("key", &key.key)?;
                self.ledger.set_data_key(project, key.clone());
            }
            Command::ShredDataKey { project } => {
                self.ledger
                    .shred(project)
                    .ok_or_else(|| CommandError::NotFound(format!("data key of project {project}")))?;
            }
            Command::Admin { by, at_ms, command } => {
                if matches!(**command, Command::Admin { .. } | Command::AdminRead { .. }) {
                    return Err(invalid("command", "an admin command wraps one plain command"));
                }
                check_name("by", by)?;
                self.apply_inner(command)?;
                let entry = AdminEntry {
                    at_ms: *at_ms,
                    by: by.clone(),
                    action: command.kind().to_owned(),
                    subject: command.subject(),
                };
                self.admin_log.record(entry);
            }
            Command::AdminRead { by, at_ms, what } => {
                check_name("by", by)?;
                let entry = AdminEntry {
                    at_ms: *at_ms,
                    by: by.clone(),
                    action: format!("read:{what}"),
                    subject: String::new(),
                };
                self.admin_log.record(entry);
            }
            Command::ResetAuditHead { frontend, at_ms } => {
                if !self.ledger.reset_head(frontend, *at_ms) {
                    return Err(CommandError::NotFound(format!("an audit head of frontend {frontend}")));
                }
            }
            Command::AddAdapter(spec) => {
                let taken = self.index.by_model.contains_key(&spec.name) || self.aliases.contains_key(&spec.name);
                self.adapters.add(spec, taken)?;
            }
            Command::RemoveAdapter { name } => self.adapters.remove(name)?,
            Command::Enroll(e) => {
                // Registered, reporting, or ever run here: a bootstrap credential cannot take over its id.
                let taken = self.enrolled.seen(&e.role, &e.node_id)
                    || match e.role.as_str() {
                        "worker" => self.workers.keys().any(|w| w.as_str() == e.node_id),
                        _ => {
                            self.ledger.heads.contains_key(&e.node_id)
                                || self.ledger.report_seqs.contains_key(&e.node_id)
                        }
                    };
                self.enrolled.apply(e, taken)?;
            }
            Command::BindMember { raft_id, node_id } => {
                check_name("node_id", node_id)?;
                if *raft_id == 0 {
                    return Err(invalid("raft_id", "Raft ids start at 1"));
                }
                if let Some(bound) = self.members.get(raft_id).filter(|b| *b != node_id) {
                    return Err(CommandError::Exists(format!("Raft id {raft_id} (it is orchestrator {bound})")));
                }
                if let Some((other, _)) = self.members.iter().find(|(id, n)| *n == node_id && **id != *raft_id) {
                    return Err(CommandError::Exists(format!("orchestrator {node_id} (it is Raft id {other})")));
                }
                if !self.members.contains_key(raft_id) && self.members.len() >= limits::MAX_MEMBERS {
                    return Err(CommandError::Limit("Raft members"));
                }
                self.members.insert(*raft_id, node_id.clone());
            }
            Command::ForgetNode { role, node_id } => {
                if !matches!(role.as_str(), "worker" | "frontend") {
                    return Err(invalid("role", format!("{role:?}: only workers and frontends enroll")));
                }
                if role == "worker" && self.workers.keys().any(|w| w.as_str() == node_id) {
                    return Err(invalid("node_id", format!("worker {node_id} is registered: stop or drain it first")));
                }
                self.enrolled.forget(role, node_id)?;
                if role == "frontend" {
                    // Its next report counts from 1 again.
                    self.ledger.report_seqs.remove(node_id);
                }
            }
            Command::FrontendReport { frontend, now_ms, report } => {
                check_name("frontend", frontend)?;
                self.ledger.report(frontend, *now_ms, report);
                self.enrolled.saw("frontend", frontend, self.applied_index);
            }
            Command::StoreResponse { project, id, stored, bounds, now_ms } => {
                self.responses.put(project, id, stored.clone(), *bounds, *now_ms).map_err(|e| invalid("body", e))?;
            }
            Command::DeleteResponse { project, id, now_ms } => {
                if !self.responses.delete(project, id, *now_ms) {
                    return Err(CommandError::NotFound(format!("response {id}")));
                }
            }
        }
        Ok(())
    }

    /// The stored Responses API responses.
    pub fn responses(&self) -> &responses::Responses {
        &self.responses
    }

    fn project_exists(&self, project: &str) -> Result<(), CommandError> {
        match self.projects.contains_key(project) {
            true => Ok(()),
            false => Err(CommandError::NotFound(format!("project {project}"))),
        }
    }

    /// Set (within the rule limit) or clear (`None`) a per-model rule.
    fn set_rule<V: Clone>(
        map: &mut BTreeMap<String, V>,
        model: &str,
        value: Option<&V>,
        what: &'static str,
    ) -> Result<(), CommandError> {
        match value {
            None => {
                map.remove(model);
            }
            Some(v) => {
                Self::room(map, model, what)?;
                map.insert(model.to_owned(), v.clone());
            }
        }
        Ok(())
    }

    fn room<V>(map: &BTreeMap<String, V>, key: &str, what: &'static str) -> Result<(), CommandError> {
        if !map.contains_key(key) && map.len() >= limits::MAX_MODEL_RULES {
            return Err(CommandError::Limit(what));
        }
        Ok(())
    }

    fn check_spec(spec: &WorkerSpec) -> Result<(), CommandError> {
        if spec.endpoint.is_empty() || spec.endpoint.len() > 255 || !spec.endpoint.contains(':') {
            return Err(invalid("endpoint", "must be host:port"));
        }
        if spec.models.is_empty() || spec.models.len() > limits::MAX_LIST {
            return Err(invalid("models", format!("a worker serves 1 to {} models", limits::MAX_LIST)));
        }
        for m in &spec.models {
            check_name("model id", &m.id)?;
            check_sha("weights_sha256", &m.weights_sha256)?;
            if m.context_length == 0 {
                return Err(invalid("context_length", "must be at least 1"));
            }
        }
        if spec.kv_block_size == 0 || spec.max_running_sequences == 0 {
            return Err(invalid("kv_block_size/max_running_sequences", "must be at least 1"));
        }
        Ok(())
    }

    fn rebuild_index(&mut self) {
        let workers: Vec<WorkerEntry> = self.workers.values().cloned().collect();
        let mut by_model: HashMap<String, Vec<(usize, usize)>> = HashMap::new();
        for (wi, w) in workers.iter().enumerate() {
            for (mi, m) in w.spec.models.iter().enumerate() {
                by_model.entry(m.id.clone()).or_default().push((wi, mi));
            }
        }
        let id_hashes = workers.iter().map(|w| crate::hash::stable_hash(w.spec.id.as_str())).collect();
        self.index = RouteIndex { generation: crate::load::next_generation(), workers, id_hashes, by_model };
    }

    fn rebuild_key_index(&mut self) {
        self.keys_by_secret = self.keys.values().map(|k| (k.secret_sha256.clone(), k.key_id.clone())).collect();
    }

    /// The state as bytes: canonical (sorted maps), so equal states give equal snapshots.
    pub fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("the routing state always serializes")
    }

    /// Rebuild a state from [`RoutingState::snapshot`] bytes.
    pub fn restore(bytes: &[u8]) -> Result<RoutingState, serde_json::Error> {
        let mut state: RoutingState = serde_json::from_slice(bytes)?;
        state.ledger.recount();
        state.rebuild_index();
        state.rebuild_key_index();
        Ok(state)
    }

    /// Log position of the last applied command.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// Registered workers, by id.
    pub fn workers(&self) -> &BTreeMap<NodeId, WorkerEntry> {
        &self.workers
    }

    /// The orchestrator each Raft member bound itself to, by Raft id.
    pub fn members(&self) -> &BTreeMap<u64, String> {
        &self.members
    }

    /// Every model a worker has registered (whether or not one serves it now), by id.
    pub fn known_models(&self) -> &BTreeMap<String, ModelVersion> {
        &self.known_models
    }

    /// The decision index.
    pub fn index(&self) -> &RouteIndex {
        &self.index
    }

    /// A model name after alias resolution (a served model id wins over an alias of the same name); a name that
    /// is no alias resolves to itself.
    pub fn resolve_alias<'a>(&'a self, name: &'a str) -> &'a str {
        let mut at = name;
        for _ in 0..limits::MAX_ALIAS_DEPTH {
            match self.aliases.get(at) {
                Some(next) if !self.index.by_model.contains_key(at) => at = next,
                _ => break,
            }
        }
        at
    }

    /// The aliases.
    pub fn aliases(&self) -> &BTreeMap<String, String> {
        &self.aliases
    }

    /// The version a model is pinned to.
    pub fn pin(&self, model: &str) -> Option<&str> {
        self.pins.get(model).map(String::as_str)
    }

    /// A model's canary split.
    pub fn canary(&self, model: &str) -> Option<&BTreeMap<String, u32>> {
        self.canaries.get(model)
    }

    /// A model's fallback chain.
    pub fn fallback(&self, model: &str) -> &[String] {
        self.fallbacks.get(model).map_or(&[], Vec::as_slice)
    }

    /// The pool a model is pinned to.
    pub fn pool_pin(&self, model: &str) -> Option<ComputePool> {
        self.pool_pins.get(model).copied()
    }

    /// API keys by id.
    pub fn keys(&self) -> &BTreeMap<String, ApiKey> {
        &self.keys
    }

    /// Projects and their quotas.
    pub fn projects(&self) -> &BTreeMap<String, Quota> {
        &self.projects
    }

    /// Operators' actions, oldest first.
    pub fn admin_log(&self) -> &AdminLog {
        &self.admin_log
    }

    /// The cache group a project is in, if an admin put it in one.
    pub fn cache_group(&self, project: &str) -> Option<&str> {
        self.cache_groups.get(project).map(String::as_str)
    }

    /// The key whose secret this is. The lookup is by the secret's SHA-256, so its timing depends on the hash,
    /// which reveals nothing usable about the secret; the stored hash is then compared in constant time.
    pub fn verify_key(&self, secret: &str) -> Option<&ApiKey> {
        self.keys.get(zl_common::keys::verify_secret(&self.keys_by_secret, secret)?)
    }

    /// Billing weights.
    pub fn billing_weights(&self) -> &BillingWeights {
        &self.billing_weights
    }

    /// Pool thresholds.
    pub fn pool_thresholds(&self) -> &PoolThresholds {
        &self.pool_thresholds
    }

    /// Usage, budgets, audit heads, data keys and priority classes.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The nodes that enrolled.
    pub fn enrolled(&self) -> &Enrolled {
        &self.enrolled
    }

    /// The registered LoRA adapters.
    pub fn adapters(&self) -> &Adapters {
        &self.adapters
    }
}

pub use zl_common::keys::{hex, secret_sha256};

#[cfg(test)]
pub(crate) mod tests;
