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
    /// The block left the pool, but a lower tier keeps it (`crate::kv::tier`): the best place it is held now.
    Offloaded(BlockHash, crate::kv::tier::Tier),
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
    /// Whether evicted and newly full blocks are noted for the lower tiers (`crate::kv::tier`).
    tiered: bool,
    /// Blocks evicted since the last [`BlockPool::take_spilled`], whose storage still holds their keys and values
    /// until the next forward pass writes over them.
    spilled: Vec<Spilled>,
    /// Blocks that became full and indexed since the last [`BlockPool::take_filled`].
    filled: Vec<(BlockId, BlockHash)>,
}

/// A block evicted from the pool whose keys and values a lower tier may keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spilled {
    /// Where its keys and values still are (until the next forward pass).
    pub id: BlockId,
    /// Its chained hash.
    pub hash: BlockHash,
    /// Its tokens.
    pub tokens: Box<[u32]>,
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
            tiered: false,
            spilled: Vec::new(),
            filled: Vec::new(),
        }
    }

    /// The same pool noting the blocks it evicts and the blocks that fill, for lower tiers to keep.
    pub fn tiered(mut self) -> Self {
        self.set_tiered();
        self
    }

    /// Note the blocks evicted and filled from now on ([`BlockPool::tiered`]).
    pub fn set_tiered(&mut self) {
        self.tiered = true;
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
        let tokens = block.tokens.take();
        block.filled = 0;
        if let Some(hash) = hash {
            self.index.remove(&hash);
            self.event(KvEvent::Evicted(hash));
            if let (true, Some(tokens)) = (self.tiered, tokens) {
                self.spilled.push(Spilled { id, hash, tokens });
            }
        }
        id
    }

    /// Continue `seq` (just started: its cached run found) with the blocks of `prompt` that the lower tiers hold
    /// (`held` says, for a block's hash and tokens), as far as the chain goes there, when the pool can also take the
    /// rest of the prompt: each gets a block of its own, full and indexed as if computed. Returns them, for the
    /// caller to write their keys and values into before the next forward pass; nothing when there is no room.
    pub fn restore(
        &mut self,
        seq: &mut SeqBlocks,
        prompt: &[u32],
        held: &mut dyn FnMut(BlockHash, &[u32]) -> bool,
    ) -> Vec<(BlockId, BlockHash)> {
        let bs = self.block_size;
        let shareable = prompt.len().saturating_sub(1) / bs;
        let first = seq.len / bs;
        if seq.len != seq.reserved || !seq.partial.is_empty() || first >= shareable {
            return Vec::new();
        }
        let mut parent = seq.parent;
        let mut found = Vec::new();
        for chunk in prompt[first * bs..shareable * bs].chunks_exact(bs) {
            let hash = chain_hash(parent, chunk);
            if self.index.contains_key(&hash) || !held(hash, chunk) {
                break;
            }
            found.push(hash);
            parent = Some(hash);
        }
        let rest = (prompt.len() - (first + found.len()) * bs).div_ceil(bs);
        if found.is_empty() || found.len() + rest > self.available() {
            return Vec::new();
        }
        // The miss `start` counted was a hit here, and the chain may have gone on to a miss of its own.
        let n = found.len();
        self.lookups += (n - 1 + usize::from(first + n < shareable)) as u64;
        self.hits += n as u64;
        let mut out = Vec::with_capacity(n);
        for (i, hash) in found.into_iter().enumerate() {
            let id = self.take_block();
            let chunk = &prompt[(first + i) * bs..(first + i + 1) * bs];
            let block = &mut self.blocks[id as usize];
            block.refs = 1;
            block.filled = bs as u32;
            block.hash = Some(hash);
            block.tokens = Some(chunk.into());
            self.used += 1;
            self.used_filled += bs as u64;
            self.index.insert(hash, id);
            self.event(KvEvent::Stored(hash));
            seq.blocks.push(id);
            seq.parent = Some(hash);
            out.push((id, hash));
        }
        seq.len += n * bs;
        seq.reserved = seq.len;
        seq.cached_tokens = seq.len;
        out
    }

    /// The blocks evicted since the last call (noted only by a [`BlockPool::tiered`] pool).
    pub fn take_spilled(&mut self) -> Vec<Spilled> {
        std::mem::take(&mut self.spilled)
    }

    /// The blocks that became full and indexed since the last call (noted only by a [`BlockPool::tiered`] pool),
    /// with their tokens.
    pub fn take_filled(&mut self) -> Vec<(BlockId, BlockHash, Box<[u32]>)> {
        let filled = std::mem::take(&mut self.filled);
        filled
            .into_iter()
            .filter_map(|(id, hash)| {
                let b = &self.blocks[id as usize];
                (b.hash == Some(hash)).then(|| (id, hash, b.tokens.clone().unwrap_or_default()))
            })
            .collect()
    }

    /// Whether the pool holds block `hash`, in use or cached.
    pub fn holds(&self, hash: BlockHash) -> bool {
        self.index.contains_key(&hash)
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
                    if self.tiered {
                        self.filled.push((id, hash));
                    }
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
#[path = "pool_tests.rs"]
mod tests;
