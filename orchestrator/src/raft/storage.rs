//! Durable storage for the orchestrators' Raft group (the [`super::replica`] builds on it): the log, the hard
//! state and snapshots of the routing state, in one directory.
//!
//! Layout:
//! - `log/{first index:020}.seg`: log segments. A segment is a run of records, each `len: u32 LE`, `crc: u32 LE`
//!   (CRC-32C of the body), then the body: `index: u64 LE`, `term: u64 LE`, the entry's bytes. Indices are
//!   contiguous within and across segments. Each appended batch ends with a commit marker (index `u64::MAX`, the
//!   batch's first and last index and the CRC-32C of the batch's bytes), written before the fsync that acknowledges
//!   the batch. Segments roll over between batches, once past `segment_bytes`.
//! - `hardstate`: term, vote and commit index with a CRC, replaced atomically (write a temporary file, fsync,
//!   rename, fsync the directory).
//! - `snapshot`: the newest snapshot (index, term, the state's bytes) with a CRC, replaced the same way.
//! - `confstate`: the group's membership as of the last applied configuration change (opaque bytes: an encoded
//!   raft-rs `ConfState`) with a CRC, replaced the same way.
//!
//! Every append is fsynced before it returns, so an acknowledged entry survives a crash. On open, the last
//! segment's records after its last intact commit marker belong to a batch that was never acknowledged (the crash
//! came mid-append, whatever the disk wrote of it, in whatever order) and are cut off. Damage before an intact
//! marker (acknowledged data), damage in an earlier segment, a gap in the indices, or a damaged hard state or
//! snapshot is corruption and refuses to open, so committed entries are never dropped silently. Entries at or below the
//! snapshot are ignored and their segments deleted (a crash between writing a snapshot and compacting leaves them behind harmlessly).
//!
//! Synchronous and single-owner: the replica calls it from the driver's one task.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Largest entry or snapshot accepted, in bytes.
pub const MAX_RECORD_BYTES: usize = 64 * 1024 * 1024;
/// Default segment size before rolling over.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
const HEADER: usize = 8;
const BODY_PREFIX: usize = 16;

/// One log entry: the Raft index and term, and opaque bytes (an encoded raft-rs `Entry`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Position in the log, from 1.
    pub index: u64,
    /// Term it was proposed in.
    pub term: u64,
    /// The entry.
    pub data: Vec<u8>,
}

/// Raft's hard state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HardState {
    /// Current term.
    pub term: u64,
    /// Vote in the current term (0: none).
    pub vote: u64,
    /// Highest index known committed.
    pub commit: u64,
}

/// A snapshot of the replicated state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Last log index it covers.
    pub index: u64,
    /// That entry's term.
    pub term: u64,
    /// The state machine's snapshot bytes.
    pub data: Vec<u8>,
}

/// Storage failures.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The file system failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// Data on disk is damaged where a crash cannot explain it.
    #[error("corrupt Raft storage: {0}")]
    Corrupt(String),
    /// The caller broke an invariant (non-contiguous append, an entry that is too large, ...).
    #[error("invalid storage request: {0}")]
    Invalid(String),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StorageError + '_ {
    move |source| StorageError::Io { path: path.to_owned(), source }
}

/// CRC-32C (Castagnoli), table-driven.
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0x82f6_3b78 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    !data.iter().fold(!0u32, |c, &b| TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8))
}

/// A record's framing: `len`, `crc`, body.
fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The record at `bytes[0..]`: its body and total length, or why it is not a whole, intact record.
fn unframe(bytes: &[u8]) -> Result<(&[u8], usize), &'static str> {
    if bytes.len() < HEADER {
        return Err("truncated header");
    }
    let len = u32::from_le_bytes(bytes[0..4].try_into().unwrap_or([0; 4])) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or([0; 4]));
    if len > MAX_RECORD_BYTES + BODY_PREFIX {
        return Err("impossible length");
    }
    let body = bytes.get(HEADER..HEADER + len).ok_or("truncated body")?;
    if crc32c(body) != crc {
        return Err("checksum mismatch");
    }
    Ok((body, HEADER + len))
}

fn entry_body(e: &LogEntry) -> Vec<u8> {
    let mut body = Vec::with_capacity(BODY_PREFIX + e.data.len());
    body.extend_from_slice(&e.index.to_le_bytes());
    body.extend_from_slice(&e.term.to_le_bytes());
    body.extend_from_slice(&e.data);
    body
}

/// The commit marker closing a batch of records (`batch` is their framed bytes).
fn marker_body(first: u64, last: u64, batch: &[u8]) -> Vec<u8> {
    let mut data = last.to_le_bytes().to_vec();
    data.extend_from_slice(&crc32c(batch).to_le_bytes());
    entry_body(&LogEntry { index: MARKER, term: first, data })
}

/// Index value that tags a commit marker.
const MARKER: u64 = u64::MAX;

fn parse_entry(body: &[u8]) -> Result<LogEntry, &'static str> {
    if body.len() < BODY_PREFIX {
        return Err("short entry");
    }
    let index = u64::from_le_bytes(body[0..8].try_into().unwrap_or([0; 8]));
    let term = u64::from_le_bytes(body[8..16].try_into().unwrap_or([0; 8]));
    Ok(LogEntry { index, term, data: body[BODY_PREFIX..].to_vec() })
}

/// Write `contents` to `path` atomically and durably.
fn replace_file(path: &Path, contents: &[u8]) -> Result<(), StorageError> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = zl_node::private::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(contents).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
    }
    fs::rename(&tmp, path).map_err(io_err(path))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

/// A whole framed file (hard state, snapshot): `None` if it does not exist.
fn read_framed(path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    match unframe(&bytes) {
        Ok((body, used)) if used == bytes.len() => Ok(Some(body.to_vec())),
        Ok(_) => Err(StorageError::Corrupt(format!("{}: trailing bytes", path.display()))),
        Err(why) => Err(StorageError::Corrupt(format!("{}: {why}", path.display()))),
    }
}

/// Where an entry lives on disk, and where its batch starts (a cut inside a batch re-closes it with a marker).
#[derive(Clone, Copy, Debug)]
struct Location {
    segment: usize,
    offset: u64,
    batch_start: u64,
    batch_first: u64,
}

#[derive(Debug)]
struct Segment {
    first: u64,
    path: PathBuf,
    len: u64,
}

/// The log, hard state and snapshot in a directory, with the log's entries after the snapshot held in memory
/// (the routing state's log is small; compaction keeps it so).
#[derive(Debug)]
pub struct DiskStorage {
    dir: PathBuf,
    segment_bytes: u64,
    segments: Vec<Segment>,
    active: Option<File>,
    entries: Vec<LogEntry>,
    locations: Vec<Location>,
    hard: HardState,
    snapshot: Snapshot,
    conf_state: Vec<u8>,
}

impl DiskStorage {
    /// Open (creating if needed) the storage in `dir`, recovering from a crash at any point.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<DiskStorage, StorageError> {
        let log_dir = dir.join("log");
        // The log and snapshots hold API-key hashes and content data keys: owner-only (zl_node::private).
        zl_node::private::create_dir(dir).map_err(io_err(dir))?;
        zl_node::private::create_dir(&log_dir).map_err(io_err(&log_dir))?;
        zl_node::private::tighten_files(dir).map_err(io_err(dir))?;
        zl_node::private::tighten_files(&log_dir).map_err(io_err(&log_dir))?;
        for stray in [dir.join("hardstate.tmp"), dir.join("snapshot.tmp"), dir.join("confstate.tmp")] {
            let _ = fs::remove_file(stray);
        }
        let hard = match read_framed(&dir.join("hardstate"))? {
            None => HardState::default(),
            Some(b) if b.len() == 24 => HardState {
                term: u64::from_le_bytes(b[0..8].try_into().unwrap_or([0; 8])),
                vote: u64::from_le_bytes(b[8..16].try_into().unwrap_or([0; 8])),
                commit: u64::from_le_bytes(b[16..24].try_into().unwrap_or([0; 8])),
            },
            Some(_) => return Err(StorageError::Corrupt("hardstate: wrong size".into())),
        };
        let conf_state = read_framed(&dir.join("confstate"))?.unwrap_or_default();
        let snapshot = match read_framed(&dir.join("snapshot"))? {
            None => Snapshot::default(),
            Some(b) => {
                let e = parse_entry(&b).map_err(|w| StorageError::Corrupt(format!("snapshot: {w}")))?;
                Snapshot { index: e.index, term: e.term, data: e.data }
            }
        };
        let mut names: Vec<(u64, PathBuf)> = Vec::new();
        for item in fs::read_dir(&log_dir).map_err(io_err(&log_dir))? {
            let path = item.map_err(io_err(&log_dir))?.path();
            let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".seg")) else {
                continue;
            };
            let first =
                stem.parse().map_err(|_| StorageError::Corrupt(format!("bad segment name {}", path.display())))?;
            names.push((first, path));
        }
        names.sort();
        let mut s = DiskStorage {
            dir: dir.to_owned(),
            segment_bytes: segment_bytes.max(1),
            segments: Vec::new(),
            active: None,
            entries: Vec::new(),
            locations: Vec::new(),
            hard,
            snapshot,
            conf_state,
        };
        let count = names.len();
        for (i, (first, path)) in names.into_iter().enumerate() {
            s.recover_segment(first, path, i + 1 == count)?;
        }
        // Entries the snapshot covers are not needed; segments wholly below it go.
        let keep_from = s.entries.iter().position(|e| e.index > s.snapshot.index).unwrap_or(s.entries.len());
        if keep_from > 0 {
            s.entries.drain(..keep_from);
            s.locations.drain(..keep_from);
        }
        if s.entries.first().is_some_and(|e| e.index != s.snapshot.index + 1) {
            // A log that does not continue the snapshot (a snapshot installed over a diverged log, then a crash
            // before the segments were removed): the snapshot wins.
            s.entries.clear();
            s.locations.clear();
        }
        s.drop_segments_below(s.snapshot.index + 1)?;
        if s.entries.is_empty() {
            // Start a fresh segment at the next index so file names keep matching their first entries.
            s.drop_segments_below(u64::MAX)?;
        }
        Ok(s)
    }

    fn recover_segment(&mut self, first: u64, path: PathBuf, last: bool) -> Result<(), StorageError> {
        let mut bytes = Vec::new();
        File::open(&path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(io_err(&path))?;
        let corrupt =
            |offset: usize, why: &str| StorageError::Corrupt(format!("{} at byte {offset}: {why}", path.display()));
        if let Some(prev) = self.entries.last()
            && prev.index + 1 != first
        {
            return Err(corrupt(0, &format!("gap after index {}", prev.index)));
        }
        let segment = self.segments.len();
        // Records since the last marker, with their offsets; committed to `entries` when their marker checks out.
        let mut pending: Vec<(LogEntry, usize)> = Vec::new();
        let mut batch_start = 0usize;
        let mut committed_end = 0usize;
        let mut damage: Option<(usize, &'static str)> = None;
        let mut damaged_batch = 0u64;
        let mut next_index = self.entries.last().map_or(first, |l| l.index + 1);
        let mut offset = 0usize;
        while offset < bytes.len() {
            let Ok(len_bytes) = <[u8; 4]>::try_from(&bytes[offset..(offset + 4).min(bytes.len())]) else { break };
            let frame_len = HEADER + u32::from_le_bytes(len_bytes) as usize;
            if offset + frame_len > bytes.len() || frame_len > HEADER + BODY_PREFIX + MAX_RECORD_BYTES {
                break; // a frame cut short by the crash (or an impossible length): nothing after it can be framed
            }
            let parsed = unframe(&bytes[offset..]).and_then(|(body, _)| parse_entry(body));
            match parsed {
                Ok(e) if e.index == MARKER => {
                    let last_index = e.data.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
                    let crc = e.data.get(8..12).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
                    let batch_first = pending.first().map_or(next_index, |p| p.0.index);
                    match damage {
                        None if e.term == batch_first
                            && pending.last().map(|p| p.0.index) == last_index
                            && Some(crc32c(&bytes[batch_start..offset])) == crc =>
                        {
                            next_index = last_index.unwrap_or(next_index) + 1;
                            for (entry, at) in pending.drain(..) {
                                let (start, first) = (batch_start as u64, e.term);
                                self.locations.push(Location {
                                    segment,
                                    offset: at as u64,
                                    batch_start: start,
                                    batch_first: first,
                                });
                                self.entries.push(entry);
                            }
                            committed_end = offset + frame_len;
                            batch_start = committed_end;
                        }
                        None => {
                            damage = Some((offset, "a commit marker that does not match its batch"));
                            damaged_batch = batch_first;
                        }
                        // The damaged batch's own marker (the disk kept it but not the whole batch): that batch was
                        // never acknowledged. A later batch's marker means the damaged one had been synced.
                        Some(_) if e.term == damaged_batch => {}
                        Some((at, why)) => return Err(corrupt(at, why)),
                    }
                }
                Ok(e) if damage.is_none() => {
                    let expected = pending.last().map_or(next_index, |p| p.0.index + 1);
                    if e.index != expected {
                        return Err(corrupt(offset, &format!("index {} where {expected} belongs", e.index)));
                    }
                    pending.push((e, offset));
                }
                Ok(_) => {}
                Err(why) => {
                    if damage.is_none() {
                        damage = Some((offset, why));
                        damaged_batch = pending.first().map_or(next_index, |p| p.0.index);
                    }
                }
            }
            offset += frame_len;
        }
        let clean = damage.is_none() && pending.is_empty() && committed_end == bytes.len();
        if !clean {
            if !last {
                let (at, why) = damage.unwrap_or((committed_end, "records after the last commit marker"));
                return Err(corrupt(at, why));
            }
            tracing::warn!(segment = %path.display(), cut_at = committed_end, "cutting an unacknowledged batch off the log");
            let f = OpenOptions::new().write(true).open(&path).map_err(io_err(&path))?;
            f.set_len(committed_end as u64).map_err(io_err(&path))?;
            f.sync_all().map_err(io_err(&path))?;
        }
        self.segments.push(Segment { first, path, len: committed_end as u64 });
        Ok(())
    }

    /// Delete segments whose entries are all below `index` (the last segment only when the log is empty); the
    /// active file is reopened on the next append.
    fn drop_segments_below(&mut self, index: u64) -> Result<(), StorageError> {
        let mut removed = 0;
        while let Some(seg) = self.segments.first() {
            let gone = match self.segments.get(1) {
                Some(next) => next.first <= index,
                None => self.entries.is_empty(),
            };
            if !gone {
                break;
            }
            fs::remove_file(&seg.path).map_err(io_err(&seg.path))?;
            self.segments.remove(0);
            removed += 1;
        }
        if removed > 0 {
            for loc in &mut self.locations {
                loc.segment -= removed;
            }
            sync_dir(&self.dir.join("log"))?;
        }
        self.active = None;
        Ok(())
    }

    /// Index of the first entry in the log (the snapshot's index + 1 when the log is empty).
    pub fn first_index(&self) -> u64 {
        self.entries.first().map_or(self.snapshot.index + 1, |e| e.index)
    }

    /// Index of the last entry (the snapshot's index when the log is empty).
    pub fn last_index(&self) -> u64 {
        self.entries.last().map_or(self.snapshot.index, |e| e.index)
    }

    /// The term of entry `index`, if it is in the log or is the snapshot's.
    pub fn term(&self, index: u64) -> Option<u64> {
        if index == self.snapshot.index {
            return Some(self.snapshot.term);
        }
        self.entry(index).map(|e| e.term)
    }

    fn entry(&self, index: u64) -> Option<&LogEntry> {
        let first = self.entries.first()?.index;
        self.entries.get(usize::try_from(index.checked_sub(first)?).ok()?)
    }

    /// Entries `lo..hi` (as many as the log holds of them).
    pub fn entries(&self, lo: u64, hi: u64) -> &[LogEntry] {
        let Some(first) = self.entries.first().map(|e| e.index) else { return &[] };
        let clamp = |i: u64| (i.saturating_sub(first) as usize).min(self.entries.len());
        &self.entries[clamp(lo.max(first))..clamp(hi.max(first))]
    }

    /// The hard state.
    pub fn hard_state(&self) -> HardState {
        self.hard
    }

    /// The newest snapshot.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The membership bytes last stored with [`DiskStorage::set_conf_state`] (empty if never).
    pub fn conf_state(&self) -> &[u8] {
        &self.conf_state
    }

    /// Persist the membership (atomically, like the hard state).
    pub fn set_conf_state(&mut self, conf_state: &[u8]) -> Result<(), StorageError> {
        if conf_state.len() > MAX_RECORD_BYTES {
            return Err(StorageError::Invalid(format!("membership is {} bytes", conf_state.len())));
        }
        replace_file(&self.dir.join("confstate"), &frame(conf_state))?;
        self.conf_state = conf_state.to_vec();
        Ok(())
    }

    /// Persist the hard state.
    pub fn set_hard_state(&mut self, hard: HardState) -> Result<(), StorageError> {
        let mut body = Vec::with_capacity(24);
        for v in [hard.term, hard.vote, hard.commit] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        replace_file(&self.dir.join("hardstate"), &frame(&body))?;
        self.hard = hard;
        Ok(())
    }

    fn active_file(&mut self) -> Result<&mut File, StorageError> {
        if self.active.is_none() {
            let next = self.last_index() + 1;
            let roll = self.segments.last().is_none_or(|s| s.len >= self.segment_bytes);
            if roll {
                let path = self.dir.join("log").join(format!("{next:020}.seg"));
                zl_node::private::create(&path).map_err(io_err(&path))?;
                sync_dir(&self.dir.join("log"))?;
                self.segments.push(Segment { first: next, path, len: 0 });
            }
            let seg = self.segments.last().ok_or_else(|| StorageError::Invalid("no segment".into()))?;
            let f = OpenOptions::new().append(true).open(&seg.path).map_err(io_err(&seg.path))?;
            self.active = Some(f);
        }
        self.active.as_mut().ok_or_else(|| StorageError::Invalid("no active segment".into()))
    }

    /// Append `entries` (contiguous; the first may be at or below the last index, replacing the conflicting
    /// suffix as Raft requires) and fsync before returning.
    pub fn append(&mut self, entries: &[LogEntry]) -> Result<(), StorageError> {
        let Some(first) = entries.first() else { return Ok(()) };
        if entries.windows(2).any(|w| w[1].index != w[0].index + 1) {
            return Err(StorageError::Invalid("appended entries are not contiguous".into()));
        }
        if first.index <= self.snapshot.index || first.index > self.last_index() + 1 {
            return Err(StorageError::Invalid(format!(
                "append at {} but the log holds {}..={} after snapshot {}",
                first.index,
                self.first_index(),
                self.last_index(),
                self.snapshot.index
            )));
        }
        if let Some(e) = entries.iter().find(|e| e.data.len() > MAX_RECORD_BYTES) {
            return Err(StorageError::Invalid(format!("entry {} is {} bytes", e.index, e.data.len())));
        }
        if first.index <= self.last_index() {
            self.truncate_from(first.index)?;
        }
        if self.segments.last().is_some_and(|s| s.len >= self.segment_bytes) {
            self.active = None;
        }
        self.active_file()?;
        let segment = self.segments.len() - 1;
        let start = self.segments[segment].len;
        let mut batch = Vec::new();
        for e in entries {
            let offset = start + batch.len() as u64;
            self.locations.push(Location { segment, offset, batch_start: start, batch_first: first.index });
            batch.extend_from_slice(&frame(&entry_body(e)));
        }
        let last = entries.last().map_or(first.index, |e| e.index);
        let marker = frame(&marker_body(first.index, last, &batch));
        batch.extend_from_slice(&marker);
        let path = self.segments[segment].path.clone();
        let file = self.active_file()?;
        file.write_all(&batch).and_then(|()| file.sync_data()).map_err(io_err(&path))?;
        self.segments[segment].len += batch.len() as u64;
        self.entries.extend_from_slice(entries);
        Ok(())
    }

    /// Remove entries from `index` on, from memory and disk.
    fn truncate_from(&mut self, index: u64) -> Result<(), StorageError> {
        let Some(pos) = self.entries.iter().position(|e| e.index == index) else { return Ok(()) };
        let loc = self.locations[pos];
        self.active = None;
        // Later segments go entirely; the one holding `index` is cut at its record.
        while self.segments.len() > loc.segment + 1 {
            if let Some(seg) = self.segments.pop() {
                fs::remove_file(&seg.path).map_err(io_err(&seg.path))?;
            }
        }
        let seg = &mut self.segments[loc.segment];
        let mut f = OpenOptions::new().read(true).write(true).open(&seg.path).map_err(io_err(&seg.path))?;
        f.set_len(loc.offset).map_err(io_err(&seg.path))?;
        seg.len = loc.offset;
        if loc.batch_first < index {
            // The cut falls inside a batch: close what is left of it with its own marker, so recovery keeps it.
            let mut kept = vec![0u8; (loc.offset - loc.batch_start) as usize];
            f.seek(SeekFrom::Start(loc.batch_start))
                .and_then(|_| f.read_exact(&mut kept))
                .map_err(io_err(&seg.path))?;
            let marker = frame(&marker_body(loc.batch_first, index - 1, &kept));
            f.seek(SeekFrom::End(0)).and_then(|_| f.write_all(&marker)).map_err(io_err(&seg.path))?;
            seg.len += marker.len() as u64;
        }
        f.sync_all().map_err(io_err(&seg.path))?;
        self.entries.truncate(pos);
        self.locations.truncate(pos);
        sync_dir(&self.dir.join("log"))
    }

    /// Store a snapshot taken at `index`/`term` (from this node's state machine, or installed from the leader)
    /// and compact: entries up to `index` are dropped; if the log does not hold `index` with that term, the whole
    /// log is (a lagging node catching up).
    pub fn install_snapshot(&mut self, snapshot: Snapshot) -> Result<(), StorageError> {
        if snapshot.index < self.snapshot.index {
            return Err(StorageError::Invalid(format!(
                "snapshot at {} is older than the stored one at {}",
                snapshot.index, self.snapshot.index
            )));
        }
        if snapshot.data.len() > MAX_RECORD_BYTES {
            return Err(StorageError::Invalid(format!("snapshot is {} bytes", snapshot.data.len())));
        }
        let body = entry_body(&LogEntry { index: snapshot.index, term: snapshot.term, data: snapshot.data.clone() });
        replace_file(&self.dir.join("snapshot"), &frame(&body))?;
        let keeps_suffix = self.term(snapshot.index) == Some(snapshot.term);
        if keeps_suffix {
            let keep_from = self.entries.iter().position(|e| e.index > snapshot.index).unwrap_or(self.entries.len());
            self.entries.drain(..keep_from);
            self.locations.drain(..keep_from);
        } else {
            self.entries.clear();
            self.locations.clear();
        }
        self.snapshot = snapshot;
        self.drop_segments_below(self.snapshot.index + 1)?;
        if self.entries.is_empty() {
            self.drop_segments_below(u64::MAX)?;
        }
        Ok(())
    }

    /// Bytes of log on disk.
    pub fn log_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn entry(index: u64, term: u64) -> LogEntry {
        LogEntry { index, term, data: format!("command {index} of term {term}").into_bytes() }
    }

    fn entries(lo: u64, hi: u64, term: u64) -> Vec<LogEntry> {
        (lo..=hi).map(|i| entry(i, term)).collect()
    }

    fn copy_dir(from: &Path, to: &Path) {
        fs::create_dir_all(to.join("log")).unwrap();
        for sub in ["", "log"] {
            for item in fs::read_dir(from.join(sub)).unwrap() {
                let p = item.unwrap().path();
                if p.is_file() {
                    fs::copy(&p, to.join(sub).join(p.file_name().unwrap())).unwrap();
                }
            }
        }
    }

    fn last_segment(dir: &Path) -> PathBuf {
        let mut segs: Vec<PathBuf> = fs::read_dir(dir.join("log")).unwrap().map(|e| e.unwrap().path()).collect();
        segs.sort();
        segs.pop().unwrap()
    }

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn appends_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES).unwrap();
        s.append(&entries(1, 10, 1)).unwrap();
        s.set_hard_state(HardState { term: 1, vote: 2, commit: 7 }).unwrap();
        drop(s);
        let s = DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES).unwrap();
        assert_eq!((s.first_index(), s.last_index()), (1, 10));
        assert_eq!(s.entries(3, 5), &entries(3, 4, 1)[..]);
        assert_eq!(s.hard_state(), HardState { term: 1, vote: 2, commit: 7 });
        assert_eq!(s.term(10), Some(1));
    }

    #[test]
    fn a_crash_at_any_byte_of_an_append_loses_only_the_unacknowledged_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES).unwrap();
        s.append(&entries(1, 5, 1)).unwrap();
        let acknowledged = fs::metadata(last_segment(dir.path())).unwrap().len();
        s.append(&entries(6, 8, 2)).unwrap();
        drop(s);
        let full = fs::read(last_segment(dir.path())).unwrap();
        for cut in acknowledged as usize..=full.len() {
            let crashed = tempfile::tempdir().unwrap();
            copy_dir(dir.path(), crashed.path());
            let seg = last_segment(crashed.path());
            fs::write(&seg, &full[..cut]).unwrap();
            let mut r = DiskStorage::open(crashed.path(), DEFAULT_SEGMENT_BYTES).unwrap();
            let last = r.last_index();
            assert!((5..=8).contains(&last), "cut at {cut}: last index {last}");
            assert_eq!(r.entries(1, last + 1), &[entries(1, 5, 1), entries(6, last, 2)].concat()[..]);
            // The log continues cleanly after recovery.
            r.append(&[entry(last + 1, 3)]).unwrap();
            drop(r);
            assert_eq!(DiskStorage::open(crashed.path(), DEFAULT_SEGMENT_BYTES).unwrap().last_index(), last + 1);
        }
    }

    #[test]
    fn damage_before_the_tail_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES).unwrap();
        s.append(&entries(1, 3, 1)).unwrap();
        s.append(&entries(4, 6, 1)).unwrap();
        drop(s);
        let seg = last_segment(dir.path());
        let mut bytes = fs::read(&seg).unwrap();
        // A flipped byte in the first (acknowledged) batch, with the next batch's intact marker after it: not a
        // torn write.
        let second = HEADER + BODY_PREFIX + entry(1, 1).data.len() + HEADER + 3;
        bytes[second] ^= 0x40;
        fs::write(&seg, &bytes).unwrap();
        let err = DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES).unwrap_err();
        assert!(matches!(err, StorageError::Corrupt(_)), "{err}");
        // A damaged hard state is corruption too.
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES).unwrap();
        s.set_hard_state(HardState { term: 3, vote: 1, commit: 0 }).unwrap();
        drop(s);
        let mut hs = fs::read(dir.path().join("hardstate")).unwrap();
        hs[10] ^= 1;
        fs::write(dir.path().join("hardstate"), hs).unwrap();
        assert!(matches!(DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES), Err(StorageError::Corrupt(_))));
    }

    #[test]
    fn membership_survives_a_restart_and_damage_to_it_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES).unwrap();
        assert!(s.conf_state().is_empty());
        s.set_conf_state(b"voters 1 2 3").unwrap();
        s.set_conf_state(b"voters 1 2 3 4").unwrap();
        drop(s);
        assert_eq!(DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES).unwrap().conf_state(), b"voters 1 2 3 4");
        let mut cs = fs::read(dir.path().join("confstate")).unwrap();
        let last = cs.len() - 1;
        cs[last] ^= 1;
        fs::write(dir.path().join("confstate"), cs).unwrap();
        assert!(matches!(DiskStorage::open(dir.path(), DEFAULT_SEGMENT_BYTES), Err(StorageError::Corrupt(_))));
    }

    #[test]
    fn a_conflicting_suffix_is_replaced_on_disk_too() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::open(dir.path(), 200).unwrap();
        s.append(&entries(1, 4, 1)).unwrap();
        s.append(&entries(5, 10, 1)).unwrap();
        // The cut falls inside the second batch, and then again inside the first.
        s.append(&entries(6, 8, 2)).unwrap();
        s.append(&entries(3, 3, 3)).unwrap();
        s.append(&entries(4, 8, 3)).unwrap();
        assert_eq!(s.last_index(), 8);
        assert_eq!(s.term(6), Some(3));
        let want = [entries(1, 2, 1), entries(3, 8, 3)].concat();
        assert_eq!(s.entries(1, 9), &want[..]);
        drop(s);
        let mut s = DiskStorage::open(dir.path(), 200).unwrap();
        assert_eq!(s.entries(1, 9), &want[..]);
        assert!(s.append(&[entry(20, 2)]).is_err(), "a gap is refused");
    }

    #[test]
    fn snapshots_compact_the_log_and_catch_up_a_lagging_node() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::open(dir.path(), 150).unwrap();
        for lo in (1..=30).step_by(3) {
            s.append(&entries(lo, lo + 2, 1)).unwrap();
        }
        let before = fs::read_dir(dir.path().join("log")).unwrap().count();
        assert!(before > 3, "small segments roll over: {before}");
        s.install_snapshot(Snapshot { index: 20, term: 1, data: b"state at 20".to_vec() }).unwrap();
        assert_eq!((s.first_index(), s.last_index()), (21, 30));
        assert!(fs::read_dir(dir.path().join("log")).unwrap().count() < before, "old segments deleted");
        drop(s);
        let mut s = DiskStorage::open(dir.path(), 150).unwrap();
        assert_eq!((s.first_index(), s.last_index()), (21, 30));
        assert_eq!(s.snapshot().data, b"state at 20");
        assert_eq!(s.term(20), Some(1));
        assert!(s.append(&[entry(20, 1)]).is_err(), "nothing at or below the snapshot");
        // A leader's snapshot far ahead of this node's log replaces the log.
        s.install_snapshot(Snapshot { index: 100, term: 4, data: b"state at 100".to_vec() }).unwrap();
        assert_eq!((s.first_index(), s.last_index()), (101, 100));
        s.append(&entries(101, 103, 4)).unwrap();
        drop(s);
        let s = DiskStorage::open(dir.path(), 150).unwrap();
        assert_eq!((s.first_index(), s.last_index()), (101, 103));
        assert_eq!(s.snapshot().index, 100);
    }

    #[test]
    fn a_crash_between_snapshot_and_compaction_is_harmless() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DiskStorage::open(dir.path(), 150).unwrap();
        s.append(&entries(1, 12, 1)).unwrap();
        drop(s);
        // The snapshot file is written, the segments are not yet removed, and a stray temporary file remains.
        let body = entry_body(&LogEntry { index: 8, term: 1, data: b"s".to_vec() });
        fs::write(dir.path().join("snapshot"), frame(&body)).unwrap();
        fs::write(dir.path().join("hardstate.tmp"), b"half written").unwrap();
        let s = DiskStorage::open(dir.path(), 150).unwrap();
        assert_eq!((s.first_index(), s.last_index()), (9, 12));
        assert_eq!(s.entries(9, 13), &entries(9, 12, 1)[..]);
        assert!(!dir.path().join("hardstate.tmp").exists());
    }
}
