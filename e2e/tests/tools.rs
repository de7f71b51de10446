//! Tool use and structured outputs through the real tiers, driven by the official `anthropic` and `openai` Python
//! SDKs (e2e/sdk/tools.py): forced and free tool calls, tool results, streamed tool use assembled by the SDKs'
//! helpers, `response_format` with a Pydantic model, and the schema property check (every constrained answer to
//! two dozen varied JSON Schemas, across seeds, validates).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use zl_e2e::{admin, certs, http, python, start_frontend, start_orchestrator, start_worker};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-tools-key-0123456789";

#[test]
fn the_sdks_call_tools_and_get_schema_valid_json() {
    let dir = tempfile::tempdir().unwrap();
    certs(dir.path(), &[("orchestrator", "orch-0"), ("worker", "worker-0"), ("frontend", "fe-0"), ("admin", "ops")]);
    let mut orch = start_orchestrator(dir.path(), "orch-0", &[]);
    let mut worker = start_worker(dir.path(), "worker-0", orch.quic);
    let (mut frontend, http_addr) = start_frontend(dir.path(), "fe-0", orch.quic);
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        orch.proc.assert_running("zl-orchestrator");
        worker.proc.assert_running("zl-worker");
        frontend.assert_running("zl-frontend");
        if let Some((200, _)) = http(http_addr, "GET", "/readyz", &[], "") {
            break;
        }
        assert!(Instant::now() < deadline, "the frontend never became ready");
        std::thread::sleep(Duration::from_millis(300));
    }
    admin(dir.path(), orch.admin, &["project", "acme"]);
    admin(dir.path(), orch.admin, &["keys", "create", "main", "--project", "acme", "--secret", KEY]);
    let auth = format!("Bearer {KEY}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while http(http_addr, "GET", "/v1/models", &[("authorization", &auth)], "").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "the frontend never accepted the new key");
        std::thread::sleep(Duration::from_millis(100));
    }

    let out = std::process::Command::new(python())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/tools.py"))
        .env("ZL_BASE_URL", format!("http://{http_addr}"))
        .env("ZL_API_KEY", KEY)
        .env("ZL_MODEL", MODEL)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("tools: ok"),
        "SDK tool use failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");

    let (status, text) = http(http_addr, "GET", "/metrics", &[], "").unwrap();
    assert_eq!(status, 200);
    assert!(text.contains("zl_frontend_tool_calls_total"), "{text}");
    assert!(frontend.terminate(Duration::from_secs(20)), "zl-frontend did not stop cleanly");
    assert!(worker.proc.terminate(Duration::from_secs(60)), "zl-worker did not stop cleanly");
    assert!(orch.proc.terminate(Duration::from_secs(20)), "zl-orchestrator did not stop cleanly");
}
