//! `zl certs`: write a cluster CA and node certificates as PEM files.
//!
//! Private keys are written with mode 0600 and never overwritten unless `--force` is given.

mod kube;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use zl_tls::{ClusterCa, NodeFiles, PemPair};
use zl_wire::message::{NodeId, Role};

/// Certificate commands.
#[derive(Subcommand, Debug)]
pub(crate) enum CertsCommand {
    /// Create a new cluster CA: `ca.pem` (give it to every node) and `ca.key` (keep it offline).
    Init(InitArgs),
    /// Issue a node certificate signed by the cluster CA: `{role}-{node-id}.pem` and `.key` (or, with
    /// --bootstrap, the role's bootstrap credential `bootstrap-{role}.pem` and `.key`, with which workers and
    /// frontends enroll for certificates of their own).
    Issue(IssueArgs),
    /// The Kubernetes Secrets the Helm chart's pods read their certificates from (without cert-manager).
    Kube(kube::KubeArgs),
}

#[derive(Args, Debug)]
pub(crate) struct InitArgs {
    /// Directory to write ca.pem and ca.key into (created if missing).
    #[arg(long, default_value = "certs")]
    out: PathBuf,
    /// CA validity in days.
    #[arg(long, default_value_t = 3650)]
    days: u32,
    /// The CA's common name.
    #[arg(long, default_value = "zerolayer cluster CA")]
    name: String,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

#[derive(Args, Debug)]
pub(crate) struct IssueArgs {
    /// Directory holding ca.pem and ca.key; the node's files are written here too unless --out is given.
    #[arg(long, default_value = "certs")]
    ca_dir: PathBuf,
    /// Where to write the node's certificate and key.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The node's tier: frontend, orchestrator, worker or admin.
    #[arg(long)]
    role: String,
    /// The node's id: a lowercase DNS label, e.g. worker-0.
    #[arg(long, required_unless_present = "bootstrap", conflicts_with = "bootstrap")]
    node_id: Option<String>,
    /// Instead of one node's: the role's bootstrap credential (workers and frontends only). It acts as no node; it
    /// may only ask an orchestrator started with --enroll-ca-key for a certificate for a node id never enrolled
    /// before, so pods named at random (a Deployment's) each get their own with no key shared between them.
    #[arg(long)]
    bootstrap: bool,
    /// Extra DNS names or IP addresses for the certificate (repeatable), e.g. the pod's service name.
    #[arg(long = "san")]
    sans: Vec<String>,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    days: u32,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

pub(crate) fn run(cmd: CertsCommand) -> Result<()> {
    match cmd {
        CertsCommand::Init(args) => init(&args),
        CertsCommand::Issue(args) => issue(&args),
        CertsCommand::Kube(args) => kube::run(&args),
    }
}

fn init(args: &InitArgs) -> Result<()> {
    if args.days == 0 {
        bail!("--days must be at least 1");
    }
    let ca = ClusterCa::generate(&args.name, args.days).context("generating the CA")?;
    write_pair(&args.out, "ca", ca.pem(), args.force)?;
    println!("wrote {} and {}", args.out.join("ca.pem").display(), args.out.join("ca.key").display());
    Ok(())
}

fn issue(args: &IssueArgs) -> Result<()> {
    let role = Role::from_name(&args.role)
        .with_context(|| format!("unknown role {:?}: use frontend, orchestrator, worker or admin", args.role))?;
    if args.days == 0 {
        bail!("--days must be at least 1");
    }
    let read = |name: &str| {
        let path = args.ca_dir.join(name);
        fs::read_to_string(&path).with_context(|| format!("reading {} (run `zl certs init` first)", path.display()))
    };
    let ca = ClusterCa::from_pem(&read("ca.pem")?, &read("ca.key")?).context("loading the CA")?;
    let out = args.out.as_ref().unwrap_or(&args.ca_dir);
    let (pair, files) = match &args.node_id {
        Some(node_id) => {
            let node_id = NodeId::new(node_id.clone()).map_err(|e| anyhow::anyhow!("--node-id: {e}"))?;
            let pair = ca.issue(role, &node_id, &args.sans, args.days).context("issuing the certificate")?;
            (pair, NodeFiles::new(out, role, node_id.as_str()))
        }
        None => {
            let pair = ca.issue_bootstrap(role, args.days).context("issuing the bootstrap credential")?;
            (pair, NodeFiles::new(out, Role::Bootstrap, zl_tls::enroll::bootstrap_id(role).as_str()))
        }
    };
    write_pair(out, &files.stem, &pair, args.force)?;
    println!("wrote {} and {}", files.cert.display(), files.key.display());
    Ok(())
}

pub(crate) fn write_pair(dir: &Path, stem: &str, pair: &PemPair, force: bool) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cert = dir.join(format!("{stem}.pem"));
    let key = dir.join(format!("{stem}.key"));
    for path in [&cert, &key] {
        if path.exists() && !force {
            bail!("{} already exists (use --force to overwrite)", path.display());
        }
    }
    write_file(&key, pair.key_pem.as_bytes(), 0o600)?;
    write_file(&cert, pair.cert_pem.as_bytes(), 0o644)?;
    Ok(())
}

/// Write `contents` owner-only, whole or not at all: into a temporary file renamed over `path`, so a reader (an
/// operator's script, `zl admin`, a test) never sees it half written.
pub(crate) fn write_private(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    write_file(&tmp, contents.as_bytes(), 0o600)?;
    fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

pub(crate) fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}
