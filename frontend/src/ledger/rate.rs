//! Per-minute rate limits shared by every frontend: this frontend's leases in the orchestrators' token buckets
//! (`orchestrator/src/ledger/rate.rs`). A request reserves its worst case in every bucket that limits it, all or
//! none, and settles its real cost when it ends.

use zl_wire::message::{RateAsk, RateGrant};

use super::{Held, Ledger, Spent};

/// What a bucket counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// Requests.
    Requests,
    /// Input tokens.
    InputTokens,
    /// Output tokens.
    OutputTokens,
    /// Input plus output tokens.
    Tokens,
    /// Requests in flight at once (a project's `max_concurrent`): a slot is held while the request runs and
    /// given back when it ends.
    Concurrent,
}

impl Dim {
    /// A finished request's cost in this dimension.
    pub fn cost(self, s: &Spent) -> u64 {
        match self {
            Dim::Requests => 1,
            Dim::InputTokens => s.input_tokens,
            Dim::OutputTokens => s.output_tokens,
            Dim::Tokens => s.input_tokens + s.output_tokens,
            Dim::Concurrent => 0,
        }
    }
}

/// One bucket a request needs: its name, the limit per minute, the request's worst case in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    /// `key/<id>/requests`, `key/<id>/input_tokens`, `key/<id>/output_tokens` or `project/<name>/tokens`.
    pub bucket: String,
    /// What it counts.
    pub dim: Dim,
    /// The limit per minute.
    pub per_minute: u64,
    /// The request's worst case.
    pub worst: u64,
}

/// A request's hold on one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateHold {
    /// The bucket.
    pub bucket: String,
    /// What it counts.
    pub dim: Dim,
    /// Reserved.
    pub reserved: u64,
}

/// Why a request does not fit the shared limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RateShort {
    /// This frontend's allotment is short: ask the orchestrators and try once more.
    Allotment,
    /// The cluster-wide limit has no room: refuse with this message and wait.
    Limited {
        /// The bucket that refused.
        bucket: String,
        /// Seconds until the request's worst case has come back into the bucket.
        retry_after: u64,
    },
}

impl Ledger {
    /// Reserve a request's worst case in every bucket it needs, or in none, at unix second `now`.
    pub fn reserve_rates(&mut self, needs: &[Need], now: u64) -> Result<Vec<RateHold>, RateShort> {
        let (mut allotment, mut limited) = (false, None);
        for n in needs {
            let h = self.rates.entry(n.bucket.clone()).or_default();
            h.limit = n.per_minute;
            h.active_at = now;
            h.concurrent = n.dim == Dim::Concurrent;
            if h.fits(n.worst) {
                continue;
            }
            if h.exhausted || n.worst > n.per_minute {
                h.wanted = h.wanted.max(n.worst);
                // A slot frees when a request ends; per-minute capacity comes back with the refill.
                let refill = match n.dim {
                    Dim::Concurrent => 1,
                    _ => (n.worst as f64 * 60.0 / n.per_minute.max(1) as f64).ceil() as u64,
                };
                limited
                    .get_or_insert(RateShort::Limited { bucket: n.bucket.clone(), retry_after: refill.clamp(1, 60) });
            } else {
                allotment = true;
            }
        }
        if let Some(l) = limited {
            return Err(l);
        }
        if allotment {
            // The request waits for one report: it asks for every bucket it needs, those it fits in too (else the
            // report would hand their room back as unused and the request would find them short after it).
            self.wait_rates(needs.iter().map(|n| (n.bucket.as_str(), n.worst)));
            return Err(RateShort::Allotment);
        }
        Ok(needs
            .iter()
            .map(|n| {
                let h = self.rates.get_mut(&n.bucket).expect("entered above");
                h.reserved += n.worst;
                RateHold { bucket: n.bucket.clone(), dim: n.dim, reserved: n.worst }
            })
            .collect())
    }

    /// A request waits for a report with these worst cases in these buckets ([`Held::waiting`]).
    pub fn wait_rates<'a>(&mut self, buckets: impl IntoIterator<Item = (&'a str, u64)>) {
        for (bucket, worst) in buckets {
            if let Some(h) = self.rates.get_mut(bucket) {
                h.wait(worst);
            }
        }
    }

    /// A request that waited with `needs` retries (or gives up): it no longer asks.
    pub fn unwait_rates(&mut self, needs: &[Need]) {
        for n in needs {
            if let Some(h) = self.rates.get_mut(&n.bucket) {
                h.unwait(n.worst);
            }
        }
    }

    /// A fresh grant did not make room in these buckets: refuse at once until a grant brings more.
    pub fn rates_exhausted(&mut self, needs: &[Need]) {
        for n in needs {
            if let Some(h) = self.rates.get_mut(&n.bucket)
                && !h.fits(n.worst)
            {
                h.exhausted = true;
            }
        }
    }

    /// A request ended: settle each hold with the real cost (at most what it reserved); `spent` is none when
    /// nothing ran (nothing counts then).
    pub fn settle_rates(&mut self, holds: &[RateHold], spent: Option<&Spent>) {
        for hold in holds {
            if let Some(h) = self.rates.get_mut(&hold.bucket) {
                h.reserved = h.reserved.saturating_sub(hold.reserved);
                if let Some(s) = spent {
                    h.used += hold.dim.cost(s).min(hold.reserved);
                }
            }
        }
    }

    pub(super) fn rate_asks(&mut self, now: u64) -> Vec<RateAsk> {
        self.rates.retain(|_, h| !h.forgettable(now));
        self.rates
            .iter_mut()
            .map(|(bucket, h)| RateAsk {
                bucket: bucket.clone(),
                per_minute: h.limit,
                used: h.used,
                target: h.ask(self.lease_fraction, now),
            })
            .collect()
    }

    pub(super) fn rates_granted(&mut self, grants: &[RateGrant]) {
        for g in grants {
            let Some(h) = self.rates.get_mut(&g.bucket) else { continue };
            if g.allotment > h.allotment {
                h.exhausted = false;
            }
            h.allotment = g.allotment;
            h.available = g.available;
            h.answered();
        }
    }

    /// A shared limit as the cluster stands, as far as this frontend knows: (limit per minute, what is left for
    /// requests here and anywhere else).
    pub fn shared_figures(&self, bucket: &str) -> Option<(u64, u64)> {
        let h = self.rates.get(bucket)?;
        let own = h.allotment.saturating_sub(h.used + h.reserved);
        Some((h.limit, (own + h.available).min(h.limit)))
    }

    /// What this frontend holds of a bucket.
    pub fn rate_held(&self, bucket: &str) -> Option<&Held> {
        self.rates.get(bucket)
    }
}
