//! Admission beyond the rate limits: the degradation level's effects (docs/operations.md, "Degradation levels")
//! and the project's budget, enforced across frontends through leased allotments (docs/audit.md, "Budgets").

use std::time::{Duration, Instant};

use zl_common::sync::lock;

use super::{Gateway, Prepared};
use crate::cluster::KeyInfo;
use crate::error::{ApiError, ErrorKind};
use crate::health::Level;
use crate::ledger::{Dim, Hold, Need, RateHold, RateShort, Short};
use crate::limits::{Figures, RateFigures, tighter};

/// What `degraded` does, per priority class (0 high, 1 normal, 2 low).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DegradeConfig {
    /// Requests of this class and lower are refused with 529 while degraded (3: none are).
    pub shed_from_class: u8,
    /// While degraded, `max_tokens` of normal and low requests is capped to this (0: no cap).
    pub cap_max_tokens: u32,
    /// While degraded, route normal and low requests to their model's fallback chain first.
    pub prefer_fallback: bool,
    /// `retry-after` of refusals, seconds.
    pub retry_after: u64,
}

impl Default for DegradeConfig {
    fn default() -> Self {
        DegradeConfig { shed_from_class: 2, cap_max_tokens: 0, prefer_fallback: true, retry_after: 5 }
    }
}

/// How long a request waits for the orchestrators to answer a report when it needs more budget.
const BUDGET_WAIT: Duration = Duration::from_secs(2);

impl Gateway {
    /// Apply the degradation level to a request of `key`'s project: refuse it, cap its output, or let it be.
    pub(super) fn degrade(&self, key: &KeyInfo, p: &mut Prepared) -> Result<(), ApiError> {
        let d = self.config.degrade;
        match self.shed(key)? {
            None => Ok(()),
            Some(class) => {
                if d.cap_max_tokens > 0 && class >= 1 && p.max_tokens > d.cap_max_tokens {
                    metrics::counter!("zl_frontend_degraded_capped_total").increment(1);
                    p.max_tokens = d.cap_max_tokens;
                }
                p.prefer_fallback = d.prefer_fallback && class >= 1;
                Ok(())
            }
        }
    }

    /// The degradation level's verdict on a request of `key`'s project: refused (unavailable, or degraded and its
    /// priority class shed), or admitted: `Some(class)` while degraded, `None` while healthy.
    pub(super) fn shed(&self, key: &KeyInfo) -> Result<Option<u8>, ApiError> {
        let (level, why) = self.cluster.level(Instant::now());
        let d = self.config.degrade;
        let refuse = |what: &str| {
            metrics::counter!("zl_frontend_shed_total", "level" => level.as_str()).increment(1);
            ApiError::new(ErrorKind::Overloaded, format!("{what}: {why}")).retry_after(d.retry_after)
        };
        match level {
            Level::Healthy => Ok(None),
            Level::Unavailable => Err(refuse("the cluster is unavailable")),
            Level::Degraded => {
                let class = self.cluster.project(&key.project).priority;
                if class >= d.shed_from_class {
                    return Err(refuse("the cluster is degraded and sheds this project's priority class first"));
                }
                Ok(Some(class))
            }
        }
    }

    /// The shared per-minute limits a request of `key` needs, with its worst case in each: `input` tokens in and at
    /// most `max` out.
    fn rate_needs(&self, key: &KeyInfo, input: u64, max: u64) -> Vec<Need> {
        let (limits, quota) = self.limits_for(key);
        let k = &key.key_id;
        [
            (format!("key/{k}/requests"), Dim::Requests, limits.requests, 1),
            (format!("key/{k}/input_tokens"), Dim::InputTokens, limits.input_tokens, input),
            (format!("key/{k}/output_tokens"), Dim::OutputTokens, limits.output_tokens, max),
            (format!("project/{}/tokens", key.project), Dim::Tokens, quota.tokens, input + max),
            // The project's requests in flight at once, fleet-wide: a slot leased like the rest.
            (format!("project/{}/concurrent", key.project), Dim::Concurrent, quota.max_concurrent, 1),
        ]
        .into_iter()
        .filter(|(_, _, limit, _)| *limit > 0)
        .map(|(bucket, dim, limit, worst)| Need { bucket, dim, per_minute: u64::from(limit), worst })
        .collect()
    }

    /// `figures` with the shared limits' cluster-wide figures in place of this frontend's own buckets, while the
    /// limits are shared (the `anthropic-ratelimit-*` headers then speak for the cluster).
    pub(super) fn shared_figures(&self, key: &KeyInfo, mut figures: RateFigures) -> RateFigures {
        if !self.limits_shared() {
            return figures;
        }
        let ledger = lock(&self.reporter.ledger);
        let bucket = |name: &str| {
            let (limit, remaining) = ledger.shared_figures(name)?;
            let missing = limit.saturating_sub(remaining) as f64;
            let reset_in = Duration::from_secs_f64(missing * 60.0 / limit.max(1) as f64);
            Some(Figures { limit, remaining, reset_in })
        };
        let shared = |dim: &str, local: Option<Figures>| bucket(&format!("key/{}/{dim}", key.key_id)).or(local);
        figures.requests = shared("requests", figures.requests);
        figures.input_tokens = shared("input_tokens", figures.input_tokens);
        figures.output_tokens = shared("output_tokens", figures.output_tokens);
        // `tokens` is the tightest token limit the request meets: the key's input and output limits, and its
        // project's total tokens per minute (`--tpm`), which only the shared ledger enforces.
        let project_tokens = bucket(&format!("project/{}/tokens", key.project));
        figures.tokens = tighter(tighter(figures.input_tokens, figures.output_tokens), project_tokens);
        figures
    }

    /// Whether the per-minute limits are shared through the orchestrators now: their last answer to a report is
    /// fresh. Otherwise each frontend enforces its `1/--replicas` share alone.
    pub(super) fn limits_shared(&self) -> bool {
        self.cluster.signals_fresh(Instant::now())
    }

    /// Reserve the request's worst case in the shared per-minute limits (while they are shared) and against its
    /// project's budget (if it has one), asking the orchestrators for more once if this frontend's leases are short.
    pub(super) async fn reserve_leases(&self, key: &KeyInfo, input: u64, max: u64) -> Result<Holds, ApiError> {
        let needs = if self.limits_shared() { self.rate_needs(key, input, max) } else { Vec::new() };
        let budget = self.cluster.project(&key.project).budget;
        let now = crate::ids::unix_now();
        // Both kinds are asked for together, so one report brings every lease the request lacks. A request that
        // waits for that report is counted as waiting in every bucket and budget it needs (`Held::waiting`) until it
        // retries, so each report until then asks for it.
        let unwait = |ledger: &mut crate::ledger::Ledger| {
            ledger.unwait_rates(&needs);
            if let Some(b) = budget {
                ledger.unwait_budget(&key.project, b, input, max);
            }
        };
        let attempt = |last: bool| -> Result<Holds, Short2> {
            let mut ledger = lock(&self.reporter.ledger);
            if last {
                // The request waited: it retries now, under the same lock (a report built in between would
                // otherwise no longer ask for it).
                unwait(&mut ledger);
                ledger.rates_exhausted(&needs);
            }
            let rates = ledger.reserve_rates(&needs, now);
            let reserve = |l: &mut crate::ledger::Ledger, b| l.reserve(&key.project, b, input, max, now);
            let held = budget.map(|b| match reserve(&mut ledger, b) {
                Err(Short::Allotment) if last => {
                    // It counted itself as waiting: it waits no more.
                    ledger.unwait_budget(&key.project, b, input, max);
                    ledger.exhausted(&key.project);
                    reserve(&mut ledger, b)
                }
                other => other,
            });
            match (rates, held) {
                (Ok(rates), None) => Ok(Holds { budget: None, rates }),
                (Ok(rates), Some(Ok(hold))) => Ok(Holds { budget: Some(hold), rates }),
                (rates, held) => {
                    // Give back what did fit; a refusal outranks a short lease. A request that waits for a report
                    // asks for what did fit too; one refused no longer waits for anything.
                    let waits = !last
                        && !matches!(&rates, Err(RateShort::Limited { .. }))
                        && !matches!(&held, Some(Err(Short::Spent { .. })));
                    match &rates {
                        Ok(r) => {
                            ledger.settle_rates(r, None);
                            if waits {
                                ledger.wait_rates(r.iter().map(|h| (h.bucket.as_str(), h.reserved)));
                            }
                        }
                        Err(RateShort::Allotment) if !waits => ledger.unwait_rates(&needs),
                        Err(_) => {}
                    }
                    match (&held, budget) {
                        (Some(Ok(h)), _) => {
                            ledger.release(Some(h));
                            if waits {
                                ledger.wait_budget(h);
                            }
                        }
                        (Some(Err(Short::Allotment)), Some(b)) if !waits => {
                            ledger.unwait_budget(&key.project, b, input, max);
                        }
                        _ => {}
                    }
                    Err(match (rates, held) {
                        (_, Some(Err(spent @ Short::Spent { .. }))) => Short2::Budget(spent),
                        (Err(limited @ RateShort::Limited { .. }), _) => Short2::Rate(limited),
                        (Err(short), _) => Short2::Rate(short),
                        (_, Some(Err(short))) => Short2::Budget(short),
                        _ => Short2::Rate(RateShort::Allotment),
                    })
                }
            }
        };
        let result = match attempt(false) {
            Err(Short2::Rate(RateShort::Allotment) | Short2::Budget(Short::Allotment)) => {
                // This frontend's leases are short: ask for more, once.
                // Counted as waiting until it retries: also when the wait fails or the client goes away meanwhile.
                let mut waiting = Waiting { ledger: &self.reporter.ledger, unwait: Some(&unwait) };
                let answered = self.reporter.ask_now(BUDGET_WAIT).await;
                if answered {
                    // `attempt(true)` stops waiting itself, under the lock it retries in.
                    waiting.unwait = None;
                }
                drop(waiting);
                if !answered {
                    return Err(ApiError::new(
                        ErrorKind::Overloaded,
                        "the orchestrators did not answer for this request's shared limits in time",
                    )
                    .retry_after(1));
                }
                attempt(true)
            }
            other => other,
        };
        match result {
            Ok(holds) => Ok(holds),
            Err(Short2::Budget(Short::Spent { message, retry_after })) => {
                metrics::counter!("zl_frontend_budget_refusals_total").increment(1);
                Err(ApiError::new(ErrorKind::RateLimit, message).retry_after(retry_after))
            }
            Err(Short2::Rate(RateShort::Limited { bucket, retry_after })) => {
                if let Some(h) = lock(&self.reporter.ledger).rate_held(&bucket) {
                    tracing::debug!(
                        %bucket, allotment = h.allotment, used = h.used, reserved = h.reserved, wanted = h.wanted,
                        exhausted = h.exhausted, "refused by a shared limit"
                    );
                }
                let dimension = bucket.rsplit('/').next().unwrap_or("requests").to_owned();
                metrics::counter!("zl_frontend_rate_limited_total", "dimension" => "shared").increment(1);
                let message = if dimension == "concurrent" {
                    format!(
                        "project {} already has {} requests in flight, its limit (across every frontend: {bucket})",
                        key.project,
                        self.cluster.project(&key.project).max_concurrent
                    )
                } else {
                    format!(
                        "rate limit exceeded: {} per minute (shared by every frontend: {bucket})",
                        dimension.replace('_', " ")
                    )
                };
                Err(ApiError::new(ErrorKind::RateLimit, message).retry_after(retry_after))
            }
            Err(_) => {
                Err(ApiError::new(ErrorKind::RateLimit, "the shared limits are held by other frontends").retry_after(1))
            }
        }
    }
}

/// A request waiting for a report: it stops counting as waiting when dropped (the wait failed, or the client went
/// away), unless its retry took that over.
struct Waiting<'a> {
    ledger: &'a std::sync::Mutex<crate::ledger::Ledger>,
    unwait: Option<&'a (dyn Fn(&mut crate::ledger::Ledger) + Sync)>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(unwait) = self.unwait.take() {
            unwait(&mut lock(self.ledger));
        }
    }
}

/// What a request holds in the shared ledgers, settled when it ends.
#[derive(Debug, Default)]
pub(super) struct Holds {
    pub(super) budget: Option<Hold>,
    pub(super) rates: Vec<RateHold>,
}

enum Short2 {
    Rate(RateShort),
    Budget(Short),
}
