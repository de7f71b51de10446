//! The stable, non-cryptographic hashes the orchestrator computes: model tags and string hashes that every node
//! and platform computes alike (route decisions and canary splits must agree across the group), and the fast
//! hasher of the maps a route decision reads.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A fast, non-cryptographic hasher (the Fx multiply-rotate) for the maps a route decision reads. Every key it
/// sees comes from authenticated peers (worker ids, block hashes that are already mixed by the chained block hash,
/// internal slot numbers), so hash-flooding resistance is not needed here and SipHash's cost is.
#[derive(Clone, Copy, Debug, Default)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` with [`FxHasher`].
pub type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// A `HashSet` with [`FxHasher`].
pub type FxHashSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

/// A model's tag in the prefix index (hashes of different models never mix).
pub fn model_tag(model: &str) -> u64 {
    // FNV-1a: stable across processes and platforms.
    model.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// A 64-bit finaliser (splitmix64's): spreads FNV's weak low bits over the whole word.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable 64-bit hash of a string (FNV-1a, then mixed), the same on every node and platform.
pub fn stable_hash(s: &str) -> u64 {
    mix(model_tag(s))
}
