//! The worker tier: runs models with candle and streams tokens to frontends over the wire protocol (see
//! docs/architecture.md).
//!
//! Today it holds the worker's place in the wire protocol; the engine arrives with issue 2/6.

use zl_proto::message::Role;
use zl_proto::quic::RpcSettings;

/// The role workers present in their certificates and handshakes.
pub const ROLE: Role = Role::Worker;

/// RPC settings for a worker's QUIC endpoint: frontends stream generations, orchestrators probe it, operators
/// inspect it. Workers never call each other.
pub fn rpc_settings() -> RpcSettings {
    RpcSettings { allowed_roles: vec![Role::Frontend, Role::Orchestrator, Role::Admin], ..RpcSettings::default() }
}
