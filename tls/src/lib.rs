//! Mutual TLS between tiers: a cluster CA, node certificates, and the rustls configurations QUIC uses.
//!
//! Every node certificate names its role and node id as DNS SANs (`{role}.zl.internal` and
//! `{node_id}.{role}.zl.internal`). A client verifies a server against the role it expects; a server checks that
//! the role and node id a client claims in its handshake are the ones its certificate was issued for, by name: a
//! wildcard, which many pods could share, is no identity. Nodes that Kubernetes names at random enroll for a
//! certificate of their own with a bootstrap credential ([`enroll`]). Only ring is used as the crypto provider.
//! This crate never opens sockets.

pub mod enroll;
pub mod reload;

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use zl_wire::message::{NodeId, Role};

/// DNS suffix of every name in node certificates.
pub const CLUSTER_DOMAIN: &str = "zl.internal";
/// ALPN protocol id of zerolayer's RPC; bumped with the protocol's major version.
pub const ALPN: &[u8] = b"zl/1";

/// A certificate or key problem.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Certificate generation failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// A PEM file could not be read or held no usable item.
    #[error("{what}: {problem}")]
    Pem {
        /// Which input.
        what: String,
        /// What is wrong.
        problem: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration refused: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// A certificate does not chain to the cluster CA this node trusts (a CA swapped under a running cluster).
    #[error(
        "the certificate does not chain to the cluster CA this node trusts ({0}); a new cluster CA must be \
             rolled out to every node first (docs/kubernetes.md, \"A CA change\")"
    )]
    Untrusted(String),
    /// A certificate is not valid for the identity it is used for.
    #[error("certificate is not valid for {expected}: {problem}")]
    Identity {
        /// The DNS name the certificate should carry.
        expected: String,
        /// Why it does not.
        problem: String,
    },
}

/// The DNS name every node of `role` carries: what a client verifies a server against.
pub fn role_name(role: Role) -> String {
    format!("{}.{CLUSTER_DOMAIN}", role.name())
}

/// The DNS name unique to one node.
pub fn node_name(role: Role, node_id: &NodeId) -> String {
    format!("{node_id}.{}.{CLUSTER_DOMAIN}", role.name())
}

/// Where a node's PEM files live in a certificate directory, as `zl certs` writes them: the cluster CA's
/// `ca.pem`, and the node's `{role}-{node id}.pem` and `.key` (a bootstrap credential's are `bootstrap-{role}.pem` and
/// `.key`: role [`Role::Bootstrap`], node id the role it enrolls). The one place these names are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFiles {
    /// `{role}-{node id}`, the file stem.
    pub stem: String,
    /// The cluster CA's certificate.
    pub ca: std::path::PathBuf,
    /// The node's certificate.
    pub cert: std::path::PathBuf,
    /// The node's private key.
    pub key: std::path::PathBuf,
}

impl NodeFiles {
    /// The files of node `id` in role `role` under `dir`.
    pub fn new(dir: &std::path::Path, role: Role, id: &str) -> NodeFiles {
        let stem = format!("{}-{id}", role.name());
        NodeFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
            stem,
        }
    }
}

/// The one crypto provider used everywhere (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Make ring the process-wide default provider. Binaries call this first thing in `main` so that any library that
/// asks rustls for the default finds exactly one. Calling it twice is harmless.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A certificate and its private key, PEM-encoded.
#[derive(Clone)]
pub struct PemPair {
    /// The certificate.
    pub cert_pem: String,
    /// The PKCS#8 private key.
    pub key_pem: String,
}

impl std::fmt::Debug for PemPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemPair").field("cert_pem", &self.cert_pem).field("key_pem", &"<redacted>").finish()
    }
}

/// A cluster certificate authority that issues node certificates.
pub struct ClusterCa {
    pem: PemPair,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // Back-date a little so peers with slightly slow clocks accept a fresh certificate.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

impl ClusterCa {
    /// A new CA with a fresh P-256 key, valid for `days`.
    pub fn generate(common_name: &str, days: u32) -> Result<ClusterCa, TlsError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        dn.push(DnType::OrganizationName, "zerolayer");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        validity(&mut params, days);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let pem = PemPair { cert_pem: cert.pem(), key_pem: key.serialize_pem() };
        Ok(ClusterCa { pem, issuer: Issuer::new(params, key) })
    }

    /// Load an existing CA (certificate and key) to issue more node certificates.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, TlsError> {
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        let pem = PemPair { cert_pem: cert_pem.to_owned(), key_pem: key_pem.to_owned() };
        Ok(ClusterCa { pem, issuer })
    }

    /// The CA certificate, which every node trusts.
    pub fn cert_pem(&self) -> &str {
        &self.pem.cert_pem
    }

    /// The CA's certificate and private key (keep the key offline in production).
    pub fn pem(&self) -> &PemPair {
        &self.pem
    }

    /// Issue a certificate for one node, valid for `days`, usable as both TLS client and server. `extra_names` are
    /// added as SANs (DNS names, or IP addresses when they parse as one).
    pub fn issue(&self, role: Role, node_id: &NodeId, extra_names: &[String], days: u32) -> Result<PemPair, TlsError> {
        let key = KeyPair::generate()?;
        let cert = node_params(role, node_id, extra_names, days)?.signed_by(&key, &self.issuer)?;
        Ok(PemPair { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// The parameters of a node certificate: its role's and its own name (plus `extra_names`), server and client use.
fn node_params(role: Role, node_id: &NodeId, extra_names: &[String], days: u32) -> Result<CertificateParams, TlsError> {
    let node = node_name(role, node_id);
    let mut names = vec![role_name(role), node.clone()];
    for extra in extra_names {
        let lower = extra.trim_end_matches('.').to_ascii_lowercase();
        if lower == CLUSTER_DOMAIN || lower.ends_with(&format!(".{CLUSTER_DOMAIN}")) || lower.contains('*') {
            return Err(TlsError::Identity {
                expected: node,
                problem: format!(
                    "`{extra}` may not be an extra name: names in {CLUSTER_DOMAIN} are the role and node a \
                     certificate is issued for (`--role`, `--node-id`), and a wildcard would let one key speak for \
                     many nodes"
                ),
            });
        }
        names.push(extra.clone());
    }
    let mut params = CertificateParams::new(names)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, node);
    dn.push(DnType::OrganizationName, "zerolayer");
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, days);
    Ok(params)
}

fn pem_err(what: &str, problem: impl std::fmt::Display) -> TlsError {
    TlsError::Pem { what: what.to_owned(), problem: problem.to_string() }
}

fn certs_from_pem(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| pem_err(what, e))?;
    if certs.is_empty() {
        return Err(pem_err(what, "no certificate found"));
    }
    Ok(certs)
}

/// Check that `cert` (already chain-verified by rustls) was issued for `role` and `node_id` ([`identity`]).
pub fn check_identity(cert: &CertificateDer<'_>, role: Role, node_id: &NodeId) -> Result<(), TlsError> {
    let (named_role, id) = identity(cert)?;
    if named_role != role {
        return Err(wrong_role(role, named_role));
    }
    if id != node_id.as_str() {
        return Err(TlsError::Identity {
            expected: node_name(role, node_id),
            problem: format!(
                "the certificate does not name this node but `{id}` (another node's certificate is no identity: each \
                 node needs a certificate of its own, `zl certs issue` or enrollment)"
            ),
        });
    }
    Ok(())
}

/// Check that `chain` (leaf first) chains to `roots`, the cluster CA this node trusts, and is valid now for
/// `role`'s node `node_id`: what every peer will check of it, checked before it is presented.
pub fn check_chain(
    roots: &Arc<RootCertStore>,
    chain: &[CertificateDer<'static>],
    role: Role,
    node_id: &NodeId,
) -> Result<(), TlsError> {
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Err(TlsError::Untrusted("no certificate".into()));
    };
    check_identity(leaf, role, node_id)?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| TlsError::Untrusted(e.to_string()))?;
    let name = ServerName::try_from(node_name(role, node_id)).map_err(|e| TlsError::Untrusted(e.to_string()))?;
    rustls::client::danger::ServerCertVerifier::verify_server_cert(
        verifier.as_ref(),
        leaf,
        intermediates,
        &name,
        &[],
        rustls_pki_types::UnixTime::now(),
    )
    .map_err(|e| TlsError::Untrusted(e.to_string()))?;
    Ok(())
}

/// The node ids a certificate names for `role`: its one node, when its [`identity`] is of that role. Only for a
/// certificate already verified against the cluster CA.
pub fn node_ids(cert: &CertificateDer<'_>, role: Role) -> Vec<String> {
    match identity(cert) {
        Ok((r, id)) if r == role => vec![id],
        _ => Vec::new(),
    }
}

/// Check that `cert` (already chain-verified) was issued for a node of `role` ([`identity`]).
pub fn check_role(cert: &CertificateDer<'_>, role: Role) -> Result<(), TlsError> {
    match identity(cert)? {
        (r, _) if r == role => Ok(()),
        (r, _) => Err(wrong_role(role, r)),
    }
}

fn wrong_role(expected: Role, named: Role) -> TlsError {
    TlsError::Identity { expected: role_name(expected), problem: format!("the certificate was issued for a {named}") }
}

/// The one role and node id a certificate was issued for, read from its names in the cluster domain: exactly one
/// role name (`{role}.zl.internal`) and exactly one node name of that role (`{id}.{role}.zl.internal`), spelled
/// out. A wildcard in the cluster domain (which names every node, or every role) or a second role or node name
/// makes it no identity at all: only the issuing paths (`zl certs issue`, enrollment, the chart's issuer) write
/// these names, and they write exactly these two. Names outside the cluster domain (addresses, public host
/// names) are the certificate's own business.
pub fn identity(cert: &CertificateDer<'_>) -> Result<(Role, String), TlsError> {
    let bad =
        |problem: String| TlsError::Identity { expected: format!("one node of one role ({CLUSTER_DOMAIN})"), problem };
    let parsed = webpki::EndEntityCert::try_from(cert).map_err(|e| bad(format!("unparsable certificate: {e}")))?;
    let suffix = format!(".{CLUSTER_DOMAIN}");
    let (mut roles, mut nodes) = (Vec::new(), Vec::new());
    for name in parsed.valid_dns_names() {
        let lower = name.to_ascii_lowercase();
        let Some(inner) = lower.strip_suffix(suffix.as_str()) else {
            if lower == CLUSTER_DOMAIN {
                return Err(bad(format!("it names the cluster domain itself ({name})")));
            }
            continue;
        };
        if inner.contains('*') {
            return Err(bad(format!("a wildcard ({name}) names no node: each node needs a certificate of its own")));
        }
        match inner.split_once('.') {
            None => roles.push(Role::from_name(inner).ok_or_else(|| bad(format!("{name} names no role")))?),
            Some((id, role)) => {
                let role = Role::from_name(role).ok_or_else(|| bad(format!("{name} names no role")))?;
                if id.is_empty() || id.contains('.') {
                    return Err(bad(format!("{name} is no node name")));
                }
                nodes.push((role, id.to_owned()));
            }
        }
    }
    match (roles.as_slice(), nodes.as_slice()) {
        ([role], [(node_role, id)]) if role == node_role => Ok((*role, id.clone())),
        ([], _) | (_, []) => Err(bad("it does not name a role and a node".into())),
        _ => Err(bad(format!(
            "it names {} role name(s) and {} node name(s); a certificate names exactly one of each, of one role",
            roles.len(),
            nodes.len()
        ))),
    }
}

/// This node's TLS identity: the cluster CA to trust, its certificate chain and key, and the role and node id the
/// certificate was issued for.
#[derive(Debug)]
pub struct TlsIdentity {
    roots: Arc<RootCertStore>,
    key: PrivateKeyDer<'static>,
    role: Role,
    node_id: NodeId,
    /// What is presented: the certificate loaded, or its files' newest content ([`reload`]).
    source: Arc<reload::CertSource>,
}

impl Clone for TlsIdentity {
    fn clone(&self) -> Self {
        TlsIdentity {
            roots: self.roots.clone(),
            key: self.key.clone_key(),
            role: self.role,
            node_id: self.node_id.clone(),
            source: self.source.clone(),
        }
    }
}

impl TlsIdentity {
    /// Load from PEM text, checking that the certificate was issued for `role` and `node_id`.
    pub fn from_pem(ca_pem: &str, cert: &PemPair, role: Role, node_id: NodeId) -> Result<TlsIdentity, TlsError> {
        let mut roots = RootCertStore::empty();
        for ca in certs_from_pem("cluster CA certificate", ca_pem.as_bytes())? {
            roots.add(ca).map_err(|e| pem_err("cluster CA certificate", e))?;
        }
        let chain = certs_from_pem("node certificate", cert.cert_pem.as_bytes())?;
        let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).map_err(|e| pem_err("node private key", e))?;
        let roots = Arc::new(roots);
        check_chain(&roots, &chain, role, &node_id)?;
        let source = Arc::new(reload::CertSource::fixed(reload::certified_key(chain, key.clone_key())?));
        Ok(TlsIdentity { roots, key, role, node_id, source })
    }

    /// Load from PEM files (production). The certificate and key are read again when their files change
    /// ([`reload`]): a rotated certificate is presented on new connections with no restart. The CA is read once.
    pub fn from_files(
        ca_path: &Path,
        cert_path: &Path,
        key_path: &Path,
        role: Role,
        node_id: NodeId,
    ) -> Result<TlsIdentity, TlsError> {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| pem_err(&p.display().to_string(), e));
        let cert = PemPair { cert_pem: read(cert_path)?, key_pem: read(key_path)? };
        let mut identity = Self::from_pem(&read(ca_path)?, &cert, role, node_id.clone())?;
        let expect = reload::Expect::Node(role, node_id, identity.roots.clone());
        identity.source = Arc::new(reload::CertSource::watching(cert_path, key_path, expect)?);
        Ok(identity)
    }

    /// Times a changed certificate was taken from its files.
    pub fn reloads(&self) -> u64 {
        self.source.reloads()
    }

    /// Look at the certificate files now (handshakes do too): a node with long-lived connections takes a rotated
    /// certificate, and its metrics show it, without waiting for a new connection.
    pub fn refresh(&self) {
        let _ = self.source.current();
    }

    /// Issue a fresh certificate from `ca` and load it (development and tests).
    pub fn issue(ca: &ClusterCa, role: Role, node_id: NodeId) -> Result<TlsIdentity, TlsError> {
        let pair = ca.issue(role, &node_id, &["localhost".into(), "127.0.0.1".into()], 30)?;
        Self::from_pem(ca.cert_pem(), &pair, role, node_id)
    }

    /// The role this identity was issued for.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The node id this identity was issued for.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// A 32-byte secret derived from the node's private key and `label`, stable across restarts of a node that
    /// keeps its certificate. Used for QUIC's stateless-reset key and connection-id key (zl-proto's `quic`).
    pub fn derived_secret(&self, label: &[u8]) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"zerolayer derived secret v1\0");
        ctx.update(label);
        ctx.update(self.node_id.as_str().as_bytes());
        ctx.update(b"\0");
        ctx.update(self.key.secret_der());
        let mut out = [0; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    /// Server side: TLS 1.3 only, a client certificate from the cluster CA required, ALPN `zl/1`.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TlsError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider()).build()?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(self.source.clone());
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }

    /// Client side: TLS 1.3 only, trusts only the cluster CA, presents this node's certificate, ALPN `zl/1`.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(self.roots.clone())
            .with_client_cert_resolver(self.source.clone());
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    #[test]
    fn issued_certificates_carry_role_and_node_names() {
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        let pair = ca.issue(Role::Worker, &id("w0"), &[], 1).unwrap();
        let chain = certs_from_pem("c", pair.cert_pem.as_bytes()).unwrap();
        check_identity(&chain[0], Role::Worker, &id("w0")).unwrap();
        assert!(check_identity(&chain[0], Role::Orchestrator, &id("w0")).is_err());
        assert!(check_identity(&chain[0], Role::Worker, &id("w1")).is_err());
        // The node id a certificate names, for the admin log.
        let admin = ca.issue(Role::Admin, &id("ops-1"), &[], 1).unwrap();
        let admin = certs_from_pem("c", admin.cert_pem.as_bytes()).unwrap();
        assert_eq!(node_ids(&admin[0], Role::Admin), vec!["ops-1".to_owned()]);
        assert!(node_ids(&admin[0], Role::Worker).is_empty());
    }

    /// The replica certificates of earlier releases (`*.worker.zl.internal`, shared by every pod of a
    /// Deployment) let any pod claim any node id of its tier; they are no identity now.
    #[test]
    fn a_wildcard_certificate_is_no_node_identity() {
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        let mut params =
            CertificateParams::new(vec!["worker.zl.internal".into(), "*.worker.zl.internal".into()]).unwrap();
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca.issuer).unwrap();
        let der = cert.der().clone();
        assert!(check_role(&der, Role::Worker).is_err(), "a wildcard is refused for its role too");
        assert!(node_ids(&der, Role::Worker).is_empty());
        let err = check_identity(&der, Role::Worker, &id("w0")).unwrap_err();
        assert!(err.to_string().contains("wildcard"), "{err}");
        let pair = PemPair { cert_pem: cert.pem(), key_pem: key.serialize_pem() };
        assert!(TlsIdentity::from_pem(ca.cert_pem(), &pair, Role::Worker, id("w0")).is_err());
    }

    #[test]
    fn identity_refuses_a_certificate_for_another_node() {
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        let pair = ca.issue(Role::Frontend, &id("f0"), &[], 1).unwrap();
        assert!(TlsIdentity::from_pem(ca.cert_pem(), &pair, Role::Frontend, id("f0")).is_ok());
        let err = TlsIdentity::from_pem(ca.cert_pem(), &pair, Role::Worker, id("f0")).unwrap_err();
        assert!(matches!(err, TlsError::Identity { .. }), "{err}");
    }

    #[test]
    fn reloaded_ca_issues_certificates_its_original_verifies() {
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        let again = ClusterCa::from_pem(ca.cert_pem(), &ca.pem().key_pem).unwrap();
        let pair = again.issue(Role::Worker, &id("w9"), &["10.0.0.9".into()], 1).unwrap();
        let identity = TlsIdentity::from_pem(ca.cert_pem(), &pair, Role::Worker, id("w9")).unwrap();
        identity.server_config().unwrap();
        identity.client_config().unwrap();
    }

    #[test]
    fn bad_pem_is_a_clear_error() {
        let err = TlsIdentity::from_pem(
            "not pem",
            &PemPair { cert_pem: String::new(), key_pem: String::new() },
            Role::Worker,
            id("w0"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("cluster CA certificate"), "{err}");
        assert!(!format!("{:?}", PemPair { cert_pem: "c".into(), key_pem: "secret".into() }).contains("secret"));
    }

    /// A certificate signed by the cluster CA with the given DNS names (as a careless or hostile issuer would).
    fn signed_with_names(ca: &ClusterCa, names: &[&str]) -> CertificateDer<'static> {
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
        params.is_ca = IsCa::ExplicitNoCa;
        let key = KeyPair::generate().unwrap();
        params.signed_by(&key, &ca.issuer).unwrap().der().clone()
    }

    #[test]
    fn a_role_is_one_role_name_and_one_node_name_never_a_wildcard() {
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        for names in [
            // Wildcards match every role's and every node's name.
            &["*.zl.internal"][..],
            &["worker.zl.internal", "w1.worker.zl.internal", "*.zl.internal"],
            &["admin.zl.internal", "*.admin.zl.internal"],
            // A worker certificate that also names admin.
            &["worker.zl.internal", "w1.worker.zl.internal", "admin.zl.internal"],
            // Two nodes, or a node of another role.
            &["admin.zl.internal", "a1.admin.zl.internal", "a2.admin.zl.internal"],
            &["admin.zl.internal", "w1.worker.zl.internal"],
            &["admin.zl.internal"],
        ] {
            let der = signed_with_names(&ca, names);
            for role in Role::ALL {
                assert!(check_role(&der, role).is_err(), "{names:?} passed as {role}");
            }
        }
        let der = signed_with_names(&ca, &["admin.zl.internal", "ops.admin.zl.internal", "ops.example.com"]);
        check_role(&der, Role::Admin).unwrap();
        assert!(check_role(&der, Role::Worker).is_err());
        assert_eq!(identity(&der).unwrap(), (Role::Admin, "ops".to_owned()));
    }

    #[test]
    fn issuing_refuses_extra_names_in_the_cluster_domain_and_wildcards() {
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        for extra in
            ["*.zl.internal", "admin.zl.internal", "x.orchestrator.zl.internal", "zl.internal", "*.example.com"]
        {
            let err = ca.issue(Role::Worker, &id("w0"), &[extra.to_owned()], 1).unwrap_err();
            assert!(err.to_string().contains("may not be an extra name"), "{extra}: {err}");
        }
        ca.issue(Role::Worker, &id("w0"), &["w0.example.com".into(), "10.0.0.1".into()], 1).unwrap();
    }

    /// The chart's CSI issuer: an intermediate CA name-constrained to worker and frontend names. A worker's
    /// certificate from it chains to the cluster CA; one it signed for the admin's name is refused by every node.
    #[test]
    fn a_name_constrained_intermediate_signs_only_its_roles() {
        use rcgen::{GeneralSubtree, NameConstraints};
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: vec![
                GeneralSubtree::DnsName("worker.zl.internal".into()),
                GeneralSubtree::DnsName("frontend.zl.internal".into()),
            ],
            excluded_subtrees: vec![],
        });
        let key = KeyPair::generate().unwrap();
        let intermediate = params.signed_by(&key, &ca.issuer).unwrap();
        let nodes = ClusterCa {
            pem: PemPair { cert_pem: intermediate.pem(), key_pem: key.serialize_pem() },
            issuer: Issuer::new(params, key),
        };
        let mut roots = RootCertStore::empty();
        roots.add(certs_from_pem("ca", ca.cert_pem().as_bytes()).unwrap().remove(0)).unwrap();
        let roots = Arc::new(roots);
        let chain = |role: Role, node: &str| {
            let pair = nodes.issue(role, &id(node), &[], 1).unwrap();
            let mut chain = certs_from_pem("leaf", pair.cert_pem.as_bytes()).unwrap();
            chain.push(intermediate.der().clone());
            chain
        };
        check_chain(&roots, &chain(Role::Worker, "w-1"), Role::Worker, &id("w-1")).unwrap();
        check_chain(&roots, &chain(Role::Frontend, "f-1"), Role::Frontend, &id("f-1")).unwrap();
        let err = check_chain(&roots, &chain(Role::Admin, "ops"), Role::Admin, &id("ops")).unwrap_err();
        assert!(matches!(err, TlsError::Untrusted(_)), "{err}");
        let err = check_chain(&roots, &chain(Role::Orchestrator, "o-0"), Role::Orchestrator, &id("o-0")).unwrap_err();
        assert!(matches!(err, TlsError::Untrusted(_)), "{err}");
    }
}
