//! The server loop: HTTP/1.1 and h2c on plain TCP, HTTP/2 and HTTP/1.1 over TLS with ALPN, graceful draining of
//! open streams on shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;

/// TLS for the public listener: a certificate chain and key (PEM files), ALPN h2 then http/1.1.
pub fn tls_config(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let (certs, key) = zl_node::pem::chain_and_key(cert, key)?;
    let mut config = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serve `router` on `listener` until `shutdown` resolves, then stop accepting, let open requests and streams
/// finish for up to `drain`, and return.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(shutdown);
    loop {
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
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let builder = Builder::new(TokioExecutor::new());
        match &acceptor {
            None => {
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                    };
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service).into_owned();
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
        }
    }
    drop(listener);
    tracing::info!("draining open connections");
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!(?drain, "connections still open after the drain timeout; closing them");
    }
}
