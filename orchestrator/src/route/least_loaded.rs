//! Least-loaded: the candidate with the lowest load score
//! `queue_depth + running_sequences / max_running_sequences + kv_used / (kv_used + kv_free)`: a queued request
//! outweighs a full batch, which outweighs a full KV cache. Requests routed since its last report count as
//! sequences (running while slots are free, queued after). Ties go to the lower worker id.

use zl_wire::message::RouteRequest;

use super::{Candidate, Pick, Policy, lowest};

/// The least-loaded policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastLoaded;

/// A candidate's load score (lower is better).
pub(super) fn load_score(c: &Candidate<'_>) -> f64 {
    let l = c.load;
    let (running, waiting) = c.sequences();
    let running = f64::from(running) / f64::from(c.worker.spec.max_running_sequences.max(1));
    let kv_total = f64::from(l.kv_blocks_used) + f64::from(l.kv_blocks_free);
    let kv = if kv_total > 0.0 { f64::from(l.kv_blocks_used) / kv_total } else { 0.0 };
    f64::from(waiting) + running + kv
}

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least-loaded"
    }

    fn pick(&self, _request: &RouteRequest, candidates: &[Candidate<'_>]) -> Pick {
        let (best, best_score) = lowest(candidates, load_score);
        let c = &candidates[best];
        Pick {
            index: best,
            reason: format!(
                "lowest load {best_score:.2} (queue {}, running {}/{}, in flight {})",
                c.load.queue_depth, c.load.running_sequences, c.worker.spec.max_running_sequences, c.in_flight
            ),
        }
    }
}
