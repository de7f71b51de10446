//! Helpers for zerolayer's black-box tests: find the real binaries (built beforehand by `scripts/test`) and run
//! them as processes. The tests build nothing themselves and talk to the processes only over 127.0.0.1.

use std::path::PathBuf;
use std::process::{Command, Output};

pub mod consul;

/// Path of a workspace binary: `$ZL_BIN_DIR/NAME`, else NAME in the profile directory this test was built in
/// (`target/release/` for `cargo nextest run --release`, as `scripts/test` runs, which shares `scripts/up`'s build).
///
/// Panics with instructions when the binary has not been built, since a test that silently skips proves nothing.
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("ZL_BIN_DIR").map(PathBuf::from).unwrap_or_else(profile_dir);
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the binaries first (`cargo build --release --bins`, which scripts/test runs, or \
         `cargo build --bins` for a debug test run)",
        path.display()
    );
    path
}

/// `target/<profile>`: a test executable lives in its `deps/` directory.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    exe.parent().and_then(std::path::Path::parent).map(std::path::Path::to_path_buf).expect("target/<profile>/deps/")
}

/// Run `zl` with `args` and capture its output.
pub fn zl(args: &[&str]) -> Output {
    Command::new(bin("zl")).args(args).output().expect("zl could not be started")
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
            && let Some((200, _)) = http(http_addr, "GET", "/readyz", &[], "")
        {
            return serde_json::from_str(&text).expect("cluster.json is JSON");
        }
        assert!(std::time::Instant::now() < deadline, "zl up never became ready");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Start `zl up` with its data dir at `dir/name`, a free HTTP port, API key `key`, more `args` and `env`; its
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
    let child = Command::new(bin("zl"))
        .args(["up", "--data-dir", data.to_str().expect("a UTF-8 path"), "--http-addr", &http.to_string()])
        .args(["--api-key", key])
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("zl up could not be started");
    let mut up = Proc(child);
    let state = wait_up(&data, http, &mut up.0);
    (up, http, state)
}

/// A child process that is killed (and reaped) when dropped, so a failing test never leaves it running.
#[derive(Debug)]
pub struct Proc(pub std::process::Child);

impl Proc {
    /// Start `bin(name)` with `args`, stdin closed.
    pub fn spawn(name: &str, args: &[&str]) -> Proc {
        let child = Command::new(bin(name))
            .args(args)
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{name} could not be started: {e}"));
        Proc(child)
    }

    /// Panic if the process has exited.
    pub fn assert_running(&mut self, what: &str) {
        if let Ok(Some(status)) = self.0.try_wait() {
            panic!("{what} exited early: {status}");
        }
    }

    /// Send SIGTERM (a graceful stop) and wait up to `timeout` for the exit; returns whether it exited cleanly.
    pub fn terminate(&mut self, timeout: std::time::Duration) -> bool {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                return status.success();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first port handed out, and how many there are: below Linux's ephemeral range (32768-60999), so the kernel
/// never gives one of them to some other test's outgoing connection or `bind(0)` between the moment a test picks
/// it and the moment the process under test binds it (seen: a worker failing with "address already in use").
const PORT_BASE: u16 = 20_000;
const PORT_SPAN: u32 = 12_000;

/// A port no other test process of this machine has been handed recently (a counter shared through a locked file
/// in the temporary directory, wrapping after [`PORT_SPAN`]) that `bind` can bind now.
fn fresh_port(bind: impl Fn(u16) -> std::io::Result<std::net::SocketAddr>) -> std::net::SocketAddr {
    use std::io::{Read, Seek, Write};
    let path = std::env::temp_dir().join("zl-e2e-ports");
    for _ in 0..1000 {
        let n = {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .expect("the port counter file");
            file.lock().expect("lock the port counter");
            let mut text = String::new();
            file.read_to_string(&mut text).expect("read the port counter");
            let n: u32 = text.trim().parse().unwrap_or(0);
            file.set_len(0).expect("truncate the port counter");
            file.rewind().expect("rewind the port counter");
            write!(file, "{}", (n + 1) % PORT_SPAN).expect("write the port counter");
            n
        };
        if let Ok(addr) = bind(PORT_BASE + n as u16) {
            return addr;
        }
    }
    panic!("no free port after 1000 tries");
}

/// A free UDP port on 127.0.0.1 (for QUIC listeners), handed out to no other test.
pub fn free_udp() -> std::net::SocketAddr {
    fresh_port(|port| std::net::UdpSocket::bind(("127.0.0.1", port))?.local_addr())
}

/// A free TCP port on 127.0.0.1 (for HTTP listeners), handed out to no other test.
pub fn free_tcp() -> std::net::SocketAddr {
    fresh_port(|port| std::net::TcpListener::bind(("127.0.0.1", port))?.local_addr())
}

/// A port on 127.0.0.1 free for both TCP and UDP (Consul's gossip listens on both), handed out to no other test.
pub fn free_tcp_udp() -> std::net::SocketAddr {
    fresh_port(|port| {
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port))?;
        std::net::UdpSocket::bind(tcp.local_addr()?)?;
        tcp.local_addr()
    })
}

/// The body of `GET /metrics` from a Prometheus endpoint, or `None` if it is not up.
pub fn metrics(addr: std::net::SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The first sample of metric `name` (any labels) in a Prometheus text body.
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| l.starts_with(name) && !l.starts_with('#')).find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

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

/// An HTTP response read whole.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: String,
}

impl HttpResponse {
    /// The first header of this name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 response whose body is read as it arrives (a stream).
#[derive(Debug)]
pub struct HttpStream {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    reader: std::io::BufReader<std::net::TcpStream>,
    chunked: bool,
    left: usize,
    done: bool,
}

impl HttpStream {
    /// The first header of this name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The next piece of the body (`None` at its end or on an error).
    pub fn next_piece(&mut self) -> Option<String> {
        use std::io::{BufRead, Read};
        if self.done {
            return None;
        }
        if !self.chunked {
            let mut buf = vec![0u8; 4096];
            let n = self.reader.read(&mut buf).ok().filter(|n| *n > 0)?;
            return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        if self.left == 0 {
            let mut line = String::new();
            self.reader.read_line(&mut line).ok()?;
            if line.trim().is_empty() {
                line.clear();
                self.reader.read_line(&mut line).ok()?;
            }
            self.left = usize::from_str_radix(line.trim(), 16).ok()?;
            if self.left == 0 {
                self.done = true;
                return None;
            }
        }
        let mut buf = vec![0u8; self.left];
        self.reader.read_exact(&mut buf).ok()?;
        self.left = 0;
        Some(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The rest of the body.
    pub fn rest(&mut self) -> String {
        let mut out = String::new();
        while let Some(piece) = self.next_piece() {
            out.push_str(&piece);
        }
        out
    }
}

/// Send one HTTP/1.1 request and read the status and headers; the body is left to read.
pub fn http_stream(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<HttpStream> {
    use std::io::{BufRead, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(120))).ok()?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).ok()?;
    let mut reader = std::io::BufReader::new(s);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let status = line.split(' ').nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let Some((k, v)) = line.trim_end().split_once(':') else { break };
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    Some(HttpStream { status, headers, reader, chunked, left: 0, done: false })
}

/// One HTTP/1.1 request, read whole.
pub fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<HttpResponse> {
    let mut stream = http_stream(addr, method, path, headers, body)?;
    let body = stream.rest();
    Some(HttpResponse { status: stream.status, headers: stream.headers, body })
}

/// One HTTP/1.1 request; the status and the body (`None` if nothing answered).
pub fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    request(addr, method, path, headers, body).map(|r| (r.status, r.body))
}

/// Send SIGKILL or SIGTERM (`signal` as `kill` spells it) to a process.
pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill").args([signal, &pid.to_string()]).status();
}

/// Whether a process with this pid exists (and is not a zombie of ours).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// The sum of every sample of metric `name` in a Prometheus text body.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The workspace's Python virtualenv interpreter, with the official SDKs (`scripts/test` installs them).
///
/// Panics with instructions when it is missing, since a test that silently skips proves nothing.
pub fn python() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(".venv").join("bin").join("python");
    assert!(path.is_file(), "{} is missing: run scripts/test, which installs the Python SDKs", path.display());
    path
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

/// Start `zl-worker serve` (default model, 64 MiB of KV cache, reports every 200 ms) as node `id`, registering with
/// `orchestrator`, on the given addresses (free ones for a new worker, the old ones to restart it).
pub fn start_worker_at(
    tls: &std::path::Path,
    id: &str,
    orchestrator: std::net::SocketAddr,
    quic: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
) -> WorkerProc {
    start_worker_with(tls, id, &[orchestrator], quic, metrics)
}

/// [`start_worker_at`] registering and reporting with every orchestrator in `orchestrators`.
pub fn start_worker_with(
    tls: &std::path::Path,
    id: &str,
    orchestrators: &[std::net::SocketAddr],
    quic: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
) -> WorkerProc {
    start_worker_args(tls, id, orchestrators, (quic, metrics), &[])
}

/// [`start_worker_with`] with more `serve` flags (no `--orchestrator` when `orchestrators` is empty).
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

/// [`start_worker_at`] on free ports.
pub fn start_worker(tls: &std::path::Path, id: &str, orchestrator: std::net::SocketAddr) -> WorkerProc {
    start_worker_at(tls, id, orchestrator, free_udp(), free_tcp())
}

/// Start `zl-frontend serve` as node `id` on a free HTTP port, syncing from `orchestrator` every 200 ms.
pub fn start_frontend(
    tls: &std::path::Path,
    id: &str,
    orchestrator: std::net::SocketAddr,
) -> (Proc, std::net::SocketAddr) {
    start_frontend_with(tls, id, &[orchestrator])
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
        if let Some((200, _)) = http(http_addr, "GET", "/readyz", &[], "") {
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

/// [`start_frontend`] asking every orchestrator in `orchestrators` (the next when one does not answer).
pub fn start_frontend_with(
    tls: &std::path::Path,
    id: &str,
    orchestrators: &[std::net::SocketAddr],
) -> (Proc, std::net::SocketAddr) {
    start_frontend_args(tls, id, orchestrators, &[])
}

/// [`start_frontend_with`] with more `serve` flags (no `--orchestrator` when `orchestrators` is empty).
pub fn start_frontend_args(
    tls: &std::path::Path,
    id: &str,
    orchestrators: &[std::net::SocketAddr],
    extra: &[&str],
) -> (Proc, std::net::SocketAddr) {
    let http = free_tcp();
    let (h, o) = (http.to_string(), addr_list(orchestrators));
    let tls = tls.to_str().expect("a UTF-8 path");
    let mut args = vec!["serve", "--http-addr", &h, "--node-id", id, "--tls-dir", tls, "--sync-interval-ms", "200"];
    if !orchestrators.is_empty() {
        args.extend(["--orchestrator", &o]);
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

/// The fenced code blocks of language `lang` in `doc` (a path relative to the workspace root, e.g. `README.md`).
pub fn code_blocks(doc: &str, lang: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // `open`: inside a fence, with the block being collected when its language is `lang`.
    let (mut blocks, mut open): (Vec<String>, Option<Option<String>>) = (Vec::new(), None);
    for line in text.lines() {
        match (open.take(), line.trim_start().strip_prefix("```")) {
            (None, Some(tag)) => open = Some((tag.trim() == lang).then(String::new)),
            (None, None) => {}
            (Some(block), Some(_)) => blocks.extend(block),
            (Some(mut block), None) => {
                if let Some(b) = &mut block {
                    b.push_str(line);
                    b.push('\n');
                }
                open = Some(block);
            }
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    #[test]
    fn code_blocks_are_found_by_language() {
        let python = super::code_blocks("README.md", "python");
        assert!(!python.is_empty() && python.iter().all(|b| b.contains("import ") && !b.contains("```")));
        let shell = super::code_blocks("README.md", "sh");
        assert!(shell.iter().any(|b| b.contains("scripts/up")) && shell.iter().all(|b| !b.contains("import ")));
    }
}
