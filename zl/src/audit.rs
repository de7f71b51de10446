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
    /// its frontend committed to the orchestrators, that no orchestrator refused a head contradicting it, that
    /// the orchestrators know every chain's frontend, and that every committed head's chain was given. Names the
    /// first bad record; exits 1 if anything is wrong.
    Verify {
        /// Chain directories (a frontend's --audit-dir), or directories holding them. None: the local cluster's
        /// (`zl up`'s audit directory, from its cluster.json). Finding no chain at all is a failure.
        dirs: Vec<PathBuf>,
        #[command(flatten)]
        checks: HeadChecks,
    },
    /// Write verified records as JSON lines, after the same checks as `verify`.
    Export {
        /// Chain directories, or directories holding them. None: the local cluster's.
        dirs: Vec<PathBuf>,
        #[command(flatten)]
        checks: HeadChecks,
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

/// How chains are checked against the heads the orchestrators committed.
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct HeadChecks {
    /// Do not ask the orchestrators for the committed heads (truncation, rewriting and unknown chains then go
    /// unnoticed).
    #[arg(long)]
    offline: bool,
    /// Accept chains whose oldest segments retention removed.
    #[arg(long)]
    allow_pruned: bool,
    /// Accept chains of frontends no orchestrator holds a head for (the state was rebuilt; otherwise such a
    /// chain is a renamed or invented one).
    #[arg(long)]
    allow_uncommitted: bool,
    /// Accept committed heads whose chains were not given (their directories were removed on purpose).
    #[arg(long)]
    allow_missing: bool,
}

/// A chain whose first record is younger than this, with no head committed, is taken for one not yet reported.
const YOUNG_CHAIN_S: u64 = 120;

/// What the orchestrators hold for one frontend.
#[derive(Debug, Default)]
struct Committed {
    /// The newest head (none right after an operator's reset).
    head: Option<ChainHead>,
    /// Heads refused because they contradicted the chain: count, and the last one.
    refused: Option<(u64, ChainHead)>,
}

async fn committed_heads(conn: &Conn) -> Result<BTreeMap<String, Committed>> {
    let (mut c, ..) = connect(conn).await?;
    let r = c.list_audit_heads(pb::ListAuditHeadsRequest {}).await.map_err(call)?.into_inner();
    Ok(r.heads
        .into_iter()
        .map(|h| {
            let committed = Committed {
                head: (h.seq > 0).then_some(ChainHead { seq: h.seq, hash: h.hash }),
                refused: (h.refused_count > 0)
                    .then_some((h.refused_count, ChainHead { seq: h.refused_seq, hash: h.refused_hash })),
            };
            (h.frontend, committed)
        })
        .collect())
}

/// Check every chain under `dirs` (calling `each` with each record of a good one) and return how many problems
/// there were. `verbose` (verify) prints a line per chain and per problem on stdout; otherwise (export, whose
/// stdout is the records) only the problems, on stderr.
async fn check_chains(
    conn: &Conn,
    dirs: &[PathBuf],
    checks: HeadChecks,
    verbose: bool,
    mut each: impl FnMut(&AuditRecord),
) -> Result<usize> {
    let say = |line: String| {
        if verbose {
            println!("{line}");
        } else if !line.starts_with("ok:") {
            eprintln!("{line}");
        }
    };
    let heads = if checks.offline { BTreeMap::new() } else { committed_heads(conn).await? };
    let mut bad = 0;
    let mut seen = Vec::new();
    let found = chains(dirs)?;
    if found.is_empty() {
        // Having verified nothing proves nothing.
        bad += 1;
        let given = dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ");
        say(format!(
            "FAILED: no audit chain under {given}: give a frontend's --audit-dir, or a directory holding them"
        ));
    }
    for dir in found {
        let frontend = frontend_of(&dir).unwrap_or_default();
        seen.push(frontend.clone());
        let committed = heads.get(&frontend);
        if let Some((count, last)) = committed.and_then(|c| c.refused.as_ref()) {
            bad += 1;
            say(format!(
                "FAILED: {} (frontend {frontend}): the orchestrators refused {count} head(s) reported for this \
                 frontend that contradict its committed chain (the last: record {}, hash {:.16}…): the chain was \
                 rewritten or lost, or another process speaks for this frontend",
                dir.display(),
                last.seq,
                last.hash
            ));
            continue;
        }
        if !checks.offline && committed.is_none() && !checks.allow_uncommitted {
            bad += 1;
            // A chain begun moments ago is committed with its frontend's next report: say so rather than call it
            // invented.
            let mut first_ms = None;
            let _ = zl_node::audit::verify_dir(&dir, None, true, |r| {
                first_ms.get_or_insert(r.time_ms);
            });
            let age_s = first_ms.map(|t| zl_common::calendar::unix_ms().saturating_sub(t) / 1000);
            match age_s {
                Some(age) if age < YOUNG_CHAIN_S => say(format!(
                    "FAILED: {} (frontend {frontend:?}): no orchestrator holds a head for this frontend yet: the \
                     chain began {age} s ago, and its frontend commits it with its next report (at once for a new \
                     chain, while the orchestrators answer): run verify again; if this persists, it is a renamed \
                     or invented chain",
                    dir.display()
                )),
                _ => say(format!(
                    "FAILED: {} (frontend {frontend:?}): no orchestrator holds a head for this frontend: a renamed or \
                     invented chain (pass --allow-uncommitted if the orchestrators' state was rebuilt)",
                    dir.display()
                )),
            }
            continue;
        }
        let head = committed.and_then(|c| c.head.clone());
        let mut records = Vec::new();
        match zl_node::audit::verify_dir(&dir, head.clone(), checks.allow_pruned, |r| records.push(r.clone())) {
            Ok(s) => {
                let against = match (committed, &head) {
                    (_, _) if checks.offline => "not checked against a committed head (--offline)".to_owned(),
                    // Records after the committed head are proven with the next report's head: until then their
                    // removal (a truncation back to the head) cannot be told from their absence.
                    (_, Some(h)) if s.head.seq > h.seq => format!(
                        "reaches the committed head, record {}; records {}..{} are not committed yet (the next \
                         report commits them: until then removing them would go unnoticed)",
                        h.seq,
                        h.seq + 1,
                        s.head.seq
                    ),
                    (_, Some(h)) => format!("reaches the committed head, record {}", h.seq),
                    (Some(_), None) => "its head was reset by an operator and not reported since".to_owned(),
                    (None, None) => "no head committed for it (--allow-uncommitted)".to_owned(),
                };
                say(format!(
                    "ok: {} (frontend {}): records {}..{}, {against}",
                    dir.display(),
                    s.frontend,
                    s.first_seq,
                    s.head.seq
                ));
                records.iter().for_each(&mut each);
            }
            Err(e) => {
                bad += 1;
                say(format!("FAILED: {} (frontend {frontend}): {e}", dir.display()));
            }
        }
    }
    for missing in heads.iter().filter(|(f, c)| c.head.is_some() && !seen.contains(f)).map(|(f, _)| f) {
        if checks.allow_missing {
            say(format!(
                "note: frontend {missing} committed a head, but its chain was not among the directories given"
            ));
        } else {
            bad += 1;
            say(format!(
                "FAILED: frontend {missing} committed a head, but its chain was not among the directories given: \
                 a removed chain (pass --allow-missing if it was removed on purpose, or give its directory)"
            ));
        }
    }
    Ok(bad)
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

/// The directories given, or the local cluster's audit directory when none was.
fn dirs_or_local(conn: &Conn, dirs: Vec<PathBuf>) -> Result<Vec<PathBuf>> {
    if !dirs.is_empty() {
        return Ok(dirs);
    }
    let local = crate::local::LocalCluster::read(conn.data_dir.as_deref());
    Ok(vec![PathBuf::from(local.pick(None, "audit_dir", "chain directory (DIRS)")?)])
}

async fn run_async(args: AuditArgs) -> Result<()> {
    match args.command {
        AuditCommand::Verify { dirs, checks } => {
            let dirs = dirs_or_local(&args.conn, dirs)?;
            let bad = check_chains(&args.conn, &dirs, checks, true, |_| {}).await?;
            if bad > 0 {
                bail!("{bad} audit problem(s) found");
            }
        }
        AuditCommand::Export { dirs, checks, since, project, decrypt } => {
            let dirs = dirs_or_local(&args.conn, dirs)?;
            let since_ms = match since {
                None => 0,
                Some(s) => {
                    zl_common::calendar::parse_time(&s).with_context(|| format!("--since {s:?}: not a date"))? * 1000
                }
            };
            let mut keys: BTreeMap<String, pb::GetDataKeysResponse> = BTreeMap::new();
            let mut client = if decrypt { Some(connect(&args.conn).await?.0) } else { None };
            let mut records: Vec<AuditRecord> = Vec::new();
            let bad = check_chains(&args.conn, &dirs, checks, false, |r| {
                if r.time_ms >= since_ms && project.as_ref().is_none_or(|p| *p == r.project) {
                    records.push(r.clone());
                }
            })
            .await?;
            if bad > 0 {
                bail!("{bad} audit problem(s) found: nothing is exported (see zl audit verify)");
            }
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
    Ok(())
}

/// Run one audit command.
pub(crate) fn run(args: AuditArgs) -> Result<()> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run_async(args))
}
