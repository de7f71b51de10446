//! The server loop: HTTP/1.1 and h2c on plain TCP, HTTP/2 and HTTP/1.1 over TLS with ALPN, graceful draining of
//! open streams on shutdown, and the edge's deadlines and connection caps, overall and per client ([`EdgeLimits`]),
//! so that slow, idle or greedy clients cannot hold connections and tasks for ever.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpStream;

/// Deadlines and caps of the public HTTP edge (docs/operations.md, "Hostile and oversized requests").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeLimits {
    /// A connection's first bytes, each HTTP/1 request's head (request line and headers), and an idle keep-alive
    /// connection's next request must arrive within this; HTTP/2 peers must answer a ping within it. Default 10 s:
    /// real clients send a head in one round trip; a slowloris trickling one header at a time is cut off.
    pub header_timeout: Duration,
    /// A request's body must arrive within this once its head did (408 otherwise). Default 60 s: 32 MiB at about
    /// 4 Mbit/s.
    pub body_timeout: Duration,
    /// Connections served at once; more wait in the kernel's accept queue until one closes. Default 4,096.
    pub max_connections: usize,
    /// Connections one client (an address; an IPv6 /64) may hold at once; more are closed as they arrive
    /// (0: no cap). Default 256: far above what an SDK's pool opens, far below `max_connections`, so one client
    /// cannot take every slot. Behind a proxy that hides client addresses, raise it or set 0.
    pub max_connections_per_client: usize,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_connections_per_client: 256,
        }
    }
}

/// HTTP/2's connection preface: a plain connection that starts with it speaks h2c.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Wait until a plain connection has sent enough to tell HTTP/1 from h2c (hyper's version detection has no timer
/// of its own); false when the peer closed first.
async fn version_readable(stream: &TcpStream) -> std::io::Result<bool> {
    let mut buf = [0u8; 24];
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Ok(false);
        }
        if n >= H2_PREFACE.len() || buf[..n] != H2_PREFACE[..n] {
            return Ok(true);
        }
        // Part of the preface: wait for the rest.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// TLS for the public listener: a certificate chain and key (PEM files, read again when they change: a renewed
/// certificate is served on new connections with no restart), ALPN h2 then http/1.1.
pub fn tls_config(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use zl_tls::reload::{CertSource, Expect};
    let source = CertSource::watching(cert, key, Expect::Any)
        .map_err(|e| anyhow::anyhow!("--tls-cert/--tls-key ({}): {e}", cert.display()))?;
    let mut config = rustls::ServerConfig::builder().with_no_client_auth().with_cert_resolver(Arc::new(source));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serve `router` on `listener` until `shutdown` resolves, then stop accepting, let open requests and streams
/// finish for up to `drain`, and return. `edge` bounds what a client may hold.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
    edge: EdgeLimits,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(edge.max_connections.max(1)));
    let clients = super::per_client::ClientSlots::new(edge.max_connections_per_client);
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(edge.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(edge.header_timeout))
        .keep_alive_timeout(edge.header_timeout);
    tokio::pin!(shutdown);
    loop {
        // At the cap, stop accepting: new connections wait in the kernel's queue, not in this process.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // A client at its own cap is turned away at once: it keeps no slot of anyone else's waiting.
        let Some(client) = clients.take(peer.ip()) else {
            metrics::counter!("zl_frontend_edge_refused_total", "reason" => "per_client").increment(1);
            tracing::debug!(%peer, "connection refused: this client holds its cap of connections");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _slots = (slot, client);
            let result = match acceptor {
                None => {
                    match tokio::time::timeout(edge.header_timeout, version_readable(&stream)).await {
                        Ok(Ok(true)) => {}
                        Ok(Ok(false)) | Ok(Err(_)) => return,
                        Err(_) => {
                            metrics::counter!("zl_frontend_edge_timeouts_total", "phase" => "first_bytes").increment(1);
                            return tracing::debug!(%peer, "no request within the header deadline");
                        }
                    }
                    watcher
                        .watch(builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned())
                        .await
                }
                Some(acceptor) => {
                    let tls = match tokio::time::timeout(edge.header_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => {
                            metrics::counter!("zl_frontend_edge_timeouts_total", "phase" => "tls").increment(1);
                            return tracing::debug!(%peer, "TLS handshake timed out");
                        }
                    };
                    // ALPN decided the protocol: no version sniffing (which has no deadline of its own).
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                    let builder = if h2 { builder.http2_only() } else { builder.http1_only() };
                    watcher.watch(builder.serve_connection_with_upgrades(TokioIo::new(tls), service).into_owned()).await
                }
            };
            if let Err(e) = result {
                if e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout) {
                    metrics::counter!("zl_frontend_edge_timeouts_total", "phase" => "header").increment(1);
                }
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!("draining open connections");
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!(?drain, "connections still open after the drain timeout; closing them");
    }
}
