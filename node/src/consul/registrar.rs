//! Keeps one node's service registered with its local Consul agent: registers it, passes its TTL check three
//! times per TTL with a one-line status as the check's output, rewrites its Meta when it changes materially (at
//! most once per [`META_MIN_INTERVAL`]: catalog writes are Raft writes in Consul), and registers again whenever
//! a pass fails (the agent restarted and forgot it, or was unreachable: a registration is idempotent). Drain
//! puts the service in maintenance; a clean stop deregisters it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::catalog::Registration;
use super::client::ConsulClient;
use super::status::{Backoff, DiscoveryStatus};

/// The fewest seconds between two Meta rewrites of one service.
pub const META_MIN_INTERVAL: Duration = Duration::from_secs(10);

/// What a node says about itself on each pass.
pub trait Report: Send + Sync + 'static {
    /// The check's output: a one-line status (load, role).
    fn note(&self) -> String;
    /// New Meta when it differs materially from what was last `written`; `None` keeps it.
    fn meta(&self, _written: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
        None
    }
}

/// A note from a closure, with fixed Meta.
impl<F: Fn() -> String + Send + Sync + 'static> Report for F {
    fn note(&self) -> String {
        self()
    }
}

enum Request {
    Maintenance(String, oneshot::Sender<()>),
    Deregister(oneshot::Sender<()>),
}

/// The running registration loop.
#[derive(Debug)]
pub struct Registrar {
    requests: mpsc::Sender<Request>,
    task: tokio::task::JoinHandle<()>,
}

struct Keeper {
    client: ConsulClient,
    registration: Registration,
    report: Arc<dyn Report>,
    status: Arc<DiscoveryStatus>,
    registered: bool,
    maintenance: Option<String>,
    meta_written_at: Option<Instant>,
}

impl Keeper {
    /// Register if needed, then pass the check. On failure, which call failed and why.
    async fn beat(&mut self) -> Result<(), (&'static str, anyhow::Error)> {
        if let Some(meta) = self.report.meta(&self.registration.meta) {
            let due = self.meta_written_at.is_none_or(|at| at.elapsed() >= META_MIN_INTERVAL);
            if meta != self.registration.meta && (due || !self.registered) {
                self.registration.meta = meta;
                if self.registered {
                    metrics::counter!("zl_discovery_meta_writes_total", "service" => self.registration.name.clone())
                        .increment(1);
                }
                self.registered = false;
            }
        }
        if !self.registered {
            self.client.register(&self.registration).await.map_err(|e| ("register", e))?;
            self.meta_written_at = Some(Instant::now());
            if let Some(reason) = &self.maintenance {
                self.client.maintenance(&self.registration.id, true, reason).await.map_err(|e| ("maintenance", e))?;
            }
            self.registered = true;
            metrics::counter!("zl_discovery_registrations_total", "service" => self.registration.name.clone())
                .increment(1);
            tracing::info!(service = %self.registration.name, id = %self.registration.id, "registered with consul");
        }
        let note = self.report.note();
        if let Err(e) = self.client.pass(&self.registration.check_id(), &note).await {
            // Unknown check (the agent restarted without our service) or no agent: register again next time.
            self.registered = false;
            return Err(("pass", e));
        }
        Ok(())
    }
}

impl Registrar {
    /// Register `registration` through `client` and keep it registered until [`Registrar::deregister`].
    pub fn spawn(
        client: ConsulClient,
        registration: Registration,
        report: Arc<dyn Report>,
        status: Arc<DiscoveryStatus>,
    ) -> Registrar {
        let every = (registration.ttl / 3).max(Duration::from_millis(100));
        let (requests, mut inbox) = mpsc::channel::<Request>(4);
        let mut keeper = Keeper {
            client,
            registration,
            report,
            status,
            registered: false,
            maintenance: None,
            meta_written_at: None,
        };
        let task = tokio::spawn(async move {
            let mut backoff = Backoff::new(Duration::from_millis(250), every.max(Duration::from_millis(250)));
            loop {
                let wait = match keeper.beat().await {
                    Ok(()) => {
                        keeper.status.ok(Instant::now());
                        backoff.reset();
                        every
                    }
                    Err((op, e)) => {
                        keeper.status.failed(op, &e, Instant::now());
                        backoff.fail()
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    request = inbox.recv() => match request {
                        Some(Request::Maintenance(reason, done)) => {
                            keeper.maintenance = Some(reason.clone());
                            if keeper.registered
                                && let Err(e) = keeper.client.maintenance(&keeper.registration.id, true, &reason).await
                            {
                                keeper.status.failed("maintenance", &e, Instant::now());
                            }
                            let _ = done.send(());
                        }
                        Some(Request::Deregister(done)) => {
                            match keeper.client.deregister(&keeper.registration.id).await {
                                Ok(()) => tracing::info!(id = %keeper.registration.id, "deregistered from consul"),
                                Err(e) => keeper.status.failed("deregister", &e, Instant::now()),
                            }
                            let _ = done.send(());
                            return;
                        }
                        None => return,
                    },
                }
            }
        });
        Registrar { requests, task }
    }

    /// Put the service in maintenance (draining: out of every `?passing` answer), kept across re-registrations.
    pub async fn maintenance(&self, reason: &str) {
        let (done, wait) = oneshot::channel();
        if self.requests.send(Request::Maintenance(reason.to_owned(), done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// Deregister the service and stop.
    pub async fn deregister(self) {
        let (done, wait) = oneshot::channel();
        if self.requests.send(Request::Deregister(done)).await.is_ok() {
            let _ = wait.await;
        }
        let _ = self.task.await;
    }
}
