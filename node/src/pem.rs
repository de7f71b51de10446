//! A TLS identity from PEM files: what the frontend's HTTPS listener serves and what the Consul client presents.

use std::path::Path;

use anyhow::{Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of `cert` (a chain, leaf first) and the private key in `key`.
pub fn chain_and_key(cert: &Path, key: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading the key {}", key.display()))?;
    Ok((chain, key))
}

/// The certificates of a CA file, as a root store.
pub fn roots(ca: &Path) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))? {
        roots.add(cert.with_context(|| format!("parsing {}", ca.display()))?)?;
    }
    Ok(roots)
}
