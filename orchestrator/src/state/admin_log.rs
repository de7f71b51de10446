//! Who did what as an operator: every admin write and every read of secrets (`GetState`, `GetDataKeys`), with the
//! admin certificate's node id and the proposer's clock, replicated like the rest of the state (so every
//! orchestrator holds the same record, and it survives them). Bounded: the newest [`ADMIN_LOG_ENTRIES`].

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Entries kept.
pub const ADMIN_LOG_ENTRIES: usize = 10_000;

/// One operator action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminEntry {
    /// Unix ms at the orchestrator that proposed it.
    pub at_ms: u64,
    /// The admin certificate's node id.
    pub by: String,
    /// The command applied (its kind), or `read:<what>` for a read of secrets.
    pub action: String,
    /// What it named (a key id, a project, a worker...), when one thing.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subject: String,
}

/// The bounded log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminLog {
    entries: VecDeque<AdminEntry>,
}

impl AdminLog {
    /// Record an action.
    pub fn record(&mut self, entry: AdminEntry) {
        if self.entries.len() >= ADMIN_LOG_ENTRIES {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &AdminEntry> {
        self.entries.iter()
    }
}
