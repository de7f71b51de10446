//! Gateway overhead: what the frontend adds to a request when the cluster behind it costs nothing (a scripted
//! upstream that routes instantly and answers one short completion). Measured two ways side by side:
//! in process (the router as a `tower::Service`: auth, parsing, template, tokenizer, limits, routing, response) and
//! over loopback HTTP/1.1 with keep-alive (adds hyper, the socket and the client). Prints p50/p99 latency and
//! requests per second at 1 and 8 concurrent clients. Run: `cargo bench -p zl-frontend --bench gateway`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use common::*;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tower::ServiceExt;
use zl_frontend::gateway::GatewayConfig;
use zl_frontend::limits::KeyLimits;

const REQUESTS: usize = 4000;

fn body() -> String {
    // Sampled without a seed: never a cache hit, so every request takes the whole path.
    serde_json::json!({"model": MODEL, "max_tokens": 8, "temperature": 0.7,
        "messages": [{"role": "user", "content": "hello, how are you today?"}]})
    .to_string()
}

fn request() -> Request<Body> {
    Request::post("/v1/messages")
        .header("host", "localhost")
        .header("x-api-key", KEY)
        .header("content-type", "application/json")
        .body(Body::from(body()))
        .unwrap()
}

fn report(label: &str, mut lat: Vec<Duration>, wall: Duration) {
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3;
    println!(
        "{label:<34} p50 {:>7.3} ms   p99 {:>7.3} ms   {:>8.0} req/s",
        pct(0.5),
        pct(0.99),
        lat.len() as f64 / wall.as_secs_f64()
    );
}

async fn in_process(h: &Harness, clients: usize) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let app = h.app.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            for _ in 0..REQUESTS / clients {
                let t = Instant::now();
                let resp = app.clone().oneshot(request()).await.unwrap();
                assert_eq!(resp.status(), 200);
                resp.into_body().collect().await.unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    report(&format!("in process, {clients} client(s)"), lat, started.elapsed());
}

async fn loopback(addr: std::net::SocketAddr, clients: usize) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        tasks.push(tokio::spawn(async move {
            let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            let mut lat = Vec::new();
            for _ in 0..REQUESTS / clients {
                let t = Instant::now();
                let resp = sender.send_request(request()).await.unwrap();
                assert_eq!(resp.status(), 200);
                resp.into_body().collect().await.unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    report(&format!("loopback HTTP/1.1, {clients} client(s)"), lat, started.elapsed());
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        // Unlimited keys and no cache: the measurement is the full path every time.
        let config = GatewayConfig { default_limits: KeyLimits::default(), cache_bytes: 0, ..GatewayConfig::default() };
        let h = harness_with(config, 1024 * 1024);
        // Warm up: the model card is fetched on first use.
        h.app.clone().oneshot(request()).await.unwrap().into_body().collect().await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = h.app.clone();
        tokio::spawn(zl_frontend::http::serve(listener, app, None, std::future::pending(), Duration::from_secs(1)));
        println!("gateway overhead with a zero-cost upstream, {REQUESTS} requests per line");
        for clients in [1, 8] {
            in_process(&h, clients).await;
            loopback(addr, clients).await;
        }
    });
}
