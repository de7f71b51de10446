//! RPC server: accepts QUIC connections, runs the handshake, and dispatches each incoming bidirectional stream to
//! a `Handler`, watching for cancellation while the handler runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::io::{FrameReader, FrameWriter, ReadFailure, WriteFailure, codes};
use super::{CallError, Cancellation, PeerInfo, RpcError, RpcSettings, endpoint_config, handshake, quinn_runtime};
use zl_tls::TlsIdentity;
use zl_wire::call::{CallPhase, CallState};
use zl_wire::message::{ErrorCode, Message, WireError};

/// Serves calls. One `call` runs per incoming stream; it must send the call's responses through `responder` and
/// return. Returning `Err` sends that error as the call's terminal frame. When the caller cancels, the `call`
/// future is dropped at once and `ctx.cancellation()` is raised for any work it spawned.
pub trait Handler: Send + Sync + 'static {
    /// Handle one call.
    fn call(
        &self,
        ctx: CallContext,
        request: Message,
        responder: &mut Responder,
    ) -> impl Future<Output = Result<(), WireError>> + Send;
}

/// What a handler knows about its call.
#[derive(Clone, Debug)]
pub struct CallContext {
    /// The authenticated caller.
    pub peer: PeerInfo,
    cancellation: Cancellation,
}

impl CallContext {
    /// Raised when the caller cancels or the server shuts down.
    pub fn cancellation(&self) -> &Cancellation {
        &self.cancellation
    }
}

/// Sends a call's responses, checking each against the call's life cycle before it goes out.
pub struct Responder {
    writer: FrameWriter,
    state: CallState,
}

impl Responder {
    /// Send one response frame. Fails if the frame is not allowed now (e.g. after the terminal frame) or the
    /// stream is gone; waits while the caller's flow-control window is full.
    pub async fn send(&mut self, msg: Message) -> Result<(), CallError> {
        let before = self.state.clone();
        self.state.on_response(msg.kind()).map_err(|e| CallError::Protocol(e.to_string()))?;
        match self.writer.write(&msg).await {
            Ok(()) => Ok(()),
            Err(WriteFailure::Encode(e)) => {
                // Nothing went out: the call is where it was, so an `Error` frame can still end it (a handler's
                // invalid terminal frame must not leave the caller with a stream that just stops).
                self.state = before;
                Err(CallError::Encode(e.to_string()))
            }
            Err(WriteFailure::Write(quinn::WriteError::Stopped(_))) => {
                Err(CallError::Cancelled("caller stopped reading".into()))
            }
            Err(WriteFailure::Write(e)) => Err(CallError::ConnectionLost(e.to_string())),
        }
    }

    /// True once a terminal frame was sent.
    pub fn is_done(&self) -> bool {
        self.state.is_done()
    }
}

/// A running RPC server.
pub struct Server {
    endpoint: quinn::Endpoint,
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Bind `addr` and serve `handler` on the current tokio runtime.
    pub fn spawn<H: Handler>(
        addr: SocketAddr,
        identity: &TlsIdentity,
        settings: RpcSettings,
        handler: Arc<H>,
    ) -> Result<Server, RpcError> {
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(identity.server_config()?)
            .map_err(|e| RpcError::Config(e.to_string()))?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(Arc::new(settings.transport()?));
        let socket = std::net::UdpSocket::bind(addr)?;
        let endpoint = quinn::Endpoint::new(endpoint_config(identity), Some(config), socket, quinn_runtime())?;
        let local_addr = endpoint.local_addr()?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let ctx = Arc::new(ServerCtx { identity: identity.clone(), settings, handler, shutdown: shutdown_rx });
        let accept_task = tokio::spawn(accept_loop(endpoint.clone(), ctx).instrument(tracing::info_span!(
            "rpc.server",
            %local_addr
        )));
        Ok(Server { endpoint, local_addr, shutdown, accept_task })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stop accepting connections and calls, give running calls up to `grace` to finish, then cancel the rest and
    /// close every connection.
    pub async fn shutdown(self, grace: Duration) {
        self.endpoint.set_server_config(None);
        let _ = self.shutdown.send(true);
        let _ = tokio::time::timeout(grace, self.accept_task).await;
        self.endpoint.close(codes::CLOSE_NORMAL, b"server shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
    }
}

struct ServerCtx<H> {
    identity: TlsIdentity,
    settings: RpcSettings,
    handler: Arc<H>,
    shutdown: watch::Receiver<bool>,
}

async fn accept_loop<H: Handler>(endpoint: quinn::Endpoint, ctx: Arc<ServerCtx<H>>) {
    let mut connections = JoinSet::new();
    let mut shutdown = ctx.shutdown.clone();
    loop {
        tokio::select! {
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let ctx = ctx.clone();
                let remote = incoming.remote_address();
                connections.spawn(
                    serve_connection(incoming, ctx).instrument(tracing::debug_span!("rpc.conn", %remote)),
                );
            }
            _ = shutdown.wait_for(|s| *s) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Wait for connections to finish their running calls; `Server::shutdown` bounds this with its grace period.
    while connections.join_next().await.is_some() {}
}

async fn serve_connection<H: Handler>(incoming: quinn::Incoming, ctx: Arc<ServerCtx<H>>) {
    let settings = &ctx.settings;
    let conn = match tokio::time::timeout(settings.connect_timeout, incoming).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            // A TLS failure is a peer without a valid certificate; anything else (the client gave up or went away
            // mid-handshake, as one that retried before this server listened does) is not.
            let result = if super::is_tls_failure(&e) { "tls_failed" } else { "abandoned" };
            metrics::counter!("zl_rpc_connections_total", "side" => "server", "result" => result).increment(1);
            tracing::info!(error = %e, result, "a connection did not complete");
            return;
        }
        Err(_) => return,
    };
    let peer = match tokio::time::timeout(settings.connect_timeout, handshake::server(&conn, &ctx.identity, settings))
        .await
        .unwrap_or_else(|_| Err("handshake timed out".into()))
    {
        Ok(peer) => peer,
        Err(reason) => {
            metrics::counter!("zl_rpc_connections_total", "side" => "server", "result" => "handshake_refused")
                .increment(1);
            tracing::info!(%reason, "refused a peer");
            // Give the client a moment to read our Error frame before the close overtakes it.
            tokio::time::sleep(Duration::from_millis(50)).await;
            conn.close(codes::CLOSE_HANDSHAKE, reason.as_bytes());
            return;
        }
    };
    metrics::counter!("zl_rpc_connections_total", "side" => "server", "result" => "ok").increment(1);
    tracing::debug!(role = %peer.role, node = %peer.node_id, "peer connected");
    let mut calls = JoinSet::new();
    let mut shutdown = ctx.shutdown.clone();
    loop {
        tokio::select! {
            stream = conn.accept_bi() => match stream {
                Ok((send, recv)) => {
                    let ctx = ctx.clone();
                    let peer = peer.clone();
                    calls.spawn(serve_call(send, recv, peer, ctx));
                }
                Err(_) => break,
            },
            _ = shutdown.wait_for(|s| *s) => break,
            Some(_) = calls.join_next(), if !calls.is_empty() => {}
        }
    }
    while calls.join_next().await.is_some() {}
}

/// Why the caller-side watcher ended a call.
enum Interrupt {
    Cancelled(String),
    Violation(String),
}

async fn serve_call<H: Handler>(
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    peer: PeerInfo,
    ctx: Arc<ServerCtx<H>>,
) {
    let settings = &ctx.settings;
    let mut reader = FrameReader::new(recv, settings.max_payload);
    let mut writer = FrameWriter::new(send, settings.max_payload);
    let request = match tokio::time::timeout(settings.request_timeout, reader.next_message()).await {
        Ok(Ok(Some(msg))) => msg,
        Ok(Ok(None)) => return,
        Ok(Err(ReadFailure::Reset(_) | ReadFailure::Connection(_))) => return,
        Ok(Err(e)) => return refuse(&mut writer, &mut reader, ErrorCode::ProtocolViolation, e.to_string()).await,
        Err(_) => {
            return refuse(&mut writer, &mut reader, ErrorCode::DeadlineExceeded, "no request frame".into()).await;
        }
    };
    let kind = request.kind();
    let state = match CallState::open(kind) {
        Ok(state) if kind != zl_wire::frame::FrameKind::Handshake => state,
        _ => {
            let msg = format!("a {kind} frame cannot open a call");
            return refuse(&mut writer, &mut reader, ErrorCode::ProtocolViolation, msg).await;
        }
    };
    let span = tracing::debug_span!("rpc.call", kind = %kind, peer = %peer.node_id);
    let cancellation = Cancellation::new();
    let call_ctx = CallContext { peer, cancellation: cancellation.clone() };
    let stopped = writer.stopped();
    let mut responder = Responder { writer, state };
    let interrupt = {
        let handler = ctx.handler.call(call_ctx, request, &mut responder).instrument(span.clone());
        let watcher = watch_caller(&mut reader, stopped);
        tokio::pin!(handler);
        tokio::select! {
            biased;
            why = watcher => {
                // Raise the signal while the handler still exists, so work it spawned sees it before it is dropped.
                cancellation.cancel();
                Err(why)
            }
            result = &mut handler => Ok(result),
        }
    };
    let outcome = match interrupt {
        Ok(result) => finish_call(&mut responder, result).await,
        Err(Interrupt::Cancelled(reason)) => {
            cancellation.cancel();
            responder.state.cancel();
            responder.writer.reset(codes::CANCELLED);
            span.in_scope(|| tracing::debug!(%reason, "call cancelled by caller"));
            "cancelled"
        }
        Err(Interrupt::Violation(reason)) => {
            cancellation.cancel();
            responder.writer.reset(codes::PROTOCOL);
            reader.stop(codes::PROTOCOL);
            span.in_scope(|| tracing::info!(%reason, "caller broke the protocol"));
            "protocol_error"
        }
    };
    metrics::counter!("zl_rpc_calls_total", "side" => "server", "kind" => kind.name(), "outcome" => outcome)
        .increment(1);
}

/// Watch the caller's side of a running call: a `Cancel` frame, a stream reset, STOP_SENDING on our responses, or
/// a connection loss all cancel it; any other frame is a violation. A clean end of the request side (FIN) is fine.
async fn watch_caller(reader: &mut FrameReader, stopped: impl Future<Output = ()>) -> Interrupt {
    let request_side = async {
        match reader.next_message().await {
            Ok(Some(Message::Cancel(c))) => Interrupt::Cancelled(format!("cancel frame: {}", c.reason)),
            Ok(Some(other)) => Interrupt::Violation(format!("{} frame after the request", other.kind())),
            Ok(None) => std::future::pending().await,
            Err(ReadFailure::Reset(code)) => Interrupt::Cancelled(format!("stream reset (code {code})")),
            Err(ReadFailure::Connection(e)) => Interrupt::Cancelled(format!("connection lost: {e}")),
            Err(e) => Interrupt::Violation(e.to_string()),
        }
    };
    tokio::select! {
        why = request_side => why,
        () = stopped => Interrupt::Cancelled("caller stopped reading".into()),
    }
}

/// After the handler returned: make sure the call ended with a terminal frame, then FIN.
async fn finish_call(responder: &mut Responder, result: Result<(), WireError>) -> &'static str {
    let outcome = match result {
        Ok(()) if responder.state.phase() == CallPhase::Finished => "ok",
        Ok(()) if responder.state.is_done() => "error",
        Ok(()) => {
            let err = WireError::new(ErrorCode::Internal, "the handler ended the call without a reply");
            tracing::error!("handler returned without sending the terminal frame");
            let _ = responder.send(Message::Error(err)).await;
            "error"
        }
        Err(err) => {
            if !responder.state.is_done() {
                let _ = responder.send(Message::Error(err)).await;
            }
            "error"
        }
    };
    responder.writer.finish();
    outcome
}

async fn refuse(writer: &mut FrameWriter, reader: &mut FrameReader, code: ErrorCode, message: String) {
    metrics::counter!("zl_rpc_frames_refused_total", "code" => code.name()).increment(1);
    tracing::info!(%message, "refused a call");
    let _ = writer.write(&Message::Error(WireError::new(code, message))).await;
    writer.finish();
    reader.stop(codes::PROTOCOL);
}
