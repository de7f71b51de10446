//! zerolayer's RPC shell: the wire protocol (`zl-wire`'s frames and messages) over QUIC streams with mutual TLS
//! (`zl-tls`'s node identities).
//!
//! - [`quic`]: the async shell on quinn that pumps `zl_wire`'s sans-IO frames and call state machine: server with
//!   a handler trait, pooled client, cancellation.
//!
//! The crate owns transport, and nothing else: no message layout (zl-wire), no certificates (zl-tls), no routing,
//! model or HTTP logic.

pub mod quic;

pub use quic::{CallContext, CallError, Client, Handler, PeerInfo, Responder, ResponseStream, RpcSettings, Server};
