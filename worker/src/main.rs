//! `zl-worker`: serves models over zerolayer's RPC, fetches the default model, and benchmarks the engine.

mod commands;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use zl_node::consul::catalog::{ORCHESTRATOR_SERVICE, WORKER_SERVICE};
use zl_node::consul::{Registrar, watch};
use zl_node::discovery::{Backend, OrchestratorArgs};
use zl_node::status::Readiness;
use zl_proto::quic::{Client, Server};
use zl_wire::message::{ComputePool, ModelInfo, NodeId, RegisterWorker, Role};
use zl_worker::adapters::{AdapterCache, AdapterSettings};
use zl_worker::consul_report::{ReportedEngine, WorkerReport};
use zl_worker::engine::{EngineCore, EngineHandle};
use zl_worker::fetch;
use zl_worker::kv::tier::Namespace;
use zl_worker::kv::tier::store::{TierConfig, Tiers};
use zl_worker::model::embed::{self, EmbeddingModel};
use zl_worker::model::llama::{KvDtype, KvStore};
use zl_worker::registration::{DirectDiscovery, Discovery, ReportedModel, run_reporter};
use zl_worker::scheduler::SchedulerConfig;
use zl_worker::serve::{ServedModel, Speculation, WorkerService};

/// zerolayer worker: runs models and streams tokens to frontends.
#[derive(Parser, Debug)]
#[command(name = "zl-worker", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve models over QUIC (mutual TLS) with a Prometheus endpoint.
    #[command(args_override_self = true)]
    Serve(Box<ServeArgs>),
    /// Download the bundled default model into the cache (once) and print its path.
    FetchDefaultModel,
    /// Measure prefill and decode throughput at several concurrency levels.
    Bench(commands::bench::BenchArgs),
    /// Measure quality: `--perplexity FILE` scores a text (`--float` adds the float reference path).
    Eval(commands::eval::EvalArgs),
}

/// Model and engine settings shared by `serve` and `bench`.
#[derive(Args, Debug, Clone)]
pub(crate) struct ModelArgs {
    /// Model to serve, repeatable: a GGUF file or a Hugging Face directory, as `PATH` or `ID=PATH`. Default: the
    /// bundled SmolLM2-135M-Instruct (fetched into the cache), served as smollm2-135m-instruct.
    #[arg(long = "model", env = "ZL_MODELS", value_delimiter = ',')]
    models: Vec<String>,
    /// KV-cache memory budget in MiB, shared equally by the models. Default 512: about 23k tokens of the default
    /// model.
    #[arg(long, env = "ZL_KV_MEMORY_MB", default_value_t = 512)]
    kv_memory_mb: usize,
    /// Tokens per KV block.
    #[arg(long, env = "ZL_KV_BLOCK_SIZE", default_value_t = 16)]
    kv_block_size: usize,
    /// How the KV cache stores keys and values: f16, or q8 (8-bit blocks of 32 with an f16 scale, 1.88x the
    /// tokens per MiB; CPU only).
    #[arg(long, env = "ZL_KV_DTYPE", value_enum, default_value_t = KvDtype::F16)]
    kv_dtype: KvDtype,
    /// Host memory in MiB for KV blocks evicted from the KV cache (the hot pool), shared equally by the models: a
    /// prompt whose cached prefix continues there takes it back instead of computing it again. 0 (the default)
    /// turns the KV tiers off.
    #[arg(long, env = "ZL_KV_HOST_MB", default_value_t = 0)]
    kv_host_mb: usize,
    /// A directory for the KV cache's disk tier (needs --kv-host-mb): full blocks are written through as they
    /// fill, read back into host memory while their request waits, and found again after a restart.
    #[arg(long, env = "ZL_KV_DISK_DIR")]
    kv_disk_dir: Option<PathBuf>,
    /// The disk tier's bound in MiB, shared equally by the models.
    #[arg(long, env = "ZL_KV_DISK_MB", default_value_t = 4096)]
    kv_disk_mb: usize,
    /// Bits of the CPU kernels' activations: auto (8 for the formats where the rule in docs/worker.md, "8-bit
    /// activations", held: Q4_K, Q6_K, Q5_0, Q5_1; 16 for the others: Q4_0, Q4_1, Q8_0, ...), 8 (every format
    /// with 8-bit kernels: llama.cpp's width, twice the products per instruction) or 16 (every matrix: the float
    /// reference path's exact greedy answers). 8 and 16 are for the CPU; a GPU computes in its own precision.
    #[arg(long, env = "ZL_ACTIVATIONS", default_value = "auto", value_parser = ["auto", "8", "16"])]
    activations: String,
    /// Sequences in the running batch at most.
    #[arg(long, env = "ZL_MAX_RUNNING", default_value_t = 32)]
    max_running: usize,
    /// Predictive streaming for requests that do not say (`x-zl-streaming-predicted`): true or false.
    #[arg(long, env = "ZL_STREAMING_PREDICTED", default_value_t = true, action = clap::ArgAction::Set)]
    streaming_predicted: bool,
    /// Draft tokens a speculating sequence verifies per step at most; 0 turns predictive streaming off for every
    /// request.
    #[arg(long, env = "ZL_MAX_DRAFT_TOKENS", default_value_t = zl_worker::speculate::DEFAULT_MAX_DRAFT)]
    max_draft_tokens: usize,
    /// Draft tokens only fill a step up to this many decode rows plus drafts: busier steps are compute-bound and
    /// decode without drafts.
    #[arg(long, env = "ZL_SPECULATIVE_ROWS", default_value_t = 16)]
    speculative_rows: usize,
    /// Where the models run: cpu, or cuda:N (an NVIDIA GPU; needs a build with `--features cuda`). The KV budget
    /// (`--kv-memory-mb`) is then device memory.
    #[arg(long, env = "ZL_DEVICE", default_value = "cpu")]
    device: zl_worker::device::Device,
}

impl ModelArgs {
    /// The KV tiers' sizes for each of `models` models.
    pub(crate) fn tiers(&self, models: usize) -> Result<TierConfig> {
        if self.kv_disk_dir.is_some() && self.kv_host_mb == 0 {
            bail!("--kv-disk-dir needs --kv-host-mb: blocks read from disk are taken back through host memory");
        }
        let per = |mb: usize| mb as u64 * 1024 * 1024 / models.max(1) as u64;
        Ok(TierConfig {
            host_bytes: per(self.kv_host_mb) as usize,
            disk: self.kv_disk_dir.clone().map(|dir| (dir, per(self.kv_disk_mb))),
        })
    }

    /// The speculation settings these flags ask for.
    pub(crate) fn speculation(&self) -> Speculation {
        Speculation { by_default: self.streaming_predicted, max_draft: self.max_draft_tokens }
    }
}

#[derive(Args, Debug)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// UDP address for the QUIC endpoint.
    #[arg(long, env = "ZL_LISTEN", default_value = "127.0.0.1:7100")]
    listen: SocketAddr,
    /// TCP address for Prometheus metrics (`/metrics`).
    #[arg(long, env = "ZL_METRICS_ADDR", default_value = "127.0.0.1:9100")]
    metrics_addr: SocketAddr,
    /// This worker's node id (a lowercase DNS label; must match its certificate).
    #[arg(long, env = "ZL_NODE_ID", default_value = "worker-0")]
    node_id: String,
    /// Directory with ca.pem and worker-{node-id}.pem/.key (see `zl certs`).
    #[arg(long, env = "ZL_TLS_DIR")]
    tls_dir: PathBuf,
    /// TOML file of settings named like these flags (see docs/zl-worker.example.toml); flags and ZL_* variables
    /// override it.
    #[arg(long, env = "ZL_CONFIG")]
    config: Option<PathBuf>,
    /// Enrolling for a certificate of its own (when --tls-dir holds a bootstrap credential instead).
    #[command(flatten)]
    identity: zl_node::enroll::IdentityArgs,
    /// The orchestrators to register with (none: standalone).
    #[command(flatten)]
    peers: OrchestratorArgs,
    /// host:port the orchestrators hand to frontends (default: the listen address).
    #[arg(long, env = "ZL_ADVERTISE")]
    advertise: Option<String>,
    /// The pool this worker serves: cpu, hybrid or gpu (default: gpu with `--device cuda:N`, else cpu).
    #[arg(long, env = "ZL_DEVICE_CLASS", value_parser = ["cpu", "hybrid", "gpu"])]
    device_class: Option<String>,
    #[command(flatten)]
    region: zl_node::region::RegionArgs,
    /// How often load and KV events go to the orchestrators.
    #[arg(long, env = "ZL_REPORT_INTERVAL_MS", default_value_t = 250)]
    report_interval_ms: u64,
    /// Serve LoRA adapters read from this directory (the chart's shared adapter volume): a request's adapter
    /// path must lie inside it. Unset: requests naming an adapter are refused.
    #[arg(long, env = "ZL_ADAPTER_ROOT")]
    adapter_root: Option<PathBuf>,
    /// LoRA adapters kept loaded at most; to load another, the least recently used idle one is evicted (one that
    /// running requests use never is).
    #[arg(long, env = "ZL_MAX_ADAPTERS", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    max_adapters: u64,
    /// Memory the loaded adapters' updates may take, in MiB (0: no limit beyond --max-adapters); idle ones are
    /// evicted, least recently used first, to stay within it.
    #[arg(long, env = "ZL_ADAPTER_MEMORY_MB", default_value_t = 0)]
    adapter_memory_mb: u64,
    /// On shutdown (SIGTERM), how long running requests may take to finish here; those still running then are
    /// handed over: frontends resume each on another worker after the tokens it has (migration), so none fails.
    #[arg(long, env = "ZL_DRAIN_TIMEOUT_S", default_value_t = 30)]
    drain_timeout_s: u64,
    /// Check the settings (flags, ZL_* variables, the config file) and exit: 0 and "valid" when they are, the first
    /// problem otherwise. Files they name (certificates, models, tokens) are not read.
    #[arg(long)]
    check_config: bool,
}

pub(crate) struct Loaded {
    pub(crate) id: String,
    pub(crate) run: Run,
    pub(crate) sha256: [u8; 32],
    pub(crate) path: PathBuf,
}

/// What a loaded model runs on.
pub(crate) enum Run {
    /// A generative model's engine.
    Generate(Box<EngineCore>),
    /// An embedding model.
    Embed(Box<EmbeddingModel>),
}

/// The models to load: (id, path), the default model when none is named.
fn model_specs(args: &ModelArgs) -> Result<Vec<(String, PathBuf)>> {
    if args.models.is_empty() {
        let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("zl-worker: {m}"))?;
        return Ok(vec![(fetch::DEFAULT_MODEL_ID.to_owned(), path)]);
    }
    let mut specs: Vec<(String, PathBuf)> = Vec::new();
    for spec in &args.models {
        let (id, path) = match spec.split_once('=') {
            Some((id, path)) => (id.to_owned(), PathBuf::from(path)),
            None => {
                let path = PathBuf::from(spec);
                let stem = path.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().to_lowercase());
                (stem, path)
            }
        };
        if id.is_empty() || id.len() > 256 || id.chars().any(char::is_whitespace) {
            bail!("--model {spec:?}: the id must be 1 to 256 characters without spaces");
        }
        if specs.iter().any(|(other, _)| *other == id) {
            bail!("--model {spec:?}: id {id} is used twice");
        }
        specs.push((id, path));
    }
    Ok(specs)
}

/// Set the activations' width `args` asks for (on the CPU).
fn activations(llama: &mut zl_worker::model::llama::Llama, args: &ModelArgs) -> Result<()> {
    use zl_worker::model::kernels::Activations;
    let (width, formats) = match args.activations.as_str() {
        "auto" => (Activations::Eight, Activations::EIGHT_BY_DEFAULT),
        bits => (bits.parse::<Activations>().map_err(|e| anyhow::anyhow!(e))?, &[][..]),
    };
    if args.device != zl_worker::device::Device::Cpu {
        if args.activations != "auto" {
            anyhow::bail!(
                "--activations {} is for the CPU kernels; {} computes in its own precision",
                width.bits(),
                args.device
            );
        }
        return Ok(());
    }
    let share = llama.set_activations(width, formats);
    if share == 0.0 && width == Activations::Eight {
        eprintln!(
            "zl-worker: 16-bit activations (--activations {}: no matrix of a format it applies to)",
            args.activations
        );
    } else {
        eprintln!("zl-worker: {} (--activations {})", width.note(share), args.activations);
    }
    Ok(())
}

pub(crate) fn load(args: &ModelArgs) -> Result<Vec<Loaded>> {
    let specs = model_specs(args)?;
    let tiers = args.tiers(specs.len())?;
    let budget = args.kv_memory_mb * 1024 * 1024 / specs.len();
    let mut loaded = Vec::new();
    for (id, path) in specs {
        eprintln!(
            "zl-worker: loading {id} from {} (CPU kernels: {})",
            path.display(),
            zl_worker::model::kernels::Isa::current().name()
        );
        let files = if path.is_dir() { zl_worker::model::hf::shards(&path)? } else { vec![path.clone()] };
        let started = std::time::Instant::now();
        let digest = fetch::sha256_files(&files)?;
        let hashed = started.elapsed();
        if embed::is_embedding(&path)? {
            let mut model = embed::load(&path, zl_worker::model::Precision::Native)
                .with_context(|| format!("loading {}", path.display()))?;
            if let embed::Net::Decoder { llama, .. } = &mut model.net {
                activations(llama, args)?;
            }
            eprintln!(
                "zl-worker: loaded {id} in {:.2} s: an embedding model ({}, {}-wide vectors, {} pooling, inputs up to \
                 {} tokens), {:.1} MB of weights in memory",
                started.elapsed().as_secs_f64(),
                model.family,
                model.dims,
                model.pooling.name(),
                model.context_length,
                model.weight_bytes() as f64 / 1e6
            );
            loaded.push(Loaded { id, run: Run::Embed(Box::new(model)), sha256: digest, path });
            continue;
        }
        let mut model = zl_worker::model::load(&path).with_context(|| format!("loading {}", path.display()))?;
        activations(&mut model.llama, args)?;
        eprintln!(
            "zl-worker: loaded {id} in {:.2} s ({:.2} s of it hashing the weights); weights in memory: {}",
            started.elapsed().as_secs_f64(),
            hashed.as_secs_f64(),
            model.llama.weights_summary()
        );
        let config = SchedulerConfig {
            max_running: args.max_running,
            speculative_rows: args.speculative_rows,
            ..SchedulerConfig::default()
        };
        let cfg = model.llama.config();
        args.kv_dtype.check(cfg.kv_dim()).map_err(|e| anyhow::anyhow!("{id}: {e}"))?;
        let sizing = KvStore::sizing(cfg, args.kv_block_size, config.max_running, config.max_item(), args.kv_dtype);
        let layout =
            sizing.layout(budget).map_err(|e| anyhow::anyhow!("--kv-memory-mb {} for {id}: {e}", args.kv_memory_mb))?;
        eprintln!(
            "zl-worker: {id}: KV cache {}: {} blocks of {} tokens ({} bytes a token)",
            args.kv_dtype.name(),
            layout.blocks,
            args.kv_block_size,
            KvStore::bytes_per_token(cfg, args.kv_dtype)
        );
        if let Some(w) = layout.window {
            eprintln!(
                "zl-worker: {id}: sliding-window layers keep {} blocks of their own ({}-token window), the others {}",
                w.blocks, w.window, layout.blocks
            );
        }
        let mut core = EngineCore::on_device(model, args.device, layout, args.kv_block_size, config)?;
        attach_tiers(&mut core, args, &tiers, &id, &digest)?;
        if let Some((free, total)) = core.device_memory() {
            eprintln!(
                "zl-worker: {id} on {}: {:.1} of {:.1} GiB of device memory free",
                args.device,
                free as f64 / (1u64 << 30) as f64,
                total as f64 / (1u64 << 30) as f64
            );
        }
        loaded.push(Loaded { id, run: Run::Generate(Box::new(core)), sha256: digest, path });
    }
    Ok(loaded)
}

/// Give `core` its KV tiers, when `tiers` asks for them and its blocks can go there.
fn attach_tiers(
    core: &mut EngineCore,
    args: &ModelArgs,
    tiers: &TierConfig,
    id: &str,
    digest: &[u8; 32],
) -> Result<()> {
    if !tiers.enabled() {
        return Ok(());
    }
    let Some(payload) = core.tier_block_bytes() else {
        eprintln!("zl-worker: {id}: its sliding-window layers keep KV blocks of their own: it runs without KV tiers");
        return Ok(());
    };
    let kernels = format!("{}/{}", zl_worker::model::kernels::Isa::current().name(), args.activations);
    let ns = Namespace::new(digest, args.kv_dtype, args.kv_block_size, &kernels);
    let (t, opened) = Tiers::open(ns, args.kv_block_size, payload, tiers, id)
        .with_context(|| format!("{id}: opening the KV disk tier"))?;
    core.attach_tiers(t).map_err(|e| anyhow::anyhow!("{id}: {e}"))?;
    eprintln!(
        "zl-worker: {id}: KV tiers: {} MiB of host memory{}",
        tiers.host_bytes >> 20,
        match (&tiers.disk, opened) {
            (Some((dir, cap)), Some(o)) => format!(
                ", {} MiB on disk in {} ({} blocks found, {} files removed)",
                cap >> 20,
                dir.join(ns.hex()).display(),
                o.kept,
                o.removed
            ),
            _ => String::new(),
        }
    );
    Ok(())
}

/// The settings' checks that need no file; returns the node id and the address orchestrators hand out.
fn check(args: &ServeArgs) -> Result<(NodeId, String)> {
    let node_id = NodeId::new(args.node_id.clone()).map_err(|e| anyhow::anyhow!("--node-id: {e}"))?;
    args.peers.check(false)?;
    args.region.check()?;
    let announced = args.peers.discovery.discovery == Backend::Consul || !args.peers.orchestrators.is_empty();
    let advertise = match &args.advertise {
        Some(a) => zl_node::resolve::parse_address(a).map_err(|e| anyhow::anyhow!("--advertise: {e}"))?,
        None if args.listen.ip().is_unspecified() && announced => {
            bail!("--listen {} is a wildcard address: give --advertise HOST:PORT for the orchestrators", args.listen)
        }
        None => args.listen.to_string(),
    };
    if args.report_interval_ms == 0 {
        bail!("--report-interval-ms must be at least 1");
    }
    if !args.model.models.is_empty() {
        model_specs(&args.model)?;
    }
    args.model.tiers(1)?;
    Ok((node_id, advertise))
}

async fn serve(args: ServeArgs) -> Result<()> {
    let (node_id, advertise) = check(&args)?;
    let identity = args.identity.load(&args.tls_dir, &args.peers.orchestrators, Role::Worker, &args.node_id).await?;
    let consul = args.peers.consul(false)?;
    let announced = consul.is_some() || !args.peers.orchestrators.is_empty();
    // Alive from here on; ready once the models are loaded and (unless standalone) an orchestrator has taken the
    // registration.
    let readiness: Arc<std::sync::OnceLock<Readiness>> = Arc::default();
    let probe = {
        let readiness = readiness.clone();
        Arc::new(move || match readiness.get() {
            None => Err("loading the models".to_owned()),
            Some(ready) => ready(),
        })
    };
    zl_node::status::serve(args.metrics_addr, probe).await?;
    // Which CPU kernels run (the same results on each; only the speed differs), for dashboards comparing nodes.
    metrics::gauge!("zl_worker_cpu_kernels", "isa" => zl_worker::model::kernels::Isa::current().name()).set(1.0);
    let mut served = Vec::new();
    let mut kv_bytes_per_token = 0;
    for loaded in load(&args.model)? {
        let core = match loaded.run {
            Run::Generate(core) => core,
            Run::Embed(model) => {
                served.push(ServedModel {
                    context_length: model.context_length as u32,
                    family: model.family.clone(),
                    weights_bytes: model.weight_bytes() as u64,
                    tokenizer: Arc::new(model.tokenizer.clone()),
                    grammar: None,
                    embedding: Some((model.dims as u32, model.pooling.name())),
                    engine: zl_worker::engine::embedder::spawn(*model, &loaded.id)?,
                    kv_block_size: args.model.kv_block_size as u32,
                    speculation: args.model.speculation(),
                    config: Default::default(),
                    id: loaded.id,
                    weights_sha256: loaded.sha256,
                    tiers: None,
                });
                continue;
            }
        };
        let cfg = core.model().llama.config().clone();
        let per_token = KvStore::bytes_per_token(&cfg, args.model.kv_dtype) as u64;
        kv_bytes_per_token = kv_bytes_per_token.max(per_token);
        let labels = [("model", loaded.id.clone()), ("dtype", args.model.kv_dtype.name().to_owned())];
        metrics::gauge!("zl_worker_kv_bytes_per_token", &labels).set(per_token as f64);
        let tokenizer = Arc::new(core.model().tokenizer.clone());
        let family = core.model().family.clone();
        let weights_bytes = core.model().llama.weight_bytes_by_format().values().sum::<usize>() as u64;
        let grammar = zl_grammar::Engine::new(&tokenizer)
            .map_err(|e| anyhow::anyhow!("{}: cannot index the vocabulary for constrained decoding: {e}", loaded.id))?;
        let tiers = core.tiers().cloned();
        let engine = EngineHandle::spawn(*core, &loaded.id)?;
        served.push(ServedModel {
            tiers,
            id: loaded.id,
            weights_sha256: loaded.sha256,
            context_length: cfg.context_length as u32,
            family,
            weights_bytes,
            tokenizer,
            grammar: Some(grammar),
            embedding: None,
            engine,
            kv_block_size: args.model.kv_block_size as u32,
            speculation: args.model.speculation(),
            config: cfg.clone(),
        });
    }
    let ids: Vec<String> = served.iter().map(|m| m.id.clone()).collect();
    let device_class = args.device_class.clone().unwrap_or_else(|| args.model.device.pool().to_owned());
    let registration = RegisterWorker {
        worker_id: node_id.clone(),
        endpoint: advertise.clone(),
        device_class: match device_class.as_str() {
            "gpu" => ComputePool::Gpu,
            "hybrid" => ComputePool::Hybrid,
            _ => ComputePool::Cpu,
        },
        models: served
            .iter()
            .map(|m| ModelInfo {
                id: m.id.clone(),
                weights_sha256: m.weights_sha256,
                context_length: m.context_length,
                family: m.family.clone(),
                weights_bytes: m.weights_bytes,
                embedding_dims: m.embedding.map_or(0, |e| e.0),
            })
            .collect(),
        kv_block_size: args.model.kv_block_size as u32,
        kv_blocks_total: served
            .iter()
            .filter_map(|m| m.engine.published(false).stats.kv.map(|kv| kv.total as u32))
            .sum(),
        max_running_sequences: args.model.max_running as u32,
        kv_dtype: args.model.kv_dtype.name().to_owned(),
        kv_bytes_per_token: u32::try_from(kv_bytes_per_token).unwrap_or(u32::MAX),
    };
    let reported: Vec<ReportedModel> =
        served.iter().map(|m| ReportedModel { id: m.id.clone(), engine: m.engine.clone() }).collect();
    let adapters = Arc::new(AdapterCache::new(AdapterSettings {
        root: args.adapter_root.clone(),
        max: args.max_adapters as usize,
        max_bytes: (args.adapter_memory_mb as usize) << 20,
    }));
    let report = WorkerReport {
        models: served
            .iter()
            .map(|m| ReportedEngine {
                id: m.id.clone(),
                sha256: zl_common::keys::hex(&m.weights_sha256),
                weights_bytes: m.weights_bytes,
                engine: m.engine.clone(),
            })
            .collect(),
        device: device_class.clone(),
        region: args.region.region.clone(),
        max_running: args.model.max_running as u32,
        kv_budget_bytes: (args.model.kv_memory_mb as u64) << 20,
        kv_dtype: args.model.kv_dtype.name().to_owned(),
        kv_bytes_per_token,
        adapters: adapters.clone(),
    };
    let service = Arc::new(WorkerService::new(served, adapters.clone()));
    let server = Server::spawn(args.listen, &identity, zl_worker::rpc_settings(), service.clone())?;
    let discovery = Arc::new(DirectDiscovery::new(Client::new(&identity, zl_worker::rpc_settings())?, vec![]));
    let resolver = {
        let discovery = discovery.clone();
        let apply = move |addrs: Vec<SocketAddr>| discovery.set_orchestrators(&addrs);
        zl_node::resolve::follow_static(args.peers.orchestrators.clone(), zl_node::resolve::RESOLVE_EVERY, apply).await
    };
    // With consul: register this worker's service (it serves from now on) and follow the passing orchestrators.
    let (registrar, orchestrator_watch) = match &consul {
        None => (None, None),
        Some(consul) => {
            let mut reg = consul.registration(WORKER_SERVICE, node_id.as_str(), &advertise)?;
            reg.tags = report.tags();
            reg.meta = report.meta_now().encode();
            let registrar = Registrar::spawn(consul.client.clone(), reg, Arc::new(report), consul.status.clone());
            let discovery = discovery.clone();
            let apply = move |addrs: Vec<SocketAddr>| discovery.set_orchestrators(&addrs);
            let follow =
                watch::follow_addresses(consul.client.clone(), ORCHESTRATOR_SERVICE, consul.status.clone(), apply);
            (Some(registrar), Some(follow))
        }
    };
    let _ = readiness.set({
        let (service, discovery) = (service.clone(), discovery.clone());
        Arc::new(move || {
            if service.draining() {
                return Err("draining".to_owned());
            }
            match discovery.registered_with() {
                0 if announced => Err("no orchestrator has taken the registration yet".to_owned()),
                0 => Ok("serving standalone".to_owned()),
                n => Ok(format!("registered with {n} orchestrator(s)")),
            }
        })
    });
    // `zl admin drain --migrate` reaches the worker in its orchestrators' answers: hand over (and back on undrain).
    let operator = {
        let (service, mut asked) = (service.clone(), discovery.hand_over_requests());
        tokio::spawn(async move {
            while asked.changed().await.is_ok() {
                let on = *asked.borrow_and_update();
                service.operator_hand_over(on);
            }
        })
    };
    let (stop_reports, stop_rx) = tokio::sync::watch::channel(false);
    let reporter = announced.then(|| {
        let discovery = discovery.clone();
        let interval = Duration::from_millis(args.report_interval_ms);
        let registration = registration.clone();
        tokio::spawn(
            async move { run_reporter(&*discovery, registration, reported, adapters, interval, stop_rx).await },
        )
    });
    eprintln!(
        "zl-worker: serving {} on {} (metrics on http://{}/metrics){}",
        ids.join(", "),
        server.local_addr(),
        args.metrics_addr,
        if consul.is_some() {
            format!(", discovering orchestrators through consul at {}", args.peers.discovery.consul_addr)
        } else if args.peers.orchestrators.is_empty() {
            String::from(", standalone")
        } else {
            format!(", registering with {} orchestrator(s)", args.peers.orchestrators.len())
        }
    );
    zl_node::shutdown_signal().await;
    // Drain: leave the routing tables first so no new request arrives (consul: maintenance, out of every
    // passing answer), refuse any that still do, let running ones finish (up to the drain timeout), then close
    // and deregister.
    eprintln!("zl-worker: draining");
    if let Some(registrar) = &registrar {
        registrar.maintenance("draining: finishing running requests").await;
    }
    service.drain();
    let _ = stop_reports.send(true);
    if let Some(reporter) = reporter {
        let _ = reporter.await;
        discovery.deregister(&node_id, "graceful shutdown").await;
    }
    if let Some(resolver) = resolver {
        resolver.abort();
    }
    operator.abort();
    if let Some(follow) = orchestrator_watch {
        follow.abort();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.drain_timeout_s);
    while service.busy() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if service.busy() {
        eprintln!("zl-worker: drain timeout: handing the running requests over to other workers");
        service.hand_over();
        let handed = tokio::time::Instant::now() + Duration::from_secs(5);
        while service.busy() && tokio::time::Instant::now() < handed {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    server.shutdown(Duration::from_secs(5)).await;
    if let Some(registrar) = registrar {
        registrar.deregister().await;
    }
    eprintln!("zl-worker: stopped");
    Ok(())
}

fn main() -> Result<()> {
    match zl_node::start::<Cli>()?.command {
        Command::FetchDefaultModel => {
            let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("zl-worker: {m}"))?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Bench(args) => commands::bench::run(&args),
        Command::Eval(args) => commands::eval::run(&args),
        Command::Serve(args) if args.check_config => {
            check(&args)?;
            println!("zl-worker: the configuration is valid");
            Ok(())
        }
        Command::Serve(args) => zl_node::block_on(serve(*args)),
    }
}
