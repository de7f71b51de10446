//! The admin API's ledger methods (budgets, priority classes, content logging, usage, audit heads, data keys):
//! request checking and answers, for [`super::admin::AdminService`].

use tonic::Status;
use zl_admin::pb;

use crate::ledger::{BudgetSpec, DataKey, Ledger};
use crate::state::Command;

/// Billing units are counted in thousandths.
const MILLI: f64 = 1000.0;

/// The command for a `SetBudget` request.
pub fn set_budget(r: pb::SetBudgetRequest) -> Result<Command, Status> {
    if !r.limit.is_finite() || r.limit < 0.0 {
        return Err(Status::invalid_argument("limit must be a finite number, at least 0"));
    }
    if r.limit == 0.0 {
        return Ok(Command::SetBudget { project: r.project, budget: None });
    }
    let tokens = match r.metric.as_str() {
        "tokens" => true,
        "units" => false,
        other => return Err(Status::invalid_argument(format!("metric {other:?}: use \"tokens\" or \"units\""))),
    };
    let monthly = match r.period.as_str() {
        "month" => true,
        "day" => false,
        other => return Err(Status::invalid_argument(format!("period {other:?}: use \"day\" or \"month\""))),
    };
    let limit = if tokens { r.limit.round() } else { (r.limit * MILLI).round() };
    if !(1.0..=1e18).contains(&limit) {
        return Err(Status::invalid_argument("limit out of range"));
    }
    Ok(Command::SetBudget { project: r.project, budget: Some(BudgetSpec { tokens, monthly, limit: limit as u64 }) })
}

/// The command for a `SetPriority` request.
pub fn set_priority(r: pb::SetPriorityRequest) -> Result<Command, Status> {
    let class = match r.class.as_str() {
        "high" => 0,
        "normal" => 1,
        "low" => 2,
        other => return Err(Status::invalid_argument(format!("class {other:?}: use high, normal or low"))),
    };
    Ok(Command::SetPriority { project: r.project, class })
}

/// The command for a `SetContentLogging` request; `existing` is the project's key, if it has one.
pub fn set_content_logging(r: pb::SetContentLoggingRequest, existing: bool) -> Result<Option<Command>, Status> {
    if !r.enabled {
        return Ok(Some(Command::ShredDataKey { project: r.project }));
    }
    if existing {
        return Ok(None);
    }
    let mut key = [0u8; 32];
    let mut id = [0u8; 8];
    let rng = ring::rand::SystemRandom::new();
    for buf in [&mut key[..], &mut id[..]] {
        ring::rand::SecureRandom::fill(&rng, buf).map_err(|_| Status::internal("no randomness available"))?;
    }
    let key = DataKey { key_id: format!("dk_{}", crate::state::hex(&id)), key: crate::state::hex(&key) };
    Ok(Some(Command::SetDataKey { project: r.project, key }))
}

fn metric_figure(spec: &BudgetSpec, v: u64) -> f64 {
    if spec.tokens { v as f64 } else { v as f64 / MILLI }
}

/// The `GetUsage` answer.
pub fn usage(ledger: &Ledger, r: &pb::GetUsageRequest, now_s: u64) -> pb::GetUsageResponse {
    let project = (!r.project.is_empty()).then_some(r.project.as_str());
    let rows = ledger
        .usage_rows(r.since, project)
        .into_iter()
        .map(|(hour, p, k, u)| pb::UsageRow {
            hour,
            project: p.to_owned(),
            key_id: k.to_owned(),
            requests: u.requests,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            units: u.milli_units as f64 / MILLI,
        })
        .collect();
    let adapters = ledger
        .adapter_usage_rows(r.since, project)
        .into_iter()
        .map(|(hour, p, adapter, sha, u)| pb::AdapterUsageRow {
            hour,
            project: p.to_owned(),
            adapter: adapter.to_owned(),
            sha256: sha.to_owned(),
            requests: u.requests,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            units: u.milli_units as f64 / MILLI,
        })
        .collect();
    let budgets = ledger
        .budgets
        .iter()
        .filter(|(p, _)| project.is_none_or(|want| want == p.as_str()))
        .map(|(p, spec)| {
            let (start, end) = spec.period(now_s);
            let period = ledger.periods.get(p).filter(|x| x.start == start);
            pb::BudgetInfo {
                project: p.clone(),
                metric: if spec.tokens { "tokens" } else { "units" }.into(),
                period: if spec.monthly { "month" } else { "day" }.into(),
                limit: metric_figure(spec, spec.limit),
                spent: metric_figure(spec, period.map_or(0, |x| x.spent())),
                committed: metric_figure(spec, period.map_or(0, |x| x.committed())),
                period_start: start,
                resets_at: end,
            }
        })
        .collect();
    pb::GetUsageResponse { rows, budgets, adapters }
}

/// The `ListAuditHeads` answer.
pub fn audit_heads(ledger: &Ledger) -> pb::ListAuditHeadsResponse {
    let frontends: std::collections::BTreeSet<&String> =
        ledger.heads.keys().chain(ledger.head_records.keys()).collect();
    let heads = frontends
        .into_iter()
        .map(|f| {
            let (current, records) = (ledger.heads.get(f), ledger.head_records.get(f));
            let refused = records.and_then(|r| r.refused.clone()).unwrap_or_default();
            pb::AuditHead {
                frontend: f.clone(),
                seq: current.map_or(0, |h| h.head.seq),
                hash: current.map(|h| h.head.hash.clone()).unwrap_or_default(),
                committed_at_ms: current.map_or(0, |h| h.at_ms),
                refused_count: refused.count,
                refused_seq: refused.last.seq,
                refused_hash: refused.last.hash,
                resets: records.map_or(0, |r| r.resets.len() as u64),
            }
        })
        .collect();
    pb::ListAuditHeadsResponse { heads }
}

/// The `GetDataKeys` answer.
pub fn data_keys(ledger: &Ledger, project: &str) -> pb::GetDataKeysResponse {
    let key = ledger.data_keys.get(project);
    pb::GetDataKeysResponse {
        key_id: key.map(|k| k.key_id.clone()).unwrap_or_default(),
        key: key.map(|k| k.key.clone()).unwrap_or_default(),
        shredded_key_ids: ledger.shredded.get(project).cloned().unwrap_or_default(),
    }
}
