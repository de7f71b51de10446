//! The disk tier: one file per block (`file`'s format) in `<dir>/<namespace>/`, least recently used first out,
//! never more than its byte bound. The index ([`DiskIndex`]) is pure and is what the engine asks; the file
//! operations beside it run outside any lock (a writer thread, the requests' prefetches), so a decode step never
//! waits for the disk.
//!
//! A restarted worker finds its blocks again by scanning its namespace's directory: files of the right size are
//! indexed (oldest first out, by modification time), anything else there (a torn temporary file, a truncated block)
//! is removed. A file's contents are checked when it is read; one that fails is removed and its block recomputed.

use std::path::{Path, PathBuf};

use zl_common::block_hash::BlockHash;

use super::file::{self, BadFile};
use super::lru::Lru;
use super::{Namespace, TierBlock};

/// The lock file in a namespace's directory.
const LOCK: &str = ".lock";

/// Which blocks the disk tier holds, in LRU order, within its bound.
#[derive(Debug)]
pub struct DiskIndex {
    file_bytes: u64,
    lru: Lru<()>,
}

impl DiskIndex {
    /// An empty index of at most `cap` bytes of files of `file_bytes` bytes each.
    pub fn new(cap: u64, file_bytes: u64) -> Self {
        DiskIndex { file_bytes, lru: Lru::new(cap) }
    }

    /// Mark `hash` the most recently used, if held.
    pub fn touch(&mut self, hash: BlockHash) -> bool {
        self.lru.touch(hash)
    }

    /// Record `hash` as held (the most recently used), evicting the least recently used as the bound needs: returns
    /// the evicted hashes, whose files the caller removes (none when it was held already: its file is written
    /// again). `None` when a file is larger than the whole bound.
    pub fn admit(&mut self, hash: BlockHash) -> Option<Vec<BlockHash>> {
        let evicted = self.lru.insert(hash, (), self.file_bytes)?;
        Some(evicted.into_iter().map(|(h, ())| h).collect())
    }

    /// Forget `hash` (its file is gone or bad).
    pub fn remove(&mut self, hash: BlockHash) -> bool {
        self.lru.remove(hash).is_some()
    }
}

/// Its sizes and what it holds (or is about to hold), read through the order it keeps ([`Lru`]'s figures).
impl std::ops::Deref for DiskIndex {
    type Target = Lru<()>;

    fn deref(&self) -> &Lru<()> {
        &self.lru
    }
}

/// A disk tier's directory and the shape of its blocks.
#[derive(Clone, Debug)]
pub struct DiskDir {
    /// `<root>/<namespace>`.
    pub dir: PathBuf,
    /// The namespace every file must carry.
    pub ns: Namespace,
    /// Tokens per block.
    pub tokens: usize,
    /// Payload bytes per block.
    pub payload: usize,
}

/// What opening a disk tier found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Opened {
    /// Blocks indexed.
    pub kept: usize,
    /// Files removed: not block files of the right size, or beyond the bound.
    pub removed: usize,
}

impl DiskDir {
    /// The directory for namespace `ns` under `root`.
    pub fn new(root: &Path, ns: Namespace, tokens: usize, payload: usize) -> Self {
        DiskDir { dir: root.join(ns.hex()), ns, tokens, payload }
    }

    /// Bytes each block's file takes.
    pub fn file_bytes(&self) -> u64 {
        file::file_bytes(self.tokens, self.payload) as u64
    }

    fn path(&self, hash: BlockHash) -> PathBuf {
        self.dir.join(format!("{hash:016x}.kvb"))
    }

    /// Create the directory if needed, lock it (the returned file holds the lock: keep it while the tier is in
    /// use; another process's lock is an error naming the directory) and index what it holds, within `cap` bytes
    /// (oldest first out).
    pub fn open(&self, cap: u64) -> std::io::Result<(DiskIndex, Opened, std::fs::File)> {
        std::fs::create_dir_all(&self.dir)?;
        let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(self.dir.join(LOCK))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(std::io::Error::other(format!(
                    "{} is in use by another worker: give each worker a KV disk directory of its own",
                    self.dir.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        let mut found = Vec::new();
        let mut opened = Opened::default();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let hash = name
                .to_str()
                .and_then(|n| n.strip_suffix(".kvb"))
                .filter(|h| h.len() == 16)
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            let meta = entry.metadata()?;
            if name == LOCK {
                continue;
            }
            match hash {
                Some(hash) if meta.is_file() && meta.len() == self.file_bytes() => {
                    found.push((meta.modified().ok(), hash));
                }
                _ if meta.is_file() => {
                    let _ = std::fs::remove_file(entry.path());
                    opened.removed += 1;
                }
                _ => {}
            }
        }
        found.sort();
        let mut index = DiskIndex::new(cap, self.file_bytes());
        for (_, hash) in found {
            match index.admit(hash) {
                Some(evicted) => {
                    for old in evicted {
                        self.delete(old);
                        opened.removed += 1;
                    }
                }
                None => {
                    self.delete(hash);
                    opened.removed += 1;
                }
            }
        }
        opened.kept = index.len();
        Ok((index, opened, lock))
    }

    /// Write `block`'s file (a temporary file renamed into place, so a reader never sees half of one).
    pub fn write(&self, block: &TierBlock) -> std::io::Result<()> {
        let path = self.path(block.hash);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, file::encode(self.ns, block))?;
        std::fs::rename(&tmp, &path)
    }

    /// Read and check block `hash`: `Ok(None)` when its file is gone, `Err` when it is bad.
    pub fn read(&self, hash: BlockHash) -> Result<Option<TierBlock>, BadFile> {
        match std::fs::read(self.path(hash)) {
            Ok(bytes) => file::decode(&bytes, self.ns, hash, self.tokens, self.payload).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Remove block `hash`'s file, if any.
    pub fn delete(&self, hash: BlockHash) {
        let _ = std::fs::remove_file(self.path(hash));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(hash: BlockHash) -> TierBlock {
        TierBlock { hash, tokens: vec![hash as u32; 4].into(), payload: vec![hash as u8; 64].into() }
    }

    #[test]
    fn the_index_keeps_its_bound_lru_first() {
        let mut ix = DiskIndex::new(300, 100);
        assert_eq!(ix.admit(1), Some(vec![]));
        assert_eq!(ix.admit(2), Some(vec![]));
        assert_eq!(ix.admit(3), Some(vec![]));
        assert_eq!(ix.admit(3), Some(vec![]), "held already: written again, nothing evicted");
        assert!(ix.touch(1));
        assert_eq!(ix.admit(4), Some(vec![2]));
        assert_eq!(ix.bytes(), 300);
        assert!(ix.remove(1) && !ix.remove(1));
        assert_eq!(DiskIndex::new(50, 100).admit(1), None, "a file larger than the bound");
    }

    #[test]
    fn files_survive_a_reopen_and_bad_ones_are_refused_or_removed() {
        let root = tempfile::tempdir().unwrap();
        let d = DiskDir::new(root.path(), Namespace(5), 4, 64);
        let (mut ix, opened, lock) = d.open(10 * d.file_bytes()).unwrap();
        assert_eq!(opened, Opened::default());
        let taken = d.open(10 * d.file_bytes()).unwrap_err().to_string();
        assert!(taken.contains("in use by another worker"), "{taken}");
        drop(lock);
        for h in 1..=3 {
            ix.admit(h).unwrap();
            d.write(&block(h)).unwrap();
        }
        // A torn temporary file and a truncated block are removed on reopening; the rest are indexed again.
        std::fs::write(d.dir.join("0000000000000009.tmp"), b"half").unwrap();
        std::fs::write(d.dir.join("0000000000000008.kvb"), b"short").unwrap();
        let (ix, opened, lock) = d.open(10 * d.file_bytes()).unwrap();
        assert_eq!(opened, Opened { kept: 3, removed: 2 });
        drop(lock);
        assert!(ix.contains(1) && ix.contains(3));
        assert_eq!(d.read(2).unwrap(), Some(block(2)));
        assert_eq!(d.read(7).unwrap(), None, "no file");
        // A flipped byte is caught when read.
        let path = d.dir.join(format!("{:016x}.kvb", 3u64));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[60] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(d.read(3), Err(BadFile::Checksum));
        // Another namespace's directory sees none of them; a smaller bound drops the oldest on reopening.
        let other = DiskDir::new(root.path(), Namespace(6), 4, 64);
        assert_eq!(other.open(1 << 20).unwrap().1.kept, 0);
        let (ix, opened, _lock) = d.open(2 * d.file_bytes()).unwrap();
        assert_eq!((opened.kept, opened.removed, ix.bytes()), (2, 1, 2 * d.file_bytes()));
    }
}
