//! One HTTP/1.1 client connection to `host:port`, plain or over TLS: what the tiers' own HTTP clients share (the
//! Consul client, a frontend forwarding a request to a peer region, `zl bench`). The connection task runs until
//! the sender and every response body are dropped.

use anyhow::{Context, Result, anyhow};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// The host part of `host:port` (brackets of an IPv6 literal removed), for SNI and certificate names.
pub fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_matches(['[', ']'])
}

/// Connect to `addr` (`host:port`) and shake hands: TLS with `tls` when given (the server's name is `addr`'s host),
/// then HTTP/1.1.
pub async fn connect(addr: &str, tls: Option<&tokio_rustls::TlsConnector>) -> Result<SendRequest<Full<Bytes>>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    let _ = tcp.set_nodelay(true);
    match tls {
        None => handshake(tcp).await,
        Some(tls) => {
            let name =
                rustls_pki_types::ServerName::try_from(host_of(addr).to_owned()).map_err(|e| anyhow!("{addr}: {e}"))?;
            let stream = tls.connect(name, tcp).await.with_context(|| format!("TLS with {addr}"))?;
            handshake(stream).await
        }
    }
}

async fn handshake<S>(io: S) -> Result<SendRequest<Full<Bytes>>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(io)).await.context("the HTTP/1.1 handshake")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        assert_eq!(host_of("consul.service:8500"), "consul.service");
        assert_eq!(host_of("[::1]:8443"), "::1");
        assert_eq!(host_of("bare"), "bare");
    }
}
