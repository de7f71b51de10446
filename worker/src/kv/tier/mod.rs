//! The KV cache's lower tiers: full blocks that leave the hot pool (the model's KV storage) are kept in host RAM
//! (`host`) and on disk (`disk`, in files whose format is `file`'s), each in `lru`'s order, and brought back when a
//! prompt's cached prefix continues there, instead of being computed again. `store` is the thin shell that shares them between the
//! engine's thread, the disk writer and the requests' prefetches.
//!
//! A block is keyed by its chained hash (which already carries the cache scope's salt and the LoRA adapter's), and
//! every tier belongs to one [`Namespace`]: the model's weights, the KV cache's type and block size and the CPU
//! kernels that computed it. A block is never served across a model, adapter, dtype or tenant boundary.

pub mod disk;
pub mod file;
pub mod host;
pub mod lru;
pub mod store;

use std::sync::Arc;

use zl_common::block_hash::BlockHash;

/// What a tier's blocks belong to: a digest of the model's weights, the KV cache's storage type and block size, and
/// the kernels that computed the values (an ISA level and activation width can round differently). Two engines
/// share blocks only when their namespaces are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Namespace(pub u64);

impl Namespace {
    /// The namespace of a model whose weights hash to `weights_sha256`, its KV cache stored as `dtype` in blocks of
    /// `block_size` tokens, computed by `kernels` (e.g. "avx2/16-bit").
    pub fn new(weights_sha256: &[u8; 32], dtype: crate::kv::dtype::KvDtype, block_size: usize, kernels: &str) -> Self {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"zerolayer kv tier v1\0");
        ctx.update(weights_sha256);
        ctx.update(dtype.name().as_bytes());
        ctx.update(&(block_size as u64).to_le_bytes());
        ctx.update(kernels.as_bytes());
        let d = ctx.finish();
        let mut first = [0u8; 8];
        first.copy_from_slice(&d.as_ref()[..8]);
        Namespace(u64::from_le_bytes(first))
    }

    /// Its name in directory names and logs: 16 hex digits.
    pub fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
}

/// One block's keys and values of every layer, as the hot pool's storage exports them, with the tokens they are of
/// (a hit is confirmed against them, as the hot pool confirms its own).
#[derive(Debug, PartialEq, Eq)]
pub struct TierBlock {
    /// The block's chained hash.
    pub hash: BlockHash,
    /// Its tokens.
    pub tokens: Box<[u32]>,
    /// Its keys and values, in the storage's export layout.
    pub payload: Box<[u8]>,
}

impl TierBlock {
    /// Bytes it holds (what a tier's bound counts).
    pub fn bytes(&self) -> usize {
        self.payload.len() + 4 * self.tokens.len()
    }
}

/// A block shared between tiers and the restore that reads it.
pub type Shared = Arc<TierBlock>;

/// Where a block was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Host memory.
    Host,
    /// A file under the disk tier's directory.
    Disk,
}

impl Tier {
    /// Its name in metrics labels and logs.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Host => "host",
            Tier::Disk => "disk",
        }
    }
}
