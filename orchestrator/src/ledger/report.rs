//! A frontend's report as the Raft log stores it: the ledger's own types, not the wire's.
//!
//! The wire's `FrontendReport` (zl-wire) evolves by the FlatBuffers rules of `schemas/README.md`; what is written
//! into the Raft log and its snapshots evolves by the persisted-state rules there ("The Raft log"): these structs'
//! JSON is read back by every later build, so a field keeps its name and meaning for ever, a new field comes with
//! `#[serde(default)]`, and none is removed while a log or snapshot may hold it. Keeping the two apart means a
//! wire change can never silently change what old logs decode to. [`ReportEntry::from`] is the one crossing.

use serde::{Deserialize, Serialize};
use zl_wire::message::{BudgetAsk, FrontendReport, RateAsk, UsageDelta};

/// Usage of one key in one hour since the frontend's last report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageEntry {
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
    /// The LoRA adapter the requests ran on (protocol 1.9; empty: the base, and absent from older entries).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub adapter: String,
    /// SHA-256 of the adapter's weights file, hex (empty exactly when `adapter` is).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub adapter_sha256: String,
}

/// A frontend's cumulative position in one project's budget period.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetPosition {
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RatePosition {
    /// What is limited (`key/<id>/requests`, ...).
    pub bucket: String,
    /// The limit per minute.
    pub per_minute: u64,
    /// Used by this frontend since it started using the bucket.
    pub used: u64,
    /// Allotment wanted (at least `used`).
    pub target: u64,
}

/// One frontend report, as committed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportEntry {
    /// From 1; a repeated number is applied once.
    pub report_seq: u64,
    /// Usage since the last report.
    pub usage: Vec<UsageEntry>,
    /// Budget positions.
    pub asks: Vec<BudgetPosition>,
    /// Newest audit record's sequence number (0: none).
    pub audit_seq: u64,
    /// SHA-256 of that record.
    pub audit_hash: Option<[u8; 32]>,
    /// The frontend's clock (unix ms) when sent.
    pub sent_ms: u64,
    /// How long its leases hold without another report (ms); 0 for the default.
    pub lease_ms: u64,
    /// Rate-limit positions (added with protocol 1.2's shared rate limits: absent in older entries).
    #[serde(default)]
    pub rate_asks: Vec<RatePosition>,
}

impl From<FrontendReport> for ReportEntry {
    fn from(r: FrontendReport) -> Self {
        let FrontendReport { report_seq, usage, asks, audit_seq, audit_hash, sent_ms, lease_ms, rate_asks } = r;
        ReportEntry {
            report_seq,
            usage: usage.into_iter().map(UsageEntry::from).collect(),
            asks: asks.into_iter().map(BudgetPosition::from).collect(),
            audit_seq,
            audit_hash,
            sent_ms,
            lease_ms,
            rate_asks: rate_asks.into_iter().map(RatePosition::from).collect(),
        }
    }
}

impl From<UsageDelta> for UsageEntry {
    fn from(u: UsageDelta) -> Self {
        let UsageDelta {
            hour,
            key_id,
            project,
            requests,
            input_tokens,
            output_tokens,
            milli_units,
            adapter,
            adapter_sha256,
        } = u;
        let adapter_sha256 = adapter_sha256.map(|h| zl_common::keys::hex(&h)).unwrap_or_default();
        UsageEntry {
            hour,
            key_id,
            project,
            requests,
            input_tokens,
            output_tokens,
            milli_units,
            adapter,
            adapter_sha256,
        }
    }
}

impl From<BudgetAsk> for BudgetPosition {
    fn from(a: BudgetAsk) -> Self {
        let BudgetAsk { project, period_start, used, target } = a;
        BudgetPosition { project, period_start, used, target }
    }
}

impl From<RateAsk> for RatePosition {
    fn from(a: RateAsk) -> Self {
        let RateAsk { bucket, per_minute, used, target } = a;
        RatePosition { bucket, per_minute, used, target }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// An entry written by the build before this type existed (the wire struct's serde form, before rate limits
    /// were shared) still decodes, and today's form is the same JSON: the log's bytes did not change.
    #[test]
    fn committed_reports_keep_their_json() {
        let old = r#"{"report_seq":3,"usage":[{"hour":3600,"key_id":"k1","project":"p","requests":2,"input_tokens":10,"output_tokens":5,"milli_units":700}],"asks":[{"project":"p","period_start":0,"used":15,"target":100}],"audit_seq":9,"audit_hash":null,"sent_ms":1234,"lease_ms":0}"#;
        let entry: ReportEntry = serde_json::from_str(old).unwrap();
        assert_eq!(entry.usage[0].milli_units, 700);
        assert!(entry.rate_asks.is_empty());
        let wire = FrontendReport {
            report_seq: 3,
            usage: vec![UsageDelta {
                hour: 3600,
                key_id: "k1".into(),
                project: "p".into(),
                requests: 2,
                input_tokens: 10,
                output_tokens: 5,
                milli_units: 700,
                ..UsageDelta::default()
            }],
            asks: vec![BudgetAsk { project: "p".into(), period_start: 0, used: 15, target: 100 }],
            audit_seq: 9,
            audit_hash: None,
            sent_ms: 1234,
            lease_ms: 0,
            rate_asks: vec![RateAsk { bucket: "key/k1/requests".into(), per_minute: 60, used: 1, target: 4 }],
        };
        let json = serde_json::to_string(&ReportEntry::from(wire)).unwrap();
        assert_eq!(
            json,
            old.replace(
                r#""lease_ms":0}"#,
                r#""lease_ms":0,"rate_asks":[{"bucket":"key/k1/requests","per_minute":60,"used":1,"target":4}]}"#
            )
        );
    }
}
