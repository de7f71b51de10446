//! Spillover (docs/regions.md): a request this region cannot serve goes to the nearest healthy peer region's
//! frontend that will take it, and the peer's answer streams through unchanged (status, headers with its
//! `x-zl-region`, body). The hop is signed ([`super::hop`]) and carries the request id and the key id this frontend
//! authenticated, never the client's API key; the peer serves it itself or fails: a request crosses at most one
//! region boundary. Which peers, in which order, and their health are [`crate::regions::Regions`]'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Response};
use http_body_util::Full;

use super::peer_pool::{PeerPool, Returning};
use crate::regions::{Peer, Regions};

use super::hop::{FORWARDED_ID_HEADER, HOP_HEADER, Hop, HopKey};

/// Where the request was served (responses), or where the client would like it served (requests).
pub const REGION_HEADER: &str = "x-zl-region";

/// How long connecting to a peer may take before it counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a peer may take to answer with its headers (a streamed answer's come at admission; a complete one's
/// after the whole generation).
const HEAD_TIMEOUT: Duration = Duration::from_secs(600);

/// The client headers a hop carries; everything else (the client's API key, hop-by-hop headers, internal headers)
/// is dropped.
const FORWARDED: &[&str] = &[
    "anthropic-version",
    "anthropic-beta",
    "content-type",
    "accept",
    "user-agent",
    "x-zl-cache",
    "x-zl-route-hint",
    "x-zl-streaming-predicted",
    "openai-organization",
    "openai-project",
    "traceparent",
];

/// Response headers that belong to one connection and are not passed on.
const HOP_BY_HOP: &[&str] = &["connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"];

/// The peers of this frontend and how to reach them.
pub struct Spill {
    /// This region and the peers.
    pub regions: Regions,
    /// TLS for https peers (the CA of `--peer-ca-file`).
    pub tls: Option<tokio_rustls::TlsConnector>,
    /// Idle connections to the peers.
    pub pool: Arc<PeerPool>,
    /// The key that signs and verifies hops (`--hop-key-file`); without it this frontend neither forwards nor
    /// takes hops.
    pub hop_key: Option<HopKey>,
}

impl std::fmt::Debug for Spill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spill")
            .field("regions", &self.regions)
            .field("tls", &self.tls.is_some())
            .field("hop_key", &self.hop_key.is_some())
            .finish()
    }
}

impl Default for Spill {
    fn default() -> Self {
        let regions = Regions::new(zl_common::region::DEFAULT_REGION.into(), vec![]).unwrap_or_else(|_| unreachable!());
        Spill { regions, tls: None, pool: Arc::default(), hop_key: None }
    }
}

/// How often the peer regions are read again from Consul.
pub const CONSUL_PEERS_EVERY: Duration = Duration::from_secs(10);

/// Which peers found in Consul are taken.
#[derive(Clone, Debug, Default)]
pub struct PeerTrust {
    /// The regions (datacenters) that may be peers.
    pub allow: Vec<String>,
    /// Take peers that register plain http too.
    pub insecure_http: bool,
}

impl PeerTrust {
    /// Whether `peer` may be one (a refusal is logged once per region and reason by the caller).
    pub fn admits(&self, peer: &Peer) -> Result<(), &'static str> {
        if !self.allow.contains(&peer.region) {
            return Err("its region is not in --peer-region-allow");
        }
        if !peer.tls && !self.insecure_http {
            return Err("it registers plain http (https peers only, unless --peer-insecure-http)");
        }
        Ok(())
    }
}

/// Follow the peer regions in Consul: every [`CONSUL_PEERS_EVERY`], the agent's other datacenters nearest first,
/// each with a passing frontend, become the peers, those that `trust` admits. When Consul cannot be read, the last
/// list stays.
pub async fn follow_consul_peers(client: zl_node::consul::ConsulClient, spill: Arc<Spill>, trust: PeerTrust) {
    let mut failing = false;
    // Each refused region is logged once per reason, not every 10 s.
    let mut refused: std::collections::BTreeSet<(String, &'static str)> = std::collections::BTreeSet::new();
    loop {
        match consul_peers(&client).await {
            Ok(found) => {
                let mut peers = Vec::with_capacity(found.len());
                for peer in found {
                    match trust.admits(&peer) {
                        Ok(()) => peers.push(peer),
                        Err(why) => {
                            if refused.insert((peer.region.clone(), why)) {
                                tracing::warn!(region = %peer.region, url = %peer.url, "peer region refused: {why}");
                                metrics::counter!("zl_frontend_peers_refused_total").increment(1);
                            }
                        }
                    }
                }
                if failing || peers != *spill.regions.peers() {
                    let names: Vec<&str> = peers.iter().map(|p| p.region.as_str()).collect();
                    tracing::info!(peers = ?names, "peer regions from consul");
                }
                spill.regions.set_peers(peers);
                failing = false;
            }
            Err(e) if !failing => {
                tracing::warn!(error = %format!("{e:#}"), "cannot read the peer regions from consul; keeping the last");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(CONSUL_PEERS_EVERY).await;
    }
}

async fn consul_peers(client: &zl_node::consul::ConsulClient) -> anyhow::Result<Vec<Peer>> {
    let mut peers = Vec::new();
    for dc in client.datacenters().await? {
        let mut frontends = client.passing_in(zl_node::consul::catalog::FRONTEND_SERVICE, &dc).await?;
        frontends.sort_by(|a, b| a.id.cmp(&b.id));
        if let Some(peer) = frontends.iter().find_map(|i| crate::regions::peer_from_instance(&dc, i)) {
            peers.push(peer);
        }
    }
    Ok(peers)
}

impl Spill {
    /// The hop `headers` carry for `path`, when a peer region's frontend signed it with our hop key (a client's
    /// `x-zl-hop` or `x-zl-request-id` is ignored: the request is an ordinary one).
    pub fn hop(&self, headers: &HeaderMap, path: &str) -> Option<Hop> {
        let hop = self.hop_key.as_ref()?.verify(headers, path, crate::ids::unix_ms());
        if hop.is_none() && headers.contains_key(HOP_HEADER) {
            metrics::counter!("zl_frontend_hops_refused_total").increment(1);
        }
        hop
    }
}

enum Outcome {
    Served(Response<Body>),
    /// Alive but would not serve it (4xx, 529): the next peer may.
    Declined(u16),
    /// Down: back off.
    Failed(String),
}

/// Forward `body` (a request to `path` with the client's `headers`) to the peers in `order`, until one serves it.
pub async fn forward(
    spill: &Arc<Spill>,
    order: &[Peer],
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
    rid: &str,
    key_id: &str,
) -> Option<Response<Body>> {
    for peer in order {
        let started = Instant::now();
        let outcome = attempt(spill, peer, path, headers, body.clone(), rid, key_id).await;
        let result = match &outcome {
            Outcome::Served(_) => "served",
            Outcome::Declined(_) => "declined",
            Outcome::Failed(_) => "failed",
        };
        metrics::counter!("zl_frontend_spills_total", "region" => peer.region.clone(), "result" => result).increment(1);
        metrics::histogram!("zl_frontend_spill_head_seconds", "region" => peer.region.clone())
            .record(started.elapsed().as_secs_f64());
        match outcome {
            Outcome::Served(resp) => {
                spill.regions.answered(&peer.region);
                tracing::info!(request_id = rid, region = %peer.region, "served by a peer region");
                return Some(resp);
            }
            Outcome::Declined(status) => {
                spill.regions.answered(&peer.region);
                tracing::info!(request_id = rid, region = %peer.region, status, "the peer region declined");
            }
            Outcome::Failed(why) => {
                spill.regions.failed(&peer.region, Instant::now());
                tracing::warn!(request_id = rid, region = %peer.region, error = %why, "the peer region failed; backing off");
            }
        }
    }
    None
}

async fn attempt(
    spill: &Spill,
    peer: &Peer,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
    rid: &str,
    key_id: &str,
) -> Outcome {
    let Some(hop_key) = &spill.hop_key else { return Outcome::Failed("hops need --hop-key-file".into()) };
    let tls = match (peer.tls, &spill.tls) {
        (false, _) => None,
        (true, Some(tls)) => Some(tls),
        (true, None) => return Outcome::Failed("an https peer needs --peer-ca-file".into()),
    };
    let request = || {
        let mut req = hyper::Request::post(path).header("host", &peer.authority);
        for name in FORWARDED {
            if let Some(v) = headers.get(*name) {
                req = req.header(*name, v);
            }
        }
        req.header(HOP_HEADER, hop_key.sign(spill.regions.local(), crate::ids::unix_ms(), rid, key_id, path))
            .header(FORWARDED_ID_HEADER, rid)
            .body(Full::new(body.clone()))
            .map_err(|e| format!("building the request: {e}"))
    };
    // A pooled connection first; if the peer closed it meanwhile, a fresh one (a stale connection is not the
    // peer's failure).
    let mut answered = None;
    if let Some(mut sender) = spill.pool.take(&peer.authority)
        && sender.ready().await.is_ok()
    {
        let req = match request() {
            Ok(r) => r,
            Err(e) => return Outcome::Failed(e),
        };
        if let Ok(Ok(resp)) = tokio::time::timeout(HEAD_TIMEOUT, sender.send_request(req)).await {
            metrics::counter!("zl_frontend_spill_connections_total", "region" => peer.region.clone(), "reused" => "true")
                .increment(1);
            answered = Some((resp, sender));
        }
    }
    let (resp, sender) =
        match answered {
            Some(a) => a,
            None => {
                let mut sender =
                    match tokio::time::timeout(CONNECT_TIMEOUT, zl_node::http_client::connect(&peer.authority, tls))
                        .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => return Outcome::Failed(format!("{e:#}")),
                        Err(_) => return Outcome::Failed(format!("no connection within {CONNECT_TIMEOUT:?}")),
                    };
                let req = match request() {
                    Ok(r) => r,
                    Err(e) => return Outcome::Failed(e),
                };
                match tokio::time::timeout(HEAD_TIMEOUT, sender.send_request(req)).await {
                    Ok(Ok(r)) => (r, sender),
                    Ok(Err(e)) => return Outcome::Failed(e.to_string()),
                    Err(_) => return Outcome::Failed(format!("no answer within {HEAD_TIMEOUT:?}")),
                }
            }
        };
    let status = resp.status();
    if status.is_server_error() && status.as_u16() != 529 {
        return Outcome::Failed(format!("it answered {status}"));
    }
    if !status.is_success() {
        return Outcome::Declined(status.as_u16());
    }
    let (parts, incoming) = resp.into_parts();
    let body = Returning::new(incoming, spill.pool.clone(), peer.authority.clone(), sender);
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            out.headers_mut().append(name, value.clone());
        }
    }
    if !out.headers().contains_key(REGION_HEADER)
        && let Ok(v) = HeaderValue::from_str(&peer.region)
    {
        out.headers_mut().insert(REGION_HEADER, v);
    }
    Outcome::Served(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(region: &str, tls: bool) -> Peer {
        let authority = format!("{region}.example:443");
        let url = format!("{}://{authority}", if tls { "https" } else { "http" });
        Peer { region: region.into(), authority, tls, url }
    }

    #[test]
    fn consul_peers_must_be_allowed_and_https() {
        let trust = PeerTrust { allow: vec!["eu".into()], insecure_http: false };
        assert!(trust.admits(&peer("eu", true)).is_ok());
        assert!(trust.admits(&peer("us", true)).unwrap_err().contains("--peer-region-allow"));
        assert!(trust.admits(&peer("eu", false)).unwrap_err().contains("https"));
        let lax = PeerTrust { insecure_http: true, ..trust };
        assert!(lax.admits(&peer("eu", false)).is_ok());
        assert!(lax.admits(&peer("us", false)).is_err(), "the allowlist holds even then");
    }

    #[test]
    fn only_signed_hops_count() {
        let mut spill = Spill::default();
        let signed = HopKey::new(&[1; 32]).unwrap().sign("eu", crate::ids::unix_ms(), "req_abc123", "", "/p");
        let mut h = HeaderMap::new();
        h.insert(FORWARDED_ID_HEADER, HeaderValue::from_static("req_abc123"));
        h.insert(HOP_HEADER, HeaderValue::from_str(&signed).unwrap());
        assert_eq!(spill.hop(&h, "/p"), None, "no hop key: no hops");
        spill.hop_key = Some(HopKey::new(&[1; 32]).unwrap());
        assert_eq!(spill.hop(&h, "/p").map(|h| h.request_id).as_deref(), Some("req_abc123"));
        h.insert(HOP_HEADER, HeaderValue::from_static("1"));
        assert_eq!(spill.hop(&h, "/p"), None, "a client's unsigned mark");
    }
}
