//! The admin endpoint's TLS, served by our own acceptor so that the orchestrator's certificate follows its files
//! (`zl_tls::reload`): tonic's own TLS loads one certificate at start. Connections reach tonic as
//! `tokio_rustls` streams, so handlers see the client's certificate exactly as with tonic's TLS
//! ([`crate::require_role`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::Stream;
use rustls_pki_types::pem::PemObject;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use zl_tls::NodeFiles;
use zl_tls::reload::{CertSource, Expect};
use zl_wire::message::{NodeId, Role};

/// A TLS handshake longer than this is dropped (it holds no slot of the others: each runs in its own task).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections handshaken but not yet taken by the server.
const BACKLOG: usize = 64;

/// TLS for orchestrator `node_id`'s admin endpoint from the files in `dir`: its certificate (read again when the
/// files change), client certificates from the cluster CA required, HTTP/2.
pub fn server_config(dir: &Path, node_id: &str) -> Result<Arc<rustls::ServerConfig>> {
    let files = NodeFiles::new(dir, Role::Orchestrator, node_id);
    let ca = std::fs::read(&files.ca).with_context(|| format!("reading {}", files.ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.context("the cluster CA certificate")?).context("the cluster CA certificate")?;
    }
    let id = NodeId::new(node_id.to_owned()).map_err(|e| anyhow::anyhow!("--node-id: {e}"))?;
    let roots = Arc::new(roots);
    let source = CertSource::watching(&files.cert, &files.key, Expect::Node(Role::Orchestrator, id, roots.clone()))
        .with_context(|| format!("loading {}", files.cert.display()))?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, zl_tls::provider())
        .build()
        .context("the client certificate verifier")?;
    let mut config = rustls::ServerConfig::builder_with_provider(zl_tls::provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(source));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// TLS connections accepted on `listener` with `config`, for `serve_with_incoming`.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> impl Stream<Item = std::io::Result<TlsStream<TcpStream>>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(BACKLOG);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(_) => {
                    // Out of descriptors and the like: try again shortly rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (acceptor, to_server) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = to_server.send(tls).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "admin TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "admin TLS handshake timed out"),
                }
            });
            if tx.is_closed() {
                return;
            }
        }
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|tls| (Ok(tls), rx)) })
}
