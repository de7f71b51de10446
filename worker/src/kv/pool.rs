//! Paged KV-cache accounting: which fixed-size block holds which sequence's tokens, which full blocks can be shared
//! between sequences by their chained hash, and which free blocks still hold a reusable prefix (LRU).
//!
//! Pure and synchronous: it never touches the KV tensors themselves (the model owns those, indexed by `BlockId`)
//! and never reads a clock (recency is a logical tick).

use std::collections::{BTreeSet, HashMap};

use zl_common::block_hash::{BlockHash, chain_hash};

/// Index of a block in the KV storage.
pub type BlockId = u32;

/// A block-table entry whose block was handed back because no later position attends to it any more (the
/// sliding-window layers' tables, [`BlockPool::slide`]). Never a storage index: reading through it is a bug.
pub const GONE: BlockId = BlockId::MAX;

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
    /// The chain's root (the cache scope's salt), the parent of the first block.
    root: Option<BlockHash>,
    /// Leading table entries handed back ([`GONE`]).
    gone: usize,
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

    /// Blocks held (the table less the entries handed back, [`GONE`]).
    pub fn held(&self) -> usize {
        self.blocks.len() - self.gone
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
    /// Whether events are kept (a pool nobody reports, such as the sliding-window layers', keeps none).
    reports: bool,
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
            reports: true,
            lookups: 0,
            hits: 0,
            used_filled: 0,
            used: 0,
        }
    }

    /// The same pool keeping no events: one whose blocks nobody is told about.
    pub fn unreported(mut self) -> Self {
        self.reports = false;
        self
    }

    fn event(&mut self, event: KvEvent) {
        if self.reports {
            self.events.push(event);
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
        let mut seq = SeqBlocks { parent: salt, root: salt, ..SeqBlocks::default() };
        let (matched, shareable) = self.cached_run(prompt, salt);
        self.lookups += (matched.len() + usize::from(matched.len() < shareable)) as u64;
        self.hits += matched.len() as u64;
        for (id, hash) in matched {
            self.pin(id);
            seq.blocks.push(id);
            seq.parent = Some(hash);
            seq.len += self.block_size;
        }
        seq.reserved = seq.len;
        seq.cached_tokens = seq.len;
        seq
    }

    /// Leading tokens of `prompt` (in scope `salt`) that [`KvPool::start_salted`] would find cached now. Reads only.
    pub fn cached_prefix_tokens(&self, prompt: &[u32], salt: Option<BlockHash>) -> usize {
        self.cached_run(prompt, salt).0.len() * self.block_size
    }

    /// The cached blocks (and their chained hashes) of `prompt`'s leading full blocks, all but the last token's,
    /// and how many blocks could have been.
    fn cached_run(&self, prompt: &[u32], salt: Option<BlockHash>) -> (Vec<(BlockId, BlockHash)>, usize) {
        let shareable = prompt.len().saturating_sub(1) / self.block_size;
        let mut parent = salt;
        let mut run = Vec::new();
        for chunk in prompt.chunks_exact(self.block_size).take(shareable) {
            let hash = chain_hash(parent, chunk);
            let Some(&id) = self.index.get(&hash) else { break };
            if self.blocks[id as usize].tokens.as_deref() != Some(chunk) {
                break; // a hash collision: not the same prefix
            }
            run.push((id, hash));
            parent = Some(hash);
        }
        (run, shareable)
    }

    fn take_block(&mut self) -> BlockId {
        if let Some(id) = self.free.pop() {
            return id;
        }
        let (_, id) = self.lru.pop_first().expect("caller checked availability");
        let block = &mut self.blocks[id as usize];
        let hash = block.hash.take();
        block.tokens = None;
        block.filled = 0;
        if let Some(hash) = hash {
            self.index.remove(&hash);
            self.event(KvEvent::Evicted(hash));
        }
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
                    self.event(KvEvent::Stored(hash));
                }
            }
        }
    }

    /// Release a finished or cancelled sequence. Its full, indexed blocks stay cached for reuse until evicted.
    pub fn release(&mut self, seq: SeqBlocks) {
        // Release the tail first, each block one tick later than the block after it: a sequence's leading blocks
        // (the prefix most likely to be shared again) are evicted last.
        for &id in seq.blocks[seq.gone..].iter().rev() {
            self.unref(id);
        }
    }

    /// Drop one reference to `id`; unreferenced, it is cached (full and indexed) or free.
    fn unref(&mut self, id: BlockId) {
        self.tick += 1;
        let block = &mut self.blocks[id as usize];
        block.refs -= 1;
        if block.refs > 0 {
            return;
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

    /// Start a sequence in the pool of the sliding-window layers, whose rows attend over their last `window`
    /// positions only: the longest cached prefix of at most `limit` tokens (what the full layers' pool found) for
    /// which this pool still holds every block the first computed row attends to. Blocks before that window are
    /// not needed and are [`GONE`] in the table.
    pub fn start_window(&mut self, prompt: &[u32], salt: Option<BlockHash>, limit: usize, window: usize) -> SeqBlocks {
        let bs = self.block_size;
        let mut hashes = Vec::new();
        let mut parent = salt;
        for chunk in prompt[..limit.min(prompt.len())].chunks_exact(bs) {
            let hash = chain_hash(parent, chunk);
            hashes.push(hash);
            parent = Some(hash);
        }
        let held = |i: usize| {
            let id = *self.index.get(&hashes[i])?;
            (self.blocks[id as usize].tokens.as_deref() == Some(&prompt[i * bs..(i + 1) * bs])).then_some(id)
        };
        let first_needed = |end: usize| (end * bs + 1).saturating_sub(window) / bs;
        // The longest run of whole blocks (ending at `end`) whose window is all here; none is always possible.
        let (end, ids) = (1..=hashes.len())
            .rev()
            .find_map(|end| Some((end, (first_needed(end)..end).map(held).collect::<Option<Vec<_>>>()?)))
            .unwrap_or((0, Vec::new()));
        let first = if end == 0 { 0 } else { first_needed(end) };
        let mut seq =
            SeqBlocks { parent: salt, root: salt, gone: first, blocks: vec![GONE; first], ..SeqBlocks::default() };
        for id in ids {
            self.pin(id);
            seq.blocks.push(id);
        }
        if end > 0 {
            seq.parent = Some(hashes[end - 1]);
        }
        seq.len = end * bs;
        seq.reserved = seq.len;
        seq.cached_tokens = seq.len;
        seq
    }

    /// Cut a sequence just started from the cache back to its first `tokens` (a whole number of blocks), when the
    /// sliding-window layers' pool holds less of the prefix than this one.
    pub fn truncate_cached(&mut self, seq: &mut SeqBlocks, tokens: usize) {
        assert!(seq.len == seq.reserved && seq.partial.is_empty() && seq.gone == 0, "only a sequence just started");
        assert!(tokens.is_multiple_of(self.block_size) && tokens <= seq.len, "whole cached blocks only");
        let keep = tokens / self.block_size;
        while seq.blocks.len() > keep {
            let id = seq.blocks.pop().expect("longer than keep");
            self.unref(id);
        }
        seq.parent = match keep {
            0 => seq.root,
            _ => self.blocks[seq.blocks[keep - 1] as usize].hash,
        };
        seq.len = tokens;
        seq.reserved = tokens;
        seq.cached_tokens = tokens;
    }

    /// Hand back the blocks of `seq` that hold only positions before `from` (no later row attends to them): they
    /// stay cached for a sequence that starts with the same prefix, until evicted.
    pub fn slide(&mut self, seq: &mut SeqBlocks, from: usize) {
        let upto = (from / self.block_size).min(seq.len / self.block_size);
        while seq.gone < upto {
            let id = std::mem::replace(&mut seq.blocks[seq.gone], GONE);
            seq.gone += 1;
            self.unref(id);
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

    #[test]
    fn a_window_hands_back_the_blocks_no_row_attends_to_and_they_stay_cached() {
        let (bs, window) = (2, 5);
        let mut pool = BlockPool::new(64, bs).unreported();
        let prompt: Vec<u32> = (1..=6).collect();
        let mut seq = pool.start_window(&prompt, None, 0, window);
        pool.reserve(&mut seq, prompt.len()).unwrap();
        pool.commit(&mut seq, &prompt);
        for t in 100..120u32 {
            // The next row (at position len) attends back to len + 1 - window.
            let from = (seq.len() + 1).saturating_sub(window);
            pool.slide(&mut seq, from);
            assert!(seq.held() <= (window + 1).div_ceil(bs) + 1, "{} blocks held at {}", seq.held(), seq.len());
            let first = seq.len() + 1 - window;
            assert!(seq.table()[first / bs] != GONE, "a block the next row reads was handed back");
            assert!(seq.table()[..first / bs].iter().all(|&b| b == GONE));
            pool.reserve(&mut seq, 1).unwrap();
            pool.commit(&mut seq, &[t]);
        }
        assert!(pool.drain_events().is_empty(), "an unreported pool keeps no events");
        let full: Vec<u32> = prompt.iter().copied().chain(100..120).collect();
        let held = seq.held();
        pool.release(seq);
        let s = pool.stats();
        assert_eq!(s.used, 0);
        assert_eq!(s.cached, full.len() / bs, "every full block, handed back early or late, stays cached");
        // Only the first row's window is needed to resume: the blocks before it are not pinned.
        let again = pool.start_window(&full, None, 24, window);
        assert_eq!(again.len(), 24);
        assert_eq!(again.held(), 24 / bs - (24 + 1 - window) / bs);
        assert!(again.held() <= held);
    }

    #[test]
    fn a_window_resumes_only_where_all_of_it_is_still_cached() {
        let (bs, window) = (2, 4);
        let mut pool = BlockPool::new(9, bs).unreported();
        let prompt: Vec<u32> = (1..=12).collect();
        let mut seq = pool.start_window(&prompt, None, 0, window);
        pool.reserve(&mut seq, 12).unwrap();
        pool.commit(&mut seq, &prompt);
        let table = seq.table().to_vec();
        pool.release(seq); // released tail first: block 5 is evicted first, block 0 last
        // Take 4 blocks: the 3 free ones and the least recently used cached one (block 5 of the prompt).
        let mut other = pool.start(&[9]);
        pool.reserve(&mut other, 8).unwrap();
        assert!(!other.table().contains(&table[4]) && other.table().contains(&table[5]));
        // Evict block 4 (next in the cache's order: 4, 3, 2, 1, 0).
        pool.reserve(&mut other, 2).unwrap();
        assert!(other.table().contains(&table[4]) && !other.table().contains(&table[3]));
        // Resuming at 10 would need block 4: the longest resume whose window is whole is 8 (blocks 2 and 3).
        let seq = pool.start_window(&prompt, None, 10, window);
        assert_eq!((seq.len(), seq.held()), (8, 2));
        assert_eq!(&seq.table()[2..], &table[2..4]);
        assert_eq!(&seq.table()[..2], &[GONE; 2], "nothing before the window is pinned");
        pool.release(seq);
        let salted = pool.start_window(&prompt, Some(7), 10, window);
        assert_eq!(salted.len(), 0, "another scope's chain finds nothing");
        pool.release(salted);
        pool.release(other);
        assert_eq!(pool.stats().used, 0);
    }

    #[test]
    fn a_truncated_start_continues_the_chain_from_where_it_was_cut() {
        let mut pool = BlockPool::new(16, 4);
        let prompt: Vec<u32> = (1..=17).collect();
        let first = run(&mut pool, &prompt);
        pool.release(first);
        let mut seq = pool.start_salted(&prompt, None);
        assert_eq!(seq.len(), 16);
        pool.truncate_cached(&mut seq, 8);
        assert_eq!((seq.len(), seq.cached_tokens(), seq.table().len()), (8, 8, 2));
        pool.reserve(&mut seq, 9).unwrap();
        pool.commit(&mut seq, &prompt[8..]);
        pool.release(seq);
        // The recomputed blocks hash as the originals did (same chain): still one cached copy of each.
        assert_eq!(pool.stats().cached, 4);
        let mut again = pool.start(&prompt);
        pool.truncate_cached(&mut again, 0);
        assert_eq!(pool.stats().used, 0);
    }
}
