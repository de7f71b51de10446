//! An orchestrator whose Raft storage fails (its data volume fills up) leaves the group for good: it must say so
//! where Kubernetes and Prometheus look. Its liveness fails (the kubelet restarts it), it stops claiming to lead,
//! and the fatal error is counted (`ZerolayerRaftFatal` alerts on it).
//!
//! The data dir is a 4 MiB tmpfs this test mounts (CI runs as root) and then fills.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use zl_e2e::{admin_as, certs, gauge, http, metric_sum, metrics, start_orchestrator};

/// A small tmpfs mounted at a temporary dir, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount runs");
        assert!(ok.success(), "mounting a tmpfs needs root (CI runs as root)");
        SmallDisk { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// Write one file until the disk is full.
    fn fill(&self) {
        let mut f = std::fs::File::create(self.dir.path().join("ballast")).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn healthz(addr: std::net::SocketAddr) -> Option<u16> {
    http(addr, "GET", "/healthz", &[], "").map(|r| r.0)
}

fn until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_full_data_volume_fails_liveness_and_clears_the_leader_gauge() {
    let tls = tempfile::tempdir().unwrap();
    certs(tls.path(), &[("orchestrator", "o1"), ("admin", "ops")]);
    let disk = SmallDisk::mount("4m");
    let data = disk.path();
    let data = data.to_str().unwrap();
    let mut o = start_orchestrator(tls.path(), "o1", &["--data-dir", data]);
    until(Duration::from_secs(20), "the orchestrator leads", || {
        metrics(o.metrics).and_then(|m| gauge(&m, "zl_raft_is_leader")) == Some(1.0)
    });
    assert_eq!(healthz(o.metrics), Some(200));

    disk.fill();
    // Writes now fail to reach the log: the Raft task stops.
    let write = |i: u32| {
        let project = format!("p{i}");
        admin_as(tls.path(), "ops", o.admin, &["project", &project, "--rpm", "10"]);
    };
    let mut i = 0;
    until(Duration::from_secs(30), "liveness fails once the Raft storage fails", || {
        i += 1;
        write(i);
        healthz(o.metrics) == Some(503)
    });
    let m = metrics(o.metrics).unwrap();
    assert_eq!(gauge(&m, "zl_raft_is_leader"), Some(0.0), "it leads nothing any more");
    assert_eq!(gauge(&m, "zl_raft_up"), Some(0.0));
    assert!(metric_sum(&m, "zl_raft_fatal_errors_total") >= 1.0);
    let (status, body) = http(o.metrics, "GET", "/readyz", &[], "").unwrap();
    assert_eq!(status, 503, "{body}");
    o.proc.terminate(Duration::from_secs(5));
}
