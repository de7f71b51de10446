//! `zl admin usage`, `budget`, `priority`, `content-logging` and `audit-reset`: the ledger part of the admin API.

use anyhow::{Result, bail};
use zl_admin::pb;
use zl_admin::pb::admin_client::AdminClient;

use zl_common::calendar::rfc3339;

use super::{AdminCommand, call, written};

type Client = AdminClient<tonic::transport::Channel>;

/// Run `command` if it is a ledger command (`Some`), else leave it (`None`).
pub(crate) async fn run(c: &mut Client, command: &AdminCommand) -> Result<Option<()>> {
    match command {
        AdminCommand::Usage { hours, project, json } => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
            let since = now.saturating_sub(hours * 3600);
            let r = c
                .get_usage(pb::GetUsageRequest { since, project: project.clone().unwrap_or_default() })
                .await
                .map_err(call)?
                .into_inner();
            if *json {
                let rows: Vec<_> = r
                    .rows
                    .iter()
                    .map(|u| {
                        serde_json::json!({"hour": u.hour, "hour_utc": rfc3339(u.hour), "project": u.project,
                            "key_id": u.key_id,
                            "requests": u.requests, "input_tokens": u.input_tokens,
                            "output_tokens": u.output_tokens, "units": u.units})
                    })
                    .collect();
                let budgets: Vec<_> = r
                    .budgets
                    .iter()
                    .map(|b| {
                        serde_json::json!({"project": b.project, "metric": b.metric, "period": b.period,
                            "limit": b.limit, "spent": b.spent, "committed": b.committed,
                            "period_start": b.period_start, "period_start_utc": rfc3339(b.period_start),
                            "resets_at": b.resets_at, "resets_at_utc": rfc3339(b.resets_at)})
                    })
                    .collect();
                let adapters: Vec<_> = r
                    .adapters
                    .iter()
                    .map(|u| {
                        serde_json::json!({"hour": u.hour, "hour_utc": rfc3339(u.hour), "project": u.project,
                            "adapter": u.adapter, "sha256": u.sha256,
                            "requests": u.requests, "input_tokens": u.input_tokens,
                            "output_tokens": u.output_tokens, "units": u.units})
                    })
                    .collect();
                println!("{}", serde_json::json!({"usage": rows, "budgets": budgets, "adapters": adapters}));
                return Ok(Some(()));
            }
            println!(
                "{:<20} {:<16} {:<16} {:>9} {:>12} {:>12} {:>10}",
                "HOUR (UTC)", "PROJECT", "KEY", "REQUESTS", "INPUT TOK", "OUTPUT TOK", "UNITS"
            );
            for u in &r.rows {
                println!(
                    "{:<20} {:<16} {:<16} {:>9} {:>12} {:>12} {:>10.3}",
                    rfc3339(u.hour),
                    u.project,
                    u.key_id,
                    u.requests,
                    u.input_tokens,
                    u.output_tokens,
                    u.units
                );
            }
            if !r.adapters.is_empty() {
                println!(
                    "\n{:<20} {:<16} {:<24} {:<14} {:>9} {:>12} {:>12} {:>10}",
                    "HOUR (UTC)", "PROJECT", "ADAPTER", "SHA-256", "REQUESTS", "INPUT TOK", "OUTPUT TOK", "UNITS"
                );
            }
            for u in &r.adapters {
                println!(
                    "{:<20} {:<16} {:<24} {:<14} {:>9} {:>12} {:>12} {:>10.3}",
                    rfc3339(u.hour),
                    u.project,
                    u.adapter,
                    format!("{}...", &u.sha256[..u.sha256.len().min(12)]),
                    u.requests,
                    u.input_tokens,
                    u.output_tokens,
                    u.units
                );
            }
            for b in &r.budgets {
                println!(
                    "budget {}: {} {} per {}; spent {}, leased {} (resets at {}, unix time {})",
                    b.project,
                    b.limit,
                    b.metric,
                    b.period,
                    b.spent,
                    b.committed - b.spent,
                    rfc3339(b.resets_at),
                    b.resets_at
                );
            }
        }
        AdminCommand::Budget { project, metric, period, limit } => written(
            &format!("budget of {project} set"),
            c.set_budget(pb::SetBudgetRequest {
                project: project.clone(),
                metric: metric.clone(),
                period: period.clone(),
                limit: *limit,
            })
            .await
            .map_err(call)?
            .into_inner(),
        ),
        AdminCommand::Priority { project, class } => written(
            &format!("{project} is priority class {class}"),
            c.set_priority(pb::SetPriorityRequest { project: project.clone(), class: class.clone() })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        AdminCommand::ContentLogging { project, action } => {
            let enabled = match action.as_str() {
                "on" => true,
                "shred" => false,
                other => bail!("{other:?}: use on or shred"),
            };
            let what = if enabled { "content logging on" } else { "content key shredded; content logging off" };
            written(
                &format!("{project}: {what}"),
                c.set_content_logging(pb::SetContentLoggingRequest { project: project.clone(), enabled })
                    .await
                    .map_err(call)?
                    .into_inner(),
            );
        }
        AdminCommand::AuditReset { frontend } => written(
            &format!("the audit head of {frontend} is reset: its next report starts a new chain"),
            c.reset_audit_head(pb::ResetAuditHeadRequest { frontend: frontend.clone() })
                .await
                .map_err(call)?
                .into_inner(),
        ),
        _ => return Ok(None),
    }
    Ok(Some(()))
}
