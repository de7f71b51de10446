//! This frontend's side of the replicated ledger: usage counted since the last report, and budget allotments
//! leased from the orchestrators. Sans-IO: the report loop (`report.rs`) takes [`Ledger::report`] to the
//! orchestrators and brings back [`Ledger::granted`]; the request path reserves a request's worst-case cost with
//! [`Ledger::reserve`] and settles the real cost with [`Ledger::settle`].
//!
//! A request is admitted only while this frontend's used and reserved cost stays within its allotment, and the
//! orchestrators never allot more than a budget holds, so the cluster's usage cannot pass a budget however many
//! frontends share it (docs/audit.md, "Budgets").

mod rate;

use std::collections::{BTreeMap, HashMap, HashSet};

use zl_wire::message::{Budget, BudgetAsk, BudgetMetric, BudgetPeriod, FrontendGrant, FrontendReport, UsageDelta};

/// A project's budget as this frontend holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Start of the period (unix s); 0 before the first grant.
    pub period_start: u64,
    /// When it resets (unix s).
    pub resets_at: u64,
    /// The budget.
    pub limit: u64,
    /// This frontend's cumulative allotment.
    pub allotment: u64,
    /// Used this period.
    pub used: u64,
    /// Reserved by requests in flight (their worst case).
    pub reserved: u64,
    /// Worst case of a request refused at once (the last grant had no room): asked for with the next report, so
    /// a grant that brings room lifts the refusal.
    pub wanted: u64,
    /// `wanted` as the report on its way carried it: its answer settles that want, not one that came later.
    pub wanted_sent: u64,
    /// Worst cases of the requests waiting now for a report's answer (this frontend's lease was short for them),
    /// added up: every report until they retry asks for them all, so a burst gets what it needs in one round
    /// trip, not one request's worth, and keeps it until it takes it.
    pub waiting: u64,
    /// A fresh grant did not make room: refuse at once until a grant brings more.
    pub exhausted: bool,
    /// When a request last asked for it (unix s): a lease is held only while requests come.
    pub active_at: u64,
    /// What the shared bucket held for anyone at the last grant (rate limits only).
    pub available: u64,
    /// A project's concurrency slots (`project/<name>/concurrent`): the allotment is how many requests may be in
    /// flight here at once, `reserved` how many are; nothing is ever `used` up.
    pub concurrent: bool,
    /// The allotment the report on its way asks for ([`Held::room`]).
    pub asked: Option<u64>,
}

/// A lease is kept this long after the last request that needed it, then returned (an idle frontend strands
/// none of a budget or limit that busy ones could use).
pub const LEASE_IDLE_S: u64 = 10;
/// What a frontend holds of a budget or limit nobody asked for this long is forgotten (it then stops reporting it).
pub const FORGET_IDLE_S: u64 = 600;

impl Held {
    /// The allotment to ask for at unix second `now`: what is used and reserved, plus the lease while requests
    /// come (at least the worst case of one refused for want of it).
    fn target(&self, lease_fraction: f64, now: u64) -> u64 {
        // Concurrency slots are asked for as requests come (a spare one only where the limit is large): a slot held
        // idle here is one another frontend's request cannot have.
        let floor = if self.concurrent { 0 } else { 1 };
        let lease = ((self.limit as f64 * lease_fraction) as u64).max(floor).max(self.wanted).max(self.waiting);
        let active = now.saturating_sub(self.active_at) <= LEASE_IDLE_S;
        self.used + self.reserved + if active { lease } else { 0 }
    }

    /// [`Held::target`] for a report being built, noting the want it carries.
    fn ask(&mut self, lease_fraction: f64, now: u64) -> u64 {
        self.wanted_sent = self.wanted;
        let target = self.target(lease_fraction, now);
        self.asked = Some(target);
        target
    }

    /// What requests may hold here now. While a report is on its way, at most what it asks for: its answer sets the
    /// allotment to that when it shrinks it, and hands what this frontend no longer asks for to the others, so
    /// room taken meanwhile beyond it would be spent twice (a budget overrun under a burst).
    fn room(&self) -> u64 {
        self.asked.map_or(self.allotment, |asked| asked.min(self.allotment))
    }

    /// Whether `worst` more fits the room now.
    fn fits(&self, worst: u64) -> bool {
        self.used + self.reserved + worst <= self.room()
    }

    /// The report that carried `wanted_sent` was answered: that want is settled (granted or not), one that grew
    /// since is asked for with the next report.
    fn answered(&mut self) {
        if self.wanted <= self.wanted_sent {
            self.wanted = 0;
        }
        self.wanted_sent = 0;
    }

    /// A request of worst case `worst` waits for a report.
    fn wait(&mut self, worst: u64) {
        self.waiting = self.waiting.saturating_add(worst);
    }

    /// A request that waited retries (or gives up): it no longer asks.
    fn unwait(&mut self, worst: u64) {
        self.waiting = self.waiting.saturating_sub(worst);
    }

    fn forgettable(&self, now: u64) -> bool {
        self.reserved == 0 && now.saturating_sub(self.active_at) > FORGET_IDLE_S
    }
}

/// A request's hold on a budget, settled when it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// Project.
    pub project: String,
    /// The budget's metric.
    pub metric: BudgetMetric,
    /// Reserved (worst case).
    pub reserved: u64,
    /// The period it was reserved in.
    pub period_start: u64,
}

/// Why a request does not fit a budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Short {
    /// This frontend's allotment is short: ask the orchestrators (a report) and try once more.
    Allotment,
    /// The budget is spent: refuse, naming it and when it resets.
    Spent {
        /// Human-readable.
        message: String,
        /// Seconds until it resets.
        retry_after: u64,
    },
}

/// A finished request's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spent {
    /// Key id.
    pub key_id: String,
    /// Project.
    pub project: String,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Billing units times 1000.
    pub milli_units: u64,
    /// The LoRA adapter it ran on and its weights' SHA-256 (none: the base model).
    pub adapter: Option<(String, [u8; 32])>,
}

/// What usage is counted by: hour, key, project and adapter (name and SHA-256).
type UsageKey = (u64, String, String, Option<(String, [u8; 32])>);

/// Usage and budgets of this frontend.
#[derive(Debug, Default)]
pub struct Ledger {
    /// (hour, key, project, adapter) -> usage not yet reported.
    pending: BTreeMap<UsageKey, UsageDelta>,
    /// The report being sent (resent unchanged until it is acknowledged).
    sending: Option<FrontendReport>,
    last_seq: u64,
    held: HashMap<String, Held>,
    /// Shared per-minute rate limits, by bucket.
    rates: HashMap<String, Held>,
    /// Lease size as a fraction of a budget.
    lease_fraction: f64,
    /// Signals from the last grant.
    pub signals: Option<FrontendGrant>,
}

fn cost(metric: BudgetMetric, input: u64, output: u64, milli_units: u64) -> u64 {
    match metric {
        BudgetMetric::Tokens => input + output,
        BudgetMetric::MilliUnits => milli_units,
    }
}

impl Ledger {
    /// A ledger leasing `lease_fraction` of a budget at a time, numbering its reports after `first_seq` (the
    /// start time in ms: more than one report's worth above any number a previous run of this frontend used, so
    /// a restarted frontend's first report is not taken for a repeat).
    pub fn new(lease_fraction: f64, first_seq: u64) -> Self {
        Ledger { lease_fraction: lease_fraction.clamp(0.0, 1.0), last_seq: first_seq, ..Ledger::default() }
    }

    /// Reserve a request's worst case (`input_tokens` and `max_tokens`; a billing unit is at most 1) against
    /// `project`'s budget at unix second `now`.
    pub fn reserve(
        &mut self,
        project: &str,
        budget: Budget,
        input_tokens: u64,
        max_tokens: u64,
        now: u64,
    ) -> Result<Hold, Short> {
        let worst = cost(budget.metric, input_tokens, max_tokens, 1000);
        let h = self.held.entry(project.to_owned()).or_default();
        h.limit = budget.limit;
        h.active_at = now;
        let current = h.resets_at == 0 || now < h.resets_at;
        if current && h.fits(worst) {
            h.reserved += worst;
            return Ok(Hold {
                project: project.to_owned(),
                metric: budget.metric,
                reserved: worst,
                period_start: h.period_start,
            });
        }
        if !h.exhausted && worst <= budget.limit {
            h.wait(worst);
            return Err(Short::Allotment);
        }
        let period = match budget.period {
            BudgetPeriod::Day => "daily",
            BudgetPeriod::Month => "monthly",
        };
        let what = match budget.metric {
            BudgetMetric::Tokens => format!("{} tokens", budget.limit),
            BudgetMetric::MilliUnits => format!("{} billing units", budget.limit as f64 / 1000.0),
        };
        let message = if worst > budget.limit {
            format!("this request may cost more than project {project:?}'s whole {period} budget of {what}")
        } else {
            format!(
                "project {project:?} has used its {period} budget of {what}; it resets at {} (unix time {})",
                zl_common::calendar::rfc3339(h.resets_at),
                h.resets_at
            )
        };
        Err(Short::Spent { message, retry_after: h.resets_at.saturating_sub(now).max(1) })
    }

    /// The orchestrators were asked (after [`Short::Allotment`]) and the request still does not fit: refuse
    /// without asking again until a grant brings more.
    pub fn exhausted(&mut self, project: &str) {
        if let Some(h) = self.held.get_mut(project) {
            h.exhausted = true;
        }
    }

    /// A request ended: count its usage and settle its hold.
    pub fn settle(&mut self, spent: &Spent, hold: Option<&Hold>, now: u64) {
        let hour = now - now % 3600;
        let key = (hour, spent.key_id.clone(), spent.project.clone(), spent.adapter.clone());
        let u = self.pending.entry(key).or_insert_with(|| UsageDelta {
            hour,
            key_id: spent.key_id.clone(),
            project: spent.project.clone(),
            adapter: spent.adapter.as_ref().map(|a| a.0.clone()).unwrap_or_default(),
            adapter_sha256: spent.adapter.as_ref().map(|a| a.1),
            ..UsageDelta::default()
        });
        u.requests += 1;
        u.input_tokens += spent.input_tokens;
        u.output_tokens += spent.output_tokens;
        u.milli_units += spent.milli_units;
        if let Some(hold) = hold
            && let Some(h) = self.held.get_mut(&hold.project)
        {
            h.reserved = h.reserved.saturating_sub(hold.reserved);
            // Never count more than was reserved: the reservation is the bound the allotment was checked against.
            let c = cost(hold.metric, spent.input_tokens, spent.output_tokens, spent.milli_units).min(hold.reserved);
            if hold.period_start == h.period_start {
                h.used += c;
            }
        }
    }

    /// A request holding `hold` waits for a report for another reason (a shared rate limit): ask for it too, so
    /// the report keeps its room for it.
    pub fn wait_budget(&mut self, hold: &Hold) {
        if let Some(h) = self.held.get_mut(&hold.project) {
            h.wait(hold.reserved);
        }
    }

    /// A request (`input_tokens`, `max_tokens`) that waited for `project`'s budget retries, or gives up.
    pub fn unwait_budget(&mut self, project: &str, budget: Budget, input_tokens: u64, max_tokens: u64) {
        if let Some(h) = self.held.get_mut(project) {
            h.unwait(cost(budget.metric, input_tokens, max_tokens, 1000));
        }
    }

    /// A request ended before anything ran: give its hold back, count nothing.
    pub fn release(&mut self, hold: Option<&Hold>) {
        if let Some(hold) = hold
            && let Some(h) = self.held.get_mut(&hold.project)
        {
            h.reserved = h.reserved.saturating_sub(hold.reserved);
        }
    }

    /// The report to send now (the unacknowledged one again, if the last send failed).
    pub fn report(&mut self, audit: Option<(u64, [u8; 32])>, now_ms: u64, lease_ms: u64) -> FrontendReport {
        if let Some(r) = &self.sending {
            let mut r = r.clone();
            // Leases and the head are idempotent figures: bring them up to date.
            r.asks = self.asks(now_ms / 1000);
            r.rate_asks = self.rate_asks(now_ms / 1000);
            (r.audit_seq, r.audit_hash) = audit.map_or((0, None), |(s, h)| (s, Some(h)));
            r.sent_ms = now_ms;
            self.sending = Some(r.clone());
            return r;
        }
        self.last_seq += 1;
        let r = FrontendReport {
            report_seq: self.last_seq,
            usage: std::mem::take(&mut self.pending).into_values().collect(),
            asks: self.asks(now_ms / 1000),
            audit_seq: audit.map_or(0, |(s, _)| s),
            audit_hash: audit.map(|(_, h)| h),
            sent_ms: now_ms,
            lease_ms,
            rate_asks: self.rate_asks(now_ms / 1000),
        };
        self.sending = Some(r.clone());
        r
    }

    fn asks(&mut self, now: u64) -> Vec<BudgetAsk> {
        self.held.retain(|_, h| !h.forgettable(now));
        self.held
            .iter_mut()
            .map(|(project, h)| BudgetAsk {
                project: project.clone(),
                period_start: h.period_start,
                used: h.used,
                target: h.ask(self.lease_fraction, now),
            })
            .collect()
    }

    /// The orchestrators answered the last report.
    pub fn granted(&mut self, grant: FrontendGrant) {
        // The report on its way is answered: its asks no longer bound the room.
        for h in self.held.values_mut().chain(self.rates.values_mut()) {
            h.asked = None;
        }
        let asked: HashSet<String> =
            self.sending.take().map_or_else(HashSet::new, |r| r.asks.into_iter().map(|a| a.project).collect());
        for g in &grant.grants {
            let Some(h) = self.held.get_mut(&g.project) else { continue };
            if g.period_start != h.period_start {
                h.used = 0;
                h.exhausted = false;
                h.period_start = g.period_start;
            }
            h.resets_at = g.resets_at;
            h.limit = g.limit;
            if g.allotment > h.allotment || g.period_start != h.period_start {
                h.exhausted = false;
            }
            h.allotment = g.allotment;
            h.answered();
        }
        // Projects whose budget was cleared are no longer held: asked about in the report this answers, and not
        // granted. One first held while the report was on its way (a request's reservation) is not in it: it is
        // asked for in the next report, not dropped with what it wants.
        let granted: HashSet<&str> = grant.grants.iter().map(|g| g.project.as_str()).collect();
        self.held.retain(|p, _| !asked.contains(p) || granted.contains(p.as_str()));
        self.rates_granted(&grant.rate_grants);
        self.signals = Some(grant);
    }

    /// What this frontend holds of a project's budget.
    pub fn held(&self, project: &str) -> Option<&Held> {
        self.held.get(project)
    }
}

pub use rate::{Dim, Need, RateHold, RateShort};

#[cfg(test)]
mod tests;
