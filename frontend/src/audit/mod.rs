//! The frontend's audit log: one hash-chained record per request (also for refusals after authentication),
//! appended to size-rotated segment files in `--audit-dir`. The record format and the chain are
//! `zl_common::audit`'s, the segment files `zl_node::audit`'s (the one home of the format on disk, which
//! `zl audit verify` reads); what goes into a record is gathered by a [`Draft`]; the chain head is committed to the
//! orchestrators by the report loop (`crate::report`). This file adds the service's side: fail-closed admission,
//! metrics, and the frontend's id and region in every record. docs/audit.md has the operator's view.

mod draft;

use std::path::PathBuf;
use std::sync::Mutex;

use zl_common::audit::{AuditRecord, ChainHead, GENESIS, encode_line};
use zl_common::sync::lock;
use zl_node::audit::{SegmentConfig, SegmentWriter};

pub use draft::{ContentKey, Draft};
/// When records reach the disk (the segment writer's policy).
pub use zl_node::audit::Fsync;

use crate::error::{ApiError, ErrorKind};

/// What a failed audit write does to the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// Refuse new requests (503) until a record can be written again: no request goes unrecorded.
    FailClosed,
    /// Keep serving; count the failure (`zl_frontend_audit_write_failures_total`) and log an error.
    Continue,
}

/// Settings of the audit log.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    /// The chain's directory (one frontend's).
    pub dir: PathBuf,
    /// Rotate to a new segment past this size.
    pub segment_bytes: u64,
    /// Keep at most this many segments (the oldest are removed; 0 keeps all).
    pub keep_segments: usize,
    /// When records reach the disk.
    pub fsync: Fsync,
    /// What a failed write does.
    pub on_failure: OnFailure,
}

struct Writer {
    segments: SegmentWriter,
    head: ChainHead,
    failure: Option<String>,
    /// Why this chain is not the one committed for this frontend (its directory was lost or replaced): nothing
    /// is written or admitted until an operator resets the committed head.
    diverged: Option<String>,
}

/// One frontend's audit chain.
pub struct AuditLog {
    config: AuditConfig,
    frontend: String,
    region: String,
    writer: Mutex<Writer>,
    /// The newest record the orchestrators committed for this chain (0: none yet).
    committed: std::sync::atomic::AtomicU64,
    /// Notified when a record is appended to a chain none of whose records is committed yet: the report loop
    /// sends the head at once, so a new chain is committed (and `zl audit verify` can prove it) without waiting for
    /// the next report.
    pub uncommitted: tokio::sync::Notify,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").field("config", &self.config).finish_non_exhaustive()
    }
}

impl AuditLog {
    /// Open (or create) the chain in `config.dir`, continuing from its newest whole record.
    pub fn open(config: AuditConfig, frontend: &str, region: &str) -> std::io::Result<Self> {
        let (segments, resumed) = SegmentWriter::open(SegmentConfig {
            dir: config.dir.clone(),
            segment_bytes: config.segment_bytes,
            keep_segments: config.keep_segments,
            fsync: config.fsync,
        })?;
        if let Some(torn) = resumed.torn {
            tracing::warn!("audit log: {torn}");
        }
        let head = resumed.head.unwrap_or(ChainHead { seq: 0, hash: GENESIS.to_owned() });
        tracing::info!(dir = %config.dir.display(), seq = head.seq, "audit log open");
        let writer = Writer { segments, head, failure: None, diverged: None };
        Ok(AuditLog {
            config,
            frontend: frontend.to_owned(),
            region: region.to_owned(),
            writer: Mutex::new(writer),
            committed: 0.into(),
            uncommitted: tokio::sync::Notify::new(),
        })
    }

    /// The newest record written (seq 0 before any).
    pub fn head(&self) -> ChainHead {
        lock(&self.writer).head.clone()
    }

    /// Refuse requests and write nothing until the first [`AuditLog::check_committed`]: a frontend that starts
    /// must not begin writing a chain before it knows the orchestrators' head agrees with its directory.
    pub fn hold_until_confirmed(&self) {
        lock(&self.writer).diverged =
            Some("its audit chain is not yet confirmed by the orchestrators (it is starting)".to_owned());
    }

    /// Compare this chain with the head the orchestrators committed for this frontend (from each report's
    /// answer; `None`: none is committed). A committed head this chain does not reach, or reaches with another
    /// hash, means the audit directory was lost or replaced: the frontend then refuses requests and writes nothing,
    /// whatever `on_failure` says, until the chain is restored or an operator resets the head (`zl admin
    /// audit-reset`), rather than start a new chain silently.
    pub fn check_committed(&self, committed: Option<(u64, [u8; 32])>) {
        self.committed.store(committed.map_or(0, |(seq, _)| seq), std::sync::atomic::Ordering::Relaxed);
        let mut w = lock(&self.writer);
        let diverged = committed.and_then(|(seq, hash)| {
            let hash = zl_common::keys::hex(&hash);
            let local = &w.head;
            (seq > local.seq || (seq == local.seq && hash != local.hash)).then(|| {
                format!(
                    "the orchestrators hold record {seq} of this frontend's audit chain, but its audit directory \
                     ends at record {}: restore the directory, or let a new chain start with `zl admin \
                     audit-reset {}`",
                    local.seq, self.frontend
                )
            })
        });
        match (&w.diverged, &diverged) {
            (old, Some(why)) if old.as_ref() != Some(why) => {
                tracing::error!(frontend = %self.frontend, "audit chain diverged: {why}");
            }
            (Some(_), None) => tracing::info!(frontend = %self.frontend, "audit chain confirmed by the orchestrators"),
            _ => {}
        }
        metrics::gauge!("zl_frontend_audit_diverged").set(if diverged.is_some() { 1.0 } else { 0.0 });
        w.diverged = diverged;
    }

    /// Whether requests may be admitted: not while the chain diverged from the committed head; with `FailClosed`,
    /// not while the last write failed.
    pub fn admit(&self) -> Result<(), ApiError> {
        let w = lock(&self.writer);
        if let Some(why) = &w.diverged {
            return Err(
                ApiError::new(ErrorKind::Overloaded, format!("this frontend cannot serve: {why}")).retry_after(2)
            );
        }
        match (&w.failure, self.config.on_failure) {
            (Some(e), OnFailure::FailClosed) => Err(ApiError::new(
                ErrorKind::Overloaded,
                format!("the audit log cannot be written ({e}); requests are refused until it can"),
            )
            .retry_after(5)),
            _ => Ok(()),
        }
    }

    /// Append a record (its chain fields are set here); not while the chain diverged from the committed head.
    pub fn append(&self, mut record: AuditRecord) {
        let mut w = lock(&self.writer);
        if w.diverged.is_some() {
            metrics::counter!("zl_frontend_audit_records_withheld_total").increment(1);
            return;
        }
        record.seq = w.head.seq + 1;
        record.prev = w.head.hash.clone();
        record.frontend = self.frontend.clone();
        record.region = self.region.clone();
        let (line, hash) = encode_line(&record);
        match w.segments.append(record.seq, line.as_bytes()) {
            Ok(()) => {
                w.head = ChainHead { seq: record.seq, hash };
                if self.committed.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                    self.uncommitted.notify_one();
                }
                if w.failure.take().is_some() {
                    tracing::warn!("audit log writable again");
                }
                metrics::counter!("zl_frontend_audit_records_total").increment(1);
            }
            Err(e) => {
                metrics::counter!("zl_frontend_audit_write_failures_total").increment(1);
                tracing::error!(request_id = %record.request_id, error = %e, "audit record not written");
                w.failure = Some(e.to_string());
            }
        }
    }

    /// Flush written records to the disk (the `Interval` policy's tick).
    pub fn sync(&self) {
        let mut w = lock(&self.writer);
        if let Err(e) = w.segments.sync() {
            tracing::error!(error = %e, "audit log fsync failed");
            metrics::counter!("zl_frontend_audit_write_failures_total").increment(1);
            w.failure = Some(e.to_string());
        }
    }
}

#[cfg(test)]
mod tests;
