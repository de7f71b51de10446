//! Round-robin: each decision takes the next candidate in worker-id order. The counter is per orchestrator (it is
//! soft state), so with several orchestrators the rotation interleaves; load still spreads evenly.

use std::sync::atomic::{AtomicU64, Ordering};

use zl_wire::message::RouteRequest;

use super::{Candidate, Pick, Policy};

/// The round-robin policy.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicU64,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn pick(&self, _request: &RouteRequest, candidates: &[Candidate<'_>]) -> Pick {
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        let index = (turn % candidates.len() as u64) as usize;
        Pick { index, reason: format!("turn {turn}") }
    }
}
