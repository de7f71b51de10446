//! `--raft-peers` and members' addresses: `id@host:port`, checked when given (DNS names are resolved on each
//! connection).

use std::collections::BTreeMap;

/// Parse `--raft-peers`: `id@host:port` (the peer's admin address: an IP address, or a DNS name resolved on each
/// connection, such as a StatefulSet pod's stable name), comma-separated.
pub fn parse_peers(spec: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut peers = BTreeMap::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('@').ok_or_else(|| format!("{part}: expected id@host:port"))?;
        let id: u64 = id.parse().map_err(|_| format!("{part}: the id must be a positive integer"))?;
        if id == 0 {
            return Err(format!("{part}: the id must be a positive integer"));
        }
        let addr = peer_address(addr).map_err(|e| format!("{part}: {e}"))?;
        if peers.insert(id, addr).is_some() {
            return Err(format!("id {id} is listed twice"));
        }
    }
    Ok(peers)
}

/// A peer's admin address as given: `host:port` with a valid port and a non-empty host (an IP address, a
/// bracketed IPv6 address, or a DNS name).
pub fn peer_address(addr: &str) -> Result<String, String> {
    zl_node::resolve::parse_address(addr)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn peer_lists_parse_and_bad_ones_are_refused() {
        let p = parse_peers("1@127.0.0.1:7001, 2@127.0.0.1:7011,3@[::1]:7021").unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[&3], "[::1]:7021");
        assert!(parse_peers("127.0.0.1:7001").is_err());
        assert!(parse_peers("0@127.0.0.1:7001").is_err());
        assert!(parse_peers("1@127.0.0.1:7001,1@127.0.0.1:7002").is_err());
        assert!(parse_peers("x@127.0.0.1:7001").is_err());
        assert!(parse_peers("").unwrap().is_empty());
        // DNS names (a StatefulSet's pods behind a headless Service) are kept as given, resolved on connection.
        let p = parse_peers("1@orch-0.orch.zl.svc:7001,2@orch-1.orch.zl.svc:7001").unwrap();
        assert_eq!(p[&2], "orch-1.orch.zl.svc:7001");
        assert!(parse_peers("1@orch-0:port").is_err());
        assert!(parse_peers("1@:7001").is_err());
        assert!(parse_peers("1@http://x:7001").is_err());
    }
}
