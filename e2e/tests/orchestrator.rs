//! The real `zl-orchestrator` and `zl-worker` processes: the worker registers itself and heartbeats over QUIC,
//! the orchestrator routes to it (and only frontends may ask), the route works for generation, KV events reach the
//! orchestrator, `zl admin` drives the admin API (admin certificates only), and a gracefully stopped worker
//! deregisters.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use zl_e2e::{certs, client, gauge, metrics, start_orchestrator, start_worker, zl};
use zl_proto::quic::{CallError, Client};
use zl_wire::message::{
    ComputePool, ErrorCode, GenerateRequest, LoadReport, Message, NodeId, Prompt, Role, RouteDecision, RouteHint,
    RouteRequest, SamplingParams,
};

const MODEL: &str = "smollm2-135m-instruct";

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
        trace_id: String::new(),
        prefer_fallback: false,
        project: String::new(),
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
    zl_tls::install_default_provider();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    certs(
        dir.path(),
        &[
            ("orchestrator", "orch-0"),
            ("worker", "worker-0"),
            ("frontend", "fe-0"),
            ("admin", "ops"),
            ("worker", "ops"),
        ],
    );
    let orch = start_orchestrator(dir.path(), "orch-0", &["--heartbeat-timeout-ms", "2000"]);
    let (orch_addr, orch_metrics, admin_addr, mut orch) = (orch.quic, orch.metrics, orch.admin, orch.proc);
    let worker = start_worker(dir.path(), "worker-0", orch_addr);
    let (worker_addr, worker_metrics, mut worker) = (worker.quic, worker.metrics, worker.proc);
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
    // The probes Kubernetes asks, on each node's metrics address: alive, and ready (a group with a leader; the
    // model loaded and the registration taken).
    // Readiness is looked at again every 100 ms until ready (a read point can take up to a second to confirm on a
    // loaded machine), so it may trail the first route by that much: bounded wait.
    for (addr, needle) in [(orch_metrics, "leader 1"), (worker_metrics, "registered with 1 orchestrator")] {
        let live = zl_e2e::request(addr, "GET", "/healthz", &[], "").unwrap();
        assert_eq!(live.status, 200, "{}", live.body);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ready = zl_e2e::request(addr, "GET", "/readyz", &[], "").unwrap();
            if ready.status == 200 && ready.body.contains(needle) {
                break;
            }
            assert!(Instant::now() < deadline, "{addr}: {} {}", ready.status, ready.body);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
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
        vram_total_bytes: 0,
        vram_free_bytes: 0,
        queued_prefill_blocks: 0,
        adapters: vec![],
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

    // The admin API, through `zl admin` with the admin certificate.
    let admin_addr = admin_addr.to_string();
    let admin = |args: &[&str]| {
        let mut all = vec!["admin", "--orchestrator", admin_addr.as_str(), "--tls-dir", d, "--node-id", "ops"];
        all.extend_from_slice(args);
        let out = zl(&all);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = admin(&["workers"]);
    assert!(ok && text.contains("worker-0") && text.contains("healthy") && text.contains(MODEL), "{text}");
    let (ok, text) = admin(&["drain", "worker-0"]);
    assert!(ok && text.contains("applied at index"), "{text}");
    match route(&fe, orch_addr, MODEL).await {
        Err(CallError::Remote(e)) => {
            assert_eq!(e.code, ErrorCode::Overloaded, "{e:?}");
            assert!(e.retry_after_ms > 0);
        }
        other => panic!("routed to a draining worker: {other:?}"),
    }
    assert!(admin(&["undrain", "worker-0"]).0);
    assert!(admin(&["alias", "default", MODEL]).0);
    assert_eq!(route(&fe, orch_addr, "default").await.unwrap().model, MODEL);
    let (ok, text) = admin(&["keys", "create", "k1", "--project", "acme"]);
    assert!(!ok && text.contains("project acme not found"), "{text}");
    assert!(admin(&["project", "acme", "--rpm", "60"]).0);
    let (ok, text) = admin(&["keys", "create", "k1", "--project", "acme"]);
    let secret = text.lines().find(|l| l.starts_with("zl-")).unwrap_or_default().to_owned();
    assert!(ok && secret.len() == 67, "{text}");
    let (ok, text) = admin(&["pool-thresholds", "--gpu", "0.2", "--hybrid", "0.5"]);
    assert!(!ok && text.contains("invalid"), "{text}");
    let (ok, state) = admin(&["state"]);
    assert!(ok && state.contains("\"k1\"") && state.contains("\"default\""), "{state}");
    assert!(!state.contains(&secret), "the state must hold only the secret's hash");
    assert!(state.contains("\"kv_blocks_total\":") && !state.contains("\"kv_blocks_total\":0"), "{state}");
    // A certificate for any other role is refused, even with the admin's node id.
    let mut all = vec!["admin", "--orchestrator", admin_addr.as_str(), "--tls-dir", d, "--node-id", "ops", "workers"];
    std::fs::copy(dir.path().join("worker-ops.pem"), dir.path().join("admin-ops.pem")).unwrap();
    std::fs::copy(dir.path().join("worker-ops.key"), dir.path().join("admin-ops.key")).unwrap();
    let out = zl(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a worker certificate administered the cluster");
    assert!(err.contains("only admin certificates may administer"), "{err}");
    all.clear();

    // A graceful stop deregisters: the model is no longer served, but it still exists: no capacity (a retryable
    // `Overloaded` with a retry hint, the frontend's 529), not an unknown model (a 404 no SDK retries).
    assert!(worker.terminate(Duration::from_secs(60)), "zl-worker did not stop cleanly");
    match route(&fe, orch_addr, MODEL).await {
        Err(CallError::Remote(e)) => {
            assert_eq!(e.code, ErrorCode::Overloaded, "{e:?}");
            assert!(e.retry_after_ms > 0, "{e:?}");
        }
        other => panic!("still routed after deregistration: {other:?}"),
    }
    match route(&fe, orch_addr, "never-registered").await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::NotFound, "{e:?}"),
        other => panic!("an unknown model was routed: {other:?}"),
    }
    assert!(orch.terminate(Duration::from_secs(20)), "zl-orchestrator did not stop cleanly");
}
