//! The real `zl-orchestrator` and `zl-worker` processes: the worker registers itself and heartbeats over QUIC,
//! the orchestrator routes to it (and only frontends may ask), the route works for generation, KV events reach the
//! orchestrator, and a gracefully stopped worker deregisters.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use zl_e2e::{Proc, certs, free_tcp, free_udp, gauge, metrics};
use zl_proto::TlsIdentity;
use zl_proto::message::{
    ComputePool, ErrorCode, GenerateRequest, LoadReport, Message, NodeId, Prompt, Role, RouteDecision, RouteHint,
    RouteRequest, SamplingParams,
};
use zl_proto::quic::{CallError, Client, RpcSettings};

const MODEL: &str = "smollm2-135m-instruct";

fn client(dir: &std::path::Path, role: Role, id: &str) -> Client {
    let stem = format!("{}-{id}", role.name());
    let identity = TlsIdentity::from_files(
        &dir.join("ca.pem"),
        &dir.join(format!("{stem}.pem")),
        &dir.join(format!("{stem}.key")),
        role,
        NodeId::new(id).unwrap(),
    )
    .unwrap();
    Client::new(&identity, RpcSettings::default()).unwrap()
}

fn route_request(model: &str) -> Message {
    Message::RouteRequest(RouteRequest {
        request_id: "req-1".into(),
        model: model.into(),
        prompt_tokens: 30,
        max_tokens: 16,
        block_hashes: vec![],
        session_id: None,
        hint: RouteHint::None,
        input_semantic_weight: 0.4,
        excluded_workers: vec![],
    })
}

async fn route(c: &Client, orch: SocketAddr, model: &str) -> Result<RouteDecision, CallError> {
    match c.call(orch, Role::Orchestrator, route_request(model)).await? {
        Message::RouteDecision(d) => Ok(d),
        other => panic!("unexpected reply {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_register_heartbeat_get_routed_to_and_deregister() {
    zl_proto::tls::install_default_provider();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    certs(dir.path(), &[("orchestrator", "orch-0"), ("worker", "worker-0"), ("frontend", "fe-0")]);
    let (orch_addr, orch_metrics) = (free_udp(), free_tcp());
    let mut orch = Proc::spawn(
        "zl-orchestrator",
        &[
            "serve",
            "--listen",
            &orch_addr.to_string(),
            "--metrics-addr",
            &orch_metrics.to_string(),
            "--node-id",
            "orch-0",
            "--tls-dir",
            d,
            "--heartbeat-timeout-ms",
            "2000",
        ],
    );
    let (worker_addr, worker_metrics) = (free_udp(), free_tcp());
    let mut worker = Proc::spawn(
        "zl-worker",
        &[
            "serve",
            "--listen",
            &worker_addr.to_string(),
            "--metrics-addr",
            &worker_metrics.to_string(),
            "--node-id",
            "worker-0",
            "--tls-dir",
            d,
            "--kv-memory-mb",
            "64",
            "--orchestrator",
            &orch_addr.to_string(),
            "--report-interval-ms",
            "100",
        ],
    );
    let fe = client(dir.path(), Role::Frontend, "fe-0");

    // Routed once the worker has loaded its model, registered and reported load (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(180);
    let decision = loop {
        orch.assert_running("zl-orchestrator");
        worker.assert_running("zl-worker");
        match route(&fe, orch_addr, MODEL).await {
            Ok(d) => break d,
            Err(e) => assert!(Instant::now() < deadline, "never routed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(decision.worker_id.as_str(), "worker-0");
    assert_eq!(decision.endpoint, worker_addr.to_string());
    assert_eq!(decision.model, MODEL);
    assert_eq!(decision.compute_pool, ComputePool::Cpu);
    assert_ne!(decision.weights_sha256, [0; 32]);
    assert!(decision.reason.starts_with("prefix-aware: "), "{}", decision.reason);
    assert!(decision.decision_nanos > 0 && decision.decision_nanos < 50_000_000);
    assert!((0.0..=1.0).contains(&decision.predicted_billing_unit));

    // Unknown models are NotFound; only frontends (and operators) get routes; a worker speaks only for itself.
    match route(&fe, orch_addr, "no-such-model").await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::NotFound, "{e:?}"),
        other => panic!("{other:?}"),
    }
    let as_worker = client(dir.path(), Role::Worker, "worker-0");
    match route(&as_worker, orch_addr, MODEL).await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::PermissionDenied),
        other => panic!("{other:?}"),
    }
    let forged = Message::LoadReport(LoadReport {
        worker_id: NodeId::new("worker-9").unwrap(),
        sequence: 1,
        queue_depth: 0,
        running_sequences: 0,
        kv_blocks_used: 0,
        kv_blocks_free: 1,
        fragmentation_ratio: 0.0,
        tokens_per_second: 0.0,
    });
    match as_worker.call(orch_addr, Role::Orchestrator, forged).await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::PermissionDenied),
        other => panic!("{other:?}"),
    }

    // The decision is usable: generate on the endpoint it names. The prompt fills two KV blocks.
    let prompt = "<|im_start|>user\nList three facts about the river Seine and the bridges of Paris, briefly.\
        <|im_end|>\n<|im_start|>assistant\n";
    let generate = Message::GenerateRequest(GenerateRequest {
        request_id: "gen-1".into(),
        trace_id: String::new(),
        model: decision.model.clone(),
        prompt: Prompt::Text(prompt.into()),
        sampling: SamplingParams { temperature: 0.0, top_p: 1.0, top_k: 0, seed: Some(3) },
        max_tokens: 8,
        stop_sequences: vec![],
        stream: false,
        logprobs: false,
    });
    let endpoint: SocketAddr = decision.endpoint.parse().unwrap();
    let mut stream = fe.stream(endpoint, Role::Worker, generate).await.unwrap();
    let mut frames = 0;
    while let Some(msg) = stream.next().await {
        msg.unwrap();
        frames += 1;
    }
    assert!(frames >= 1);

    // The worker's KV events reach the orchestrator (its gauge is refreshed every second).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cached = metrics(orch_metrics).and_then(|m| gauge(&m, "zl_cached_prefix_blocks"));
        if cached.is_some_and(|c| c >= 1.0) {
            break;
        }
        assert!(Instant::now() < deadline, "no KV events reached the orchestrator: {cached:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = metrics(orch_metrics).unwrap();
    assert!(text.contains("zl_route_decisions_total"), "{text}");
    assert!(text.contains("zl_route_decision_seconds"), "{text}");
    assert_eq!(gauge(&text, "zl_workers{state=\"healthy\"}"), Some(1.0), "{text}");

    // A graceful stop deregisters: the model is no longer served.
    assert!(worker.terminate(Duration::from_secs(60)), "zl-worker did not stop cleanly");
    match route(&fe, orch_addr, MODEL).await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::NotFound, "{e:?}"),
        other => panic!("still routed after deregistration: {other:?}"),
    }
    assert!(orch.terminate(Duration::from_secs(20)), "zl-orchestrator did not stop cleanly");
}
