//! Session affinity: requests with the same session id go to the same worker while it stays a candidate, so a
//! conversation's KV cache is reused without prefix hashing. Rendezvous (highest-random-weight) hashing over the
//! candidates: when a worker leaves, only its sessions move, each to its own next choice. Without a session id,
//! least-loaded decides.

use zl_wire::message::RouteRequest;

use super::{Candidate, LeastLoaded, Pick, Policy};
use crate::hash::{mix, stable_hash};

/// The session-affinity policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionAffinity;

impl Policy for SessionAffinity {
    fn name(&self) -> &'static str {
        "session-affinity"
    }

    fn pick(&self, request: &RouteRequest, candidates: &[Candidate<'_>]) -> Pick {
        let Some(session) = request.session_id.as_deref().filter(|s| !s.is_empty()) else {
            let pick = LeastLoaded.pick(request, candidates);
            return Pick { index: pick.index, reason: format!("no session id, {}", pick.reason) };
        };
        let key = stable_hash(session);
        let mut best = 0;
        let mut best_weight = 0u64;
        for (i, c) in candidates.iter().enumerate() {
            let weight = mix(key ^ c.id_hash);
            if i == 0 || weight > best_weight {
                best = i;
                best_weight = weight;
            }
        }
        Pick { index: best, reason: "session affinity (rendezvous hash)".into() }
    }
}
