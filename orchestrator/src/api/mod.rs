//! The orchestrator's two faces, thin shells over [`crate::orchestrator::Orchestrator`]: [`quic`] for frontends and
//! workers (FlatBuffers over QUIC), [`admin`] for operators (gRPC).

pub mod admin;
pub mod ledger;
pub mod quic;
