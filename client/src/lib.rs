//! The cluster as its clients see it, shared by the frontend (the gateway) and `zl bench` (which measures the
//! gateway by going around it): the same calls, the same tokens.
//!
//! - [`upstream`]: the tiers behind a client ([`upstream::Upstream`]; [`upstream::QuicUpstream`] speaks the RPC).
//! - [`card`]: a model's card from a worker, with its tokenizer built.
//! - [`embed`]: an embeddings answer from a worker, checked frame by frame.
//! - [`prompt`]: a conversation rendered with the model's chat template and tokenised, exactly as the gateway
//!   sends it.
//!
//! Like TGI's client crate beside its router and its benchmark: no HTTP, no policy, nothing of the gateway.

pub mod card;
pub mod embed;
pub mod prompt;
pub mod upstream;

use zl_proto::quic::RpcSettings;

/// RPC settings of a client of the cluster (a frontend, or `zl bench` going straight to a worker). Its connections
/// to workers and orchestrators ping every 400 ms and are declared dead after 1.5 s without a packet (QUIC takes
/// the smaller of the two ends' idle timeouts), so a killed or frozen worker costs its streams 1.5 s, not 15;
/// connecting gives up after 1 s (peers are in the same region; a handshake takes milliseconds). See
/// docs/operations.md, "Fault detection".
pub fn rpc_settings() -> RpcSettings {
    RpcSettings {
        keep_alive: std::time::Duration::from_millis(400),
        idle_timeout: std::time::Duration::from_millis(1500),
        connect_timeout: std::time::Duration::from_secs(1),
        ..RpcSettings::default()
    }
}
