//! The audit chain heads the frontends commit (docs/audit.md): the newest per frontend, a short history of the
//! heads before it, and the heads refused because they contradict what was committed. Pure and deterministic, like
//! the rest of the ledger.
//!
//! A head only moves forward along one chain: a report naming a newer record is taken; one naming a record already
//! committed must name it with the same hash, or it is refused and counted (a rewritten chain, or another process
//! speaking for the frontend); one naming an older record than the newest must match the history, or it is refused
//! too (a chain that was rolled back or started over). `zl audit verify` fails a frontend with refused heads, and
//! a frontend whose committed head is ahead of its own chain refuses to serve until an operator resets its head
//! (`zl admin audit-reset`), which keeps the old heads in the history.

use serde::{Deserialize, Serialize};
use zl_common::audit::ChainHead;

use super::Ledger;

/// Heads kept per frontend before the current one (the newest ones).
pub const HEAD_HISTORY: usize = 64;

/// A committed head and when.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadEntry {
    /// The head.
    pub head: ChainHead,
    /// When committed (unix ms).
    pub at_ms: u64,
}

/// Heads that contradicted the committed chain, for the alarm.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// How many were refused.
    pub count: u64,
    /// The last one.
    pub last: ChainHead,
    /// When it was refused (unix ms).
    pub at_ms: u64,
}

/// What the ledger keeps of a frontend's heads beside the current one (`Ledger::heads`, whose JSON form older
/// snapshots share).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadRecords {
    /// Older heads, oldest first, at most [`HEAD_HISTORY`]; a reset's old current head ends up here too.
    #[serde(default)]
    pub history: Vec<HeadEntry>,
    /// Contradicting heads refused.
    #[serde(default)]
    pub refused: Option<Refused>,
    /// Operator resets (`zl admin audit-reset`), each the unix ms it was applied at (the newest ones).
    #[serde(default)]
    pub resets: Vec<u64>,
}

impl HeadRecords {
    fn remember(&mut self, entry: HeadEntry) {
        self.history.push(entry);
        if self.history.len() > HEAD_HISTORY {
            self.history.remove(0);
        }
    }
}

/// What a reported head did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadOutcome {
    /// It is the new current head.
    Advanced,
    /// It was already known (the current head, or one of the history).
    Known,
    /// It contradicts the committed chain and was refused.
    Refused,
}

impl Ledger {
    /// Apply a head `frontend` reported at `now_ms`.
    pub fn commit_head(&mut self, frontend: &str, head: ChainHead, now_ms: u64) -> HeadOutcome {
        let records = self.head_records.entry(frontend.to_owned()).or_default();
        let outcome = match self.heads.get(frontend) {
            None => HeadOutcome::Advanced,
            Some(c) if head.seq > c.head.seq => HeadOutcome::Advanced,
            Some(c) if head == c.head => HeadOutcome::Known,
            Some(c) if head.seq == c.head.seq => HeadOutcome::Refused,
            Some(_) if records.history.iter().any(|h| h.head == head) => HeadOutcome::Known,
            // Older than the newest, and not a head this chain had: rolled back, started over, or forged. A head
            // older than the whole history cannot be checked here; it is refused as well (the chain must grow).
            Some(_) => HeadOutcome::Refused,
        };
        match outcome {
            HeadOutcome::Advanced => {
                if let Some(old) = self.heads.insert(frontend.to_owned(), HeadEntry { head, at_ms: now_ms }) {
                    records.remember(old);
                }
            }
            HeadOutcome::Known => {}
            HeadOutcome::Refused => {
                let refused = records.refused.get_or_insert_with(Refused::default);
                refused.count += 1;
                refused.last = head;
                refused.at_ms = now_ms;
            }
        }
        if records == &HeadRecords::default() {
            self.head_records.remove(frontend);
        }
        outcome
    }

    /// An operator's reset of `frontend`'s head at `now_ms`: the current head goes to the history and the next
    /// report starts the chain afresh. False when the frontend has no head.
    pub fn reset_head(&mut self, frontend: &str, now_ms: u64) -> bool {
        let Some(old) = self.heads.remove(frontend) else { return false };
        let records = self.head_records.entry(frontend.to_owned()).or_default();
        records.remember(old);
        records.resets.push(now_ms);
        if records.resets.len() > HEAD_HISTORY {
            records.resets.remove(0);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(seq: u64, hash: &str) -> ChainHead {
        ChainHead { seq, hash: hash.into() }
    }

    #[test]
    fn heads_only_move_forward_along_one_chain() {
        let mut l = Ledger::default();
        assert_eq!(l.commit_head("fe", h(3, "c"), 1), HeadOutcome::Advanced);
        assert_eq!(l.commit_head("fe", h(5, "e"), 2), HeadOutcome::Advanced);
        assert_eq!(l.commit_head("fe", h(5, "e"), 3), HeadOutcome::Known, "a repeated report");
        assert_eq!(l.commit_head("fe", h(3, "c"), 4), HeadOutcome::Known, "a late report of an older head");
        assert_eq!(l.heads["fe"].head.seq, 5);
        // The same record with another hash: a rewritten chain or an impostor. Refused and counted.
        assert_eq!(l.commit_head("fe", h(5, "forged"), 5), HeadOutcome::Refused);
        // A chain that started over (an emptied audit directory) or was rolled back.
        assert_eq!(l.commit_head("fe", h(1, "new"), 6), HeadOutcome::Refused);
        assert_eq!(l.commit_head("fe", h(4, "d"), 7), HeadOutcome::Refused, "a head this chain never had");
        let refused = l.head_records["fe"].refused.clone().unwrap();
        assert_eq!((refused.count, refused.last, refused.at_ms), (3, h(4, "d"), 7));
        assert_eq!(l.heads["fe"].head, h(5, "e"), "refusals change nothing else");
        // Another frontend's heads are its own.
        assert_eq!(l.commit_head("fe-2", h(1, "x"), 7), HeadOutcome::Advanced);
        assert!(!l.head_records.contains_key("fe-2"));
        // An operator's reset lets a new chain start; the old heads stay in the history.
        assert!(l.reset_head("fe", 8));
        assert!(!l.reset_head("nobody", 8));
        assert_eq!(l.commit_head("fe", h(1, "new"), 9), HeadOutcome::Advanced);
        let records = &l.head_records["fe"];
        assert_eq!(records.history.iter().map(|e| e.head.seq).collect::<Vec<_>>(), vec![3, 5]);
        assert_eq!(records.resets, vec![8]);
    }

    #[test]
    fn the_history_is_bounded() {
        let mut l = Ledger::default();
        for seq in 1..=(HEAD_HISTORY as u64 + 10) {
            l.commit_head("fe", h(seq, &seq.to_string()), seq);
        }
        assert_eq!(l.head_records["fe"].history.len(), HEAD_HISTORY);
        assert_eq!(l.head_records["fe"].history[0].head.seq, 10);
    }
}
