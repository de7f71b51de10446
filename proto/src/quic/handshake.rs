//! The connection handshake: on the first stream of every connection each side sends a `Handshake` frame. The
//! server checks the protocol major version, that the client's role may call it, and that the role and node id the
//! client claims are the ones its certificate was issued for; the client checks the same of the server.

use rustls_pki_types::CertificateDer;

use super::io::{FrameReader, FrameWriter, ReadFailure};
use super::{PROTOCOL_MAJOR, PROTOCOL_MINOR, PeerInfo, RpcSettings};
use zl_tls::{TlsIdentity, check_identity};
use zl_wire::message::{ErrorCode, Handshake, Message, Role, WireError};

fn ours(identity: &TlsIdentity) -> Handshake {
    Handshake {
        protocol_major: PROTOCOL_MAJOR,
        protocol_minor: PROTOCOL_MINOR,
        role: identity.role(),
        node_id: identity.node_id().clone(),
        software_version: concat!("zerolayer ", env!("CARGO_PKG_VERSION")).to_owned(),
    }
}

fn peer_certificate(conn: &quinn::Connection) -> Option<CertificateDer<'static>> {
    let any = conn.peer_identity()?;
    let certs = any.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    certs.first().cloned()
}

/// Check a peer's handshake against our version and its certificate.
fn check_peer(conn: &quinn::Connection, hs: &Handshake, allowed: &[Role]) -> Result<PeerInfo, WireError> {
    if hs.protocol_major != PROTOCOL_MAJOR {
        return Err(WireError::new(
            ErrorCode::VersionMismatch,
            format!(
                "protocol major version {} is not supported (this node speaks {PROTOCOL_MAJOR})",
                hs.protocol_major
            ),
        ));
    }
    if !allowed.contains(&hs.role) {
        return Err(WireError::new(ErrorCode::PermissionDenied, format!("role {} may not call this node", hs.role)));
    }
    let cert = peer_certificate(conn)
        .ok_or_else(|| WireError::new(ErrorCode::PermissionDenied, "no client certificate presented"))?;
    check_identity(&cert, hs.role, &hs.node_id)
        .map_err(|e| WireError::new(ErrorCode::PermissionDenied, e.to_string()))?;
    Ok(PeerInfo {
        role: hs.role,
        node_id: hs.node_id.clone(),
        addr: conn.remote_address(),
        protocol_minor: hs.protocol_minor,
    })
}

fn describe(err: ReadFailure) -> String {
    format!("handshake failed: {err}")
}

/// Client side: open the first stream, send our handshake, check the server's.
pub(crate) async fn client(
    conn: &quinn::Connection,
    identity: &TlsIdentity,
    expected: Role,
    settings: &RpcSettings,
) -> Result<PeerInfo, String> {
    let (send, recv) = conn.open_bi().await.map_err(|e| format!("handshake failed: {e}"))?;
    let mut writer = FrameWriter::new(send, settings.max_payload);
    let mut reader = FrameReader::new(recv, settings.max_payload);
    writer.write(&Message::Handshake(ours(identity))).await.map_err(|e| format!("handshake failed: {e}"))?;
    writer.finish();
    match reader.next_message().await.map_err(describe)? {
        Some(Message::Handshake(hs)) => {
            if hs.role != expected {
                return Err(format!("expected a {expected} but the peer is a {}", hs.role));
            }
            check_peer(conn, &hs, &[expected]).map_err(|e| format!("server refused: {}", e.message))
        }
        Some(Message::Error(e)) => Err(format!("server refused the handshake: {e}")),
        Some(other) => Err(format!("handshake failed: unexpected {} frame", other.kind())),
        None => Err("handshake failed: server closed the stream".into()),
    }
}

/// Server side: accept the first stream, check the client's handshake, answer with ours or with an `Error`.
pub(crate) async fn server(
    conn: &quinn::Connection,
    identity: &TlsIdentity,
    settings: &RpcSettings,
) -> Result<PeerInfo, String> {
    let (send, recv) = conn.accept_bi().await.map_err(|e| format!("no handshake stream: {e}"))?;
    let mut writer = FrameWriter::new(send, settings.max_payload);
    let mut reader = FrameReader::new(recv, settings.max_payload);
    let result = match reader.next_message().await {
        Ok(Some(Message::Handshake(hs))) => check_peer(conn, &hs, &settings.allowed_roles),
        Ok(Some(other)) => {
            Err(WireError::new(ErrorCode::ProtocolViolation, format!("expected a handshake, got {}", other.kind())))
        }
        Ok(None) => Err(WireError::new(ErrorCode::ProtocolViolation, "stream closed before the handshake")),
        Err(e) => Err(WireError::new(ErrorCode::ProtocolViolation, describe(e))),
    };
    let reply = match &result {
        Ok(_) => Message::Handshake(ours(identity)),
        Err(e) => Message::Error(e.clone()),
    };
    let written = writer.write(&reply).await;
    writer.finish();
    let peer = result.map_err(|e| e.to_string())?;
    written.map_err(|e| format!("handshake reply failed: {e}"))?;
    Ok(peer)
}
