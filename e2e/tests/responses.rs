//! The Responses API served by the three real tiers, driven by the official `openai` SDK and the official Agents
//! SDK (`e2e/sdk/responses.py`): plain, streamed (the official event sequence), a function tool round trip (whole
//! and through a stored response's `previous_response_id`), stored responses read back, listed and deleted,
//! `text.format` through `responses.parse`, refusals by name, and an agent calling a function tool. A stored
//! response is read through a second frontend (the store is the cluster's), and another project cannot see it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use zl_e2e::{Tiers, admin, certs_more, request, start_frontend, start_tiers, wait_for_key};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-responses-key-0123456789";
const RIVAL: &str = "sk-zl-e2e-responses-rival-0123456789";

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

    // The stored response, through another frontend of the cluster: found for its project, not for another.
    let id = stdout.lines().find_map(|l| l.strip_prefix("stored id: ")).expect("the script names a stored response");
    certs_more(dir.path(), &[("frontend", "fe-1")]);
    let (mut other, other_http) = start_frontend(dir.path(), "fe-1", orch.quic);
    admin(&["project", "rival"]);
    admin(&["keys", "create", "rival", "--project", "rival", "--secret", RIVAL]);
    wait_for_key(other_http, KEY);
    wait_for_key(other_http, RIVAL);
    let get = |key: &str| {
        let auth = format!("Bearer {key}");
        request(other_http, "GET", &format!("/v1/responses/{id}"), &[("authorization", &auth)], "").unwrap()
    };
    let mine = get(KEY);
    assert_eq!(mine.status, 200, "{}", mine.body);
    let body: serde_json::Value = serde_json::from_str(&mine.body).unwrap();
    assert_eq!(body["id"], id);
    assert_eq!(body["output"][0]["type"], "function_call");
    let theirs = get(RIVAL);
    assert_eq!(theirs.status, 404, "another project's response is unknown: {}", theirs.body);
    assert!(other.terminate(Duration::from_secs(20)), "the second zl-frontend did not stop cleanly");
    assert!(frontend.terminate(Duration::from_secs(20)), "zl-frontend did not stop cleanly");
    assert!(worker.proc.terminate(Duration::from_secs(60)), "zl-worker did not stop cleanly");
    assert!(orch.proc.terminate(Duration::from_secs(20)), "zl-orchestrator did not stop cleanly");
}
