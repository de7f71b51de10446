//! Certificates that follow their files: a node's certificate and key are read again when the files change, so
//! cert-manager's rotations (and `zl certs issue` over the old files) take effect in a running process, for new
//! connections, with no restart. Used as the rustls certificate resolver on both sides of every TLS endpoint
//! (QUIC, the admin API, HTTPS); connections already open keep the certificate they were made with.
//!
//! The files are looked at (two `stat`s) at most once a second, on a handshake. A new pair is used only once it
//! parses, the key matches the certificate, and a node certificate still names this node and chains to the
//! cluster CA the node trusts (read once at start: a certificate from a new CA would be refused by every peer, so
//! it is never presented); otherwise the old one stays, and the problem is logged once per change and counted
//! (`zl_tls_certificate_reload_failures_total`, by `reason`: `untrusted` for another CA, which the
//! `ZerolayerCertificateUntrusted` alert watches). Kubernetes Secret and CSI volumes replace both files at once (a symlink swap); a writer that replaces
//! them one by one is read again at the next look.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use rustls::RootCertStore;
use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use zl_wire::message::{NodeId, Role};

use crate::{TlsError, check_chain, pem_err, provider};

/// Between two looks at the files.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// What a certificate must name to be taken.
#[derive(Clone, Debug)]
pub enum Expect {
    /// A node certificate of this role and node id, chaining to these roots (the cluster CA).
    Node(Role, NodeId, Arc<RootCertStore>),
    /// Anything that parses (an HTTPS certificate from a public CA).
    Any,
}

#[derive(Debug)]
struct Watched {
    cert: PathBuf,
    key: PathBuf,
    expect: Expect,
    /// The files' stamps when last read, and when they were last looked at.
    seen: Mutex<(Option<Stamp>, Instant)>,
}

type Stamp = [(SystemTime, u64); 2];

/// A certificate and key, read again from their files when these change (or fixed, for one made in memory).
#[derive(Debug)]
pub struct CertSource {
    current: RwLock<Arc<CertifiedKey>>,
    watched: Option<Watched>,
    reloads: std::sync::atomic::AtomicU64,
    failures: std::sync::atomic::AtomicU64,
}

fn stamp(cert: &Path, key: &Path) -> Option<Stamp> {
    let one = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
    Some([one(cert)?, one(key)?])
}

/// Parse a chain and key and check they belong together.
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, TlsError> {
    Ok(Arc::new(CertifiedKey::from_der(chain, key, &provider())?))
}

/// The metric label of a certificate file: its name (`worker-w0.pem`, `tls.crt`).
fn label(cert: &Path) -> String {
    cert.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn load(cert: &Path, key: &Path, expect: &Expect) -> Result<Arc<CertifiedKey>, TlsError> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| pem_err(&p.display().to_string(), e));
    let pem = read(cert)?;
    // When it stops being valid: alert well before (docs/operations.md).
    if let Some((_, not_after)) = crate::enroll::validity_ms(&String::from_utf8_lossy(&pem)) {
        metrics::gauge!("zl_tls_certificate_not_after_seconds", "cert" => label(cert)).set(not_after as f64 / 1e3);
    }
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(&cert.display().to_string(), e))?;
    if chain.is_empty() {
        return Err(pem_err(&cert.display().to_string(), "no certificate"));
    }
    if let Expect::Node(role, node_id, roots) = expect {
        check_chain(roots, &chain, *role, node_id)?;
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| pem_err(&key.display().to_string(), e))?;
    certified_key(chain, key)
}

impl CertSource {
    /// A certificate that never changes (made in memory: tests, `zl up`'s throwaway clusters).
    pub fn fixed(key: Arc<CertifiedKey>) -> CertSource {
        CertSource { current: RwLock::new(key), watched: None, reloads: 0.into(), failures: 0.into() }
    }

    /// Read `cert` and `key` now (an error if they are unusable), and again whenever they change.
    pub fn watching(cert: &Path, key: &Path, expect: Expect) -> Result<CertSource, TlsError> {
        let seen = stamp(cert, key);
        let current = load(cert, key, &expect)?;
        let watched = Watched {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            expect,
            seen: Mutex::new((seen, Instant::now())),
        };
        Ok(CertSource { current: RwLock::new(current), watched: Some(watched), reloads: 0.into(), failures: 0.into() })
    }

    /// How many times a changed pair was taken.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times a changed pair was refused.
    pub fn refusals(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The certificate to present now (after a look at the files, at most once a second).
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.look(Instant::now());
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn look(&self, now: Instant) {
        let Some(w) = &self.watched else { return };
        let mut seen = w.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.saturating_duration_since(seen.1) < LOOK_EVERY {
            return;
        }
        seen.1 = now;
        let stamp = stamp(&w.cert, &w.key);
        if stamp.is_none() || stamp == seen.0 {
            return;
        }
        seen.0 = stamp;
        match load(&w.cert, &w.key, &w.expect) {
            Ok(key) => {
                *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = key;
                self.reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                metrics::counter!("zl_tls_certificate_reloads_total", "cert" => label(&w.cert)).increment(1);
                tracing::info!(cert = %w.cert.display(), "certificate changed on disk: new connections use the new one");
            }
            Err(e) => {
                let reason = if matches!(e, TlsError::Untrusted(_)) { "untrusted" } else { "unusable" };
                metrics::counter!("zl_tls_certificate_reload_failures_total", "cert" => label(&w.cert), "reason" => reason)
                    .increment(1);
                self.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(cert = %w.cert.display(), error = %e, reason, "certificate changed on disk but is refused: keeping the old one")
            }
        }
    }
}

impl ResolvesServerCert for CertSource {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for CertSource {
    fn resolve(&self, _issuers: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClusterCa;

    fn id(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    fn roots(ca: &ClusterCa) -> Arc<RootCertStore> {
        let mut roots = RootCertStore::empty();
        roots.add(crate::certs_from_pem("ca", ca.cert_pem().as_bytes()).unwrap().remove(0)).unwrap();
        Arc::new(roots)
    }

    #[test]
    fn a_rotated_pair_is_taken_and_a_bad_one_is_not() {
        let ca = ClusterCa::generate("test", 1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("w.pem"), dir.path().join("w.key"));
        let write = |pair: &crate::PemPair| {
            std::fs::write(&cert, &pair.cert_pem).unwrap();
            std::fs::write(&key, &pair.key_pem).unwrap();
        };
        let first = ca.issue(Role::Worker, &id("w0"), &[], 1).unwrap();
        write(&first);
        let source = CertSource::watching(&cert, &key, Expect::Node(Role::Worker, id("w0"), roots(&ca))).unwrap();
        let before = source.current();
        // Unchanged files: the same certificate.
        source.look(Instant::now() + LOOK_EVERY * 2);
        assert!(Arc::ptr_eq(&before, &source.current()));

        let second = ca.issue(Role::Worker, &id("w0"), &["extra.example".into()], 1).unwrap();
        write(&second);
        source.look(Instant::now() + LOOK_EVERY * 4);
        let after = source.current();
        assert_ne!(before.cert[0], after.cert[0], "the new certificate is presented");
        assert_eq!(source.reloads(), 1);

        // Another node's certificate, and a key that does not match, are refused: the last good pair stays.
        let other = ca.issue(Role::Worker, &id("w1"), &[], 1).unwrap();
        write(&other);
        source.look(Instant::now() + LOOK_EVERY * 6);
        assert_eq!(source.current().cert[0], after.cert[0]);
        std::fs::write(&cert, &second.cert_pem).unwrap();
        std::fs::write(&key, &first.key_pem).unwrap();
        source.look(Instant::now() + LOOK_EVERY * 8);
        assert_eq!(source.current().cert[0], after.cert[0]);
        assert_eq!(source.reloads(), 1);
        // A missing file at start is an error.
        assert!(CertSource::watching(&dir.path().join("none.pem"), &key, Expect::Any).is_err());
    }

    /// The chart's certs Job run without the CA Secret mints a new CA and new node certificates over a running
    /// cluster: every peer would refuse them (`BadSignature`), so the node keeps presenting its old one, and says so.
    #[test]
    fn a_pair_from_another_ca_is_refused_and_counted() {
        let ca = ClusterCa::generate("test", 1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("w.pem"), dir.path().join("w.key"));
        let first = ca.issue(Role::Worker, &id("w0"), &[], 1).unwrap();
        std::fs::write(&cert, &first.cert_pem).unwrap();
        std::fs::write(&key, &first.key_pem).unwrap();
        let source = CertSource::watching(&cert, &key, Expect::Node(Role::Worker, id("w0"), roots(&ca))).unwrap();
        let before = source.current();

        let other_ca = ClusterCa::generate("a new CA", 1).unwrap();
        let swapped = other_ca.issue(Role::Worker, &id("w0"), &[], 1).unwrap();
        std::fs::write(&cert, &swapped.cert_pem).unwrap();
        std::fs::write(&key, &swapped.key_pem).unwrap();
        source.look(Instant::now() + LOOK_EVERY * 2);
        assert_eq!(source.current().cert[0], before.cert[0], "the old, trusted certificate stays");
        assert_eq!((source.reloads(), source.refusals()), (0, 1));
        let err = load(&cert, &key, &Expect::Node(Role::Worker, id("w0"), roots(&ca))).unwrap_err();
        assert!(matches!(err, TlsError::Untrusted(_)), "{err}");
        // At start, too: a node never presents what its peers cannot verify.
        let pair = crate::PemPair { cert_pem: swapped.cert_pem, key_pem: swapped.key_pem };
        assert!(matches!(
            crate::TlsIdentity::from_pem(ca.cert_pem(), &pair, Role::Worker, id("w0")),
            Err(TlsError::Untrusted(_))
        ));
    }
}
