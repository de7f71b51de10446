//! `zl audit verify` and `zl audit export`: check audit chains (against the heads the frontends committed to the
//! orchestrators) and write records as JSON lines, decrypting logged content with the project's data key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use zl_admin::pb;
use zl_common::audit::{AuditRecord, ChainHead, SealError};

use crate::admin::{Conn, call, connect};

/// Audit logs.
#[derive(Args, Debug)]
pub(crate) struct AuditArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum AuditCommand {
    /// Check chains: every record's hash and link, and (unless --offline) that each chain still reaches the head
    /// its frontend committed to the orchestrators. Names the first bad record; exits 1 if any chain is bad.
    Verify {
        /// Chain directories (a frontend's --audit-dir), or directories holding them.
        dirs: Vec<PathBuf>,
        /// Do not ask the orchestrators for the committed heads (truncation then goes unnoticed).
        #[arg(long)]
        offline: bool,
        /// Accept chains whose oldest segments retention removed.
        #[arg(long)]
        allow_pruned: bool,
    },
    /// Write verified records as JSON lines.
    Export {
        /// Chain directories, or directories holding them.
        dirs: Vec<PathBuf>,
        /// Only records from this time: unix seconds, YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ.
        #[arg(long)]
        since: Option<String>,
        /// Only this project's records.
        #[arg(long)]
        project: Option<String>,
        /// Decrypt logged content with the project's data key (asked of the orchestrators).
        #[arg(long)]
        decrypt: bool,
    },
}

/// The chain directories under `dirs`: each that holds segments, and each child that does.
fn chains(dirs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for dir in dirs {
        let holds = |d: &Path| zl_node::audit::segments(d).is_ok_and(|s| !s.is_empty());
        if holds(dir) {
            found.push(dir.clone());
            continue;
        }
        let mut children: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir() && holds(p))
            .collect();
        children.sort();
        if children.is_empty() {
            bail!("{} holds no audit segments", dir.display());
        }
        found.extend(children);
    }
    Ok(found)
}

/// The frontend a chain belongs to (from its first record).
fn frontend_of(dir: &Path) -> Option<String> {
    let (_, first) = zl_node::audit::segments(dir).ok()?.into_iter().next()?;
    let text = std::fs::read(first).ok()?;
    let line = text.split(|&b| b == b'\n').next()?;
    zl_common::audit::decode_line(line).ok().map(|(_, r)| r.frontend)
}

async fn run_async(args: AuditArgs) -> Result<()> {
    match args.command {
        AuditCommand::Verify { dirs, offline, allow_pruned } => {
            let heads: BTreeMap<String, ChainHead> = if offline {
                BTreeMap::new()
            } else {
                let (mut c, ..) = connect(&args.conn).await?;
                let r = c.list_audit_heads(pb::ListAuditHeadsRequest {}).await.map_err(call)?.into_inner();
                r.heads.into_iter().map(|h| (h.frontend, ChainHead { seq: h.seq, hash: h.hash })).collect()
            };
            let mut bad = 0;
            let mut seen = Vec::new();
            for dir in chains(&dirs)? {
                let frontend = frontend_of(&dir).unwrap_or_default();
                let head = heads.get(&frontend).cloned();
                seen.push(frontend.clone());
                match zl_node::audit::verify_dir(&dir, head.clone(), allow_pruned, |_| {}) {
                    Ok(s) => {
                        let against = match (&head, offline) {
                            (_, true) => "not checked against a committed head (--offline)".to_owned(),
                            (Some(h), false) => format!("reaches the committed head, record {}", h.seq),
                            (None, false) => "no head committed for it".to_owned(),
                        };
                        println!(
                            "ok: {} (frontend {}): records {}..{}, {against}",
                            dir.display(),
                            s.frontend,
                            s.first_seq,
                            s.head.seq
                        );
                    }
                    Err(e) => {
                        bad += 1;
                        println!("FAILED: {} (frontend {frontend}): {e}", dir.display());
                    }
                }
            }
            for missing in heads.keys().filter(|f| !seen.contains(f)) {
                eprintln!(
                    "note: frontend {missing} committed a head, but its chain was not among the directories given"
                );
            }
            if bad > 0 {
                bail!("{bad} audit chain(s) failed verification");
            }
        }
        AuditCommand::Export { dirs, since, project, decrypt } => {
            let since_ms = match since {
                None => 0,
                Some(s) => {
                    zl_common::calendar::parse_time(&s).with_context(|| format!("--since {s:?}: not a date"))? * 1000
                }
            };
            let mut keys: BTreeMap<String, pb::GetDataKeysResponse> = BTreeMap::new();
            let mut client = if decrypt { Some(connect(&args.conn).await?.0) } else { None };
            for dir in chains(&dirs)? {
                let mut records: Vec<AuditRecord> = Vec::new();
                zl_node::audit::verify_dir(&dir, None, true, |r| {
                    if r.time_ms >= since_ms && project.as_ref().is_none_or(|p| *p == r.project) {
                        records.push(r.clone());
                    }
                })
                .with_context(|| format!("{} does not verify; run zl audit verify", dir.display()))?;
                for r in records {
                    let mut line = serde_json::to_value(&r)?;
                    if let (Some(c), Some(sealed)) = (client.as_mut(), &r.payload) {
                        if !keys.contains_key(&r.project) {
                            let k = c
                                .get_data_keys(pb::GetDataKeysRequest { project: r.project.clone() })
                                .await
                                .map_err(call)?
                                .into_inner();
                            keys.insert(r.project.clone(), k);
                        }
                        let k = &keys[&r.project];
                        line["content"] = if k.key_id == sealed.key_id {
                            let key = zl_common::keys::parse_hex32(&k.key).context("a data key is not 32 hex bytes")?;
                            match zl_common::audit::open(sealed, &key, &r.request_id) {
                                Ok(p) => serde_json::to_value(p)?,
                                Err(SealError::Open | SealError::BadKey) => {
                                    serde_json::json!({"error": "the payload does not open with the project's key"})
                                }
                            }
                        } else if k.shredded_key_ids.contains(&sealed.key_id) {
                            serde_json::json!({"error": format!("unreadable: data key {} was shredded", sealed.key_id)})
                        } else {
                            serde_json::json!({"error": format!("data key {} is unknown", sealed.key_id)})
                        };
                    }
                    println!("{line}");
                }
            }
        }
    }
    Ok(())
}

/// Run one audit command.
pub(crate) fn run(args: AuditArgs) -> Result<()> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run_async(args))
}
