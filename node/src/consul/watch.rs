//! Watches one service through the local Consul agent with blocking queries and publishes each changed list of
//! instances. The index is carried from answer to answer and reset when it goes backwards; any failure forgets
//! it, so the first answer after a reconnect is a full list and no removal is missed. Queries start at most once
//! per [`MIN_QUERY_INTERVAL`]; failures back off to [`MAX_BACKOFF`]. While the agent is unreachable the last
//! published list stands: every tier keeps serving with the view it had.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::BlockingIndex;
use super::catalog::{IndexChange, Instance};
use super::client::ConsulClient;
use super::status::{Backoff, DiscoveryStatus};

/// How long one blocking query waits for a change.
pub const WAIT: Duration = Duration::from_secs(30);
/// The fewest milliseconds between the starts of two queries.
pub const MIN_QUERY_INTERVAL: Duration = Duration::from_millis(250);
/// The longest wait between retries while the agent is unreachable.
pub const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// Watch `service` (only its passing instances when `passing_only`). The receiver holds `None` until the first
/// answer, then the newest list, in id order; it changes only when the list does.
pub fn spawn(
    client: ConsulClient,
    service: &'static str,
    passing_only: bool,
    status: Arc<DiscoveryStatus>,
) -> (watch::Receiver<Option<Vec<Instance>>>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        let mut index = BlockingIndex::default();
        let mut backoff = Backoff::new(MIN_QUERY_INTERVAL, MAX_BACKOFF);
        loop {
            let started = Instant::now();
            match client.instances(service, passing_only, &mut index, WAIT).await {
                Ok((change, instances)) => {
                    status.ok(Instant::now());
                    backoff.reset();
                    metrics::counter!("zl_discovery_watch_answers_total", "service" => service).increment(1);
                    if change == IndexChange::Reset {
                        tracing::info!(service, "consul's index went backwards; listing again");
                    }
                    metrics::gauge!("zl_discovery_instances", "service" => service).set(instances.len() as f64);
                    tx.send_if_modified(|current| {
                        if current.as_ref() == Some(&instances) {
                            return false;
                        }
                        tracing::info!(
                            service,
                            instances = %instances.iter().map(|i| i.id.as_str()).collect::<Vec<_>>().join(","),
                            "discovered"
                        );
                        *current = Some(instances);
                        true
                    });
                    tokio::time::sleep(MIN_QUERY_INTERVAL.saturating_sub(started.elapsed())).await;
                }
                Err(e) => {
                    status.failed("watch", &e, Instant::now());
                    tokio::time::sleep(backoff.fail()).await;
                }
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    (rx, task)
}

/// Watch the passing instances of `service` and hand the addresses of every new list to `apply` (the orchestrators a
/// worker reports to, or a frontend calls). Aborting the returned task stops the watch too.
pub fn follow_addresses<F>(
    client: ConsulClient,
    service: &'static str,
    status: Arc<DiscoveryStatus>,
    apply: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(Vec<SocketAddr>) + Send + Sync + 'static,
{
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let (mut found, task) = spawn(client, service, true, status);
    tokio::spawn(async move {
        let _watch = AbortOnDrop(task);
        while found.changed().await.is_ok() {
            let instances = found.borrow_and_update().clone().unwrap_or_default();
            apply(addresses(&instances).await);
        }
    })
}

/// The addresses to dial of these instances (`address:port`; host names resolved, those that do not resolve
/// left out with a warning).
pub async fn addresses(instances: &[Instance]) -> Vec<SocketAddr> {
    let mut out = Vec::with_capacity(instances.len());
    for i in instances {
        let host = if i.address.contains(':') && !i.address.starts_with('[') {
            format!("[{}]", i.address)
        } else {
            i.address.clone()
        };
        let target = format!("{host}:{}", i.port);
        match crate::resolve::resolve(&target).await {
            Ok(found) if !found.is_empty() => out.extend(found),
            Ok(_) => tracing::warn!(id = %i.id, target, "a discovered address resolves to nothing; skipped"),
            Err(e) => tracing::warn!(id = %i.id, target, error = %e, "a discovered address does not resolve; skipped"),
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str, address: &str, port: u16) -> Instance {
        Instance {
            id: id.into(),
            address: address.into(),
            port,
            tags: vec![],
            meta: Default::default(),
            node: "n".into(),
            passing: true,
        }
    }

    #[tokio::test]
    async fn addresses_take_ipv4_ipv6_and_names_once_each() {
        let got = addresses(&[
            instance("a", "127.0.0.1", 7000),
            instance("b", "::1", 7001),
            instance("c", "localhost", 7002),
            instance("e", "127.0.0.1", 7000),
        ])
        .await;
        assert!(got.contains(&"127.0.0.1:7000".parse().unwrap()));
        assert!(got.contains(&"[::1]:7001".parse().unwrap()));
        assert!(got.iter().any(|a| a.port() == 7002 && a.ip().is_loopback()));
        assert_eq!(got.iter().filter(|a| a.port() == 7000).count(), 1, "duplicates are dropped");
    }
}
