//! `zl certs kube`: the Secrets the Helm chart's pods read their certificates from when cert-manager does not issue
//! them, from the cluster CA in `--ca-dir` (created there if missing): `FULLNAME-tls-orchestrator` (the CA and a
//! certificate for each orchestrator pod, `FULLNAME-orchestrator-N`), `FULLNAME-tls-worker` and
//! `FULLNAME-tls-frontend` (the CA and the role's bootstrap credential each: every pod enrolls with an
//! orchestrator for a certificate of its own, `zl_tls::enroll`). Written as one JSON `List` for `kubectl apply -f`
//! (PEM in `stringData`). The CA key leaves `--ca-dir` only with --ca-secret (the Secret the orchestrators sign
//! enrollments with); an admin certificate for `zl admin` is written there too.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;
use zl_tls::{ClusterCa, NodeFiles, PemPair};
use zl_wire::message::{NodeId, Role};

#[derive(Args, Debug)]
pub(crate) struct KubeArgs {
    /// The Helm release's name.
    #[arg(long)]
    release: String,
    /// The chart's resource prefix, if `fullnameOverride` is set (default: what the chart derives from the release).
    #[arg(long)]
    fullname: Option<String>,
    /// The namespace the release is installed in.
    #[arg(long)]
    namespace: String,
    /// Orchestrator replicas (`orchestrator.replicas`): one certificate each.
    #[arg(long, default_value_t = 3)]
    orchestrators: u32,
    /// Directory of the cluster CA (`ca.pem`, `ca.key`); a new CA is created there when it holds none.
    #[arg(long, default_value = "certs")]
    ca_dir: PathBuf,
    /// Read the CA from here when it holds one, instead of --ca-dir (a mounted Secret, read-only); a new CA is
    /// still written to --ca-dir when neither holds one.
    #[arg(long)]
    ca_from: Option<PathBuf>,
    /// Fail when no CA is found instead of making one: nodes already running trust the CA they started with and
    /// would refuse every certificate a new one signs (the chart's upgrade Job and renewal CronJob).
    #[arg(long)]
    require_ca: bool,
    /// Also write the CA (certificate and key) as the Secret FULLNAME-ca, so a Job run in the cluster finds it
    /// again on the next upgrade (the key then lives in the cluster, as with cert-manager's own CA).
    #[arg(long)]
    ca_secret: bool,
    /// Also write the admin certificate as the Secret FULLNAME-tls-admin (for in-cluster `zl admin` Jobs).
    #[arg(long)]
    admin_secret: bool,
    /// Validity of the node certificates in days.
    #[arg(long, default_value_t = 365)]
    days: u32,
    /// The admin certificate's node id (written to --ca-dir, for `zl admin --tls-dir`).
    #[arg(long, default_value = "admin")]
    admin_id: String,
    /// Where to write the Secrets (`-`: standard output).
    #[arg(long, default_value = "-")]
    out: String,
}

/// The chart's `zl.fullname`: the release name when it contains the chart's, else `RELEASE-zerolayer`, cut to 40.
fn fullname(release: &str) -> String {
    let name = if release.contains("zerolayer") { release.to_owned() } else { format!("{release}-zerolayer") };
    name.chars().take(40).collect::<String>().trim_end_matches('-').to_owned()
}

fn secret(name: String, namespace: &str, files: Vec<(String, String)>) -> serde_json::Value {
    let data: serde_json::Map<String, serde_json::Value> = files.into_iter().map(|(k, v)| (k, v.into())).collect();
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "zerolayer"}},
        "stringData": data,
    })
}

pub(crate) fn run(args: &KubeArgs) -> Result<()> {
    if args.days == 0 || args.orchestrators == 0 {
        bail!("--days and --orchestrators must be at least 1");
    }
    let full = args.fullname.clone().unwrap_or_else(|| fullname(&args.release));
    let read_ca = |dir: &std::path::Path| {
        let (cert, key) = (fs::read_to_string(dir.join("ca.pem")).ok()?, fs::read_to_string(dir.join("ca.key")).ok()?);
        Some(ClusterCa::from_pem(&cert, &key).with_context(|| format!("loading the CA in {}", dir.display())))
    };
    let found = args.ca_from.as_deref().and_then(read_ca).or_else(|| read_ca(&args.ca_dir));
    let ca = match found {
        Some(ca) => ca?,
        None if args.require_ca => bail!(
            "no cluster CA in {} or {}, and --require-ca: a running cluster trusts only the CA it started with, so a \
             new one would split it (restore the CA Secret FULLNAME-ca, or see docs/kubernetes.md, \"A CA change\")",
            args.ca_from.as_deref().map_or("(no --ca-from)".into(), |p| p.display().to_string()),
            args.ca_dir.display()
        ),
        None => {
            let ca = ClusterCa::generate(&format!("{full} cluster CA"), 3650).context("generating the CA")?;
            super::write_pair(&args.ca_dir, "ca", ca.pem(), false)?;
            eprintln!("zl certs kube: a new cluster CA in {}", args.ca_dir.display());
            ca
        }
    };
    let ca_pem = ("ca.pem".to_owned(), ca.cert_pem().to_owned());
    let pem =
        |stem: &str, pair: PemPair| vec![(format!("{stem}.pem"), pair.cert_pem), (format!("{stem}.key"), pair.key_pem)];
    let mut orchestrator_files = vec![ca_pem.clone()];
    for i in 0..args.orchestrators {
        let node = NodeId::new(format!("{full}-orchestrator-{i}")).map_err(|e| anyhow::anyhow!("{e}"))?;
        let pair = ca.issue(Role::Orchestrator, &node, &[], args.days)?;
        orchestrator_files.extend(pem(&NodeFiles::new(&args.ca_dir, Role::Orchestrator, node.as_str()).stem, pair));
    }
    let mut items = vec![secret(format!("{full}-tls-orchestrator"), &args.namespace, orchestrator_files)];
    for role in [Role::Worker, Role::Frontend] {
        let mut files = vec![ca_pem.clone()];
        let boot = NodeFiles::new(&args.ca_dir, Role::Bootstrap, zl_tls::enroll::bootstrap_id(role).as_str());
        files.extend(pem(&boot.stem, ca.issue_bootstrap(role, args.days)?));
        items.push(secret(format!("{full}-tls-{}", role.name()), &args.namespace, files));
    }
    let admin = NodeId::new(args.admin_id.clone()).map_err(|e| anyhow::anyhow!("--admin-id: {e}"))?;
    let pair = ca.issue(Role::Admin, &admin, &[], args.days)?;
    let admin_stem = NodeFiles::new(&args.ca_dir, Role::Admin, admin.as_str()).stem;
    if args.admin_secret {
        let mut files = vec![ca_pem.clone()];
        files.extend(pem(&admin_stem, pair.clone()));
        items.push(secret(format!("{full}-tls-admin"), &args.namespace, files));
    }
    if args.ca_secret {
        let files = vec![ca_pem.clone(), ("ca.key".to_owned(), ca.pem().key_pem.clone())];
        items.push(secret(format!("{full}-ca"), &args.namespace, files));
    }
    super::write_pair(&args.ca_dir, &admin_stem, &pair, true)?;
    let list = serde_json::to_string_pretty(&json!({"apiVersion": "v1", "kind": "List", "items": items}))?;
    if args.out == "-" {
        println!("{list}");
    } else {
        super::write_file(std::path::Path::new(&args.out), list.as_bytes(), 0o600)?;
        eprintln!("zl certs kube: wrote {} (apply with `kubectl apply -f {}`)", args.out, args.out);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn fullnames_follow_the_chart() {
        assert_eq!(super::fullname("zl"), "zl-zerolayer");
        assert_eq!(super::fullname("zerolayer-prod"), "zerolayer-prod");
        assert_eq!(super::fullname(&"x".repeat(50)).len(), 40);
    }
}
