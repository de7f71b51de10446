//! The frontend tier: the HTTP edge (Anthropic Messages and OpenAI Chat Completions APIs) that authenticates,
//! rate-limits, checks the context, answers repeats from the deterministic response cache, asks an orchestrator
//! for a route and streams tokens straight from the chosen worker (see docs/architecture.md and docs/api.md).
//!
//! Layers, outermost first: [`http`] (router, headers, the generation handler, SSE, server), [`anthropic`] and
//! [`openai`] (each API's request rules and response shapes, each a [`dialect::Dialect`] the handler is written
//! over), [`request`] (the field rules both parsers share), [`gateway`] (one request's path, API-independent),
//! [`cluster`] (cached routing state and model cards), [`upstream`] (the tiers behind, over QUIC), and the pure
//! parts: [`limits`], [`cache`], [`sanitize`], [`suspects`], [`error`], [`ids`].

pub mod anthropic;
pub mod audit;
pub mod cache;
pub mod cluster;
pub mod dialect;
pub mod error;
pub mod gateway;
pub mod health;
pub mod http;
pub mod ids;
pub mod ledger;
pub mod limits;
pub mod openai;
pub mod regions;
pub mod report;
pub mod request;
pub mod sanitize;
pub mod suspects;
pub mod tools;
pub mod upstream;

use zl_proto::quic::RpcSettings;
use zl_wire::message::Role;

/// The role frontends present in their certificates and handshakes.
pub const ROLE: Role = Role::Frontend;

/// RPC settings of a frontend's client (nothing calls a frontend over QUIC). Its connections to workers and
/// orchestrators ping every 400 ms and are declared dead after 1.5 s without a packet (QUIC takes the smaller of
/// the two ends' idle timeouts), so a killed or frozen worker costs its streams 1.5 s, not 15; connecting gives up
/// after 1 s (peers are in the same region; a handshake takes milliseconds). See docs/operations.md, "Fault
/// detection".
pub fn rpc_settings() -> RpcSettings {
    RpcSettings {
        keep_alive: std::time::Duration::from_millis(400),
        idle_timeout: std::time::Duration::from_millis(1500),
        connect_timeout: std::time::Duration::from_secs(1),
        ..RpcSettings::default()
    }
}
