//! Who may get a node certificate from this orchestrator, and the signing itself (sans-IO). The orchestrator
//! commits each enrollment to the routing state before it answers ([`crate::state::Enrolled`]), so every
//! orchestrator refuses a second enrollment of the same node id.

use zl_tls::ClusterCa;
use zl_tls::enroll::{Signed, bootstrap_id, enrollable};
use zl_wire::message::{CertificateRequest, ErrorCode, Role, WireError};

use crate::state::EnrollEntry;

/// Default validity of an enrolled certificate, in days. Nodes renew when a third of it is left.
pub const DEFAULT_DAYS: u32 = 30;

/// The cluster CA this orchestrator signs node certificates with (`--enroll-ca-key`).
pub struct Enroller {
    ca: ClusterCa,
    days: u32,
}

impl std::fmt::Debug for Enroller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enroller").field("days", &self.days).finish_non_exhaustive()
    }
}

fn denied(message: String) -> WireError {
    WireError::new(ErrorCode::PermissionDenied, message)
}

impl Enroller {
    /// Sign with `ca`, certificates valid for `days`.
    pub fn new(ca: ClusterCa, days: u32) -> Enroller {
        Enroller { ca, days: days.max(1) }
    }

    /// Whether the caller may ask for this certificate: a bootstrap credential of the requested role (a first
    /// enrollment), or the node itself (a renewal). Returns whether it is a renewal.
    pub fn authorize(peer_role: Role, peer_id: &str, req: &CertificateRequest) -> Result<bool, WireError> {
        if !enrollable(req.role) {
            return Err(denied(format!("{} nodes are not enrolled", req.role)));
        }
        if peer_role == Role::Bootstrap && peer_id == bootstrap_id(req.role).as_str() {
            return Ok(false);
        }
        if peer_role == req.role && peer_id == req.node_id.as_str() {
            return Ok(true);
        }
        Err(denied(format!(
            "{peer_role} {peer_id} may not ask for a certificate for {} {} (a bootstrap credential enrolls new nodes \
             of its role; a node renews only its own)",
            req.role, req.node_id
        )))
    }

    /// Sign the request; the entry to commit before the certificate is handed out.
    pub fn sign(
        &self,
        req: &CertificateRequest,
        renewal: bool,
        at_ms: u64,
    ) -> Result<(Signed, EnrollEntry), WireError> {
        let signed = self
            .ca
            .sign_request(&req.csr_der, req.role, &req.node_id, self.days)
            .map_err(|e| WireError::new(ErrorCode::InvalidRequest, e.to_string()))?;
        let entry = EnrollEntry {
            role: req.role.name().to_owned(),
            node_id: req.node_id.to_string(),
            key_sha256: zl_common::keys::hex(&signed.key_sha256),
            not_after_ms: signed.not_after_ms,
            at_ms,
            renewal,
        };
        Ok((signed, entry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zl_wire::message::NodeId;

    fn request(role: Role, id: &str) -> CertificateRequest {
        let node_id = NodeId::new(id).unwrap();
        let csr = zl_tls::enroll::signing_request(role, &node_id).unwrap();
        CertificateRequest { role, node_id, csr_der: csr.csr_der }
    }

    #[test]
    fn only_the_roles_bootstrap_credential_or_the_node_itself_asks() {
        let w = request(Role::Worker, "w-1");
        assert_eq!(Enroller::authorize(Role::Bootstrap, "worker", &w), Ok(false));
        assert_eq!(Enroller::authorize(Role::Worker, "w-1", &w), Ok(true));
        assert!(Enroller::authorize(Role::Bootstrap, "frontend", &w).is_err(), "another role's credential");
        assert!(Enroller::authorize(Role::Worker, "w-2", &w).is_err(), "another node");
        assert!(Enroller::authorize(Role::Frontend, "w-1", &w).is_err(), "another role");
        assert!(Enroller::authorize(Role::Admin, "ops", &w).is_err());
    }

    #[test]
    fn a_signed_request_becomes_the_entry_to_commit() {
        let enroller = Enroller::new(ClusterCa::generate("t", 1).unwrap(), 2);
        let (signed, entry) = enroller.sign(&request(Role::Frontend, "f-1"), false, 1234).unwrap();
        assert_eq!((entry.role.as_str(), entry.node_id.as_str(), entry.at_ms), ("frontend", "f-1", 1234));
        assert_eq!(entry.key_sha256, zl_common::keys::hex(&signed.key_sha256));
        assert_eq!(entry.not_after_ms, signed.not_after_ms);
        let mut bad = request(Role::Frontend, "f-1");
        bad.csr_der.truncate(10);
        assert_eq!(enroller.sign(&bad, false, 0).unwrap_err().code, ErrorCode::InvalidRequest);
    }
}
