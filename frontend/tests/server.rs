//! The real server loop on 127.0.0.1: HTTP/1.1, h2c (HTTP/2 with prior knowledge), HTTPS with HTTP/2 chosen by
//! ALPN, and a graceful shutdown that lets an open stream finish while refusing new connections.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Version};
use common::*;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use zl_frontend::gateway::GatewayConfig;
use zl_frontend::http::{EdgeLimits, serve};

async fn start(
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (std::net::SocketAddr, Harness, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    start_with(tls, EdgeLimits::default()).await
}

async fn start_with(
    tls: Option<Arc<rustls::ServerConfig>>,
    edge: EdgeLimits,
) -> (std::net::SocketAddr, Harness, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let h = harness_with_edge(GatewayConfig::default(), 1024 * 1024, edge);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = h.app.clone();
    let task = tokio::spawn(async move {
        serve(listener, app, tls, async { drop(stopped.await) }, Duration::from_secs(10), edge).await;
    });
    (addr, h, stop, task)
}

async fn body_text(resp: hyper::Response<hyper::body::Incoming>) -> String {
    String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

fn healthz(version: Version) -> Request<Body> {
    // HTTP/2 needs an absolute URI (scheme and authority become pseudo-headers).
    let uri = if version == Version::HTTP_2 { "http://localhost/healthz" } else { "/healthz" };
    Request::get(uri).version(version).header("host", "localhost").body(Body::empty()).unwrap()
}

#[tokio::test]
async fn http1_and_h2c_on_one_port() {
    let (addr, _h, _stop, _task) = start(None).await;

    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (mut h1, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let resp = h1.send_request(healthz(Version::HTTP_11)).await.unwrap();
    assert_eq!((resp.version(), resp.status().as_u16()), (Version::HTTP_11, 200));
    assert!(resp.headers().contains_key("request-id"));

    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (mut h2, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.unwrap();
    tokio::spawn(conn);
    let resp = h2.send_request(healthz(Version::HTTP_2)).await.unwrap();
    assert_eq!((resp.version(), resp.status().as_u16()), (Version::HTTP_2, 200));
    assert_eq!(body_text(resp).await, r#"{"status":"ok"}"#);
}

#[tokio::test]
async fn https_negotiates_http2_by_alpn() {
    zl_tls::install_default_provider();
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let tls = zl_frontend::http::tls_config(&cert_path, &key_path).unwrap();
    let (addr, _h, _stop, _task) = start(Some(tls)).await;

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let mut client = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls_stream = connector.connect(name, tcp).await.unwrap();
    assert_eq!(tls_stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls_stream)).await.unwrap();
    tokio::spawn(conn);
    let resp = h2.send_request(healthz(Version::HTTP_2)).await.unwrap();
    assert_eq!((resp.version(), resp.status().as_u16()), (Version::HTTP_2, 200));
}

#[tokio::test]
async fn shutdown_drains_open_streams_and_refuses_new_connections() {
    let (addr, h, stop, task) = start(None).await;
    *h.fake.mode.lock().unwrap() = WorkerMode::Slow;
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (mut h1, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let req = Request::post("/v1/messages")
        .header("host", "localhost")
        .header("x-api-key", KEY)
        .body(Body::from(hello(serde_json::json!({"stream": true})).to_string()))
        .unwrap();
    let resp = h1.send_request(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    stop.send(()).unwrap();
    // The open stream still runs to its end...
    let text = body_text(resp).await;
    assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), "{text}");
    // ...and the server stops once it has, without waiting for the drain timeout.
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the server stopped").unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is closed");
}

fn bad_key_post(body: String) -> Request<Body> {
    Request::post("/v1/messages")
        .header("host", "localhost")
        .header("x-api-key", "sk-not-a-key")
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap()
}

#[tokio::test]
async fn an_early_401_keeps_the_connection_usable_or_announces_its_close() {
    let (addr, _h, _stop, _task) = start(None).await;
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (mut h1, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    let conn = tokio::spawn(conn);

    // A small body the handler never read (the key was refused first) is read and dropped: the pooled
    // connection serves the next requests.
    let small = serde_json::json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..3 {
        let resp = h1.send_request(bad_key_post(small.to_string())).await.unwrap();
        assert_eq!(resp.status().as_u16(), 401);
        assert!(!resp.headers().contains_key("connection"), "{:?}", resp.headers());
        body_text(resp).await;
        let resp = h1.send_request(healthz(Version::HTTP_11)).await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        body_text(resp).await;
    }

    // A large one is not read: the answer says the connection closes, so no client reuses it.
    let large = format!("{{\"pad\": \"{}\"}}", "x".repeat(512 * 1024));
    let resp = h1.send_request(bad_key_post(large)).await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert_eq!(resp.headers().get("connection").map(|v| v.to_str().unwrap()), Some("close"));
    body_text(resp).await;
    tokio::time::timeout(Duration::from_secs(5), conn).await.expect("the server closes the connection").ok();
}

/// Tight edge limits for the slow-client tests.
fn tight(max_connections: usize) -> EdgeLimits {
    EdgeLimits {
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
        max_connections,
        ..EdgeLimits::default()
    }
}

/// Read until the server closes the connection (or `within` passes); what it sent, and whether it closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let closed = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

#[tokio::test]
async fn a_slowloris_is_cut_off_at_the_header_deadline() {
    use tokio::io::AsyncWriteExt;
    let (addr, _h, _stop, _task) = start_with(None, tight(64)).await;

    // Headers trickled one line every 300 ms would take 6 s: the connection is closed after about 1 s.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    slow.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: localhost\r\n").await.unwrap();
    let mut cut_off = false;
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if slow.write_all(format!("x-trickle-{i}: {i}\r\n").as_bytes()).await.is_err() {
            cut_off = true;
            break;
        }
        let mut probe = [0u8; 256];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), slow.peek(&mut probe)).await {
            cut_off = true;
            break;
        }
    }
    let elapsed = started.elapsed();
    assert!(cut_off, "the slow connection was still open after {elapsed:?}");
    assert!(elapsed < Duration::from_secs(4), "cut off only after {elapsed:?}");

    // A connection that sends nothing, and one that sends only the first byte of the h2c preface, are closed too.
    for first in [&b""[..], &b"P"[..]] {
        let mut silent = TcpStream::connect(addr).await.unwrap();
        silent.write_all(first).await.unwrap();
        let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(4)).await;
        assert!(closed, "a connection that sent {first:?} was not closed");
    }

    // A head in time but a body trickled past the body deadline gets a 408 in the API's error format.
    let mut trickle = TcpStream::connect(addr).await.unwrap();
    trickle
        .write_all(
            format!(
                "POST /v1/messages HTTP/1.1\r\nhost: localhost\r\nx-api-key: {KEY}\r\ncontent-type: application/json\r\n\
                 content-length: 100\r\n\r\n{{\"model\":"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (answer, _) = read_until_closed(&mut trickle, Duration::from_secs(4)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"type\":\"invalid_request_error\"") && answer.contains("did not arrive"), "{answer}");

    // Prompt clients are unaffected.
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (mut h1, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    assert_eq!(h1.send_request(healthz(Version::HTTP_11)).await.unwrap().status().as_u16(), 200);
}

#[tokio::test]
async fn connections_past_the_cap_wait_for_a_free_slot() {
    use tokio::io::AsyncWriteExt;
    let (addr, _h, _stop, _task) = start_with(None, tight(1)).await;
    // The one slot is held by a connection sending its request slowly (within the deadlines).
    let mut holder = TcpStream::connect(addr).await.unwrap();
    holder.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A second client connects (the kernel queues it) but is not served while the slot is taken.
    let mut second = TcpStream::connect(addr).await.unwrap();
    second.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(300), second.peek(&mut buf)).await;
    assert!(early.is_err(), "served past the connection cap");
    // The holder finishes and closes: the waiting connection is served.
    holder.write_all(b"host: localhost\r\nconnection: close\r\n\r\n").await.unwrap();
    let (answer, _) = read_until_closed(&mut holder, Duration::from_secs(4)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(holder);
    let served = tokio::time::timeout(Duration::from_secs(4), second.peek(&mut buf)).await;
    assert!(matches!(served, Ok(Ok(n)) if n > 0), "the queued connection was never served");
    assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200"));
}

/// A connection from `source` (any 127/8 address: another client on this machine).
async fn connect_from(source: &str, addr: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

#[tokio::test]
async fn one_client_cannot_take_every_connection_slot() {
    let edge = EdgeLimits {
        header_timeout: Duration::from_secs(5),
        body_timeout: Duration::from_secs(5),
        max_connections: 8,
        max_connections_per_client: 3,
    };
    let (addr, _h, _stop, _task) = start_with(None, edge).await;
    // One client opens sockets and sends nothing (each would be held until the header deadline).
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from("127.0.0.2", addr).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Its fourth is closed at once, well before the 5 s header deadline.
    let mut fourth = connect_from("127.0.0.2", addr).await;
    let (_, closed) = read_until_closed(&mut fourth, Duration::from_millis(1000)).await;
    assert!(closed, "a client past its cap is turned away at once");
    // Another client is served meanwhile, and health probes stay prompt.
    let io = TokioIo::new(connect_from("127.0.0.3", addr).await);
    let (mut h1, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let started = std::time::Instant::now();
    assert_eq!(h1.send_request(healthz(Version::HTTP_11)).await.unwrap().status().as_u16(), 200);
    assert!(started.elapsed() < Duration::from_secs(1));
    // The first client's slots come back as its connections close.
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let io = TokioIo::new(connect_from("127.0.0.2", addr).await);
    let (mut again, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    assert_eq!(again.send_request(healthz(Version::HTTP_11)).await.unwrap().status().as_u16(), 200);
}
