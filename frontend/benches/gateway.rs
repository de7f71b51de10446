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
use futures_util::FutureExt;
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

/// `n` requests one after another through `send`, each read to its end; their latencies.
async fn timed<B, Fut>(n: usize, mut send: impl FnMut() -> Fut) -> Vec<Duration>
where
    Fut: std::future::Future<Output = axum::http::Response<B>>,
    B: axum::body::HttpBody,
    B::Error: std::fmt::Debug,
{
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let resp = send().await;
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap();
        lat.push(t.elapsed());
    }
    lat
}

/// `clients` concurrent clients, each made by `client` and sending its share of [`REQUESTS`]; prints the figures.
async fn run<Fut>(label: &str, clients: usize, client: impl Fn(usize) -> Fut)
where
    Fut: std::future::Future<Output = Vec<Duration>> + Send + 'static,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients).map(|_| tokio::spawn(client(REQUESTS / clients))).collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    report(&format!("{label}, {clients} client(s)"), lat, started.elapsed());
}

async fn in_process(h: &Harness, clients: usize) {
    run("in process", clients, |n| {
        let app = h.app.clone();
        async move { timed(n, || app.clone().oneshot(request()).map(Result::unwrap)).await }
    })
    .await;
}

async fn loopback(addr: std::net::SocketAddr, clients: usize) {
    run("loopback HTTP/1.1", clients, |n| async move {
        let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        timed(n, || sender.send_request(request()).map(Result::unwrap)).await
    })
    .await;
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
        let edge = zl_frontend::http::EdgeLimits::default();
        tokio::spawn(zl_frontend::http::serve(
            listener,
            app,
            None,
            std::future::pending(),
            Duration::from_secs(1),
            edge,
        ));
        println!("gateway overhead with a zero-cost upstream, {REQUESTS} requests per line");
        for clients in [1, 8] {
            in_process(&h, clients).await;
            loopback(addr, clients).await;
        }
    });
}
