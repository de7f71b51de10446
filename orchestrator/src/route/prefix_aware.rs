//! Prefix-aware (KV-cache-aware) routing, after Dynamo's KV router cost function: send a request where its
//! prompt's leading KV blocks are already cached, unless that worker is so busy that recomputing elsewhere is
//! cheaper. Cost, in blocks of work (lower is better):
//!
//! ```text
//! cost = prefill_weight * (prompt_blocks - cached_prefix_blocks)
//!      + load_weight * (queue_depth + running_sequences)
//! ```
//!
//! `prompt_blocks` is the number of full blocks in the prompt (the request's block hashes); the cached prefix is
//! what the worker's KV events say it holds. A queued or running sequence costs `load_weight` blocks (default 4:
//! a sequence in the batch slows every step a little, which a short prefill saving does not outweigh). Ties go to
//! the lower worker id.

use zl_proto::message::RouteRequest;

use super::{Candidate, Pick, Policy, lowest};

/// The prefix-aware policy.
#[derive(Clone, Copy, Debug)]
pub struct PrefixAware {
    /// Cost of one block of prompt to prefill.
    pub prefill_weight: f64,
    /// Cost, in blocks, of one queued or running sequence.
    pub load_weight: f64,
}

impl Default for PrefixAware {
    fn default() -> Self {
        PrefixAware { prefill_weight: 1.0, load_weight: 4.0 }
    }
}

impl PrefixAware {
    /// A candidate's cost for a prompt of `prompt_blocks` full blocks.
    pub fn cost(&self, c: &Candidate<'_>, prompt_blocks: usize) -> f64 {
        let new_blocks = prompt_blocks.saturating_sub(c.prefix_blocks as usize) as f64;
        self.prefill_weight * new_blocks
            + self.load_weight * (f64::from(c.load.queue_depth) + f64::from(c.load.running_sequences))
    }
}

impl Policy for PrefixAware {
    fn name(&self) -> &'static str {
        "prefix-aware"
    }

    fn pick(&self, request: &RouteRequest, candidates: &[Candidate<'_>]) -> Pick {
        let blocks = request.block_hashes.len();
        let (best, best_cost) = lowest(candidates, |c| self.cost(c, blocks));
        let c = &candidates[best];
        Pick {
            index: best,
            reason: format!(
                "{} of {blocks} prompt blocks cached, queue {} + running {}, cost {best_cost:.1}",
                c.prefix_blocks, c.load.queue_depth, c.load.running_sequences
            ),
        }
    }
}
