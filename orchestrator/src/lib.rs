//! The orchestrator tier: routing state and microsecond route decisions (see docs/routing.md). It is never on the
//! token path: the frontend asks it for a route, then streams from the worker directly.
//!
//! From the bottom up (no module imports one above it; `scripts/check-house` keeps it so):
//! - [`hash`]: the stable hashes every node computes alike;
//! - [`load`]: the soft load view (load reports, KV-cache events), never replicated;
//! - [`ledger`]: the replicated ledger (usage, budgets and their leases, shared rate-limit buckets, audit heads,
//!   content data keys, priority classes), part of the state;
//! - [`state`]: the replicated routing state, a deterministic command-driven state machine;
//! - [`route`]: route decisions as pure functions over both, with pluggable policies;
//! - [`enroll`]: who may get a node certificate, and the signing;
//! - [`raft`]: the Raft group that replicates the state (storage, the pure replica, the async driver, and its
//!   transport and peer service outside the loop);
//! - [`orchestrator`]: one orchestrator: the state with its group, the load view and the policy;
//! - [`stored`]: its stored Responses API responses, as frontends store and read them;
//! - [`api`]: its QUIC face (frontends, workers) and its gRPC admin face (operators).

pub mod api;
pub mod enroll;
pub mod hash;
pub mod ledger;
pub mod load;
pub mod orchestrator;
pub mod raft;
pub mod route;
pub mod state;
pub mod stored;

use zl_proto::quic::RpcSettings;
use zl_wire::message::Role;

/// The role orchestrators present in their certificates and handshakes.
pub const ROLE: Role = Role::Orchestrator;

/// RPC settings for an orchestrator's QUIC endpoint: frontends ask for routes, workers register and report load,
/// operators administer, and peers forward writes.
pub fn rpc_settings() -> RpcSettings {
    RpcSettings {
        // Bootstrap credentials only ever get as far as a certificate request (api/quic.rs).
        allowed_roles: vec![Role::Frontend, Role::Worker, Role::Orchestrator, Role::Admin, Role::Bootstrap],
        ..RpcSettings::default()
    }
}
