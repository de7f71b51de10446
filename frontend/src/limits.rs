//! Per-key rate limits (requests, input tokens and output tokens per minute) as token buckets, project quotas
//! (requests in flight, total tokens per minute), and the `anthropic-ratelimit-*` figures they produce.
//!
//! Pure and synchronous: every call takes `now`, so tests drive time by hand. Output tokens are reserved from
//! `max_tokens` when a request is admitted and the unused part is given back when it ends ([`RateLimiter::settle`]).
//! Each frontend replica enforces its share of a limit (`share`), so N replicas together enforce the limit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Limits per minute; 0 means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyLimits {
    /// Requests per minute.
    pub requests: u32,
    /// Input tokens per minute.
    pub input_tokens: u32,
    /// Output tokens per minute.
    pub output_tokens: u32,
}

/// A project's shared quota; 0 means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjectLimits {
    /// Input plus output tokens per minute, over all the project's keys.
    pub tokens: u32,
    /// Requests in flight, over all the project's keys.
    pub max_concurrent: u32,
}

/// One bucket: holds up to `capacity` and refills at `capacity` per minute.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    capacity: f64,
    level: f64,
    updated: Instant,
}

impl Bucket {
    fn new(capacity: f64, now: Instant) -> Self {
        Bucket { capacity, level: capacity, updated: now }
    }

    fn refill(&mut self, capacity: f64, now: Instant) {
        if capacity != self.capacity {
            // A changed limit keeps the used amount.
            self.level = (self.level + capacity - self.capacity).max(0.0);
            self.capacity = capacity;
        }
        let dt = now.saturating_duration_since(self.updated).as_secs_f64();
        self.level = (self.level + dt * self.capacity / 60.0).min(self.capacity);
        self.updated = now;
    }

    /// Time until `amount` is available (zero if it is now; `None` if it never can be).
    fn wait_for(&self, amount: f64) -> Option<Duration> {
        if amount > self.capacity {
            return None;
        }
        let missing = (amount - self.level).max(0.0);
        Some(Duration::from_secs_f64(missing * 60.0 / self.capacity))
    }

    /// Time until the bucket is full again.
    fn reset_in(&self) -> Duration {
        Duration::from_secs_f64((self.capacity - self.level).max(0.0) * 60.0 / self.capacity)
    }

    fn figures(&self) -> Figures {
        Figures { limit: self.capacity as u64, remaining: self.level.max(0.0) as u64, reset_in: self.reset_in() }
    }
}

/// One dimension's `limit`, `remaining` and time to `reset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    /// The limit per minute (this replica's share).
    pub limit: u64,
    /// What is left now.
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset_in: Duration,
}

/// The figures for the `anthropic-ratelimit-*` headers; a dimension without a limit has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateFigures {
    /// `requests-*`.
    pub requests: Option<Figures>,
    /// `tokens-*`: the tighter of the input and output figures.
    pub tokens: Option<Figures>,
    /// `input-tokens-*`.
    pub input_tokens: Option<Figures>,
    /// `output-tokens-*`.
    pub output_tokens: Option<Figures>,
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// Which limit: "requests", "input_tokens", "output_tokens", "project_tokens", "project_concurrency".
    pub dimension: &'static str,
    /// Human-readable.
    pub message: String,
    /// When to retry.
    pub retry_after: Duration,
    /// The figures at the time of refusal.
    pub figures: RateFigures,
}

/// The `tokens-*` figures: whichever of input and output has less left.
pub(crate) fn tighter(input: Option<Figures>, output: Option<Figures>) -> Option<Figures> {
    match (input, output) {
        (Some(i), Some(o)) => Some(if i.remaining <= o.remaining { i } else { o }),
        (i, o) => i.or(o),
    }
}

#[derive(Debug, Default)]
struct KeyState {
    requests: Option<Bucket>,
    input: Option<Bucket>,
    output: Option<Bucket>,
    last_used: Option<Instant>,
}

#[derive(Debug, Default)]
struct ProjectState {
    tokens: Option<Bucket>,
    in_flight: u32,
}

/// Rate limiter state for every key and project this replica has seen.
#[derive(Debug)]
pub struct RateLimiter {
    share: f64,
    keys: HashMap<String, KeyState>,
    projects: HashMap<String, ProjectState>,
}

/// What [`RateLimiter::admit`] reserved; hand it back to [`RateLimiter::settle`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    key: String,
    project: String,
    input_tokens: u32,
    output_tokens: u32,
    counted_concurrency: bool,
}

fn sync_bucket(slot: &mut Option<Bucket>, limit: u32, share: f64, now: Instant) -> Option<&mut Bucket> {
    if limit == 0 {
        *slot = None;
        return None;
    }
    let capacity = (f64::from(limit) * share).max(1.0);
    let bucket = slot.get_or_insert_with(|| Bucket::new(capacity, now));
    bucket.refill(capacity, now);
    Some(bucket)
}

/// This frontend's share of a project's concurrency limit when `in_flight` requests fill it (`None`: room left, or
/// no limit).
fn concurrency_full(quota: ProjectLimits, share: f64, in_flight: u32) -> Option<u32> {
    let limit = (f64::from(quota.max_concurrent) * share).ceil() as u32;
    (quota.max_concurrent > 0 && in_flight >= limit).then_some(limit)
}

fn concurrency_message(project: &str, limit: u32) -> String {
    format!("project {project} already has {limit} requests in flight, its limit")
}

impl RateLimiter {
    /// A limiter enforcing `share` (in (0, 1]) of each limit: 1 / the number of frontend replicas.
    pub fn new(share: f64) -> Self {
        let share = if share.is_finite() && share > 0.0 { share.min(1.0) } else { 1.0 };
        RateLimiter { share, keys: HashMap::new(), projects: HashMap::new() }
    }

    /// Enforce `share` of each limit from now on: 1 while the orchestrators share the limits between frontends,
    /// 1 / the number of replicas while they cannot.
    pub fn set_share(&mut self, share: f64) {
        if share.is_finite() && share > 0.0 {
            self.share = share.min(1.0);
        }
    }

    /// Admit one request of `input_tokens` that may produce up to `max_tokens` tokens, or refuse it with the
    /// time to wait. Nothing is taken on refusal.
    #[allow(clippy::too_many_arguments)]
    pub fn admit(
        &mut self,
        key: &str,
        project: &str,
        limits: KeyLimits,
        quota: ProjectLimits,
        input_tokens: u32,
        max_tokens: u32,
        now: Instant,
    ) -> Result<(Reservation, RateFigures), Box<Refusal>> {
        let share = self.share;
        let state = self.keys.entry(key.to_owned()).or_default();
        state.last_used = Some(now);
        let mut checks: Vec<(&'static str, &mut Bucket, f64)> = Vec::new();
        if let Some(b) = sync_bucket(&mut state.requests, limits.requests, share, now) {
            checks.push(("requests", b, 1.0));
        }
        if let Some(b) = sync_bucket(&mut state.input, limits.input_tokens, share, now) {
            checks.push(("input_tokens", b, f64::from(input_tokens)));
        }
        if let Some(b) = sync_bucket(&mut state.output, limits.output_tokens, share, now) {
            checks.push(("output_tokens", b, f64::from(max_tokens)));
        }
        let project_state = self.projects.entry(project.to_owned()).or_default();
        if let Some(b) = sync_bucket(&mut project_state.tokens, quota.tokens, share, now) {
            checks.push(("project_tokens", b, f64::from(input_tokens) + f64::from(max_tokens)));
        }
        let mut refusal: Option<(&'static str, Option<Duration>)> = None;
        for (dimension, bucket, amount) in &checks {
            match bucket.wait_for(*amount) {
                Some(wait) if wait.is_zero() => {}
                wait => {
                    if refusal.is_none_or(|(_, w)| wait.is_none() || w.is_some_and(|w| wait.is_some_and(|x| x > w))) {
                        refusal = Some((dimension, wait));
                    }
                }
            }
        }
        let full = concurrency_full(quota, share, project_state.in_flight);
        if refusal.is_none() && full.is_some() {
            refusal = Some(("project_concurrency", Some(Duration::from_secs(1))));
        }
        if let Some((dimension, wait)) = refusal {
            drop(checks);
            let figures = self.figures(key, project);
            let message = match (dimension, wait) {
                ("project_concurrency", _) => concurrency_message(project, full.unwrap_or_default()),
                (_, None) => format!(
                    "this request needs more {} than the per-minute limit allows at all",
                    dimension.replace('_', " ")
                ),
                (_, Some(_)) => format!("rate limit exceeded: {} per minute", dimension.replace('_', " ")),
            };
            return Err(Box::new(Refusal {
                dimension,
                message,
                retry_after: wait.unwrap_or(Duration::from_secs(60)),
                figures,
            }));
        }
        for (_, bucket, amount) in checks {
            bucket.level -= amount;
        }
        let counted = quota.max_concurrent > 0;
        if counted {
            project_state.in_flight += 1;
        }
        let reservation = Reservation {
            key: key.to_owned(),
            project: project.to_owned(),
            input_tokens,
            output_tokens: max_tokens,
            counted_concurrency: counted,
        };
        Ok((reservation, self.figures(key, project)))
    }

    /// Whether a request of `key` could be admitted at all now, taking nothing: a request left in its per-minute
    /// bucket and a free concurrency slot for `project`. Checked before the body is read, so a key already over
    /// its limits costs no body read, parse or tokenization; the real admission ([`RateLimiter::admit`]) follows.
    pub fn precheck(
        &mut self,
        key: &str,
        project: &str,
        limits: KeyLimits,
        quota: ProjectLimits,
        now: Instant,
    ) -> Result<(), Box<Refusal>> {
        let share = self.share;
        let state = self.keys.entry(key.to_owned()).or_default();
        let wait = sync_bucket(&mut state.requests, limits.requests, share, now).and_then(|b| b.wait_for(1.0));
        let in_flight = self.projects.get(project).map_or(0, |p| p.in_flight);
        let (dimension, message, retry_after) = match (wait, concurrency_full(quota, share, in_flight)) {
            (Some(w), _) if !w.is_zero() => ("requests", "rate limit exceeded: requests per minute".to_owned(), w),
            (_, Some(limit)) => ("project_concurrency", concurrency_message(project, limit), Duration::from_secs(1)),
            _ => return Ok(()),
        };
        Err(Box::new(Refusal { dimension, message, retry_after, figures: self.figures(key, project) }))
    }

    /// The request ended having produced `output_tokens`: give back the unused reservation and its concurrency
    /// slot.
    pub fn settle(&mut self, reservation: &Reservation, output_tokens: u32, now: Instant) {
        let unused = f64::from(reservation.output_tokens.saturating_sub(output_tokens));
        if let Some(state) = self.keys.get_mut(&reservation.key)
            && let Some(b) = state.output.as_mut()
        {
            b.refill(b.capacity, now);
            b.level = (b.level + unused).min(b.capacity);
        }
        if let Some(p) = self.projects.get_mut(&reservation.project) {
            if let Some(b) = p.tokens.as_mut() {
                b.refill(b.capacity, now);
                b.level = (b.level + unused).min(b.capacity);
            }
            if reservation.counted_concurrency {
                p.in_flight = p.in_flight.saturating_sub(1);
            }
        }
    }

    /// The request was admitted here but never ran (another limit, a budget or the route refused it): give back
    /// everything it took, its request and input tokens too. A refusal costs a client none of its allowance.
    pub fn release(&mut self, reservation: &Reservation, now: Instant) {
        let give = |slot: &mut Option<Bucket>, amount: f64| {
            if let Some(b) = slot.as_mut() {
                b.refill(b.capacity, now);
                b.level = (b.level + amount).min(b.capacity);
            }
        };
        let (input, output) = (f64::from(reservation.input_tokens), f64::from(reservation.output_tokens));
        if let Some(state) = self.keys.get_mut(&reservation.key) {
            give(&mut state.requests, 1.0);
            give(&mut state.input, input);
            give(&mut state.output, output);
        }
        if let Some(p) = self.projects.get_mut(&reservation.project) {
            give(&mut p.tokens, input + output);
            if reservation.counted_concurrency {
                p.in_flight = p.in_flight.saturating_sub(1);
            }
        }
    }

    /// Current figures for a key.
    pub fn figures(&self, key: &str, _project: &str) -> RateFigures {
        let Some(state) = self.keys.get(key) else { return RateFigures::default() };
        let requests = state.requests.map(|b| b.figures());
        let input_tokens = state.input.map(|b| b.figures());
        let output_tokens = state.output.map(|b| b.figures());
        let tokens = tighter(input_tokens, output_tokens);
        RateFigures { requests, tokens, input_tokens, output_tokens }
    }

    /// [`RateLimiter::figures`], or full buckets under `limits` for a key this replica has not seen yet.
    pub fn figures_or_full(&self, key: &str, limits: KeyLimits) -> RateFigures {
        if self.keys.contains_key(key) {
            return self.figures(key, "");
        }
        let full = |limit: u32| {
            (limit > 0).then(|| {
                let cap = (f64::from(limit) * self.share).max(1.0) as u64;
                Figures { limit: cap, remaining: cap, reset_in: Duration::ZERO }
            })
        };
        let (input_tokens, output_tokens) = (full(limits.input_tokens), full(limits.output_tokens));
        let tokens = tighter(input_tokens, output_tokens);
        RateFigures { requests: full(limits.requests), tokens, input_tokens, output_tokens }
    }

    /// Forget keys idle for longer than `idle` (their buckets are full again by then anyway).
    pub fn sweep(&mut self, now: Instant, idle: Duration) {
        self.keys.retain(|_, s| s.last_used.is_some_and(|t| now.saturating_duration_since(t) < idle));
        self.projects.retain(|_, p| p.in_flight > 0 || p.tokens.is_some_and(|b| b.level < b.capacity));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const LIMITS: KeyLimits = KeyLimits { requests: 3, input_tokens: 1000, output_tokens: 600 };

    #[test]
    fn requests_per_minute_refill_continuously() {
        let mut rl = RateLimiter::new(1.0);
        let t0 = Instant::now();
        for _ in 0..3 {
            rl.admit("k", "p", LIMITS, ProjectLimits::default(), 10, 10, t0).unwrap();
        }
        let refused = rl.admit("k", "p", LIMITS, ProjectLimits::default(), 10, 10, t0).unwrap_err();
        assert_eq!(refused.dimension, "requests");
        assert_eq!(refused.retry_after, Duration::from_secs(20));
        assert_eq!(refused.figures.requests.unwrap().remaining, 0);
        // One request comes back every 20 s.
        rl.admit("k", "p", LIMITS, ProjectLimits::default(), 10, 10, t0 + Duration::from_secs(20)).unwrap();
    }

    #[test]
    fn output_is_reserved_then_settled() {
        let mut rl = RateLimiter::new(1.0);
        let t0 = Instant::now();
        let (res, fig) = rl.admit("k", "p", LIMITS, ProjectLimits::default(), 100, 500, t0).unwrap();
        assert_eq!(fig.output_tokens.unwrap().remaining, 100);
        assert_eq!(fig.input_tokens.unwrap().remaining, 900);
        assert_eq!(fig.tokens.unwrap().remaining, 100, "tokens-* is the tighter of the two");
        let refused = rl.admit("k", "p", LIMITS, ProjectLimits::default(), 100, 500, t0).unwrap_err();
        assert_eq!(refused.dimension, "output_tokens");
        rl.settle(&res, 20, t0);
        assert_eq!(rl.figures("k", "p").output_tokens.unwrap().remaining, 580);
        rl.admit("k", "p", LIMITS, ProjectLimits::default(), 100, 500, t0).unwrap();
    }

    #[test]
    fn an_impossible_request_says_so() {
        let mut rl = RateLimiter::new(1.0);
        let refused = rl.admit("k", "p", LIMITS, ProjectLimits::default(), 5000, 1, Instant::now()).unwrap_err();
        assert_eq!(refused.dimension, "input_tokens");
        assert!(refused.message.contains("at all"), "{}", refused.message);
    }

    #[test]
    fn unlimited_dimensions_have_no_figures_and_never_refuse() {
        let mut rl = RateLimiter::new(1.0);
        let t0 = Instant::now();
        for _ in 0..1000 {
            let (_, fig) = rl.admit("k", "p", KeyLimits::default(), ProjectLimits::default(), 9999, 9999, t0).unwrap();
            assert_eq!(fig, RateFigures::default());
        }
    }

    #[test]
    fn project_concurrency_is_shared_by_its_keys_and_released() {
        let mut rl = RateLimiter::new(1.0);
        let t0 = Instant::now();
        let quota = ProjectLimits { tokens: 0, max_concurrent: 2 };
        let (a, _) = rl.admit("k1", "p", KeyLimits::default(), quota, 1, 1, t0).unwrap();
        rl.admit("k2", "p", KeyLimits::default(), quota, 1, 1, t0).unwrap();
        assert_eq!(
            rl.admit("k3", "p", KeyLimits::default(), quota, 1, 1, t0).unwrap_err().dimension,
            "project_concurrency"
        );
        rl.admit("k3", "other", KeyLimits::default(), quota, 1, 1, t0).unwrap();
        rl.settle(&a, 1, t0);
        rl.admit("k3", "p", KeyLimits::default(), quota, 1, 1, t0).unwrap();
    }

    #[test]
    fn a_replica_enforces_its_share() {
        let mut rl = RateLimiter::new(0.5);
        let t0 = Instant::now();
        let limits = KeyLimits { requests: 10, ..KeyLimits::default() };
        for _ in 0..5 {
            rl.admit("k", "p", limits, ProjectLimits::default(), 1, 1, t0).unwrap();
        }
        assert!(rl.admit("k", "p", limits, ProjectLimits::default(), 1, 1, t0).is_err());
    }
}
