//! `zl certs` writes a CA and node certificates that the wire protocol accepts for mutual TLS, and refuses bad
//! input with a clear message.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use zl_e2e::zl;
use zl_proto::quic::{CallContext, CallError, Client, Handler, Responder, RpcSettings, Server};
use zl_tls::{ClusterCa, TlsIdentity};
use zl_wire::message::{ErrorCode, Message, NodeId, Role, RouteHint, RouteRequest, WireError};

struct Echo;

impl Handler for Echo {
    async fn call(&self, ctx: CallContext, _request: Message, _out: &mut Responder) -> Result<(), WireError> {
        Err(WireError::new(ErrorCode::NotFound, format!("hello {}", ctx.peer.node_id)))
    }
}

fn ok(args: &[&str]) -> String {
    let out = zl(args);
    assert!(out.status.success(), "zl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn version_names_the_wire_protocol() {
    let v = ok(&["version"]);
    assert!(v.starts_with("zl ") && v.contains("wire protocol 1."), "{v}");
}

#[tokio::test]
async fn issued_certificates_authenticate_a_real_quic_call() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    ok(&["certs", "init", "--out", d, "--days", "2"]);
    ok(&["certs", "issue", "--ca-dir", d, "--role", "worker", "--node-id", "worker-0", "--san", "10.1.2.3"]);
    ok(&["certs", "issue", "--ca-dir", d, "--role", "frontend", "--node-id", "fe-0"]);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("worker-worker-0.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "private keys must not be world-readable");
    }
    let load = |role, id: &str, stem: &str| {
        TlsIdentity::from_files(
            &dir.path().join("ca.pem"),
            &dir.path().join(format!("{stem}.pem")),
            &dir.path().join(format!("{stem}.key")),
            role,
            NodeId::new(id).unwrap(),
        )
        .unwrap()
    };
    let worker = load(Role::Worker, "worker-0", "worker-worker-0");
    let frontend = load(Role::Frontend, "fe-0", "frontend-fe-0");
    // A certificate is bound to its role: the worker's files do not load as a frontend identity.
    assert!(
        TlsIdentity::from_files(
            &dir.path().join("ca.pem"),
            &dir.path().join("worker-worker-0.pem"),
            &dir.path().join("worker-worker-0.key"),
            Role::Frontend,
            NodeId::new("worker-0").unwrap(),
        )
        .is_err()
    );

    let server =
        Server::spawn("127.0.0.1:0".parse().unwrap(), &worker, RpcSettings::default(), Arc::new(Echo)).unwrap();
    let client = Client::new(&frontend, RpcSettings::default()).unwrap();
    let request = Message::RouteRequest(RouteRequest {
        request_id: "r".into(),
        model: "m".into(),
        prompt_tokens: 1,
        max_tokens: 1,
        block_hashes: vec![],
        session_id: None,
        hint: RouteHint::None,
        input_semantic_weight: 0.0,
        excluded_workers: vec![],
        trace_id: String::new(),
        prefer_fallback: false,
        project: String::new(),
    });
    match client.call(server.local_addr(), Role::Worker, request.clone()).await {
        Err(CallError::Remote(e)) => assert_eq!(e.message, "hello fe-0"),
        other => panic!("{other:?}"),
    }
    // A node with a certificate from a different CA is refused.
    let stranger =
        TlsIdentity::issue(&ClusterCa::generate("other", 1).unwrap(), Role::Frontend, NodeId::new("fe-0").unwrap())
            .unwrap();
    let stranger = Client::new(&stranger, RpcSettings::default()).unwrap();
    assert!(matches!(stranger.call(server.local_addr(), Role::Worker, request).await, Err(CallError::Connect { .. })));
}

#[test]
fn bootstrap_credentials_are_issued_only_for_the_roles_that_enroll() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    ok(&["certs", "init", "--out", d, "--days", "2"]);
    ok(&["certs", "issue", "--ca-dir", d, "--role", "worker", "--bootstrap"]);
    ok(&["certs", "issue", "--ca-dir", d, "--role", "frontend", "--bootstrap"]);
    assert!(dir.path().join("bootstrap-worker.pem").is_file() && dir.path().join("bootstrap-frontend.key").is_file());
    // Raft members and operators each get a certificate of their own from `zl certs issue`.
    let out = zl(&["certs", "issue", "--ca-dir", d, "--role", "orchestrator", "--bootstrap"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not enrollment"));
    // A bootstrap credential is no node identity of its role.
    assert!(zl_node::load_identity(dir.path(), Role::Worker, "worker").is_err());
}

#[test]
fn bad_input_is_refused_with_a_clear_message_and_nothing_is_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    ok(&["certs", "init", "--out", d]);
    let ca_before = std::fs::read(dir.path().join("ca.key")).unwrap();

    let again = zl(&["certs", "init", "--out", d]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    assert_eq!(std::fs::read(dir.path().join("ca.key")).unwrap(), ca_before);

    let bad_id = zl(&["certs", "issue", "--ca-dir", d, "--role", "worker", "--node-id", "Worker_0"]);
    assert!(!bad_id.status.success());
    assert!(String::from_utf8_lossy(&bad_id.stderr).contains("lowercase DNS label"));

    let bad_role = zl(&["certs", "issue", "--ca-dir", d, "--role", "router", "--node-id", "r0"]);
    assert!(String::from_utf8_lossy(&bad_role.stderr).contains("unknown role"));

    let no_ca = zl(&["certs", "issue", "--ca-dir", "/nonexistent-zl", "--role", "worker", "--node-id", "w0"]);
    assert!(String::from_utf8_lossy(&no_ca.stderr).contains("zl certs init"));
}
