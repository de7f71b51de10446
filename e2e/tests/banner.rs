//! What `zl up` prints runs as printed: every command of its banner (the zl commands, curl, and the Python SDK
//! line, its `python3` being the venv's, where the SDK is installed), in the default data dir and in a custom one.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "sk-zl-e2e-banner-0123456789abcdef";

/// The commands of the banner in `out` (zl up's stdout): each `zl ...` line without its explanation, the curl
/// command with its continuation lines, and the python line.
fn commands(out: &str) -> Vec<String> {
    let zl = zl_e2e::bin("zl").display().to_string();
    let mut found = Vec::new();
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with(&zl) {
            // `zl chat --data-dir D             (a streaming chat ...)`: the command ends where the note begins.
            found.push(line.split("   (").next().unwrap().trim().to_owned());
        } else if line.starts_with("curl ") {
            let mut cmd = String::new();
            while lines[i].ends_with('\\') {
                cmd.push_str(lines[i].trim_end_matches('\\'));
                i += 1;
            }
            cmd.push_str(lines[i]);
            found.push(cmd);
        } else if line.starts_with("python3 -c ") {
            found.push(line.replacen("python3", &zl_e2e::python().display().to_string(), 1));
        }
        i += 1;
    }
    found
}

fn run_banner(dir: &Path, name: &str, env: &[(&str, &str)]) {
    let (mut up, _http, _state) = zl_e2e::zl_up(dir, name, KEY, &[], env);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = String::new();
    while !out.contains("Ctrl-C stops the cluster") {
        assert!(Instant::now() < deadline, "no banner: {out}");
        std::thread::sleep(Duration::from_millis(100));
        out = std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default();
    }
    assert!(out.contains("pip install anthropic"), "the Python line says what it needs: {out}");
    // The banner names every process's metrics address, and each serves Prometheus text there.
    let line = out.lines().map(str::trim).find(|l| l.starts_with("metrics ")).expect("a metrics line");
    let addrs: Vec<std::net::SocketAddr> =
        line.split("http://").skip(1).map(|s| s.split('/').next().unwrap().parse().unwrap()).collect();
    assert_eq!(addrs.len(), 3, "the frontend, the orchestrator and the worker: {line}");
    for addr in addrs {
        let (status, body) = zl_e2e::http(addr, "GET", "/metrics", &[], "").unwrap();
        assert!(status == 200 && body.contains("# TYPE"), "{addr}: {status} {body}");
        // Every series is explained: a `# HELP` line for each `# TYPE` (zl_node::metrics_help).
        for name in body.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.split(' ').next().unwrap()) {
            assert!(body.contains(&format!("# HELP {name} ")), "{addr}: no HELP for {name}");
        }
    }
    assert!(out.lines().any(|l| l.trim().starts_with("admin ") && l.contains("orchestrator-0 127.0.0.1:")), "{out}");
    let cmds = commands(&out);
    assert_eq!(cmds.len(), 5, "curl, python and three zl commands: {cmds:?}\n{out}");
    for cmd in cmds {
        let ran =
            Command::new("sh").args(["-c", &cmd]).envs(env.iter().copied()).stdin(Stdio::null()).output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&ran.stdout), String::from_utf8_lossy(&ran.stderr));
        assert!(ran.status.success(), "{cmd}\n{said}");
    }
    up.terminate(Duration::from_secs(30));
}

#[test]
fn every_banner_command_runs_as_printed_with_a_custom_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    run_banner(dir.path(), "custom data dir", &[]);
}

#[test]
fn every_banner_command_runs_as_printed_in_the_default_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    // The default data dir is $XDG_DATA_HOME/zerolayer: zl up given exactly that prints no --data-dir.
    let xdg = dir.path().to_str().unwrap().to_owned();
    run_banner(dir.path(), "zerolayer", &[("XDG_DATA_HOME", &xdg)]);
}
