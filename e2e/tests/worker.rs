//! The real `zl-worker` process serving the bundled default model over QUIC with mutual TLS: streaming answers,
//! concurrent requests, typed errors, and a cancelled stream freeing its KV blocks (read from `/metrics`).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use zl_e2e::{Proc, certs, free_tcp, free_udp, gauge, metric_sum, metrics};
use zl_proto::quic::{CallError, Client};
use zl_wire::message::{ErrorCode, GenerateRequest, Message, Prompt, Role, SamplingParams, StopReason};

struct Worker {
    child: Proc,
    quic: SocketAddr,
    metrics: SocketAddr,
    _dir: tempfile::TempDir,
    client: Client,
}

const PARIS: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

fn generate(id: &str, prompt: &str, max_tokens: u32) -> Message {
    Message::GenerateRequest(GenerateRequest {
        request_id: id.into(),
        trace_id: String::new(),
        model: "smollm2-135m-instruct".into(),
        prompt: Prompt::Text(prompt.into()),
        sampling: SamplingParams { temperature: 0.0, top_p: 1.0, top_k: 0, seed: Some(1) },
        max_tokens,
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
    })
}

async fn start() -> Worker {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    certs(dir.path(), &[("worker", "worker-0"), ("frontend", "fe-0")]);
    let (quic, metrics_addr) = (free_udp(), free_tcp());
    // Identity and KV budget come from a config file; addresses from flags.
    let config = dir.path().join("worker.toml");
    std::fs::write(
        &config,
        format!("node-id = \"worker-0\"\nkv-memory-mb = 64\ntls-dir = {d:?}\nlisten = \"127.0.0.1:1\"\n"),
    )
    .unwrap();
    let child = Proc::spawn(
        "zl-worker",
        &[
            "serve",
            "--config",
            config.to_str().unwrap(),
            "--listen",
            &quic.to_string(),
            "--metrics-addr",
            &metrics_addr.to_string(),
        ],
    );
    let client = zl_e2e::client(dir.path(), Role::Frontend, "fe-0");
    let mut worker = Worker { child, quic, metrics: metrics_addr, _dir: dir, client };
    // Ready once it answers a call (the model loads first).
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        worker.child.assert_running("zl-worker");
        if collect(&worker, generate("ready", PARIS, 1)).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "zl-worker never became ready");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    worker
}

async fn collect(w: &Worker, req: Message) -> Result<(String, StopReason, u32), CallError> {
    let mut stream = w.client.stream(w.quic, Role::Worker, req).await?;
    let mut text = String::new();
    while let Some(msg) = stream.next().await {
        match msg? {
            Message::TokenChunk(c) => text.push_str(&c.text_delta),
            Message::Finish(f) => return Ok((text, f.stop_reason, f.usage.output_tokens)),
            other => panic!("unexpected {other:?}"),
        }
    }
    Err(CallError::Protocol("no finish".into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_process_serves_streams_and_frees_cancelled_sequences() {
    let w = start().await;

    // A streamed greedy answer, ended by the model's end-of-turn token.
    let (text, reason, _) = collect(&w, generate("paris", PARIS, 32)).await.unwrap();
    assert!(text.contains("Paris"), "{text:?}");
    assert_eq!(reason, StopReason::EndTurn, "{text:?}");

    // Two concurrent streams both complete, and greedy answers are deterministic.
    let (a, b) = tokio::join!(collect(&w, generate("c1", PARIS, 32)), collect(&w, generate("c2", PARIS, 32)));
    assert_eq!(a.unwrap().0, text);
    assert_eq!(b.unwrap().0, text);

    // Typed errors.
    let mut unknown = generate("nf", PARIS, 4);
    if let Message::GenerateRequest(g) = &mut unknown {
        g.model = "no-such-model".into();
    }
    match collect(&w, unknown).await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::NotFound),
        other => panic!("{other:?}"),
    }
    match collect(&w, generate("long", PARIS, 9000)).await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::ContextLengthExceeded, "{}", e.message),
        other => panic!("{other:?}"),
    }

    // A long prompt (about 1k tokens): the first frame says the request is admitted (no tokens), before its
    // prefill produces the first token; the frontend answers its client with headers and message_start on it
    // (frontend/tests/http.rs holds a worker between the two to show that).
    let long = format!(
        "<|im_start|>user\n{}Repeat the last sentence.<|im_end|>\n<|im_start|>assistant\n",
        "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(80)
    );
    let mut stream = w.client.stream(w.quic, Role::Worker, generate("long-prompt", &long, 2)).await.unwrap();
    let first = stream.next().await;
    assert!(matches!(&first, Some(Ok(Message::TokenChunk(c))) if c.is_admission()), "{first:?}");
    match stream.next().await {
        Some(Ok(Message::TokenChunk(c))) => assert_eq!(c.token_ids.len(), 1),
        other => panic!("{other:?}"),
    }
    // Read it to its end, so it finishes rather than being cancelled (counted below).
    while let Some(frame) = stream.next().await {
        frame.unwrap();
    }

    // A client that goes away mid-stream: its KV blocks return to the pool.
    let counting =
        "<|im_start|>user\nCount from one to five hundred, one number per line.<|im_end|>\n<|im_start|>assistant\n";
    let mut stream = w.client.stream(w.quic, Role::Worker, generate("cancel", counting, 500)).await.unwrap();
    for _ in 0..5 {
        assert!(matches!(stream.next().await, Some(Ok(Message::TokenChunk(_)))));
    }
    let text = metrics(w.metrics).unwrap();
    let used = gauge(&text, "zl_worker_kv_blocks_used").unwrap();
    assert!(used > 0.0, "a running sequence holds blocks");
    assert_eq!(gauge(&text, "zl_worker_cpu_kernels{isa="), Some(1.0), "the kernels' instruction set is exported");
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let used = metrics(w.metrics).and_then(|m| gauge(&m, "zl_worker_kv_blocks_used"));
        if used == Some(0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "blocks still used after cancel: {used:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The documented counter counts it.
    let cancelled = metric_sum(&metrics(w.metrics).unwrap(), "zl_worker_cancelled_total");
    assert_eq!(cancelled, 1.0, "zl_worker_cancelled_total after one client went away");
}
