//! `zl up`'s state as tests read it: its `cluster.json` (the children's names and pids), and waiting for a child
//! its supervision restarts.

use std::time::{Duration, Instant};

use serde_json::Value;

/// `cluster.json` as `zl up` last wrote it in `data`.
pub fn read_state(data: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(data.join("cluster.json")).expect("zl up's cluster.json");
    serde_json::from_str(&text).expect("cluster.json is JSON")
}

/// Every child of `state`: (name, pid).
pub fn pids(state: &Value) -> Vec<(String, u32)> {
    state["pids"]
        .as_array()
        .expect("cluster.json lists pids")
        .iter()
        .map(|p| (p["name"].as_str().unwrap_or_default().to_owned(), p["pid"].as_u64().unwrap_or_default() as u32))
        .collect()
}

/// Wait (bounded) until `cluster.json` shows `name` running under a pid other than `old`; returns it.
pub fn wait_restarted(data: &std::path::Path, name: &str, old: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((_, pid)) = std::fs::read_to_string(data.join("cluster.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|state| pids(&state).into_iter().find(|(n, pid)| n == name && *pid != old))
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "{name} was not restarted");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `zl admin ARGS` against the `zl up` cluster in `data` (must succeed); its standard output.
pub fn up_admin(data: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["admin", "--data-dir", data.to_str().expect("a UTF-8 path")];
    all.extend_from_slice(args);
    let out = crate::process::zl(&all);
    assert!(out.status.success(), "zl admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Create `projects` in the `zl up` cluster in `data`, each with its key (project, key id, secret), and wait until
/// the frontend at `http` takes each key.
pub fn up_projects(data: &std::path::Path, http: std::net::SocketAddr, projects: &[(&str, &str, &str)]) {
    for (project, key_id, key) in projects {
        up_admin(data, &["project", project]);
        up_admin(data, &["keys", "create", key_id, "--project", project, "--secret", key]);
        crate::tiers::wait_for_key(http, key);
    }
}
