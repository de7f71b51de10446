//! What `zl up` keeps in its data dir from one run to the next: the cluster CA and the key pepper (`tls/`), the
//! orchestrators' Raft logs and snapshots (`orchestrator-N/`: projects, keys, budgets, usage, audit heads), the
//! audit chain (`audit/`) and `up.json` (the API key it printed, the size of its Raft group). A restart resumes
//! all of it; `zl up --fresh` (or a data dir without `up.json`) starts a new cluster there.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use zl_tls::ClusterCa;

/// The file naming what a data dir's cluster is.
const UP_FILE: &str = "up.json";
/// Locked while a `zl up` runs on the data dir: a second one would share its Raft logs.
const LOCK_FILE: &str = "up.lock";
/// Days the local CA (and each node certificate) is valid; renewed on a start when a third of that is left.
pub(crate) const CERT_DAYS: u32 = 30;

/// `up.json`: what a restart needs beyond the Raft logs and the certificates.
#[derive(Debug, Clone, PartialEq)]
struct UpFile {
    /// The API key of the `local` key of the `default` project, as the banner printed it.
    api_key: String,
    /// The Raft group's size: a kept group restarts only with the same voters.
    orchestrators: usize,
    /// When this cluster was first started (RFC 3339).
    created: String,
}

impl UpFile {
    fn to_json(&self) -> String {
        let v = serde_json::json!({
            "api_key": self.api_key, "orchestrators": self.orchestrators, "created": self.created,
        });
        serde_json::to_string_pretty(&v).unwrap_or_default()
    }

    fn parse(text: &str) -> Option<UpFile> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        Some(UpFile {
            api_key: v["api_key"].as_str().filter(|k| !k.is_empty())?.to_owned(),
            orchestrators: usize::try_from(v["orchestrators"].as_u64()?).ok()?,
            created: v["created"].as_str()?.to_owned(),
        })
    }
}

/// A data dir's cluster, ready to start: new or as the last run left it.
pub(crate) struct Kept {
    pub ca: ClusterCa,
    /// The API key the `local` key gets (the one given, else the kept one, else a new one).
    pub api_key: String,
    /// The file the orchestrators and the frontend read the key pepper from.
    pub pepper: PathBuf,
    /// When the kept cluster was created; `None` for a new one.
    pub resumed_from: Option<String>,
    /// Whether a kept CA was renewed on this start.
    pub ca_renewed: bool,
    /// Held (locked) for as long as this start runs; the OS releases it when the process ends, however it ends.
    _lock: fs::File,
}

impl Kept {
    /// The banner's line on the cluster's state.
    pub(crate) fn describe(&self, data: &Path) -> String {
        match &self.resumed_from {
            Some(created) => format!(
                "kept in {} (created {created}; projects, keys, budgets and usage as the last run left them; \
                 `zl up --fresh` starts over)",
                data.display()
            ),
            None => format!("new, kept in {} across restarts (`zl up --fresh` starts over)", data.display()),
        }
    }
}

/// The parts of `data` a new cluster replaces: certificates, Raft state, the audit chain, the workers' KV disk
/// tiers (a new cluster's project of an old one's name must not find its blocks) and `up.json` (logs stay).
fn clear(data: &Path) -> Result<()> {
    let mut doomed = vec![data.join("tls"), data.join("audit"), data.join("kv"), data.join(UP_FILE)];
    for entry in fs::read_dir(data).with_context(|| format!("reading {}", data.display()))?.flatten() {
        if entry.file_name().to_string_lossy().starts_with("orchestrator-") {
            doomed.push(entry.path());
        }
    }
    for path in doomed {
        let gone = if path.is_dir() { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        match gone {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("clearing {}", path.display())),
        }
    }
    Ok(())
}

/// The kept cluster in `data`, if `up.json` and the certificates it needs are there; an error when they are there
/// but unusable (a damaged file, another group size), since starting over would silently drop its state.
fn read_kept(data: &Path, orchestrators: usize) -> Result<Option<(UpFile, ClusterCa)>> {
    let path = data.join(UP_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let fresh_hint = "`zl up --fresh` starts a new cluster there, dropping its projects, keys and usage";
    let up = UpFile::parse(&text).with_context(|| format!("{} is damaged ({fresh_hint})", path.display()))?;
    if up.orchestrators != orchestrators {
        bail!(
            "{} holds a cluster of {} orchestrator(s), whose Raft state needs the same voters: start it with \
             --orchestrators {}, or {fresh_hint}",
            data.display(),
            up.orchestrators,
            up.orchestrators
        );
    }
    let tls = data.join("tls");
    let read = |name: &str| {
        fs::read_to_string(tls.join(name))
            .with_context(|| format!("reading {} ({fresh_hint})", tls.join(name).display()))
    };
    let ca = ClusterCa::from_pem(&read("ca.pem")?, &read("ca.key")?)
        .map_err(|e| anyhow::anyhow!("{}: {e} ({fresh_hint})", tls.join("ca.pem").display()))?;
    read("key-pepper")?;
    Ok(Some((up, ca)))
}

/// Whether a CA certificate should be replaced now: a third of its lifetime or less left, or unreadable.
fn due(ca: &ClusterCa) -> bool {
    let now_ms = zl_common::calendar::unix_ms();
    zl_tls::enroll::validity_ms(ca.cert_pem()).is_none_or(|v| zl_tls::enroll::due_for_renewal(v, now_ms))
}

/// Prepare `data` for a start: resume the cluster kept there (unless `fresh`), or make a new one. `api_key` is the
/// one given on the command line; `new_secret` makes secrets (the API key, the pepper).
pub(crate) fn prepare(
    data: &Path,
    fresh: bool,
    orchestrators: usize,
    api_key: Option<&str>,
    new_secret: impl Fn() -> Result<String>,
) -> Result<Kept> {
    fs::create_dir_all(data).with_context(|| format!("creating {}", data.display()))?;
    let lock_path = data.join(LOCK_FILE);
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => bail!(
            "another `zl up` is running on {} (it holds {}): stop it first, or give this one another --data-dir",
            data.display(),
            lock_path.display()
        ),
        Err(fs::TryLockError::Error(e)) => return Err(e).with_context(|| format!("locking {}", lock_path.display())),
    }
    let kept = if fresh { None } else { read_kept(data, orchestrators)? };
    let tls = data.join("tls");
    let pepper = tls.join("key-pepper");
    let kept = match kept {
        Some((up, ca)) => {
            let renew = due(&ca);
            let ca = if renew { ClusterCa::generate("zerolayer local cluster", CERT_DAYS)? } else { ca };
            if renew {
                crate::certs::write_pair(&tls, "ca", ca.pem(), true)?;
            }
            let api_key = api_key.map_or(up.api_key, str::to_owned);
            Kept { ca, api_key, pepper, resumed_from: Some(up.created), ca_renewed: renew, _lock: lock }
        }
        None => {
            // A new cluster: nothing of an earlier one may mix in (a Raft log of another group, a chain whose
            // head that log held).
            clear(data)?;
            let ca = ClusterCa::generate("zerolayer local cluster", CERT_DAYS).context("generating the cluster CA")?;
            crate::certs::write_pair(&tls, "ca", ca.pem(), true)?;
            crate::certs::write_file(&pepper, new_secret()?.as_bytes(), 0o600)?;
            let api_key = match api_key {
                Some(k) => k.to_owned(),
                None => new_secret()?,
            };
            Kept { ca, api_key, pepper, resumed_from: None, ca_renewed: false, _lock: lock }
        }
    };
    let created = kept
        .resumed_from
        .clone()
        .unwrap_or_else(|| zl_common::calendar::rfc3339(zl_common::calendar::unix_ms() / 1000));
    let up = UpFile { api_key: kept.api_key.clone(), orchestrators, created };
    crate::certs::write_private(&data.join(UP_FILE), &up.to_json())?;
    Ok(kept)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn secrets() -> impl Fn() -> Result<String> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        || Ok(format!("secret-{}", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))
    }

    #[test]
    fn a_restart_keeps_the_key_the_ca_and_the_raft_state_and_fresh_drops_them() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = prepare(&data, false, 1, None, secrets()).unwrap();
        assert!(first.resumed_from.is_none());
        fs::create_dir_all(data.join("orchestrator-0")).unwrap();
        fs::write(data.join("orchestrator-0/log"), "raft").unwrap();
        fs::create_dir_all(data.join("kv/worker-0")).unwrap();
        let pepper = fs::read_to_string(&first.pepper).unwrap();
        let (first_key, first_ca) = (first.api_key.clone(), first.ca.cert_pem().to_owned());
        drop(first); // as the first `zl up` stops

        let again = prepare(&data, false, 1, None, secrets()).unwrap();
        assert_eq!(again.api_key, first_key);
        assert_eq!(again.ca.cert_pem(), first_ca);
        assert_eq!(fs::read_to_string(&again.pepper).unwrap(), pepper);
        assert!(again.resumed_from.is_some() && !again.ca_renewed);
        assert!(data.join("orchestrator-0/log").exists());
        assert!(data.join("kv/worker-0").exists(), "a restart keeps the KV disk tiers");
        assert!(again.describe(&data).contains("--fresh"));
        drop(again);
        // A key given on the command line wins (the cluster rotates `local` to it) and is kept for next time.
        let given = prepare(&data, false, 1, Some("sk-given-0123456789"), secrets()).unwrap().api_key;
        assert_eq!(given, "sk-given-0123456789");
        assert_eq!(prepare(&data, false, 1, None, secrets()).unwrap().api_key, "sk-given-0123456789");

        // Another group size is refused, naming the kept one and --fresh.
        let err = format!("{:#}", prepare(&data, false, 3, None, secrets()).err().unwrap());
        assert!(err.contains("--orchestrators 1") && err.contains("--fresh"), "{err}");

        let fresh = prepare(&data, true, 3, None, secrets()).unwrap();
        assert!(fresh.resumed_from.is_none());
        assert_ne!(fresh.ca.cert_pem(), first_ca);
        assert!(!data.join("orchestrator-0").exists(), "--fresh drops the Raft state");
        assert!(!data.join("kv").exists(), "--fresh drops the workers' KV disk tiers");
        assert_ne!(fs::read_to_string(&fresh.pepper).unwrap(), pepper);
    }

    #[test]
    fn a_second_start_on_a_running_data_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let running = prepare(dir.path(), false, 1, None, secrets()).unwrap();
        let err = format!("{:#}", prepare(dir.path(), false, 1, None, secrets()).err().unwrap());
        assert!(err.contains("another `zl up` is running"), "{err}");
        drop(running);
        prepare(dir.path(), false, 1, None, secrets()).unwrap();
    }

    #[test]
    fn a_damaged_up_file_is_an_error_not_a_silent_start_over() {
        let dir = tempfile::tempdir().unwrap();
        prepare(dir.path(), false, 1, None, secrets()).unwrap();
        fs::write(dir.path().join(UP_FILE), "{not json").unwrap();
        let err = format!("{:#}", prepare(dir.path(), false, 1, None, secrets()).err().unwrap());
        assert!(err.contains("damaged") && err.contains("--fresh"), "{err}");
        fs::remove_file(dir.path().join("tls/ca.key")).unwrap();
        prepare(dir.path(), true, 1, None, secrets()).unwrap();
    }
}
