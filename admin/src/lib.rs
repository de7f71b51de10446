//! zerolayer's operator admin API (`schemas/admin.proto`): gRPC over HTTP/2 with mutual TLS from the cluster CA,
//! served by every orchestrator and called by `zl admin`. Only certificates issued for the `admin` role may call
//! it: [`require_admin`] checks every request.

use std::path::Path;

use anyhow::{Context, Result};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use zl_tls::NodeFiles;
use zl_wire::message::Role;

/// Generated messages, client and server.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("zerolayer.admin.v1");
}

pub mod serve;

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// The PEM files `zl certs issue` writes for a node: `{dir}/ca.pem`, `{dir}/{role}-{id}.pem` and `.key`.
fn pems(dir: &Path, role: Role, id: &str) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let files = NodeFiles::new(dir, role, id);
    Ok((read(&files.ca)?, read(&files.cert)?, read(&files.key)?))
}

/// A channel to an orchestrator's admin endpoint, presenting the admin certificate `admin-{id}` from `dir`.
pub async fn connect(addr: impl std::fmt::Display, dir: &Path, admin_id: &str) -> Result<Channel> {
    endpoint(&addr.to_string(), dir, Role::Admin, admin_id)?
        .connect()
        .await
        .with_context(|| format!("connecting to the admin API at {addr}"))
}

/// An endpoint for an orchestrator's admin port at `addr` (`host:port`; a DNS name is resolved on each
/// connection), presenting the certificate `{role}-{id}` from `dir` (connect it now, or lazily on first use).
/// Calls time out after 10 s. The server is verified as an orchestrator whatever name was dialled.
pub fn endpoint(addr: &str, dir: &Path, role: Role, id: &str) -> Result<Endpoint> {
    let (ca, cert, key) = pems(dir, role, id)?;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .identity(Identity::from_pem(cert, key))
        .domain_name(zl_tls::role_name(Role::Orchestrator));
    Ok(Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(std::time::Duration::from_secs(10)))
}

/// Refuse a request whose client certificate was not issued for the `admin` role.
#[allow(clippy::result_large_err)]
pub fn require_admin<T>(request: &tonic::Request<T>) -> Result<(), tonic::Status> {
    require_role(request, Role::Admin)
        .map_err(|e| tonic::Status::permission_denied(e.message().replace("may call this", "may administer")))
}

/// The node id of the admin certificate that made `request` (after [`require_admin`]): who did it, for the
/// routing state's admin log. `unknown` for a certificate that names none (a wildcard).
pub fn admin_id<T>(request: &tonic::Request<T>) -> String {
    let ids = request
        .peer_certs()
        .and_then(|certs| certs.first().map(|c| zl_tls::node_ids(c, Role::Admin)))
        .unwrap_or_default();
    ids.into_iter().next().unwrap_or_else(|| "unknown".to_owned())
}

/// Refuse a request whose client certificate was not issued for `role`.
#[allow(clippy::result_large_err)]
pub fn require_role<T>(request: &tonic::Request<T>, role: Role) -> Result<(), tonic::Status> {
    let certs =
        request.peer_certs().ok_or_else(|| tonic::Status::unauthenticated("a client certificate is required"))?;
    let cert = certs.first().ok_or_else(|| tonic::Status::unauthenticated("a client certificate is required"))?;
    zl_tls::check_role(cert, role)
        .map_err(|e| tonic::Status::permission_denied(format!("only {} certificates may call this: {e}", role.name())))
}
