//! Paged KV-cache accounting: which fixed-size block holds which sequence's tokens, which full blocks can be shared
//! between sequences by their chained hash, and which free blocks still hold a reusable prefix (LRU).
//!
//! Pure and synchronous: it never touches the KV tensors themselves (the model owns those, indexed by `BlockId`)
//! and never reads a clock (recency is a logical tick).

use std::collections::{BTreeSet, HashMap};

use zl_common::block_hash::{BlockHash, chain_hash};

/// Index of a block in the KV storage.
pub type BlockId = u32;

/// A change to the set of reusable prefix blocks, reported to the orchestrators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// A full block with this hash became reusable.
    Stored(BlockHash),
    /// The block with this hash was evicted.
    Evicted(BlockHash),
}

/// Not enough free blocks for the request; nothing was allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("KV cache full: {needed} blocks needed, {available} available")]
pub struct OutOfBlocks {
    /// Blocks the operation needed.
    pub needed: usize,
    /// Blocks that could be had (free or evictable).
    pub available: usize,
}

#[derive(Clone, Debug, Default)]
struct Block {
    refs: u32,
    /// Set once the block is full and indexed for sharing.
    hash: Option<BlockHash>,
    /// The block's tokens once full, to confirm a hash hit before sharing (guards against collisions).
    tokens: Option<Box<[u32]>>,
    /// Token slots written.
    filled: u32,
    /// Logical time of last release, for LRU eviction.
    last_used: u64,
}

/// One sequence's blocks.
#[derive(Debug, Default)]
pub struct SeqBlocks {
    blocks: Vec<BlockId>,
    /// Tokens whose KV is written.
    len: usize,
    /// Slots reserved (written or about to be).
    reserved: usize,
    /// Hash of the last full block, the parent of the next.
    parent: Option<BlockHash>,
    /// Tokens of the current, partial block.
    partial: Vec<u32>,
    /// Prompt tokens found in cached blocks when the sequence started.
    cached_tokens: usize,
}

impl SeqBlocks {
    /// The block table, in order.
    pub fn table(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Tokens whose KV is written.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Token slots reserved (written or about to be).
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// True when no token is written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Prompt tokens that were served from cached blocks.
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }
}

/// Figures a worker exports and reports to the orchestrators.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvStats {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks referenced by at least one sequence.
    pub used: usize,
    /// Unreferenced blocks that still hold a reusable prefix.
    pub cached: usize,
    /// Blocks holding nothing.
    pub free: usize,
    /// Full blocks looked up when sequences started / found cached.
    pub prefix_lookups: u64,
    /// Of those, found.
    pub prefix_hits: u64,
    /// Unused token slots in referenced blocks / slots in referenced blocks, in [0, 1].
    pub fragmentation: f32,
}

impl KvStats {
    /// Fraction of looked-up prefix blocks that were found cached.
    pub fn hit_rate(&self) -> f64 {
        if self.prefix_lookups == 0 { 0.0 } else { self.prefix_hits as f64 / self.prefix_lookups as f64 }
    }
}

/// The block pool.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    blocks: Vec<Block>,
    free: Vec<BlockId>,
    /// Unreferenced, hashed blocks ordered by (last_used, id): the eviction order.
    lru: BTreeSet<(u64, BlockId)>,
    index: HashMap<BlockHash, BlockId>,
    tick: u64,
    events: Vec<KvEvent>,
    lookups: u64,
    hits: u64,
    /// Slots written in referenced blocks (kept incrementally for the fragmentation figure).
    used_filled: u64,
    used: usize,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0 && num_blocks > 0, "pool needs blocks of at least one token");
        assert!(num_blocks <= BlockId::MAX as usize, "too many blocks");
        BlockPool {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            // Hand out low ids first (pop from the end).
            free: (0..num_blocks as BlockId).rev().collect(),
            lru: BTreeSet::new(),
            index: HashMap::new(),
            tick: 0,
            events: Vec::new(),
            lookups: 0,
            hits: 0,
            used_filled: 0,
            used: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks that an allocation can take now (free, or cached and evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks needed to hold `tokens` more tokens in `seq` beyond what it has reserved.
    pub fn blocks_needed(&self, seq: &SeqBlocks, tokens: usize) -> usize {
        let have = seq.blocks.len() * self.block_size;
        (seq.reserved + tokens).saturating_sub(have).div_ceil(self.block_size)
    }

    fn pin(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        if block.refs == 0 {
            self.lru.remove(&(block.last_used, id));
            self.used += 1;
            self.used_filled += u64::from(block.filled);
        }
        block.refs += 1;
    }

    /// Start a sequence for `prompt`: pin the longest run of its leading full blocks that is cached. At least the
    /// last prompt token is always left to compute, since its logits pick the first output token.
    pub fn start(&mut self, prompt: &[u32]) -> SeqBlocks {
        self.start_salted(prompt, None)
    }

    /// [`KvPool::start`] for a prompt of a cache scope: its block chain starts from `salt`
    /// (`zl_common::block_hash::cache_salt`), so it finds, and later offers, only blocks of the same scope.
    pub fn start_salted(&mut self, prompt: &[u32], salt: Option<BlockHash>) -> SeqBlocks {
        let mut seq = SeqBlocks { parent: salt, ..SeqBlocks::default() };
        let shareable = prompt.len().saturating_sub(1) / self.block_size;
        for chunk in prompt.chunks_exact(self.block_size).take(shareable) {
            self.lookups += 1;
            let hash = chain_hash(seq.parent, chunk);
            let Some(&id) = self.index.get(&hash) else { break };
            if self.blocks[id as usize].tokens.as_deref() != Some(chunk) {
                break; // a hash collision: not the same prefix
            }
            self.hits += 1;
            self.pin(id);
            seq.blocks.push(id);
            seq.parent = Some(hash);
            seq.len += self.block_size;
        }
        seq.reserved = seq.len;
        seq.cached_tokens = seq.len;
        seq
    }

    fn take_block(&mut self) -> BlockId {
        if let Some(id) = self.free.pop() {
            return id;
        }
        let (_, id) = self.lru.pop_first().expect("caller checked availability");
        let block = &mut self.blocks[id as usize];
        if let Some(hash) = block.hash.take() {
            self.index.remove(&hash);
            self.events.push(KvEvent::Evicted(hash));
        }
        block.tokens = None;
        block.filled = 0;
        id
    }

    /// Reserve slots for `tokens` more tokens, allocating blocks as needed. All or nothing.
    pub fn reserve(&mut self, seq: &mut SeqBlocks, tokens: usize) -> Result<(), OutOfBlocks> {
        let needed = self.blocks_needed(seq, tokens);
        if needed > self.available() {
            return Err(OutOfBlocks { needed, available: self.available() });
        }
        for _ in 0..needed {
            let id = self.take_block();
            let block = &mut self.blocks[id as usize];
            debug_assert_eq!(block.refs, 0);
            block.refs = 1;
            block.filled = 0;
            self.used += 1;
            seq.blocks.push(id);
        }
        seq.reserved += tokens;
        Ok(())
    }

    /// Where token position `pos` of `seq` lives: (block, slot within the block).
    pub fn slot(&self, seq: &SeqBlocks, pos: usize) -> (BlockId, usize) {
        (seq.blocks[pos / self.block_size], pos % self.block_size)
    }

    /// Record that the KV of `tokens` (the next positions of `seq`, within its reservation) is now written. Blocks
    /// that fill up are indexed for sharing.
    pub fn commit(&mut self, seq: &mut SeqBlocks, tokens: &[u32]) {
        assert!(seq.len + tokens.len() <= seq.reserved, "commit beyond the reservation");
        for &token in tokens {
            let (id, _) = self.slot(seq, seq.len);
            self.blocks[id as usize].filled += 1;
            self.used_filled += 1;
            seq.partial.push(token);
            seq.len += 1;
            if seq.partial.len() == self.block_size {
                let hash = chain_hash(seq.parent, &seq.partial);
                seq.parent = Some(hash);
                let full = std::mem::take(&mut seq.partial).into_boxed_slice();
                if let std::collections::hash_map::Entry::Vacant(slot) = self.index.entry(hash) {
                    slot.insert(id);
                    let block = &mut self.blocks[id as usize];
                    block.hash = Some(hash);
                    block.tokens = Some(full);
                    self.events.push(KvEvent::Stored(hash));
                }
            }
        }
    }

    /// Release a finished or cancelled sequence. Its full, indexed blocks stay cached for reuse until evicted.
    pub fn release(&mut self, seq: SeqBlocks) {
        // Release the tail first, each block one tick later than the block after it: a sequence's leading blocks
        // (the prefix most likely to be shared again) are evicted last.
        for &id in seq.blocks.iter().rev() {
            self.tick += 1;
            let block = &mut self.blocks[id as usize];
            block.refs -= 1;
            if block.refs > 0 {
                continue;
            }
            self.used -= 1;
            self.used_filled -= u64::from(block.filled);
            block.last_used = self.tick;
            if block.hash.is_some() {
                self.lru.insert((self.tick, id));
            } else {
                block.filled = 0;
                self.free.push(id);
            }
        }
    }

    /// Hashes of every block indexed for sharing (held or cached), sorted: a full picture for a resync.
    pub fn indexed_hashes(&self) -> Vec<BlockHash> {
        let mut hashes: Vec<BlockHash> = self.index.keys().copied().collect();
        hashes.sort_unstable();
        hashes
    }

    /// Take the events since the last call.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Current figures.
    pub fn stats(&self) -> KvStats {
        let slots = (self.used * self.block_size) as u64;
        KvStats {
            total: self.blocks.len(),
            used: self.used,
            cached: self.lru.len(),
            free: self.free.len(),
            prefix_lookups: self.lookups,
            prefix_hits: self.hits,
            fragmentation: if slots == 0 { 0.0 } else { (slots - self.used_filled) as f32 / slots as f32 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pool: &mut BlockPool, prompt: &[u32]) -> SeqBlocks {
        let mut seq = pool.start(prompt);
        let rest = &prompt[seq.len()..];
        pool.reserve(&mut seq, rest.len()).unwrap();
        pool.commit(&mut seq, rest);
        seq
    }

    #[test]
    fn blocks_fill_in_order_and_slots_map_positions() {
        let mut pool = BlockPool::new(8, 4);
        let seq = run(&mut pool, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(seq.table().len(), 2);
        assert_eq!(pool.slot(&seq, 0), (seq.table()[0], 0));
        assert_eq!(pool.slot(&seq, 5), (seq.table()[1], 1));
        let s = pool.stats();
        assert_eq!((s.used, s.free, s.cached), (2, 6, 0));
        assert!((s.fragmentation - 0.25).abs() < 1e-6, "2 of 8 slots unused: {}", s.fragmentation);
    }

    #[test]
    fn a_shared_prefix_is_reused_and_counted() {
        let mut pool = BlockPool::new(16, 4);
        let a = run(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(a.cached_tokens(), 0);
        let b = pool.start(&[1, 2, 3, 4, 5, 6, 7, 8, 100, 101]);
        assert_eq!(b.cached_tokens(), 8);
        assert_eq!(b.table(), &a.table()[..2]);
        let s = pool.stats();
        // The first sequence stopped looking at its first miss; the second found both blocks.
        assert_eq!((s.prefix_lookups, s.prefix_hits), (3, 2));
        assert_eq!(s.used, 3, "shared blocks count once");
    }

    #[test]
    fn a_prefix_is_shared_within_its_cache_scope_only() {
        use zl_common::block_hash::{cache_salt, salted_block_hashes};
        let mut pool = BlockPool::new(16, 4);
        let (a, b) = (Some(cache_salt("project:a")), Some(cache_salt("project:b")));
        let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        let mut first = pool.start_salted(&prompt, a);
        pool.reserve(&mut first, prompt.len()).unwrap();
        pool.commit(&mut first, &prompt);
        // Another scope, and the unsalted chain, find nothing of it; the same scope finds both full blocks.
        assert_eq!(pool.start_salted(&prompt, b).cached_tokens(), 0);
        assert_eq!(pool.start(&prompt).cached_tokens(), 0);
        assert_eq!(pool.start_salted(&prompt, a).cached_tokens(), 8);
        // What the pool reports (and prefix-aware routing matches) is the scope's salted chain, as a frontend
        // computes it for the route.
        let stored: Vec<_> = pool
            .drain_events()
            .into_iter()
            .filter_map(|e| if let KvEvent::Stored(h) = e { Some(h) } else { None })
            .collect();
        assert_eq!(stored, salted_block_hashes(&prompt, 4, a));
    }

    #[test]
    fn the_last_prompt_token_is_always_computed() {
        let mut pool = BlockPool::new(16, 4);
        let a = run(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8]);
        pool.release(a);
        let b = pool.start(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b.cached_tokens(), 4, "the second block holds the last token, so it is recomputed");
    }

    #[test]
    fn released_prefixes_stay_cached_until_evicted_lru_first() {
        let mut pool = BlockPool::new(3, 2);
        let a = run(&mut pool, &[1, 2, 3]); // blocks: [1,2] full+hashed, [3] partial
        let a_first = a.table()[0];
        pool.release(a);
        assert_eq!(pool.stats().cached, 1);
        assert_eq!(pool.stats().free, 2);
        let first_events = pool.drain_events();
        assert_eq!(first_events.len(), 1);
        // A second sequence reuses the cached block.
        let b = pool.start(&[1, 2, 9]);
        assert_eq!(b.table(), &[a_first]);
        pool.release(b);
        // Filling the pool with unrelated tokens evicts the cached block and reports it.
        let c = run(&mut pool, &[7, 7, 8, 8, 9]);
        assert_eq!(c.table().len(), 3);
        let events = pool.drain_events();
        assert!(events.contains(&KvEvent::Evicted(match first_events[0] {
            KvEvent::Stored(h) => h,
            other => panic!("{other:?}"),
        })));
        assert_eq!(pool.start(&[1, 2, 9]).cached_tokens(), 0);
    }

    #[test]
    fn reservation_is_all_or_nothing() {
        let mut pool = BlockPool::new(2, 4);
        let mut seq = pool.start(&[1]);
        assert_eq!(pool.reserve(&mut seq, 9), Err(OutOfBlocks { needed: 3, available: 2 }));
        assert_eq!(pool.stats().free, 2);
        pool.reserve(&mut seq, 8).unwrap();
        assert_eq!(pool.available(), 0);
        pool.release(seq);
        assert_eq!(pool.stats().free, 2);
        assert_eq!(pool.stats().used, 0);
    }

    #[test]
    fn decode_appends_one_token_at_a_time() {
        let mut pool = BlockPool::new(4, 2);
        let mut seq = run(&mut pool, &[1, 2, 3]);
        for t in 10..14 {
            if pool.blocks_needed(&seq, 1) > 0 {
                pool.reserve(&mut seq, 1).unwrap();
            } else {
                pool.reserve(&mut seq, 1).unwrap(); // reserving within the last block allocates nothing
            }
            pool.commit(&mut seq, &[t]);
        }
        assert_eq!(seq.len(), 7);
        assert_eq!(seq.table().len(), 4);
        // The generated tokens' full blocks are shareable too.
        pool.release(seq);
        let again = pool.start(&[1, 2, 3, 10, 11, 12, 13, 99]);
        assert_eq!(again.cached_tokens(), 6);
    }

    #[test]
    fn everything_returns_to_the_pool() {
        let mut pool = BlockPool::new(64, 4);
        let mut seqs = Vec::new();
        for i in 0..10u32 {
            let prompt: Vec<u32> = (0..(i * 3 + 5)).map(|t| t % 7 + i % 3).collect();
            seqs.push(run(&mut pool, &prompt));
        }
        for seq in seqs {
            pool.release(seq);
        }
        let s = pool.stats();
        assert_eq!(s.used, 0);
        assert_eq!(s.free + s.cached, s.total);
        assert_eq!(s.fragmentation, 0.0);
    }
}
