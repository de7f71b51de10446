//! zerolayer's RPC shell: the wire protocol (`zl-wire`'s frames and messages) over QUIC streams with mutual TLS.
//!
//! - [`tls`]: the cluster CA, node certificates and rustls configurations.
//! - [`quic`]: the async shell on quinn that pumps `zl_wire`'s sans-IO frames and call state machine: server with
//!   a handler trait, pooled client, cancellation.
//!
//! The crate owns transport and identity, and nothing else: no message layout (zl-wire), no routing, model or HTTP
//! logic.

pub mod quic;
pub mod tls;

pub use quic::{CallContext, CallError, Client, Handler, PeerInfo, Responder, ResponseStream, RpcSettings, Server};
pub use tls::{ClusterCa, TlsIdentity};
