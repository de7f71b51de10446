//! The frontend tier: the HTTP edge (Anthropic Messages and OpenAI APIs) that authenticates, rate-limits, asks an
//! orchestrator for a route and streams tokens straight from the chosen worker (see docs/architecture.md).
//!
//! Today it holds the frontend's place in the wire protocol; the HTTP server arrives with issue 4/6.

use zl_proto::message::Role;

/// The role frontends present in their certificates and handshakes.
pub const ROLE: Role = Role::Frontend;
