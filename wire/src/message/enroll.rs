//! Enrollment: a node asks an orchestrator for a certificate of its own, proving with a signing request that it
//! holds the private key.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::check::{self, invalid};
use super::{MessageError, NodeId, Role};
use crate::generated::zl::wire as fb;

/// The largest signing request accepted (a P-256 CSR is about 300 bytes).
pub const MAX_CSR_LEN: usize = 4 * 1024;
/// The largest issued certificate carried back.
pub const MAX_CERT_PEM_LEN: usize = 8 * 1024;

/// A node's request for a certificate of `role` and `node_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateRequest {
    /// The role the certificate is for (worker or frontend).
    pub role: Role,
    /// The node id it is for.
    pub node_id: NodeId,
    /// A PKCS#10 signing request, DER.
    pub csr_der: Vec<u8>,
}

impl CertificateRequest {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        if !matches!(self.role, Role::Worker | Role::Frontend) {
            return Err(invalid("CertificateRequest.role", format!("{} nodes are not enrolled", self.role)));
        }
        if self.csr_der.is_empty() || self.csr_der.len() > MAX_CSR_LEN {
            return Err(invalid("CertificateRequest.csr_der", format!("must be 1 to {MAX_CSR_LEN} bytes")));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::CertificateRequest<'b>> {
        let node_id = fbb.create_string(self.node_id.as_str());
        let csr_der = fbb.create_vector(&self.csr_der);
        fb::CertificateRequest::create(
            fbb,
            &fb::CertificateRequestArgs { role: self.role.to_wire(), node_id: Some(node_id), csr_der: Some(csr_der) },
        )
    }

    pub(crate) fn read(t: fb::CertificateRequest<'_>) -> Result<Self, MessageError> {
        let msg = CertificateRequest {
            role: Role::from_wire("CertificateRequest.role", t.role())?,
            node_id: NodeId::read("CertificateRequest.node_id", t.node_id())?,
            csr_der: t.csr_der().bytes().to_vec(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// The certificate issued for a [`CertificateRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateIssued {
    /// The node certificate, PEM.
    pub cert_pem: String,
    /// Its expiry, milliseconds since the Unix epoch.
    pub not_after_ms: u64,
}

impl CertificateIssued {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::text("CertificateIssued.cert_pem", &self.cert_pem, 1, MAX_CERT_PEM_LEN)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::CertificateIssued<'b>> {
        let cert_pem = fbb.create_string(&self.cert_pem);
        fb::CertificateIssued::create(
            fbb,
            &fb::CertificateIssuedArgs { cert_pem: Some(cert_pem), not_after_ms: self.not_after_ms },
        )
    }

    pub(crate) fn read(t: fb::CertificateIssued<'_>) -> Result<Self, MessageError> {
        let msg = CertificateIssued { cert_pem: t.cert_pem().to_owned(), not_after_ms: t.not_after_ms() };
        msg.check()?;
        Ok(msg)
    }
}
