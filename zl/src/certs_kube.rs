//! `zl certs kube`: the Secrets the Helm chart's pods read their certificates from when cert-manager does not issue
//! them, from the cluster CA in `--ca-dir` (created there if missing): `FULLNAME-tls-orchestrator` (the CA and a
//! certificate for each orchestrator pod, `FULLNAME-orchestrator-N`), `FULLNAME-tls-worker` and
//! `FULLNAME-tls-frontend` (the CA and one replica certificate each). Written as one JSON `List` for `kubectl apply
//! -f` (PEM in `stringData`). The CA key never leaves `--ca-dir`; an admin certificate for `zl admin` is written
//! there too.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;
use zl_proto::message::{NodeId, Role};
use zl_proto::tls::{ClusterCa, NodeFiles, PemPair};

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
    let ca = match (fs::read_to_string(args.ca_dir.join("ca.pem")), fs::read_to_string(args.ca_dir.join("ca.key"))) {
        (Ok(cert), Ok(key)) => ClusterCa::from_pem(&cert, &key).context("loading the CA")?,
        _ => {
            let ca = ClusterCa::generate(&format!("{full} cluster CA"), 3650).context("generating the CA")?;
            crate::certs::write_pair(&args.ca_dir, "ca", ca.pem(), false)?;
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
        files.extend(pem(&NodeFiles::replicas(&args.ca_dir, role).stem, ca.issue_replicas(role, &[], args.days)?));
        items.push(secret(format!("{full}-tls-{}", role.name()), &args.namespace, files));
    }
    let admin = NodeId::new(args.admin_id.clone()).map_err(|e| anyhow::anyhow!("--admin-id: {e}"))?;
    let pair = ca.issue(Role::Admin, &admin, &[], args.days)?;
    crate::certs::write_pair(
        &args.ca_dir,
        &NodeFiles::new(&args.ca_dir, Role::Admin, admin.as_str()).stem,
        &pair,
        true,
    )?;
    let list = serde_json::to_string_pretty(&json!({"apiVersion": "v1", "kind": "List", "items": items}))?;
    if args.out == "-" {
        println!("{list}");
    } else {
        crate::certs::write_file(std::path::Path::new(&args.out), list.as_bytes(), 0o600)?;
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
