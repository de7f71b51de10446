//! The chart's orchestrator tier scaled 3 -> 5 -> 3 and rolled, replayed on 127.0.0.1 with the release binaries:
//! each pod runs the `config.toml` `helm template` renders for its replica count (addresses and paths mapped to
//! this machine), the StatefulSet's steps are taken in its order (new ordinals start, then the survivors roll from
//! the highest ordinal down, each waiting for the previous to be ready; on a scale-down the pre-upgrade hook's
//! command runs first, then the highest ordinals go), while a writer commits changes and a client sends requests
//! through the frontend. After each step `members list` names exactly the replicas; no acknowledged write is lost,
//! no request fails, no rollout stalls. Last, two pods lose their volumes and rejoin.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zl_e2e::{
    OrchestratorProc, Proc, admin, admin_as, certs, free_tcp, free_udp, request, start_frontend_args, start_worker_args,
};

const MODEL: &str = "smollm2-135m-instruct";
const KEY: &str = "sk-zl-e2e-scaling-0123456789abcdef";
const FULL: &str = "zl-zerolayer";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `helm template` of the chart with `replicas` orchestrators; `show` picks one template.
fn render(replicas: usize, show: &str) -> String {
    let helm = root().join(".tools/helm/helm");
    assert!(helm.is_file(), "{} is missing: run scripts/install-helm (scripts/test does)", helm.display());
    let out = Command::new(helm)
        .args(["template", "zl", "helm/zerolayer", "--namespace", "default", "--show-only", show])
        .args(["--set", &format!("orchestrator.replicas={replicas}")])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The orchestrators' `config.toml` from the rendered ConfigMap.
fn rendered_config(replicas: usize) -> String {
    let yaml = render(replicas, "templates/orchestrator.yaml");
    let start = yaml.find("  config.toml: |\n").expect("the orchestrator ConfigMap") + "  config.toml: |\n".len();
    yaml[start..]
        .lines()
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join("\n")
}

struct Pod {
    ordinal: usize,
    addrs: (SocketAddr, SocketAddr, SocketAddr),
    data: tempfile::TempDir,
    proc: Option<OrchestratorProc>,
}

impl Pod {
    fn name(&self) -> String {
        format!("{FULL}-orchestrator-{}", self.ordinal)
    }
}

struct Fleet {
    dir: tempfile::TempDir,
    pods: Vec<Pod>,
}

impl Fleet {
    fn tls(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    /// The rendered config for `replicas`, as pod `ordinal` on this machine sees it.
    fn config_for(&self, replicas: usize, ordinal: usize) -> PathBuf {
        let mut text = rendered_config(replicas);
        assert!(text.contains("raft-auto-join = true"), "the chart joins new members by itself:\n{text}");
        for p in &self.pods {
            let host =
                format!("{FULL}-orchestrator-{}.{FULL}-orchestrator-peers.default.svc.cluster.local:7001", p.ordinal);
            text = text.replace(&host, &format!("localhost:{}", p.addrs.1.port()));
        }
        let pod = &self.pods[ordinal];
        let (q, a, m) = pod.addrs;
        let tls = self.tls();
        for (from, to) in [
            ("\"0.0.0.0:7000\"", format!("\"{q}\"")),
            ("\"0.0.0.0:7001\"", format!("\"{a}\"")),
            ("\"0.0.0.0:9000\"", format!("\"{m}\"")),
            ("\"/var/lib/zerolayer\"", format!("{:?}", pod.data.path().to_str().unwrap())),
            ("\"/etc/zerolayer/key-pepper/pepper\"", format!("{:?}", self.dir.path().join("pepper").to_str().unwrap())),
            ("\"/etc/zerolayer/enroll/ca.key\"", format!("{:?}", tls.join("ca.key").to_str().unwrap())),
        ] {
            assert!(text.contains(from), "the rendered config has {from}:\n{text}");
            text = text.replace(from, &to);
        }
        assert!(!text.contains("svc.cluster.local"), "every address mapped:\n{text}");
        let path = self.dir.path().join(format!("orchestrator-{ordinal}-{replicas}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Start pod `ordinal` as the StatefulSet with `replicas` does (its name is its node id).
    fn start(&mut self, replicas: usize, ordinal: usize) {
        let config = self.config_for(replicas, ordinal);
        let (name, tls) = (self.pods[ordinal].name(), self.tls());
        let args =
            ["serve", "--config", config.to_str().unwrap(), "--node-id", &name, "--tls-dir", tls.to_str().unwrap()];
        let (quic, admin, metrics) = self.pods[ordinal].addrs;
        let proc = Proc::spawn("zl-orchestrator", &args);
        self.pods[ordinal].proc = Some(OrchestratorProc { proc, quic, admin, metrics, data: None });
    }

    fn stop(&mut self, ordinal: usize) {
        if let Some(mut p) = self.pods[ordinal].proc.take() {
            assert!(p.proc.terminate(Duration::from_secs(10)), "orchestrator {ordinal} stops on SIGTERM");
        }
    }

    fn ready(&self, ordinal: usize) -> bool {
        request(self.pods[ordinal].addrs.2, "GET", "/readyz", &[], "").is_some_and(|r| r.status == 200)
    }

    /// Voting members as `members list` on pod `ordinal` prints them.
    fn voters(&self, ordinal: usize) -> Option<Vec<u64>> {
        let out = admin_as(&self.tls(), "ops", self.pods[ordinal].addrs.1, &["members", "list"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status.success().then(|| {
            text.lines()
                .filter(|l| l.ends_with("leader") || l.ends_with("follower"))
                .filter_map(|l| l.split_whitespace().next()?.parse().ok())
                .collect()
        })
    }

    /// The StatefulSet's wait: every pod in `ordinals` ready and listing voters 1..=replicas (bounded).
    fn await_group(&mut self, ordinals: &[usize], replicas: usize, step: &str) {
        let want: Vec<u64> = (1..=replicas as u64).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = ordinals.iter().all(|&o| self.ready(o));
            let seen: Vec<Option<Vec<u64>>> = ordinals.iter().map(|&o| self.voters(o)).collect();
            if ready && seen.iter().all(|v| v.as_ref() == Some(&want)) {
                return;
            }
            for &o in ordinals {
                self.pods[o].proc.as_mut().unwrap().proc.assert_running("zl-orchestrator");
            }
            assert!(Instant::now() < deadline, "{step}: the rollout stalled (ready {ready}, voters {seen:?})");
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// A rolling update: pods `ordinals` restarted with the config for `replicas`, highest ordinal first, each
    /// ready before the next goes.
    fn roll(&mut self, replicas: usize, step: &str) {
        for o in (0..replicas).rev() {
            self.stop(o);
            self.start(replicas, o);
            self.await_group(&(0..replicas).collect::<Vec<_>>(), replicas, &format!("{step}, ordinal {o} rolled"));
        }
    }

    fn admin_addrs(&self) -> Vec<SocketAddr> {
        self.pods.iter().filter(|p| p.proc.is_some()).map(|p| p.addrs.1).collect()
    }
}

fn ask(http: SocketAddr, n: usize) -> u16 {
    zl_e2e::ask_messages(http, KEY, MODEL, &format!("Count to {n}."))
}

#[test]
fn the_charts_orchestrators_scale_3_to_5_to_3_and_roll_with_no_lost_write_or_failed_request() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let names: Vec<String> = (0..5).map(|o| format!("{FULL}-orchestrator-{o}")).collect();
    let mut nodes: Vec<(&str, &str)> = names.iter().map(|n| ("orchestrator", n.as_str())).collect();
    nodes.extend([("worker", "w-0"), ("frontend", "fe-0"), ("admin", "ops")]);
    certs(&tls, &nodes);
    std::fs::write(dir.path().join("pepper"), "a key pepper of more than thirty-two bytes for the test").unwrap();
    let pods = (0..5)
        .map(|ordinal| Pod {
            ordinal,
            addrs: (free_udp(), free_tcp(), free_tcp()),
            data: tempfile::tempdir().unwrap(),
            proc: None,
        })
        .collect();
    let mut fleet = Fleet { dir, pods };

    // Install: three pods at once (podManagementPolicy Parallel).
    for o in 0..3 {
        fleet.start(3, o);
    }
    fleet.await_group(&[0, 1, 2], 3, "install");
    let a0 = fleet.pods[0].addrs.1;
    admin(&tls, a0, &["project", "acme"]);
    admin(&tls, a0, &["keys", "create", "main", "--project", "acme", "--secret", KEY]);

    // A worker and a frontend that know all five orchestrator addresses (the chart lists every ordinal).
    let quic = fleet.pods.iter().map(|p| format!("localhost:{}", p.addrs.0.port())).collect::<Vec<_>>().join(",");
    let mut worker = start_worker_args(&tls, "w-0", &[], (free_udp(), free_tcp()), &["--orchestrator", &quic]);
    let pepper = fleet.dir.path().join("pepper");
    let frontend_args = ["--orchestrator", &quic, "--key-pepper-file", pepper.to_str().unwrap()];
    let (mut frontend, http) = start_frontend_args(&tls, "fe-0", &[], &frontend_args);
    let deadline = Instant::now() + Duration::from_secs(180);
    while ask(http, 0) != 200 {
        worker.proc.assert_running("zl-worker");
        frontend.assert_running("zl-frontend");
        assert!(Instant::now() < deadline, "the cluster never served a request");
        std::thread::sleep(Duration::from_millis(250));
    }

    // Writes and routed requests flow through every step.
    let stop = Arc::new(AtomicBool::new(false));
    let targets = Arc::new(Mutex::new(fleet.admin_addrs()));
    let writer = {
        let (stop, targets, tls) = (stop.clone(), targets.clone(), tls.clone());
        std::thread::spawn(move || {
            let (mut acked, mut failed, mut retried) = (Vec::new(), Vec::new(), 0usize);
            for n in 0..2000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = format!("w{n}");
                let addrs = targets.lock().unwrap().clone();
                // As the admin Service does: a pod that is not up (being restarted) is passed over. And as a client
                // does with UNAVAILABLE (the write is an idempotent upsert): asked once more, of the next pod.
                let (mut errors, mut taken) = (Vec::new(), false);
                for i in 0..addrs.len() {
                    let at = addrs[(n + i) % addrs.len()];
                    let out = admin_as(&tls, "ops", at, &["project", &name]);
                    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
                    if out.status.success() {
                        taken = true;
                        break;
                    } else if !err.contains("connecting to the admin API") {
                        errors.push(format!("{name} via {at}: {err}"));
                        if errors.len() == 2 {
                            break;
                        }
                    }
                }
                if taken {
                    retried += usize::from(!errors.is_empty());
                    acked.push(name);
                } else {
                    failed.extend(errors);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (acked, failed, retried)
        })
    };
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut statuses = Vec::new();
            // Bounded: the test stops it, and it stops by itself after 2,000 requests.
            for n in 1..2000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                statuses.push(ask(http, n));
                std::thread::sleep(Duration::from_millis(50));
            }
            statuses
        })
    };

    // 3 -> 5: the new ordinals start and join; then the survivors roll onto the five-member config.
    let upgrade = render(5, "templates/members-job.yaml");
    assert!(upgrade.contains("members, trim, \"5\"") && upgrade.contains("pre-upgrade"), "{upgrade}");
    fleet.start(5, 3);
    fleet.start(5, 4);
    fleet.await_group(&[0, 1, 2, 3, 4], 5, "3 -> 5, new ordinals");
    *targets.lock().unwrap() = fleet.admin_addrs();
    fleet.roll(5, "3 -> 5");

    // 5 -> 3: the pre-upgrade hook's command first (rendered for the new count), then the StatefulSet deletes the
    // highest ordinals and rolls the survivors.
    let hook = render(3, "templates/members-job.yaml");
    assert!(hook.contains("members, trim, \"3\""), "{hook}");
    // (The admin Service stops sending to the departing pods once they are removed and turn unready.)
    *targets.lock().unwrap() = fleet.pods[..3].iter().map(|p| p.addrs.1).collect();
    let out = admin_as(&tls, "ops", fleet.pods[4].addrs.1, &["members", "trim", "3"]);
    assert!(out.status.success(), "members trim 3: {}", String::from_utf8_lossy(&out.stderr));
    // The removed members turn unready (no leader gives them a read point), so the Service passes them over.
    let deadline = Instant::now() + Duration::from_secs(10);
    while fleet.ready(3) || fleet.ready(4) {
        assert!(Instant::now() < deadline, "removed members still ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    fleet.await_group(&[0, 1, 2], 3, "5 -> 3, members removed");
    fleet.stop(4);
    fleet.stop(3);
    fleet.await_group(&[0, 1, 2], 3, "5 -> 3, pods deleted");
    fleet.roll(3, "5 -> 3");
    // And every survivor restarted once more, one at a time: still a group of three.
    fleet.roll(3, "restart");
    // Volumes lost: ordinal 1, then ordinal 0 (the one that starts a group when none runs) come back empty. Each
    // finds the running group, its old self is removed, and it joins again as a learner, then a voter.
    for o in [1, 0] {
        fleet.stop(o);
        fleet.pods[o].data = tempfile::tempdir().unwrap();
        fleet.start(3, o);
        fleet.await_group(&[0, 1, 2], 3, &format!("ordinal {o}'s volume lost"));
    }

    stop.store(true, Ordering::Relaxed);
    let (acked, failed, retried) = writer.join().unwrap();
    let statuses = client.join().unwrap();
    println!("{} writes acknowledged ({retried} on a second pod), {} refused: {failed:?}", acked.len(), failed.len());
    println!("{} requests, statuses {:?}", statuses.len(), statuses.iter().filter(|&&s| s != 200).collect::<Vec<_>>());
    let state = String::from_utf8_lossy(&admin_as(&tls, "ops", fleet.pods[0].addrs.1, &["state"]).stdout).into_owned();
    let lost: Vec<&String> = acked.iter().filter(|name| !state.contains(&format!("\"{name}\""))).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(acked.len() >= 20, "writes flowed: {}", acked.len());
    assert!(statuses.len() >= 20 && statuses.iter().all(|&s| s == 200), "every request answered: {statuses:?}");
    assert!(failed.is_empty(), "every write was taken: {failed:?}");
    worker.proc.assert_running("zl-worker");
    frontend.assert_running("zl-frontend");
}
