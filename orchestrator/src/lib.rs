//! The orchestrator tier: Raft-replicated routing state and microsecond route decisions (see
//! docs/architecture.md). It is never on the token path.
//!
//! Today it holds the orchestrator's place in the wire protocol; routing arrives with issue 3/6.

use zl_proto::message::Role;
use zl_proto::quic::RpcSettings;

/// The role orchestrators present in their certificates and handshakes.
pub const ROLE: Role = Role::Orchestrator;

/// RPC settings for an orchestrator's QUIC endpoint: frontends ask for routes, workers register and report load,
/// operators administer, and peers forward writes.
pub fn rpc_settings() -> RpcSettings {
    RpcSettings {
        allowed_roles: vec![Role::Frontend, Role::Worker, Role::Orchestrator, Role::Admin],
        ..RpcSettings::default()
    }
}
