//! The audit log on disk, its one home: a chain directory of size-rotated segment files
//! (`audit-<first seq, 20 digits>.log`, so sorting names sorts segments), each holding whole record lines. The
//! frontend writes it ([`write::SegmentWriter`]: appends, rotates, prunes, syncs, never leaves a torn record);
//! `zl audit verify` and `zl audit export` read it ([`read::verify_dir`]); a restarted writer resumes from it
//! ([`read::resume`]). What a line holds and how records chain are `zl_common::audit`'s (pure); what goes into a
//! record is the frontend's.

pub mod read;
pub mod write;

use std::path::{Path, PathBuf};

pub use read::{DirError, Resume, resume, verify_dir};
pub use write::{Fsync, SegmentConfig, SegmentWriter};

/// Name of the segment file whose first record is `first_seq`: sorting names sorts segments.
pub fn segment_name(first_seq: u64) -> String {
    format!("audit-{first_seq:020}.log")
}

/// The first sequence number of a segment file name, if it is one.
pub fn segment_first_seq(name: &str) -> Option<u64> {
    name.strip_prefix("audit-")?.strip_suffix(".log")?.parse().ok()
}

/// The segment files of a chain directory, oldest first.
pub fn segments(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if let Some(first) = entry.file_name().to_str().and_then(segment_first_seq) {
            found.push((first, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_sort_and_parse() {
        assert_eq!(segment_name(7), "audit-00000000000000000007.log");
        assert_eq!(segment_first_seq(&segment_name(42)), Some(42));
        assert!(segment_name(9) < segment_name(10));
        assert_eq!(segment_first_seq("notes.txt"), None);
        assert_eq!(segment_first_seq("audit-x.log"), None);
    }
}
