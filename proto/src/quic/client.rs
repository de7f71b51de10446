//! RPC client: one pooled QUIC connection per (peer, role), one stream per call, unary and server-streaming calls,
//! cancellation by dropping the response stream, and reconnection after a peer restarts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zl_common::sync::lock;

use super::io::{FrameReader, FrameWriter, ReadFailure, WriteFailure, codes};
use super::{CallError, PeerInfo, RpcError, RpcSettings, client_socket, endpoint_config, handshake, quinn_runtime};
use zl_tls::{TlsIdentity, role_name};
use zl_wire::call::{CallState, Delivery};
use zl_wire::message::{Cancel, Message, Role};

#[derive(Clone)]
struct Pooled {
    conn: quinn::Connection,
    peer: PeerInfo,
}

type Slot = Arc<tokio::sync::Mutex<Option<Pooled>>>;

/// A client for calling other tiers. Cheap to share (`Arc`); connections are made on first use and kept.
pub struct Client {
    endpoint: quinn::Endpoint,
    identity: TlsIdentity,
    settings: RpcSettings,
    pool: Mutex<HashMap<(SocketAddr, Role), Slot>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("node_id", self.identity.node_id()).finish_non_exhaustive()
    }
}

impl Client {
    /// A client presenting `identity` to the peers it calls.
    pub fn new(identity: &TlsIdentity, settings: RpcSettings) -> Result<Client, RpcError> {
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(identity.client_config()?)
            .map_err(|e| RpcError::Config(e.to_string()))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(Arc::new(settings.transport()?));
        let endpoint_config = endpoint_config(identity);
        let mut endpoint = quinn::Endpoint::new(endpoint_config, None, client_socket()?, quinn_runtime())?;
        endpoint.set_default_client_config(config);
        Ok(Client { endpoint, identity: identity.clone(), settings, pool: Mutex::new(HashMap::new()) })
    }

    fn slot(&self, peer: SocketAddr, role: Role) -> Slot {
        let mut pool = lock(&self.pool);
        pool.entry((peer, role)).or_default().clone()
    }

    /// The pooled connection to `peer`, (re)connecting if there is none or it has died. Concurrent callers share
    /// one connection attempt.
    async fn connection(&self, peer: SocketAddr, role: Role) -> Result<Pooled, CallError> {
        let slot = self.slot(peer, role);
        let mut guard = slot.lock().await;
        if let Some(pooled) = guard.as_ref().filter(|p| p.conn.close_reason().is_none()) {
            return Ok(pooled.clone());
        }
        *guard = None;
        let pooled = self.connect(peer, role).await?;
        *guard = Some(pooled.clone());
        Ok(pooled)
    }

    async fn connect(&self, peer: SocketAddr, role: Role) -> Result<Pooled, CallError> {
        // The metric's result: `unreachable` (nothing answered: the peer is down or not listening yet, as at a
        // cluster's start), `tls_failed` (a certificate or TLS alert), `refused` (our handshake frame was refused),
        // `failed` (anything else).
        let fail = |label: &'static str, reason: String| (label, CallError::Connect { peer, reason });
        let attempt = async {
            // The connection outlives the call that opened it, and quinn's driver task takes the current span: it
            // is opened outside every span, so no request's span is held open (and exported late) by it.
            let connecting = tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
                self.endpoint.connect(peer, &role_name(role))
            })
            .map_err(|e| fail("failed", e.to_string()))?;
            let conn = connecting.await.map_err(|e| {
                let label = match &e {
                    quinn::ConnectionError::TimedOut | quinn::ConnectionError::Reset => "unreachable",
                    e if super::is_tls_failure(e) => "tls_failed",
                    _ => "failed",
                };
                fail(label, e.to_string())
            })?;
            match handshake::client(&conn, &self.identity, role, &self.settings).await {
                Ok(info) => Ok(Pooled { conn, peer: info }),
                Err(reason) => {
                    conn.close(codes::CLOSE_HANDSHAKE, b"handshake failed");
                    Err(fail("refused", reason))
                }
            }
        };
        let result = tokio::time::timeout(self.settings.connect_timeout, attempt).await.unwrap_or_else(|_| {
            Err(fail("unreachable", format!("no answer within {:?}", self.settings.connect_timeout)))
        });
        let label = match &result {
            Ok(_) => "ok",
            Err((label, _)) => label,
        };
        metrics::counter!("zl_rpc_connections_total", "side" => "client", "result" => label).increment(1);
        result.map_err(|(_, e)| e)
    }

    fn forget(&self, peer: SocketAddr, role: Role, conn: &quinn::Connection) {
        let slot = self.slot(peer, role);
        if let Ok(mut guard) = slot.try_lock()
            && guard.as_ref().is_some_and(|p| p.conn.stable_id() == conn.stable_id())
        {
            *guard = None;
        }
    }

    /// Start a call: open a stream on the pooled connection and send the request. A connection found dead when the
    /// stream is opened is replaced once; the request has not been sent then.
    pub async fn stream(&self, peer: SocketAddr, role: Role, request: Message) -> Result<ResponseStream, CallError> {
        let state = CallState::open(request.kind()).map_err(|e| CallError::Encode(e.to_string()))?;
        let mut last_err = None;
        for _ in 0..2 {
            let pooled = self.connection(peer, role).await?;
            let (send, recv) = match pooled.conn.open_bi().await {
                Ok(streams) => streams,
                Err(e) => {
                    self.forget(peer, role, &pooled.conn);
                    last_err = Some(CallError::Connect { peer, reason: e.to_string() });
                    continue;
                }
            };
            let mut writer = FrameWriter::new(send, self.settings.max_payload);
            match writer.write(&request).await {
                Ok(()) => {}
                Err(WriteFailure::Encode(e)) => return Err(CallError::Encode(e.to_string())),
                Err(WriteFailure::Write(e)) => {
                    self.forget(peer, role, &pooled.conn);
                    last_err = Some(CallError::Connect { peer, reason: e.to_string() });
                    continue;
                }
            }
            let reader = FrameReader::new(recv, self.settings.max_payload);
            return Ok(ResponseStream { writer, reader, state: state.clone(), peer: pooled.peer, peer_reset: false });
        }
        Err(last_err.unwrap_or_else(|| CallError::Connect { peer, reason: "no connection".into() }))
    }

    /// A unary call: one request, one reply. Retried once on a fresh connection when the peer answered with a
    /// stateless reset (it restarted and never saw the request).
    pub async fn call(&self, peer: SocketAddr, role: Role, request: Message) -> Result<Message, CallError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut stream = self.stream(peer, role, request.clone()).await?;
            match stream.next().await {
                Some(Ok(reply)) => {
                    // Read to the end so a trailing frame (a protocol violation) is noticed.
                    return match stream.next().await {
                        None => Ok(reply),
                        Some(Err(e)) => Err(e),
                        Some(Ok(extra)) => Err(CallError::Protocol(format!("extra {} frame", extra.kind()))),
                    };
                }
                Some(Err(e)) if stream.peer_reset && attempt < 2 => {
                    tracing::debug!(error = %e, %peer, "peer restarted; retrying on a new connection");
                }
                Some(Err(e)) => return Err(e),
                None => return Err(CallError::Protocol("stream ended without a reply".into())),
            }
        }
    }

    /// [`Client::call`] within `deadline`: past it the call is dropped (its stream reset) and the caller gets
    /// [`CallError::deadline_exceeded`], so one hung or unreachable peer never stalls a caller that has others.
    pub async fn call_within(
        &self,
        deadline: Duration,
        peer: SocketAddr,
        role: Role,
        request: Message,
    ) -> Result<Message, CallError> {
        tokio::time::timeout(deadline, self.call(peer, role, request))
            .await
            .unwrap_or_else(|_| Err(CallError::deadline_exceeded(role.name())))
    }

    /// Close every connection (pending calls fail with `ConnectionLost`).
    pub fn close(&self) {
        self.endpoint.close(codes::CLOSE_NORMAL, b"client closed");
    }
}

/// The responses of one call. Dropping it before the call ends cancels the call: the stream is reset and the
/// server's handler is stopped at once.
pub struct ResponseStream {
    writer: FrameWriter,
    reader: FrameReader,
    state: CallState,
    peer: PeerInfo,
    peer_reset: bool,
}

impl std::fmt::Debug for ResponseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStream").field("peer", &self.peer).field("phase", &self.state.phase()).finish()
    }
}

impl ResponseStream {
    /// The server answering this call.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// The next response: `Some(Ok(item or final message))`, `Some(Err(_))` once on failure (an `Error` frame
    /// becomes `CallError::Remote`), then `None` after the call ended.
    pub async fn next(&mut self) -> Option<Result<Message, CallError>> {
        if self.state.is_done() {
            return None;
        }
        let result = match self.reader.next_message().await {
            Ok(Some(msg)) => match self.state.on_response(msg.kind()) {
                Ok(Delivery::Item | Delivery::Last) => Ok(msg),
                Ok(Delivery::Error) => match msg {
                    Message::Error(e) => Err(CallError::Remote(e)),
                    other => Err(CallError::Protocol(format!("{} frame delivered as an error", other.kind()))),
                },
                Err(violation) => Err(CallError::Protocol(violation.to_string())),
            },
            Ok(None) => match self.state.on_end_of_responses() {
                Ok(()) => return None,
                Err(violation) => Err(CallError::Protocol(violation.to_string())),
            },
            Err(ReadFailure::Reset(code)) => {
                self.state.cancel();
                Err(CallError::Cancelled(format!("server reset the stream (code {code})")))
            }
            Err(ReadFailure::Connection(e)) => {
                self.peer_reset = matches!(e, quinn::ConnectionError::Reset) && self.state.frames() == 0;
                self.state.cancel();
                Err(CallError::ConnectionLost(e.to_string()))
            }
            Err(e) => Err(CallError::Protocol(e.to_string())),
        };
        if result.is_err() && !self.state.is_done() {
            self.state.cancel();
        }
        if let Err(CallError::Protocol(_)) = &result {
            self.abandon(codes::PROTOCOL);
        }
        if self.state.is_done() {
            self.writer.finish();
        }
        metrics_on_end(&self.state, &result);
        Some(result)
    }

    /// Cancel politely: send a `Cancel` frame with `reason`, then stop reading. The server stops its handler.
    pub async fn cancel(mut self, reason: &str) {
        if self.state.cancel() {
            let _ = self.writer.write(&Message::Cancel(Cancel { reason: reason.to_owned() })).await;
            self.writer.finish();
            self.reader.stop(codes::CANCELLED);
        }
    }

    fn abandon(&mut self, code: quinn::VarInt) {
        self.writer.reset(code);
        self.reader.stop(code);
    }
}

fn metrics_on_end(state: &CallState, result: &Result<Message, CallError>) {
    if !state.is_done() {
        return;
    }
    let outcome = match result {
        Ok(_) => "ok",
        Err(CallError::Remote(_)) => "error",
        Err(CallError::Cancelled(_)) => "cancelled",
        Err(CallError::ConnectionLost(_)) => "connection_lost",
        Err(_) => "protocol_error",
    };
    metrics::counter!("zl_rpc_calls_total", "side" => "client", "kind" => state.request().name(), "outcome" => outcome)
        .increment(1);
}

impl Drop for ResponseStream {
    fn drop(&mut self) {
        if !self.state.is_done() {
            self.state.cancel();
            self.abandon(codes::CANCELLED);
            metrics::counter!("zl_rpc_calls_total", "side" => "client", "kind" => self.state.request().name(), "outcome" => "dropped")
                .increment(1);
        }
    }
}
