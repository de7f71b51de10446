//! One identity per node (docs/operations.md, "Node identity"): pods named at random enroll with their role's
//! bootstrap credential for a certificate of their own, against a real orchestrator, and serve with it; the
//! bootstrap credential can take over no node, and no node can speak for another.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use zl_e2e::{admin, certs, http, start_frontend_args, start_orchestrator, start_worker_args, zl};
use zl_e2e::{free_tcp, free_udp};
use zl_node::enroll::{IdentitySource, enroll, identity};
use zl_proto::quic::{CallError, Client, RpcSettings};
use zl_tls::TlsIdentity;
use zl_tls::enroll::bootstrap_id;
use zl_wire::message::{DeregisterWorker, ErrorCode, Message, NodeId, Role};

const WORKER: &str = "zl-worker-cpu-7d9f8c6b5-x2x9z";
const FRONTEND: &str = "zl-frontend-5c7d-8kq2p";

fn refused(result: Result<Message, CallError>) -> String {
    match result {
        Err(CallError::Remote(e)) if e.code == ErrorCode::PermissionDenied => e.message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn pods_enroll_for_identities_of_their_own_and_cannot_take_over_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    certs(&tls, &[("orchestrator", "orch-0"), ("admin", "ops")]);
    let t = tls.to_str().unwrap();
    for role in ["worker", "frontend"] {
        assert!(zl(&["certs", "issue", "--ca-dir", t, "--role", role, "--bootstrap"]).status.success());
    }
    let ca_key = tls.join("ca.key");
    let mut orch = start_orchestrator(&tls, "orch-0", &["--enroll-ca-key", ca_key.to_str().unwrap()]);
    let (wdir, fdir) = (dir.path().join("worker-identity"), dir.path().join("frontend-identity"));
    let worker_flags = ["--identity-dir", wdir.to_str().unwrap()];
    let mut worker = start_worker_args(&tls, WORKER, &[orch.quic], (free_udp(), free_tcp()), &worker_flags);
    let frontend_flags = ["--identity-dir", fdir.to_str().unwrap()];
    let (mut frontend, http_addr) = start_frontend_args(&tls, FRONTEND, &[orch.quic], &frontend_flags);
    let deadline = Instant::now() + Duration::from_secs(240);
    while !zl_e2e::serving(http_addr) {
        orch.proc.assert_running("zl-orchestrator");
        worker.proc.assert_running("zl-worker");
        frontend.assert_running("zl-frontend");
        assert!(Instant::now() < deadline, "the enrolled worker and frontend never became ready");
        std::thread::sleep(Duration::from_millis(300));
    }
    // Each kept its own key, owner-only, in its identity directory; no key was shared.
    let key = wdir.join(format!("worker-{WORKER}.key"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    }
    assert_ne!(std::fs::read(&key).unwrap(), std::fs::read(tls.join("bootstrap-worker.key")).unwrap());

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let at = [orch.quic.to_string()];
        let boot = |role: Role| {
            let stem = format!("bootstrap-{}", role.name());
            TlsIdentity::from_files(
                &tls.join("ca.pem"),
                &tls.join(format!("{stem}.pem")),
                &tls.join(format!("{stem}.key")),
                Role::Bootstrap,
                bootstrap_id(role),
            )
            .unwrap()
        };
        let worker_id = NodeId::new(WORKER).unwrap();
        // The stolen bootstrap credential cannot enroll a running node's id again, nor another role's.
        let err = enroll(&boot(Role::Worker), &at, Role::Worker, &worker_id).await.unwrap_err().to_string();
        assert!(err.contains("refused") && err.contains("enrolled already"), "{err}");
        let err = enroll(&boot(Role::Worker), &at, Role::Frontend, &NodeId::new("fe-new").unwrap()).await;
        assert!(err.unwrap_err().to_string().contains("may not ask"));
        // It gets no further than a certificate request.
        let bootstrap = Client::new(&boot(Role::Worker), RpcSettings::default()).unwrap();
        let leave = Message::DeregisterWorker(DeregisterWorker { worker_id: worker_id.clone(), reason: "x".into() });
        let err = refused(bootstrap.call(orch.quic, Role::Orchestrator, leave.clone()).await);
        assert!(err.contains("may only enroll"), "{err}");

        // A new pod enrolls a new id, and its certificate speaks for that id alone.
        let other = tempfile::tempdir().unwrap();
        let src = IdentitySource { tls_dir: &tls, state_dir: Some(other.path()), orchestrators: &at };
        let impostor = identity(&src, Role::Worker, "zl-worker-cpu-7d9f8c6b5-zzzzz").await.unwrap();
        let impostor = Client::new(&impostor, RpcSettings::default()).unwrap();
        let err = refused(impostor.call(orch.quic, Role::Orchestrator, leave).await);
        assert!(err.contains("may not speak for worker"), "{err}");

        // The frontend renews with its own certificate (never with another's).
        let kept = IdentitySource { tls_dir: &tls, state_dir: Some(&fdir), orchestrators: &[] };
        let own = identity(&kept, Role::Frontend, FRONTEND).await.expect("a restart loads the kept certificate");
        let renewed = enroll(&own, &at, Role::Frontend, &NodeId::new(FRONTEND).unwrap()).await;
        assert!(renewed.is_ok(), "{renewed:?}");
        let err = enroll(&own, &at, Role::Frontend, &NodeId::new("zl-frontend-other").unwrap()).await;
        assert!(err.unwrap_err().to_string().contains("may not ask"));
    });

    // A restarted worker serves with the certificate it kept (it does not enroll again, which would be refused).
    worker.proc.terminate(Duration::from_secs(30));
    let mut worker = start_worker_args(&tls, WORKER, &[orch.quic], (free_udp(), free_tcp()), &worker_flags);
    let metrics_deadline = Instant::now() + Duration::from_secs(240);
    loop {
        worker.proc.assert_running("the restarted zl-worker");
        let ready = http(worker.metrics, "GET", "/readyz", &[], "").map(|r| r.0);
        if ready == Some(200) {
            break;
        }
        assert!(Instant::now() < metrics_deadline, "the restarted worker never registered again");
        std::thread::sleep(Duration::from_millis(300));
    }

    // The frontend's pod loses its volume: with its identity gone it cannot enroll its id again (it exits, and
    // would crash-loop), until an operator forgets the old node; then it enrolls and serves.
    frontend.terminate(Duration::from_secs(30));
    std::fs::remove_dir_all(&fdir).unwrap();
    let (mut lost, _) = start_frontend_args(&tls, FRONTEND, &[orch.quic], &frontend_flags);
    let status = wait_exit(&mut lost, Duration::from_secs(60));
    assert!(!status.success(), "a frontend whose id is enrolled already cannot enroll again");
    let out = admin(&tls, orch.admin, &["forget-node", "frontend", FRONTEND]);
    assert!(out.contains("may enroll again"), "{out}");
    let state = admin(&tls, orch.admin, &["state"]);
    assert!(state.contains("forget_node"), "the admin log records who forgot it: {state}");
    let (mut back, http_addr) = start_frontend_args(&tls, FRONTEND, &[orch.quic], &frontend_flags);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !zl_e2e::serving(http_addr) {
        back.assert_running("the re-enrolled zl-frontend");
        assert!(Instant::now() < deadline, "the forgotten frontend never enrolled again");
        std::thread::sleep(Duration::from_millis(300));
    }
    worker.proc.terminate(Duration::from_secs(30));
}

fn wait_exit(p: &mut zl_e2e::Proc, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the process did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
