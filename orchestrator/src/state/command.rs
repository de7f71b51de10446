//! The commands that change the routing state (what the Raft log holds, one JSON value per entry: its rules are in
//! `schemas/README.md`, "The Raft log"), why one is rejected, and the field checks every command shares.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use zl_common::billing::BillingWeights;
use zl_wire::message::{ComputePool, NodeId};

use super::limits;
use super::{ApiKey, PoolThresholds, Quota, WorkerSpec};
use crate::ledger::{BudgetSpec, DataKey, ReportEntry};

/// An enrollment or renewal, as the Raft log holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollEntry {
    /// `worker` or `frontend`.
    pub role: String,
    /// The node id.
    pub node_id: String,
    /// SHA-256 (hex) of the certified public key.
    pub key_sha256: String,
    /// The new certificate's expiry (Unix ms).
    pub not_after_ms: u64,
    /// Unix ms at the proposer.
    pub at_ms: u64,
    /// A renewal by the node's own certificate (else a first enrollment by a bootstrap credential).
    pub renewal: bool,
}

/// One registered adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterSpec {
    /// Its name, as clients ask for it (no `:`, which separates `BASE:NAME`).
    pub name: String,
    /// The model id it applies to.
    pub base: String,
    /// Where workers read it: a PEFT directory or a GGUF adapter file, relative to their adapter root or absolute
    /// inside it.
    pub path: String,
    /// SHA-256 (lowercase hex) of its weights file.
    pub sha256: String,
    /// The project that owns it; empty: every project may use it.
    #[serde(default)]
    pub project: String,
    /// Usable by every project although owned by one.
    #[serde(default)]
    pub shared: bool,
}

impl AdapterSpec {
    /// Whether `project` may use it.
    pub fn visible_to(&self, project: &str) -> bool {
        self.project.is_empty() || self.shared || self.project == project
    }
}

/// A change to the routing state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Add a worker, or replace its registration (a restarted worker registers again).
    RegisterWorker(WorkerSpec),
    /// Remove a worker.
    DeregisterWorker {
        /// The worker.
        id: NodeId,
    },
    /// Start or stop draining a worker.
    SetDrain {
        /// The worker.
        id: NodeId,
        /// Draining or not.
        draining: bool,
        /// With `draining`: its running requests are handed over too (migrated), not left to finish there.
        #[serde(default)]
        migrate: bool,
    },
    /// Point an alias at a model id or another alias; `None` removes it.
    SetAlias {
        /// The alias clients use.
        alias: String,
        /// What it resolves to.
        target: Option<String>,
    },
    /// Serve a model only at one version; `None` unpins.
    PinVersion {
        /// Model id.
        model: String,
        /// Weights SHA-256, lowercase hex.
        weights_sha256: Option<String>,
    },
    /// Split a model's traffic between versions by weight; empty clears.
    SetCanary {
        /// Model id.
        model: String,
        /// Weights SHA-256 (hex) to relative weight.
        weights: BTreeMap<String, u32>,
    },
    /// Models to try, in order, when a model has no capacity; empty clears.
    SetFallback {
        /// Model id.
        model: String,
        /// Fallback model ids or aliases.
        chain: Vec<String>,
    },
    /// Serve a model only from one pool; `None` unpins.
    PinPool {
        /// Model id.
        model: String,
        /// The pool.
        pool: Option<ComputePool>,
    },
    /// Add an API key.
    CreateKey(ApiKey),
    /// Create a key, or bring an existing one of the same project to this secret (rotating it) and these regions.
    EnsureKey(ApiKey),
    /// Remove an API key.
    RevokeKey {
        /// Its id.
        key_id: String,
    },
    /// Bind a key to regions (data residency); an empty list unbinds it.
    SetKeyRegions {
        /// Its id.
        key_id: String,
        /// The regions whose frontends may serve it.
        regions: Vec<String>,
    },
    /// Create or update a project and its quota.
    SetProject {
        /// Project name.
        name: String,
        /// Its limits.
        quota: Quota,
    },
    /// Change the billing-unit weights.
    SetBillingWeights(BillingWeights),
    /// Change the compute-pool thresholds.
    SetPoolThresholds(PoolThresholds),
    /// Set or clear (`None`) a project's budget.
    SetBudget {
        /// Project.
        project: String,
        /// The budget.
        budget: Option<BudgetSpec>,
    },
    /// Put a project in a cache group (`Some`), whose projects share the response cache and KV prefixes, or keep
    /// its caches to itself (`None`, the default).
    SetCacheGroup {
        /// Project.
        project: String,
        /// The group.
        group: Option<String>,
    },
    /// Set a project's priority class under degradation: 0 high, 1 normal, 2 low.
    SetPriority {
        /// Project.
        project: String,
        /// Class.
        class: u8,
    },
    /// Turn content logging on for a project, or rotate its data key (generated by the proposer).
    SetDataKey {
        /// Project.
        project: String,
        /// The key.
        key: DataKey,
    },
    /// Crypto-shred a project's content: forget its data key (content logging is off afterwards).
    ShredDataKey {
        /// Project.
        project: String,
    },
    /// An operator's write: `command`, made by the admin certificate `by` at `at_ms` (the proposer's clock);
    /// applied as `command` and recorded in the admin log.
    Admin {
        /// The admin certificate's node id.
        by: String,
        /// Unix ms at the proposer.
        at_ms: u64,
        /// What the operator asked for (never another `Admin`).
        command: Box<Command>,
    },
    /// An operator's read of secrets (`GetState`, `GetDataKeys`), recorded before it is answered.
    AdminRead {
        /// The admin certificate's node id.
        by: String,
        /// Unix ms at the proposer.
        at_ms: u64,
        /// What was read, e.g. `state` or `data_keys:acme`.
        what: String,
    },
    /// An operator's reset of a frontend's audit head (its chain was lost and a new one may start); `at_ms` is the
    /// proposer's clock. The old heads stay in the frontend's history.
    ResetAuditHead {
        /// The frontend.
        frontend: String,
        /// Unix ms at the proposer.
        at_ms: u64,
    },
    /// A node enrolled for a certificate of its own, or renewed it (`state/enrolled.rs`).
    Enroll(EnrollEntry),
    /// Forget a node's enrollment and that it ever ran, so a pod that lost its identity volume may enroll its id
    /// again (`zl admin forget-node`): the operator vouches that the old node is gone.
    ForgetNode {
        /// `worker` or `frontend`.
        role: String,
        /// The node id.
        node_id: String,
    },
    /// Raft member `raft_id` is orchestrator `node_id` (its certificate's name): proposed by that member itself
    /// once it votes, so peers can check that each Raft message comes from the member it names.
    BindMember {
        /// The Raft id.
        raft_id: u64,
        /// The orchestrator's node id.
        node_id: String,
    },
    /// Register a LoRA adapter (`zl admin adapters add`).
    AddAdapter(AdapterSpec),
    /// Remove a LoRA adapter.
    RemoveAdapter {
        /// Its name.
        name: String,
    },
    /// A frontend's report: usage, budget leases, audit head; `now_ms` is the proposer's clock.
    FrontendReport {
        /// The frontend (from its certificate).
        frontend: String,
        /// Unix ms at the proposer.
        now_ms: u64,
        /// The report, in the ledger's own persisted form (`ledger/report.rs`).
        report: ReportEntry,
    },
    /// Store a Responses API response for a project (`state/responses.rs`); the bounds and `now_ms` are the
    /// proposer's, so every replica evicts alike.
    StoreResponse {
        /// The project.
        project: String,
        /// The response id.
        id: String,
        /// The response.
        stored: super::responses::Stored,
        /// The project's bounds.
        bounds: super::responses::Bounds,
        /// Unix ms at the proposer.
        now_ms: u64,
    },
    /// Forget a project's stored response.
    DeleteResponse {
        /// The project.
        project: String,
        /// The response id.
        id: String,
        /// Unix ms at the proposer.
        now_ms: u64,
    },
}

impl Command {
    /// The one thing a command names, for the admin log (empty when none or many).
    pub fn subject(&self) -> String {
        match self {
            Command::RegisterWorker(spec) => spec.id.to_string(),
            Command::DeregisterWorker { id } | Command::SetDrain { id, .. } => id.to_string(),
            Command::SetAlias { alias, .. } => alias.clone(),
            Command::PinVersion { model, .. }
            | Command::SetCanary { model, .. }
            | Command::SetFallback { model, .. }
            | Command::PinPool { model, .. } => model.clone(),
            Command::CreateKey(k) | Command::EnsureKey(k) => k.key_id.clone(),
            Command::RevokeKey { key_id } | Command::SetKeyRegions { key_id, .. } => key_id.clone(),
            Command::SetProject { name, .. } => name.clone(),
            Command::SetBudget { project, .. }
            | Command::SetPriority { project, .. }
            | Command::SetCacheGroup { project, .. }
            | Command::SetDataKey { project, .. }
            | Command::ShredDataKey { project } => project.clone(),
            Command::ResetAuditHead { frontend, .. } | Command::FrontendReport { frontend, .. } => frontend.clone(),
            Command::StoreResponse { project, id, .. } | Command::DeleteResponse { project, id, .. } => {
                format!("{project}/{id}")
            }
            Command::Enroll(e) => format!("{}/{}", e.role, e.node_id),
            Command::ForgetNode { role, node_id } => format!("{role}/{node_id}"),
            Command::BindMember { raft_id, node_id } => format!("{raft_id}/{node_id}"),
            Command::AddAdapter(a) => a.name.clone(),
            Command::RemoveAdapter { name } => name.clone(),
            Command::Admin { command, .. } => command.subject(),
            Command::SetBillingWeights(_) | Command::SetPoolThresholds(_) | Command::AdminRead { .. } => String::new(),
        }
    }

    /// Short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::RegisterWorker(_) => "register_worker",
            Command::DeregisterWorker { .. } => "deregister_worker",
            Command::SetDrain { .. } => "set_drain",
            Command::SetAlias { .. } => "set_alias",
            Command::PinVersion { .. } => "pin_version",
            Command::SetCanary { .. } => "set_canary",
            Command::SetFallback { .. } => "set_fallback",
            Command::PinPool { .. } => "pin_pool",
            Command::CreateKey(_) => "create_key",
            Command::RevokeKey { .. } => "revoke_key",
            Command::EnsureKey(_) => "ensure_key",
            Command::SetKeyRegions { .. } => "set_key_regions",
            Command::SetProject { .. } => "set_project",
            Command::SetBillingWeights(_) => "set_billing_weights",
            Command::SetPoolThresholds(_) => "set_pool_thresholds",
            Command::SetBudget { .. } => "set_budget",
            Command::SetPriority { .. } => "set_priority",
            Command::SetCacheGroup { .. } => "set_cache_group",
            Command::SetDataKey { .. } => "set_data_key",
            Command::ShredDataKey { .. } => "shred_data_key",
            Command::FrontendReport { .. } => "frontend_report",
            Command::ResetAuditHead { .. } => "reset_audit_head",
            Command::Enroll(_) => "enroll",
            Command::ForgetNode { .. } => "forget_node",
            Command::BindMember { .. } => "bind_member",
            Command::AddAdapter(_) => "add_adapter",
            Command::RemoveAdapter { .. } => "remove_adapter",
            Command::Admin { command, .. } => command.kind(),
            Command::AdminRead { .. } => "admin_read",
            Command::StoreResponse { .. } => "store_response",
            Command::DeleteResponse { .. } => "delete_response",
        }
    }
}

/// Why a command was rejected. Deterministic: every node rejects the same command the same way.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// A named thing does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// A field is out of range or malformed.
    #[error("invalid {field}: {problem}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A limit in [`limits`] would be exceeded.
    #[error("limit reached: {0}")]
    Limit(&'static str),
    /// The thing already exists.
    #[error("{0} already exists")]
    Exists(String),
}

pub(super) fn invalid(field: &'static str, problem: impl Into<String>) -> CommandError {
    CommandError::Invalid { field, problem: problem.into() }
}

pub(super) fn check_name(field: &'static str, name: &str) -> Result<(), CommandError> {
    if name.is_empty() || name.len() > limits::MAX_NAME || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(invalid(field, format!("{name:?} must be 1 to {} printable bytes", limits::MAX_NAME)));
    }
    Ok(())
}

pub(super) fn check_regions(regions: &[String]) -> Result<(), CommandError> {
    match zl_common::region::regions_problem(regions) {
        Some(problem) => Err(invalid("regions", problem)),
        None => Ok(()),
    }
}

pub(super) fn check_secret_hash(hash: &str) -> Result<(), CommandError> {
    if !zl_common::keys::is_secret_hash(hash) {
        return Err(invalid("secret_sha256", "must be 64 lowercase hex digits or hmac-sha256:ID:HEX"));
    }
    Ok(())
}

pub(super) fn check_sha(field: &'static str, sha: &str) -> Result<(), CommandError> {
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(invalid(field, "must be 64 lowercase hex digits"));
    }
    Ok(())
}
