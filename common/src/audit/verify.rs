//! Checking a chain: every line's hash, every link, no gap in the sequence numbers, and, given a head committed to
//! the Raft group, that the chain still reaches that head with the same hash (so truncation is caught too).

use serde::{Deserialize, Serialize};

use super::{AuditRecord, GENESIS, decode_line};

/// A frontend's chain head as committed to the routing state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    /// Sequence number of the newest record committed.
    pub seq: u64,
    /// Its hash (hex).
    pub hash: String,
}

/// The first bad record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{segment} line {line} (record {seq}): {problem}")]
pub struct Broken {
    /// Segment file.
    pub segment: String,
    /// Line number in it, from 1.
    pub line: usize,
    /// The sequence number the record should have.
    pub seq: u64,
    /// What is wrong.
    pub problem: String,
}

/// A verified chain.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Records checked.
    pub records: u64,
    /// First sequence number (above 1 when retention removed older segments).
    pub first_seq: u64,
    /// The newest record.
    pub head: ChainHead,
    /// The frontend that wrote it (from its records).
    pub frontend: String,
}

/// Checks one frontend's chain, line by line, in order.
#[derive(Debug, Default)]
pub struct Verifier {
    summary: Summary,
    /// Where the last line came from, for naming the end of the chain.
    last_place: (String, usize),
    committed: Option<ChainHead>,
    committed_seen: bool,
    allow_pruned: bool,
}

impl Verifier {
    /// A verifier; `committed` is the head the Raft group holds for this chain, if known; `allow_pruned` accepts
    /// a chain whose oldest segments retention removed (it then starts above record 1).
    pub fn new(committed: Option<ChainHead>, allow_pruned: bool) -> Self {
        Verifier { committed, allow_pruned, ..Verifier::default() }
    }

    /// Check the next line (record `line` of `segment`); returns the record.
    pub fn push(&mut self, segment: &str, line: usize, bytes: &[u8]) -> Result<AuditRecord, Broken> {
        let expected = if self.summary.records == 0 { None } else { Some(self.summary.head.seq + 1) };
        let broken =
            |problem: String| Broken { segment: segment.to_owned(), line, seq: expected.unwrap_or(1), problem };
        if !bytes.ends_with(b"\n") {
            return Err(broken("the line is incomplete (no newline): a torn or truncated write".into()));
        }
        let (hash, record) = decode_line(bytes).map_err(broken)?;
        match expected {
            Some(seq) if record.seq != seq => {
                return Err(broken(format!("sequence number {} where {seq} was due: records are missing", record.seq)));
            }
            Some(_) if record.prev != self.summary.head.hash => {
                return Err(broken("its prev hash is not the hash of the record before it".into()));
            }
            Some(_) if record.frontend != self.summary.frontend => {
                return Err(broken(format!(
                    "written by frontend {:?}, not {:?}",
                    record.frontend, self.summary.frontend
                )));
            }
            Some(_) => {}
            None if record.seq == 1 && record.prev != GENESIS => {
                return Err(broken("the first record does not start the chain (prev is not zero)".into()));
            }
            None if record.seq != 1 && !self.allow_pruned => {
                return Err(broken(format!(
                    "the chain starts at record {}: older records are missing (pass --allow-pruned if retention \
                     removed them)",
                    record.seq
                )));
            }
            None => {
                self.summary.first_seq = record.seq;
                self.summary.frontend = record.frontend.clone();
            }
        }
        if let Some(head) = &self.committed
            && head.seq == record.seq
        {
            if head.hash != hash {
                return Err(broken(format!(
                    "its hash differs from the head committed to the orchestrators ({:.16}…)",
                    head.hash
                )));
            }
            self.committed_seen = true;
        }
        self.summary.records += 1;
        self.summary.head = ChainHead { seq: record.seq, hash };
        self.last_place = (segment.to_owned(), line);
        Ok(record)
    }

    /// The chain is complete: check it reaches the committed head.
    pub fn finish(self) -> Result<Summary, Broken> {
        if let Some(head) = &self.committed
            && !self.committed_seen
            && head.seq > 0
            && !(self.allow_pruned && self.summary.records > 0 && head.seq < self.summary.first_seq)
        {
            let (segment, line) = self.last_place;
            let first = self.summary.first_seq;
            let problem = if self.summary.records > 0 && head.seq < first {
                format!("the committed head (record {}) is older than the oldest record kept ({first})", head.seq)
            } else {
                format!(
                    "the log ends at record {} but the orchestrators hold record {} as committed: newer records \
                     were removed (truncated)",
                    self.summary.head.seq, head.seq
                )
            };
            return Err(Broken { segment, line, seq: self.summary.head.seq + 1, problem });
        }
        Ok(self.summary)
    }
}
