//! Admission beyond the rate limits: the degradation level's effects (docs/operations.md, "Degradation levels")
//! and the project's budget, enforced across frontends through leased allotments (docs/audit.md, "Budgets").

use std::time::{Duration, Instant};

use zl_common::sync::lock;

use super::{Gateway, Prepared};
use crate::cluster::KeyInfo;
use crate::error::{ApiError, ErrorKind};
use crate::health::Level;
use crate::ledger::{Hold, Short};

/// What `degraded` does, per priority class (0 high, 1 normal, 2 low).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DegradeConfig {
    /// Requests of this class and lower are refused with 529 while degraded (3: none are).
    pub shed_from_class: u8,
    /// While degraded, `max_tokens` of normal and low requests is capped to this (0: no cap).
    pub cap_max_tokens: u32,
    /// `retry-after` of refusals, seconds.
    pub retry_after: u64,
}

impl Default for DegradeConfig {
    fn default() -> Self {
        DegradeConfig { shed_from_class: 2, cap_max_tokens: 0, retry_after: 5 }
    }
}

/// How long a request waits for the orchestrators to answer a report when it needs more budget.
const BUDGET_WAIT: Duration = Duration::from_secs(2);

impl Gateway {
    /// Apply the degradation level to a request of `key`'s project: refuse it, cap its output, or let it be.
    pub(super) fn degrade(&self, key: &KeyInfo, p: &mut Prepared) -> Result<(), ApiError> {
        let (level, why) = self.cluster.level(Instant::now());
        let d = self.config.degrade;
        let refuse = |what: &str| {
            metrics::counter!("zl_frontend_shed_total", "level" => level.as_str()).increment(1);
            ApiError::new(ErrorKind::Overloaded, format!("{what}: {why}")).retry_after(d.retry_after)
        };
        match level {
            Level::Healthy => Ok(()),
            Level::Unavailable => Err(refuse("the cluster is unavailable")),
            Level::Degraded => {
                let class = self.cluster.project(&key.project).priority;
                if class >= d.shed_from_class {
                    return Err(refuse("the cluster is degraded and sheds this project's priority class first"));
                }
                if d.cap_max_tokens > 0 && class >= 1 && p.max_tokens > d.cap_max_tokens {
                    metrics::counter!("zl_frontend_degraded_capped_total").increment(1);
                    p.max_tokens = d.cap_max_tokens;
                }
                Ok(())
            }
        }
    }

    /// Reserve the request's worst-case cost against its project's budget, if it has one.
    pub(super) async fn reserve_budget(&self, key: &KeyInfo, p: &Prepared) -> Result<Option<Hold>, ApiError> {
        let Some(budget) = self.cluster.project(&key.project).budget else { return Ok(None) };
        let input = p.tokens.len() as u64;
        let max = u64::from(p.max_tokens);
        let now = crate::report::unix_ms() / 1000;
        let attempt = || lock(&self.reporter.ledger).reserve(&key.project, budget, input, max, now);
        let result = match attempt() {
            Err(Short::Allotment) => {
                // This frontend's lease is short: ask for more, once.
                if !self.reporter.ask_now(BUDGET_WAIT).await {
                    return Err(ApiError::new(
                        ErrorKind::Overloaded,
                        "the orchestrators did not answer for this project's budget in time",
                    )
                    .retry_after(1));
                }
                match attempt() {
                    Err(Short::Allotment) => {
                        lock(&self.reporter.ledger).exhausted(&key.project);
                        attempt()
                    }
                    other => other,
                }
            }
            other => other,
        };
        match result {
            Ok(hold) => Ok(Some(hold)),
            Err(Short::Spent { message, retry_after }) => {
                metrics::counter!("zl_frontend_budget_refusals_total").increment(1);
                Err(ApiError::new(ErrorKind::RateLimit, message).retry_after(retry_after))
            }
            Err(Short::Allotment) => {
                Err(ApiError::new(ErrorKind::RateLimit, "the project's budget is held by other frontends")
                    .retry_after(1))
            }
        }
    }
}
