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
    dir: tempfile::TempDir,
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
        let dir = tempfile::tempdir().expect("a temp dir");
        let (http, server, lan, wan) = (free_tcp(), free_tcp(), free_tcp_udp(), free_tcp_udp());
        let config = dir.path().join("agent.hcl");
        let hcl = format!(
            "bind_addr = \"127.0.0.1\"\nclient_addr = \"127.0.0.1\"\n\
             ports {{\n  http = {}\n  server = {}\n  serf_lan = {}\n  serf_wan = {}\n  dns = -1\n  grpc = -1\n}}\n{extra_hcl}",
            http.port(),
            server.port(),
            lan.port(),
            wan.port()
        );
        std::fs::write(&config, hcl).expect("writing the agent's config");
        let log = std::fs::File::create(dir.path().join("agent.log")).expect("the agent's log");
        let child = Command::new(binary())
            .args(["agent", "-dev", "-node", "zl-test", "-config-file"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("consul could not be started");
        let mut agent = ConsulAgent { proc: Proc(child), http, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            agent.proc.assert_running("consul agent");
            if agent.get("/v1/status/leader").is_some_and(|r| r.status == 200 && r.body.contains(':')) {
                return agent;
            }
            assert!(Instant::now() < deadline, "consul never elected itself: {}", agent.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `GET path` on the agent's HTTP API.
    pub fn get(&self, path: &str) -> Option<HttpResponse> {
        request(self.http, "GET", path, &[], "")
    }

    /// `PUT path` with a body.
    pub fn put(&self, path: &str, body: &[u8]) -> Option<HttpResponse> {
        self.put_as("", path, body)
    }

    /// `PUT path` with a body and an ACL token (none when empty).
    pub fn put_as(&self, token: &str, path: &str, body: &[u8]) -> Option<HttpResponse> {
        let mut headers = vec![("content-type", "application/json")];
        if !token.is_empty() {
            headers.push(("x-consul-token", token));
        }
        request(self.http, "PUT", path, &headers, &String::from_utf8_lossy(body))
    }

    /// What the agent logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }
}
