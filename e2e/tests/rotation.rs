//! Every certificate of a running cluster rotated under load, with no restart: the orchestrator's, the worker's,
//! both frontends' (QUIC), the admin's, and the public HTTPS certificate, each replaced on disk as cert-manager
//! replaces a Secret's files. Each process takes its new certificate within seconds (its
//! `zl_tls_certificate_reloads_total` and `zl_tls_certificate_not_after_seconds` show it), new connections present
//! the new ones (the HTTPS listener's certificate read back over TLS; an admin call and a new worker's QUIC
//! registration handshaken against the rotated orchestrator), and no request fails meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use zl_e2e::{
    admin, certs, free_tcp, free_udp, metric_sum, metrics, python, serving, start_frontend_args, start_orchestrator,
    start_worker_args, zl,
};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-rotation-0123456789abcdef";

/// Issue `role`/`id` from the CA in `tls` into `staging`, then move the pair over the live files (one rename
/// each, as a Secret volume's files change).
fn rotate(tls: &Path, staging: &Path, role: &str, id: &str, extra: &[&str]) {
    let (t, s) = (tls.to_str().unwrap(), staging.to_str().unwrap());
    let mut args = vec!["certs", "issue", "--ca-dir", t, "--out", s, "--role", role, "--node-id", id];
    args.extend_from_slice(&["--days", "30", "--force"]);
    args.extend_from_slice(extra);
    let out = zl(&args);
    assert!(out.status.success(), "zl certs issue {role} {id}: {}", String::from_utf8_lossy(&out.stderr));
    for ext in ["pem", "key"] {
        let name = format!("{role}-{id}.{ext}");
        std::fs::rename(staging.join(&name), tls.join(&name)).unwrap();
    }
}

/// The certificate the TLS server at `addr` presents (PEM), read with Python's ssl module.
fn presented(addr: SocketAddr) -> String {
    let code = format!("import ssl; print(ssl.get_server_certificate(('127.0.0.1', {})))", addr.port());
    let out = std::process::Command::new(python()).args(["-c", &code]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn ask(http: SocketAddr, n: usize) -> u16 {
    zl_e2e::ask_messages(http, KEY, MODEL, &format!("Rotate {n}."))
}

fn reloads(text: &str, cert: &str) -> f64 {
    let line = format!("zl_tls_certificate_reloads_total{{cert=\"{cert}\"}}");
    text.lines().filter(|l| l.starts_with(&line)).map(|l| metric_sum(l, "zl_tls_certificate_reloads_total")).sum()
}

#[test]
fn every_certificate_rotates_under_load_with_no_restart_and_no_failed_request() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let staging = dir.path().join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    certs(
        &tls,
        &[("orchestrator", "o-0"), ("worker", "w-0"), ("frontend", "fe-0"), ("frontend", "fe-1"), ("admin", "ops")],
    );
    // The public certificate of the HTTPS frontend (any CA would do; the cluster's is at hand).
    rotate(&tls, &staging, "frontend", "api", &["--san", "localhost", "--san", "127.0.0.1"]);
    let (https_cert, https_key) = (tls.join("frontend-api.pem"), tls.join("frontend-api.key"));

    let mut orch = start_orchestrator(&tls, "o-0", &[]);
    let mut worker = start_worker_args(&tls, "w-0", &[orch.quic], (free_udp(), free_tcp()), &[]);
    let (mut frontend, http) = start_frontend_args(&tls, "fe-0", &[orch.quic], &[]);
    let fe1_metrics = free_tcp().to_string();
    let https_flags = [
        "--tls-cert",
        https_cert.to_str().unwrap(),
        "--tls-key",
        https_key.to_str().unwrap(),
        "--metrics-addr",
        &fe1_metrics,
    ];
    let (mut https_frontend, https) = start_frontend_args(&tls, "fe-1", &[orch.quic], &https_flags);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !zl_e2e::admin_as(&tls, "ops", orch.admin, &["project", "acme"]).status.success() {
        orch.proc.assert_running("zl-orchestrator");
        assert!(Instant::now() < deadline, "the orchestrator's admin API never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    admin(&tls, orch.admin, &["keys", "create", "main", "--project", "acme", "--secret", KEY]);
    let deadline = Instant::now() + Duration::from_secs(180);
    while !(serving(http) && ask(http, 0) == 200) {
        worker.proc.assert_running("zl-worker");
        frontend.assert_running("zl-frontend");
        assert!(Instant::now() < deadline, "the cluster never served a request");
        std::thread::sleep(Duration::from_millis(250));
    }
    let before = presented(https);

    let stop = Arc::new(AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut statuses = Vec::new();
            for n in 1..5000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                statuses.push(ask(http, n));
                std::thread::sleep(Duration::from_millis(20));
            }
            statuses
        })
    };
    std::thread::sleep(Duration::from_secs(1));

    // Every certificate replaced on disk while requests flow.
    for (role, id) in
        [("orchestrator", "o-0"), ("worker", "w-0"), ("frontend", "fe-0"), ("frontend", "fe-1"), ("admin", "ops")]
    {
        rotate(&tls, &staging, role, id, &[]);
    }
    rotate(&tls, &staging, "frontend", "api", &["--san", "localhost", "--san", "127.0.0.1"]);
    let rotated_https = std::fs::read_to_string(&https_cert).unwrap();

    // Each process takes its own within seconds (it looks every 5 s, and on every handshake).
    let fe1_metrics: SocketAddr = fe1_metrics.parse().unwrap();
    let text_of = |addr: SocketAddr| metrics(addr).unwrap_or_default();
    // (The HTTPS listener looks at its files on handshakes: one is made until it presents the new certificate.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while presented(https) == before {
        assert!(Instant::now() < deadline, "the HTTPS listener never presented the rotated certificate");
        std::thread::sleep(Duration::from_millis(300));
    }
    let waits: [(&dyn Fn() -> String, &str); 5] = [
        (&|| text_of(orch.metrics), "orchestrator-o-0.pem"),
        (&|| text_of(worker.metrics), "worker-w-0.pem"),
        (&|| zl_e2e::frontend_metrics(http), "frontend-fe-0.pem"),
        (&|| text_of(fe1_metrics), "frontend-fe-1.pem"),
        (&|| text_of(fe1_metrics), "frontend-api.pem"),
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    for (text, cert) in waits {
        while reloads(&text(), cert) < 1.0 {
            assert!(Instant::now() < deadline, "{cert} was never taken");
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(text().contains(&format!("zl_tls_certificate_not_after_seconds{{cert=\"{cert}\"}}")), "{cert}");
    }
    // New connections present the new certificates: HTTPS, the admin API (with the rotated admin certificate),
    // and QUIC (a new worker registering, checked by the orchestrator's rotated certificate).
    let now = presented(https);
    let strip = |pem: &str| pem.lines().filter(|l| !l.starts_with("-----")).collect::<String>();
    assert_eq!(strip(&now), strip(rotated_https.split("-----END CERTIFICATE-----").next().unwrap()));
    let workers = admin(&tls, orch.admin, &["workers"]);
    assert!(workers.contains("w-0"), "{workers}");
    zl_e2e::certs_more(&tls, &[("worker", "w-1")]);
    let mut second = start_worker_args(&tls, "w-1", &[orch.quic], (free_udp(), free_tcp()), &[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !admin(&tls, orch.admin, &["workers"]).contains("w-1") {
        second.proc.assert_running("the second zl-worker");
        assert!(Instant::now() < deadline, "a new worker never registered after the rotation");
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(1));

    stop.store(true, Ordering::Relaxed);
    let statuses = client.join().unwrap();
    let failed: Vec<&u16> = statuses.iter().filter(|&&s| s != 200).collect();
    println!("{} requests during the rotation, {} failed", statuses.len(), failed.len());
    assert!(statuses.len() >= 20, "requests flowed: {}", statuses.len());
    assert!(failed.is_empty(), "no request failed: {failed:?}");
    // Nobody restarted.
    orch.proc.assert_running("zl-orchestrator");
    worker.proc.assert_running("zl-worker");
    frontend.assert_running("zl-frontend");
    https_frontend.assert_running("the HTTPS zl-frontend");
}
