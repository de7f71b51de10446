//! The host-memory tier: blocks evicted from the hot pool (and blocks read back from disk), least recently used
//! first out, never more than its byte bound. Pure: no clock (recency is a logical tick), no I/O.

use zl_common::block_hash::BlockHash;

use super::Shared;
use super::lru::Lru;

/// The host tier.
#[derive(Debug)]
pub struct HostTier {
    lru: Lru<Shared>,
}

impl HostTier {
    /// A tier of at most `cap` bytes (0: it keeps nothing).
    pub fn new(cap: usize) -> Self {
        HostTier { lru: Lru::new(cap as u64) }
    }

    /// The block `hash` of `tokens` (a hash whose tokens differ is a collision: not a hit), now the most recently
    /// used.
    pub fn get(&mut self, hash: BlockHash, tokens: &[u32]) -> Option<Shared> {
        let block = self.lru.peek(hash).filter(|b| *b.tokens == *tokens)?.clone();
        self.lru.touch(hash);
        Some(block)
    }

    /// Keep `block` (the most recently used), evicting the least recently used blocks as its bound needs; returns
    /// the hashes evicted. A block larger than the whole bound is not kept. A block already held is only touched.
    pub fn insert(&mut self, block: Shared) -> Vec<BlockHash> {
        let (hash, size) = (block.hash, block.bytes() as u64);
        self.lru.insert(hash, block, size).unwrap_or_default().into_iter().map(|(h, _)| h).collect()
    }
}

/// Its sizes and what it holds, read through the order it keeps ([`Lru`]'s figures: `bytes`, `len`, `contains`, ...).
impl std::ops::Deref for HostTier {
    type Target = Lru<Shared>;

    fn deref(&self) -> &Lru<Shared> {
        &self.lru
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::kv::tier::TierBlock;

    fn block(hash: BlockHash, payload: usize) -> Shared {
        Arc::new(TierBlock { hash, tokens: vec![hash as u32; 4].into(), payload: vec![7; payload].into() })
    }

    #[test]
    fn the_bound_holds_and_the_least_recently_used_go_first() {
        // Each block: 84 payload bytes + 16 bytes of tokens = 100.
        let mut t = HostTier::new(350);
        for h in 1..=3 {
            assert!(t.insert(block(h, 84)).is_empty());
        }
        assert_eq!(t.bytes(), 300);
        assert!(t.get(1, &[1; 4]).is_some(), "touching 1 makes 2 the oldest");
        assert_eq!(t.insert(block(4, 84)), vec![2]);
        assert_eq!(t.insert(block(5, 84)), vec![3]);
        assert!(t.bytes() <= t.capacity());
        assert!(t.contains(1) && t.contains(4) && t.contains(5) && !t.contains(2));
        // Overfilled many times over, it never holds more than its bound.
        for h in 10..1000 {
            t.insert(block(h, 84 + (h as usize % 50)));
            assert!(t.bytes() <= 350, "{} bytes", t.bytes());
        }
    }

    #[test]
    fn a_collision_is_not_a_hit_and_oversized_or_zero_bounds_keep_nothing() {
        let mut t = HostTier::new(1000);
        t.insert(block(9, 10));
        assert!(t.get(9, &[8; 4]).is_none(), "other tokens under the same hash");
        assert!(t.get(9, &[9; 4]).is_some());
        assert!(t.insert(block(10, 2000)).is_empty());
        assert!(!t.contains(10));
        let mut off = HostTier::new(0);
        off.insert(block(1, 1));
        assert!(off.is_empty());
    }

    #[test]
    fn inserting_a_held_block_again_only_touches_it() {
        let mut t = HostTier::new(200);
        t.insert(block(1, 84));
        t.insert(block(2, 84));
        t.insert(block(1, 84));
        assert_eq!(t.bytes(), 200);
        assert_eq!(t.insert(block(3, 84)), vec![2]);
    }
}
