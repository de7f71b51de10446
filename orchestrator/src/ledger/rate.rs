//! Per-minute rate limits shared by every frontend: a token bucket per limited thing (a key's requests, input
//! or output tokens, a project's tokens) held in the replicated ledger, from which frontends lease allotments the
//! way they lease budgets. The bucket's cumulative capacity grows by the limit per minute and never runs more than
//! one minute's worth ahead of what is allotted (a full bucket stops filling), so over any stretch of time the
//! frontends together are allotted at most one minute's limit plus the refill of that stretch: the token bucket's
//! own bound, cluster-wide instead of per replica.
//!
//! A project's concurrency limit is a bucket too (`project/<name>/concurrent`, its `per_minute` the limit): its
//! capacity is the limit itself, never refilled; a frontend's allotment is the slots it may fill at once (what it
//! has in flight plus what it asks for), so the frontends together never hold more slots than the limit. A
//! silent frontend's slots come back when its lease expires (its requests died with it): nothing is charged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use zl_wire::message::RateGrant;

use super::report::RatePosition;

use super::Allotment;
use super::lease::Leases;

/// One shared bucket.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RateBucket {
    /// The limit per minute (as the frontends last stated it).
    pub per_minute: u64,
    /// Capacity that has come into existence since the bucket was made (cumulative).
    pub total: f64,
    /// When `total` was last brought up to date (unix ms).
    pub last_ms: u64,
    /// Charged for the leases of frontends that stopped reporting or started their count afresh.
    pub charged: u64,
    /// Per frontend (cumulative figures).
    pub frontends: BTreeMap<String, Allotment>,
}

/// Whether `bucket` counts requests in flight (a project's `max_concurrent`) rather than a per-minute rate.
pub(super) fn is_concurrency(bucket: &str) -> bool {
    bucket.ends_with("/concurrent")
}

impl RateBucket {
    fn committed(&self) -> u64 {
        self.charged + self.frontends.values().map(|a| a.allotment).sum::<u64>()
    }

    /// What the bucket holds for anyone now.
    pub fn available(&self) -> u64 {
        (self.total.floor() as u64).saturating_sub(self.committed())
    }

    /// Bring the capacity up to `now_ms`; a bucket never holds more than one minute's limit.
    fn refill(&mut self, now_ms: u64) {
        let dt = now_ms.saturating_sub(self.last_ms) as f64;
        self.total += self.per_minute as f64 * dt / 60_000.0;
        self.last_ms = self.last_ms.max(now_ms);
        self.cap();
    }

    /// What is returned to a full bucket spills over.
    fn cap(&mut self) {
        self.total = self.total.min((self.committed() + self.per_minute) as f64);
    }
}

/// Apply a frontend's rate asks at `now_ms`; its leases hold until `expires_ms`.
pub(super) fn ask(
    buckets: &mut BTreeMap<String, RateBucket>,
    frontend: &str,
    asks: &[RatePosition],
    now_ms: u64,
    expires_ms: u64,
) {
    for ask in asks {
        let b = buckets.entry(ask.bucket.clone()).or_insert_with(|| RateBucket {
            per_minute: ask.per_minute,
            // A new bucket starts full.
            total: ask.per_minute as f64,
            last_ms: now_ms,
            ..RateBucket::default()
        });
        b.per_minute = ask.per_minute;
        if is_concurrency(&ask.bucket) {
            b.total = ask.per_minute as f64;
            b.last_ms = now_ms;
            Leases { frontends: &mut b.frontends, charged: &mut b.charged }.ask(
                frontend,
                0,
                ask.target,
                ask.per_minute,
                expires_ms,
            );
            continue;
        }
        b.refill(now_ms);
        let capacity = b.total.floor() as u64;
        Leases { frontends: &mut b.frontends, charged: &mut b.charged }
            .ask(frontend, ask.used, ask.target, capacity, expires_ms);
        b.cap();
    }
}

/// Charge the leases of frontends silent past their lease time, and drop buckets nobody holds any more (a new one
/// starts full, as an idle one would be).
pub(super) fn expire(buckets: &mut BTreeMap<String, RateBucket>, now_ms: u64) {
    for (name, b) in buckets.iter_mut() {
        if is_concurrency(name) {
            // The slots of a frontend that went silent come back: its requests went with it.
            b.frontends.retain(|_, a| a.expires_ms >= now_ms);
            b.charged = 0;
            continue;
        }
        Leases { frontends: &mut b.frontends, charged: &mut b.charged }.expire(now_ms);
    }
    buckets.retain(|name, b| {
        if is_concurrency(name) {
            return !b.frontends.is_empty();
        }
        b.refill(now_ms);
        !b.frontends.is_empty() || b.available() < b.per_minute
    });
}

/// A frontend's grants for the buckets it asked about.
pub(super) fn grants(buckets: &BTreeMap<String, RateBucket>, frontend: &str, asked: &[RatePosition]) -> Vec<RateGrant> {
    asked
        .iter()
        .filter_map(|a| {
            let b = buckets.get(&a.bucket)?;
            Some(RateGrant {
                bucket: a.bucket.clone(),
                allotment: b.frontends.get(frontend).map_or(0, |x| x.allotment),
                available: b.available(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask_for(bucket: &str, used: u64, target: u64) -> RatePosition {
        RatePosition { bucket: bucket.into(), per_minute: 60, used, target }
    }

    #[test]
    fn frontends_share_one_minute_of_limit_plus_the_refill() {
        let mut b = BTreeMap::new();
        let t0 = 1_000_000;
        // Three frontends each want 40 of a 60-per-minute limit at once: 60 in all.
        for (i, f) in ["a", "b", "c"].iter().enumerate() {
            ask(&mut b, f, &[ask_for("k/requests", 0, 40)], t0 + i as u64, t0 + 10_000);
        }
        let held: Vec<u64> = ["a", "b", "c"].iter().map(|f| b["k/requests"].frontends[*f].allotment).collect();
        assert_eq!(held, vec![40, 20, 0]);
        // Ten seconds later ten more have come in.
        ask(&mut b, "c", &[ask_for("k/requests", 0, 40)], t0 + 10_002, t0 + 20_000);
        assert_eq!(b["k/requests"].frontends["c"].allotment, 10);
        // An idle full bucket does not overfill: after an hour the frontends together get one minute's worth.
        let later = t0 + 3_600_000;
        ask(&mut b, "a", &[ask_for("k/requests", 40, 40)], later, later + 10_000);
        ask(&mut b, "b", &[ask_for("k/requests", 20, 20)], later, later + 10_000);
        ask(&mut b, "c", &[ask_for("k/requests", 10, 10)], later, later + 10_000);
        ask(&mut b, "a", &[ask_for("k/requests", 40, 1000)], later, later + 10_000);
        assert_eq!(b["k/requests"].frontends["a"].allotment - 40, 60);
        let g = grants(&b, "a", &[ask_for("k/requests", 0, 0)]);
        assert_eq!((g[0].allotment, g[0].available), (100, 0));
    }

    #[test]
    fn a_projects_concurrency_slots_are_shared_and_come_back_from_the_silent() {
        let mut b = BTreeMap::new();
        let slots = |in_flight_and_wanted: u64| RatePosition {
            bucket: "project/p/concurrent".into(),
            per_minute: 4,
            used: 0,
            target: in_flight_and_wanted,
        };
        // Three frontends each want 3 slots of a limit of 4 at once: 4 in all, however they ask.
        for f in ["a", "b", "c"] {
            ask(&mut b, f, &[slots(3)], 1_000, 10_000);
        }
        let held = |b: &BTreeMap<String, RateBucket>, f: &str| {
            b["project/p/concurrent"].frontends.get(f).map_or(0, |a| a.allotment)
        };
        assert_eq!([held(&b, "a"), held(&b, "b"), held(&b, "c")], [3, 1, 0]);
        // The capacity never refills with time: an hour later c still gets nothing while a and b hold them.
        ask(&mut b, "c", &[slots(1)], 3_600_000, 3_610_000);
        assert_eq!(held(&b, "c"), 0);
        // a's requests end and it asks for none: its slots go back, and c gets one.
        ask(&mut b, "a", &[slots(0)], 3_600_001, 3_610_000);
        ask(&mut b, "c", &[slots(1)], 3_600_002, 3_610_000);
        assert_eq!((held(&b, "a"), held(&b, "c")), (0, 1));
        // b goes silent: its slot comes back without a charge once its lease expires.
        expire(&mut b, 3_700_000);
        assert!(b.is_empty() || b["project/p/concurrent"].charged == 0);
        ask(&mut b, "a", &[slots(4)], 3_700_001, 3_800_000);
        assert_eq!(held(&b, "a"), 4);
    }

    #[test]
    fn dead_and_restarted_frontends_are_charged_and_idle_buckets_go() {
        let mut b = BTreeMap::new();
        ask(&mut b, "a", &[ask_for("k/requests", 0, 30)], 0, 5_000);
        ask(&mut b, "b", &[ask_for("k/requests", 0, 10)], 0, 5_000);
        ask(&mut b, "b", &[ask_for("k/requests", 5, 10)], 50, 5_000);
        // b restarts and counts from 0: its old lease is charged.
        ask(&mut b, "b", &[ask_for("k/requests", 0, 10)], 100, 5_000);
        assert_eq!(b["k/requests"].charged, 10);
        // a goes silent: charged after its lease time.
        expire(&mut b, 6_000);
        assert!(!b["k/requests"].frontends.contains_key("a") || b["k/requests"].frontends.is_empty());
        assert_eq!(b["k/requests"].charged, 50);
        // Nobody holds it and it has filled up again: gone.
        expire(&mut b, 200_000);
        assert!(b.is_empty());
    }
}
