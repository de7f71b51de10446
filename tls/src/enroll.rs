//! Enrollment: how a node that Kubernetes names at random (a Deployment's pod) gets a certificate of its own
//! without any private key shared between pods, after the kubelet's TLS bootstrap.
//!
//! The pods of a role share one *bootstrap credential*: a certificate of role [`Role::Bootstrap`] whose node id
//! is the role it enrolls (`worker.bootstrap.zl.internal`). It carries no node's name and no role's name, so it
//! can act as no node; an orchestrator admits it for one call only, a certificate request. The node makes its key
//! pair itself, sends a signing request ([`signing_request`]: proof that it holds the key, which never leaves
//! it), and the orchestrator signs a node certificate ([`ClusterCa::sign_request`]) for a node id that was never
//! enrolled before. A node renews with its own certificate, for its own id only.

use rcgen::{CertificateParams, CertificateSigningRequestParams, KeyPair, PublicKeyData};
use rustls_pki_types::CertificateSigningRequestDer;

use crate::{ClusterCa, PemPair, TlsError, node_params};
use zl_wire::message::{NodeId, Role};

/// The roles whose nodes enroll (interchangeable replicas named at random); orchestrators (Raft members with
/// stable names) and operators get certificates from `zl certs issue`.
pub fn enrollable(role: Role) -> bool {
    matches!(role, Role::Worker | Role::Frontend)
}

/// The node id of the bootstrap credential that enrolls nodes of `role`.
pub fn bootstrap_id(role: Role) -> NodeId {
    NodeId::new(role.name()).expect("role names are valid node ids")
}

/// A signing request and the private key it was made with (which stays on the node).
#[derive(Clone)]
pub struct SigningRequest {
    /// The PKCS#10 request, DER.
    pub csr_der: Vec<u8>,
    /// The new private key, PKCS#8 PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for SigningRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningRequest").field("csr_der", &self.csr_der.len()).finish_non_exhaustive()
    }
}

/// Make a fresh P-256 key pair and a signing request for node `node_id` of `role`.
pub fn signing_request(role: Role, node_id: &NodeId) -> Result<SigningRequest, TlsError> {
    let key = KeyPair::generate()?;
    let params = CertificateParams::new(vec![crate::node_name(role, node_id)])?;
    let csr = params.serialize_request(&key)?;
    Ok(SigningRequest { csr_der: csr.der().to_vec(), key_pem: key.serialize_pem() })
}

/// A certificate signed for a request.
#[derive(Clone, Debug)]
pub struct Signed {
    /// The node certificate, PEM (LF line endings).
    pub cert_pem: String,
    /// When it expires, milliseconds since the Unix epoch.
    pub not_after_ms: u64,
    /// SHA-256 of the subject public key it certifies: what the enrollment record keeps.
    pub key_sha256: [u8; 32],
}

impl ClusterCa {
    /// Issue the bootstrap credential of `role` (only [`enrollable`] roles), valid for `days`.
    pub fn issue_bootstrap(&self, role: Role, days: u32) -> Result<PemPair, TlsError> {
        if !enrollable(role) {
            return Err(TlsError::Identity {
                expected: crate::node_name(Role::Bootstrap, &bootstrap_id(role)),
                problem: format!("{role} nodes get certificates of their own from `zl certs issue`, not enrollment"),
            });
        }
        self.issue(Role::Bootstrap, &bootstrap_id(role), &[], days)
    }

    /// Sign a node certificate for `role` and `node_id` over the public key of `csr_der`, after checking the
    /// request's signature (the caller holds the key). The names in the request are ignored: the certificate
    /// names exactly `role` and `node_id`.
    pub fn sign_request(&self, csr_der: &[u8], role: Role, node_id: &NodeId, days: u32) -> Result<Signed, TlsError> {
        let bad = |problem: String| TlsError::Identity { expected: crate::node_name(role, node_id), problem };
        if !enrollable(role) {
            return Err(bad(format!("{role} nodes are not enrolled")));
        }
        let csr = CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(csr_der))
            .map_err(|e| bad(format!("the signing request is invalid: {e}")))?;
        let params = node_params(role, node_id, &[], days)?;
        let not_after_ms = u64::try_from(params.not_after.unix_timestamp()).unwrap_or(0) * 1000;
        let key_sha256 = sha256(csr.public_key.der_bytes());
        let cert = CertificateSigningRequestParams { params, public_key: csr.public_key }.signed_by(&self.issuer)?;
        Ok(Signed { cert_pem: cert.pem().replace("\r\n", "\n"), not_after_ms, key_sha256 })
    }
}

/// A certificate's validity, `(not_before, not_after)` in Unix ms; `None` when the PEM holds no certificate.
pub fn validity_ms(cert_pem: &str) -> Option<(u64, u64)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let ms = |t: x509_parser::time::ASN1Time| u64::try_from(t.timestamp()).ok().map(|s| s * 1000);
    Some((ms(cert.validity().not_before)?, ms(cert.validity().not_after)?))
}

/// Whether a certificate valid over `(not_before, not_after)` should be renewed at `now_ms`: when less than a
/// third of its lifetime is left (or it is not valid at all).
pub fn due_for_renewal((not_before, not_after): (u64, u64), now_ms: u64) -> bool {
    let third = not_after.saturating_sub(not_before) / 3;
    now_ms < not_before || now_ms.saturating_add(third) >= not_after
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TlsIdentity, certs_from_pem, check_identity, check_role};

    fn id(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    #[test]
    fn a_signed_request_is_a_certificate_for_exactly_that_node() {
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        let req = signing_request(Role::Worker, &id("w-7f9c")).unwrap();
        let signed = ca.sign_request(&req.csr_der, Role::Worker, &id("w-7f9c"), 2).unwrap();
        assert!(!signed.cert_pem.contains('\r'));
        let pair = PemPair { cert_pem: signed.cert_pem.clone(), key_pem: req.key_pem.clone() };
        let identity = TlsIdentity::from_pem(ca.cert_pem(), &pair, Role::Worker, id("w-7f9c")).unwrap();
        identity.client_config().unwrap();
        let der = &certs_from_pem("c", signed.cert_pem.as_bytes()).unwrap()[0];
        assert!(check_identity(der, Role::Worker, &id("w-other")).is_err());
        assert!(check_identity(der, Role::Frontend, &id("w-7f9c")).is_err());
        let now_ms = u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp()).unwrap() * 1000;
        assert!(signed.not_after_ms > now_ms + 86_400_000 && signed.not_after_ms <= now_ms + 2 * 86_400_000);
        let (from, until) = validity_ms(&signed.cert_pem).unwrap();
        assert_eq!(until, signed.not_after_ms);
        assert!(!due_for_renewal((from, until), now_ms));
        assert!(due_for_renewal((from, until), until - (until - from) / 4));
        assert!(due_for_renewal((from, until), from - 1));
        assert_eq!(validity_ms("not pem"), None);
        // The same request signed again certifies the same key.
        let again = ca.sign_request(&req.csr_der, Role::Worker, &id("w-7f9c"), 2).unwrap();
        assert_eq!(again.key_sha256, signed.key_sha256);
        assert_ne!(signing_request(Role::Worker, &id("w-7f9c")).unwrap().csr_der, req.csr_der, "a fresh key each time");
    }

    #[test]
    fn tampered_requests_and_other_roles_are_refused() {
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        let mut req = signing_request(Role::Frontend, &id("f0")).unwrap();
        let last = req.csr_der.len() - 1;
        req.csr_der[last] ^= 1;
        assert!(ca.sign_request(&req.csr_der, Role::Frontend, &id("f0"), 1).is_err(), "bad signature");
        assert!(ca.sign_request(b"not a csr", Role::Frontend, &id("f0"), 1).is_err());
        let req = signing_request(Role::Orchestrator, &id("o0")).unwrap();
        assert!(ca.sign_request(&req.csr_der, Role::Orchestrator, &id("o0"), 1).is_err());
        assert!(ca.sign_request(&req.csr_der, Role::Admin, &id("o0"), 1).is_err());
    }

    #[test]
    fn a_bootstrap_credential_acts_as_no_node() {
        let ca = ClusterCa::generate("test CA", 1).unwrap();
        let boot = ca.issue_bootstrap(Role::Worker, 1).unwrap();
        let der = &certs_from_pem("c", boot.cert_pem.as_bytes()).unwrap()[0];
        check_identity(der, Role::Bootstrap, &bootstrap_id(Role::Worker)).unwrap();
        assert!(check_identity(der, Role::Bootstrap, &bootstrap_id(Role::Frontend)).is_err());
        for role in [Role::Worker, Role::Frontend, Role::Orchestrator, Role::Admin] {
            assert!(check_role(der, role).is_err(), "{role}");
        }
        assert!(ca.issue_bootstrap(Role::Orchestrator, 1).is_err());
        assert!(ca.issue_bootstrap(Role::Admin, 1).is_err());
    }
}
