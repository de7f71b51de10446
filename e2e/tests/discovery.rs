//! Whole clusters discovering each other through a real Consul agent (1.8.7, `consul agent -dev` on loopback), the
//! same scenario three times: plain HTTP, ACLs on (each tier with a token of only its documented policy), and an
//! HTTPS agent that verifies client certificates. Every process is a real binary; nothing is told any other's
//! address. What is checked: the worker's Meta through Consul's own API; a worker started later served without a
//! restart; a worker Consul holds in maintenance getting no routes though it heartbeats; a drained worker in
//! maintenance, then deregistered; a SIGKILLed worker's routes gone within its TTL; the agent stopped for 10 s and
//! restarted empty under a steady stream of requests: none fails, the outage shows on `/readyz` and in the
//! metrics, and every service is registered again afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use zl_e2e::consul::{ConsulAgent, documented_policy};
use zl_e2e::{
    HttpResponse, admin, certs, free_tcp, free_udp, gauge, http_stream, metric_sum, metrics, request, signal,
    start_frontend_args, start_orchestrator, start_worker_args,
};
use zl_node::consul::WorkerMeta;
use zl_node::consul::catalog::{FRONTEND_SERVICE, Instance, ORCHESTRATOR_SERVICE, WORKER_SERVICE, parse_health};
use zl_tls::ClusterCa;
use zl_wire::message::{NodeId, Role};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-consul-0123456789";
const ROOT: &str = "root-token-for-tests";
const TTL: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Plain,
    Acl,
    Https,
}

/// The agent and what each tier needs to reach it.
struct Setup {
    agent: ConsulAgent,
    variant: Variant,
    dir: PathBuf,
}

/// A fixed UUID per tier: a restarted dev agent is empty, and the harness gives it the same tokens again (as a
/// real, persistent Consul would still have them).
fn token_ids(service: &str) -> (String, String) {
    let n = [WORKER_SERVICE, ORCHESTRATOR_SERVICE, FRONTEND_SERVICE].iter().position(|s| *s == service).unwrap();
    (format!("00000000-0000-4000-8000-00000000010{n}"), format!("00000000-0000-4000-8000-00000000020{n}"))
}

impl Setup {
    fn start(variant: Variant, dir: &Path) -> Setup {
        let agent = match variant {
            Variant::Plain => ConsulAgent::start(""),
            Variant::Acl => ConsulAgent::start(&format!(
                "acl {{\n  enabled = true\n  default_policy = \"deny\"\n  tokens {{\n    master = \"{ROOT}\"\n    agent = \"{ROOT}\"\n  }}\n}}\n"
            )),
            Variant::Https => {
                let ca = ClusterCa::generate("consul test CA", 1).unwrap();
                let names = ["127.0.0.1".to_owned(), "localhost".to_owned()];
                for (file, id) in [("agent", "consul-agent"), ("client", "consul-client")] {
                    let pair = ca.issue(Role::Admin, &NodeId::new(id).unwrap(), &names, 1).unwrap();
                    std::fs::write(dir.join(format!("{file}.pem")), &pair.cert_pem).unwrap();
                    std::fs::write(dir.join(format!("{file}.key")), &pair.key_pem).unwrap();
                }
                std::fs::write(dir.join("ca.pem"), ca.cert_pem()).unwrap();
                let p = |f: &str| dir.join(f).to_string_lossy().into_owned();
                ConsulAgent::start_with(
                    &format!(
                        "cert_file = \"{}\"\nkey_file = \"{}\"\nca_file = \"{}\"\nverify_incoming_https = true\n",
                        p("agent.pem"),
                        p("agent.key"),
                        p("ca.pem")
                    ),
                    true,
                )
            }
        };
        let setup = Setup { agent, variant, dir: dir.to_owned() };
        setup.acl_tokens();
        setup
    }

    /// With ACLs: each tier's documented policy and a token of only that policy, its secret in a file.
    fn acl_tokens(&self) {
        if self.variant != Variant::Acl {
            return;
        }
        for service in [WORKER_SERVICE, ORCHESTRATOR_SERVICE, FRONTEND_SERVICE] {
            let policy = serde_json::json!({"Name": service, "Rules": documented_policy(service)}).to_string();
            let r = self.agent.put_as(ROOT, "/v1/acl/policy", policy.as_bytes()).unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
            let (accessor, secret) = token_ids(service);
            let token =
                serde_json::json!({"AccessorID": accessor, "SecretID": secret, "Policies": [{"Name": service}]});
            let r = self.agent.put_as(ROOT, "/v1/acl/token", token.to_string().as_bytes()).unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
            std::fs::write(self.dir.join(format!("{service}.token")), format!("{secret}\n")).unwrap();
        }
    }

    /// The discovery flags of the tier whose service is `service`.
    fn flags(&self, service: &str) -> Vec<String> {
        let ttl = TTL.as_millis().to_string();
        let mut flags: Vec<String> = vec!["--discovery".into(), "consul".into(), "--consul-ttl-ms".into(), ttl];
        let file = |f: &str| self.dir.join(f).to_string_lossy().into_owned();
        match self.variant {
            Variant::Plain => flags.extend(["--consul-addr".into(), self.agent.http.to_string()]),
            Variant::Acl => flags.extend([
                "--consul-addr".into(),
                self.agent.http.to_string(),
                "--consul-token-file".into(),
                file(&format!("{service}.token")),
            ]),
            Variant::Https => flags.extend([
                "--consul-addr".into(),
                format!("https://{}", self.agent.https.unwrap()),
                "--consul-ca-file".into(),
                file("ca.pem"),
                "--consul-client-cert".into(),
                file("client.pem"),
                "--consul-client-key".into(),
                file("client.key"),
            ]),
        }
        flags
    }

    fn token(&self) -> &'static str {
        if self.variant == Variant::Acl { ROOT } else { "" }
    }

    /// Every instance of `service` Consul lists, passing or not (as an operator reads it).
    fn instances(&self, service: &str) -> Vec<Instance> {
        let r = self.agent.get_as(self.token(), &format!("/v1/health/service/{service}")).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        parse_health(r.body.as_bytes()).unwrap()
    }

    /// The checks of `service` instance `id` as (CheckID, Status, Output).
    fn checks(&self, service: &str, id: &str) -> Vec<(String, String, String)> {
        let r = self.agent.get_as(self.token(), &format!("/v1/health/service/{service}")).unwrap();
        let entries: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        let entry = entries.as_array().unwrap().iter().find(|e| e["Service"]["ID"] == id);
        let Some(entry) = entry else { return vec![] };
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        entry["Checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (s(&c["CheckID"]), s(&c["Status"]), s(&c["Output"])))
            .collect()
    }

    fn put(&self, path: &str) {
        let r = self.agent.put_as(self.token(), path, b"").unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }

    fn restart_agent(&mut self) {
        self.agent.restart();
        self.acl_tokens();
    }
}

fn body(model: &str, max_tokens: u32, content: &str) -> String {
    serde_json::json!({
        "model": model, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

fn ask(http_addr: std::net::SocketAddr, model: &str) -> Option<HttpResponse> {
    request(http_addr, "POST", "/v1/messages", &[("x-api-key", KEY)], &body(model, 4, "Say hi."))
}

/// Poll `f` every 100 ms until it holds; panics after `limit` with `what`. Returns how long it took.
fn until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

/// The bundled model's path (fetched by `scripts/test` before the tests run).
fn default_model_path() -> String {
    let out = std::process::Command::new(zl_e2e::bin("zl-worker")).arg("fetch-default-model").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn discovery_through_consul(variant: Variant) {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    certs(
        &tls,
        &[
            ("orchestrator", "orch-0"),
            ("frontend", "fe-0"),
            ("admin", "ops"),
            ("worker", "worker-a"),
            ("worker", "worker-b"),
        ],
    );
    let mut setup = Setup::start(variant, dir.path());
    let flags = |service: &str| setup.flags(service);

    // Nothing is told any other process's address.
    let orch_flags = flags(ORCHESTRATOR_SERVICE);
    let mut orch = start_orchestrator(&tls, "orch-0", &orch_flags.iter().map(String::as_str).collect::<Vec<_>>());
    let worker_flags = flags(WORKER_SERVICE);
    let worker_args: Vec<&str> = worker_flags.iter().map(String::as_str).collect();
    let mut worker_a = start_worker_args(&tls, "worker-a", &[], (free_udp(), free_tcp()), &worker_args);
    // No response cache: every request below must be routed.
    let mut fe_flags = flags(FRONTEND_SERVICE);
    fe_flags.extend(["--cache-mb".into(), "0".into()]);
    let (mut frontend, http_addr) =
        start_frontend_args(&tls, "fe-0", &[], &fe_flags.iter().map(String::as_str).collect::<Vec<_>>());
    until(Duration::from_secs(240), "worker-a healthy on the orchestrator", || {
        orch.proc.assert_running("zl-orchestrator");
        worker_a.proc.assert_running("zl-worker");
        frontend.assert_running("zl-frontend");
        metric_sum(&metrics(orch.metrics).unwrap_or_default(), "zl_workers{state=\"healthy\"}") >= 1.0
    });
    admin(&tls, orch.admin, &["project", "p"]);
    admin(&tls, orch.admin, &["keys", "create", "k", "--project", "p", "--secret", KEY]);
    until(Duration::from_secs(60), "the frontend serves", || ask(http_addr, MODEL).is_some_and(|r| r.status == 200));

    // The worker's Meta, tags and load note through Consul's own API; the other tiers registered too.
    let workers = setup.instances(WORKER_SERVICE);
    assert_eq!(workers.len(), 1);
    let w = &workers[0];
    assert_eq!((w.id.as_str(), w.port, w.passing), ("worker-a", worker_a.quic.port(), true));
    assert!(w.tags.iter().any(|t| t == "cpu") && w.tags.iter().any(|t| t == MODEL), "{:?}", w.tags);
    let meta = WorkerMeta::decode(&w.meta).unwrap();
    assert_eq!(meta.models.len(), 1);
    assert_eq!((meta.models[0].id.as_str(), meta.models[0].sha256.len()), (MODEL, 12));
    // The bundled Q4_1 model's weights in memory: about 92 MiB, as in its file (f16 scales kept).
    assert!((88 << 20..100 << 20).contains(&meta.models[0].weights_bytes), "{:?}", meta.models[0]);
    assert!(meta.kv_blocks_total > 0 && meta.kv_blocks_free + meta.kv_blocks_cached <= meta.kv_blocks_total);
    assert!((0.0..=1.0).contains(&meta.kv_fragmentation));
    assert_eq!((meta.memory_total_bytes, meta.max_running, meta.device.as_str()), (64 << 20, 32, "cpu"));
    // The load note is the check's output on the agent (the catalog copies an unchanged status's output only
    // every `check_update_interval`, five minutes by default, to spare Raft writes).
    until(Duration::from_secs(5), "the worker's load note on its check", || {
        let r = setup.agent.get_as(setup.token(), "/v1/agent/checks").unwrap();
        let checks: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        let output = checks["service:worker-a"]["Output"].as_str().unwrap_or_default().to_owned();
        output.contains("running") && output.contains("KV blocks")
    });
    let orchestrators = setup.instances(ORCHESTRATOR_SERVICE);
    assert_eq!(orchestrators.len(), 1);
    assert_eq!((orchestrators[0].port, orchestrators[0].meta["raft_id"].as_str()), (orch.quic.port(), "1"));
    until(Duration::from_secs(10), "the frontend registered", || {
        setup.instances(FRONTEND_SERVICE).iter().any(|f| f.id == "fe-0" && f.port == http_addr.port() && f.passing)
    });

    // A worker started later (a second model id over the bundled weights) is served without restarting anything.
    let second = format!("second={}", default_model_path());
    let mut b_args = worker_args.clone();
    b_args.extend(["--model", &second]);
    let start_b = || start_worker_args(&tls, "worker-b", &[], (free_udp(), free_tcp()), &b_args);
    let mut worker_b = start_b();
    let took = until(Duration::from_secs(120), "worker-b served", || {
        worker_b.proc.assert_running("zl-worker b");
        ask(http_addr, "second").is_some_and(|r| r.status == 200)
    });
    eprintln!("worker-b started and served in {took:?}");

    // Consul's word holds: worker-b in maintenance gets no routes though it still heartbeats, and gets them again
    // when it leaves maintenance.
    setup.put("/v1/agent/service/maintenance/worker-b?enable=true&reason=test");
    let mut refusal = None;
    let took = until(Duration::from_secs(5), "no routes to worker-b in maintenance", || {
        refusal = ask(http_addr, "second").filter(|r| r.status != 200);
        refusal.is_some()
    });
    let refusal = refusal.unwrap();
    eprintln!("maintenance took effect in {took:?}: {} {}", refusal.status, refusal.body);
    assert!(refusal.status == 503 || refusal.status == 529, "{} {}", refusal.status, refusal.body);
    assert!(refusal.body.contains("healthy"), "{}", refusal.body);
    worker_b.proc.assert_running("zl-worker b");
    setup.put("/v1/agent/service/maintenance/worker-b?enable=false");
    until(Duration::from_secs(5), "worker-b served again", || {
        ask(http_addr, "second").is_some_and(|r| r.status == 200)
    });

    // Drain: SIGTERM during a long stream puts worker-b in maintenance while the stream finishes, then it
    // deregisters.
    let long = serde_json::json!({
        "model": "second", "max_tokens": 300, "stream": true, "temperature": 0.7, "seed": 3,
        "messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}],
    })
    .to_string();
    let mut stream = http_stream(http_addr, "POST", "/v1/messages", &[("x-api-key", KEY)], &long).unwrap();
    assert_eq!(stream.status, 200);
    let mut seen = String::new();
    while !seen.contains("content_block_delta") {
        seen.push_str(&stream.next_piece().expect("the stream continues"));
    }
    signal(worker_b.proc.0.id(), "-TERM");
    until(Duration::from_secs(5), "worker-b in maintenance while draining", || {
        setup
            .checks(WORKER_SERVICE, "worker-b")
            .iter()
            .any(|c| c.0 == "_service_maintenance:worker-b" && c.1 == "critical")
    });
    let rest = stream.rest();
    assert!(rest.contains("message_stop"), "the drained stream did not finish: {rest}");
    until(Duration::from_secs(30), "worker-b exits", || matches!(worker_b.proc.0.try_wait(), Ok(Some(_))));
    until(Duration::from_secs(5), "worker-b deregistered", || {
        !setup.instances(WORKER_SERVICE).iter().any(|w| w.id == "worker-b")
    });

    // SIGKILL: its routes stop within its TTL, and Consul marks it critical within the TTL too.
    let mut worker_b = start_b();
    until(Duration::from_secs(120), "worker-b served again after its restart", || {
        worker_b.proc.assert_running("zl-worker b");
        ask(http_addr, "second").is_some_and(|r| r.status == 200)
    });
    signal(worker_b.proc.0.id(), "-KILL");
    let killed = Instant::now();
    until(TTL, "no routes to the killed worker", || ask(http_addr, "second").is_some_and(|r| r.status != 200));
    eprintln!("routes to the killed worker stopped after {:?}", killed.elapsed());
    until(TTL + Duration::from_secs(2) - killed.elapsed().min(TTL), "the killed worker critical in consul", || {
        setup.checks(WORKER_SERVICE, "worker-b").iter().any(|c| c.0 == "service:worker-b" && c.1 == "critical")
    });
    eprintln!("consul marked the killed worker critical after {:?}", killed.elapsed());
    let _ = worker_b.proc.0.wait();

    // The agent stopped for 10 s and restarted empty, under a steady stream of requests.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut statuses = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let r = ask(http_addr, MODEL);
                statuses.push(r.map(|r| (r.status, r.body)));
            }
            statuses
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    setup.agent.stop();
    let down = Instant::now();
    until(Duration::from_secs(8), "the frontend says consul is unreachable", || {
        let r = request(http_addr, "GET", "/readyz", &[], "").unwrap();
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        r.status == 200 && v["discovery"]["reachable"] == false && r.header("x-zl-health") == Some("degraded")
    });
    let text = zl_e2e::frontend_metrics(http_addr);
    assert_eq!(gauge(&text, "zl_discovery_up"), Some(0.0), "zl_discovery_up on the frontend");
    std::thread::sleep(Duration::from_secs(10).saturating_sub(down.elapsed()));
    setup.restart_agent();
    let back = until(Duration::from_secs(20), "every service registered again", || {
        let names = |service: &str| {
            setup.instances(service).into_iter().filter(|i| i.passing).map(|i| i.id).collect::<Vec<_>>()
        };
        names(WORKER_SERVICE) == ["worker-a"]
            && names(ORCHESTRATOR_SERVICE) == ["orch-0"]
            && names(FRONTEND_SERVICE) == ["fe-0"]
    });
    eprintln!("every service registered again {back:?} after the agent restarted");
    until(Duration::from_secs(10), "the frontend says consul is reachable", || {
        let r = request(http_addr, "GET", "/readyz", &[], "").unwrap();
        r.body.contains("\"reachable\":true") && r.header("x-zl-health") == Some("healthy")
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let statuses = load.join().unwrap();
    let failed: Vec<_> = statuses.iter().filter(|s| s.as_ref().is_none_or(|(code, _)| *code != 200)).collect();
    eprintln!("{} requests around the outage, {} failed", statuses.len(), failed.len());
    assert!(statuses.len() >= 10, "only {} requests ran during the outage", statuses.len());
    assert!(failed.is_empty(), "{} of {} requests failed around the outage: {failed:?}", failed.len(), statuses.len());
    let text = zl_e2e::frontend_metrics(http_addr);
    assert_eq!(gauge(&text, "zl_discovery_up"), Some(1.0));
    assert!(metric_sum(&text, "zl_discovery_errors_total") > 0.0);
    let orch_text = metrics(orch.metrics).unwrap();
    assert!(metric_sum(&orch_text, "zl_discovery_registrations_total") >= 2.0, "the orchestrator registered again");

    // A clean stop deregisters every tier.
    assert!(frontend.terminate(Duration::from_secs(20)), "zl-frontend did not stop cleanly");
    assert!(worker_a.proc.terminate(Duration::from_secs(60)), "zl-worker did not stop cleanly");
    assert!(orch.proc.terminate(Duration::from_secs(20)), "zl-orchestrator did not stop cleanly");
    for service in [WORKER_SERVICE, ORCHESTRATOR_SERVICE, FRONTEND_SERVICE] {
        assert!(setup.instances(service).is_empty(), "{service} is still registered after a clean stop");
    }
}

#[test]
fn a_cluster_discovers_itself_through_consul() {
    discovery_through_consul(Variant::Plain);
}

#[test]
fn a_cluster_discovers_itself_through_consul_with_acls() {
    discovery_through_consul(Variant::Acl);
}

#[test]
fn a_cluster_discovers_itself_through_an_https_consul_that_verifies_clients() {
    discovery_through_consul(Variant::Https);
}

#[test]
fn zl_up_runs_the_local_cluster_through_a_consul_agent() {
    let agent = ConsulAgent::start("");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let http_addr = free_tcp();
    let log = std::fs::File::create(dir.path().join("up.log")).unwrap();
    let mut up = std::process::Command::new(zl_e2e::bin("zl"))
        .args(["up", "--data-dir", data.to_str().unwrap(), "--http-addr", &http_addr.to_string()])
        .args(["--api-key", KEY, "--workers", "2", "--kv-memory-mb", "64"])
        .args(["--discovery", "consul", "--consul-addr", &agent.http.to_string(), "--consul-ttl-ms", "3000"])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let up_log = || std::fs::read_to_string(dir.path().join("up.log")).unwrap_or_default();
    until(Duration::from_secs(300), "zl up ready", || {
        if let Ok(Some(status)) = up.try_wait() {
            panic!("zl up exited: {status}\n{}", up_log());
        }
        data.join("cluster.json").exists() && ask(http_addr, MODEL).is_some_and(|r| r.status == 200)
    });
    let passing = |service: &str| {
        let r = agent.get(&format!("/v1/health/service/{service}?passing")).unwrap();
        parse_health(r.body.as_bytes()).unwrap().into_iter().map(|i| i.id).collect::<Vec<_>>()
    };
    until(Duration::from_secs(10), "every process registered", || {
        passing(WORKER_SERVICE) == ["worker-0", "worker-1"]
            && passing(ORCHESTRATOR_SERVICE) == ["orchestrator-0"]
            && passing(FRONTEND_SERVICE) == ["frontend-0"]
    });
    signal(up.id(), "-TERM");
    until(Duration::from_secs(60), "zl up stops", || matches!(up.try_wait(), Ok(Some(_))));
    for service in [WORKER_SERVICE, ORCHESTRATOR_SERVICE, FRONTEND_SERVICE] {
        let r = agent.get(&format!("/v1/health/service/{service}")).unwrap();
        assert!(parse_health(r.body.as_bytes()).unwrap().is_empty(), "{service} still registered:\n{}", up_log());
    }
}
