//! Writing a chain directory: whole record lines appended to the newest segment, a new segment past a size, the
//! oldest removed past a count, data synced by policy. A failed write is cut back so no torn record stays behind.
//! What a line says is the caller's ([`zl_common::audit::encode_line`]); this file knows only lines and files.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use super::{resume, segment_name, segments};

/// When records reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// After every record (no record acknowledged to the client is lost in a power cut; slowest).
    Always,
    /// When [`SegmentWriter::sync`] is called (the frontend does once a second: a crash of the machine loses at
    /// most the last second).
    Interval,
    /// Left to the kernel.
    Never,
}

/// Where and how a chain's segments are written.
#[derive(Clone, Debug)]
pub struct SegmentConfig {
    /// The chain's directory (one writer's).
    pub dir: PathBuf,
    /// Rotate to a new segment past this size.
    pub segment_bytes: u64,
    /// Keep at most this many segments (the oldest are removed; 0 keeps all).
    pub keep_segments: usize,
    /// When records reach the disk.
    pub fsync: Fsync,
}

/// The writer of one chain directory.
#[derive(Debug)]
pub struct SegmentWriter {
    config: SegmentConfig,
    file: Option<File>,
    size: u64,
    unsynced: bool,
}

impl SegmentWriter {
    /// Open (or create) the directory, continuing after its newest whole line; returns the writer, the newest
    /// whole line's head (none for an empty chain) and what was cut off a segment whose last write was torn.
    pub fn open(config: SegmentConfig) -> std::io::Result<(Self, super::Resume)> {
        // Evidence: owner-only, like the Raft log (zl_node::private).
        crate::private::create_dir(&config.dir)?;
        crate::private::tighten_files(&config.dir)?;
        let at = resume(&config.dir)?;
        let (file, size) = match &at.newest {
            Some((path, size)) => (Some(crate::private::append(path)?), *size),
            None => (None, 0),
        };
        Ok((SegmentWriter { config, file, size, unsynced: false }, at))
    }

    /// The directory written.
    pub fn dir(&self) -> &std::path::Path {
        &self.config.dir
    }

    /// Append `line` (a whole record line) as record `seq`: into a new segment named for `seq` when there is none
    /// yet or the current one would pass its size.
    pub fn append(&mut self, seq: u64, line: &[u8]) -> std::io::Result<()> {
        if self.file.is_none() || (self.size > 0 && self.size + line.len() as u64 > self.config.segment_bytes) {
            if let Some(old) = self.file.take() {
                old.sync_all()?;
            }
            let path = self.config.dir.join(segment_name(seq));
            self.file = Some(crate::private::append(&path)?);
            self.size = 0;
            self.prune();
        }
        let file = self.file.as_mut().expect("opened above");
        if let Err(e) = file.write_all(line) {
            // Leave no torn record behind: cut back to the last whole one.
            let _ = file.set_len(self.size);
            return Err(e);
        }
        self.size += line.len() as u64;
        match self.config.fsync {
            Fsync::Always => file.sync_data()?,
            Fsync::Interval => self.unsynced = true,
            Fsync::Never => {}
        }
        Ok(())
    }

    /// Flush appended lines to the disk (the `Interval` policy's tick); nothing to do is a success.
    pub fn sync(&mut self) -> std::io::Result<()> {
        if !std::mem::take(&mut self.unsynced) {
            return Ok(());
        }
        match &self.file {
            Some(f) => f.sync_data(),
            None => Ok(()),
        }
    }

    /// Remove the oldest segments beyond `keep_segments`.
    fn prune(&self) {
        if self.config.keep_segments == 0 {
            return;
        }
        let Ok(mut segments) = segments(&self.config.dir) else { return };
        // The segment about to be written is not listed yet if it is new: keep room for it.
        while segments.len() >= self.config.keep_segments {
            let (_, path) = segments.remove(0);
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(segment = %path.display(), "audit segment removed (retention)"),
                Err(e) => tracing::warn!(segment = %path.display(), error = %e, "audit segment not removed"),
            }
        }
    }
}
