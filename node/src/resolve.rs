//! Peer addresses given as `host:port`, where the host may be a DNS name (a Kubernetes Service, a StatefulSet
//! pod's stable name): checked when given, resolved when used, and for a static list re-resolved every few
//! seconds so a peer that comes back on a new IP address is found again without restarting anything.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// How often a static list with DNS names is resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// `host:port` or `[v6]:port` into the host (brackets removed) and the port.
pub fn split_host_port(s: &str) -> Result<(String, u16)> {
    let (host, port) = s.rsplit_once(':').with_context(|| format!("{s:?} is not host:port"))?;
    let port: u16 = port.parse().with_context(|| format!("{s:?}: bad port"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() {
        bail!("{s:?} has no host");
    }
    Ok((host.to_owned(), port))
}

/// A `host:port` peer address as given on a command line (clap's value parser): an IP address, a bracketed IPv6
/// address or a DNS name, with a port.
pub fn parse_address(s: &str) -> std::result::Result<String, String> {
    split_host_port(s).map_err(|e| format!("{e:#}"))?;
    if s.chars().any(|c| c.is_whitespace() || c == '/' || c == '@') {
        return Err(format!("{s:?} is not host:port"));
    }
    Ok(s.to_owned())
}

/// The socket addresses of `target` (`host:port`): itself when it is one, else what DNS answers, IPv4 only when
/// there is any (a dual-stack name lists one server under both families; a headless Service lists each pod).
pub async fn resolve(target: &str) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(addr) = target.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let all: Vec<SocketAddr> = tokio::net::lookup_host(target).await?.collect();
    let v4: Vec<SocketAddr> = all.iter().copied().filter(SocketAddr::is_ipv4).collect();
    Ok(if v4.is_empty() { all } else { v4 })
}

/// Resolve every target (one that does not resolve keeps what it resolved to before, in `previous`), sorted and
/// without duplicates.
async fn resolve_all(targets: &[String], previous: &mut [Vec<SocketAddr>]) -> Vec<SocketAddr> {
    for (target, known) in targets.iter().zip(previous.iter_mut()) {
        match resolve(target).await {
            Ok(found) if !found.is_empty() => *known = found,
            Ok(_) => tracing::warn!(target, "a peer's name resolves to no address; keeping what it had"),
            Err(e) => tracing::warn!(target, error = %e, "a peer's name does not resolve; keeping what it had"),
        }
    }
    let mut all: Vec<SocketAddr> = previous.iter().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// Resolve a static list of peers now and hand the addresses to `apply`; when some are DNS names, keep resolving
/// them every `every` in a task, handing each changed set to `apply`.
pub async fn follow_static<F>(targets: Vec<String>, every: Duration, apply: F) -> Option<tokio::task::JoinHandle<()>>
where
    F: Fn(Vec<SocketAddr>) + Send + 'static,
{
    let mut known = vec![Vec::new(); targets.len()];
    let mut current = resolve_all(&targets, &mut known).await;
    apply(current.clone());
    if targets.iter().all(|t| t.parse::<SocketAddr>().is_ok()) {
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let next = resolve_all(&targets, &mut known).await;
            if next != current {
                tracing::info!(addresses = ?next, "peers resolve to new addresses");
                apply(next.clone());
                current = next;
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn addresses_are_host_and_port() {
        for good in ["127.0.0.1:7000", "[::1]:7000", "orch-0.orch.zl.svc.cluster.local:7000", "localhost:1"] {
            assert_eq!(parse_address(good).as_deref(), Ok(good));
        }
        for bad in ["127.0.0.1", ":7000", "host:port", "https://host:7000", "a b:1", "1@host:7000"] {
            assert!(parse_address(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn static_lists_resolve_names_and_follow_only_when_there_are_names() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = |seen: &Arc<Mutex<Vec<Vec<SocketAddr>>>>| {
            let seen = seen.clone();
            move |addrs| seen.lock().unwrap().push(addrs)
        };
        let literal = vec!["127.0.0.1:7001".to_owned(), "127.0.0.1:7000".to_owned()];
        assert!(follow_static(literal, RESOLVE_EVERY, record(&seen)).await.is_none(), "nothing to re-resolve");
        let named = vec!["localhost:7002".to_owned()];
        let task = follow_static(named, Duration::from_millis(10), record(&seen)).await;
        assert!(task.is_some());
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen[0], vec!["127.0.0.1:7000".parse().unwrap(), "127.0.0.1:7001".parse().unwrap()]);
        assert_eq!(seen[1], vec!["127.0.0.1:7002".parse().unwrap()], "one address for localhost's two families");
    }
}
