//! Stored Responses API responses as frontends reach them: a store is one Raft command (its project's bounds and
//! the proposer's clock in it); a read is local, after this node has applied everything committed when the read
//! arrived, so a response stored through any orchestrator is found through any other.

use std::time::{Duration, Instant};

use zl_wire::message::{ResponseFound, ResponseLookup, StoredResponse};

use crate::orchestrator::{Orchestrator, unix_ms};
use crate::raft::CommitError;
use crate::state::responses::{Bounds, Stored};
use crate::state::{Command, CommandError};

/// The bounds where the operator set none: 1,000 responses and 2 MiB of records a project, 6 MiB in all (the
/// store travels in Raft snapshots, single messages of at most 16 MiB with the rest of the state).
pub const DEFAULT_BOUNDS: Bounds = Bounds { count: 1_000, bytes: 2 << 20, total: 6 << 20 };

/// How long a read waits for this node to apply what was committed when it arrived.
const CATCH_UP: Duration = Duration::from_secs(1);

impl Orchestrator {
    /// Keep at most `bounds` of each project's responses from now on (once; later calls are ignored).
    pub fn set_response_bounds(&self, bounds: Bounds) {
        let _ = self.response_bounds.set(bounds);
    }

    /// Each project's bounds.
    pub fn response_bounds(&self) -> Bounds {
        self.response_bounds.get().copied().unwrap_or(DEFAULT_BOUNDS)
    }

    /// Store `r` for its project (replacing one of the same id).
    pub async fn store_response(&self, r: StoredResponse) -> Result<u64, CommitError> {
        let now_ms = unix_ms();
        let stored = Stored {
            created_at: r.created_at,
            expires_ms: now_ms.saturating_add(u64::from(r.ttl_s) * 1000),
            body: r.body,
        };
        let cmd =
            Command::StoreResponse { project: r.project, id: r.id, stored, bounds: self.response_bounds(), now_ms };
        let index = self.commit(&cmd).await?;
        let (count, bytes) = self.with_state(|s| s.responses().totals());
        metrics::gauge!("zl_stored_responses").set(count as f64);
        metrics::gauge!("zl_stored_response_bytes").set(bytes as f64);
        Ok(index)
    }

    /// Read or delete a project's stored response.
    pub async fn lookup_response(&self, r: ResponseLookup) -> Result<ResponseFound, CommitError> {
        if r.delete {
            let cmd = Command::DeleteResponse { project: r.project, id: r.id, now_ms: unix_ms() };
            return match self.commit(&cmd).await {
                Ok(_) => Ok(ResponseFound { found: true, ..ResponseFound::default() }),
                Err(CommitError::Command(CommandError::NotFound(_))) => Ok(ResponseFound::default()),
                Err(e) => Err(e),
            };
        }
        let found = |o: &Orchestrator| {
            o.with_state(|s| {
                s.responses().get(&r.project, &r.id, unix_ms()).map(|s| ResponseFound {
                    found: true,
                    body: s.body.clone(),
                    created_at: s.created_at,
                })
            })
        };
        if let Some(hit) = found(self) {
            return Ok(hit);
        }
        // Not here: it may be committed and not applied here yet (stored through another orchestrator a moment
        // ago). Wait until this node has applied what was committed when the read came, then look again.
        let committed = self.group().status().commit;
        let deadline = Instant::now() + CATCH_UP;
        while self.with_state(|s| s.applied_index()) < committed && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(found(self).unwrap_or_default())
    }
}
