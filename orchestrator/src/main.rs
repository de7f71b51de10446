//! `zl-orchestrator`: keeps the routing state, takes worker registrations and load reports, answers route
//! requests.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use zl_node::consul::catalog::{ORCHESTRATOR_SERVICE, WORKER_SERVICE};
use zl_node::consul::{Registrar, watch};
use zl_node::discovery::DiscoveryArgs;
use zl_orchestrator::api::admin::AdminService;
use zl_orchestrator::load::LoadSettings;
use zl_orchestrator::orchestrator::Orchestrator;
use zl_orchestrator::raft::{GroupConfig, ReplicaConfig, Start, parse_peers, raft_dir};
use zl_orchestrator::route::{POLICY_NAMES, policy_by_name};
use zl_proto::quic::Server;
use zl_wire::message::{NodeId, Role};

/// zerolayer's orchestrator: routing state and route decisions.
#[derive(Parser, Debug)]
#[command(name = "zl-orchestrator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve registrations, load reports and route requests over QUIC.
    #[command(args_override_self = true)]
    Serve(ServeArgs),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// QUIC address (UDP) for workers, frontends and operators.
    #[arg(long, env = "ZL_LISTEN", default_value = "127.0.0.1:7000")]
    listen: SocketAddr,
    /// Prometheus endpoint address.
    #[arg(long, env = "ZL_METRICS_ADDR", default_value = "127.0.0.1:9000")]
    metrics_addr: SocketAddr,
    /// This orchestrator's id (a DNS label; its certificate must carry it).
    #[arg(long, env = "ZL_NODE_ID", default_value = "orchestrator-0")]
    node_id: String,
    /// Directory with `ca.pem` and `orchestrator-{node-id}.pem`/`.key` (`zl certs`).
    #[arg(long, env = "ZL_TLS_DIR")]
    tls_dir: PathBuf,
    /// The cluster CA's private key (PEM; its certificate is --tls-dir's ca.pem): this orchestrator then signs the
    /// certificates workers and frontends enroll for with their role's bootstrap credential (docs/operations.md,
    /// "Node identity"). Without it, nodes need certificates from `zl certs issue`.
    #[arg(long, env = "ZL_ENROLL_CA_KEY")]
    enroll_ca_key: Option<PathBuf>,
    /// File holding the key pepper (at least 32 bytes; the same file on every orchestrator and frontend): API-key
    /// secrets are then stored as HMAC-SHA256 keyed with it, not bare SHA-256 (docs/operations.md, "Secrets and
    /// evidence at rest").
    #[arg(long, env = "ZL_KEY_PEPPER_FILE")]
    key_pepper_file: Option<PathBuf>,
    /// Validity of an enrolled certificate in days (nodes renew at start when a third is left).
    #[arg(long, env = "ZL_ENROLL_DAYS", default_value_t = zl_orchestrator::enroll::DEFAULT_DAYS)]
    enroll_days: u32,
    /// TCP address of the admin API (gRPC with mutual TLS; admin certificates only).
    #[arg(long, env = "ZL_ADMIN_LISTEN", default_value = "127.0.0.1:7001")]
    admin_listen: SocketAddr,
    /// Routing policy: least-loaded, prefix-aware, session-affinity or round-robin.
    #[arg(long, env = "ZL_POLICY", default_value = "prefix-aware")]
    policy: String,
    /// This orchestrator's region: its Raft group serves that region alone (docs/regions.md).
    #[command(flatten)]
    region: zl_node::region::RegionArgs,
    /// A worker silent for this long gets no new requests.
    #[arg(long, env = "ZL_HEARTBEAT_TIMEOUT_MS", default_value_t = 1000)]
    heartbeat_timeout_ms: u64,
    /// A worker silent for this long is forgotten from the soft load view.
    #[arg(long, env = "ZL_FORGET_AFTER_S", default_value_t = 600)]
    forget_after_s: u64,
    /// Directory for the Raft log, hard state and snapshots (default: `~/.local/share/zerolayer/{node-id}`).
    #[arg(long, env = "ZL_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// This orchestrator's Raft id (a positive integer, unique in the group).
    #[arg(long, env = "ZL_RAFT_ID", default_value_t = 1)]
    raft_id: u64,
    /// Take the Raft id from the node id's ordinal instead: `NAME-N` has Raft id N+1 (a StatefulSet's pods are
    /// named `NAME-0`, `NAME-1`, ...: give each `--node-id` its pod name).
    #[arg(long, env = "ZL_RAFT_ID_FROM_ORDINAL")]
    raft_id_from_ordinal: bool,
    /// The group: `id@host:port` for every orchestrator (this one included), the port being its admin API's; a
    /// host may be a DNS name (resolved on each connection: a StatefulSet pod's stable name). Empty: a group of
    /// this node alone.
    #[arg(long, env = "ZL_RAFT_PEERS", default_value = "")]
    raft_peers: String,
    /// Join an existing group instead of starting one: start with no members and wait for the leader to add
    /// this node (`zl admin members add ID ADDRESS`). Only for a node whose data directory is empty.
    #[arg(long, env = "ZL_RAFT_JOIN", conflicts_with = "raft_auto_join")]
    raft_join: bool,
    /// Membership follows the deployment (a StatefulSet's ordinals; docs/consensus.md): with empty storage, the
    /// first listed peer starts the group unless one runs, every other node asks the leader to join it (as a
    /// learner, then a voter once caught up), and a voter whose storage was lost is replaced. Members leave with
    /// `zl admin members trim N` (the chart runs it before its StatefulSet shrinks).
    #[arg(long, env = "ZL_RAFT_AUTO_JOIN")]
    raft_auto_join: bool,
    /// Raft's logical time step: heartbeats every tick, elections after 10-20 ticks without a leader.
    #[arg(long, env = "ZL_RAFT_TICK_MS", default_value_t = 50)]
    raft_tick_ms: u64,
    /// Applied entries between snapshots of the routing state (and log compactions).
    #[arg(long, env = "ZL_RAFT_SNAPSHOT_EVERY", default_value_t = 1000)]
    raft_snapshot_every: u64,
    /// Stored Responses API responses kept per project at most (the oldest go first).
    #[arg(long, env = "ZL_RESPONSES_PER_PROJECT", default_value_t = 1000)]
    responses_per_project: u32,
    /// MiB of stored Responses API responses kept per project at most (the oldest go first).
    #[arg(long, env = "ZL_RESPONSES_MB_PER_PROJECT", default_value_t = 2)]
    responses_mb_per_project: u64,
    /// MiB of stored Responses API responses kept over every project together (the oldest go first). The store
    /// travels in Raft snapshots, one message of at most 16 MiB with the rest of the state: at most 8.
    #[arg(long, env = "ZL_RESPONSES_MB_TOTAL", default_value_t = 6, value_parser = clap::value_parser!(u64).range(1..=8))]
    responses_mb_total: u64,
    /// host:port workers and frontends dial for --listen (registered in consul; default: the listen address).
    #[arg(long, env = "ZL_ADVERTISE")]
    advertise: Option<String>,
    #[command(flatten)]
    discovery: DiscoveryArgs,
    /// TOML file whose keys are these flags' long names.
    #[arg(long, env = "ZL_CONFIG")]
    config: Option<PathBuf>,
    /// Check the settings (flags, ZL_* variables, the config file) and exit: 0 and "valid" when they are, the first
    /// problem otherwise. Files they name (certificates, models, tokens) are not read.
    #[arg(long)]
    check_config: bool,
}

fn default_data_dir(node_id: &str) -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("zerolayer").join(node_id)
}

/// The Raft id of a node named `NAME-N`: N+1.
fn ordinal_raft_id(node_id: &str) -> Result<u64> {
    let ordinal = node_id.rsplit_once('-').and_then(|(_, n)| n.parse::<u64>().ok());
    match ordinal {
        Some(n) if n < u64::MAX => Ok(n + 1),
        _ => bail!("--raft-id-from-ordinal: the node id {node_id:?} does not end in -N (a StatefulSet pod's name)"),
    }
}

/// The settings' checks that need no file: the routing policy and the Raft group (its peers with this node).
fn check(args: &mut ServeArgs) -> Result<(Box<dyn zl_orchestrator::route::Policy>, BTreeMap<u64, String>)> {
    if args.raft_id_from_ordinal {
        args.raft_id = ordinal_raft_id(&args.node_id)?;
    }
    args.region.check()?;
    let Some(policy) = policy_by_name(&args.policy) else {
        bail!("--policy {:?}: choose one of {}", args.policy, POLICY_NAMES.join(", "));
    };
    if args.heartbeat_timeout_ms == 0 {
        bail!("--heartbeat-timeout-ms must be at least 1");
    }
    if args.raft_tick_ms == 0 || args.raft_id == 0 {
        bail!("--raft-tick-ms and --raft-id must be at least 1");
    }
    let mut peers = parse_peers(&args.raft_peers).map_err(|e| anyhow::anyhow!("--raft-peers: {e}"))?;
    if peers.is_empty() {
        peers.insert(args.raft_id, args.admin_listen.to_string());
    }
    if !peers.contains_key(&args.raft_id) {
        bail!("--raft-peers must list this node's own id {}", args.raft_id);
    }
    if let Some(a) = &args.advertise {
        zl_node::resolve::parse_address(a).map_err(|e| anyhow::anyhow!("--advertise: {e}"))?;
    }
    NodeId::new(args.node_id.clone()).map_err(|e| anyhow::anyhow!("--node-id: {e}"))?;
    args.discovery.check()?;
    Ok((policy, peers))
}

async fn serve(mut args: ServeArgs) -> Result<()> {
    let (policy, peers) = check(&mut args)?;
    let identity = zl_node::load_identity(&args.tls_dir, Role::Orchestrator, &args.node_id)?;
    // Alive from here on; ready once this node is a voter that has applied what the leader had committed (checked
    // every second with a read point).
    let readiness: Arc<std::sync::RwLock<Result<String, String>>> =
        Arc::new(std::sync::RwLock::new(Err("opening the Raft storage".to_owned())));
    // Alive while the Raft task runs: one whose storage failed has left the group for good, and only a restart
    // (by the kubelet, or `zl up`'s supervisor) brings it back. Not ready then either, at once.
    let raft: Arc<std::sync::OnceLock<zl_orchestrator::raft::driver::Group>> = Arc::default();
    let stopped = {
        let raft = raft.clone();
        move || {
            raft.get().is_some_and(|group| !group.alive()).then(|| {
                "the Raft task stopped (storage failed: see zl_raft_fatal_errors_total and the log)".to_owned()
            })
        }
    };
    let probe = {
        let (readiness, stopped) = (readiness.clone(), stopped.clone());
        Arc::new(move || match stopped() {
            Some(why) => Err(why),
            None => zl_common::sync::read(&readiness).clone(),
        })
    };
    let live = Arc::new(move || match stopped() {
        Some(why) => Err(why),
        None => Ok("serving".to_owned()),
    });
    zl_node::status::serve_probes(args.metrics_addr, zl_node::status::Probes { ready: probe, live }).await?;
    let settings = LoadSettings {
        heartbeat_timeout: Duration::from_millis(args.heartbeat_timeout_ms),
        forget_after: Duration::from_secs(args.forget_after_s),
        ..LoadSettings::default()
    };
    let data_dir = args.data_dir.clone().unwrap_or_else(|| default_data_dir(&args.node_id));
    let empty = !zl_orchestrator::raft::join::holds_storage(&raft_dir(&data_dir));
    let start = if args.raft_join {
        Start::Join
    } else if args.raft_auto_join && empty {
        *zl_common::sync::write(&readiness) = Err("looking for a running group to join".to_owned());
        zl_orchestrator::raft::join::plan(args.raft_id, &peers, &args.tls_dir, &args.node_id).await
    } else {
        Start::Peers
    };
    let own_address = peers.get(&args.raft_id).cloned().unwrap_or_default();
    let group = GroupConfig {
        id: args.raft_id,
        peers,
        start,
        hold_messages: args.raft_auto_join && empty && start == Start::Join,
        data_dir: raft_dir(&data_dir),
        tls_dir: args.tls_dir.clone(),
        node_id: args.node_id.clone(),
        tick: Duration::from_millis(args.raft_tick_ms),
        replica: ReplicaConfig { snapshot_every: args.raft_snapshot_every.max(1), ..ReplicaConfig::default() },
    };
    let node = Arc::new(
        Orchestrator::start(&args.node_id, policy, settings, group)
            .with_context(|| format!("opening the Raft storage in {}", raft_dir(&data_dir).display()))?,
    );
    tracing::info!(raft_id = args.raft_id, ?start, empty, "Raft group opened");
    *zl_common::sync::write(&readiness) = Err("Raft storage open: waiting for a leader's read point".to_owned());
    node.set_response_bounds(zl_orchestrator::state::responses::Bounds {
        count: args.responses_per_project.max(1),
        bytes: args.responses_mb_per_project.max(1) << 20,
        total: args.responses_mb_total << 20,
    });
    let _ = raft.set(node.group().clone());
    // Bind this member's Raft id to this node, so peers take its messages from this certificate alone.
    tokio::spawn(node.group().clone().bind_self());
    {
        let group = node.group().clone();
        tokio::spawn(async move {
            loop {
                let now = group.caught_up().await;
                // Not ready yet: look again soon (a probe should see readiness within a heartbeat or two).
                let next = if now.is_ok() { Duration::from_secs(1) } else { Duration::from_millis(100) };
                *zl_common::sync::write(&readiness) = now;
                tokio::time::sleep(next).await;
            }
        });
    }
    if args.raft_auto_join && !node.group().votes() {
        if empty || node.group().status().learners.contains(&args.raft_id) {
            tokio::spawn(node.group().clone().keep_joining(own_address));
        } else {
            // Removed from the group (scaled away) with its storage kept: joining again is the operator's call.
            tracing::warn!("this node was removed from the group; start it with an empty data directory to join again");
        }
    }
    if let Some(key) = &args.enroll_ca_key {
        let read = |p: &std::path::Path| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
        let ca = zl_tls::ClusterCa::from_pem(&read(&args.tls_dir.join("ca.pem"))?, &read(key)?)
            .context("--enroll-ca-key: loading the cluster CA")?;
        node.enable_enrollment(zl_orchestrator::enroll::Enroller::new(ca, args.enroll_days));
        tracing::info!(days = args.enroll_days, "enrolling workers and frontends");
    }
    let raft_service = node.group().service();
    let server = Server::spawn(args.listen, &identity, zl_orchestrator::rpc_settings(), node.clone())?;
    let admin = {
        let tls = zl_admin::serve::server_config(&args.tls_dir, &args.node_id)?;
        let hasher = zl_common::keys::SecretHasher::from_file(args.key_pepper_file.as_deref())
            .map_err(|e| anyhow::anyhow!("--key-pepper-file: {e}"))?;
        if hasher.pepper_id().is_none() {
            tracing::warn!("no --key-pepper-file: operator-chosen API-key secrets are stored as bare SHA-256");
        }
        let service = AdminService::new(node.clone()).with_hasher(hasher).into_server();
        let listener = tokio::net::TcpListener::bind(args.admin_listen)
            .await
            .with_context(|| format!("binding the admin API to {}", args.admin_listen))?;
        let incoming = zl_admin::serve::incoming(listener, tls);
        let router = tonic::transport::Server::builder().add_service(service).add_service(raft_service);
        let (stop_admin, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            if let Err(e) = router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await
            {
                tracing::error!(error = %e, "admin API stopped");
            }
        });
        (stop_admin, task)
    };
    let sweeper = {
        let node = node.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                node.sweep(Instant::now());
            }
        })
    };
    // With consul: register this orchestrator (workers and frontends find it there) and follow the workers'
    // health (a failing check takes a worker out of routing within its TTL).
    let consul = match args.discovery.consul()? {
        None => None,
        Some(consul) => {
            let advertise = args.advertise.clone().unwrap_or_else(|| args.listen.to_string());
            let mut reg = consul.registration(ORCHESTRATOR_SERVICE, &args.node_id, &advertise)?;
            reg.meta = [
                ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
                ("raft_id".to_owned(), args.raft_id.to_string()),
                ("admin".to_owned(), args.admin_listen.to_string()),
                ("metrics".to_owned(), args.metrics_addr.to_string()),
            ]
            .into();
            let note = {
                let node = node.clone();
                move || {
                    let status = node.group().status();
                    let role = if status.leader == Some(status.id) { "raft leader" } else { "raft follower" };
                    let counts = node.worker_counts(Instant::now());
                    format!("{role}, term {}; {} healthy worker(s)", status.term, counts.healthy)
                }
            };
            let registrar = Registrar::spawn(consul.client.clone(), reg, Arc::new(note), consul.status.clone());
            let (mut found, task) = watch::spawn(consul.client.clone(), WORKER_SERVICE, false, consul.status.clone());
            let node = node.clone();
            let follow = tokio::spawn(async move {
                while found.changed().await.is_ok() {
                    let instances = found.borrow_and_update().clone().unwrap_or_default();
                    let listed = instances.into_iter().filter_map(|i| Some((NodeId::new(i.id).ok()?, i.passing)));
                    node.apply_discovery(listed, Instant::now());
                }
            });
            Some((registrar, task, follow))
        }
    };
    eprintln!(
        "zl-orchestrator: {} (Raft id {}, region {}) serving on {} with the {} policy (admin API on {}, metrics on http://{}/metrics)",
        args.node_id,
        args.raft_id,
        args.region.region,
        server.local_addr(),
        node.policy_name(),
        args.admin_listen,
        args.metrics_addr
    );
    zl_node::shutdown_signal().await;
    eprintln!("zl-orchestrator: shutting down");
    if let Some((registrar, watch, follow)) = consul {
        watch.abort();
        follow.abort();
        registrar.deregister().await;
    }
    sweeper.abort();
    // Within 3 s of SIGTERM in all (docs/consensus.md): a leader hands over first (writes, forwarded ones included,
    // then wait for no election), then the admin API and the QUIC server get what is left to finish their calls
    // (routes and reports take milliseconds; a call still open then fails over to another orchestrator).
    let stop_by = tokio::time::Instant::now() + Duration::from_millis(2500);
    node.group().hand_over(Duration::from_millis(1500)).await;
    let _ = admin.0.send(());
    let left = |floor: u64| {
        stop_by.saturating_duration_since(tokio::time::Instant::now()).max(Duration::from_millis(floor)) / 2
    };
    if tokio::time::timeout(left(200), admin.1).await.is_err() {
        tracing::warn!("admin calls still open at shutdown: closed");
    }
    server.shutdown(left(200)).await;
    Ok(())
}

fn main() -> Result<()> {
    match zl_node::start::<Cli>()?.command {
        Command::Serve(mut args) if args.check_config => {
            check(&mut args)?;
            println!("zl-orchestrator: the configuration is valid");
            Ok(())
        }
        Command::Serve(args) => zl_node::block_on(serve(args)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_statefulset_ordinal_is_a_raft_id() {
        assert_eq!(super::ordinal_raft_id("zl-orchestrator-0").unwrap(), 1);
        assert_eq!(super::ordinal_raft_id("zl-orchestrator-4").unwrap(), 5);
        assert!(super::ordinal_raft_id("orchestrator").is_err());
        assert!(super::ordinal_raft_id("orch-x").is_err());
    }
}
