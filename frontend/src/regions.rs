//! Regions, as a frontend sees them: its own, its peers' frontends (nearest first) with a health view each, and the
//! rules of spillover and data residency (docs/regions.md). Pure: instants are passed in; the forwarding itself is
//! `http/spill.rs`.
//!
//! - A key bound to regions is served only by frontends of those regions ([`Regions::admit`]) and never spills
//!   outside them ([`Regions::spill_order`]); with no peer inside them, it gets this region's own answer.
//! - A peer that failed (no connection, a 5xx) is skipped for a backoff that doubles from 1 s to 30 s with each
//!   failure in a row; after it, one request tries it again. A dead region thus costs one failed attempt per
//!   backoff, not one per request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use zl_common::region::region_problem;
use zl_common::sync::{lock, read, write};

use crate::error::{ApiError, ErrorKind};

/// The first backoff after a peer fails.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest backoff.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A peer region's frontend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its region.
    pub region: String,
    /// `host:port`.
    pub authority: String,
    /// Whether it speaks HTTPS.
    pub tls: bool,
    /// The URL as given.
    pub url: String,
}

/// Parse `REGION=URL` (http:// or https://, no path).
pub fn parse_peer(spec: &str) -> Result<Peer, String> {
    let (region, url) = spec.split_once('=').ok_or_else(|| format!("--peer-region {spec:?}: expected REGION=URL"))?;
    if let Some(p) = region_problem(region) {
        return Err(format!("--peer-region {spec:?}: {p}"));
    }
    let (tls, rest) = match url.split_once("://") {
        Some(("http", r)) => (false, r),
        Some(("https", r)) => (true, r),
        _ => return Err(format!("--peer-region {spec:?}: the URL must start with http:// or https://")),
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        return Err(format!("--peer-region {spec:?}: give the frontend's base URL (scheme, host, port), no path"));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && !p.contains(']') && p.parse::<u16>().is_ok())
    {
        authority.to_owned()
    } else {
        format!("{authority}:{}", if tls { 443 } else { 80 })
    };
    Ok(Peer { region: region.to_owned(), authority, tls, url: url.to_owned() })
}

/// A peer region's frontend as Consul lists it in another datacenter: the datacenter names the region, the
/// instance's address and port are its API, and its `scheme` Meta (which frontends register) says http or https.
pub fn peer_from_instance(dc: &str, instance: &zl_node::consul::catalog::Instance) -> Option<Peer> {
    if region_problem(dc).is_some() || instance.address.is_empty() || instance.port == 0 {
        return None;
    }
    let tls = instance.meta.get("scheme").is_some_and(|s| s == "https");
    let host =
        if instance.address.contains(':') { format!("[{}]", instance.address) } else { instance.address.clone() };
    let authority = format!("{host}:{}", instance.port);
    let url = format!("{}://{authority}", if tls { "https" } else { "http" });
    Some(Peer { region: dc.to_owned(), authority, tls, url })
}

#[derive(Clone, Copy, Debug, Default)]
struct Health {
    failures: u32,
    down_until: Option<Instant>,
}

/// This frontend's region and its peers (from settings, or followed in Consul: [`Regions::set_peers`]).
#[derive(Debug)]
pub struct Regions {
    local: String,
    peers: RwLock<Arc<Vec<Peer>>>,
    /// By region name, so a peer list that changes keeps what is known of each region.
    health: Mutex<HashMap<String, Health>>,
}

/// Why `peers` cannot be `local`'s peer list: a peer that is this region, or one listed twice.
fn peers_problem(local: &str, peers: &[Peer]) -> Option<String> {
    for (i, p) in peers.iter().enumerate() {
        if p.region == local {
            return Some(format!("--peer-region {}: that is this frontend's own region", p.region));
        }
        if peers[..i].iter().any(|q| q.region == p.region) {
            return Some(format!("--peer-region {}: listed twice", p.region));
        }
    }
    None
}

impl Regions {
    /// `local` with `peers`, nearest first. Errors name a peer that is this region or listed twice.
    pub fn new(local: String, peers: Vec<Peer>) -> Result<Regions, String> {
        if let Some(p) = region_problem(&local) {
            return Err(format!("--region: {p}"));
        }
        if let Some(p) = peers_problem(&local, &peers) {
            return Err(p);
        }
        Ok(Regions { local, peers: RwLock::new(Arc::new(peers)), health: Mutex::default() })
    }

    /// Replace the peers (nearest first), as discovery found them: this region and repeats are left out; what is
    /// known of a region's health stays.
    pub fn set_peers(&self, found: Vec<Peer>) {
        let mut peers: Vec<Peer> = Vec::with_capacity(found.len());
        for p in found {
            if p.region != self.local && !peers.iter().any(|q| q.region == p.region) {
                peers.push(p);
            }
        }
        *write(&self.peers) = Arc::new(peers);
    }

    /// This frontend's region.
    pub fn local(&self) -> &str {
        &self.local
    }

    /// The peers, nearest first.
    pub fn peers(&self) -> Arc<Vec<Peer>> {
        read(&self.peers).clone()
    }

    /// May a key bound to `bound` (empty: any region) be served here? The 403 names both sides.
    pub fn admit(&self, key_id: &str, bound: &[String]) -> Result<(), ApiError> {
        if bound.is_empty() || bound.iter().any(|r| r == &self.local) {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorKind::Permission,
            format!(
                "key {key_id} may only be served in region {} (data residency); this is region {}",
                bound.join(", "),
                self.local
            ),
        ))
    }

    /// Peers to try for a request, in order: the preferred region first when it is a peer, then the others by
    /// nearness; only those `bound` allows, and none that is backing off at `now`.
    pub fn spill_order(&self, bound: &[String], preferred: Option<&str>, now: Instant) -> Vec<Peer> {
        let peers = self.peers();
        let health = lock(&self.health);
        let allowed = |p: &&Peer| {
            (bound.is_empty() || bound.contains(&p.region))
                && health.get(&p.region).and_then(|h| h.down_until).is_none_or(|t| now >= t)
        };
        let mut order: Vec<Peer> = peers.iter().filter(allowed).cloned().collect();
        if let Some(pos) = preferred.and_then(|r| order.iter().position(|p| p.region == r)) {
            let first = order.remove(pos);
            order.insert(0, first);
        }
        order
    }

    /// `region` failed at `now`: back off.
    pub fn failed(&self, region: &str, now: Instant) {
        let mut health = lock(&self.health);
        let h = health.entry(region.to_owned()).or_default();
        h.failures = h.failures.saturating_add(1);
        let backoff = FIRST_BACKOFF.saturating_mul(1 << (h.failures - 1).min(5)).min(MAX_BACKOFF);
        h.down_until = Some(now + backoff);
    }

    /// `region` answered: healthy again.
    pub fn answered(&self, region: &str) {
        lock(&self.health).remove(region);
    }

    /// Peer regions backing off at `now` (`/readyz` shows them).
    pub fn down(&self, now: Instant) -> Vec<String> {
        let health = lock(&self.health);
        let mut down: Vec<String> =
            health.iter().filter(|(_, h)| h.down_until.is_some_and(|t| now < t)).map(|(r, _)| r.clone()).collect();
        down.sort();
        down
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regions() -> Regions {
        let peers = ["b=http://127.0.0.2:8080", "c=https://c.example.com"].map(|s| parse_peer(s).unwrap()).to_vec();
        Regions::new("a".into(), peers).unwrap()
    }

    #[test]
    fn peers_parse() {
        let p = parse_peer("eu-west=https://eu.example.com/").unwrap();
        assert_eq!((p.region.as_str(), p.authority.as_str(), p.tls), ("eu-west", "eu.example.com:443", true));
        assert_eq!(parse_peer("b=http://[::1]:9000").unwrap().authority, "[::1]:9000");
        for bad in ["b", "B=http://x", "b=ftp://x", "b=http://", "b=http://x/v1"] {
            assert!(parse_peer(bad).is_err(), "{bad}");
        }
        let b = parse_peer("b=http://x").unwrap();
        assert!(Regions::new("b".into(), vec![b.clone()]).is_err());
        assert!(Regions::new("a".into(), vec![b.clone(), b]).is_err());
        assert!(Regions::new("A".into(), vec![]).is_err());
    }

    #[test]
    fn peers_from_consul_instances() {
        let mut instance = zl_node::consul::catalog::Instance {
            id: "fe-0".into(),
            address: "10.1.2.3".into(),
            port: 8443,
            tags: vec![],
            meta: [("scheme".to_owned(), "https".to_owned())].into(),
            node: "n".into(),
            passing: true,
        };
        let p = peer_from_instance("eu-central", &instance).unwrap();
        assert_eq!((p.authority.as_str(), p.tls, p.url.as_str()), ("10.1.2.3:8443", true, "https://10.1.2.3:8443"));
        instance.meta.clear();
        instance.address = "::1".into();
        assert_eq!(peer_from_instance("dc2", &instance).unwrap().url, "http://[::1]:8443");
        assert!(peer_from_instance("DC2", &instance).is_none(), "not a region name");
        instance.port = 0;
        assert!(peer_from_instance("dc2", &instance).is_none());
    }

    #[test]
    fn residency() {
        let r = regions();
        assert!(r.admit("k", &[]).is_ok());
        assert!(r.admit("k", &["a".into(), "b".into()]).is_ok());
        let e = r.admit("k", &["b".into()]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Permission);
        assert!(e.message.contains("region b") && e.message.contains("this is region a"), "{}", e.message);
        let now = Instant::now();
        let names = |v: Vec<Peer>| v.into_iter().map(|p| p.region).collect::<Vec<_>>();
        assert_eq!(names(r.spill_order(&["a".into(), "c".into()], None, now)), ["c"]);
        assert!(r.spill_order(&["a".into()], None, now).is_empty());
    }

    #[test]
    fn order_preference_and_backoff() {
        let r = regions();
        let order = |bound: &[String], preferred: Option<&str>, now: Instant| {
            r.spill_order(bound, preferred, now).into_iter().map(|p| p.region).collect::<Vec<_>>()
        };
        let t0 = Instant::now();
        assert_eq!(order(&[], None, t0), ["b", "c"]);
        assert_eq!(order(&[], Some("c"), t0), ["c", "b"]);
        assert_eq!(order(&[], Some("zz"), t0), ["b", "c"]);
        // b fails: skipped for 1 s, then tried again; failing again doubles the wait.
        r.failed("b", t0);
        assert_eq!(order(&[], None, t0), ["c"]);
        assert_eq!(r.down(t0), ["b"]);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(order(&[], None, t1), ["b", "c"]);
        r.failed("b", t1);
        assert_eq!(order(&[], None, t1 + Duration::from_millis(1999)), ["c"]);
        assert_eq!(order(&[], None, t1 + Duration::from_secs(2)), ["b", "c"]);
        for _ in 0..10 {
            r.failed("b", t1);
        }
        assert_eq!(order(&[], None, t1 + MAX_BACKOFF - Duration::from_millis(1)), ["c"]);
        assert_eq!(order(&[], None, t1 + MAX_BACKOFF), ["b", "c"]);
        // A new peer list (from discovery) keeps b's backoff, drops this region and repeats.
        let d = parse_peer("d=http://d:80").unwrap();
        let a = parse_peer("a=http://self:80").unwrap();
        let b = parse_peer("b=http://b2:80").unwrap();
        r.set_peers(vec![d.clone(), a, b.clone(), d]);
        assert_eq!(order(&[], None, t1), ["d"]);
        assert_eq!(r.peers().iter().map(|p| p.authority.as_str()).collect::<Vec<_>>(), ["d:80", "b2:80"]);
        r.answered("b");
        assert!(r.down(t1).is_empty());
        assert_eq!(order(&[], None, t1), ["d", "b"]);
    }
}
