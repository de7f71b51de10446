//! Regions, as a frontend sees them: its own, its peers' frontends (nearest first) with a health view each, and the
//! rules of spillover and data residency (docs/regions.md). Pure: instants are passed in; the forwarding itself is
//! `http/spill.rs`.
//!
//! - A key bound to regions is served only by frontends of those regions ([`Regions::admit`]) and never spills
//!   outside them ([`Regions::spill_order`]).
//! - A peer that failed (no connection, a 5xx) is skipped for a backoff that doubles from 1 s to 30 s with each
//!   failure in a row; after it, one request tries it again. A dead region thus costs one failed attempt per
//!   backoff, not one per request.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use zl_common::region::region_problem;
use zl_common::sync::lock;

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

#[derive(Clone, Copy, Debug, Default)]
struct Health {
    failures: u32,
    down_until: Option<Instant>,
}

/// This frontend's region and its peers.
#[derive(Debug)]
pub struct Regions {
    local: String,
    peers: Vec<Peer>,
    health: Mutex<Vec<Health>>,
}

impl Regions {
    /// `local` with `peers`, nearest first. Errors name a peer that is this region or listed twice.
    pub fn new(local: String, peers: Vec<Peer>) -> Result<Regions, String> {
        if let Some(p) = region_problem(&local) {
            return Err(format!("--region: {p}"));
        }
        for (i, p) in peers.iter().enumerate() {
            if p.region == local {
                return Err(format!("--peer-region {}: that is this frontend's own region", p.region));
            }
            if peers[..i].iter().any(|q| q.region == p.region) {
                return Err(format!("--peer-region {}: listed twice", p.region));
            }
        }
        let health = Mutex::new(vec![Health::default(); peers.len()]);
        Ok(Regions { local, peers, health })
    }

    /// This frontend's region.
    pub fn local(&self) -> &str {
        &self.local
    }

    /// The peers, nearest first.
    pub fn peers(&self) -> &[Peer] {
        &self.peers
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
    pub fn spill_order(&self, bound: &[String], preferred: Option<&str>, now: Instant) -> Vec<usize> {
        let health = lock(&self.health);
        let allowed = |i: &usize| {
            let p = &self.peers[*i];
            (bound.is_empty() || bound.contains(&p.region)) && health[*i].down_until.is_none_or(|t| now >= t)
        };
        let mut order: Vec<usize> = (0..self.peers.len()).filter(allowed).collect();
        if let Some(pos) = preferred.and_then(|r| order.iter().position(|&i| self.peers[i].region == r)) {
            let first = order.remove(pos);
            order.insert(0, first);
        }
        order
    }

    /// Whether `bound` shuts every peer out (a bound key that cannot spill gets the local answer).
    pub fn confined(&self, bound: &[String]) -> bool {
        !bound.is_empty() && !self.peers.iter().any(|p| bound.contains(&p.region))
    }

    /// Peer `i` failed at `now`: back off.
    pub fn failed(&self, i: usize, now: Instant) {
        let mut health = lock(&self.health);
        let h = &mut health[i];
        h.failures = h.failures.saturating_add(1);
        let backoff = FIRST_BACKOFF.saturating_mul(1 << (h.failures - 1).min(5)).min(MAX_BACKOFF);
        h.down_until = Some(now + backoff);
    }

    /// Peer `i` answered: healthy again.
    pub fn answered(&self, i: usize) {
        lock(&self.health)[i] = Health::default();
    }

    /// Peers backing off at `now`, for metrics and readiness.
    pub fn down(&self, now: Instant) -> Vec<&str> {
        let health = lock(&self.health);
        (0..self.peers.len())
            .filter(|&i| health[i].down_until.is_some_and(|t| now < t))
            .map(|i| self.peers[i].region.as_str())
            .collect()
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
    fn residency() {
        let r = regions();
        assert!(r.admit("k", &[]).is_ok());
        assert!(r.admit("k", &["a".into(), "b".into()]).is_ok());
        let e = r.admit("k", &["b".into()]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Permission);
        assert!(e.message.contains("region b") && e.message.contains("this is region a"), "{}", e.message);
        let now = Instant::now();
        assert_eq!(r.spill_order(&["a".into(), "c".into()], None, now), vec![1]);
        assert!(r.spill_order(&["a".into()], None, now).is_empty());
        assert!(r.confined(&["a".into()]) && !r.confined(&[]) && !r.confined(&["c".into()]));
    }

    #[test]
    fn order_preference_and_backoff() {
        let r = regions();
        let t0 = Instant::now();
        assert_eq!(r.spill_order(&[], None, t0), vec![0, 1]);
        assert_eq!(r.spill_order(&[], Some("c"), t0), vec![1, 0]);
        assert_eq!(r.spill_order(&[], Some("zz"), t0), vec![0, 1]);
        // b fails: skipped for 1 s, then tried again; failing again doubles the wait.
        r.failed(0, t0);
        assert_eq!(r.spill_order(&[], None, t0), vec![1]);
        assert_eq!(r.down(t0), vec!["b"]);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(r.spill_order(&[], None, t1), vec![0, 1]);
        r.failed(0, t1);
        assert_eq!(r.spill_order(&[], None, t1 + Duration::from_millis(1999)), vec![1]);
        assert_eq!(r.spill_order(&[], None, t1 + Duration::from_secs(2)), vec![0, 1]);
        for _ in 0..10 {
            r.failed(0, t1);
        }
        assert_eq!(r.spill_order(&[], None, t1 + MAX_BACKOFF - Duration::from_millis(1)), vec![1]);
        assert_eq!(r.spill_order(&[], None, t1 + MAX_BACKOFF), vec![0, 1]);
        r.answered(0);
        assert!(r.down(t1).is_empty());
    }
}
