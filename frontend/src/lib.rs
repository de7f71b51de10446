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
pub mod completions;
pub mod dialect;
pub mod embeddings;
pub mod error;
pub mod events;
pub mod gateway;
pub mod health;
pub mod http;
pub mod ids;
pub mod ledger;
pub mod limits;
pub mod logprobs;
pub mod openai;
pub mod regions;
pub mod report;
pub mod request;
pub mod responses;
pub mod sanitize;
pub mod suspects;
pub mod thinking;
pub mod tools;

/// The tiers behind the frontend (zl-client's, shared with `zl bench`).
pub use zl_client::upstream;

use zl_wire::message::Role;

/// The role frontends present in their certificates and handshakes.
pub const ROLE: Role = Role::Frontend;

/// RPC settings of a frontend's client (nothing calls a frontend over QUIC): zl-client's, which say why.
pub use zl_client::rpc_settings;
