//! The frontend tier: the HTTP edge (Anthropic Messages and OpenAI Chat Completions APIs) that authenticates,
//! rate-limits, checks the context, answers repeats from the deterministic response cache, asks an orchestrator
//! for a route and streams tokens straight from the chosen worker (see docs/architecture.md and docs/api.md).
//!
//! Layers, outermost first: [`http`] (router, headers, the generation handler, SSE, server), [`anthropic`] and
//! [`openai`] (each API's request rules and response shapes, each a [`dialect::Dialect`] the handler is written
//! over), [`request`] (the field rules both parsers share), [`gateway`] (one request's path, API-independent),
//! [`cluster`] (cached routing state and model cards), [`upstream`] (the tiers behind, over QUIC), and the pure
//! parts: [`limits`], [`cache`], [`sanitize`], [`error`], [`ids`].

pub mod anthropic;
pub mod cache;
pub mod cluster;
pub mod dialect;
pub mod error;
pub mod gateway;
pub mod http;
pub mod ids;
pub mod limits;
pub mod openai;
pub mod request;
pub mod sanitize;
pub mod upstream;

use zl_proto::message::Role;
use zl_proto::quic::RpcSettings;

/// The role frontends present in their certificates and handshakes.
pub const ROLE: Role = Role::Frontend;

/// RPC settings of a frontend's client: nothing calls a frontend over QUIC.
pub fn rpc_settings() -> RpcSettings {
    RpcSettings::default()
}
