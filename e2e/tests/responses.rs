//! The Responses API served by the three real tiers, driven by the official `openai` SDK and the official Agents
//! SDK (`e2e/sdk/responses.py`): plain, streamed (the official event sequence), a function tool round trip,
//! `text.format` through `responses.parse`, refusals by name, and an agent calling a function tool.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use zl_e2e::{Tiers, admin, start_tiers, wait_for_key};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-responses-key-0123456789";

#[test]
fn the_responses_api_works_through_the_openai_and_agents_sdks() {
    let dir = tempfile::tempdir().unwrap();
    let Tiers { mut orch, mut worker, mut frontend, http: http_addr } = start_tiers(dir.path());
    let admin = |args: &[&str]| admin(dir.path(), orch.admin, args);
    admin(&["project", "acme"]);
    admin(&["keys", "create", "main", "--project", "acme", "--secret", KEY]);
    wait_for_key(http_addr, KEY);
    let stdout = zl_e2e::sdk_script("responses.py", http_addr, KEY, MODEL, &[], "responses: ok");
    println!("{stdout}");
    assert!(frontend.terminate(Duration::from_secs(20)), "zl-frontend did not stop cleanly");
    assert!(worker.proc.terminate(Duration::from_secs(60)), "zl-worker did not stop cleanly");
    assert!(orch.proc.terminate(Duration::from_secs(20)), "zl-orchestrator did not stop cleanly");
}
