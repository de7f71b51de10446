//! `zl bench`'s arguments and the run they describe: levels one after another, a table after each, then the
//! results file and the plots. The `zl` binary passes in the defaults of a running `zl up` ([`Defaults`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};

use crate::api::Flavour;
use crate::client::{Endpoint, split_url, tls_config};
use crate::direct::DirectWorker;
use crate::jsonl::read_jsonl;
use crate::load::sweep;
use crate::progress::{Progress, Ticker};
use crate::report::{FORMAT, LevelResult, Report, level_rows, table_head};
use crate::runner::{Plan, Target, run_level};
use crate::stats::{Targets, summarize};
use crate::trace::{TraceSpec, generate, to_jsonl};
use crate::workload::{Kind, Length, Workload};

/// What the target speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Api {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    Openai,
    /// One zerolayer worker over the cluster RPC, past the frontend (`--url quic://HOST:PORT`).
    ZlWorker,
}

/// Workload kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    /// Independent requests of the given lengths.
    Synthetic,
    /// Groups of requests sharing a long system prompt.
    SharedPrefix,
    /// Conversations whose history grows.
    MultiTurn,
    /// Requests from a JSONL file (`--file`): requests, or a trace's lines (replayed with `--replay-speed`).
    File,
}

/// `zl bench`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: Option<BenchCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Draw a results file's plots again (for a run with --no-plots, or after an upgrade of the plots).
    Plot {
        /// The results file.
        file: PathBuf,
        /// Where the plots go. Default: beside the results file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Compare results files: the figures side by side with their ratios to the first (B/A, ...), and all on one
    /// set of plots.
    Compare {
        /// The results files: A (the baseline), B, and optionally more.
        #[arg(num_args = 2.., required = true)]
        files: Vec<PathBuf>,
        /// Where the plots go. Default: compare-UNIXTIME in the bench directory (the data dir's `bench/`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Write a seeded request trace in the Mooncake format (JSONL: timestamp ms, input_length, output_length,
    /// hash_ids), to replay with `--workload file --file T --replay-speed S`.
    Trace(Box<TraceArgs>),
}

/// `zl bench trace`.
#[derive(Args, Debug)]
struct TraceArgs {
    /// The file to write.
    #[arg(long)]
    out: PathBuf,
    /// Lines.
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// Mean arrivals per second (Poisson).
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Shared prefixes (system prompts, documents).
    #[arg(long, default_value_t = 32)]
    prefixes: u32,
    /// Zipf exponent of the prefixes' popularity (0: all alike).
    #[arg(long, default_value_t = 1.0)]
    zipf: f64,
    /// Blocks in each shared prefix, MEAN or MEAN:STDDEV.
    #[arg(long, default_value = "16:4")]
    prefix_blocks: String,
    /// Each request's own blocks after its prefix, MEAN or MEAN:STDDEV.
    #[arg(long, default_value = "2:1")]
    unique_blocks: String,
    /// The chance that a request continues an earlier one's conversation.
    #[arg(long, default_value_t = 0.2)]
    follow: f64,
    /// Output tokens, MEAN or MEAN:STDDEV.
    #[arg(long, default_value = "32:8")]
    output_tokens: String,
    /// Tokens per block (Mooncake's traces: 512).
    #[arg(long, default_value_t = 512)]
    block_tokens: u32,
    /// The seed: the same seed writes the same trace.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Settings of a run.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The endpoint's base URL (http:// or https://; a trailing /v1 is fine), or quic://HOST:PORT of a worker with
    /// `--api zl-worker`. Default: the running `zl up`'s.
    #[arg(long, env = "ZL_URL")]
    url: Option<String>,
    /// The API to speak.
    #[arg(long, value_enum, default_value = "anthropic")]
    api: Api,
    /// API key. Default: the running `zl up`'s.
    #[arg(long, env = "ZL_API_KEY")]
    api_key: Option<String>,
    /// Model id. Default: the running `zl up`'s.
    #[arg(long)]
    model: Option<String>,
    /// An extra CA certificate (PEM) to trust for https, besides the system's.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// `--api zl-worker`: the directory with the cluster's certificates. Default: the running `zl up`'s.
    #[arg(long)]
    tls_dir: Option<PathBuf>,
    /// `--api zl-worker`: whose frontend certificate to present.
    #[arg(long, default_value = "frontend-0")]
    node_id: String,
    /// The workload.
    #[arg(long, value_enum, default_value = "synthetic")]
    workload: WorkloadKind,
    /// Words per user turn, MEAN or MEAN:STDDEV (about one token each).
    #[arg(long, default_value = "32:8")]
    input_tokens: String,
    /// `max_tokens` per request, MEAN or MEAN:STDDEV.
    #[arg(long, default_value = "64")]
    output_tokens: String,
    /// shared-prefix: the number of groups.
    #[arg(long, default_value_t = 4)]
    groups: u32,
    /// shared-prefix: words in each group's shared system prompt, MEAN or MEAN:STDDEV.
    #[arg(long, default_value = "512")]
    prefix_tokens: String,
    /// shared-prefix: Zipf exponent of the groups' popularity (0: all alike; 1: a few hot tenants).
    #[arg(long, default_value_t = 0.0)]
    group_zipf: f64,
    /// shared-prefix: each group's requests name model PREFIX followed by the group's number (`tenant-0`,
    /// `tenant-1`, ...: tenants each with their own LoRA adapter over the served base) instead of --model.
    #[arg(long, value_name = "PREFIX")]
    group_models: Option<String>,
    /// multi-turn: user turns per conversation.
    #[arg(long, default_value_t = 4)]
    turns: u32,
    /// file: a JSONL file of requests (`{"messages": [...], "system": ..., "max_tokens": ...}` or `{"prompt": ...}`),
    /// or a trace (Mooncake's lines: `{"timestamp", "input_length", "output_length", "hash_ids"}`).
    #[arg(long)]
    file: Option<PathBuf>,
    /// file: a trace's tokens per hash id (Mooncake's: 512).
    #[arg(long, default_value_t = 512)]
    trace_block_tokens: u32,
    /// The workload's seed: the same seed sends the same requests.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Closed loop: concurrent clients, one level per value (a sweep: 1,2,4).
    #[arg(long)]
    concurrency: Option<String>,
    /// Open loop: Poisson arrivals per second, one level per value (a sweep: 0.5,1,2).
    #[arg(long)]
    rate: Option<String>,
    /// A trace's own arrivals (`--workload file` with a trace), this many times faster, one level per value.
    #[arg(long)]
    replay_speed: Option<String>,
    /// Requests per level, at most.
    #[arg(long, default_value_t = 50)]
    requests: usize,
    /// Seconds per level, at most (no new request after it).
    #[arg(long)]
    duration_s: Option<f64>,
    /// Requests sent (and not counted) before the first level, to load caches and connections.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Per-request deadline, seconds.
    #[arg(long, default_value_t = 300.0)]
    timeout_s: f64,
    /// Goodput: a request is good when its TTFT is at most this many milliseconds (and its TPOT within its target).
    #[arg(long)]
    ttft_target_ms: Option<f64>,
    /// Goodput: a request is good when its time per output token is at most this many milliseconds.
    #[arg(long)]
    tpot_target_ms: Option<f64>,
    /// Where the results file and plots go. Default: run-UNIXTIME in the bench directory (the data dir's `bench/`),
    /// never the working directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// A name for this run in tables and plots. Default: the name of its output directory.
    #[arg(long)]
    label: Option<String>,
    /// Write the results file only.
    #[arg(long)]
    no_plots: bool,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

/// What a running `zl up` offers when flags are not given.
#[derive(Debug, Default, Clone)]
pub struct Defaults {
    /// Its HTTP URL.
    pub url: Option<String>,
    /// Its API key.
    pub api_key: Option<String>,
    /// Its model.
    pub model: Option<String>,
    /// Its certificates' directory.
    pub tls_dir: Option<PathBuf>,
    /// Its first worker's QUIC address.
    pub worker: Option<String>,
    /// Why a missing setting was not found, for the error.
    pub missing: String,
    /// Where results go when no `--out` is given (each run or comparison in a directory of its own there).
    pub bench_dir: PathBuf,
}

fn now_unix_s() -> u64 {
    zl_common::calendar::unix_ms() / 1000
}

/// `given`, else a new directory `PREFIX-UNIXTIME` in `bench_dir` (`-2`, `-3`... when that exists already).
fn out_dir(given: Option<PathBuf>, bench_dir: &std::path::Path, prefix: &str) -> PathBuf {
    given.unwrap_or_else(|| {
        let stem = format!("{prefix}-{}", now_unix_s());
        let mut dir = bench_dir.join(&stem);
        let mut n = 2;
        while dir.exists() {
            dir = bench_dir.join(format!("{stem}-{n}"));
            n += 1;
        }
        dir
    })
}

/// Run `zl bench`.
pub fn main(args: BenchArgs, defaults: Defaults) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match args.command {
        Some(BenchCommand::Compare { files, out }) => {
            let out = out_dir(out, &defaults.bench_dir, "compare");
            let reports = files.iter().map(|f| Report::read(f)).collect::<Result<Vec<_>>>()?;
            let reports: Vec<&Report> = reports.iter().collect();
            print!("{}", crate::compare::table(&reports));
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let files = crate::compare::plots(&reports, &out)?;
            println!("\nplots: {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
            Ok(())
        }
        Some(BenchCommand::Plot { file, out }) => {
            let report = Report::read(&file)?;
            let beside = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
            let out = out.unwrap_or_else(|| beside.to_path_buf());
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let files = crate::plot::run_plots(&report, &out)?;
            println!("plots: {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
            Ok(())
        }
        Some(BenchCommand::Trace(t)) => write_trace(&t),
        None => rt.block_on(run(args.run, defaults)),
    }
}

fn write_trace(t: &TraceArgs) -> Result<()> {
    let valid = t.rate.is_finite() && t.rate > 0.0 && (0.0..=1.0).contains(&t.follow) && t.zipf.is_finite();
    if !valid || t.zipf < 0.0 {
        bail!("--rate must be above 0, --follow within [0, 1] and --zipf at least 0");
    }
    if t.requests == 0 || t.prefixes == 0 || t.block_tokens == 0 {
        bail!("--requests, --prefixes and --block-tokens must be at least 1");
    }
    let spec = TraceSpec {
        requests: t.requests,
        rate: t.rate,
        prefixes: t.prefixes,
        zipf: t.zipf,
        prefix_blocks: Length::parse(&t.prefix_blocks).context("--prefix-blocks")?,
        unique_blocks: Length::parse(&t.unique_blocks).context("--unique-blocks")?,
        follow: t.follow,
        output: Length::parse(&t.output_tokens).context("--output-tokens")?,
        block_tokens: t.block_tokens,
    };
    let lines = generate(&spec, t.seed);
    std::fs::write(&t.out, to_jsonl(&lines)).with_context(|| format!("writing {}", t.out.display()))?;
    let tokens: u64 = lines.iter().map(|l| u64::from(l.input_length)).sum();
    println!(
        "{}: {} requests over {:.0} s, {tokens} prompt tokens",
        t.out.display(),
        lines.len(),
        lines.last().map_or(0.0, |l| l.timestamp as f64 / 1e3)
    );
    Ok(())
}

fn workload(args: &RunArgs) -> Result<Workload> {
    let kind = match args.workload {
        WorkloadKind::Synthetic => Kind::Synthetic,
        WorkloadKind::SharedPrefix => {
            if args.groups == 0 {
                bail!("--groups must be at least 1");
            }
            if !(args.group_zipf.is_finite() && args.group_zipf >= 0.0) {
                bail!("--group-zipf must be at least 0");
            }
            Kind::SharedPrefix {
                groups: args.groups,
                prefix: Length::parse(&args.prefix_tokens).context("--prefix-tokens")?,
                zipf: args.group_zipf,
                models: args.group_models.clone(),
            }
        }
        WorkloadKind::MultiTurn => {
            if args.turns == 0 {
                bail!("--turns must be at least 1");
            }
            Kind::MultiTurn { turns: args.turns }
        }
        WorkloadKind::File => {
            let Some(path) = &args.file else { bail!("--workload file needs --file PATH") };
            if args.trace_block_tokens == 0 {
                bail!("--trace-block-tokens must be at least 1");
            }
            Kind::File(read_jsonl(path, args.trace_block_tokens)?)
        }
    };
    Ok(Workload {
        kind,
        input: Length::parse(&args.input_tokens).context("--input-tokens")?,
        output: Length::parse(&args.output_tokens).context("--output-tokens")?,
        seed: args.seed,
    })
}

async fn target(args: &RunArgs, d: &Defaults, url: &str, key: &str, model: &str) -> Result<Target> {
    let timeout = Duration::from_secs_f64(args.timeout_s.max(0.001));
    if args.api == Api::ZlWorker {
        let Some(addr) = url.strip_prefix("quic://") else { bail!("--api zl-worker takes --url quic://HOST:PORT") };
        let tls_dir =
            args.tls_dir.clone().or(d.tls_dir.clone()).with_context(|| format!("no --tls-dir: {}", d.missing))?;
        return Ok(Target::Worker(DirectWorker::connect(addr, &tls_dir, &args.node_id, model).await?, timeout));
    }
    let (tls, host, port, path) = split_url(url)?;
    let flavour = if args.api == Api::Openai { Flavour::Openai } else { Flavour::Anthropic };
    Ok(Target::Http(Arc::new(Endpoint {
        authority: format!("{host}:{port}"),
        host: host.trim_start_matches('[').trim_end_matches(']').to_owned(),
        path: flavour.path(&path),
        tls: if tls { Some(tls_config(args.ca_file.as_deref())?) } else { None },
        flavour,
        key: key.to_owned(),
        timeout,
    })))
}

async fn run(args: RunArgs, d: Defaults) -> Result<()> {
    let pick = |given: &Option<String>, default: &Option<String>, flag: &str| {
        given.clone().or_else(|| default.clone()).with_context(|| format!("no {flag}: {}", d.missing))
    };
    let default_url =
        if args.api == Api::ZlWorker { d.worker.as_ref().map(|w| format!("quic://{w}")) } else { d.url.clone() };
    let url = pick(&args.url, &default_url, "--url")?;
    let model = pick(&args.model, &d.model, "--model")?;
    let key = if args.api == Api::ZlWorker { String::new() } else { pick(&args.api_key, &d.api_key, "--api-key")? };
    let shapes = sweep(args.concurrency.as_deref(), args.rate.as_deref(), args.replay_speed.as_deref())?;
    if args.requests == 0 {
        bail!("--requests must be at least 1");
    }
    let workload = workload(&args)?;
    if args.replay_speed.is_some() && workload.arrival(0).is_none() {
        bail!("--replay-speed replays a trace: give --workload file --file with a trace's lines");
    }
    let plan = Plan {
        workload,
        model: model.clone(),
        temperature: args.temperature,
        requests: args.requests,
        duration: args.duration_s.map(|s| Duration::from_secs_f64(s.max(0.0))),
    };
    let targets =
        Targets { ttft_s: args.ttft_target_ms.map(|m| m / 1e3), tpot_s: args.tpot_target_ms.map(|m| m / 1e3) };
    let started_unix_s = now_unix_s();
    let out = out_dir(args.out.clone(), &d.bench_dir, "run");
    // Made once the warm-up has answered: a run against a wrong URL or key leaves nothing behind.
    let api = match args.api {
        Api::Anthropic => "anthropic",
        Api::Openai => "openai",
        Api::ZlWorker => "zl-worker",
    };
    let target = target(&args, &d, &url, &key, &model).await?;
    let mut report = Report {
        format: FORMAT,
        // Each run its own name by default: its output directory's (`run-1764712345`, or what --out named).
        label: args.label.clone().unwrap_or_else(|| {
            out.file_name().map_or_else(|| out.display().to_string(), |n| n.to_string_lossy().into_owned())
        }),
        url: url.clone(),
        api: api.into(),
        model,
        workload: plan.workload.describe(),
        started_unix_s,
        levels: vec![],
    };
    let levels = if shapes.len() == 1 { "1 level".to_owned() } else { format!("{} levels", shapes.len()) };
    eprintln!("zl bench: {levels} of at most {} requests against {url} ({api}), {}", plan.requests, report.workload);
    if args.warmup > 0 {
        // Sessions far from the measured ones: the warm-up never sends a measured prompt ahead of time.
        let warm = Plan { requests: args.warmup, duration: None, ..plan.clone() };
        let shape = crate::load::Shape::Closed { clients: 1 };
        let (records, _) = run_level(&warm, &target, shape, 1 << 40, Arc::default()).await;
        if let Some(r) = records.iter().find(|r| !r.ok()) {
            bail!(
                "the warm-up request failed ({}: {}); is the endpoint up, and are the URL, key and model right?",
                r.error.as_deref().unwrap_or("?"),
                r.error_message.as_deref().unwrap_or("")
            );
        }
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    // The table, once, on stdout: its head now, each level's rows as the level ends.
    print!("{}", table_head(&report));
    let _ = std::io::Write::flush(&mut std::io::stdout());
    // Session numbers run on across levels, so no level repeats another's prompts.
    let mut next = 0;
    for shape in shapes {
        let progress = Arc::new(Progress::default());
        let ticker = Ticker::start(shape.to_string(), plan.requests, progress.clone(), args.quiet);
        let (records, n) = run_level(&plan, &target, shape, next, progress).await;
        drop(ticker);
        next = n;
        let summary = summarize(&records, targets);
        let level = LevelResult { shape, summary, records };
        print!("{}", level_rows(&level));
        let _ = std::io::Write::flush(&mut std::io::stdout());
        report.levels.push(level);
    }
    let results = out.join("results.json");
    report.write(&results)?;
    println!("\nresults: {}", results.display());
    if !args.no_plots {
        let files = crate::plot::run_plots(&report, &out)?;
        println!("plots: {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
    }
    Ok(())
}
