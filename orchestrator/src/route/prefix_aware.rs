//! Prefix-aware (KV-cache-aware) routing, after Dynamo's KV router cost function: send a request where its
//! prompt's leading KV blocks are already cached, unless that worker is so busy that recomputing elsewhere is
//! cheaper. Cost, in blocks of work (lower is better):
//!
//! ```text
//! cost = prefill_weight * (own * new_blocks + queued_prefill_blocks + in_flight_blocks)
//!      + load_weight * (queue_depth + running_sequences + in_flight)
//!      + adapter_load_weight * (1 if the request's LoRA adapter is cold there, else 0)
//! new_blocks = prompt_blocks - cached_prefix_blocks + host_block_weight * host + disk_block_weight * disk
//! own = 2 where prompt work is waiting (queued prefill or in-flight blocks), else 1
//! ```
//!
//! `host` and `disk` are the prefix blocks the worker keeps in its KV tiers rather than its KV cache (its events
//! say where each block is, docs/worker.md, "Lower tiers"): taking one back costs a copy from host memory or a read
//! from disk, not a recomputation. Measured on the bundled model (docs/benchmarks.md, "KV tiers", AVX2, 2 cores):
//! a block computed at a 4,096-token context takes about 51 ms, read back from disk (page cache) and copied in
//! 0.29 ms, copied from host memory in tens of microseconds (a 360 KiB copy); the weights are those ratios rounded
//! up generously (a cold drive, a GPU whose prefill is far faster): `host_block_weight` 0.02, `disk_block_weight`
//! 0.1. A prefix in a tier still beats recomputing it anywhere, and a hot copy beats a tier's.
//!
//! A request on a LoRA adapter goes to the workers that hold it (or were just sent a request on it, so it is
//! loading there) while one of them has nothing queued (`route::decide`, for every policy). Once they queue, every
//! worker of the base is a candidate and a cold one pays `adapter_load_weight` blocks (default 16: the load takes
//! one of the worker's `--max-adapters` places from another adapter, which then loads again where it is next used,
//! besides reading and checking the file). So a hot adapter leaves the workers that hold it only when the work
//! queued there outweighs a load elsewhere, and then it lives on two workers: sticky until saturated, as prefixes
//! are.
//!
//! `prompt_blocks` is the number of full blocks in the prompt (the request's block hashes); the cached prefix is
//! what the worker's KV events say it holds. The prompt work already waiting there (its report's
//! `queued_prefill_blocks`, plus the uncached blocks of requests this orchestrator routed there since) delays this
//! prompt as much as its own, so a hot prefix's worker with a long prefill queue loses to recomputing the prefix
//! elsewhere, and the prefix then lives on two workers. A queued or running sequence costs `load_weight` blocks
//! (default 4: a sequence in the batch slows every step a little, which a short prefill saving does not outweigh);
//! in-flight ones count as sequences (running while slots are free, queued after).
//!
//! Ties (every worker idle and none holding the prefix, as for each new document or system prompt) are broken by
//! rendezvous hashing of the prompt's first block over the workers: new prefixes spread evenly over the pool, and a
//! prefix's next requests, arriving before the workers' KV events tell where its blocks are, go where its first
//! one went. (Breaking ties by worker id piled every new prefix onto the first worker: measured with `zl bench`,
//! docs/benchmarks.md.) A prompt shorter than a block has no prefix to keep together: its request id decides.
//!
//! `prefix-aware-v1` is the cost this policy had before it counted work (phase 2's, kept to compare against in
//! `scripts/bench routing`): `prefill_weight * uncached_blocks + load_weight * (queue_depth + running_sequences)`,
//! from the newest report alone, blind to the prompt work queued there and to the routes handed out since.

use zl_wire::message::RouteRequest;

use super::{AdapterFit, Candidate, Pick, Policy};
use crate::hash::{mix, stable_hash};

/// The prefix-aware policy.
#[derive(Clone, Copy, Debug)]
pub struct PrefixAware {
    /// Cost of one block of prompt to prefill.
    pub prefill_weight: f64,
    /// Cost, in blocks, of one queued or running sequence.
    pub load_weight: f64,
    /// Count the work waiting at a worker (queued prefill, routes in flight); false: `prefix-aware-v1`.
    pub predicted_work: bool,
    /// Cost, in blocks, of loading the request's adapter where it is cold (with `predicted_work`).
    pub adapter_load_weight: f64,
    /// Cost of taking back one prefix block a worker keeps in host memory, against computing it (1).
    pub host_block_weight: f64,
    /// Cost of reading back and taking back one prefix block a worker keeps on disk.
    pub disk_block_weight: f64,
}

impl Default for PrefixAware {
    fn default() -> Self {
        PrefixAware {
            prefill_weight: 1.0,
            load_weight: 4.0,
            predicted_work: true,
            adapter_load_weight: 16.0,
            host_block_weight: 0.02,
            disk_block_weight: 0.1,
        }
    }
}

impl PrefixAware {
    /// A candidate's cost for a prompt of `prompt_blocks` full blocks.
    pub fn cost(&self, c: &Candidate<'_>, prompt_blocks: usize) -> f64 {
        let missing = prompt_blocks.saturating_sub(c.prefix_blocks as usize) as f64;
        let (host, disk) = (f64::from(c.prefix_tiers.0), f64::from(c.prefix_tiers.1));
        let new_blocks = missing + self.host_block_weight * host + self.disk_block_weight * disk;
        if !self.predicted_work {
            let sequences = f64::from(c.load.queue_depth) + f64::from(c.load.running_sequences);
            return self.prefill_weight * new_blocks + self.load_weight * sequences;
        }
        // Prompt work waiting there (reported, and routed since the report) delays this prompt's as much.
        let waiting_prefill = f64::from(c.load.queued_prefill_blocks) + f64::from(c.in_flight_blocks);
        // Recomputing on a worker that has prompt work waiting takes compute its other requests wait for: there
        // the request's own blocks count twice, so a prefix moves only to a worker with room ("sticky until
        // saturated"), not from one busy worker to another.
        let own = if waiting_prefill > 0.0 { 2.0 * new_blocks } else { new_blocks };
        let (running, waiting) = c.sequences();
        let cold = if c.adapter == AdapterFit::Cold { self.adapter_load_weight } else { 0.0 };
        self.prefill_weight * (own + waiting_prefill)
            + self.load_weight * (f64::from(waiting) + f64::from(running))
            + cold
    }
}

impl Policy for PrefixAware {
    fn name(&self) -> &'static str {
        if self.predicted_work { "prefix-aware" } else { "prefix-aware-v1" }
    }

    fn pick(&self, request: &RouteRequest, candidates: &[Candidate<'_>]) -> Pick {
        let blocks = request.block_hashes.len();
        let key = request.block_hashes.first().copied().unwrap_or_else(|| stable_hash(&request.request_id));
        let (mut best, mut best_cost, mut best_weight) = (0, f64::INFINITY, 0u64);
        for (i, c) in candidates.iter().enumerate() {
            let (cost, weight) = (self.cost(c, blocks), mix(key ^ c.id_hash));
            // Costs are sums of small integers times the weights: equal ones are exactly equal.
            if cost < best_cost || (cost == best_cost && weight > best_weight) {
                (best, best_cost, best_weight) = (i, cost, weight);
            }
        }
        let c = &candidates[best];
        Pick {
            index: best,
            reason: format!(
                "{} of {blocks} prompt blocks cached{}, {} prefill blocks waiting, queue {} + running {} + in flight \
                 {}, cost {best_cost:.1}",
                c.prefix_blocks,
                match c.prefix_tiers {
                    (0, 0) => String::new(),
                    (host, disk) => format!(" ({host} in host memory, {disk} on disk)"),
                },
                c.load.queued_prefill_blocks + c.in_flight_blocks,
                c.load.queue_depth,
                c.load.running_sequences,
                c.in_flight
            ),
        }
    }
}
