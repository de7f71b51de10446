//! `zl admin`: the operator admin API of an orchestrator (`schemas/admin.proto`), over gRPC with the admin's
//! certificate from the cluster CA.

mod adapters;
mod ledger;
mod members;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use zl_admin::pb;
use zl_admin::pb::admin_client::AdminClient;

/// The admin API of an orchestrator, and which one.
#[derive(Args, Debug)]
pub(crate) struct AdminArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: AdminCommand,
}

/// Where and as whom. Each defaults to the cluster `zl up` is running (its `cluster.json`).
#[derive(Args, Debug)]
pub(crate) struct Conn {
    /// An orchestrator's admin API address (its `--admin-listen`; host:port, the host may be a DNS name).
    /// Default: the local cluster's orchestrators, the first that answers.
    #[arg(long, env = "ZL_ADMIN_ADDR", global = true, help_heading = "Which cluster (any admin command)", value_parser = zl_node::resolve::parse_address)]
    orchestrator: Option<String>,
    /// Directory with `ca.pem` and `admin-{node-id}.pem`/`.key` (`zl certs issue --role admin`). Default: the
    /// local cluster's.
    #[arg(long, env = "ZL_TLS_DIR", global = true, help_heading = "Which cluster (any admin command)")]
    tls_dir: Option<PathBuf>,
    /// The admin certificate's node id. Default: `admin`, or `zl-up` for the local cluster's certificates.
    #[arg(long, env = "ZL_ADMIN_ID", global = true, help_heading = "Which cluster (any admin command)")]
    node_id: Option<String>,
    /// `zl up`'s data dir, to find its cluster.json.
    #[arg(long, env = "ZL_DATA_DIR", global = true, help_heading = "Which cluster (any admin command)")]
    pub(crate) data_dir: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum AdminCommand {
    /// List registered workers with their health, models and load.
    Workers,
    /// Stop routing new requests to a worker (running ones finish there, or with --migrate go on elsewhere).
    Drain {
        /// Worker id.
        worker: String,
        /// Also hand its running requests over now: each goes on on another worker after the tokens it has,
        /// byte for byte (the worker then holds nothing and can be stopped or upgraded at once).
        #[arg(long)]
        migrate: bool,
    },
    /// Route to a drained worker again.
    Undrain {
        /// Worker id.
        worker: String,
    },
    /// Point an alias at a model (no target removes the alias).
    Alias {
        /// The alias.
        alias: String,
        /// Model id or alias.
        target: Option<String>,
    },
    /// Serve a model only at one weights version (no sha256 unpins).
    PinVersion {
        /// Model id.
        model: String,
        /// Weights SHA-256, lowercase hex.
        sha256: Option<String>,
    },
    /// Split a model's traffic between weights versions: SHA256=WEIGHT ... (none clears the split).
    Canary {
        /// Model id.
        model: String,
        /// SHA256=WEIGHT pairs.
        weights: Vec<String>,
    },
    /// Models to try, in order, when a model has no capacity (none clears the chain).
    Fallback {
        /// Model id.
        model: String,
        /// Fallback models.
        chain: Vec<String>,
    },
    /// Serve a model only from one pool: gpu, hybrid or cpu (none unpins).
    PinPool {
        /// Model id.
        model: String,
        /// The pool.
        pool: Option<String>,
    },
    /// Create or update a project and its quota (0 is unlimited).
    Project {
        /// Project name.
        name: String,
        /// Requests per minute.
        #[arg(long, default_value_t = 0)]
        rpm: u32,
        /// Tokens per minute.
        #[arg(long, default_value_t = 0)]
        tpm: u32,
        /// Requests in flight.
        #[arg(long, default_value_t = 0)]
        concurrent: u32,
        /// Input tokens per minute.
        #[arg(long, default_value_t = 0)]
        itpm: u32,
        /// Output tokens per minute.
        #[arg(long, default_value_t = 0)]
        otpm: u32,
        /// Leave the project as it is when it exists (quota included).
        #[arg(long)]
        if_missing: bool,
    },
    /// API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// LoRA adapters served over the models (docs/adapters.md).
    #[command(subcommand)]
    Adapters(adapters::AdaptersCommand),
    /// Set the billing-unit weights, each in [0, 1].
    BillingWeights {
        /// Weight of the input's semantic weight.
        #[arg(long)]
        input: f32,
        /// Weight of the output's action score.
        #[arg(long)]
        output: f32,
        /// Weight of the context retention ratio.
        #[arg(long)]
        context: f32,
    },
    /// Set the compute-pool thresholds on predicted cost: 0 <= hybrid <= gpu <= 1.
    PoolThresholds {
        /// Cost at or above which requests go to the gpu pool.
        #[arg(long)]
        gpu: f32,
        /// Cost at or above which (below gpu) requests go to the hybrid pool.
        #[arg(long)]
        hybrid: f32,
    },
    /// Print the whole routing state as JSON.
    State,
    /// The orchestrators' Raft group.
    #[command(subcommand)]
    Members(MembersCommand),
    /// Usage per hour, project and key, and budgets with what is spent of them.
    Usage {
        /// From this many hours ago.
        #[arg(long, default_value_t = 24)]
        hours: u64,
        /// Only this project.
        #[arg(long)]
        project: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Set a project's budget per period, enforced across all frontends (a limit of 0 clears it).
    Budget {
        /// Project.
        project: String,
        /// What it counts: tokens (input plus output) or units (billing units).
        #[arg(long, default_value = "tokens")]
        metric: String,
        /// When it resets: day or month (UTC calendar).
        #[arg(long, default_value = "month")]
        period: String,
        /// The budget per period.
        #[arg(long)]
        limit: f64,
    },
    /// Put a project in a cache group: projects of one group share the response cache and KV prefixes (each
    /// project's are its own by default). Without GROUP the project leaves its group.
    CacheGroup {
        /// Project.
        project: String,
        /// The group.
        group: Option<String>,
    },
    /// A project's priority class under degradation: high, normal or low.
    Priority {
        /// Project.
        project: String,
        /// high, normal or low.
        class: String,
    },
    /// Let a frontend whose audit directory was lost start a new chain: forget its committed audit head (kept in
    /// its history). Until then that frontend refuses requests (docs/audit.md).
    AuditReset {
        /// The frontend's node id.
        frontend: String,
    },
    /// Forget a worker's or frontend's enrollment and that it ever ran, so a pod that lost its identity volume
    /// may enroll its id again (docs/kubernetes.md, "Lose a volume"). Only once the old node is gone for good.
    ForgetNode {
        /// worker or frontend.
        role: String,
        /// The node id.
        node: String,
    },
    /// Content logging: `on` stores the project's prompts and answers encrypted in the audit log; `shred` forgets
    /// the data key, so what it sealed can never be read again (docs/audit.md).
    ContentLogging {
        /// Project.
        project: String,
        /// on or shred.
        action: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum MembersCommand {
    /// List the voting members, the leader, the term and the commit and applied indices.
    List,
    /// Add a voting member (start it first with the group in its --raft-peers). Sent to the leader.
    Add {
        /// Its Raft id.
        raft_id: u64,
        /// Its admin API address (host:port; the host may be a DNS name, resolved on each connection).
        #[arg(value_parser = zl_node::resolve::parse_address)]
        address: String,
    },
    /// Remove a voting member. Sent to the leader.
    Remove {
        /// Its Raft id.
        raft_id: u64,
    },
    /// Remove every member whose Raft id is above N, highest first, handing leadership over when the leader is one
    /// of them: a StatefulSet of N orchestrators (Raft ids 1..N) keeps a group of its own size (the chart runs it
    /// before each upgrade). Idempotent; waits up to 2 minutes for a leader.
    Trim {
        /// The orchestrators that stay (Raft ids 1 to N).
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        replicas: u64,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum KeysCommand {
    /// List key ids and their projects.
    List,
    /// Create a key; prints the secret once.
    Create {
        /// Key id (public).
        key_id: String,
        /// Project the key bills to (must exist: `zl admin project NAME`).
        #[arg(long)]
        project: String,
        /// Use this secret instead of generating one (the same key in every region: docs/regions.md).
        #[arg(long, env = "ZL_NEW_KEY_SECRET")]
        secret: Option<String>,
        /// Data residency: only these regions' frontends serve the key, and it never spills elsewhere.
        #[arg(long, value_delimiter = ',')]
        regions: Vec<String>,
    },
    /// Make sure a key exists with this secret and these regions: create it when absent, else set its regions and,
    /// when the secret differs, rotate it to this one (for jobs and automation that run on every deploy: the
    /// chart's, Terraform's). The secret comes from ZL_NEW_KEY_SECRET so that it never shows in argv.
    Ensure {
        /// Key id (public).
        key_id: String,
        /// Project the key bills to (must exist).
        #[arg(long)]
        project: String,
        /// The key's secret.
        #[arg(long, env = "ZL_NEW_KEY_SECRET", hide_env_values = true)]
        secret: String,
        /// Data residency: the regions whose frontends may serve the key (none: any region).
        #[arg(long, value_delimiter = ',')]
        regions: Vec<String>,
    },
    /// Bind a key to regions (data residency), or with no region unbind it.
    Regions {
        /// Key id.
        key_id: String,
        /// The regions whose frontends may serve it, e.g. `eu-west,eu-central`.
        #[arg(value_delimiter = ',')]
        regions: Vec<String>,
    },
    /// Revoke a key.
    Revoke {
        /// Key id.
        key_id: String,
    },
}

pub(crate) fn written(what: &str, r: pb::WriteResponse) {
    println!("{what} (applied at index {})", r.applied_index);
}

/// A client of the first orchestrator that answers (any member serves reads and forwards changes to the leader),
/// with the certificate directory and node id it used.
pub(crate) async fn connect(conn: &Conn) -> Result<(AdminClient<tonic::transport::Channel>, PathBuf, String)> {
    let local = crate::local::LocalCluster::read(conn.data_dir.as_deref());
    // Certificates: the given directory (node id `admin` unless given), or the local cluster's (`zl-up`).
    let (dir, default_id) = match &conn.tls_dir {
        Some(dir) => (dir.clone(), "admin"),
        None => (PathBuf::from(local.pick(None, "tls_dir", "--tls-dir (or ZL_TLS_DIR)")?), crate::local::ADMIN_ID),
    };
    let node_id = conn.node_id.clone().unwrap_or_else(|| default_id.to_owned());
    let addrs: Vec<String> = match &conn.orchestrator {
        Some(addr) => vec![addr.clone()],
        None if conn.tls_dir.is_none() => local.admin_addrs().iter().map(ToString::to_string).collect(),
        None => vec!["127.0.0.1:7001".to_owned()],
    };
    if addrs.is_empty() {
        bail!("{}", local.missing("--orchestrator (or ZL_ADMIN_ADDR)"));
    }
    let mut last = None;
    for addr in addrs {
        match zl_admin::connect(&addr, &dir, &node_id).await {
            Ok(c) => return Ok((AdminClient::new(c), dir, node_id)),
            Err(e) => last = Some(e.context(format!("orchestrator {addr}"))),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no orchestrator to call")))
}

/// A gRPC status as an error.
pub(crate) fn call(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}: {}", e.code(), e.message())
}

async fn run_async(args: AdminArgs) -> Result<()> {
    let (mut c, dir, node_id) = connect(&args.conn).await?;
    if let Some(done) = ledger::run(&mut c, &args.command).await? {
        return Ok(done);
    }
    match args.command {
        AdminCommand::Adapters(command) => adapters::run(&mut c, command).await?,
        AdminCommand::Workers => {
            let workers = c.list_workers(pb::ListWorkersRequest {}).await.map_err(call)?.into_inner().workers;
            println!(
                "{:<20} {:<22} {:<6} {:<9} {:>6} {:>9} {:>15} {:>8} {:>13}  models",
                "WORKER", "ENDPOINT", "POOL", "STATE", "QUEUE", "RUNNING", "KV USED", "TOK/S", "VRAM FREE GB"
            );
            for w in workers {
                let state = if w.draining {
                    "draining"
                } else if w.healthy {
                    "healthy"
                } else {
                    "silent"
                };
                let (queue, running, kv, tps, vram) =
                    w.load.as_ref().map_or(("-".into(), "-".into(), "-".into(), "-".into(), "-".into()), |l| {
                        let gb = |b: u64| b as f64 / 1e9;
                        (
                            l.queue_depth.to_string(),
                            format!("{}/{}", l.running_sequences, w.max_running_sequences),
                            // The blocks and how they store keys and values (f16, q8), where the worker says.
                            format!(
                                "{}/{} {}",
                                l.kv_blocks_used,
                                l.kv_blocks_used + l.kv_blocks_free,
                                if w.kv_dtype.is_empty() { "-" } else { w.kv_dtype.as_str() }
                            ),
                            format!("{:.1}", l.tokens_per_second),
                            if l.vram_total_bytes > 0 {
                                format!("{:.1}/{:.1}", gb(l.vram_free_bytes), gb(l.vram_total_bytes))
                            } else {
                                "-".into()
                            },
                        )
                    });
                let models: Vec<String> = w
                    .models
                    .iter()
                    .map(|m| {
                        // The weights' memory on the worker, where it reports it: `id@sha (241 MiB)`.
                        let memory = match m.weights_bytes {
                            0 => String::new(),
                            b => format!(" ({:.0} MiB)", b as f64 / (1u64 << 20) as f64),
                        };
                        format!("{}@{}{memory}", m.id, &m.weights_sha256[..12.min(m.weights_sha256.len())])
                    })
                    .collect();
                println!(
                    "{:<20} {:<22} {:<6} {:<9} {:>6} {:>9} {:>15} {:>8} {:>13}  {}",
                    w.id,
                    w.endpoint,
                    w.device_class,
                    state,
                    queue,
                    running,
                    kv,
                    tps,
                    vram,
                    models.join(", ")
                );
                if let Some(load) = w.load.as_ref().filter(|l| !l.adapters.is_empty()) {
                    println!("{:<20} adapters loaded: {}", "", load.adapters.join(", "));
                }
            }
        }
        AdminCommand::Drain { worker, migrate } => written(
            &if migrate {
                format!("draining {worker}; its running requests are handed over to other workers")
            } else {
                format!("draining {worker}")
            },
            c.set_drain(pb::SetDrainRequest { worker_id: worker.clone(), draining: true, migrate })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        AdminCommand::ForgetNode { role, node } => written(
            &format!("{role} {node} forgotten: it may enroll again"),
            c.forget_node(pb::ForgetNodeRequest { role: role.clone(), node_id: node.clone() })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        AdminCommand::Undrain { worker } => written(
            &format!("routing to {worker} again"),
            c.set_drain(pb::SetDrainRequest { worker_id: worker.clone(), draining: false, migrate: false })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        AdminCommand::Alias { alias, target } => written(
            &format!("alias {alias} -> {}", target.as_deref().unwrap_or("(removed)")),
            c.set_alias(pb::SetAliasRequest { alias: alias.clone(), target: target.clone().unwrap_or_default() })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        AdminCommand::PinVersion { model, sha256 } => written(
            &format!("{model} pinned to {}", sha256.as_deref().unwrap_or("(any version)")),
            c.pin_version(pb::PinVersionRequest {
                model: model.clone(),
                weights_sha256: sha256.clone().unwrap_or_default(),
            })
            .await
            .map_err(call)?
            .into_inner(),
        ),
        AdminCommand::Canary { model, weights } => {
            let mut map = std::collections::HashMap::new();
            for pair in &weights {
                let Some((sha, w)) = pair.split_once('=') else { bail!("{pair:?}: expected SHA256=WEIGHT") };
                let w: u32 = w.parse().with_context(|| format!("{pair:?}: the weight must be a whole number"))?;
                map.insert(sha.to_owned(), w);
            }
            written(
                &format!("canary split for {model} set"),
                c.set_canary(pb::SetCanaryRequest { model, weights: map }).await.map_err(call)?.into_inner(),
            );
        }
        AdminCommand::Fallback { model, chain } => written(
            &format!("fallback chain for {model} set"),
            c.set_fallback(pb::SetFallbackRequest { model, chain }).await.map_err(call)?.into_inner(),
        ),
        AdminCommand::CacheGroup { project, group } => written(
            &match &group {
                Some(g) => format!("{project} shares its caches with cache group {g}"),
                None => format!("{project} keeps its caches to itself"),
            },
            c.set_cache_group(pb::SetCacheGroupRequest { project, group: group.unwrap_or_default() })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        AdminCommand::PinPool { model, pool } => written(
            &format!("{model} pinned to pool {}", pool.as_deref().unwrap_or("(any)")),
            c.pin_pool(pb::PinPoolRequest { model: model.clone(), pool: pool.clone().unwrap_or_default() })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        AdminCommand::Project { name, rpm, tpm, concurrent, itpm, otpm, if_missing } => written(
            &format!("project {name} set"),
            c.set_project(pb::SetProjectRequest {
                name: name.clone(),
                quota: Some(pb::Quota {
                    requests_per_minute: rpm,
                    tokens_per_minute: tpm,
                    max_concurrent: concurrent,
                    input_tokens_per_minute: itpm,
                    output_tokens_per_minute: otpm,
                }),
                if_missing,
            })
            .await
            .map_err(call)?
            .into_inner(),
        ),
        AdminCommand::Keys(KeysCommand::List) => {
            for k in c.list_keys(pb::ListKeysRequest {}).await.map_err(call)?.into_inner().keys {
                let regions = if k.regions.is_empty() { "any region".to_owned() } else { k.regions.join(",") };
                println!("{}\t{}\t{regions}", k.key_id, k.project);
            }
        }
        AdminCommand::Keys(KeysCommand::Create { key_id, project, secret, regions }) => {
            let r = c
                .create_key(pb::CreateKeyRequest {
                    key_id: key_id.clone(),
                    project,
                    secret: secret.unwrap_or_default(),
                    regions,
                })
                .await
                .map_err(call)?
                .into_inner();
            eprintln!("key {key_id} created (applied at index {}); its secret, shown once:", r.applied_index);
            println!("{}", r.secret);
        }
        AdminCommand::Keys(KeysCommand::Ensure { key_id, project, secret, regions }) => {
            let ensure = pb::CreateKeyRequest { key_id: key_id.clone(), project, secret, regions };
            let r = c.ensure_key(ensure).await.map_err(call)?.into_inner();
            let what = match r.outcome.as_str() {
                "rotated" => "exists; its secret was rotated (the old one no longer works)",
                "updated" => "exists; regions set",
                "unchanged" => "exists, unchanged",
                _ => "created",
            };
            println!("key {key_id} {what} (applied at index {})", r.applied_index);
        }
        AdminCommand::Keys(KeysCommand::Regions { key_id, regions }) => written(
            &format!(
                "key {key_id} bound to {}",
                if regions.is_empty() { "any region".into() } else { regions.join(",") }
            ),
            c.set_key_regions(pb::SetKeyRegionsRequest { key_id: key_id.clone(), regions })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        AdminCommand::Keys(KeysCommand::Revoke { key_id }) => written(
            &format!("key {key_id} revoked"),
            c.revoke_key(pb::RevokeKeyRequest { key_id: key_id.clone() }).await.map_err(call)?.into_inner(),
        ),
        AdminCommand::BillingWeights { input, output, context } => written(
            "billing weights set",
            c.set_billing_weights(pb::SetBillingWeightsRequest { input, output, context })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        AdminCommand::PoolThresholds { gpu, hybrid } => written(
            "pool thresholds set",
            c.set_pool_thresholds(pb::SetPoolThresholdsRequest { gpu, hybrid }).await.map_err(call)?.into_inner(),
        ),
        AdminCommand::State => {
            let r = c.get_state(pb::GetStateRequest {}).await.map_err(call)?.into_inner();
            println!("{}", r.state_json);
        }
        AdminCommand::Members(command) => members::run(&mut c, &dir, &node_id, command).await?,
        AdminCommand::Usage { .. }
        | AdminCommand::Budget { .. }
        | AdminCommand::Priority { .. }
        | AdminCommand::AuditReset { .. }
        | AdminCommand::ContentLogging { .. } => unreachable!("run by admin::ledger"),
    }
    Ok(())
}

/// Run one admin command.
pub(crate) fn run(args: AdminArgs) -> Result<()> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run_async(args))
}
