//! The order both tiers keep their blocks in: by chained hash, each with its size, least recently used first out,
//! never more than a byte bound. Pure: recency is a logical tick, and nothing here reads a clock or a file.

use std::collections::{BTreeSet, HashMap};

use zl_common::block_hash::BlockHash;

#[derive(Debug)]
struct Entry<V> {
    value: V,
    tick: u64,
    size: u64,
}

/// A byte-bounded LRU of blocks.
#[derive(Debug)]
pub struct Lru<V> {
    cap: u64,
    bytes: u64,
    tick: u64,
    map: HashMap<BlockHash, Entry<V>>,
    order: BTreeSet<(u64, BlockHash)>,
}

impl<V> Lru<V> {
    /// Empty, of at most `cap` bytes.
    pub fn new(cap: u64) -> Self {
        Lru { cap, bytes: 0, tick: 0, map: HashMap::new(), order: BTreeSet::new() }
    }

    /// Its bound.
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// Bytes held now (never above the bound).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether it holds `hash`.
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.map.contains_key(&hash)
    }

    /// Block `hash`'s value, its recency unchanged.
    pub fn peek(&self, hash: BlockHash) -> Option<&V> {
        self.map.get(&hash).map(|e| &e.value)
    }

    /// Mark `hash` the most recently used, if held.
    pub fn touch(&mut self, hash: BlockHash) -> bool {
        let Some(e) = self.map.get_mut(&hash) else { return false };
        self.order.remove(&(e.tick, hash));
        self.tick += 1;
        e.tick = self.tick;
        self.order.insert((e.tick, hash));
        true
    }

    /// Hold `hash` (`size` bytes) as the most recently used, evicting the least recently used as the bound needs:
    /// returns the evicted. One held already is only touched (its value kept). `None` (nothing held) when `size` is
    /// larger than the whole bound.
    pub fn insert(&mut self, hash: BlockHash, value: V, size: u64) -> Option<Vec<(BlockHash, V)>> {
        if size > self.cap {
            return None;
        }
        if self.touch(hash) {
            return Some(Vec::new());
        }
        let mut evicted = Vec::new();
        while self.bytes + size > self.cap {
            let Some((_, old)) = self.order.pop_first() else { break };
            let e = self.map.remove(&old).expect("the order and the map agree");
            self.bytes -= e.size;
            evicted.push((old, e.value));
        }
        self.tick += 1;
        self.bytes += size;
        self.order.insert((self.tick, hash));
        self.map.insert(hash, Entry { value, tick: self.tick, size });
        Some(evicted)
    }

    /// Forget `hash`; its value.
    pub fn remove(&mut self, hash: BlockHash) -> Option<V> {
        let e = self.map.remove(&hash)?;
        self.order.remove(&(e.tick, hash));
        self.bytes -= e.size;
        Some(e.value)
    }

    /// Every hash held.
    pub fn hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.map.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_holds_least_recently_used_first_out() {
        let mut l: Lru<u8> = Lru::new(300);
        for h in 1..=3 {
            assert_eq!(l.insert(h, h as u8, 100), Some(vec![]));
        }
        assert_eq!(l.insert(3, 0, 100), Some(vec![]), "held already: touched, value kept");
        assert_eq!(l.peek(3), Some(&3));
        assert!(l.touch(1));
        assert_eq!(l.insert(4, 4, 100), Some(vec![(2, 2)]));
        assert_eq!(l.remove(4), Some(4));
        assert_eq!(l.insert(5, 5, 250), Some(vec![(3, 3), (1, 1)]), "as many as it takes");
        assert_eq!((l.len(), l.bytes()), (1, 250));
        assert_eq!(l.insert(6, 6, 301), None, "larger than the bound");
        assert!(l.remove(4).is_none() && !l.touch(4));
    }
}
