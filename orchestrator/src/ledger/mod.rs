//! The replicated ledger: usage per key and hour, project budgets enforced across frontends by leased
//! allotments, the audit chain heads the frontends commit, content-logging data keys, and projects' priority
//! classes. Part of the routing state (`state/mod.rs` applies its commands); deterministic like the rest: the time a
//! report is applied at is carried in the command, stamped by the orchestrator that proposed it.
//!
//! Budgets: each frontend holds an *allotment* per project and period (cumulative, including what it has used)
//! and never admits a request whose worst-case cost would take its use past it. The ledger never lets the
//! allotments plus what expired leases were charged exceed the budget, so usage cannot pass the budget whatever
//! the number of frontends. A frontend that stops reporting for [`LEASE_TTL_MS`] is presumed dead: its whole
//! allotment is charged (it may have used it), so it loses at most the unused part of its lease.

mod heads;
mod lease;
mod rate;
mod report;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use zl_common::audit::ChainHead;
use zl_wire::message::{BudgetGrant, BudgetMetric, BudgetPeriod};

pub use heads::{HEAD_HISTORY, HeadEntry, HeadOutcome, HeadRecords, Refused};
pub use rate::RateBucket;
pub use report::{BudgetPosition, RatePosition, ReportEntry, UsageEntry};

use lease::Leases;

/// A frontend silent this long (unless its reports name another time) has its allotments charged and dropped.
pub const LEASE_TTL_MS: u64 = 30_000;
/// The shortest and longest lease time a frontend may ask for.
pub const LEASE_MS_RANGE: (u64, u64) = (1_000, 600_000);
/// Hours of usage kept (about 92 days).
pub const USAGE_HOURS: u64 = 24 * 92;
/// Most (hour, project, key) usage rows kept; the oldest hours go first beyond it.
pub const MAX_USAGE_ROWS: usize = 1_000_000;

/// Usage counted in one hour.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Requests.
    pub requests: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Billing units times 1000.
    pub milli_units: u64,
}

impl Usage {
    fn add(&mut self, o: &Usage) {
        self.requests += o.requests;
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.milli_units += o.milli_units;
    }
}

fn rows(hour: &BTreeMap<String, BTreeMap<String, Usage>>) -> usize {
    hour.values().map(BTreeMap::len).sum()
}

/// One hour of adapter usage: project -> adapter -> SHA-256 of its weights (hex) -> usage.
pub type AdapterHour = BTreeMap<String, BTreeMap<String, BTreeMap<String, Usage>>>;

/// Adapter usage rows in one hour of `Ledger::adapter_usage`.
fn adapter_rows(hour: &AdapterHour) -> usize {
    hour.values().map(|adapters| adapters.values().map(BTreeMap::len).sum::<usize>()).sum()
}

/// A project's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetSpec {
    /// `tokens` or `units` (billing milli-units on the wire).
    pub tokens: bool,
    /// Monthly (else daily), UTC calendar.
    pub monthly: bool,
    /// Per period, in the metric (milli-units for units).
    pub limit: u64,
}

impl BudgetSpec {
    /// As the wire carries it.
    pub fn wire(&self) -> zl_wire::message::Budget {
        zl_wire::message::Budget {
            metric: if self.tokens { BudgetMetric::Tokens } else { BudgetMetric::MilliUnits },
            period: if self.monthly { BudgetPeriod::Month } else { BudgetPeriod::Day },
            limit: self.limit,
        }
    }

    /// The period holding unix second `now`: (start, end).
    pub fn period(&self, now: u64) -> (u64, u64) {
        zl_common::calendar::period(now, self.monthly)
    }
}

/// One frontend's lease in a project's period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allotment {
    /// Used so far this period (reported).
    pub used: u64,
    /// Allotment held (cumulative, at least `used`).
    pub allotment: u64,
    /// When it expires unless renewed (unix ms).
    pub expires_ms: u64,
}

/// A project's budget period.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Period {
    /// Start (unix seconds).
    pub start: u64,
    /// Charged for leases of frontends that stopped reporting.
    pub charged: u64,
    /// Per frontend.
    pub frontends: BTreeMap<String, Allotment>,
}

impl Period {
    /// Used or charged: what counts against the budget for certain.
    pub fn spent(&self) -> u64 {
        self.charged + self.frontends.values().map(|a| a.used).sum::<u64>()
    }

    /// Spent plus what frontends hold unused.
    pub fn committed(&self) -> u64 {
        self.charged + self.frontends.values().map(|a| a.allotment).sum::<u64>()
    }
}

/// A project's content-logging key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataKey {
    /// Id named in sealed payloads.
    pub key_id: String,
    /// 32 bytes, hex.
    pub key: String,
}

/// The ledger.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// hour (unix s) -> project -> key -> usage.
    pub usage: BTreeMap<u64, BTreeMap<String, BTreeMap<String, Usage>>>,
    /// Rows in `usage` and `adapter_usage` (kept as rows come and go; recounted on restore).
    #[serde(default)]
    pub row_count: usize,
    /// Requests on LoRA adapters, as well as in `usage`: hour (unix s) -> project -> adapter -> SHA-256 of its
    /// weights (hex) -> usage (protocol 1.9's usage rows; absent in older snapshots).
    #[serde(default)]
    pub adapter_usage: BTreeMap<u64, AdapterHour>,
    /// Budgets by project.
    pub budgets: BTreeMap<String, BudgetSpec>,
    /// Current period by project.
    pub periods: BTreeMap<String, Period>,
    /// Audit chain heads by frontend: the newest committed (`heads.rs` says how a head may move).
    pub heads: BTreeMap<String, HeadEntry>,
    /// The rest of each frontend's head record: older heads, refused ones, operator resets.
    #[serde(default)]
    pub head_records: BTreeMap<String, HeadRecords>,
    /// Last report applied per frontend.
    pub report_seqs: BTreeMap<String, u64>,
    /// Content-logging keys by project.
    pub data_keys: BTreeMap<String, DataKey>,
    /// Shredded key ids by project (so exports can say why a payload does not open).
    pub shredded: BTreeMap<String, Vec<String>>,
    /// Priority class by project (absent: 1, normal).
    pub priority: BTreeMap<String, u8>,
    /// Per-minute rate limits shared by the frontends, by bucket.
    #[serde(default)]
    pub rates: BTreeMap<String, RateBucket>,
}

impl Ledger {
    /// Apply a frontend's report received at `now_ms` (the proposer's clock).
    pub fn report(&mut self, frontend: &str, now_ms: u64, r: &ReportEntry) {
        let last = self.report_seqs.get(frontend).copied().unwrap_or(0);
        if r.report_seq > last {
            for u in &r.usage {
                let add = Usage {
                    requests: u.requests,
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                    milli_units: u.milli_units,
                };
                let keys = self.usage.entry(u.hour).or_default().entry(u.project.clone()).or_default();
                if !keys.contains_key(&u.key_id) {
                    self.row_count += 1;
                }
                keys.entry(u.key_id.clone()).or_default().add(&add);
                if !u.adapter.is_empty() {
                    let versions = self
                        .adapter_usage
                        .entry(u.hour)
                        .or_default()
                        .entry(u.project.clone())
                        .or_default()
                        .entry(u.adapter.clone())
                        .or_default();
                    if !versions.contains_key(&u.adapter_sha256) {
                        self.row_count += 1;
                    }
                    versions.entry(u.adapter_sha256.clone()).or_default().add(&add);
                }
            }
            self.report_seqs.insert(frontend.to_owned(), r.report_seq);
        }
        if let Some(hash) = r.audit_hash {
            self.commit_head(frontend, ChainHead { seq: r.audit_seq, hash: zl_common::keys::hex(&hash) }, now_ms);
        }
        let now_s = now_ms / 1000;
        let ttl = if r.lease_ms == 0 { LEASE_TTL_MS } else { r.lease_ms.clamp(LEASE_MS_RANGE.0, LEASE_MS_RANGE.1) };
        rate::ask(&mut self.rates, frontend, &r.rate_asks, now_ms, now_ms + ttl);
        for ask in &r.asks {
            let Some(spec) = self.budgets.get(&ask.project).copied() else { continue };
            let (start, _) = spec.period(now_s);
            let period = self.periods.entry(ask.project.clone()).or_default();
            if period.start != start {
                *period = Period { start, ..Period::default() };
            }
            // Figures for an older period count as a fresh start in this one.
            let (used, target) =
                if ask.period_start == start { (ask.used, ask.target) } else { (0, ask.target - ask.used) };
            Leases { frontends: &mut period.frontends, charged: &mut period.charged }.ask(
                frontend,
                used,
                target,
                spec.limit,
                now_ms + ttl,
            );
        }
        self.expire(now_ms);
        self.prune(now_s);
    }

    /// Charge and drop the leases of frontends that stopped reporting.
    fn expire(&mut self, now_ms: u64) {
        rate::expire(&mut self.rates, now_ms);
        for (project, period) in &mut self.periods {
            let mut leases = Leases { frontends: &mut period.frontends, charged: &mut period.charged };
            for (f, a) in leases.expire(now_ms) {
                tracing::info!(%project, frontend = %f, charged = a.allotment, unused = a.allotment - a.used, "budget lease expired");
            }
        }
    }

    /// Drop hours older than [`USAGE_HOURS`], then the oldest hours while there are more than [`MAX_USAGE_ROWS`]
    /// rows (the row count is kept as rows come and go, so a report costs no scan of the ledger).
    fn prune(&mut self, now_s: u64) {
        let oldest = (now_s / 3600).saturating_sub(USAGE_HOURS) * 3600;
        while let Some((&hour, _)) = self.usage.first_key_value()
            && (hour < oldest || (self.row_count > MAX_USAGE_ROWS && self.usage.len() > 1))
        {
            if let Some(gone) = self.usage.remove(&hour) {
                self.row_count -= rows(&gone);
            }
        }
        // Adapter rows go with their hour (each came with a key's row in the same hour).
        let first_kept = self.usage.first_key_value().map_or(u64::MAX, |(&h, _)| h);
        while let Some((&hour, _)) = self.adapter_usage.first_key_value()
            && hour < first_kept
        {
            if let Some(gone) = self.adapter_usage.remove(&hour) {
                self.row_count -= adapter_rows(&gone);
            }
        }
    }

    /// Count the usage rows afresh (after a restore).
    pub fn recount(&mut self) {
        self.row_count =
            self.usage.values().map(rows).sum::<usize>() + self.adapter_usage.values().map(adapter_rows).sum::<usize>();
    }

    /// A frontend's grants for the budgets of `projects` (those it asked about).
    pub fn grants<'a>(
        &self,
        frontend: &str,
        now_ms: u64,
        projects: impl IntoIterator<Item = &'a str>,
    ) -> Vec<BudgetGrant> {
        projects
            .into_iter()
            .filter_map(|p| self.budgets.get_key_value(p))
            .map(|(project, spec)| {
                let (start, end) = spec.period(now_ms / 1000);
                let period = self.periods.get(project).filter(|p| p.start == start);
                BudgetGrant {
                    project: project.clone(),
                    period_start: start,
                    resets_at: end,
                    limit: spec.limit,
                    spent: period.map_or(0, Period::spent),
                    allotment: period.and_then(|p| p.frontends.get(frontend)).map_or(0, |a| a.allotment),
                }
            })
            .collect()
    }

    /// A frontend's grants for the rate-limit buckets it asked about.
    pub fn rate_grants(&self, frontend: &str, asked: &[RatePosition]) -> Vec<zl_wire::message::RateGrant> {
        rate::grants(&self.rates, frontend, asked)
    }

    /// Set or clear a project's budget. A changed budget keeps the period's figures.
    pub fn set_budget(&mut self, project: &str, spec: Option<BudgetSpec>) {
        match spec {
            Some(s) => {
                self.budgets.insert(project.to_owned(), s);
            }
            None => {
                self.budgets.remove(project);
                self.periods.remove(project);
            }
        }
    }

    /// Turn content logging on with this key (or rotate to it).
    pub fn set_data_key(&mut self, project: &str, key: DataKey) {
        self.data_keys.insert(project.to_owned(), key);
    }

    /// Crypto-shred: forget the project's data key; returns its id.
    pub fn shred(&mut self, project: &str) -> Option<String> {
        let key = self.data_keys.remove(project)?;
        let shredded = self.shredded.entry(project.to_owned()).or_default();
        if shredded.len() < 1000 {
            shredded.push(key.key_id.clone());
        }
        Some(key.key_id)
    }

    /// Adapter usage rows from hour `since` (unix s), optionally of one project: (hour, project, adapter, SHA-256
    /// hex, usage).
    pub fn adapter_usage_rows(&self, since: u64, project: Option<&str>) -> Vec<(u64, &str, &str, &str, Usage)> {
        let mut out = Vec::new();
        for (hour, projects) in self.adapter_usage.range(since - since % 3600..) {
            for (p, adapters) in projects.iter().filter(|(p, _)| project.is_none_or(|want| want == p.as_str())) {
                for (name, versions) in adapters {
                    out.extend(versions.iter().map(|(sha, u)| (*hour, p.as_str(), name.as_str(), sha.as_str(), *u)));
                }
            }
        }
        out
    }

    /// Usage rows from hour `since` (unix s), optionally of one project: (hour, project, key, usage).
    pub fn usage_rows(&self, since: u64, project: Option<&str>) -> Vec<(u64, &str, &str, Usage)> {
        let mut rows = Vec::new();
        for (hour, projects) in self.usage.range(since - since % 3600..) {
            for (p, keys) in projects {
                if project.is_some_and(|want| want != p) {
                    continue;
                }
                for (k, u) in keys {
                    rows.push((*hour, p.as_str(), k.as_str(), *u));
                }
            }
        }
        rows
    }
}

#[cfg(test)]
mod tests;
