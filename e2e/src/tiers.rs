//! The cluster's tiers under test: certificates, each tier's process on free ports (orchestrators, workers,
//! frontends), a whole small cluster, `zl up`'s cluster, and the admin command against it.

use std::process::{Command, Output};

use crate::http::http;
use crate::metrics::{metric_sum, metrics};
use crate::ports::{free_tcp, free_udp};
use crate::process::{Proc, bin, zl};

/// A throwaway cluster CA in `dir` and a certificate for each `(role, node id)`.
pub fn certs(dir: &std::path::Path, nodes: &[(&str, &str)]) {
    let d = dir.to_str().expect("a UTF-8 temp dir");
    assert!(zl(&["certs", "init", "--out", d]).status.success(), "zl certs init failed");
    certs_more(dir, nodes);
}

/// Issue more node certificates from the CA `certs` made in `dir`.
pub fn certs_more(dir: &std::path::Path, nodes: &[(&str, &str)]) {
    let d = dir.to_str().expect("a UTF-8 temp dir");
    for (role, id) in nodes {
        let out = zl(&["certs", "issue", "--ca-dir", d, "--role", role, "--node-id", id]);
        assert!(out.status.success(), "zl certs issue {role} {id} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// A QUIC client with the identity `zl certs issue` wrote to `dir` for `role` and node `id`.
pub fn client(dir: &std::path::Path, role: zl_wire::message::Role, id: &str) -> zl_proto::quic::Client {
    let identity = zl_node::load_identity(dir, role, id).expect("the test certificates load");
    zl_proto::quic::Client::new(&identity, zl_proto::quic::RpcSettings::default()).expect("a QUIC client")
}

/// A running `zl-orchestrator` and its addresses.
#[derive(Debug)]
pub struct OrchestratorProc {
    /// The process.
    pub proc: Proc,
    /// QUIC address.
    pub quic: std::net::SocketAddr,
    /// Admin API address.
    pub admin: std::net::SocketAddr,
    /// Prometheus address.
    pub metrics: std::net::SocketAddr,
    /// Its Raft storage (removed when this is dropped), unless `extra` named a `--data-dir`.
    pub data: Option<tempfile::TempDir>,
}

/// Start `zl-orchestrator serve` as node `id` with the certificates in `tls`, on free ports, plus `extra` flags
/// (a fresh temporary `--data-dir` unless `extra` has one).
pub fn start_orchestrator(tls: &std::path::Path, id: &str, extra: &[&str]) -> OrchestratorProc {
    start_orchestrator_at(tls, id, (free_udp(), free_tcp(), free_tcp()), extra)
}

/// [`start_orchestrator`] on given QUIC, admin and metrics addresses (a restart keeps its addresses).
pub fn start_orchestrator_at(
    tls: &std::path::Path,
    id: &str,
    (quic, admin, metrics): (std::net::SocketAddr, std::net::SocketAddr, std::net::SocketAddr),
    extra: &[&str],
) -> OrchestratorProc {
    let (q, a, m) = (quic.to_string(), admin.to_string(), metrics.to_string());
    let mut args = vec!["serve", "--listen", &q, "--admin-listen", &a, "--metrics-addr", &m, "--node-id", id];
    let tls = tls.to_str().expect("a UTF-8 path");
    args.extend(["--tls-dir", tls]);
    let data = if extra.contains(&"--data-dir") { None } else { Some(tempfile::tempdir().expect("a temporary dir")) };
    let data_path = data.as_ref().map(|d| d.path().to_string_lossy().into_owned());
    if let Some(p) = &data_path {
        args.extend(["--data-dir", p]);
    }
    args.extend_from_slice(extra);
    OrchestratorProc { proc: Proc::spawn("zl-orchestrator", &args), quic, admin, metrics, data }
}

/// A running `zl-worker` and its addresses.
#[derive(Debug)]
pub struct WorkerProc {
    /// The process.
    pub proc: Proc,
    /// QUIC address.
    pub quic: std::net::SocketAddr,
    /// Prometheus address.
    pub metrics: std::net::SocketAddr,
}

/// Start `zl-worker serve` (default model, 64 MiB of KV cache, reports every 200 ms) as node `id`, registering and
/// reporting with every orchestrator in `orchestrators` (no `--orchestrator` when it is empty), on the given QUIC
/// and metrics addresses (free ones for a new worker, the old ones to restart it), plus `extra` flags.
pub fn start_worker_args(
    tls: &std::path::Path,
    id: &str,
    orchestrators: &[std::net::SocketAddr],
    (quic, metrics): (std::net::SocketAddr, std::net::SocketAddr),
    extra: &[&str],
) -> WorkerProc {
    let (q, m, o) = (quic.to_string(), metrics.to_string(), addr_list(orchestrators));
    let tls = tls.to_str().expect("a UTF-8 path");
    let mut args = vec![
        "serve",
        "--listen",
        &q,
        "--metrics-addr",
        &m,
        "--node-id",
        id,
        "--tls-dir",
        tls,
        "--kv-memory-mb",
        "64",
        "--report-interval-ms",
        "200",
    ];
    if !orchestrators.is_empty() {
        args.extend(["--orchestrator", &o]);
    }
    args.extend_from_slice(extra);
    WorkerProc { proc: Proc::spawn("zl-worker", &args), quic, metrics }
}

/// [`start_worker_args`] with one orchestrator, on free ports.
pub fn start_worker(tls: &std::path::Path, id: &str, orchestrator: std::net::SocketAddr) -> WorkerProc {
    start_worker_args(tls, id, &[orchestrator], (free_udp(), free_tcp()), &[])
}

/// Start `zl-frontend serve` as node `id` on a free HTTP port, syncing from `orchestrator` every 200 ms.
pub fn start_frontend(
    tls: &std::path::Path,
    id: &str,
    orchestrator: std::net::SocketAddr,
) -> (Proc, std::net::SocketAddr) {
    start_frontend_args(tls, id, &[orchestrator], &[])
}

/// One of each tier as a process on 127.0.0.1: an orchestrator, a worker with the default model and a frontend.
pub struct Tiers {
    /// The orchestrator.
    pub orch: OrchestratorProc,
    /// The worker.
    pub worker: WorkerProc,
    /// The frontend.
    pub frontend: Proc,
    /// The frontend's HTTP address.
    pub http: std::net::SocketAddr,
}

/// Certificates in `dir` (orchestrator orch-0, worker worker-0, frontend fe-0, admin ops), the three tiers started,
/// and a bounded wait until the frontend is ready (the worker has loaded the model and registered).
pub fn start_tiers(dir: &std::path::Path) -> Tiers {
    certs(dir, &[("orchestrator", "orch-0"), ("worker", "worker-0"), ("frontend", "fe-0"), ("admin", "ops")]);
    let mut orch = start_orchestrator(dir, "orch-0", &[]);
    let mut worker = start_worker(dir, "worker-0", orch.quic);
    let (mut frontend, http_addr) = start_frontend(dir, "fe-0", orch.quic);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    loop {
        orch.proc.assert_running("zl-orchestrator");
        worker.proc.assert_running("zl-worker");
        frontend.assert_running("zl-frontend");
        if crate::http::serving(http_addr) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the frontend never became ready");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    Tiers { orch, worker, frontend, http: http_addr }
}

/// Wait (bounded) until the frontend at `http_addr` accepts API key `key` (it learns new keys within its sync
/// interval).
pub fn wait_for_key(http_addr: std::net::SocketAddr, key: &str) {
    let auth = format!("Bearer {key}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while http(http_addr, "GET", "/v1/models", &[("authorization", &auth)], "").map(|r| r.0) != Some(200) {
        assert!(std::time::Instant::now() < deadline, "the frontend never accepted the new key");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// [`start_frontend`] asking every orchestrator in `orchestrators` (the next when one does not answer; no
/// `--orchestrator` when it is empty), plus `extra` flags.
pub fn start_frontend_args(
    tls: &std::path::Path,
    id: &str,
    orchestrators: &[std::net::SocketAddr],
    extra: &[&str],
) -> (Proc, std::net::SocketAddr) {
    let (http, metrics) = (free_tcp(), free_tcp());
    let (h, m, o) = (http.to_string(), metrics.to_string(), addr_list(orchestrators));
    let tls = tls.to_str().expect("a UTF-8 path");
    let mut args = vec!["serve", "--http-addr", &h, "--node-id", id, "--tls-dir", tls, "--sync-interval-ms", "200"];
    if !orchestrators.is_empty() {
        args.extend(["--orchestrator", &o]);
    }
    if !extra.contains(&"--metrics-addr") {
        args.extend(["--metrics-addr", &m]);
        crate::metrics::frontend_at(http, metrics);
    }
    args.extend_from_slice(extra);
    (Proc::spawn("zl-frontend", &args), http)
}

fn addr_list(addrs: &[std::net::SocketAddr]) -> String {
    addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// Run `zl admin ARGS` against `admin` as the admin certificate `node_id` in `tls`, whatever the outcome.
pub fn admin_as(tls: &std::path::Path, node_id: &str, admin: std::net::SocketAddr, args: &[&str]) -> Output {
    let a = admin.to_string();
    let mut all =
        vec!["admin", "--orchestrator", &a, "--tls-dir", tls.to_str().expect("a UTF-8 path"), "--node-id", node_id];
    all.extend_from_slice(args);
    zl(&all)
}

/// Run `zl admin ARGS` against `admin` with the admin certificate `ops` in `tls`; panics if it fails. Returns
/// what it printed.
pub fn admin(tls: &std::path::Path, admin: std::net::SocketAddr, args: &[&str]) -> String {
    let out = admin_as(tls, "ops", admin, args);
    assert!(out.status.success(), "zl admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A small cluster of real processes on 127.0.0.1: one orchestrator, some workers and one frontend, with the API
/// key `key` of a project `p`, ready to serve (every worker healthy, the key accepted).
#[derive(Debug)]
pub struct SmallCluster {
    /// The orchestrator.
    pub orch: OrchestratorProc,
    /// The workers, in the order named (`None` once a test took one away).
    pub workers: Vec<Option<WorkerProc>>,
    /// The frontend.
    pub frontend: Proc,
    /// The frontend's HTTP address.
    pub http: std::net::SocketAddr,
}

/// Issue certificates into `tls` and start a [`SmallCluster`] with workers `worker_ids`, extra `serve` flags for the
/// orchestrator and the frontend; waits (bounded) until it serves.
pub fn small_cluster(
    tls: &std::path::Path,
    worker_ids: &[&str],
    orchestrator_args: &[&str],
    frontend_args: &[&str],
    key: &str,
) -> SmallCluster {
    let mut nodes = vec![("orchestrator", "orch-0"), ("frontend", "fe-0"), ("admin", "ops")];
    nodes.extend(worker_ids.iter().map(|id| ("worker", *id)));
    certs(tls, &nodes);
    let mut orch = start_orchestrator(tls, "orch-0", orchestrator_args);
    let workers = worker_ids.iter().map(|id| Some(start_worker(tls, id, orch.quic))).collect();
    let (mut frontend, http_addr) = start_frontend_args(tls, "fe-0", &[orch.quic], frontend_args);
    let healthy = |orch: &OrchestratorProc| {
        metric_sum(&metrics(orch.metrics).unwrap_or_default(), "zl_workers{state=\"healthy\"}")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    while healthy(&orch) < worker_ids.len() as f64 {
        orch.proc.assert_running("zl-orchestrator");
        frontend.assert_running("zl-frontend");
        assert!(std::time::Instant::now() < deadline, "the workers never all became healthy");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    admin(tls, orch.admin, &["project", "p"]);
    admin(tls, orch.admin, &["keys", "create", "k", "--project", "p", "--secret", key]);
    while http(http_addr, "GET", "/v1/models", &[("x-api-key", key)], "").map(|r| r.0) != Some(200) {
        assert!(std::time::Instant::now() < deadline, "the frontend never accepted the key");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    SmallCluster { orch, workers, frontend, http: http_addr }
}

/// Wait (bounded) for `zl up`'s `cluster.json` in `data` to appear and its API at `http_addr` to be ready; returns
/// the parsed file. Panics with the tail of every log when `up` exits first.
pub fn wait_up(
    data: &std::path::Path,
    http_addr: std::net::SocketAddr,
    up: &mut std::process::Child,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        if let Ok(Some(status)) = up.try_wait() {
            // Everything zl up and its children said, to see which one failed and why.
            let mut said = String::new();
            let parent = data.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
            for dir in [parent, data.to_path_buf(), data.join("logs")] {
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let path = entry.path();
                    if path.is_file() && path.extension().is_some_and(|e| e == "log" || e == "err" || e == "out") {
                        let text = std::fs::read_to_string(&path).unwrap_or_default();
                        let tail: Vec<&str> = text.lines().rev().take(15).collect();
                        said.push_str(&format!("--- {}\n", path.display()));
                        said.extend(tail.into_iter().rev().map(|l| format!("{l}\n")));
                    }
                }
            }
            panic!("zl up exited early: {status}\n{said}");
        }
        if let Ok(text) = std::fs::read_to_string(data.join("cluster.json"))
            && crate::http::serving(http_addr)
        {
            let state: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("cluster.json is not JSON ({e}): {text:?}"));
            let metrics = state["frontends"][0]["metrics"].as_str().and_then(|m| m.parse().ok());
            crate::metrics::frontend_at(http_addr, metrics.expect("cluster.json names the frontend's metrics address"));
            return state;
        }
        assert!(std::time::Instant::now() < deadline, "zl up never became ready");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Start `zl up` with its data dir at `dir/name`, a free HTTP port, API key `key` (none: `zl up`'s own), more
/// `args` and `env`; its
/// stderr goes to `dir/name.err`. Waits (bounded) until it serves; the process, its HTTP address and its
/// `cluster.json`.
pub fn zl_up(
    dir: &std::path::Path,
    name: &str,
    key: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Proc, std::net::SocketAddr, serde_json::Value) {
    let data = dir.join(name);
    let http = free_tcp();
    let stderr = std::fs::File::create(dir.join(format!("{name}.err"))).expect("zl up's stderr file");
    // Its banner, for tests that run what it prints.
    let stdout = std::fs::File::create(dir.join(format!("{name}.out"))).expect("zl up's stdout file");
    let child = Command::new(bin("zl"))
        .args(["up", "--data-dir", data.to_str().expect("a UTF-8 path"), "--http-addr", &http.to_string()])
        .args(if key.is_empty() { vec![] } else { vec!["--api-key", key] })
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("zl up could not be started");
    let mut up = Proc(child);
    let state = wait_up(&data, http, &mut up.0);
    (up, http, state)
}
