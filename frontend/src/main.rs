//! `zl-frontend`: the HTTP edge of a zerolayer cluster (Anthropic Messages and OpenAI Chat Completions APIs).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use zl_frontend::audit::{AuditConfig, AuditLog, Fsync, OnFailure};
use zl_frontend::cluster::{Cluster, sync_loop};
use zl_frontend::gateway::{DegradeConfig, Gateway, GatewayConfig};
use zl_frontend::health::Thresholds;
use zl_frontend::http::spill::Spill;
use zl_frontend::http::{self, App};
use zl_frontend::limits::KeyLimits;
use zl_frontend::regions::{Regions, parse_peer};
use zl_frontend::report::report_loop;
use zl_frontend::upstream::{QuicUpstream, Upstream};
use zl_node::consul::catalog::{FRONTEND_SERVICE, ORCHESTRATOR_SERVICE};
use zl_node::consul::{Registrar, Report, watch};
use zl_node::discovery::OrchestratorArgs;
use zl_proto::quic::Client;
use zl_wire::message::Role;

/// zerolayer's frontend: the Anthropic and OpenAI APIs in front of the cluster.
#[derive(Parser, Debug)]
#[command(name = "zl-frontend", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the HTTP APIs.
    #[command(args_override_self = true)]
    Serve(ServeArgs),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// HTTP address (HTTP/1.1 and h2c; HTTP/2 over TLS with --tls-cert).
    #[arg(long, env = "ZL_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Internal address of `/metrics` (and `/healthz`, `/readyz`), kept off the public API port: scrapers and
    /// probes reach it, clients never do.
    #[arg(long, env = "ZL_METRICS_ADDR", default_value = "127.0.0.1:9300")]
    metrics_addr: SocketAddr,
    /// The orchestrators (calls are spread over them and fail over).
    #[command(flatten)]
    peers: OrchestratorArgs,
    /// Enrolling for a certificate of its own (when --tls-dir holds a bootstrap credential instead).
    #[command(flatten)]
    identity: zl_node::enroll::IdentityArgs,
    /// host:port clients reach this frontend at (registered in consul; default: --http-addr).
    #[arg(long, env = "ZL_ADVERTISE")]
    advertise: Option<String>,
    /// This frontend's id (a DNS label; its certificate must carry it).
    #[arg(long, env = "ZL_NODE_ID", default_value = "frontend-0")]
    node_id: String,
    /// Directory with `ca.pem` and `frontend-{node-id}.pem`/`.key` (`zl certs`), for the cluster's mutual TLS.
    #[arg(long, env = "ZL_TLS_DIR")]
    tls_dir: PathBuf,
    /// PEM certificate chain for HTTPS on --http-addr (with --tls-key). Without it the API is plain HTTP.
    #[arg(long, env = "ZL_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "ZL_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require an API key on every API request ("false" only for local experiments).
    #[arg(long, env = "ZL_REQUIRE_AUTH", default_value_t = true, action = clap::ArgAction::Set)]
    require_auth: bool,
    /// Requests per minute per key when its project sets no limit (0: unlimited).
    #[arg(long, env = "ZL_DEFAULT_RPM", default_value_t = 4000)]
    default_rpm: u32,
    /// Input tokens per minute per key when its project sets no limit (0: unlimited).
    #[arg(long, env = "ZL_DEFAULT_ITPM", default_value_t = 2_000_000)]
    default_itpm: u32,
    /// Output tokens per minute per key when its project sets no limit (0: unlimited).
    #[arg(long, env = "ZL_DEFAULT_OTPM", default_value_t = 400_000)]
    default_otpm: u32,
    /// Frontend replicas sharing the limits: each enforces 1/N of every limit.
    #[arg(long, env = "ZL_REPLICAS", default_value_t = 1)]
    replicas: u32,
    /// Response cache size in MiB (0 disables it).
    #[arg(long, env = "ZL_CACHE_MB", default_value_t = 256)]
    cache_mb: usize,
    /// Refuse prompts with more UTF-8 bytes of text than this, before anything else is done with them (0: no
    /// limit but the context window's). Default 4 MiB: about a million tokens of text, more than any context the
    /// bundled families take; the context window's own byte bound is checked next in any case.
    #[arg(long, env = "ZL_MAX_PROMPT_BYTES", default_value_t = 4 * 1024 * 1024)]
    max_prompt_bytes: usize,
    /// Strip BOMs and invisible bidi/zero-width characters from prompts before tokenising.
    #[arg(long, env = "ZL_SANITIZE", default_value_t = false, action = clap::ArgAction::Set)]
    sanitize: bool,
    /// Largest request body in MiB (answered with 413 request_too_large above it).
    #[arg(long, env = "ZL_BODY_LIMIT_MB", default_value_t = 32)]
    body_limit_mb: usize,
    /// How often the cached routing state (keys, quotas, models) is refreshed.
    #[arg(long, env = "ZL_SYNC_INTERVAL_MS", default_value_t = 1000)]
    sync_interval_ms: u64,
    /// On shutdown, how long open requests and streams may take to finish.
    #[arg(long, env = "ZL_DRAIN_TIMEOUT_S", default_value_t = 30)]
    drain_timeout_s: u64,
    /// A connection's first bytes, each HTTP/1 request head and an idle keep-alive connection's next request must
    /// arrive within this; HTTP/2 peers must answer pings within it (slow or silent clients are cut off).
    #[arg(long, env = "ZL_HEADER_TIMEOUT_S", default_value_t = 10)]
    header_timeout_s: u64,
    /// A request body must arrive within this once its head did (408 otherwise).
    #[arg(long, env = "ZL_BODY_TIMEOUT_S", default_value_t = 60)]
    body_timeout_s: u64,
    /// Connections served at once; more wait in the kernel's accept queue until one closes.
    #[arg(long, env = "ZL_MAX_CONNECTIONS", default_value_t = 4096)]
    max_connections: usize,
    /// Connections one client address (an IPv6 /64) may hold at once; more are closed as they arrive (0: no cap;
    /// raise it behind a proxy that hides client addresses).
    #[arg(long, env = "ZL_MAX_CONNECTIONS_PER_CLIENT", default_value_t = 256)]
    max_connections_per_client: usize,
    #[command(flatten)]
    region: zl_node::region::RegionArgs,
    /// Peer regions' frontends, nearest first, as REGION=URL (comma-separated or repeated): where requests this
    /// region cannot serve spill over, and where an `x-zl-region` preference is sent (docs/regions.md).
    #[arg(long = "peer-region", env = "ZL_PEER_REGIONS", value_delimiter = ',')]
    peer_regions: Vec<String>,
    /// With --discovery consul: the peer regions are the Consul agent's other datacenters, nearest first, each
    /// with a passing frontend (the datacenter names the region), read again every 10 s. Replaces --peer-region.
    #[arg(long, env = "ZL_PEER_REGIONS_FROM_CONSUL", default_value_t = false, action = clap::ArgAction::Set)]
    peer_regions_from_consul: bool,
    /// File holding the key pepper (the orchestrators' --key-pepper-file): key secrets stored keyed with it verify.
    #[arg(long, env = "ZL_KEY_PEPPER_FILE")]
    key_pepper_file: Option<PathBuf>,
    /// File holding the key (at least 32 bytes) that signs region hops: the same file on the frontends of every
    /// region. Needed with peer regions; a hop without a valid signature is an ordinary request (docs/regions.md).
    #[arg(long, env = "ZL_HOP_KEY_FILE")]
    hop_key_file: Option<PathBuf>,
    /// With --peer-regions-from-consul: the only regions (Consul datacenters) taken as peers, comma-separated.
    /// Required: a datacenter joined to the WAN is not trusted with this region's clients by being there.
    #[arg(long, env = "ZL_PEER_REGION_ALLOW", value_delimiter = ',')]
    peer_region_allow: Vec<String>,
    /// With --peer-regions-from-consul: also take peers that register plain http (by default only https peers,
    /// checked against --peer-ca-file, are taken). For a test bed or a private network only.
    #[arg(long, env = "ZL_PEER_INSECURE_HTTP", default_value_t = false, action = clap::ArgAction::Set)]
    peer_insecure_http: bool,
    /// CA certificate (PEM) that https peer regions' frontends are checked against.
    #[arg(long, env = "ZL_PEER_CA_FILE")]
    peer_ca_file: Option<PathBuf>,
    /// Directory of this frontend's audit log (hash-chained records, one per request; docs/audit.md). Unset: no
    /// audit log.
    #[arg(long, env = "ZL_AUDIT_DIR")]
    audit_dir: Option<PathBuf>,
    /// Rotate audit segments past this size, in MiB.
    #[arg(long, env = "ZL_AUDIT_SEGMENT_MB", default_value_t = 64)]
    audit_segment_mb: u64,
    /// Keep at most this many audit segments, removing the oldest (0: keep all).
    #[arg(long, env = "ZL_AUDIT_KEEP_SEGMENTS", default_value_t = 0)]
    audit_keep_segments: usize,
    /// When audit records reach the disk: always (fsync each), interval (each second) or never (the kernel's call).
    #[arg(long, env = "ZL_AUDIT_FSYNC", default_value = "interval")]
    audit_fsync: String,
    /// When an audit record cannot be written: fail-closed (refuse requests with 529 until it can) or continue
    /// (serve on; counted and logged as errors).
    #[arg(long, env = "ZL_AUDIT_ON_FAILURE", default_value = "fail-closed")]
    audit_on_failure: String,
    /// How often usage, leases (budgets, shared rate limits) and the audit head are reported to the orchestrators.
    #[arg(long, env = "ZL_REPORT_INTERVAL_MS", default_value_t = 1000)]
    report_interval_ms: u64,
    /// Share of a budget or of a per-minute limit this frontend leases at a time (the most it holds unused).
    #[arg(long, env = "ZL_LEASE_FRACTION", default_value_t = 0.05)]
    lease_fraction: f64,
    /// How long this frontend's leases hold without a report; after that the orchestrators charge them.
    #[arg(long, env = "ZL_LEASE_S", default_value_t = 15)]
    lease_s: u64,
    /// Degraded when the workers' load reaches this: sequences running and waiting per sequence slot (0 to 2;
    /// a worker queues at most as many as it runs).
    #[arg(long, env = "ZL_DEGRADED_LOAD", default_value_t = 1.5)]
    degraded_load: f64,
    /// Unavailable (529 at once, nothing queued) when the workers' load reaches this.
    #[arg(long, env = "ZL_UNAVAILABLE_LOAD", default_value_t = 1.9)]
    unavailable_load: f64,
    /// While degraded, refuse requests of this priority class and lower with 529: low, normal or none.
    #[arg(long, env = "ZL_DEGRADED_SHED", default_value = "low")]
    degraded_shed: String,
    /// While degraded, cap max_tokens of normal and low priority requests to this (0: no cap).
    #[arg(long, env = "ZL_DEGRADED_MAX_TOKENS", default_value_t = 0)]
    degraded_max_tokens: u32,
    /// While degraded, route normal and low priority requests to their model's fallback chain first.
    #[arg(long, env = "ZL_DEGRADED_PREFER_FALLBACK", default_value_t = true, action = clap::ArgAction::Set)]
    degraded_prefer_fallback: bool,
    /// Times one request may move to another worker when its worker fails mid-answer (0 turns migration off).
    /// The new worker continues after the tokens already sent, exactly as the failed one would have.
    #[arg(long, env = "ZL_MIGRATION_LIMIT", default_value_t = 2)]
    migration_limit: u32,
    /// Output tokens held per request for a migration (4 bytes each); a longer answer is not moved.
    #[arg(long, env = "ZL_MIGRATION_MAX_TOKENS", default_value_t = 32_768)]
    migration_max_tokens: usize,
    /// How long a migration waits, in milliseconds, for a worker to take the request when none can now (a lone
    /// worker being restarted: `zl up`'s supervisor has it back in about 1.5 s). 0 fails at once.
    #[arg(long, env = "ZL_MIGRATION_WAIT_MS", default_value_t = 5_000)]
    migration_wait_ms: u64,
    /// A worker that sends nothing for this long once an answer's tokens have started is treated as failed for
    /// that request (a wedged device; a stopped or dead process is noticed sooner by its connection).
    #[arg(long, env = "ZL_STALL_TIMEOUT_MS", default_value_t = 10_000)]
    stall_timeout_ms: u64,
    /// How long a stored Responses API response (`store`, the default) is kept, in seconds (30 days by default);
    /// each project keeps at most the orchestrators' `--responses-per-project`, oldest evicted first.
    #[arg(long, env = "ZL_RESPONSE_TTL_S", default_value_t = 30 * 86_400)]
    response_ttl_s: u32,
    /// TOML file whose keys are these flags' long names.
    #[arg(long, env = "ZL_CONFIG")]
    config: Option<PathBuf>,
    /// Check the settings (flags, ZL_* variables, the config file) and exit: 0 and "valid" when they are, the first
    /// problem otherwise. Files they name (certificates, models, tokens) are not read.
    #[arg(long)]
    check_config: bool,
}

fn audit_config(args: &ServeArgs) -> Result<Option<AuditConfig>> {
    let fsync = match args.audit_fsync.as_str() {
        "always" => Fsync::Always,
        "interval" => Fsync::Interval,
        "never" => Fsync::Never,
        other => bail!("--audit-fsync {other:?}: use always, interval or never"),
    };
    let on_failure = match args.audit_on_failure.as_str() {
        "fail-closed" => OnFailure::FailClosed,
        "continue" => OnFailure::Continue,
        other => bail!("--audit-on-failure {other:?}: use fail-closed or continue"),
    };
    if args.audit_segment_mb == 0 {
        bail!("--audit-segment-mb must be at least 1");
    }
    Ok(args.audit_dir.clone().map(|dir| AuditConfig {
        dir,
        segment_bytes: args.audit_segment_mb * 1024 * 1024,
        keep_segments: args.audit_keep_segments,
        fsync,
        on_failure,
    }))
}

fn degrade(args: &ServeArgs) -> Result<(DegradeConfig, Thresholds)> {
    let shed_from_class = match args.degraded_shed.as_str() {
        "low" => 2,
        "normal" => 1,
        "none" => 3,
        other => bail!("--degraded-shed {other:?}: use low, normal or none"),
    };
    let (d, u) = (args.degraded_load, args.unavailable_load);
    if !(d.is_finite() && u.is_finite() && 0.0 < d && d <= u) {
        bail!("need 0 < --degraded-load <= --unavailable-load");
    }
    if !(0.0..=1.0).contains(&args.lease_fraction) || args.lease_s == 0 || args.report_interval_ms == 0 {
        bail!("--lease-fraction must be in [0, 1]; --lease-s and --report-interval-ms at least 1");
    }
    let config = DegradeConfig {
        shed_from_class,
        cap_max_tokens: args.degraded_max_tokens,
        prefer_fallback: args.degraded_prefer_fallback,
        retry_after: 5,
    };
    let thresholds = Thresholds { degraded_load: d, unavailable_load: u, ..Thresholds::default() };
    Ok((config, thresholds))
}

/// The settings' checks that need no file.
fn check(args: &ServeArgs) -> Result<()> {
    audit_config(args)?;
    if (!args.peer_regions.is_empty() || args.peer_regions_from_consul) && args.hop_key_file.is_none() {
        bail!("peer regions need --hop-key-file (the key every region's frontends sign hops with)");
    }
    degrade(args)?;
    if args.header_timeout_s == 0 || args.body_timeout_s == 0 || args.max_connections == 0 {
        bail!("--header-timeout-s, --body-timeout-s and --max-connections must be at least 1");
    }
    if args.replicas == 0 || args.sync_interval_ms == 0 || args.body_limit_mb == 0 {
        bail!("--replicas, --sync-interval-ms and --body-limit-mb must be at least 1");
    }
    if let Some(a) = &args.advertise {
        zl_node::resolve::parse_address(a).map_err(|e| anyhow::anyhow!("--advertise: {e}"))?;
    }
    zl_wire::message::NodeId::new(args.node_id.clone()).map_err(|e| anyhow::anyhow!("--node-id: {e}"))?;
    args.region.check()?;
    regions(args)?;
    if args.peer_regions_from_consul {
        if args.peers.discovery.discovery != zl_node::discovery::Backend::Consul {
            bail!("--peer-regions-from-consul needs --discovery consul");
        }
        if !args.peer_regions.is_empty() {
            bail!("give --peer-region or --peer-regions-from-consul, not both");
        }
        if args.peer_region_allow.is_empty() {
            bail!("--peer-regions-from-consul needs --peer-region-allow: the regions that may be peers");
        }
        if let Some(problem) = args.peer_region_allow.iter().find_map(|r| zl_common::region::region_problem(r)) {
            bail!("--peer-region-allow: {problem}");
        }
        if args.peer_ca_file.is_none() && !args.peer_insecure_http {
            bail!("--peer-regions-from-consul takes https peers only: give --peer-ca-file (or --peer-insecure-http)");
        }
    }
    args.peers.check(true)
}

/// This frontend's region and its peers, from the settings.
fn regions(args: &ServeArgs) -> Result<Regions> {
    let peers =
        args.peer_regions.iter().map(|p| parse_peer(p)).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
    if peers.iter().any(|p| p.tls) && args.peer_ca_file.is_none() {
        bail!("an https --peer-region needs --peer-ca-file, the CA its certificate is checked against");
    }
    Regions::new(args.region.region.clone(), peers).map_err(anyhow::Error::msg)
}

/// How this frontend reaches its peer regions.
fn spill(args: &ServeArgs) -> Result<Spill> {
    let tls = match &args.peer_ca_file {
        None => None,
        Some(ca) => {
            let config = rustls::ClientConfig::builder_with_provider(zl_tls::provider())
                .with_safe_default_protocol_versions()?
                .with_root_certificates(zl_node::pem::roots(ca)?)
                .with_no_client_auth();
            Some(tokio_rustls::TlsConnector::from(Arc::new(config)))
        }
    };
    let hop_key = match &args.hop_key_file {
        Some(path) => Some(http::hop::HopKey::from_file(path).map_err(|e| anyhow::anyhow!("--hop-key-file: {e}"))?),
        None => None,
    };
    Ok(Spill { regions: regions(args)?, tls, pool: Arc::default(), hop_key })
}

async fn serve(args: ServeArgs) -> Result<()> {
    check(&args)?;
    let consul = args.peers.consul(true)?;
    let identity = args.identity.load(&args.tls_dir, &args.peers.orchestrators, Role::Frontend, &args.node_id).await?;
    // The internal status listener first, so that every metric is recorded from the start; ready once the
    // cluster view exists and says so.
    let ready_view: Arc<std::sync::OnceLock<Arc<Cluster>>> = Arc::default();
    let probe: zl_node::status::Readiness = {
        let view = ready_view.clone();
        Arc::new(move || match view.get() {
            None => Err("starting".to_owned()),
            Some(cluster) => cluster.ready(std::time::Instant::now()).map(|()| "ready".to_owned()),
        })
    };
    zl_node::status::serve(args.metrics_addr, probe).await?;
    let client = Client::new(&identity, zl_frontend::rpc_settings())?;
    let quic = Arc::new(QuicUpstream::new(client, vec![]));
    let resolver = {
        let quic = quic.clone();
        let apply = move |addrs| quic.set_orchestrators(addrs);
        zl_node::resolve::follow_static(args.peers.orchestrators.clone(), zl_node::resolve::RESOLVE_EVERY, apply).await
    };
    let upstream: Arc<dyn Upstream> = quic.clone();
    let hasher = zl_common::keys::SecretHasher::from_file(args.key_pepper_file.as_deref())
        .map_err(|e| anyhow::anyhow!("--key-pepper-file: {e}"))?;
    let cluster = Arc::new(
        match &consul {
            Some(c) => Cluster::with_discovery(c.status.clone()),
            None => Cluster::default(),
        }
        .with_hasher(hasher),
    );
    let _ = ready_view.set(cluster.clone());
    // With consul: follow the passing orchestrators, and (once listening) register this frontend, for operators
    // and load balancers that read Consul.
    let consul = match consul {
        None => None,
        Some(consul) => {
            let apply = move |addrs| quic.set_orchestrators(addrs);
            let follow =
                watch::follow_addresses(consul.client.clone(), ORCHESTRATOR_SERVICE, consul.status.clone(), apply);
            let advertise = args.advertise.clone().unwrap_or_else(|| args.http_addr.to_string());
            let mut reg = consul.registration(FRONTEND_SERVICE, &args.node_id, &advertise)?;
            let scheme = if args.tls_cert.is_some() { "https" } else { "http" };
            reg.meta = [
                ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
                ("scheme".to_owned(), scheme.to_owned()),
            ]
            .into();
            let note = {
                let cluster = cluster.clone();
                move || format!("{}; {}", cluster.health(std::time::Instant::now()), scheme)
            };
            let note: Arc<dyn Report> = Arc::new(note);
            Some((consul, reg, note, follow))
        }
    };
    let config = GatewayConfig {
        require_auth: args.require_auth,
        default_limits: KeyLimits {
            requests: args.default_rpm,
            input_tokens: args.default_itpm,
            output_tokens: args.default_otpm,
        },
        limit_share: 1.0 / f64::from(args.replicas),
        cache_bytes: args.cache_mb * 1024 * 1024,
        max_prompt_bytes: args.max_prompt_bytes,
        sanitize: args.sanitize,
        lease_fraction: args.lease_fraction,
        lease: Duration::from_secs(args.lease_s),
        degrade: degrade(&args)?.0,
        migration_limit: args.migration_limit,
        migration_max_tokens: args.migration_max_tokens,
        migration_wait: Duration::from_millis(args.migration_wait_ms),
        stall_timeout: Duration::from_millis(args.stall_timeout_ms.max(1)),
        response_ttl_s: args.response_ttl_s.max(1),
    };
    cluster.set_thresholds(degrade(&args)?.1);
    let audit = match audit_config(&args)? {
        Some(c) => {
            let dir = c.dir.clone();
            let log = AuditLog::open(c, &args.node_id, &args.region.region)
                .with_context(|| format!("opening the audit log in {}", dir.display()))?;
            // No request before the orchestrators confirm this chain is the one committed for this frontend.
            log.hold_until_confirmed();
            Some(Arc::new(log))
        }
        None => None,
    };
    let gateway = Arc::new(Gateway::new(upstream.clone(), cluster.clone(), config));
    let reports = tokio::spawn(report_loop(
        gateway.reporter().clone(),
        upstream.clone(),
        cluster.clone(),
        audit.clone(),
        Duration::from_millis(args.report_interval_ms),
    ));
    let fsync = audit.clone().map(|log| {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let log = log.clone();
                let _ = tokio::task::spawn_blocking(move || log.sync()).await;
            }
        })
    });
    let sync = tokio::spawn(sync_loop(cluster, upstream, Duration::from_millis(args.sync_interval_ms)));
    let sweeper = {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                gateway.sweep();
            }
        })
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(http::tls_config(cert, key)?),
        _ => None,
    };
    let spill = Arc::new(spill(&args)?);
    let mut peers: Vec<String> = spill.regions.peers().iter().map(|p| format!("{} at {}", p.region, p.url)).collect();
    let consul_peers = match (&consul, args.peer_regions_from_consul) {
        (Some((c, ..)), true) => {
            peers.push("other consul datacenters".into());
            let trust = http::spill::PeerTrust {
                allow: args.peer_region_allow.clone(),
                insecure_http: args.peer_insecure_http,
            };
            Some(tokio::spawn(http::spill::follow_consul_peers(c.client.clone(), spill.clone(), trust)))
        }
        _ => None,
    };
    let edge = http::EdgeLimits {
        header_timeout: Duration::from_secs(args.header_timeout_s),
        body_timeout: Duration::from_secs(args.body_timeout_s),
        max_connections: args.max_connections,
        max_connections_per_client: args.max_connections_per_client,
    };
    let app = App { gateway, body_limit: args.body_limit_mb * 1024 * 1024, edge, spill, audit: audit.clone() };
    let listener = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .with_context(|| format!("binding the HTTP API to {}", args.http_addr))?;
    // Registered once it listens.
    let consul = consul.map(|(consul, reg, note, follow)| {
        (Registrar::spawn(consul.client.clone(), reg, note, consul.status.clone()), follow)
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    let orchestrators = if consul.is_some() {
        format!("found through consul at {}", args.peers.discovery.consul_addr)
    } else {
        args.peers.orchestrators.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    };
    let peers = if peers.is_empty() { "none".to_owned() } else { peers.join(", ") };
    eprintln!(
        "zl-frontend: {} serving {scheme}://{} in region {} (orchestrators: {orchestrators}; peer regions: {peers}; \
         metrics on http://{}/metrics)",
        args.node_id,
        listener.local_addr()?,
        args.region.region,
        args.metrics_addr
    );
    http::serve(
        listener,
        http::router(app),
        tls,
        async {
            zl_node::shutdown_signal().await;
            // Draining: out of consul's passing answers while open requests finish.
            if let Some((registrar, ..)) = &consul {
                registrar.maintenance("draining: finishing open requests").await;
            }
        },
        Duration::from_secs(args.drain_timeout_s),
        edge,
    )
    .await;
    if let Some((registrar, follow)) = consul {
        follow.abort();
        registrar.deregister().await;
    }
    eprintln!("zl-frontend: stopped");
    if let Some(resolver) = resolver {
        resolver.abort();
    }
    if let Some(task) = consul_peers {
        task.abort();
    }
    sync.abort();
    sweeper.abort();
    reports.abort();
    if let Some(task) = fsync {
        task.abort();
    }
    if let Some(log) = audit {
        log.sync();
    }
    Ok(())
}

fn main() -> Result<()> {
    // Request bodies of up to 32 MB come and go: give their memory back when they go.
    zl_node::memory::return_large_allocations();
    match zl_node::start::<Cli>()?.command {
        Command::Serve(args) if args.check_config => {
            check(&args)?;
            println!("zl-frontend: the configuration is valid");
            Ok(())
        }
        Command::Serve(args) => zl_node::block_on(serve(args)),
    }
}
