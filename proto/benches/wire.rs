//! Wire-protocol benchmark: prints codec cost per token-chunk frame, unary-call round trip over loopback QUIC, and
//! token-chunk frames per second on one stream, each beside a baseline measured in the same run.
//!
//! Run: `cargo bench -p zl-proto --bench wire` (add `-- --quick` for a short run).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use zl_proto::quic::{CallContext, Client, Handler, Responder, RpcSettings, Server};
use zl_tls::{ClusterCa, TlsIdentity};
use zl_wire::message::{
    ComputePool, ErrorCode, Finish, GenerateRequest, NodeId, Prompt, Role, RouteDecision, RouteRequest, SamplingParams,
    StopReason, TokenChunk, Usage, WireError,
};
use zl_wire::{Encoder, FrameDecoder, HARD_MAX_PAYLOAD, Message};

struct BenchHandler;

impl Handler for BenchHandler {
    async fn call(&self, _ctx: CallContext, request: Message, out: &mut Responder) -> Result<(), WireError> {
        let err = |e: zl_proto::CallError| WireError::new(ErrorCode::Internal, e.to_string());
        match request {
            Message::RouteRequest(r) => out.send(Message::RouteDecision(decision(r.request_id))).await.map_err(err),
            Message::GenerateRequest(g) => {
                for i in 0..g.max_tokens {
                    out.send(Message::TokenChunk(chunk(i))).await.map_err(err)?;
                }
                let usage = Usage { input_tokens: 1, output_tokens: g.max_tokens, ..Usage::default() };
                out.send(Message::Finish(Finish { stop_reason: StopReason::MaxTokens, stop_sequence: None, usage }))
                    .await
                    .map_err(err)
            }
            _ => Err(WireError::new(ErrorCode::InvalidRequest, "unsupported")),
        }
    }
}

fn chunk(i: u32) -> TokenChunk {
    TokenChunk { token_ids: vec![i % 49152], text_delta: " Paris".into(), ..Default::default() }
}

fn decision(request_id: String) -> RouteDecision {
    RouteDecision {
        request_id,
        worker_id: NodeId::new("worker-0").unwrap(),
        endpoint: "127.0.0.1:7100".into(),
        model: "smollm2-135m-instruct".into(),
        weights_sha256: [3; 32],
        compute_pool: ComputePool::Cpu,
        predicted_billing_unit: 0.4,
        reason: "least-loaded".into(),
        decision_nanos: 900,
        orchestrator_id: String::new(),
        adapter: None,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn codec(iterations: u32) {
    let msg = Message::TokenChunk(chunk(42));
    let mut encoder = Encoder::new(HARD_MAX_PAYLOAD);
    let mut buf = BytesMut::new();
    encoder.encode_into(&msg, &mut buf).unwrap();
    let frame_len = buf.len();

    // Baseline: copying the frame's bytes, the least any codec must do.
    let started = Instant::now();
    for _ in 0..iterations {
        let copy = black_box(&buf[..]).to_vec();
        black_box(copy);
    }
    let copy_ns = started.elapsed().as_nanos() as f64 / f64::from(iterations);

    let started = Instant::now();
    let mut decoder = FrameDecoder::new(HARD_MAX_PAYLOAD);
    for _ in 0..iterations {
        buf.clear();
        encoder.encode_into(black_box(&msg), &mut buf).unwrap();
        let mut input = &buf[..];
        let frame = decoder.decode(&mut input).unwrap().unwrap();
        let decoded = Message::decode(&frame).unwrap();
        black_box(decoded);
    }
    let full_ns = started.elapsed().as_nanos() as f64 / f64::from(iterations);
    println!("codec: token-chunk frame of {frame_len} bytes");
    println!("  encode + verify + decode    {full_ns:>9.0} ns/frame");
    println!("  baseline: copy the frame    {copy_ns:>9.0} ns/frame   (ratio {:.1}x)", full_ns / copy_ns);
}

async fn quic(calls: usize, frames: u32) {
    let ca = ClusterCa::generate("bench", 1).unwrap();
    let server_id = TlsIdentity::issue(&ca, Role::Worker, NodeId::new("w0").unwrap()).unwrap();
    let client_id = TlsIdentity::issue(&ca, Role::Frontend, NodeId::new("f0").unwrap()).unwrap();
    let server =
        Server::spawn("127.0.0.1:0".parse().unwrap(), &server_id, RpcSettings::default(), Arc::new(BenchHandler))
            .unwrap();
    let addr = server.local_addr();
    let client = Client::new(&client_id, RpcSettings::default()).unwrap();
    let route = |i: usize| {
        Message::RouteRequest(RouteRequest {
            request_id: format!("req-{i}"),
            model: "smollm2-135m-instruct".into(),
            prompt_tokens: 100,
            max_tokens: 64,
            block_hashes: (0..7).collect(),
            session_id: None,
            hint: Default::default(),
            input_semantic_weight: 0.5,
            excluded_workers: vec![],
            trace_id: String::new(),
            prefer_fallback: false,
            project: String::new(),
        })
    };
    for i in 0..100 {
        client.call(addr, Role::Worker, route(i)).await.unwrap(); // warm-up and connect
    }
    let mut rtts = Vec::with_capacity(calls);
    for i in 0..calls {
        let started = Instant::now();
        client.call(addr, Role::Worker, route(i)).await.unwrap();
        rtts.push(started.elapsed());
    }
    rtts.sort();
    println!("unary call over loopback QUIC (route request -> decision), {calls} sequential calls");
    println!("  p50 {:>8.1} us   p99 {:>8.1} us", micros(percentile(&rtts, 0.5)), micros(percentile(&rtts, 0.99)));

    let generate = Message::GenerateRequest(GenerateRequest {
        request_id: "stream".into(),
        trace_id: String::new(),
        model: "smollm2-135m-instruct".into(),
        prompt: Prompt::Tokens(vec![1, 2, 3]),
        sampling: SamplingParams::default(),
        max_tokens: frames,
        stop_sequences: vec![],
        stream: true,
        logprobs: false,
        streaming_predicted: None,
        grammar: String::new(),
        cache_salt: 0,
        resume_tokens: vec![],
        adapter: None,
        top_logprobs: 0,
        prompt_logprobs: false,
        think: None,
        penalties: None,
    });
    let started = Instant::now();
    let mut stream = client.stream(addr, Role::Worker, generate).await.unwrap();
    let mut received = 0u32;
    while let Some(msg) = stream.next().await {
        if let Message::TokenChunk(_) = msg.unwrap() {
            received += 1;
        }
    }
    let rate = f64::from(received) / started.elapsed().as_secs_f64();
    println!("token-chunk frames on one stream: {received} frames");
    println!("  {rate:>12.0} frames/s   (a 16-way batch at 100 tokens/s each needs 1,600)");
    client.close();
    server.shutdown(Duration::from_millis(100)).await;
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (iterations, calls, frames) = if quick { (20_000, 500, 20_000) } else { (500_000, 5_000, 200_000) };
    zl_tls::install_default_provider();
    codec(iterations);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(quic(calls, frames));
}
