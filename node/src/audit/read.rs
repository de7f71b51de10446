//! Reading a chain directory: verifying it segment by segment (`zl audit verify`, `zl audit export`), and where
//! a writer resumes after a restart (a torn last record cut off).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use zl_common::audit::{AuditRecord, Broken, ChainHead, MAX_LINE, Summary, Verifier};

use super::segments;

/// Why a directory does not verify.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A file could not be read.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The chain is broken.
    #[error("{0}")]
    Broken(#[from] Broken),
}

/// Verify the chain in `dir` (against the head committed for it, if given), calling `each` with every record in
/// order. An empty directory is an empty chain, unless a head says records were committed.
pub fn verify_dir(
    dir: &Path,
    committed: Option<ChainHead>,
    allow_pruned: bool,
    mut each: impl FnMut(&AuditRecord),
) -> Result<Summary, DirError> {
    let io = |p: &Path, e| DirError::Io(p.display().to_string(), e);
    let mut verifier = Verifier::new(committed, allow_pruned);
    for (_, path) in segments(dir).map_err(|e| io(dir, e))? {
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let mut reader = BufReader::new(File::open(&path).map_err(|e| io(&path, e))?);
        let mut line = Vec::new();
        for n in 1.. {
            line.clear();
            let read =
                (&mut reader).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line).map_err(|e| io(&path, e))?;
            if read == 0 {
                break;
            }
            if line.len() > MAX_LINE {
                return Err(Broken {
                    segment: name,
                    line: n,
                    seq: 0,
                    problem: format!("the line is longer than {MAX_LINE} bytes"),
                }
                .into());
            }
            each(&verifier.push(&name, n, &line)?);
        }
    }
    Ok(verifier.finish()?)
}

/// Where a writer resumes.
#[derive(Debug, Default)]
pub struct Resume {
    /// The newest segment and its size (after any torn record was cut off).
    pub newest: Option<(PathBuf, u64)>,
    /// The chain head: the newest whole record (none for an empty chain).
    pub head: Option<ChainHead>,
    /// What was cut off, if a write had been torn by a crash.
    pub torn: Option<String>,
}

/// Where a writer resumes the chain in `dir`. An incomplete last line (a write torn by a crash) is cut off and
/// reported, so the chain continues from the last whole record.
pub fn resume(dir: &Path) -> std::io::Result<Resume> {
    let segments = segments(dir)?;
    let Some((_, newest)) = segments.last() else { return Ok(Resume::default()) };
    let bytes = std::fs::read(newest)?;
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut torn = None;
    if whole < bytes.len() {
        let f = std::fs::OpenOptions::new().write(true).open(newest)?;
        f.set_len(whole as u64)?;
        f.sync_all()?;
        torn = Some(format!("cut {} bytes of an incomplete record off {}", bytes.len() - whole, newest.display()));
    }
    // The head is the last whole line of the newest segment that has one.
    let mut head = None;
    for (_, path) in segments.iter().rev() {
        let text = if path == newest { bytes[..whole].to_vec() } else { std::fs::read(path)? };
        if let Some(line) = text.split(|&b| b == b'\n').rfind(|l| !l.is_empty()) {
            let (hash, record) = zl_common::audit::decode_line(line).map_err(std::io::Error::other)?;
            head = Some(ChainHead { seq: record.seq, hash });
            break;
        }
    }
    Ok(Resume { newest: Some((newest.clone(), whole as u64)), head, torn })
}
