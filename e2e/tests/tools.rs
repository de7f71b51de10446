//! Tool use and structured outputs through the real tiers, driven by the official `anthropic` and `openai` Python
//! SDKs (e2e/sdk/tools.py): forced and free tool calls, tool results, streamed tool use assembled by the SDKs'
//! helpers, `response_format` with a Pydantic model, and the schema property check (every constrained answer to
//! two dozen varied JSON Schemas, across seeds, validates).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use zl_e2e::{Tiers, admin, http, start_tiers, wait_for_key};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-tools-key-0123456789";

#[test]
fn the_sdks_call_tools_and_get_schema_valid_json() {
    let dir = tempfile::tempdir().unwrap();
    let Tiers { mut orch, mut worker, mut frontend, http: http_addr } = start_tiers(dir.path());
    admin(dir.path(), orch.admin, &["project", "acme"]);
    admin(dir.path(), orch.admin, &["keys", "create", "main", "--project", "acme", "--secret", KEY]);
    wait_for_key(http_addr, KEY);

    let stdout = zl_e2e::sdk_script("tools.py", http_addr, KEY, MODEL, &[], "tools: ok");
    println!("{stdout}");

    let text = zl_e2e::frontend_metrics(http_addr);
    // Never on the public API port.
    assert_eq!(http(http_addr, "GET", "/metrics", &[], "").unwrap().0, 404);
    assert!(text.contains("zl_frontend_tool_calls_total"), "{text}");
    assert!(frontend.terminate(Duration::from_secs(20)), "zl-frontend did not stop cleanly");
    assert!(worker.proc.terminate(Duration::from_secs(60)), "zl-worker did not stop cleanly");
    assert!(orch.proc.terminate(Duration::from_secs(20)), "zl-orchestrator did not stop cleanly");
}
