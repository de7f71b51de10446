//! The worker tier: runs models and streams tokens to frontends over the wire protocol (see
//! docs/architecture.md and docs/worker.md).
//!
//! Pure parts: [`kv`] (paged KV-cache accounting with prefix sharing), [`scheduler`] (continuous batching),
//! [`sampling`] (seeded, batch-invariant token choice) and [`stop`] (stop sequences across token boundaries).
//! [`model`] loads weights (GGUF, safetensors) and runs the forward pass on the CPU kernels; [`engine`] is the
//! actor that owns a model, its KV cache and the scheduler and steps them; [`serve`] is the QUIC face;
//! [`adapters`] keeps the LoRA adapters requests name; [`registration`] registers with the orchestrators; [`fetch`] brings the bundled default model; [`speculate`] drafts
//! tokens for predictive streaming; [`eval`] measures quality (perplexity, the question set against the float path).

pub mod adapters;
pub mod consul_report;
pub mod device;
pub mod engine;
pub mod eval;
pub mod fetch;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod kv;
pub mod model;
pub mod ptx;
pub mod registration;
pub mod sampling;
pub mod scheduler;
pub mod serve;
pub mod speculate;
pub mod stop;

use zl_proto::quic::RpcSettings;
use zl_wire::message::Role;

/// The role workers present in their certificates and handshakes.
pub const ROLE: Role = Role::Worker;

/// RPC settings for a worker's QUIC endpoint: frontends stream generations, orchestrators probe it, operators
/// inspect it. Workers never call each other.
pub fn rpc_settings() -> RpcSettings {
    RpcSettings { allowed_roles: vec![Role::Frontend, Role::Orchestrator, Role::Admin], ..RpcSettings::default() }
}
