//! The continuous-batching scheduler: which sequences run in the next model step, and how much of each.
//!
//! Pure and synchronous: no IO, no clock, no model. The engine calls `schedule` to get a `StepPlan`, runs the
//! model over it, then reports back with `complete`. Each step carries every running sequence's next decode token
//! plus prefill chunks within a token budget, so a long prompt never stalls running decodes. When KV blocks run
//! out, the most recently admitted sequence is preempted: its blocks are released and it is recomputed later
//! (its full blocks usually survive in the prefix cache, so recomputation is cheap).
//!
//! Sequences that speculate get draft tokens (`speculate::propose`) appended to their decode item, from the step's
//! token budget left after every decode and prefill chunk: speculation only ever uses room nobody else asked for.

use std::collections::{HashMap, VecDeque};

use crate::kv::pool::{BlockId, BlockPool, SeqBlocks};
use crate::kv::window::WindowKv;

/// A sequence's id, unique within one engine.
pub type SeqId = u64;

/// Scheduler limits.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Sequences in the running batch at most. Default 32: enough to saturate a CPU's matmul units, small enough
    /// that each step stays short.
    pub max_running: usize,
    /// Tokens computed per step at most (decode tokens plus prefill chunk tokens). Default 512.
    pub max_step_tokens: usize,
    /// Prefill chunk size in tokens; chunks start at multiples of it, so a prompt is always cut at the same places
    /// whatever else is running. Default 256.
    pub prefill_chunk: usize,
    /// Draft tokens only fill a step up to this many decode rows plus drafts. Speculation pays while a step waits
    /// on reading the weights, which a few more rows hardly slow; a step that already decodes this many
    /// sequences is compute-bound, and drafts would slow every sequence in it. Default 16.
    pub speculative_rows: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { max_running: 32, max_step_tokens: 512, prefill_chunk: 256, speculative_rows: 16 }
    }
}

/// Invalid scheduler limits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid scheduler config: {0}")]
pub struct ConfigError(String);

impl SchedulerConfig {
    /// Tokens one step computes for one sequence at most: a prefill chunk, or a decode token and its drafts.
    pub fn max_item(&self) -> usize {
        self.prefill_chunk.max(self.speculative_rows + 1)
    }

    /// Check the limits fit together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_running == 0 || self.prefill_chunk == 0 {
            return Err(ConfigError("max_running and prefill_chunk must be at least 1".into()));
        }
        if self.max_step_tokens < self.prefill_chunk + self.max_running {
            return Err(ConfigError(format!(
                "max_step_tokens ({}) must cover one prefill chunk ({}) plus a decode token per running sequence ({})",
                self.max_step_tokens, self.prefill_chunk, self.max_running
            )));
        }
        Ok(())
    }
}

/// Work for one sequence in one step: compute the KV of `tokens` at positions `start..start + tokens.len()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepItem {
    /// The sequence.
    pub seq: SeqId,
    /// Position of the first token.
    pub start: usize,
    /// Token ids to feed.
    pub tokens: Vec<u32>,
    /// True when this item reaches the sequence's last known token, so its last logits pick the next token.
    pub sample: bool,
    /// The sequence's block table (covers every position up to the end of this item).
    pub blocks: Vec<BlockId>,
    /// Its table in the sliding-window layers' pool, when they have their own (covers the window of each of the
    /// item's rows; entries before it are `GONE`); empty otherwise.
    pub window_blocks: Vec<BlockId>,
    /// How many of `tokens` (the last ones) are draft tokens to verify: the item then needs the logits after each
    /// of its tokens, not only the last.
    pub drafts: usize,
}

/// One model step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Items, decodes first, then prefill chunks.
    pub items: Vec<StepItem>,
    /// Sequences preempted while planning (their callers see no change; they are recomputed later).
    pub preempted: Vec<SeqId>,
    /// Tokens of prefill chunks in `items` (prompts, and sequences recomputed after preemption).
    pub prefill_tokens: usize,
    /// Blocks admitted sequences took back from the lower tiers: their keys and values must be written into these
    /// blocks before the step's forward pass.
    pub restores: Vec<(BlockId, zl_common::block_hash::BlockHash)>,
}

/// Whether a lower tier holds a block (its hash and tokens), for [`Scheduler::schedule_with`].
pub type TierLookup<'a> = &'a mut dyn FnMut(zl_common::block_hash::BlockHash, &[u32]) -> bool;

impl StepPlan {
    /// Tokens computed in this step.
    pub fn tokens(&self) -> usize {
        self.items.iter().map(|i| i.tokens.len()).sum()
    }
}

#[derive(Debug)]
struct Seq {
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose KV is written.
    computed: usize,
    blocks: Option<SeqBlocks>,
    /// Its blocks in the sliding-window layers' pool, while it holds any.
    window_blocks: Option<SeqBlocks>,
    /// Blocks of that pool it may hold at once (0 without one).
    window_commitment: usize,
    cached_prompt_tokens: usize,
    /// While it waits: the prompt tokens its cache scope held cached when it arrived (or was scoped), which its
    /// admission will most likely find; not prefill work to wait behind. Looked up once, not per step.
    expected_cached: usize,
    /// Prompt plus output tokens at most, as admitted: drafts never take a sequence past it.
    max_total: usize,
    /// Draft tokens per step at most (0: no speculation).
    max_draft: usize,
    /// Whether drafts pay for it, from its acceptance so far.
    gate: crate::speculate::DraftGate,
    /// The cache scope's salt: its prefix blocks are shared only with sequences of the same salt.
    salt: Option<u64>,
    /// Computed whole: it takes no cached prefix blocks (its caller needs every prompt position's logits).
    uncached: bool,
}

impl Seq {
    /// Its table in the sliding-window layers' pool (empty without one).
    fn window_table(&self) -> Vec<BlockId> {
        self.window_blocks.as_ref().map_or_else(Vec::new, |b| b.table().to_vec())
    }
}

/// Why a sequence cannot be admitted at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The prompt plus output would need more blocks than the whole pool has.
    #[error("the request needs {needed} KV blocks but the pool has {total}")]
    TooLong {
        /// Blocks needed.
        needed: usize,
        /// Blocks in the pool.
        total: usize,
    },
    /// The sliding-window layers' pool cannot hold this sequence's window beside nothing else.
    #[error("the request needs {needed} sliding-window KV blocks but that pool has {total}")]
    WindowTooLarge {
        /// Blocks needed.
        needed: usize,
        /// Blocks in the pool.
        total: usize,
    },
    /// The prompt is empty.
    #[error("empty prompt")]
    EmptyPrompt,
}

/// The scheduler's state.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    pool: BlockPool,
    /// The sliding-window layers' own pool, when the model has such layers and they are kept apart.
    window: Option<WindowKv>,
    seqs: HashMap<SeqId, Seq>,
    waiting: VecDeque<SeqId>,
    running: Vec<SeqId>,
    preemptions: u64,
}

impl Scheduler {
    /// A scheduler over `pool`.
    pub fn new(config: SchedulerConfig, pool: BlockPool) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Scheduler {
            config,
            pool,
            window: None,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
        })
    }

    /// Keep the sliding-window layers' KV in `window` (its rows must fit [`SchedulerConfig::max_item`]).
    pub fn with_window(mut self, window: WindowKv) -> Self {
        self.window = Some(window);
        self
    }

    /// The sliding-window layers' pool, when kept apart.
    pub fn window(&self) -> Option<&WindowKv> {
        self.window.as_ref()
    }

    /// The block pool (for figures and events).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The block pool, mutably (to drain events).
    pub fn pool_mut(&mut self) -> &mut BlockPool {
        &mut self.pool
    }

    /// Sequences waiting to be admitted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences in the running batch.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// KV blocks of prompt tokens admitted but not computed yet, over waiting and running sequences: the prefill
    /// work a new request would wait behind (a decoding sequence's one next token is not prefill).
    pub fn queued_prefill_blocks(&self) -> usize {
        let bs = self.pool.block_size();
        self.seqs
            .values()
            .map(|s| {
                // A sequence not admitted yet will find its cached prefix: only the rest is work.
                let done = if s.blocks.is_none() { s.expected_cached } else { 0 };
                s.tokens.len() - s.computed.max(done)
            })
            .filter(|&left| left > 1)
            .map(|left| left.div_ceil(bs))
            .sum()
    }

    /// Preemptions so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// True when there is nothing to do.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Prompt tokens of `seq` that were served from the prefix cache when it was (last) admitted.
    pub fn cached_prompt_tokens(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.cached_prompt_tokens)
    }

    /// Queue a new sequence. `max_tokens` bounds its growth, so one that could never fit is refused now.
    pub fn add(&mut self, id: SeqId, prompt: Vec<u32>, max_tokens: usize) -> Result<(), AdmitError> {
        if prompt.is_empty() {
            return Err(AdmitError::EmptyPrompt);
        }
        let bs = self.pool.block_size();
        let needed = (prompt.len() + max_tokens).div_ceil(bs);
        let total = self.pool.stats().total;
        if needed > total {
            return Err(AdmitError::TooLong { needed, total });
        }
        let prompt_len = prompt.len();
        let max_total = prompt_len + max_tokens;
        let expected_cached = self.pool.cached_prefix_tokens(&prompt, None);
        let window_commitment = self.window.as_ref().map_or(0, |w| w.commitment(max_total));
        if let Some(w) = &self.window
            && window_commitment > w.total()
        {
            return Err(AdmitError::WindowTooLarge { needed: window_commitment, total: w.total() });
        }
        let seq = Seq {
            tokens: prompt,
            prompt_len,
            computed: 0,
            blocks: None,
            window_blocks: None,
            window_commitment,
            cached_prompt_tokens: 0,
            expected_cached,
            max_total,
            max_draft: 0,
            gate: Default::default(),
            salt: None,
            uncached: false,
        };
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
        Ok(())
    }

    /// Let `id` speculate with up to `max_draft` draft tokens per step (0 turns it off).
    pub fn speculate(&mut self, id: SeqId, max_draft: usize) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.max_draft = max_draft;
        }
    }

    /// Put a queued sequence in a cache scope (`salt`, from `zl_common::block_hash::cache_salt`): it reuses and
    /// offers prefix blocks only within that scope. Before it is admitted; without a call it is unsalted.
    pub fn salt(&mut self, id: SeqId, salt: Option<u64>) {
        let expected =
            self.seqs.get(&id).map(|s| if s.uncached { 0 } else { self.pool.cached_prefix_tokens(&s.tokens, salt) });
        if let (Some(seq), Some(expected)) = (self.seqs.get_mut(&id), expected) {
            seq.salt = salt;
            seq.expected_cached = expected;
        }
    }

    /// Compute a queued sequence whole: it takes no cached prefix blocks, so every prompt position's logits can be
    /// read (prompt log-probabilities). Its full blocks are still offered to others once computed.
    pub fn uncached(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.uncached = true;
            seq.expected_cached = 0;
        }
    }

    /// Drop a sequence wherever it is (finished, or its caller went away). Its blocks return to the pool now.
    pub fn remove(&mut self, id: SeqId) {
        if let Some(mut seq) = self.seqs.remove(&id) {
            Self::release_blocks(&mut self.pool, &mut self.window, &mut seq);
        }
        self.waiting.retain(|s| *s != id);
        self.running.retain(|s| *s != id);
    }

    fn preempt(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            Self::release_blocks(&mut self.pool, &mut self.window, seq);
            seq.computed = 0;
        }
        self.running.retain(|s| *s != id);
        self.waiting.push_front(id);
        self.preemptions += 1;
    }

    /// Hand back a sequence's blocks in both pools (and its window commitment).
    fn release_blocks(pool: &mut BlockPool, window: &mut Option<WindowKv>, seq: &mut Seq) {
        if let Some(blocks) = seq.blocks.take() {
            pool.release(blocks);
            if let Some(w) = window {
                w.release(seq.window_blocks.take(), seq.window_commitment);
            }
        }
    }

    /// The window pool's slots for `seq` through position `upto` (exclusive); true without that pool.
    fn reserve_window(window: &mut Option<WindowKv>, seq: &mut Seq, upto: usize) -> bool {
        match (window, seq.window_blocks.as_mut()) {
            (Some(w), Some(blocks)) => w.reserve_to(blocks, upto),
            _ => true,
        }
    }

    /// Plan the next step.
    pub fn schedule(&mut self) -> StepPlan {
        self.schedule_with(None)
    }

    /// [`Scheduler::schedule`], an admitted prompt's cached prefix continued from the lower tiers where `tiers`
    /// holds it (not with sliding-window layers kept apart, whose blocks the tiers do not keep).
    pub fn schedule_with(&mut self, mut tiers: Option<TierLookup<'_>>) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.config.max_step_tokens;

        // 1. One decode token for every running sequence whose prompt is done; preempt the newest when blocks run
        //    out (possibly the sequence itself).
        let mut i = 0;
        while i < self.running.len() {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            if seq.tokens.len() - seq.computed != 1 {
                i += 1;
                continue;
            }
            loop {
                let seq = self.seqs.get_mut(&id).expect("running sequences exist");
                let blocks = seq.blocks.as_mut().expect("running sequences hold blocks");
                // A prompt's last token was reserved at admission; a generated token needs a new slot.
                let held = blocks.reserved() > blocks.len() || self.pool.reserve(blocks, 1).is_ok();
                let upto = seq.computed + 1;
                if held && Self::reserve_window(&mut self.window, seq, upto) {
                    break;
                }
                let victim = *self.running.last().expect("running is not empty");
                self.preempt(victim);
                plan.preempted.push(victim);
                plan.items.retain(|it| it.seq != victim);
                if victim == id {
                    break;
                }
            }
            if !self.running.contains(&id) {
                continue; // preempted itself; `i` now points at the next sequence
            }
            let seq = &self.seqs[&id];
            plan.items.push(StepItem {
                seq: id,
                start: seq.computed,
                tokens: vec![*seq.tokens.last().expect("non-empty")],
                sample: true,
                blocks: seq.blocks.as_ref().expect("held").table().to_vec(),
                window_blocks: seq.window_table(),
                drafts: 0,
            });
            budget -= 1;
            i += 1;
        }
        let decodes = plan.items.len();

        // 2. Admit waiting sequences (FCFS) while there is room; reserve their whole remaining prompt so prefill
        //    never fails half-way. Not in a step that had to preempt: the victim would only take its blocks back.
        while plan.preempted.is_empty() && self.running.len() < self.config.max_running {
            let Some(&id) = self.waiting.front() else { break };
            let seq = self.seqs.get_mut(&id).expect("waiting sequences exist");
            if self.window.as_ref().is_some_and(|w| !w.has_room(seq.window_commitment)) {
                break;
            }
            // What the pool may match cached blocks against: nothing for a sequence computed whole.
            let lookup: &[u32] = if seq.uncached { &[] } else { &seq.tokens };
            let mut blocks = self.pool.start_salted(lookup, seq.salt);
            if let (Some(held), None) = (tiers.as_mut(), &self.window) {
                plan.restores.extend(self.pool.restore(&mut blocks, lookup, *held));
            }
            seq.window_blocks = self
                .window
                .as_mut()
                .map(|w| w.start(&mut self.pool, &mut blocks, lookup, seq.salt, seq.window_commitment));
            let (cached, rest) = (blocks.len(), seq.tokens.len() - blocks.len());
            let reserved = self.pool.reserve(&mut blocks, rest);
            seq.blocks = Some(blocks);
            if reserved.is_err() {
                Self::release_blocks(&mut self.pool, &mut self.window, seq);
                break;
            }
            seq.computed = cached;
            seq.cached_prompt_tokens = cached.min(seq.prompt_len);
            self.waiting.pop_front();
            self.running.push(id);
        }

        // 3. Prefill chunks, oldest first, each cut at a multiple of `prefill_chunk`, within the budget.
        let chunk = self.config.prefill_chunk;
        for &id in &self.running {
            let seq = self.seqs.get_mut(&id).expect("running sequences exist");
            let remaining = seq.tokens.len() - seq.computed;
            if remaining == 0 || plan.items.iter().any(|it| it.seq == id) {
                continue;
            }
            let end = ((seq.computed / chunk + 1) * chunk).min(seq.tokens.len());
            let n = end - seq.computed;
            if n > budget || !Self::reserve_window(&mut self.window, seq, end) {
                continue;
            }
            budget -= n;
            plan.prefill_tokens += n;
            plan.items.push(StepItem {
                seq: id,
                start: seq.computed,
                tokens: seq.tokens[seq.computed..end].to_vec(),
                sample: end == seq.tokens.len(),
                blocks: seq.blocks.as_ref().expect("held").table().to_vec(),
                window_blocks: seq.window_table(),
                drafts: 0,
            });
        }

        // 4. Draft tokens for speculating decodes, from what is left of the budget and within the speculative rows,
        //    in running order.
        let mut spare = self.config.speculative_rows.saturating_sub(decodes).min(budget);
        // The rows the step computes already (decodes and prefill chunks): how much a draft row costs there.
        let rows = plan.tokens();
        for item in &mut plan.items[..decodes] {
            if spare == 0 {
                break;
            }
            let seq = self.seqs.get_mut(&item.seq).expect("planned sequences exist");
            // A step emits at most drafts + 1 tokens: never past the admitted total.
            let room = seq.max_total.saturating_sub(seq.tokens.len() + 1);
            let allowed = seq.gate.allowance(seq.max_draft, rows, self.config.speculative_rows);
            let drafts = crate::speculate::propose(&seq.tokens, allowed.min(spare).min(room));
            if drafts.is_empty() {
                continue;
            }
            // Slots for the drafts' KV from free blocks only: speculation never preempts anyone.
            let blocks = seq.blocks.as_mut().expect("running sequences hold blocks");
            let wanted = (seq.computed + 1 + drafts.len()).saturating_sub(blocks.reserved());
            if wanted > 0 && self.pool.reserve(blocks, wanted).is_err() {
                continue;
            }
            item.blocks = blocks.table().to_vec();
            if !Self::reserve_window(&mut self.window, seq, seq.computed + 1 + drafts.len()) {
                continue;
            }
            spare -= drafts.len();
            item.drafts = drafts.len();
            item.tokens.extend(drafts);
            item.window_blocks = seq.window_table();
        }
        plan
    }

    /// Report a finished step: every item's KV is now written, and each sampling item produced `sampled` (the next
    /// tokens: one, or with drafts the accepted drafts and the token after them; `None` when the sequence is
    /// finishing and will be removed). Of an item with drafts only the KV of the tokens that were accepted counts
    /// (the first `sampled.len()` fed tokens); the slots of rejected drafts are written over later.
    pub fn complete(&mut self, plan: &StepPlan, sampled: &HashMap<SeqId, Vec<u32>>) {
        for item in &plan.items {
            let Some(seq) = self.seqs.get_mut(&item.seq) else { continue }; // removed meanwhile
            let Some(blocks) = seq.blocks.as_mut() else { continue }; // preempted meanwhile
            if seq.computed != item.start {
                continue;
            }
            let emitted = sampled.get(&item.seq).filter(|_| item.sample);
            let valid = if item.drafts == 0 {
                item.tokens.len()
            } else {
                emitted.map_or(1, |t| t.len().clamp(1, item.tokens.len()))
            };
            self.pool.commit(blocks, &item.tokens[..valid]);
            if let (Some(w), Some(blocks)) = (self.window.as_mut(), seq.window_blocks.as_mut()) {
                w.commit(blocks, &item.tokens[..valid]);
            }
            seq.computed += valid;
            if let Some(tokens) = emitted {
                seq.tokens.extend(tokens);
                // The emitted tokens are the accepted drafts and the model's next one.
                seq.gate.record(item.drafts, tokens.len().saturating_sub(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_running: usize, max_step_tokens: usize, prefill_chunk: usize) -> SchedulerConfig {
        SchedulerConfig { max_running, max_step_tokens, prefill_chunk, speculative_rows: 16 }
    }

    /// Run a step, answering every sampling item with `token`.
    fn step(s: &mut Scheduler, token: u32) -> StepPlan {
        let plan = s.schedule();
        let sampled = plan.items.iter().filter(|i| i.sample).map(|i| (i.seq, vec![token])).collect();
        s.complete(&plan, &sampled);
        plan
    }

    #[test]
    fn config_must_leave_room_for_a_chunk_and_the_decodes() {
        assert!(config(4, 10, 8).validate().is_err());
        assert!(config(4, 12, 8).validate().is_ok());
        assert!(config(0, 100, 8).validate().is_err());
    }

    #[test]
    fn a_long_prompt_is_prefilled_in_aligned_chunks_then_decoded() {
        let mut s = Scheduler::new(config(4, 20, 8), BlockPool::new(64, 4)).unwrap();
        s.add(1, (0..20).collect(), 10).unwrap();
        let p = step(&mut s, 100);
        assert_eq!((p.items[0].start, p.items[0].tokens.len(), p.items[0].sample), (0, 8, false));
        let p = step(&mut s, 100);
        assert_eq!((p.items[0].start, p.items[0].tokens.len(), p.items[0].sample), (8, 8, false));
        let p = step(&mut s, 100);
        assert_eq!((p.items[0].start, p.items[0].tokens.len(), p.items[0].sample), (16, 4, true));
        let p = step(&mut s, 101);
        assert_eq!(p.items[0].tokens, vec![100]);
        assert_eq!(p.items[0].start, 20);
        assert!(p.items[0].sample);
    }

    #[test]
    fn decodes_keep_running_while_a_new_prompt_prefills() {
        let mut s = Scheduler::new(config(4, 12, 8), BlockPool::new(64, 4)).unwrap();
        s.add(1, vec![1, 2, 3], 50).unwrap();
        step(&mut s, 9); // prefill seq 1, sample
        s.add(2, (0..30).collect(), 5).unwrap();
        for _ in 0..4 {
            let p = step(&mut s, 9);
            let decode = p.items.iter().find(|i| i.seq == 1).expect("seq 1 decodes every step");
            assert_eq!(decode.tokens.len(), 1);
            assert!(p.tokens() <= 12);
        }
    }

    #[test]
    fn running_batch_is_capped_and_later_sequences_wait() {
        let mut s = Scheduler::new(config(2, 64, 8), BlockPool::new(64, 4)).unwrap();
        for id in 0..3 {
            s.add(id, vec![1, 2], 5).unwrap();
        }
        let p = step(&mut s, 5);
        assert_eq!(p.items.len(), 2);
        assert_eq!((s.running(), s.waiting()), (2, 1));
        s.remove(0);
        let p = s.schedule();
        assert!(p.items.iter().any(|i| i.seq == 2), "a freed slot admits the next sequence");
    }

    #[test]
    fn out_of_blocks_preempts_the_newest_and_recomputes_it_later() {
        // 4 blocks of 2 tokens: two sequences of 3 prompt tokens take 2 blocks each; the first decode that needs
        // a third block for either must preempt the newest.
        let mut s = Scheduler::new(config(4, 16, 4), BlockPool::new(4, 2)).unwrap();
        s.add(1, vec![1, 2, 3], 4).unwrap();
        s.add(2, vec![4, 5, 6], 4).unwrap();
        step(&mut s, 7); // prefill both; each now holds 4 tokens (3 + sampled) in 2 blocks
        let p = step(&mut s, 8); // both decode into their second block's free slot
        assert_eq!(p.items.len(), 2);
        let p = step(&mut s, 9); // seq 1 needs a 3rd block: seq 2 (newest) is preempted
        assert_eq!(p.preempted, vec![2]);
        assert_eq!(p.items.iter().map(|i| i.seq).collect::<Vec<_>>(), vec![1]);
        assert_eq!(s.preemptions(), 1);
        s.remove(1);
        // Seq 2 comes back: its first full block is still cached, the rest of prompt + generated tokens is
        // recomputed in aligned chunks, and the last chunk samples its next token.
        let p = step(&mut s, 10);
        assert_eq!(p.items.len(), 1);
        assert_eq!((p.items[0].seq, p.items[0].start, p.items[0].tokens.len(), p.items[0].sample), (2, 2, 2, false));
        let p = step(&mut s, 10);
        assert_eq!((p.items[0].start, p.items[0].tokens.clone(), p.items[0].sample), (4, vec![8], true));
    }

    #[test]
    fn removing_a_sequence_returns_its_blocks_at_once() {
        let mut s = Scheduler::new(config(4, 64, 16), BlockPool::new(16, 4)).unwrap();
        s.add(1, (0..30).collect(), 10).unwrap();
        step(&mut s, 1);
        assert!(s.pool().stats().used > 0);
        s.remove(1);
        assert_eq!(s.pool().stats().used, 0);
        assert!(s.is_idle());
    }

    #[test]
    fn a_request_that_can_never_fit_is_refused_up_front() {
        let mut s = Scheduler::new(config(4, 64, 16), BlockPool::new(4, 4)).unwrap();
        assert_eq!(s.add(1, vec![1; 10], 10), Err(AdmitError::TooLong { needed: 5, total: 4 }));
        assert_eq!(s.add(2, vec![], 1), Err(AdmitError::EmptyPrompt));
    }

    #[test]
    fn a_repeated_prompt_starts_from_the_prefix_cache() {
        let mut s = Scheduler::new(config(4, 64, 16), BlockPool::new(32, 4)).unwrap();
        let prompt: Vec<u32> = (0..13).collect();
        s.add(1, prompt.clone(), 2).unwrap();
        step(&mut s, 50);
        s.remove(1);
        s.add(2, prompt, 2).unwrap();
        let p = s.schedule();
        assert_eq!(p.items[0].start, 12);
        assert_eq!(s.cached_prompt_tokens(2), 12);
    }

    #[test]
    fn drafts_use_only_the_budget_left_and_only_accepted_tokens_count() {
        // Budget 12: two decodes and a 8-token prefill chunk leave 2 for drafts.
        let mut s = Scheduler::new(config(4, 12, 8), BlockPool::new(64, 4)).unwrap();
        s.add(1, vec![5, 6, 7, 5, 6], 20).unwrap();
        s.speculate(1, 8);
        s.add(2, vec![1, 2, 3], 20).unwrap();
        step(&mut s, 7); // prefill both; seq 1 is now 5 6 7 5 6 7, seq 2 is 1 2 3 7
        s.add(3, (100..116).collect(), 4).unwrap();
        let plan = s.schedule();
        let one = plan.items.iter().find(|i| i.seq == 1).unwrap();
        // "6 7" was seen before, followed by "5 6": the budget left allows two drafts.
        assert_eq!((one.tokens.clone(), one.drafts), (vec![7, 5, 6], 2));
        assert_eq!(plan.tokens(), 12);
        assert!(plan.items.iter().find(|i| i.seq == 2).unwrap().drafts == 0, "seq 2 does not speculate");
        // The model took the first draft (5) and then chose 9 instead of 6: KV of "7 5" counts, not of the 6.
        let mut sampled: HashMap<SeqId, Vec<u32>> = HashMap::from([(1, vec![5, 9]), (2, vec![8])]);
        sampled.retain(|seq, _| plan.items.iter().any(|i| i.seq == *seq && i.sample));
        s.complete(&plan, &sampled);
        let seq = &s.seqs[&1];
        assert_eq!(seq.tokens, vec![5, 6, 7, 5, 6, 7, 5, 9]);
        assert_eq!(seq.computed, 7);
        assert_eq!(seq.blocks.as_ref().unwrap().len(), 7);
    }

    #[test]
    fn drafts_stop_where_the_step_has_enough_rows() {
        let mut s =
            Scheduler::new(SchedulerConfig { speculative_rows: 5, ..config(8, 64, 8) }, BlockPool::new(64, 4)).unwrap();
        for id in 1..=3 {
            s.add(id, vec![1, 2, 3, 1, 2, 3, 1, 2], 20).unwrap();
            s.speculate(id, 8);
        }
        step(&mut s, 3); // prefill all three
        let plan = s.schedule();
        // Three decode rows leave two draft rows, both for the first sequence.
        let drafts: Vec<usize> = plan.items.iter().map(|i| i.drafts).collect();
        assert_eq!(drafts, vec![2, 0, 0]);
    }

    #[test]
    fn drafts_never_take_a_sequence_past_its_output_limit() {
        let mut s = Scheduler::new(config(4, 64, 8), BlockPool::new(64, 4)).unwrap();
        s.add(1, vec![1, 2, 1, 2, 1, 2], 3).unwrap();
        s.speculate(1, 8);
        step(&mut s, 1); // prefill; 1 output token so far (of 3)
        let plan = s.schedule();
        // Two more tokens at most: the decode's own and one draft.
        assert_eq!(plan.items[0].drafts, 1);
    }

    #[test]
    fn a_window_pool_holds_each_rows_window_only_and_admits_within_its_promises() {
        use crate::kv::pool::GONE;
        use crate::kv::window::WindowLayout;
        let cfg = config(4, 64, 8);
        // A sequence holds at most (8 + 17) / 4 + 2 = 9 blocks (a decode and 16 drafts is the largest item): two
        // long sequences fit in 18.
        let window = WindowKv::new(WindowLayout { blocks: 18, window: 8 }, 4, cfg.max_item());
        let mut s = Scheduler::new(cfg, BlockPool::new(256, 4)).unwrap().with_window(window);
        for id in 1..=3 {
            s.add(id, (0..20).map(|t| t % 3 + id as u32).collect(), 60).unwrap();
            s.speculate(id, 8);
        }
        let mut out: HashMap<SeqId, usize> = HashMap::new();
        let mut finished = 0;
        for _ in 0..400 {
            let plan = s.schedule();
            assert!(s.running() <= 2, "admitted past the window pool's promises");
            for item in &plan.items {
                // Every row's window is held: positions p + 1 - 8 ..= p.
                for p in item.start..item.start + item.tokens.len() {
                    for q in (p + 1).saturating_sub(8)..=p {
                        assert_ne!(item.window_blocks[q / 4], GONE, "seq {} row {p} reads {q}", item.seq);
                    }
                }
            }
            let used = s.window().unwrap().pool().stats().used;
            assert!(used <= 18);
            let sampled: HashMap<SeqId, Vec<u32>> =
                plan.items.iter().filter(|i| i.sample).map(|i| (i.seq, vec![7])).collect();
            s.complete(&plan, &sampled);
            for id in sampled.keys() {
                let n = out.entry(*id).or_default();
                *n += 1;
                if *n == 60 {
                    s.remove(*id);
                    finished += 1;
                }
            }
            if finished == 3 {
                break;
            }
        }
        assert_eq!(finished, 3);
        let w = s.window().unwrap();
        assert_eq!(w.pool().stats().used, 0);
        assert!(w.has_room(18), "every promise returned");
    }

    #[test]
    fn queued_prefill_counts_the_prompt_blocks_still_to_compute() {
        let mut s = Scheduler::new(config(4, 12, 8), BlockPool::new(64, 4)).unwrap();
        s.add(1, (0..20).collect(), 4).unwrap();
        s.add(2, (0..6).collect(), 4).unwrap();
        assert_eq!(s.queued_prefill_blocks(), 5 + 2, "waiting prompts: 20 and 6 tokens");
        step(&mut s, 9); // 8 of the first prompt (the budget leaves no room for the second's chunk)
        assert_eq!(s.queued_prefill_blocks(), 3 + 2);
        for _ in 0..4 {
            step(&mut s, 9);
        }
        assert_eq!(s.queued_prefill_blocks(), 0, "decoding sequences have no prefill left");
        // A waiting prompt whose first 16 tokens are cached (the first sequence's) counts only the other 6.
        s.add(3, (0..16).chain(100..106).collect(), 4).unwrap();
        assert_eq!(s.queued_prefill_blocks(), 2);
    }
}
