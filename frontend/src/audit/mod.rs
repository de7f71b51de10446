//! The frontend's audit log: one hash-chained record per request (also for refusals after authentication),
//! appended to size-rotated segment files in `--audit-dir`. The record format and the chain are
//! `zl_common::audit`'s; what goes into a record is gathered by a [`Draft`]; the chain head is committed to the
//! orchestrators by the report loop (`crate::report`). docs/audit.md has the operator's view.

mod draft;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use zl_common::audit::{AuditRecord, ChainHead, GENESIS, encode_line, segment_name};
use zl_common::sync::lock;

pub use draft::{ContentKey, Draft};

use crate::error::{ApiError, ErrorKind};

/// When records reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// After every record (no record acknowledged to the client is lost in a power cut; slowest).
    Always,
    /// Once a second from a background task (a crash of the machine loses at most the last second).
    Interval,
    /// Left to the kernel.
    Never,
}

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
    file: Option<File>,
    size: u64,
    head: ChainHead,
    unsynced: bool,
    failure: Option<String>,
}

/// One frontend's audit chain.
pub struct AuditLog {
    config: AuditConfig,
    frontend: String,
    region: String,
    writer: Mutex<Writer>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").field("config", &self.config).finish_non_exhaustive()
    }
}

impl AuditLog {
    /// Open (or create) the chain in `config.dir`, continuing from its newest whole record.
    pub fn open(config: AuditConfig, frontend: &str, region: &str) -> std::io::Result<Self> {
        std::fs::create_dir_all(&config.dir)?;
        let zl_node::audit_files::Resume { newest, head, torn } = zl_node::audit_files::resume(&config.dir)?;
        if let Some(torn) = torn {
            tracing::warn!("audit log: {torn}");
        }
        let (file, size) = match newest {
            Some((path, size)) => (Some(OpenOptions::new().append(true).open(path)?), size),
            None => (None, 0),
        };
        let head = head.unwrap_or(ChainHead { seq: 0, hash: GENESIS.to_owned() });
        tracing::info!(dir = %config.dir.display(), seq = head.seq, "audit log open");
        let writer = Writer { file, size, head, unsynced: false, failure: None };
        Ok(AuditLog { config, frontend: frontend.to_owned(), region: region.to_owned(), writer: Mutex::new(writer) })
    }

    /// The newest record written (seq 0 before any).
    pub fn head(&self) -> ChainHead {
        lock(&self.writer).head.clone()
    }

    /// Whether requests may be admitted: with `FailClosed`, not while the last write failed.
    pub fn admit(&self) -> Result<(), ApiError> {
        match (&lock(&self.writer).failure, self.config.on_failure) {
            (Some(e), OnFailure::FailClosed) => Err(ApiError::new(
                ErrorKind::Overloaded,
                format!("the audit log cannot be written ({e}); requests are refused until it can"),
            )
            .retry_after(5)),
            _ => Ok(()),
        }
    }

    /// Append a record (its chain fields are set here).
    pub fn append(&self, mut record: AuditRecord) {
        let mut w = lock(&self.writer);
        record.seq = w.head.seq + 1;
        record.prev = w.head.hash.clone();
        record.frontend = self.frontend.clone();
        record.region = self.region.clone();
        let (line, hash) = encode_line(&record);
        match self.write(&mut w, record.seq, line.as_bytes()) {
            Ok(()) => {
                w.head = ChainHead { seq: record.seq, hash };
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

    fn write(&self, w: &mut Writer, seq: u64, line: &[u8]) -> std::io::Result<()> {
        if w.file.is_none() || (w.size > 0 && w.size + line.len() as u64 > self.config.segment_bytes) {
            if let Some(old) = w.file.take() {
                old.sync_all()?;
            }
            let path = self.config.dir.join(segment_name(seq));
            w.file = Some(OpenOptions::new().create(true).append(true).open(path)?);
            w.size = 0;
            self.prune();
        }
        let file = w.file.as_mut().expect("opened above");
        if let Err(e) = file.write_all(line) {
            // Leave no torn record behind: cut back to the last whole one.
            let _ = file.set_len(w.size);
            return Err(e);
        }
        w.size += line.len() as u64;
        match self.config.fsync {
            Fsync::Always => file.sync_data()?,
            Fsync::Interval => w.unsynced = true,
            Fsync::Never => {}
        }
        Ok(())
    }

    /// Remove the oldest segments beyond `keep_segments`.
    fn prune(&self) {
        if self.config.keep_segments == 0 {
            return;
        }
        let Ok(mut segments) = zl_node::audit_files::segments(&self.config.dir) else { return };
        // The segment about to be written is not listed yet if it is new: keep room for it.
        while segments.len() >= self.config.keep_segments {
            let (_, path) = segments.remove(0);
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(segment = %path.display(), "audit segment removed (retention)"),
                Err(e) => tracing::warn!(segment = %path.display(), error = %e, "audit segment not removed"),
            }
        }
    }

    /// Flush written records to the disk (the `Interval` policy's tick).
    pub fn sync(&self) {
        let mut w = lock(&self.writer);
        if w.unsynced
            && let Some(f) = &w.file
        {
            if let Err(e) = f.sync_data() {
                tracing::error!(error = %e, "audit log fsync failed");
                metrics::counter!("zl_frontend_audit_write_failures_total").increment(1);
                w.failure = Some(e.to_string());
            }
            w.unsynced = false;
        }
    }
}

#[cfg(test)]
mod tests;
