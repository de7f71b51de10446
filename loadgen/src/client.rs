//! The HTTP side of `zl bench`: one keep-alive HTTP/1.1 connection per client (plain or TLS with the system's roots
//! and an optional extra CA), one streamed request at a time, every content chunk timestamped as it is read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;

use crate::api::{Flavour, Said};
use crate::record::{Record, status_kind};
use crate::sse::Parser;
use crate::workload::Turn;

/// Where requests go.
#[derive(Clone)]
pub struct Endpoint {
    /// `host:port` to connect to.
    pub authority: String,
    /// Host name, for TLS and the `Host` header.
    pub host: String,
    /// The path of the request, after the base URL's.
    pub path: String,
    /// TLS settings where the URL is https.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The API flavour.
    pub flavour: Flavour,
    /// The API key.
    pub key: String,
    /// Per-request deadline.
    pub timeout: Duration,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("authority", &self.authority).field("path", &self.path).finish_non_exhaustive()
    }
}

/// Split `http(s)://host[:port][/path]`.
pub fn split_url(url: &str) -> Result<(bool, String, u16, String)> {
    let (tls, rest) = match url.split_once("://") {
        Some(("http", r)) => (false, r),
        Some(("https", r)) => (true, r),
        _ => bail!("--url {url:?}: expected http://HOST[:PORT][/PATH] or https://..."),
    };
    let (hostport, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && !p.contains(']') => {
            (h, p.parse().with_context(|| format!("--url {url:?}: bad port {p:?}"))?)
        }
        _ => (hostport, if tls { 443 } else { 80 }),
    };
    if host.is_empty() || host.starts_with(':') {
        bail!("--url {url:?}: no host");
    }
    Ok((tls, host.to_owned(), port, path.to_owned()))
}

/// TLS settings: the system's root certificates, plus `ca_file`'s.
pub fn tls_config(ca_file: Option<&std::path::Path>) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let mut added = 0;
        for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(&pem) {
            let cert: rustls_pki_types::CertificateDer<'static> =
                cert.with_context(|| format!("{}: not PEM certificates", path.display()))?;
            roots.add(cert).with_context(|| format!("{}: an unusable certificate", path.display()))?;
            added += 1;
        }
        if added == 0 {
            bail!("{}: no certificate in it", path.display());
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(zl_tls::provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client's connection, opened on first use and again after it closes.
#[derive(Default)]
pub struct Connection {
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    /// The connection, and whether it was kept alive from an earlier request (a fresh one is not).
    async fn ready(&mut self, ep: &Endpoint) -> Result<(&mut SendRequest<Full<Bytes>>, bool), String> {
        if let Some(s) = &mut self.sender
            && !s.is_closed()
            && s.ready().await.is_ok()
        {
            return self.sender.as_mut().map(|s| (s, true)).ok_or_else(String::new);
        }
        self.sender = None;
        let tls = ep.tls.clone().map(tokio_rustls::TlsConnector::from);
        let sender = zl_node::http_client::connect(&ep.authority, tls.as_ref()).await.map_err(|e| format!("{e:#}"))?;
        Ok((self.sender.insert(sender), false))
    }
}

/// Whether a failed send on a kept-alive connection never reached the server: hyper handed the request back
/// unsent, or the server had closed the connection (its keep-alive timeout) before any byte of an answer. Such a
/// request is sent again on a fresh connection, as browsers and curl do; on a fresh connection it is an error.
fn stale_keep_alive(e: &hyper::client::conn::TrySendError<hyper::Request<Full<Bytes>>>, reused: bool) -> bool {
    reused && (e.message().is_some() || e.error().is_canceled() || e.error().is_incomplete_message())
}

/// One request to send.
#[derive(Debug)]
pub struct Ask<'a> {
    /// Model id.
    pub model: &'a str,
    /// System prompt.
    pub system: Option<&'a str>,
    /// The messages, the last one the user's.
    pub messages: &'a [Turn],
    /// Output limit.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
}

fn header(resp: &hyper::Response<hyper::body::Incoming>, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty() && *v != "-").map(str::to_owned)
}

/// Send `ask` and stream its answer; the record (times relative to `t0`; its start is `due` where the request
/// was due earlier, as in an open loop, else now) and the answer's text.
pub async fn send(
    conn: &mut Connection,
    ep: &Endpoint,
    ask: &Ask<'_>,
    t0: Instant,
    due: Option<f64>,
) -> (Record, String) {
    let mut rec = Record { start_s: due.unwrap_or_else(|| t0.elapsed().as_secs_f64()), ..Record::default() };
    let mut answer = String::new();
    let outcome = tokio::time::timeout(ep.timeout, exchange(conn, ep, ask, t0, &mut rec, &mut answer)).await;
    let failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err((kind, message))) => Some((kind, message)),
        Err(_) => Some(("timeout".to_owned(), format!("no complete answer within {:?}", ep.timeout))),
    };
    if let Some((kind, message)) = failure {
        // A connection in an unknown state is not reused.
        conn.sender = None;
        rec.error = Some(kind);
        rec.error_message = Some(message);
    }
    rec.end_s = t0.elapsed().as_secs_f64();
    if rec.output_tokens == 0 {
        rec.output_tokens = rec.chunks_s.len() as u32;
    }
    (rec, answer)
}

type Failure = (String, String);

async fn exchange(
    conn: &mut Connection,
    ep: &Endpoint,
    ask: &Ask<'_>,
    t0: Instant,
    rec: &mut Record,
    answer: &mut String,
) -> Result<(), Failure> {
    let body =
        Bytes::from(ep.flavour.body(ask.model, ask.system, ask.messages, ask.max_tokens, ask.temperature).to_string());
    let request = || {
        let mut req = hyper::Request::post(&ep.path)
            .header("host", &ep.host)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream");
        for (name, value) in ep.flavour.headers(&ep.key) {
            req = req.header(name, value);
        }
        req.body(Full::new(body.clone())).map_err(|e| ("request".to_owned(), e.to_string()))
    };
    let resp = loop {
        let (sender, reused) = conn.ready(ep).await.map_err(|e| ("connect".to_owned(), e))?;
        match sender.try_send_request(request()?).await {
            Ok(resp) => break resp,
            Err(e) if stale_keep_alive(&e, reused) => {
                conn.sender = None;
                rec.resent += 1;
            }
            Err(e) => return Err(("connection".to_owned(), e.into_error().to_string())),
        }
    };
    rec.status = resp.status().as_u16();
    rec.request_id = header(&resp, "request-id").or_else(|| header(&resp, "x-request-id"));
    rec.worker = header(&resp, "x-zl-worker");
    rec.cache = header(&resp, "x-zl-cache");
    rec.route_ms = header(&resp, "x-zl-route-ms").and_then(|v| v.parse().ok());
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let mut text = Vec::new();
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                text.extend_from_slice(&data);
                if text.len() > 64 << 10 {
                    break;
                }
            }
        }
        let text = String::from_utf8_lossy(&text);
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| text.chars().take(300).collect());
        return Err((status_kind(status.as_u16()), message));
    }
    let mut parser = Parser::default();
    loop {
        let frame = match body.frame().await {
            None => return Err(("incomplete".to_owned(), "the stream ended before the answer was complete".into())),
            Some(Err(e)) => return Err(("connection".to_owned(), e.to_string())),
            Some(Ok(frame)) => frame,
        };
        let Ok(data) = frame.into_data() else { continue };
        let now = t0.elapsed().as_secs_f64();
        for event in parser.feed(&data).map_err(|e| ("protocol".to_owned(), e))? {
            match ep.flavour.read(event.name.as_deref(), &event.data) {
                Said::Start { input_tokens, id } => {
                    rec.input_tokens = input_tokens.or(rec.input_tokens);
                    rec.request_id = rec.request_id.take().or(id);
                }
                Said::Text(t) => {
                    rec.chunks_s.push(now);
                    answer.push_str(&t);
                }
                Said::Usage { input_tokens, output_tokens } => {
                    rec.input_tokens = input_tokens.or(rec.input_tokens);
                    if let Some(n) = output_tokens {
                        rec.output_tokens = n;
                    }
                }
                // (OpenAI's usage chunk comes after the last content and before [DONE].)
                Said::Stop => return Ok(()),
                Said::Error(e) => return Err(("stream_error".to_owned(), e)),
                Said::Other => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Read one request (head and content-length body); false if the peer closed first.
    async fn read_request(s: &mut TcpStream) -> bool {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + len {
                    return true;
                }
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    async fn answer(s: &mut TcpStream) {
        let body = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\
                    \"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n\
                    event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let head =
            format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body.as_bytes()).await.unwrap();
    }

    #[tokio::test]
    async fn a_request_on_a_connection_the_server_closed_is_sent_again_on_a_fresh_one() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ep = Endpoint {
            authority: listener.local_addr().unwrap().to_string(),
            host: "127.0.0.1".into(),
            path: "/v1/messages".into(),
            tls: None,
            flavour: Flavour::Anthropic,
            key: "k".into(),
            timeout: Duration::from_secs(10),
        };
        let server = tokio::spawn(async move {
            // The first connection answers once, then closes as the second request arrives (a keep-alive
            // timeout racing the client); the second answers; the third closes without answering.
            let (mut s, _) = listener.accept().await.unwrap();
            assert!(read_request(&mut s).await);
            answer(&mut s).await;
            assert!(read_request(&mut s).await);
            drop(s);
            let (mut s, _) = listener.accept().await.unwrap();
            assert!(read_request(&mut s).await);
            answer(&mut s).await;
            let (mut s, _) = listener.accept().await.unwrap();
            assert!(read_request(&mut s).await);
            drop(s);
        });
        let turns = [Turn { role: "user".into(), content: "x".into() }];
        let ask = Ask { model: "m", system: None, messages: &turns, max_tokens: 4, temperature: 0.0 };
        let (mut conn, t0) = (Connection::default(), Instant::now());
        let (first, text) = send(&mut conn, &ep, &ask, t0, None).await;
        assert!(first.ok() && first.resent == 0 && text == "hi", "{first:?}");
        let (second, text) = send(&mut conn, &ep, &ask, t0, None).await;
        assert!(second.ok() && text == "hi", "{second:?}");
        assert_eq!(second.resent, 1);
        // A fresh connection that closes unanswered is the server's failure: no second try.
        let (third, _) = send(&mut Connection::default(), &ep, &ask, t0, None).await;
        assert_eq!((third.error.as_deref(), third.resent), (Some("connection"), 0), "{third:?}");
        server.await.unwrap();
    }

    #[test]
    fn urls() {
        assert_eq!(split_url("http://127.0.0.1:8080").unwrap(), (false, "127.0.0.1".into(), 8080, String::new()));
        assert_eq!(
            split_url("https://api.example.com/v1").unwrap(),
            (true, "api.example.com".into(), 443, "/v1".into())
        );
        assert_eq!(split_url("http://h/").unwrap().2, 80);
        for bad in ["127.0.0.1:8080", "ftp://x", "http://:80", "http://h:x"] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
    }
}
