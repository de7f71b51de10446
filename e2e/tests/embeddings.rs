//! Embeddings served by the three real tiers: one worker serving the bundled chat model and a random-weight BERT
//! embedding model (`scripts/embed_models.py`), driven by the official `openai` SDK (`e2e/sdk/embeddings.py`):
//! floats and base64, batched and alone, `dimensions`, token arrays, refusals by parameter, and neither kind of
//! model answering the other's requests. The vector the whole path gives matches llama.cpp's for the same file
//! (the worker test's recorded reference) within cosine 0.999; the worker counts what it embedded.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;
use std::time::Duration;

use zl_e2e::{
    admin, certs, free_tcp, free_udp, metric_sum, metrics, request, start_frontend, start_orchestrator,
    start_worker_args, wait_for_key,
};

const KEY: &str = "sk-zl-e2e-embeddings-key-0123456789";
const CHAT: &str = "smollm2-135m-instruct";
const EMBED: &str = "bert-embed";

fn bundled() -> String {
    let out = Command::new(zl_e2e::bin("zl-worker")).arg("fetch-default-model").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt() * b.iter().map(|x| x * x).sum::<f64>().sqrt())
}

#[test]
fn the_embeddings_api_serves_an_embedding_model_beside_a_chat_model() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/embed_models.py");
    let bundled = bundled();
    let out = Command::new(zl_e2e::python()).arg(script).arg(&bundled).arg(&models).output().unwrap();
    assert!(out.status.success(), "embed_models.py: {}", String::from_utf8_lossy(&out.stderr));
    certs(dir.path(), &[("orchestrator", "orch-0"), ("worker", "worker-0"), ("frontend", "fe-0"), ("admin", "ops")]);
    let mut orch = start_orchestrator(dir.path(), "orch-0", &[]);
    let chat = format!("{CHAT}={bundled}");
    let embed = format!("{EMBED}={}", models.join("bert-embed.gguf").display());
    let args = ["--model", &chat, "--model", &embed];
    let mut worker = start_worker_args(dir.path(), "worker-0", &[orch.quic], (free_udp(), free_tcp()), &args);
    let (mut frontend, http) = start_frontend(dir.path(), "fe-0", orch.quic);
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while !zl_e2e::serving(http) {
        worker.proc.assert_running("zl-worker");
        assert!(std::time::Instant::now() < deadline, "the frontend never became ready");
        std::thread::sleep(Duration::from_millis(300));
    }
    let admin = |args: &[&str]| admin(dir.path(), orch.admin, args);
    admin(&["project", "acme"]);
    admin(&["keys", "create", "main", "--project", "acme", "--secret", KEY]);
    wait_for_key(http, KEY);

    let stdout = zl_e2e::sdk_script(
        "embeddings.py",
        http,
        KEY,
        EMBED,
        &[("ZL_CHAT_MODEL", CHAT), ("ZL_DIMS", "128")],
        "embeddings: ok",
    );
    println!("{stdout}");

    // The whole path gives llama.cpp's vector for the same file (recorded by worker/tests/embeddings.rs).
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../worker/tests/data/embeddings.json")).unwrap(),
    )
    .unwrap();
    let theirs: Vec<f64> = serde_json::from_value(reference[EMBED]["vectors"][0].clone()).unwrap();
    let body =
        serde_json::json!({"model": EMBED, "input": "The capital of France is Paris.", "encoding_format": "float"});
    let auth = format!("Bearer {KEY}");
    let r = request(http, "POST", "/v1/embeddings", &[("authorization", &auth)], &body.to_string()).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.header("x-zl-worker").is_some_and(|w| w == "worker-0"), "routed by the orchestrator");
    let answer: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let ours: Vec<f64> = serde_json::from_value(answer["data"][0]["embedding"].clone()).unwrap();
    let c = cosine(&ours, &theirs);
    println!("end to end vs llama.cpp: cosine {c:.7}");
    assert!(c >= 0.999, "cosine {c} with llama.cpp's vector");

    // Measured on both tiers.
    let worker_metrics = metrics(worker.metrics).unwrap();
    assert!(metric_sum(&worker_metrics, "zl_worker_embedded_inputs_total") >= 5.0, "{worker_metrics}");
    let frontend_metrics = zl_e2e::frontend_metrics(http);
    assert!(metric_sum(&frontend_metrics, "zl_frontend_embedded_inputs_total") >= 5.0);

    assert!(frontend.terminate(Duration::from_secs(20)), "zl-frontend did not stop cleanly");
    assert!(worker.proc.terminate(Duration::from_secs(60)), "zl-worker did not stop cleanly");
    assert!(orch.proc.terminate(Duration::from_secs(20)), "zl-orchestrator did not stop cleanly");
}
