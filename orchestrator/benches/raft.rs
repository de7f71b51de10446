//! A three-orchestrator Raft group on loopback, in one process but with everything real: the gRPC transport over
//! mutual TLS, fsynced storage in a temporary directory on the local disk. Prints proposal latency p50/p99 on the
//! leader and through a follower (forwarded), and committed writes per second with 1 and 64 writers.
//! `cargo bench -p zl-orchestrator --bench raft`

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zl_orchestrator::raft::{Group, GroupConfig, ReplicaConfig, SharedState, raft_dir};
use zl_orchestrator::state::{Command, Quota};
use zl_tls::ClusterCa;
use zl_wire::message::{NodeId, Role};

fn command(i: u64) -> Command {
    Command::SetProject {
        name: format!("p{}", i % 100),
        quota: Quota { requests_per_minute: i as u32, ..Quota::default() },
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn latency(name: &str, group: &Group, n: u64, offset: u64) {
    let mut times = Vec::with_capacity(n as usize);
    for i in 0..n {
        let t = Instant::now();
        group.commit(&command(offset + i)).await.expect("commit");
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "{name:<28} p50 {:>7.2} ms  p99 {:>7.2} ms  ({n} sequential writes)",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3
    );
}

async fn throughput(group: &Group, writers: u64, each: u64) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let g = group.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..each {
                g.commit(&command(1_000_000 + w * each + i)).await.expect("commit");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let rate = (writers * each) as f64 / started.elapsed().as_secs_f64();
    println!("{:<28} {rate:>8.0} committed writes/s", format!("{writers} concurrent writer(s)"));
}

fn main() {
    zl_tls::install_default_provider();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let tls = tempfile::tempdir().expect("tls dir");
    let data = tempfile::tempdir_in(std::env::current_dir().expect("cwd")).expect("data dir");
    let ca = ClusterCa::generate("zerolayer bench CA", 1).expect("CA");
    std::fs::write(tls.path().join("ca.pem"), ca.cert_pem()).expect("ca.pem");
    let mut peers = BTreeMap::new();
    for id in 1..=3u64 {
        let node = NodeId::new(format!("o-{id}")).expect("node id");
        let pair = ca.issue(Role::Orchestrator, &node, &[], 1).expect("certificate");
        std::fs::write(tls.path().join(format!("orchestrator-o-{id}.pem")), &pair.cert_pem).expect("cert");
        std::fs::write(tls.path().join(format!("orchestrator-o-{id}.key")), &pair.key_pem).expect("key");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        peers.insert(id, format!("127.0.0.1:{port}"));
    }
    runtime.block_on(async {
        let mut groups = BTreeMap::new();
        for (&id, addr) in &peers {
            let config = GroupConfig {
                id,
                peers: peers.clone(),
                start: zl_orchestrator::raft::Start::Peers,
                hold_messages: false,
                data_dir: raft_dir(&data.path().join(id.to_string())),
                tls_dir: tls.path().to_owned(),
                node_id: format!("o-{id}"),
                tick: Duration::from_millis(50),
                replica: ReplicaConfig::default(),
            };
            let group = Group::start(config, SharedState::default()).expect("group");
            let server_tls = zl_admin::serve::server_config(tls.path(), &format!("o-{id}")).expect("server TLS");
            let service = group.service();
            let listen: std::net::SocketAddr = addr.parse().expect("a socket address");
            let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
            tokio::spawn(async move {
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(zl_admin::serve::incoming(listener, server_tls))
                    .await
                    .expect("serve");
            });
            groups.insert(id, group);
        }
        let groups = Arc::new(groups);
        let deadline = Instant::now() + Duration::from_secs(30);
        let leader = loop {
            if let Some(l) = groups.values().find_map(|g| g.status().leader.filter(|&l| l == g.status().id)) {
                break l;
            }
            assert!(Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let follower = *groups.keys().find(|&&id| id != leader).expect("a follower");
        println!("3-node group on loopback (gRPC + mutual TLS, fsynced storage under {})", data.path().display());
        latency("proposal on the leader", &groups[&leader], 300, 0).await;
        latency("proposal via a follower", &groups[&follower], 300, 10_000).await;
        throughput(&groups[&leader], 1, 300).await;
        throughput(&groups[&leader], 64, 20).await;
    });
}
