//! Two regions on loopback, each a whole cluster of its own (its own CA, orchestrator group, worker and frontend):
//! requests are served where they arrive; when region a loses its workers its frontend spills to region b (same
//! model, streaming through, `x-zl-region: b`, no client error) and takes the traffic back once they return; a key
//! bound to a alone gets a's 529 instead of leaving; a key bound to b is refused at a with a 403; a client's
//! `x-zl-region` preference is honoured. Bounded polls only; nothing is timed.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use zl_e2e::{HttpResponse, admin, request, small_cluster, start_worker_args};

const KEY: &str = "sk-zl-regions-any-0123456789abcdef";
const BOUND_A: &str = "sk-zl-regions-bound-a-0123456789ab";
const BOUND_B: &str = "sk-zl-regions-bound-b-0123456789ab";
const MODEL: &str = "smollm2-135m-instruct";

fn ask(addr: SocketAddr, key: &str, stream: bool, extra: &[(&str, &str)]) -> HttpResponse {
    let body = serde_json::json!({"model": MODEL, "max_tokens": 4, "temperature": 0.7, "stream": stream,
        "messages": [{"role": "user", "content": "Name a colour."}]})
    .to_string();
    let mut headers = vec![("x-api-key", key)];
    headers.extend_from_slice(extra);
    request(addr, "POST", "/v1/messages", &headers, &body).expect("the frontend answers")
}

fn region(r: &HttpResponse) -> &str {
    r.header("x-zl-region").unwrap_or("(none)")
}

/// Ask (bounded) until `done` holds for an answer; every answer on the way must satisfy `each`.
fn until(what: &str, mut attempt: impl FnMut() -> HttpResponse, done: impl Fn(&HttpResponse) -> bool) -> HttpResponse {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = attempt();
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "{what}: last answer {} from {}: {}", r.status, region(&r), r.body);
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn regions_serve_locally_spill_over_and_keep_bound_keys_home() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The key every region's frontends sign hops with.
    let hop_key = dir_a.path().join("hop.key");
    std::fs::write(&hop_key, "a-hop-key-shared-by-every-region-0123456789").unwrap();
    let hk = hop_key.to_str().unwrap();
    let b = small_cluster(dir_b.path(), &["wb"], &["--region", "b"], &["--region", "b", "--hop-key-file", hk], KEY);
    let peer = format!("b=http://{}", b.http);
    let a_flags = ["--region", "a", "--peer-region", &peer, "--hop-key-file", hk];
    let mut a = small_cluster(dir_a.path(), &["wa"], &["--region", "a"], &a_flags, KEY);
    // The same keys in both regions (an operator's Terraform or `zl admin` does this), two of them bound.
    for (tls, orch) in [(dir_a.path(), a.orch.admin), (dir_b.path(), b.orch.admin)] {
        admin(tls, orch, &["keys", "create", "bound-a", "--project", "p", "--secret", BOUND_A, "--regions", "a"]);
        // `keys ensure` (what deploy jobs run every time): creates, then only sets the regions.
        let out =
            admin(tls, orch, &["keys", "ensure", "bound-b", "--project", "p", "--secret", BOUND_B, "--regions", "a"]);
        assert!(out.contains("created"), "{out}");
        let out =
            admin(tls, orch, &["keys", "ensure", "bound-b", "--project", "p", "--secret", BOUND_B, "--regions", "b"]);
        assert!(out.contains("exists; regions set"), "{out}");
        let listed = admin(tls, orch, &["keys", "list"]);
        assert!(listed.contains("bound-a\tp\ta") && listed.contains("k\tp\tany region"), "{listed}");
    }

    // Served where it arrives.
    let r = until("a serves", || ask(a.http, KEY, false, &[]), |r| r.status == 200);
    assert_eq!(region(&r), "a", "{}", r.body);
    let r = until("a serves bound-a", || ask(a.http, BOUND_A, false, &[]), |r| r.status == 200);
    assert_eq!(region(&r), "a");
    assert_eq!(region(&ask(b.http, KEY, false, &[])), "b");
    // A key bound to b is refused at a, naming both regions (once a's frontend has synced the key).
    let r = until("bound-b refused at a", || ask(a.http, BOUND_B, false, &[]), |r| r.status == 403);
    assert!(
        r.body.contains("permission_error") && r.body.contains("region b") && r.body.contains("region a"),
        "{}",
        r.body
    );
    // A client's preference for b is honoured while a is healthy.
    let r = ask(a.http, KEY, false, &[("x-zl-region", "b")]);
    assert_eq!((r.status, region(&r)), (200, "b"), "{}", r.body);
    // The internal hop headers are ignored from a client: no request id of its choosing, no bypass of spillover,
    // and at b a forged hop is an ordinary request that needs its own API key.
    let forged = [("x-zl-hop", "1"), ("x-zl-request-id", "req_chosenbytheclient")];
    let r = ask(a.http, KEY, false, &forged);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ne!(r.header("request-id"), Some("req_chosenbytheclient"));
    let anonymous =
        serde_json::json!({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]});
    let r = request(b.http, "POST", "/v1/messages", &forged, &anonymous.to_string()).unwrap();
    assert_eq!(r.status, 401, "a forged hop without a key: {}", r.body);

    // Over HTTPS: b gets a frontend with a public certificate for localhost (from a CA of its own), a gets a
    // frontend whose peer b is that one (https, --peer-ca-file); the hop and `zl bench --ca-file` both verify it.
    let public = tempfile::tempdir().unwrap();
    let pub_dir = public.path().to_str().unwrap();
    assert!(zl_e2e::zl(&["certs", "init", "--out", pub_dir]).status.success());
    let issued = zl_e2e::zl(&[
        "certs",
        "issue",
        "--ca-dir",
        pub_dir,
        "--role",
        "frontend",
        "--node-id",
        "api",
        "--san",
        "localhost",
    ]);
    assert!(issued.status.success(), "{}", String::from_utf8_lossy(&issued.stderr));
    let (cert, key, ca) =
        (public.path().join("frontend-api.pem"), public.path().join("frontend-api.key"), public.path().join("ca.pem"));
    let (_b_https, b_https) = zl_e2e::start_frontend_args(
        dir_b.path(),
        "fe-0",
        &[b.orch.quic],
        &[
            "--region",
            "b",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--hop-key-file",
            hk,
        ],
    );
    let peer_https = format!("b=https://localhost:{}", b_https.port());
    let (_a_https, a_https) = zl_e2e::start_frontend_args(
        dir_a.path(),
        "fe-0",
        &[a.orch.quic],
        &["--region", "a", "--peer-region", &peer_https, "--peer-ca-file", ca.to_str().unwrap(), "--hop-key-file", hk],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while zl_e2e::http(a_https, "GET", "/healthz", &[], "").is_none() {
        assert!(Instant::now() < deadline, "the second frontend of a never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    until(
        "a spills to b over https",
        || ask(a_https, KEY, true, &[("x-zl-region", "b")]),
        |r| r.status == 200 && region(r) == "b" && r.body.contains("message_stop"),
    );
    let out = public.path().join("bench");
    let run = zl_e2e::zl(&[
        "bench",
        "--url",
        &format!("https://localhost:{}", b_https.port()),
        "--ca-file",
        ca.to_str().unwrap(),
        "--api-key",
        KEY,
        "--model",
        MODEL,
        "--requests",
        "2",
        "--output-tokens",
        "4",
        "--quiet",
        "--no-plots",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

    // a loses its only worker: requests at a are served by b, streamed through, without a client error.
    let wa = a.workers[0].take().unwrap();
    let (wa_quic, wa_metrics) = (wa.quic, wa.metrics);
    drop(wa);
    let mut seen_b = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen_b < 3 {
        assert!(Instant::now() < deadline, "a never spilled to b");
        let r = ask(a.http, KEY, seen_b % 2 == 1, &[]);
        assert_eq!(r.status, 200, "a client saw an error while a's worker was gone: {}", r.body);
        if region(&r) == "b" {
            seen_b += 1;
            if r.body.starts_with("event:") {
                assert!(r.body.contains("event: message_stop"), "{}", r.body);
            }
        }
    }
    // The hops reused their connections to b (a connection goes back to the pool when its answer has been read).
    let scrape = zl_e2e::frontend_metrics(a.http);
    let reused: f64 = scrape
        .lines()
        .filter(|l| l.starts_with("zl_frontend_spill_connections_total{") && l.contains("reused=\"true\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(reused >= 1.0, "no spilled request reused a connection:\n{scrape}");
    // A key bound to a does not leave: a's own 529.
    let r = ask(a.http, BOUND_A, false, &[]);
    assert_eq!(r.status, 529, "{}", r.body);
    assert_eq!(region(&r), "a");
    assert!(r.body.contains("overloaded_error"), "{}", r.body);

    // a's worker comes back: traffic returns to a.
    let wa = start_worker_args(dir_a.path(), "wa", &[a.orch.quic], (wa_quic, wa_metrics), &["--region", "a"]);
    a.workers[0] = Some(wa);
    until("traffic returns to a", || ask(a.http, KEY, false, &[]), |r| r.status == 200 && region(r) == "a");
    until("bound-a served at a again", || ask(a.http, BOUND_A, false, &[]), |r| r.status == 200);

    // A dead peer costs one failed attempt per backoff, not one per request: with b's frontend gone, a request at
    // a preferring b is served by a.
    drop(b);
    let r = ask(a.http, KEY, false, &[("x-zl-region", "b")]);
    assert_eq!((r.status, region(&r)), (200, "a"), "{}", r.body);
    // /readyz shows the region, its peers and the one backing off.
    let (_, ready) = zl_e2e::http(a.http, "GET", "/readyz", &[], "").unwrap();
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(ready["region"], serde_json::json!({"local": "a", "peers": ["b"], "backing_off": ["b"]}), "{ready}");
}

/// Start `zl up` as region `region` through the Consul agent at `consul`, with `env`; waits until it serves.
fn up_in(dir: &std::path::Path, region: &str, consul: SocketAddr, env: &[(&str, &str)]) -> (zl_e2e::Proc, SocketAddr) {
    let consul = consul.to_string();
    let args = ["--region", region, "--discovery", "consul", "--consul-addr", &consul];
    let (up, http, _) = zl_e2e::zl_up(dir, region, KEY, &args, env);
    (up, http)
}

/// Peer regions from Consul: two datacenters joined over the WAN, one region each; region a's frontend finds b's
/// frontend in datacenter b (no --peer-region) and a preference for b is served there.
#[test]
fn peer_regions_are_found_in_consuls_other_datacenters() {
    let dir = tempfile::tempdir().unwrap();
    let agent_a = zl_e2e::consul::ConsulAgent::start("datacenter = \"a\"\n");
    let agent_b =
        zl_e2e::consul::ConsulAgent::start(&format!("datacenter = \"b\"\nretry_join_wan = [\"{}\"]\n", agent_a.wan));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !agent_a.get("/v1/catalog/datacenters").is_some_and(|r| r.body.contains("\"b\"")) {
        assert!(Instant::now() < deadline, "the datacenters never joined: {}", agent_b.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let hop_key = dir.path().join("hop.key");
    std::fs::write(&hop_key, "a-hop-key-shared-by-every-region-0123456789").unwrap();
    let hk = hop_key.to_str().unwrap();
    let (mut up_b, _) = up_in(dir.path(), "b", agent_b.http, &[("ZL_HOP_KEY_FILE", hk)]);
    // Only the allowed regions are taken, and plain http peers only on an explicit opt-in (this test bed is http).
    let env = [
        ("ZL_PEER_REGIONS_FROM_CONSUL", "true"),
        ("ZL_PEER_REGION_ALLOW", "b"),
        ("ZL_PEER_INSECURE_HTTP", "true"),
        ("ZL_HOP_KEY_FILE", hk),
    ];
    let (mut up_a, http_a) = up_in(dir.path(), "a", agent_a.http, &env);
    until(
        "a's frontend finds b through consul",
        || ask(http_a, KEY, false, &[("x-zl-region", "b")]),
        |r| r.status == 200 && region(r) == "b",
    );
    assert_eq!(region(&ask(http_a, KEY, false, &[])), "a", "without a preference, a serves");
    assert!(up_a.terminate(Duration::from_secs(30)) && up_b.terminate(Duration::from_secs(30)));
}
