//! zerolayer's wire protocol: FlatBuffers frames over QUIC streams with mutual TLS.
//!
//! Layers, from the bytes up:
//! - [`frame`]: sans-IO framing (8-byte header + one FlatBuffers table), size limits, incremental decoding.
//! - [`message`]: verified decoding into owned, checked Rust types, and checked encoding.
//! - [`call`]: the sans-IO life cycle of one call (open, streaming, finished, cancelled, failed).
//! - [`tls`]: the cluster CA, node certificates and rustls configurations.
//! - [`quic`]: the async shell on quinn: server with a handler trait, pooled client, cancellation.
//!
//! The crate owns framing, verification and transport, and nothing else: no routing, model or HTTP logic.

pub mod call;
pub mod frame;
pub mod message;
pub mod quic;
pub mod tls;

#[allow(
    unsafe_code,
    missing_docs,
    unreachable_pub,
    unused_imports,
    dead_code,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    deprecated,
    mismatched_lifetime_syntaxes,
    rust_2018_idioms,
    clippy::all,
    clippy::unwrap_used
)]
#[rustfmt::skip]
#[path = "generated/zerolayer_generated.rs"]
mod generated;

pub use call::{CallPhase, CallShape, CallState};
pub use frame::{FrameDecoder, FrameError, FrameKind, HARD_MAX_PAYLOAD, RawFrame};
pub use message::{Encoder, Message, MessageError};
pub use quic::{CallContext, CallError, Client, Handler, PeerInfo, Responder, ResponseStream, RpcSettings, Server};
pub use tls::{ClusterCa, TlsIdentity};
