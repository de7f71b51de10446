//! The deterministic response cache: an in-memory, byte-bounded LRU of finished generations, keyed by the SHA-256
//! of the canonicalised request. Only requests whose output is a function of the request are cached (greedy, or
//! an explicit seed): sampling is seeded and batch-invariant on the workers, so a repeat would produce exactly the
//! stored tokens. Streaming hits replay the stored text deltas as the same events.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;
use zl_wire::message::StopReason;

/// A finished generation's ending.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishInfo {
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// The stop sequence that matched.
    pub stop_sequence: Option<String>,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// Prompt tokens served from the worker's prefix cache.
    pub cached_input_tokens: u32,
    /// The semantic billing unit of the request.
    pub billing_unit: f32,
    /// Draft tokens predictive streaming verified.
    pub draft_tokens: u32,
    /// Draft tokens it accepted (output tokens that cost no model step of their own).
    pub accepted_draft_tokens: u32,
    /// Workers the request moved to when the one before failed mid-answer, in order (empty for most).
    pub migrated_to: Vec<String>,
}

/// A stored generation.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedAnswer {
    /// Text deltas as the worker sent them.
    pub deltas: Vec<String>,
    /// How it ended.
    pub finish: FinishInfo,
    /// Concrete model id.
    pub model: String,
}

impl CachedAnswer {
    fn bytes(&self) -> usize {
        // Text plus a fixed overhead per delta and entry (allocation headers, the index).
        self.deltas.iter().map(|d| d.len() + 32).sum::<usize>() + self.model.len() + 256
    }
}

/// The canonical form of a request for the cache key: everything that decides the output, and the cache scope it
/// may be shared in (a project, or an admin's cache group: one tenant's answers are never another's hits).
#[derive(Serialize)]
pub struct CacheKeyParts<'a> {
    /// `project:NAME` or `group:NAME` (`Cluster::cache_scope`).
    pub scope: &'a str,
    /// Concrete model id.
    pub model: &'a str,
    /// Weights SHA-256 (hex).
    pub weights: &'a str,
    /// The prompt as the model sees it (system and messages rendered by the chat template).
    pub prompt: &'a str,
    /// Output limit.
    pub max_tokens: u32,
    /// Sampling.
    pub temperature: f32,
    /// Sampling.
    pub top_p: f32,
    /// Sampling.
    pub top_k: u32,
    /// Seed, if any.
    pub seed: Option<u64>,
    /// Stop sequences, in order.
    pub stop: &'a [String],
    /// The grammar the answer matches (tools and schemas), empty for none.
    pub grammar: &'a str,
}

impl CacheKeyParts<'_> {
    /// SHA-256 of the canonical JSON.
    pub fn key(&self) -> [u8; 32] {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let digest = ring::digest::digest(&ring::digest::SHA256, &json);
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        key
    }
}

/// Byte-bounded LRU.
#[derive(Debug)]
pub struct ResponseCache {
    capacity: usize,
    used: usize,
    tick: u64,
    entries: HashMap<[u8; 32], (Arc<CachedAnswer>, u64)>,
    recency: BTreeMap<u64, [u8; 32]>,
}

impl ResponseCache {
    /// A cache of at most `capacity` bytes (0 disables it).
    pub fn new(capacity: usize) -> Self {
        ResponseCache { capacity, used: 0, tick: 0, entries: HashMap::new(), recency: BTreeMap::new() }
    }

    /// Whether it stores anything at all.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Bytes held.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Look up and mark as recently used.
    pub fn get(&mut self, key: &[u8; 32]) -> Option<Arc<CachedAnswer>> {
        self.tick += 1;
        let (answer, tick) = self.entries.get_mut(key)?;
        self.recency.remove(tick);
        *tick = self.tick;
        self.recency.insert(self.tick, *key);
        Some(answer.clone())
    }

    /// Store, evicting the least recently used entries to stay within the capacity. An entry larger than the
    /// whole cache is not stored.
    pub fn insert(&mut self, key: [u8; 32], answer: CachedAnswer) {
        let size = answer.bytes();
        if size > self.capacity {
            return;
        }
        self.remove(&key);
        while self.used + size > self.capacity {
            let Some((_, oldest)) = self.recency.pop_first() else { break };
            if let Some((old, _)) = self.entries.remove(&oldest) {
                self.used -= old.bytes();
            }
        }
        self.tick += 1;
        self.used += size;
        self.recency.insert(self.tick, key);
        self.entries.insert(key, (Arc::new(answer), self.tick));
    }

    fn remove(&mut self, key: &[u8; 32]) {
        if let Some((old, tick)) = self.entries.remove(key) {
            self.recency.remove(&tick);
            self.used -= old.bytes();
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn answer(text: &str) -> CachedAnswer {
        CachedAnswer {
            deltas: vec![text.to_owned()],
            finish: FinishInfo {
                stop_reason: StopReason::EndTurn,
                stop_sequence: None,
                input_tokens: 1,
                output_tokens: 1,
                cached_input_tokens: 0,
                draft_tokens: 0,
                accepted_draft_tokens: 0,
                migrated_to: Vec::new(),
                billing_unit: 0.1,
            },
            model: "m".into(),
        }
    }

    fn key(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[test]
    fn least_recently_used_goes_first_and_bytes_stay_bounded() {
        let one = answer(&"x".repeat(100)).bytes();
        let mut c = ResponseCache::new(one * 3);
        for n in 0..3 {
            c.insert(key(n), answer(&"x".repeat(100)));
        }
        assert!(c.get(&key(0)).is_some()); // 0 is now the most recent
        c.insert(key(3), answer(&"x".repeat(100)));
        assert!(c.get(&key(1)).is_none(), "1 was least recently used");
        assert!(c.get(&key(0)).is_some());
        assert_eq!(c.len(), 3);
        assert!(c.used() <= one * 3);
        c.insert(key(9), answer(&"x".repeat(one * 4)));
        assert!(c.get(&key(9)).is_none(), "an entry larger than the cache is not stored");
        c.insert(key(0), answer("y"));
        assert_eq!(c.get(&key(0)).unwrap().deltas, vec!["y".to_owned()]);
    }

    #[test]
    fn keys_cover_everything_that_decides_the_output() {
        let stop = vec!["\n\n".to_owned()];
        let base = CacheKeyParts {
            scope: "project:a",
            model: "m",
            weights: "ab",
            prompt: "p",
            max_tokens: 10,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            stop: &stop,
            grammar: "",
        };
        let k = base.key();
        assert_eq!(k, CacheKeyParts { ..base }.key());
        assert_ne!(k, CacheKeyParts { weights: "cd", ..base }.key());
        assert_ne!(k, CacheKeyParts { scope: "project:b", ..base }.key());
        assert_ne!(k, CacheKeyParts { scope: "group:a", ..base }.key());
        assert_ne!(k, CacheKeyParts { seed: Some(1), ..base }.key());
        assert_ne!(k, CacheKeyParts { max_tokens: 11, ..base }.key());
        assert_ne!(k, CacheKeyParts { stop: &[], ..base }.key());
        assert_ne!(k, CacheKeyParts { prompt: "q", ..base }.key());
        assert_ne!(k, CacheKeyParts { grammar: "start: %json {}", ..base }.key());
    }
}
