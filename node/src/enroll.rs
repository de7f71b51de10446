//! A node's TLS identity at start: its own certificate when it has one (from `zl certs issue`; `node.pem` and
//! `node.key` as a per-pod issuer such as cert-manager's CSI driver mounts them; or enrolled before and kept in
//! its state directory), else one it enrolls for with its role's bootstrap credential
//! (`zl_tls::enroll`). An enrolled certificate with less than a third of its life left is renewed with itself, at
//! start and then while the node runs (checked every [`RENEW_CHECK`]): the new files are written over the old and
//! the running identity takes them (`zl_tls::reload`), so a pod that runs for months never presents an expired
//! certificate. The private key is made here and never leaves the node.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use zl_proto::quic::{CallError, Client, RpcSettings};
use zl_tls::enroll::{bootstrap_id, due_for_renewal, signing_request, validity_ms};
use zl_tls::{NodeFiles, PemPair, TlsIdentity};
use zl_wire::message::{CertificateRequest, ErrorCode, Message, NodeId, Role};

/// How long a node keeps asking for a certificate while no orchestrator answers (they may be starting too).
pub const ENROLL_PATIENCE: Duration = Duration::from_secs(120);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_EVERY: Duration = Duration::from_secs(2);
/// How often a running node looks at whether its enrolled certificate is due for renewal.
pub const RENEW_CHECK: Duration = Duration::from_secs(600);

/// The identity flags a worker and a frontend share.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct IdentityArgs {
    /// Writable directory where a certificate enrolled with the role's bootstrap credential is kept across
    /// restarts (default: --tls-dir). Only used when --tls-dir holds no certificate of this node's own.
    #[arg(long, env = "ZL_IDENTITY_DIR")]
    pub identity_dir: Option<std::path::PathBuf>,
    /// Orchestrator QUIC addresses to enroll with, host:port (repeatable, or comma-separated; default: the
    /// --orchestrator list; with Consul discovery, give them here).
    #[arg(long = "enroll-at", env = "ZL_ENROLL_AT", value_delimiter = ',', value_parser = crate::resolve::parse_address)]
    pub enroll_at: Vec<String>,
}

impl IdentityArgs {
    /// This node's identity ([`identity`]); `orchestrators` is the --orchestrator list.
    pub async fn load(&self, tls_dir: &Path, orchestrators: &[String], role: Role, id: &str) -> Result<TlsIdentity> {
        let at = if self.enroll_at.is_empty() { orchestrators } else { &self.enroll_at };
        identity(&IdentitySource { tls_dir, state_dir: self.identity_dir.as_deref(), orchestrators: at }, role, id)
            .await
    }
}

/// Where a node finds and keeps its identity.
#[derive(Clone, Debug)]
pub struct IdentitySource<'a> {
    /// `ca.pem`, and the node's own certificate or its role's bootstrap credential (read-only is fine).
    pub tls_dir: &'a Path,
    /// Where an enrolled certificate and key are kept across restarts (writable; the TLS directory when `None`).
    pub state_dir: Option<&'a Path>,
    /// The orchestrators to enroll with (`host:port`).
    pub orchestrators: &'a [String],
}

fn load(ca: &Path, files: &NodeFiles, role: Role, node_id: &NodeId) -> Result<(TlsIdentity, String)> {
    let cert = std::fs::read_to_string(&files.cert).with_context(|| format!("reading {}", files.cert.display()))?;
    let identity = TlsIdentity::from_files(ca, &files.cert, &files.key, role, node_id.clone())
        .with_context(|| format!("loading the TLS identity {}", files.stem))?;
    crate::keep_fresh(&identity);
    Ok((identity, cert))
}

/// This node's identity (see the module docs).
pub async fn identity(src: &IdentitySource<'_>, role: Role, id: &str) -> Result<TlsIdentity> {
    let node_id = NodeId::new(id.to_owned()).map_err(|e| anyhow::anyhow!("--node-id: {e}"))?;
    let ca = src.tls_dir.join("ca.pem");
    let own = NodeFiles::new(src.tls_dir, role, node_id.as_str());
    if own.cert.exists() {
        return Ok(load(&ca, &own, role, &node_id)?.0);
    }
    let mounted = NodeFiles {
        stem: "node".into(),
        ca: ca.clone(),
        cert: src.tls_dir.join("node.pem"),
        key: src.tls_dir.join("node.key"),
    };
    if mounted.cert.exists() {
        return Ok(load(&ca, &mounted, role, &node_id)?.0);
    }
    let state_dir = src.state_dir.unwrap_or(src.tls_dir);
    let kept = NodeFiles::new(state_dir, role, node_id.as_str());
    if kept.cert.exists() {
        let (identity, _) = load(&ca, &kept, role, &node_id)?;
        renew_if_due(&identity, &kept, src.orchestrators, role, &node_id).await;
        renew_while_running(&identity, kept, src.orchestrators, role, &node_id);
        return Ok(identity);
    }
    let boot = NodeFiles::new(src.tls_dir, Role::Bootstrap, bootstrap_id(role).as_str());
    if !boot.cert.exists() {
        bail!(
            "no TLS identity for {role} {node_id}: {} (zl certs issue) or a bootstrap credential {} (zl certs issue \
             --bootstrap) to enroll with",
            own.cert.display(),
            boot.cert.display()
        );
    }
    let bootstrap = TlsIdentity::from_files(&ca, &boot.cert, &boot.key, Role::Bootstrap, bootstrap_id(role))
        .with_context(|| format!("loading the bootstrap credential {}", boot.stem))?;
    let pair = enroll(&bootstrap, src.orchestrators, role, &node_id).await?;
    tracing::info!(node = %node_id, dir = %state_dir.display(), "enrolled: a certificate of this node's own");
    let identity = keep(state_dir, &kept, &ca, &pair, role, &node_id)?;
    renew_while_running(&identity, kept, src.orchestrators, role, &node_id);
    Ok(identity)
}

/// Renew the enrolled certificate in `files` with itself when a third of its life is left: the new pair replaces
/// the files, which `identity` (and every connection made from now on) then presents. A failure leaves the
/// current certificate serving; the next look tries again.
async fn renew_if_due(
    identity: &TlsIdentity,
    files: &NodeFiles,
    orchestrators: &[String],
    role: Role,
    node_id: &NodeId,
) {
    let cert = std::fs::read_to_string(&files.cert).unwrap_or_default();
    if !validity_ms(&cert).is_none_or(|v| due_for_renewal(v, zl_common::calendar::unix_ms())) {
        return;
    }
    tracing::info!(node = %node_id, "the enrolled certificate is due for renewal");
    match enroll(identity, orchestrators, role, node_id).await {
        Ok(pair) => match write_pair(files, &pair) {
            Ok(()) => {
                identity.refresh();
                metrics::counter!("zl_tls_renewals_total").increment(1);
                tracing::info!(node = %node_id, "renewed the enrolled certificate");
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "writing the renewed certificate failed"),
        },
        Err(e) => tracing::warn!(error = %format!("{e:#}"), "renewal failed; the current certificate serves meanwhile"),
    }
}

/// Look every [`RENEW_CHECK`] whether the enrolled certificate is due for renewal (in the background, when a
/// runtime runs).
fn renew_while_running(
    identity: &TlsIdentity,
    files: NodeFiles,
    orchestrators: &[String],
    role: Role,
    node_id: &NodeId,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let (identity, orchestrators, node_id) = (identity.clone(), orchestrators.to_vec(), node_id.clone());
    runtime.spawn(async move {
        loop {
            tokio::time::sleep(RENEW_CHECK).await;
            renew_if_due(&identity, &files, &orchestrators, role, &node_id).await;
        }
    });
}

/// Write an enrolled key (0600) and certificate over `files`, each through a temporary file renamed over it.
fn write_pair(files: &NodeFiles, pair: &PemPair) -> Result<()> {
    use std::io::Write;
    for (path, text) in [(&files.key, &pair.key_pem), (&files.cert, &pair.cert_pem)] {
        let tmp = path.with_extension("tmp");
        let mut f = crate::private::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Write the enrolled key (0600) and certificate, then load them.
fn keep(dir: &Path, files: &NodeFiles, ca: &Path, pair: &PemPair, role: Role, node_id: &NodeId) -> Result<TlsIdentity> {
    crate::private::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_pair(files, pair)?;
    let identity = TlsIdentity::from_files(ca, &files.cert, &files.key, role, node_id.clone())
        .context("loading the enrolled identity")?;
    crate::keep_fresh(&identity);
    Ok(identity)
}

/// Ask the orchestrators, in turn, for a certificate for `node_id`, presenting `as_identity` (a bootstrap
/// credential, or the node's own certificate to renew it); retried for [`ENROLL_PATIENCE`] while none answers.
/// A refusal is final.
pub async fn enroll(
    as_identity: &TlsIdentity,
    orchestrators: &[String],
    role: Role,
    node_id: &NodeId,
) -> Result<PemPair> {
    if orchestrators.is_empty() {
        bail!("enrolling needs the orchestrators' addresses (--orchestrator, or --enroll-at with Consul discovery)");
    }
    let csr = signing_request(role, node_id)?;
    let request = Message::CertificateRequest(CertificateRequest {
        role,
        node_id: node_id.clone(),
        csr_der: csr.csr_der.clone(),
    });
    let client = Client::new(as_identity, RpcSettings::default())?;
    let started = tokio::time::Instant::now();
    let mut last = String::from("no orchestrator address resolved");
    let result = loop {
        let mut addrs: Vec<SocketAddr> = Vec::new();
        for target in orchestrators {
            match crate::resolve::resolve(target).await {
                Ok(found) => addrs.extend(found),
                Err(e) => last = format!("{target}: {e}"),
            }
        }
        // A certificate, or a refusal: either ends the asking.
        let mut settled = None;
        for addr in addrs {
            match client.call_within(ATTEMPT_TIMEOUT, addr, Role::Orchestrator, request.clone()).await {
                Ok(Message::CertificateIssued(issued)) => {
                    settled = Some(Ok(PemPair { cert_pem: issued.cert_pem, key_pem: csr.key_pem.clone() }));
                    break;
                }
                Ok(other) => last = format!("{addr}: unexpected {} answer", other.kind()),
                Err(CallError::Remote(e))
                    if matches!(e.code, ErrorCode::PermissionDenied | ErrorCode::InvalidRequest) =>
                {
                    settled = Some(Err(anyhow::anyhow!("orchestrator {addr} refused the enrollment: {}", e.message)));
                    break;
                }
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        if let Some(result) = settled {
            break result;
        }
        if started.elapsed() >= ENROLL_PATIENCE {
            break Err(anyhow::anyhow!("no orchestrator issued a certificate within {ENROLL_PATIENCE:?}: {last}"));
        }
        tracing::info!(error = %last, "no orchestrator enrolled this node yet; retrying");
        tokio::time::sleep(RETRY_EVERY).await;
    };
    client.close();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use zl_tls::ClusterCa;

    #[tokio::test]
    async fn a_certificate_of_its_own_comes_first_in_either_layout() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::generate("t", 1).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).unwrap();
        let src = IdentitySource { tls_dir: dir.path(), state_dir: None, orchestrators: &[] };
        // Nothing to go on: the error names both ways to get an identity.
        let err = format!("{:#}", identity(&src, Role::Worker, "w-1").await.unwrap_err());
        assert!(err.contains("worker-w-1.pem") && err.contains("bootstrap-worker.pem"), "{err}");
        // A per-pod certificate mounted as node.pem (cert-manager's CSI driver) serves, for its own id only.
        let pair = ca.issue(Role::Worker, &NodeId::new("w-1").unwrap(), &[], 1).unwrap();
        std::fs::write(dir.path().join("node.pem"), &pair.cert_pem).unwrap();
        std::fs::write(dir.path().join("node.key"), &pair.key_pem).unwrap();
        assert_eq!(identity(&src, Role::Worker, "w-1").await.unwrap().node_id().as_str(), "w-1");
        assert!(identity(&src, Role::Worker, "w-2").await.is_err(), "another pod's id");
        // A bootstrap credential with no orchestrator to ask is a clear error, not a hang.
        std::fs::remove_file(dir.path().join("node.pem")).unwrap();
        let boot = ca.issue_bootstrap(Role::Worker, 1).unwrap();
        std::fs::write(dir.path().join("bootstrap-worker.pem"), &boot.cert_pem).unwrap();
        std::fs::write(dir.path().join("bootstrap-worker.key"), &boot.key_pem).unwrap();
        let err = format!("{:#}", identity(&src, Role::Worker, "w-1").await.unwrap_err());
        assert!(err.contains("orchestrators' addresses"), "{err}");
    }
}
