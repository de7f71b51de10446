//! The KV of sliding-window layers (Gemma 3's local layers), kept apart from the full layers' so that the window
//! also bounds their memory: a row of such a layer attends over its last `window` positions only, so the blocks
//! wholly before the window of a sequence's next row are handed back as it advances (cached for a sequence that
//! starts with the same prefix, until evicted). A sequence holds at most [`WindowKv::per_sequence`] blocks here,
//! however long it grows; the full layers' pool holds its whole length.
//!
//! Admission reserves each sequence's most (its commitment), so a reservation here never fails once a sequence
//! runs: the full layers' pool alone decides preemption. Pure and synchronous, like the pool.

use zl_common::block_hash::BlockHash;

use crate::kv::dtype::KvDtype;
use crate::kv::pool::{BlockPool, SeqBlocks};

/// How a KV budget is split between the full layers' blocks and the sliding-window layers' blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Blocks of the full layers (of every layer, without a window).
    pub blocks: usize,
    /// The sliding-window layers' own blocks, when they are kept apart.
    pub window: Option<WindowLayout>,
    /// How keys and values are stored.
    pub dtype: KvDtype,
}

/// The sliding-window layers' part of a [`KvLayout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowLayout {
    /// Blocks (each holding every sliding-window layer's keys and values for `block_size` positions).
    pub blocks: usize,
    /// Positions a row attends over, its own included.
    pub window: usize,
}

impl KvLayout {
    /// Every layer in one pool of `blocks` blocks, in f16.
    pub fn full(blocks: usize) -> Self {
        KvLayout { blocks, window: None, dtype: KvDtype::F16 }
    }

    /// The same blocks stored as `dtype`.
    #[must_use]
    pub fn with_dtype(self, dtype: KvDtype) -> Self {
        KvLayout { dtype, ..self }
    }

    /// Blocks a layer has: a sliding-window layer its own pool's, when apart, any other the full pool's.
    pub fn blocks_of(&self, sliding: bool) -> usize {
        match self.window {
            Some(w) if sliding => w.blocks,
            _ => self.blocks,
        }
    }
}

/// What sizing a KV budget needs to know of the model and the scheduler.
#[derive(Clone, Copy, Debug)]
pub struct KvSizing {
    /// Bytes of one block across the full (global) layers.
    pub full_block_bytes: usize,
    /// Bytes of one block across the sliding-window layers, and their window; `None` for a model without.
    pub window: Option<(usize, usize)>,
    /// The model's context in tokens.
    pub context: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Sequences running at once at most.
    pub max_running: usize,
    /// Tokens one step computes for one sequence at most.
    pub max_item: usize,
    /// How keys and values are stored (the block sizes above are of this type).
    pub dtype: KvDtype,
}

impl KvSizing {
    /// The layout for `budget` bytes: the sliding-window layers get what `max_running` sequences can hold at once
    /// (at most half the budget, and at least one sequence's worth), the full layers the rest. A window that would
    /// not save memory (one reaching past the context) keeps every layer in one pool.
    pub fn layout(&self, budget: usize) -> Result<KvLayout, String> {
        let bs = self.block_size.max(1);
        let too_small = |per: usize| format!("a KV budget of {budget} bytes holds fewer than 2 blocks of {per} bytes");
        let Some((local_bytes, window)) = self.window.filter(|&(_, w)| w + self.max_item < self.context) else {
            let per = self.full_block_bytes + self.window.map_or(0, |(b, _)| b);
            let blocks = budget / per.max(1);
            return if blocks < 2 { Err(too_small(per)) } else { Ok(KvLayout::full(blocks).with_dtype(self.dtype)) };
        };
        let per_seq = WindowKv::per_sequence(window, self.max_item, bs);
        let fits = (budget / 2 / (per_seq * local_bytes).max(1)).max(1);
        let local = per_seq * self.max_running.min(fits).max(1);
        let blocks = budget.saturating_sub(local * local_bytes) / self.full_block_bytes.max(1);
        if blocks < 2 {
            return Err(too_small(self.full_block_bytes + local_bytes));
        }
        Ok(KvLayout { blocks, window: Some(WindowLayout { blocks: local, window }), dtype: self.dtype })
    }
}

/// The sliding-window layers' block pool and what admitted sequences may take of it.
#[derive(Debug)]
pub struct WindowKv {
    pool: BlockPool,
    window: usize,
    max_item: usize,
    /// Blocks promised to admitted sequences (the sum of their commitments).
    committed: usize,
}

impl WindowKv {
    /// A pool of `layout.blocks` blocks of `block_size` tokens for rows of at most `max_item` tokens per step.
    pub fn new(layout: WindowLayout, block_size: usize, max_item: usize) -> Self {
        WindowKv {
            pool: BlockPool::new(layout.blocks, block_size).unreported(),
            window: layout.window.max(1),
            max_item,
            committed: 0,
        }
    }

    /// Blocks one sequence holds at most: its next rows' window plus a step's rows, over block boundaries.
    pub fn per_sequence(window: usize, max_item: usize, block_size: usize) -> usize {
        (window + max_item).div_ceil(block_size) + 2
    }

    /// Blocks a sequence of at most `max_total` tokens may hold at once.
    pub fn commitment(&self, max_total: usize) -> usize {
        let bs = self.pool.block_size();
        Self::per_sequence(self.window, self.max_item, bs).min(max_total.div_ceil(bs))
    }

    /// Blocks in the pool.
    pub fn total(&self) -> usize {
        self.pool.stats().total
    }

    /// Whether a sequence with `commitment` can be admitted beside those admitted.
    pub fn has_room(&self, commitment: usize) -> bool {
        self.committed + commitment <= self.total()
    }

    /// The pool (for figures and tests).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Start a sequence whose full layers found `full_seq` cached: the window's blocks of the longest prefix both
    /// pools hold, the full layers' cut back to it when this pool holds less.
    pub fn start(
        &mut self,
        full: &mut BlockPool,
        full_seq: &mut SeqBlocks,
        prompt: &[u32],
        salt: Option<BlockHash>,
        commitment: usize,
    ) -> SeqBlocks {
        let seq = self.pool.start_window(prompt, salt, full_seq.len(), self.window);
        if seq.len() < full_seq.len() {
            full.truncate_cached(full_seq, seq.len());
        }
        self.committed += commitment;
        seq
    }

    /// Make sure `seq` has slots through position `upto` (exclusive). False only if admission's promise is broken.
    pub fn reserve_to(&mut self, seq: &mut SeqBlocks, upto: usize) -> bool {
        let wanted = upto.saturating_sub(seq.reserved());
        let ok = wanted == 0 || self.pool.reserve(seq, wanted).is_ok();
        debug_assert!(ok, "the window pool ran out within its commitments");
        ok
    }

    /// Record `tokens` as written, then hand back the blocks the sequence's next row no longer attends to.
    pub fn commit(&mut self, seq: &mut SeqBlocks, tokens: &[u32]) {
        self.pool.commit(seq, tokens);
        let from = (seq.len() + 1).saturating_sub(self.window);
        self.pool.slide(seq, from);
    }

    /// Release a sequence (finished, cancelled or preempted) and its commitment.
    pub fn release(&mut self, seq: Option<SeqBlocks>, commitment: usize) {
        if let Some(seq) = seq {
            self.pool.release(seq);
        }
        self.committed -= commitment;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizing(window: Option<(usize, usize)>) -> KvSizing {
        let dtype = KvDtype::F16;
        KvSizing { full_block_bytes: 100, window, context: 4096, block_size: 16, max_running: 4, max_item: 64, dtype }
    }

    #[test]
    fn a_window_takes_what_the_running_sequences_can_hold_and_the_full_layers_the_rest() {
        // 512 + 64 tokens over blocks of 16, plus two at the edges: 38 blocks a sequence, 4 sequences.
        let layout = sizing(Some((500, 512))).layout(1_000_000).unwrap();
        assert_eq!(layout.window, Some(WindowLayout { blocks: 4 * 38, window: 512 }));
        assert_eq!(layout.blocks, (1_000_000 - 4 * 38 * 500) / 100);
        // A small budget: the window gets at most half of it, but always one sequence's worth.
        let small = sizing(Some((500, 512))).layout(60_000).unwrap();
        assert_eq!(small.window.unwrap().blocks, 38);
        assert_eq!(small.blocks, (60_000 - 38 * 500) / 100);
        assert!(sizing(Some((500, 512))).layout(19_000).is_err(), "not even one sequence's window");
    }

    #[test]
    fn a_window_past_the_context_or_none_keeps_one_pool() {
        assert_eq!(sizing(None).layout(10_000).unwrap(), KvLayout::full(100));
        assert_eq!(sizing(Some((500, 4096))).layout(60_000).unwrap(), KvLayout::full(100));
        assert!(sizing(None).layout(150).is_err());
    }

    #[test]
    fn commitments_bound_admission_and_a_long_sequence_holds_its_window_only() {
        let layout = WindowLayout { blocks: 12, window: 8 };
        let mut kv = WindowKv::new(layout, 4, 4);
        let mut full = BlockPool::new(64, 4);
        // (8 + 4) / 4 + 2 = 5 blocks at most; a 6-token sequence 2.
        assert_eq!((kv.commitment(1000), kv.commitment(6)), (5, 2));
        let prompt: Vec<u32> = (1..=10).collect();
        let mut full_seq = full.start(&prompt);
        let mut seq = kv.start(&mut full, &mut full_seq, &prompt, None, 5);
        assert!(kv.has_room(7) && !kv.has_room(8), "12 blocks, 5 promised");
        assert!(kv.reserve_to(&mut seq, 10));
        kv.commit(&mut seq, &prompt);
        for t in 0..100u32 {
            let upto = seq.len() + 4;
            assert!(kv.reserve_to(&mut seq, upto), "a step of 4 rows at {}", seq.len());
            assert!(seq.held() <= 5);
            kv.commit(&mut seq, &[t, t + 1, t + 2, t + 3][..1 + (t as usize % 4)]);
        }
        assert!(seq.len() > 200);
        kv.release(Some(seq), 5);
        assert!(kv.has_room(12));
        assert_eq!(kv.pool().stats().used, 0);
    }
}
