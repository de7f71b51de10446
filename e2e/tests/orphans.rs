//! A `zl up` killed outright (SIGKILL: no chance to stop its processes) leaves nothing behind: its orchestrator,
//! worker and frontend notice they were orphaned and shut down within seconds, so their ports are free for the
//! next `zl up`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use zl_e2e::{alive, signal, zl_up};

const KEY: &str = "sk-zl-e2e-orphans-0123456789abcdef";

/// The pids of `pid`'s children.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn a_killed_zl_up_leaves_no_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (up, http, _) = zl_up(dir.path(), "data", KEY, &[], &[]);
    let kids = children(up.0.id());
    assert!(kids.len() >= 3, "an orchestrator, a worker and a frontend: {kids:?}");
    signal(up.0.id(), "-KILL");
    drop(up);
    let deadline = Instant::now() + Duration::from_secs(45);
    while kids.iter().any(|&k| alive(k)) {
        let left: Vec<u32> = kids.iter().copied().filter(|&k| alive(k)).collect();
        if Instant::now() > deadline {
            for k in &left {
                signal(*k, "-KILL");
            }
            panic!("still running 45 s after zl up was killed: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The HTTP port is free again.
    std::net::TcpListener::bind(http).expect("the frontend's port is free");
}
