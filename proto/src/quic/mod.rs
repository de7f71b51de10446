//! The QUIC shell: quinn endpoints with mutual TLS that carry one call per bidirectional stream.
//!
//! A thin async driver around the sans-IO parts (`frame`, `message`, `call`): it moves bytes and enforces
//! timeouts, and leaves every protocol decision to them. Flow control and backpressure are QUIC's: a slow reader
//! holds its writer back through stream credit, and nothing here buffers more than one frame per stream.

mod client;
mod handshake;
mod io;
mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use zl_tls::TlsError;
use zl_wire::frame::HARD_MAX_PAYLOAD;
use zl_wire::message::{ErrorCode, NodeId, Role, WireError};

pub use client::{Client, ResponseStream};
pub use server::{CallContext, Handler, Responder, Server};

/// Protocol major version: peers with different majors refuse each other.
pub const PROTOCOL_MAJOR: u16 = 1;
/// Protocol minor version: raised when optional fields are added.
pub const PROTOCOL_MINOR: u16 = 13;

/// Timeouts and limits of an RPC endpoint. Defaults suit a cluster inside one region or across nearby regions.
#[derive(Clone, Debug)]
pub struct RpcSettings {
    /// Largest frame payload accepted or sent (clamped to 16 MiB). Default 16 MiB: a long prompt fits.
    pub max_payload: u32,
    /// QUIC keep-alive ping interval. Default 5 s: keeps NAT and load-balancer state alive and notices a dead
    /// peer well within the idle timeout.
    pub keep_alive: Duration,
    /// A connection with no traffic (keep-alives included) for this long is dead. Default 15 s.
    pub idle_timeout: Duration,
    /// Limit on establishing a connection, handshake included. Default 5 s.
    pub connect_timeout: Duration,
    /// How long a server waits for the request frame after a stream opens. Default 10 s.
    pub request_timeout: Duration,
    /// Concurrent calls a peer may have open on one connection. Default 4096: a worker streams hundreds of
    /// sequences to one frontend at once.
    pub max_concurrent_calls: u32,
    /// Per-stream receive window in bytes. Default 1 MiB: a token stream never needs more in flight, and a stuck
    /// reader pins at most this much per call.
    pub stream_window: u32,
    /// Roles a server accepts calls from. Default: all.
    pub allowed_roles: Vec<Role>,
}

impl Default for RpcSettings {
    fn default() -> Self {
        RpcSettings {
            max_payload: HARD_MAX_PAYLOAD,
            keep_alive: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            max_concurrent_calls: 4096,
            stream_window: 1024 * 1024,
            allowed_roles: Role::ALL.to_vec(),
        }
    }
}

impl RpcSettings {
    fn transport(&self) -> Result<quinn::TransportConfig, RpcError> {
        let mut t = quinn::TransportConfig::default();
        let idle = quinn::IdleTimeout::try_from(self.idle_timeout)
            .map_err(|_| RpcError::Config(format!("idle timeout {:?} is too large", self.idle_timeout)))?;
        t.max_idle_timeout(Some(idle))
            .keep_alive_interval(Some(self.keep_alive))
            .max_concurrent_bidi_streams(quinn::VarInt::from_u32(self.max_concurrent_calls))
            .max_concurrent_uni_streams(quinn::VarInt::from_u32(0))
            .stream_receive_window(quinn::VarInt::from_u32(self.stream_window))
            .receive_window(quinn::VarInt::from_u32(self.stream_window.saturating_mul(64)));
        Ok(t)
    }
}

/// Failure to set up an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// TLS material or configuration problem.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Socket problem.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// Invalid settings.
    #[error("invalid RPC settings: {0}")]
    Config(String),
}

/// Why a call failed, as its caller sees it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// No connection to the peer could be made (unreachable, refused, TLS or handshake failure).
    #[error("cannot connect to {peer}: {reason}")]
    Connect {
        /// The peer address.
        peer: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The peer answered with a typed error.
    #[error("peer error {0}")]
    Remote(WireError),
    /// The call was cancelled: locally, by the peer, or by shutdown.
    #[error("call cancelled: {0}")]
    Cancelled(String),
    /// A frame was malformed or out of order; the stream was abandoned.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The connection died during the call.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The request could not be encoded (fails checks or is too large).
    #[error("request refused before sending: {0}")]
    Encode(String),
}

/// Whether a connection failed in TLS (a certificate or protocol alert, raised by either end), not by timing out,
/// being reset or being abandoned. QUIC carries TLS alerts as the crypto error codes 0x100 to 0x1ff.
pub(crate) fn is_tls_failure(e: &quinn::ConnectionError) -> bool {
    let crypto = |code: quinn_proto::TransportErrorCode| (0x100..0x200).contains(&u64::from(code));
    match e {
        quinn::ConnectionError::TransportError(t) => crypto(t.code),
        quinn::ConnectionError::ConnectionClosed(c) => crypto(c.error_code),
        _ => false,
    }
}

impl CallError {
    /// The error code to report upstream for this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            CallError::Connect { .. } | CallError::ConnectionLost(_) => ErrorCode::Unavailable,
            CallError::Remote(e) => e.code,
            CallError::Cancelled(_) => ErrorCode::Cancelled,
            CallError::Protocol(_) => ErrorCode::ProtocolViolation,
            CallError::Encode(_) => ErrorCode::InvalidRequest,
        }
    }

    /// No answer from `what` before the caller's deadline.
    pub fn deadline_exceeded(what: &str) -> Self {
        CallError::Remote(WireError::new(ErrorCode::DeadlineExceeded, format!("no answer from the {what} in time")))
    }

    /// True when nothing reached the peer's handler, so retrying elsewhere cannot run the request twice.
    pub fn is_before_request(&self) -> bool {
        matches!(self, CallError::Connect { .. })
    }
}

/// Who is on the other end of a connection, as proven by its certificate and handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's tier.
    pub role: Role,
    /// The peer's node id.
    pub node_id: NodeId,
    /// The peer's UDP address.
    pub addr: SocketAddr,
    /// The peer's protocol minor version.
    pub protocol_minor: u16,
}

/// A cancellation signal shared between a call's driver and its handler.
#[derive(Clone, Debug, Default)]
pub struct Cancellation {
    inner: Arc<(AtomicBool, Notify)>,
}

impl Cancellation {
    /// A signal not yet raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raise the signal; wakes every waiter.
    pub fn cancel(&self) {
        self.inner.0.store(true, Ordering::SeqCst);
        self.inner.1.notify_waiters();
    }

    /// True once raised.
    pub fn is_cancelled(&self) -> bool {
        self.inner.0.load(Ordering::SeqCst)
    }

    /// Resolves once the signal is raised.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.inner.1.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// Bind a UDP socket for a client endpoint: dual-stack where the host allows, IPv4 otherwise.
fn client_socket() -> std::io::Result<std::net::UdpSocket> {
    std::net::UdpSocket::bind(SocketAddr::from(([0u16; 8], 0)))
        .or_else(|_| std::net::UdpSocket::bind(SocketAddr::from(([0u8; 4], 0))))
}

/// Endpoint settings whose secrets survive a restart: a restarted node recognises the connection ids its previous
/// process issued (same id key) and answers packets on those dead connections with a valid stateless reset (same
/// reset key), so peers drop them at once instead of waiting out the idle timeout.
fn endpoint_config(identity: &zl_tls::TlsIdentity) -> quinn::EndpointConfig {
    let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &identity.derived_secret(b"stateless reset"));
    let cid_secret = identity.derived_secret(b"connection id");
    let mut cid_key = [0u8; 8];
    cid_key.copy_from_slice(&cid_secret[..8]);
    let cid_key = u64::from_le_bytes(cid_key);
    let mut config = quinn::EndpointConfig::new(Arc::new(reset_key));
    config.cid_generator(move || Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key)));
    config
}

fn quinn_runtime() -> Arc<dyn quinn::Runtime> {
    Arc::new(quinn::TokioRuntime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cancellation_wakes_waiters_and_late_waiters() {
        let c = Cancellation::new();
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.cancelled().await }
        });
        tokio::task::yield_now().await;
        c.cancel();
        waiter.await.unwrap();
        c.cancelled().await;
        assert!(c.is_cancelled());
    }

    #[test]
    fn default_settings_build_a_transport() {
        RpcSettings::default().transport().unwrap();
        let bad = RpcSettings { idle_timeout: Duration::from_secs(u64::MAX / 2), ..Default::default() };
        assert!(bad.transport().is_err());
    }
}
