//! A frontend's periodic report to the orchestrators (usage, budget leases, audit chain head) and the answer
//! (allotments and health signals). Owned, checked values and their FlatBuffers conversion.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::check::{self, invalid};
use super::{MessageError, fb};

/// Most usage deltas or budget asks in one report, grants in one answer.
pub const MAX_REPORT_ITEMS: usize = 10_000;

/// Usage of one key in one hour since the last report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageDelta {
    /// Unix time of the hour's start, in seconds (a multiple of 3600).
    pub hour: u64,
    /// Key id.
    pub key_id: String,
    /// Project.
    pub project: String,
    /// Requests.
    pub requests: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Billing units times 1000.
    pub milli_units: u64,
    /// The adapter the requests ran on (empty: the base model; protocol 1.9).
    pub adapter: String,
    /// SHA-256 of the adapter's weights file (given exactly when `adapter` is).
    pub adapter_sha256: Option<[u8; 32]>,
}

/// A frontend's cumulative position in one project's budget period.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetAsk {
    /// Project.
    pub project: String,
    /// Start of the period (unix seconds).
    pub period_start: u64,
    /// Used by this frontend this period.
    pub used: u64,
    /// Allotment wanted (at least `used`).
    pub target: u64,
}

/// A frontend's cumulative position in one shared per-minute rate limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateAsk {
    /// What is limited (`key/<id>/requests`, ...).
    pub bucket: String,
    /// The limit per minute.
    pub per_minute: u64,
    /// Used by this frontend since it started using the bucket.
    pub used: u64,
    /// Allotment wanted (at least `used`).
    pub target: u64,
}

/// A frontend's allotment in one rate-limit bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateGrant {
    /// The bucket.
    pub bucket: String,
    /// Cumulative allotment.
    pub allotment: u64,
    /// What the bucket holds for anyone now.
    pub available: u64,
}

/// A frontend's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontendReport {
    /// From 1; a repeated number is applied once.
    pub report_seq: u64,
    /// Usage since the last report.
    pub usage: Vec<UsageDelta>,
    /// Budget positions.
    pub asks: Vec<BudgetAsk>,
    /// Newest audit record's sequence number (0: none) and hash.
    pub audit_seq: u64,
    /// SHA-256 of that record.
    pub audit_hash: Option<[u8; 32]>,
    /// The frontend's clock (unix ms) when sent.
    pub sent_ms: u64,
    /// How long its leases hold without another report (ms); 0 for the default.
    pub lease_ms: u64,
    /// Rate-limit positions.
    pub rate_asks: Vec<RateAsk>,
}

/// A project's budget as one frontend holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetGrant {
    /// Project.
    pub project: String,
    /// Start of the period (unix seconds).
    pub period_start: u64,
    /// When it resets (unix seconds).
    pub resets_at: u64,
    /// The budget.
    pub limit: u64,
    /// Used or held by all frontends.
    pub spent: u64,
    /// This frontend's cumulative allotment this period.
    pub allotment: u64,
}

/// The answer to a report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontendGrant {
    /// Applied index of the committed report.
    pub applied_index: u64,
    /// Budgets.
    pub grants: Vec<BudgetGrant>,
    /// Sequence slots of healthy, non-draining workers.
    pub capacity: u32,
    /// Sequences running.
    pub running: u32,
    /// Sequences waiting.
    pub waiting: u32,
    /// The Raft group has a leader.
    pub leader: bool,
    /// Rate-limit allotments.
    pub rate_grants: Vec<RateGrant>,
    /// The audit head committed for this frontend (sequence number, SHA-256); `None` when none is.
    pub audit_head: Option<(u64, [u8; 32])>,
}

impl FrontendReport {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::count("FrontendReport.usage", self.usage.len(), MAX_REPORT_ITEMS)?;
        check::count("FrontendReport.asks", self.asks.len(), MAX_REPORT_ITEMS)?;
        if self.report_seq == 0 {
            return Err(invalid("FrontendReport.report_seq", "starts at 1"));
        }
        for u in &self.usage {
            check::id("UsageDelta.key_id", &u.key_id)?;
            check::id("UsageDelta.project", &u.project)?;
            if u.hour % 3600 != 0 {
                return Err(invalid("UsageDelta.hour", "must be the start of an hour"));
            }
            if !u.adapter.is_empty() {
                check::id("UsageDelta.adapter", &u.adapter)?;
            }
            if u.adapter.is_empty() == u.adapter_sha256.is_some() {
                return Err(invalid("UsageDelta.adapter_sha256", "given exactly when adapter is"));
            }
        }
        for a in &self.asks {
            check::id("BudgetAsk.project", &a.project)?;
            if a.target < a.used {
                return Err(invalid("BudgetAsk.target", "below what was used"));
            }
        }
        check::count("FrontendReport.rate_asks", self.rate_asks.len(), MAX_REPORT_ITEMS)?;
        for a in &self.rate_asks {
            check::id("RateAsk.bucket", &a.bucket)?;
            if a.target < a.used {
                return Err(invalid("RateAsk.target", "below what was used"));
            }
        }
        if (self.audit_seq > 0) != self.audit_hash.is_some() {
            return Err(invalid("FrontendReport.audit_hash", "given exactly when audit_seq is above 0"));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::FrontendReport<'b>> {
        let usage: Vec<_> = self
            .usage
            .iter()
            .map(|u| {
                let key_id = fbb.create_string(&u.key_id);
                let project = fbb.create_string(&u.project);
                let adapter = (!u.adapter.is_empty()).then(|| fbb.create_string(&u.adapter));
                let adapter_sha256 = u.adapter_sha256.map(|h| fbb.create_vector(&h));
                fb::UsageDelta::create(
                    fbb,
                    &fb::UsageDeltaArgs {
                        hour: u.hour,
                        key_id: Some(key_id),
                        project: Some(project),
                        requests: u.requests,
                        input_tokens: u.input_tokens,
                        output_tokens: u.output_tokens,
                        milli_units: u.milli_units,
                        adapter,
                        adapter_sha256,
                    },
                )
            })
            .collect();
        let usage = fbb.create_vector(&usage);
        let asks: Vec<_> = self
            .asks
            .iter()
            .map(|a| {
                let project = fbb.create_string(&a.project);
                fb::BudgetAsk::create(
                    fbb,
                    &fb::BudgetAskArgs {
                        project: Some(project),
                        period_start: a.period_start,
                        used: a.used,
                        target: a.target,
                    },
                )
            })
            .collect();
        let asks = fbb.create_vector(&asks);
        let audit_hash = self.audit_hash.map(|h| fbb.create_vector(&h));
        let rate_asks: Vec<_> = self
            .rate_asks
            .iter()
            .map(|a| {
                let bucket = fbb.create_string(&a.bucket);
                fb::RateAsk::create(
                    fbb,
                    &fb::RateAskArgs { bucket: Some(bucket), per_minute: a.per_minute, used: a.used, target: a.target },
                )
            })
            .collect();
        let rate_asks = fbb.create_vector(&rate_asks);
        fb::FrontendReport::create(
            fbb,
            &fb::FrontendReportArgs {
                report_seq: self.report_seq,
                usage: Some(usage),
                asks: Some(asks),
                audit_seq: self.audit_seq,
                audit_hash,
                sent_ms: self.sent_ms,
                lease_ms: self.lease_ms,
                rate_asks: Some(rate_asks),
            },
        )
    }

    pub(crate) fn read(t: fb::FrontendReport<'_>) -> Result<Self, MessageError> {
        let usage = t.usage().unwrap_or_default();
        let asks = t.asks().unwrap_or_default();
        let rate_asks = t.rate_asks().unwrap_or_default();
        check::count("FrontendReport.usage", usage.len(), MAX_REPORT_ITEMS)?;
        check::count("FrontendReport.asks", asks.len(), MAX_REPORT_ITEMS)?;
        check::count("FrontendReport.rate_asks", rate_asks.len(), MAX_REPORT_ITEMS)?;
        let msg = FrontendReport {
            report_seq: t.report_seq(),
            usage: usage
                .iter()
                .map(|u| {
                    Ok(UsageDelta {
                        hour: u.hour(),
                        key_id: u.key_id().to_owned(),
                        project: u.project().to_owned(),
                        requests: u.requests(),
                        input_tokens: u.input_tokens(),
                        output_tokens: u.output_tokens(),
                        milli_units: u.milli_units(),
                        adapter: u.adapter().unwrap_or_default().to_owned(),
                        adapter_sha256: match u.adapter_sha256() {
                            None => None,
                            Some(h) => Some(check::sha256("UsageDelta.adapter_sha256", h.bytes())?),
                        },
                    })
                })
                .collect::<Result<_, MessageError>>()?,
            asks: asks
                .iter()
                .map(|a| BudgetAsk {
                    project: a.project().to_owned(),
                    period_start: a.period_start(),
                    used: a.used(),
                    target: a.target(),
                })
                .collect(),
            audit_seq: t.audit_seq(),
            audit_hash: match t.audit_hash() {
                None => None,
                Some(h) => Some(check::sha256("FrontendReport.audit_hash", h.bytes())?),
            },
            sent_ms: t.sent_ms(),
            lease_ms: t.lease_ms(),
            rate_asks: rate_asks
                .iter()
                .map(|a| RateAsk {
                    bucket: a.bucket().to_owned(),
                    per_minute: a.per_minute(),
                    used: a.used(),
                    target: a.target(),
                })
                .collect(),
        };
        msg.check()?;
        Ok(msg)
    }
}

impl FrontendGrant {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::count("FrontendGrant.grants", self.grants.len(), MAX_REPORT_ITEMS)?;
        check::count("FrontendGrant.rate_grants", self.rate_grants.len(), MAX_REPORT_ITEMS)?;
        self.rate_grants.iter().try_for_each(|g| check::id("RateGrant.bucket", &g.bucket))?;
        self.grants.iter().try_for_each(|g| check::id("BudgetGrant.project", &g.project))
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::FrontendGrant<'b>> {
        let grants: Vec<_> = self
            .grants
            .iter()
            .map(|g| {
                let project = fbb.create_string(&g.project);
                fb::BudgetGrant::create(
                    fbb,
                    &fb::BudgetGrantArgs {
                        project: Some(project),
                        period_start: g.period_start,
                        resets_at: g.resets_at,
                        limit: g.limit,
                        spent: g.spent,
                        allotment: g.allotment,
                    },
                )
            })
            .collect();
        let grants = fbb.create_vector(&grants);
        let rate_grants: Vec<_> = self
            .rate_grants
            .iter()
            .map(|g| {
                let bucket = fbb.create_string(&g.bucket);
                fb::RateGrant::create(
                    fbb,
                    &fb::RateGrantArgs { bucket: Some(bucket), allotment: g.allotment, available: g.available },
                )
            })
            .collect();
        let rate_grants = fbb.create_vector(&rate_grants);
        let audit_hash = self.audit_head.map(|(_, h)| fbb.create_vector(&h));
        fb::FrontendGrant::create(
            fbb,
            &fb::FrontendGrantArgs {
                applied_index: self.applied_index,
                grants: Some(grants),
                capacity: self.capacity,
                running: self.running,
                waiting: self.waiting,
                leader: self.leader,
                rate_grants: Some(rate_grants),
                audit_seq: self.audit_head.map_or(0, |(seq, _)| seq),
                audit_hash,
            },
        )
    }

    pub(crate) fn read(t: fb::FrontendGrant<'_>) -> Result<Self, MessageError> {
        let grants = t.grants().unwrap_or_default();
        let rate_grants = t.rate_grants().unwrap_or_default();
        check::count("FrontendGrant.grants", grants.len(), MAX_REPORT_ITEMS)?;
        check::count("FrontendGrant.rate_grants", rate_grants.len(), MAX_REPORT_ITEMS)?;
        let msg = FrontendGrant {
            applied_index: t.applied_index(),
            grants: grants
                .iter()
                .map(|g| BudgetGrant {
                    project: g.project().to_owned(),
                    period_start: g.period_start(),
                    resets_at: g.resets_at(),
                    limit: g.limit(),
                    spent: g.spent(),
                    allotment: g.allotment(),
                })
                .collect(),
            capacity: t.capacity(),
            running: t.running(),
            waiting: t.waiting(),
            leader: t.leader(),
            rate_grants: rate_grants
                .iter()
                .map(|g| RateGrant {
                    bucket: g.bucket().to_owned(),
                    allotment: g.allotment(),
                    available: g.available(),
                })
                .collect(),
            audit_head: match (t.audit_seq(), t.audit_hash()) {
                (0, None) => None,
                (seq, Some(h)) if seq > 0 => Some((seq, check::sha256("FrontendGrant.audit_hash", h.bytes())?)),
                _ => return Err(invalid("FrontendGrant.audit_hash", "given exactly when audit_seq is above 0")),
            },
        };
        msg.check()?;
        Ok(msg)
    }
}
