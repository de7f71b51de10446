//! A real Consul agent for the discovery tests: `consul agent -dev` (Consul 1.8.7, which `scripts/install-consul`
//! puts in `.tools/`; `ZL_CONSUL` names another binary) on loopback ports of its own, killed when dropped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{HttpResponse, Proc, free_tcp, free_tcp_udp, request};

/// A running dev-mode agent.
#[derive(Debug)]
pub struct ConsulAgent {
    /// The process.
    pub proc: Proc,
    /// Its HTTP API.
    pub http: SocketAddr,
    /// Its HTTPS API, when started with one.
    pub https: Option<SocketAddr>,
    /// Its WAN gossip address (what another datacenter's `retry_join_wan` names).
    pub wan: SocketAddr,
    dir: tempfile::TempDir,
}

fn spawn(dir: &std::path::Path) -> Proc {
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(dir.join("agent.log")).expect("the agent's log");
    let child = Command::new(binary())
        .args(["agent", "-dev", "-node", "zl-test", "-config-file"])
        .arg(dir.join("agent.hcl"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log)
        .spawn()
        .expect("consul could not be started");
    Proc(child)
}

/// The ACL policy `docs/discovery.md` gives the tier whose service is `service` (the `hcl` block whose first line
/// is `# SERVICE`), so the tests run with exactly what the documentation tells operators.
pub fn documented_policy(service: &str) -> String {
    let blocks = crate::code_blocks("docs/discovery.md", "hcl");
    blocks
        .into_iter()
        .find(|b| b.lines().next().is_some_and(|l| l.trim() == format!("# {service}")))
        .unwrap_or_else(|| panic!("docs/discovery.md has no ACL policy for {service}"))
}

/// The Consul binary: `$ZL_CONSUL`, else the one `scripts/install-consul` installed. Panics with instructions
/// when it is missing, since a test that silently skips proves nothing.
pub fn binary() -> PathBuf {
    let path = std::env::var_os("ZL_CONSUL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/consul/usr/bin/consul"));
    assert!(path.is_file(), "{} is missing: run scripts/install-consul (scripts/test does)", path.display());
    path
}

impl ConsulAgent {
    /// Start `consul agent -dev` with `extra_hcl` added to its configuration, and wait (bounded) for its leader.
    pub fn start(extra_hcl: &str) -> ConsulAgent {
        ConsulAgent::start_with(extra_hcl, false)
    }

    /// [`ConsulAgent::start`], with an HTTPS port as well when `https` (`extra_hcl` then names the certificates).
    pub fn start_with(extra_hcl: &str, https: bool) -> ConsulAgent {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (http, server, lan, wan) = (free_tcp(), free_tcp(), free_tcp_udp(), free_tcp_udp());
        let https = https.then(free_tcp);
        let config = dir.path().join("agent.hcl");
        let https_port = https.map(|a| format!("  https = {}\n", a.port())).unwrap_or_default();
        let hcl = format!(
            "bind_addr = \"127.0.0.1\"\nclient_addr = \"127.0.0.1\"\n\
             ports {{\n  http = {}\n{https_port}  server = {}\n  serf_lan = {}\n  serf_wan = {}\n  dns = -1\n  grpc = -1\n}}\n{extra_hcl}",
            http.port(),
            server.port(),
            lan.port(),
            wan.port()
        );
        std::fs::write(&config, hcl).expect("writing the agent's config");
        let proc = spawn(dir.path());
        let mut agent = ConsulAgent { proc, http, https, wan, dir };
        agent.wait_for_leader();
        if extra_hcl.contains("acl") {
            agent.wait_for_acls();
        }
        agent
    }

    /// A freshly elected server answers ACL writes with "the ACL system is currently in legacy mode" for a moment
    /// after it elects itself: wait (bounded) until it has left that mode.
    fn wait_for_acls(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.proc.assert_running("consul agent");
            if self.get("/v1/acl/policies").is_some_and(|r| !r.body.contains("legacy mode")) {
                return;
            }
            assert!(Instant::now() < deadline, "consul's ACL system never left legacy mode: {}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_for_leader(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.proc.assert_running("consul agent");
            if self.get("/v1/status/leader").is_some_and(|r| r.status == 200 && r.body.contains(':')) {
                return;
            }
            assert!(Instant::now() < deadline, "consul never elected itself: {}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stop the agent (SIGKILL: it leaves nothing behind, as a crashed agent would not).
    pub fn stop(&mut self) {
        let _ = self.proc.0.kill();
        let _ = self.proc.0.wait();
    }

    /// Start it again on the same ports, with the same configuration and, being a dev agent, an empty state.
    pub fn restart(&mut self) {
        self.stop();
        self.proc = spawn(self.dir.path());
        self.wait_for_leader();
    }

    /// `GET path` on the agent's HTTP API.
    pub fn get(&self, path: &str) -> Option<HttpResponse> {
        self.get_as("", path)
    }

    /// `GET path` with an ACL token (none when empty).
    pub fn get_as(&self, token: &str, path: &str) -> Option<HttpResponse> {
        let headers: &[(&str, &str)] = if token.is_empty() { &[] } else { &[("x-consul-token", token)] };
        request(self.http, "GET", path, headers, "")
    }

    /// `PUT path` with a body.
    pub fn put(&self, path: &str, body: &[u8]) -> Option<HttpResponse> {
        self.put_as("", path, body)
    }

    /// `PUT path` with a body and an ACL token (none when empty). An ACL write a fresh server refuses because its
    /// ACL system is still in legacy mode (for a moment after it elects itself; an unauthenticated look cannot
    /// tell) is sent again until it leaves that mode (bounded): the write itself is the readiness probe.
    pub fn put_as(&self, token: &str, path: &str, body: &[u8]) -> Option<HttpResponse> {
        let mut headers = vec![("content-type", "application/json")];
        if !token.is_empty() {
            headers.push(("x-consul-token", token));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = request(self.http, "PUT", path, &headers, &String::from_utf8_lossy(body));
            let legacy = r.as_ref().is_some_and(|r| r.status == 500 && r.body.contains("legacy mode"));
            if !legacy || !path.starts_with("/v1/acl/") || Instant::now() > deadline {
                return r;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The agent's directory (its config and log; put certificates here).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// What the agent logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }
}
