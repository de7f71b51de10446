//! How a node's discovery backend is doing, for its logs, its metrics (`zl_discovery_*`), `/readyz` and the
//! health header: whether the agent answered the last call, since when, and why not. Also the retry backoff the
//! registration and watch loops share. Clock-free: callers pass `now`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use zl_common::sync::lock;

/// What [`DiscoveryStatus::view`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusView {
    /// The agent answered the last call.
    pub reachable: bool,
    /// Since when it has (or has not).
    pub since: Instant,
    /// The last failure, empty when none.
    pub last_error: String,
}

/// Shared by a node's registration and watch loops.
#[derive(Debug)]
pub struct DiscoveryStatus {
    state: Mutex<StatusView>,
}

impl DiscoveryStatus {
    /// A status that counts as reachable from `now` until a call fails (a node starts serving at once, with the
    /// view it is given).
    pub fn new(now: Instant) -> Self {
        metrics::gauge!("zl_discovery_up", "backend" => "consul").set(1.0);
        DiscoveryStatus { state: Mutex::new(StatusView { reachable: true, since: now, last_error: String::new() }) }
    }

    /// A call succeeded.
    pub fn ok(&self, now: Instant) {
        let mut s = lock(&self.state);
        if !s.reachable {
            tracing::info!(
                after = ?now.saturating_duration_since(s.since),
                "consul answers again; the discovery view is live"
            );
            metrics::gauge!("zl_discovery_up", "backend" => "consul").set(1.0);
            *s = StatusView { reachable: true, since: now, last_error: String::new() };
        }
    }

    /// A call (`op`: register, pass, watch, ...) failed.
    pub fn failed(&self, op: &'static str, error: &anyhow::Error, now: Instant) {
        metrics::counter!("zl_discovery_errors_total", "backend" => "consul", "op" => op).increment(1);
        let mut s = lock(&self.state);
        if s.reachable {
            tracing::warn!(op, error = %format!("{error:#}"), "consul calls fail; serving with the last known view");
            metrics::gauge!("zl_discovery_up", "backend" => "consul").set(0.0);
            s.reachable = false;
            s.since = now;
        } else {
            tracing::debug!(op, error = %format!("{error:#}"), "consul calls still fail");
        }
        s.last_error = format!("{op}: {error:#}");
    }

    /// The current status.
    pub fn view(&self) -> StatusView {
        lock(&self.state).clone()
    }
}

/// Exponential backoff between retries of a failing call: `min`, doubling to `max`; back to `min` after a success.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// From `min` to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff { min, max, next: min }
    }

    /// The wait before the next retry (each failure doubles the following one).
    pub fn fail(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// A success: the next failure waits `min` again.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
        let waits: Vec<u64> = (0..6).map(|_| b.fail().as_millis() as u64).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 2000, 2000]);
        b.reset();
        assert_eq!(b.fail(), Duration::from_millis(250));
    }

    #[test]
    fn status_flips_on_failure_and_recovery_and_keeps_the_reason() {
        let t0 = Instant::now();
        let s = DiscoveryStatus::new(t0);
        assert!(s.view().reachable);
        let t1 = t0 + Duration::from_secs(1);
        s.failed("watch", &anyhow::anyhow!("connection refused"), t1);
        s.failed("pass", &anyhow::anyhow!("connection refused"), t1 + Duration::from_secs(1));
        let v = s.view();
        assert!(!v.reachable);
        assert_eq!(v.since, t1, "the outage started at the first failure");
        assert_eq!(v.last_error, "pass: connection refused");
        let t2 = t1 + Duration::from_secs(5);
        s.ok(t2);
        assert_eq!(s.view(), StatusView { reachable: true, since: t2, last_error: String::new() });
    }
}
