//! The three real tiers as processes (orchestrator, worker with the default model, frontend) driven over HTTP by
//! the official `anthropic` and `openai` Python SDKs: create, stream (helpers and raw events), count_tokens,
//! models list/get, the cache, and errors surfacing as the SDKs' own exception classes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use zl_e2e::{Tiers, admin, gauge, http, start_tiers, wait_for_key};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-main-key-0123456789";
const LIMITED: &str = "sk-zl-e2e-limited-key-0123456789";

#[test]
fn the_official_sdks_work_against_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let Tiers { mut orch, mut worker, mut frontend, http: http_addr } = start_tiers(dir.path());
    let admin = |args: &[&str]| admin(dir.path(), orch.admin, args);
    admin(&["project", "acme"]);
    admin(&["project", "tiny", "--rpm", "1"]);
    admin(&["keys", "create", "main", "--project", "acme", "--secret", KEY]);
    admin(&["keys", "create", "limited", "--project", "tiny", "--secret", LIMITED]);
    wait_for_key(http_addr, KEY);

    let stdout =
        zl_e2e::sdk_script("conformance.py", http_addr, KEY, MODEL, &[("ZL_LIMITED_KEY", LIMITED)], "conformance: ok");
    println!("{stdout}");

    let text = zl_e2e::frontend_metrics(http_addr);
    // Never on the public API port.
    assert_eq!(http(http_addr, "GET", "/metrics", &[], "").unwrap().0, 404);
    assert!(gauge(&text, "zl_frontend_requests_total").is_some(), "{text}");
    assert!(text.contains("zl_frontend_cache_total{result=\"hit\"}"), "{text}");
    assert!(text.contains("zl_frontend_rate_limited_total{dimension=\"requests\"}"), "{text}");
    assert!(text.contains("zl_frontend_ttft_seconds"), "{text}");

    assert!(frontend.terminate(Duration::from_secs(20)), "zl-frontend did not stop cleanly");
    assert!(worker.proc.terminate(Duration::from_secs(60)), "zl-worker did not stop cleanly");
    assert!(orch.proc.terminate(Duration::from_secs(20)), "zl-orchestrator did not stop cleanly");
}
