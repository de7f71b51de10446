//! The report loop: about once a second (and at once when a request needs more budget), send the orchestrators
//! this frontend's usage, budget positions and audit chain head, and take back its allotments and the cluster's
//! health signals; log and count every change of degradation level.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zl_common::sync::lock;

use crate::audit::AuditLog;
use crate::cluster::Cluster;
use crate::health::Level;
use crate::ids::unix_ms;
use crate::ledger::Ledger;
use crate::upstream::Upstream;

/// The ledger and the means to ask for a report now.
#[derive(Debug)]
pub struct Reporter {
    /// Usage and budgets.
    pub ledger: Mutex<Ledger>,
    wake: tokio::sync::Notify,
    /// Reports built so far (each report's number), and the number of the last one answered.
    started: AtomicU64,
    granted: tokio::sync::watch::Sender<u64>,
    /// How long leases hold without another report.
    pub lease: Duration,
}

impl Reporter {
    /// A reporter leasing `lease_fraction` of a budget at a time, for `lease`.
    pub fn new(lease_fraction: f64, lease: Duration) -> Self {
        Reporter {
            // Reports are numbered from the start time, so a restarted frontend's are never taken for repeats.
            ledger: Mutex::new(Ledger::new(lease_fraction, unix_ms())),
            wake: tokio::sync::Notify::new(),
            started: AtomicU64::new(0),
            granted: tokio::sync::watch::Sender::new(0),
            lease,
        }
    }

    /// Report now and wait (up to `within`) for the answer to a report built after this call (one already on
    /// its way does not carry what the caller just asked for); false if none came.
    pub async fn ask_now(&self, within: Duration) -> bool {
        let mut rx = self.granted.subscribe();
        let needed = self.started.load(Ordering::SeqCst) + 1;
        self.wake.notify_one();
        matches!(tokio::time::timeout(within, rx.wait_for(|answered| *answered >= needed)).await, Ok(Ok(_)))
    }
}

/// Report every `interval` (or when asked) until the task is dropped.
pub async fn report_loop(
    reporter: Arc<Reporter>,
    upstream: Arc<dyn Upstream>,
    cluster: Arc<Cluster>,
    audit: Option<Arc<AuditLog>>,
    interval: Duration,
) {
    let mut level = Level::Healthy;
    let mut first = true;
    loop {
        // The first report goes at once: it confirms the audit chain before the frontend serves.
        if !std::mem::take(&mut first) {
            let uncommitted = async {
                match &audit {
                    Some(log) => log.uncommitted.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = reporter.wake.notified() => {}
                () = uncommitted => {}
            }
        }
        let head = audit.as_ref().map(|a| a.head()).filter(|h| h.seq > 0);
        let head = head.and_then(|h| Some((h.seq, zl_common::keys::parse_hex32(&h.hash)?)));
        let number = reporter.started.fetch_add(1, Ordering::SeqCst) + 1;
        let report = lock(&reporter.ledger).report(head, unix_ms(), reporter.lease.as_millis() as u64);
        let sent = Instant::now();
        match upstream.report(report).await {
            Ok(grant) => {
                metrics::histogram!("zl_frontend_report_seconds").record(sent.elapsed().as_secs_f64());
                if let Some(log) = &audit {
                    log.check_committed(grant.audit_head);
                }
                cluster.set_signals(grant.clone(), Instant::now());
                lock(&reporter.ledger).granted(grant);
                reporter.granted.send_replace(number);
            }
            Err(e) => {
                metrics::counter!("zl_frontend_report_failures_total").increment(1);
                tracing::warn!(error = %e, "report to the orchestrators failed; it is sent again");
            }
        }
        let (now, why) = cluster.level(Instant::now());
        if now != level {
            tracing::warn!(from = level.as_str(), to = now.as_str(), reason = %why, "health level changed");
            metrics::counter!("zl_frontend_health_changes_total", "to" => now.as_str()).increment(1);
            level = now;
        }
        metrics::gauge!("zl_frontend_health_level").set(match level {
            Level::Healthy => 0.0,
            Level::Degraded => 1.0,
            Level::Unavailable => 2.0,
        });
    }
}
