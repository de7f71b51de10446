//! What every zerolayer tier binary (`zl-worker`, `zl-orchestrator`, `zl-frontend`) shares: TOML config files
//! layered under flags and `ZL_*` variables, shutdown signals, loading a node's TLS identity from a directory
//! written by `zl certs`, the Prometheus endpoint, and the allocator setting that returns large buffers
//! ([`memory`]).

pub mod audit;
pub mod config;
pub mod consul;
pub mod discovery;
pub mod enroll;
pub mod http_client;
pub mod memory;
pub mod metrics_help;
pub mod otlp;
pub mod pem;
pub mod private;
pub mod region;
pub mod resolve;
pub mod status;

use std::path::Path;

use anyhow::{Context, Result};
use zl_tls::{NodeFiles, TlsIdentity};
use zl_wire::message::{NodeId, Role};

/// Start a tier binary: install the one TLS crypto provider, log to stderr (filter: `ZL_LOG`; colours only on a
/// terminal, so log files and collectors get plain text), and parse the command line with the config file of
/// `serve` (if any) layered under flags and `ZL_*` variables.
pub fn start<C: clap::Parser>() -> Result<C> {
    zl_tls::install_default_provider();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        use tracing_subscriber::{Layer, fmt};
        // Spans go to an OpenTelemetry collector too when ZL_OTLP_ENDPOINT is set.
        let otel = otlp::layer_from_env();
        let logs = fmt::layer().with_ansi(ansi).with_filter(tracing_subscriber::EnvFilter::from_env("ZL_LOG"));
        tracing_subscriber::registry().with(otel.with_filter(otlp::targets())).with(logs).init();
    }
    let argv = config::expand(&C::command(), "serve", std::env::args_os().collect())?;
    Ok(C::parse_from(argv))
}

/// Run a tier's async main on a multi-threaded runtime; then send the spans still buffered for OTLP export.
pub fn block_on<T>(main: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let result = tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(main);
    otlp::shutdown();
    result
}

/// Load `{dir}/ca.pem` and the node's `{dir}/{role}-{id}.pem` / `.key`, as `zl certs issue` names them (nodes
/// that may enroll use [`enroll::identity`]).
pub fn load_identity(dir: &Path, role: Role, id: &str) -> Result<TlsIdentity> {
    let node_id = NodeId::new(id.to_owned()).map_err(|e| anyhow::anyhow!("--node-id: {e}"))?;
    let files = NodeFiles::new(dir, role, node_id.as_str());
    let identity = TlsIdentity::from_files(&files.ca, &files.cert, &files.key, role, node_id)
        .with_context(|| format!("loading the TLS identity {} from {}", files.stem, dir.display()))?;
    keep_fresh(&identity);
    Ok(identity)
}

/// Look at `identity`'s certificate files every few seconds (in the background, when a runtime runs): a rotated
/// certificate is taken, and `zl_tls_certificate_*` show it, even while no new connection is made.
pub fn keep_fresh(identity: &TlsIdentity) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let identity = identity.clone();
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                tick.tick().await;
                identity.refresh();
            }
        });
    }
}

/// Buckets of every latency histogram (`*_seconds`): microsecond route decisions to minute-long answers.
pub const LATENCY_BUCKETS: [f64; 21] = [
    0.000_01, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Buckets of the billing unit's histogram, in [0, 1].
pub const UNIT_BUCKETS: [f64; 10] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// Record metrics and return the renderer of the Prometheus text ([`status::serve`] serves it on every tier's
/// internal metrics address). Upkeep runs on every render and every 5 s. Histograms are Prometheus histograms
/// (`_bucket{le}`, `_sum`, `_count`), which aggregate across pods with `histogram_quantile` (summaries cannot).
pub fn metrics_renderer() -> Result<std::sync::Arc<dyn Fn() -> String + Send + Sync>> {
    use metrics_exporter_prometheus::Matcher;
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("zl_frontend_billing_unit".into()), &UNIT_BUCKETS))
        .context("the metrics' histogram buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    metrics_help::describe_all();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(std::sync::Arc::new(move || {
        handle.run_upkeep();
        handle.render()
    }))
}

/// Resolves once this process's parent has changed (it was re-parented: the supervisor exited), when
/// [`EXIT_WITH_PARENT_ENV`] is set; never otherwise. Polls twice a second.
#[cfg(unix)]
async fn orphaned() {
    if std::env::var_os(EXIT_WITH_PARENT_ENV).is_none() {
        return std::future::pending().await;
    }
    let parent = std::os::unix::process::parent_id();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tick.tick().await;
        if std::os::unix::process::parent_id() != parent {
            tracing::warn!(parent, "the supervising process is gone: shutting down");
            return;
        }
    }
}

/// Set (to anything) in a process's environment by a supervisor (`zl up`) that wants it to stop when the
/// supervisor is gone, even killed outright: [`shutdown_signal`] then also resolves when the process is orphaned.
pub const EXIT_WITH_PARENT_ENV: &str = "ZL_EXIT_WITH_PARENT";

/// Resolves on Ctrl-C or SIGTERM (what Kubernetes sends before killing a pod), and, under a supervisor that set
/// [`EXIT_WITH_PARENT_ENV`], when the supervisor is gone (a `zl up` killed with SIGKILL left its processes holding
/// their ports; the next `zl up` could not start).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                    _ = orphaned() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
