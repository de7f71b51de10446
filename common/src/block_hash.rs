//! The chained KV block hash: a prompt's token ids, cut into fixed-size blocks, each block hashed together with
//! the hash of the block before it. Two prompts share a block hash exactly when they share every token up to the
//! end of that block (up to hash collisions), so the hashes name reusable KV-cache prefixes.
//!
//! The function is part of the cluster's protocol: frontends, orchestrators and workers of one cluster must agree
//! on it bit for bit, on every platform. It is a fast 64-bit mix (not cryptographic): a collision can at worst
//! make a router prefer the wrong worker, because a worker confirms the tokens of a cached block before reusing it.

/// Tokens per KV block unless configured otherwise. 16 balances prefix-sharing granularity (a shared prefix is only
/// reusable in whole blocks) against block-table size.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// A block's chained hash.
pub type BlockHash = u64;

/// Domain separator, so a block hash never equals a hash computed elsewhere with the same mixer; bumped if the
/// function ever changes (which invalidates every cached prefix in the cluster).
const SEED: u64 = 0x7a6c_626c_6b68_0001; // "zlblkh" v1

#[inline]
fn mix(x: u64) -> u64 {
    // splitmix64 finaliser: full avalanche, so nearby inputs give unrelated outputs.
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash of one block given its parent's hash (`None` for the first block).
pub fn chain_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = mix(SEED ^ parent.map_or(0, |p| mix(p ^ 0x9e37_79b9_7f4a_7c15)));
    h = mix(h ^ tokens.len() as u64);
    for pair in tokens.chunks(2) {
        let word = u64::from(pair[0]) | (pair.get(1).map_or(0xffff_ffff, |&t| u64::from(t)) << 32);
        h = mix(h.rotate_left(23) ^ word);
    }
    h
}

/// Chained hashes of every full block of `tokens` (a trailing partial block has none: it cannot be shared yet).
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    salted_block_hashes(tokens, block_size, None)
}

/// The salt of a cache scope (`project:NAME`, or `group:NAME` for projects an admin put in one cache group): the
/// first block of a salted chain takes it as its parent, so two scopes never share a block hash, and a worker's
/// prefix cache never serves one scope's blocks to another (docs/api.md, "Isolation"). Never 0, which the wire
/// uses for "unsalted".
pub fn cache_salt(scope: &str) -> BlockHash {
    let fnv = scope.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    mix(SEED ^ mix(fnv ^ 0x7363_6f70_6500_0001)).max(1) // "scope" v1
}

/// The salt of a LoRA adapter's requests within the scope `salt` (`None`: unsalted): an adapter's keys and values
/// differ from the base's for the same tokens, so its prefix blocks are its own. `adapter` names it by content
/// (its SHA-256's first eight bytes, big-endian). Never 0.
pub fn adapter_salt(salt: Option<BlockHash>, adapter: u64) -> BlockHash {
    mix(SEED ^ mix(salt.unwrap_or(0) ^ mix(adapter ^ 0x6164_6170_7465_0001))).max(1) // "adapte" v1
}

/// An adapter's content key for [`adapter_salt`]: its weights file's SHA-256's first eight bytes, big-endian.
pub fn adapter_key(sha256: &[u8; 32]) -> u64 {
    u64::from_be_bytes([sha256[0], sha256[1], sha256[2], sha256[3], sha256[4], sha256[5], sha256[6], sha256[7]])
}

/// [`block_hashes`] of a chain that starts from `salt` (`None`: the unsalted chain every scope shares).
pub fn salted_block_hashes(tokens: &[u32], block_size: usize, salt: Option<BlockHash>) -> Vec<BlockHash> {
    assert!(block_size > 0, "block size must be positive");
    let mut parent = salt;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let h = chain_hash(parent, block);
            parent = Some(h);
            h
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adapters_salt_differs_from_its_scope_and_from_other_adapters() {
        let project = cache_salt("project:a");
        let scope = Some(project);
        let all = [project, adapter_salt(scope, 1), adapter_salt(scope, 2), adapter_salt(None, 1)];
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| a != b), "{all:?}");
        }
        assert_eq!(adapter_salt(scope, 1), adapter_salt(scope, 1));
    }

    #[test]
    fn salted_chains_share_nothing_across_scopes() {
        let tokens: Vec<u32> = (0..64).collect();
        let (a, b) = (cache_salt("project:a"), cache_salt("project:b"));
        assert_ne!(a, b);
        assert_eq!(cache_salt("group:g"), cache_salt("group:g"));
        let (ha, hb) = (salted_block_hashes(&tokens, 16, Some(a)), salted_block_hashes(&tokens, 16, Some(b)));
        let plain = block_hashes(&tokens, 16);
        assert_eq!(ha.len(), 4);
        for h in &ha {
            assert!(!hb.contains(h) && !plain.contains(h), "a salted block hash is its scope's alone");
        }
        // The same scope computes the same chain on every tier: a frontend's route hashes match a worker's blocks.
        assert_eq!(ha, salted_block_hashes(&tokens, 16, Some(cache_salt("project:a"))));
        assert_eq!(salted_block_hashes(&tokens, 16, None), plain);
    }

    #[test]
    fn golden_values_never_change() {
        // These values are part of the protocol between tiers: if this test fails, the function changed, and every
        // deployed frontend, orchestrator and worker would disagree. Bump SEED and update deliberately instead.
        let tokens: Vec<u32> = (0..40).collect();
        assert_eq!(block_hashes(&tokens, 16), vec![GOLDEN[0], GOLDEN[1]]);
        assert_eq!(chain_hash(None, &[]), GOLDEN[2]);
        // Frontends salt the chains they route with, and send the salt to workers: every frontend computes it alike.
        assert_eq!(cache_salt("project:default"), 0x2f80_4f1c_9f3f_ee44);
    }

    const GOLDEN: [u64; 3] = [0x7cb0_6e6b_d1f3_6bc2, 0x5540_bc76_b1ee_6010, 0x2317_ef48_80b8_3615];

    #[test]
    fn shared_prefixes_share_hashes_and_diverge_after() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 999;
        let ha = block_hashes(&a, 16);
        let hb = block_hashes(&b, 16);
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        // A change in an early block changes every later hash (chaining).
        let mut c = a.clone();
        c[0] = 7;
        let hc = block_hashes(&c, 16);
        assert!(ha.iter().zip(&hc).all(|(x, y)| x != y));
    }

    #[test]
    fn partial_blocks_have_no_hash_and_order_matters() {
        assert_eq!(block_hashes(&[1, 2, 3], 4).len(), 0);
        assert_eq!(block_hashes(&[1, 2, 3, 4, 5], 4).len(), 1);
        assert_ne!(chain_hash(None, &[1, 2]), chain_hash(None, &[2, 1]));
        assert_ne!(chain_hash(None, &[1]), chain_hash(None, &[1, 0xffff_ffff]));
        assert_ne!(chain_hash(None, &[1, 2]), chain_hash(Some(0), &[1, 2]));
    }

    #[test]
    fn no_collisions_among_many_small_blocks() {
        let mut seen = std::collections::HashSet::new();
        for a in 0..300u32 {
            for b in 0..300u32 {
                assert!(seen.insert(chain_hash(None, &[a, b])), "collision at {a},{b}");
            }
        }
    }
}
