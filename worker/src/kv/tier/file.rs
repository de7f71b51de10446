//! A disk tier block file: the block, the key it belongs to and a checksum over everything, so that a torn,
//! truncated, foreign or altered file is recognised and never served. Pure: bytes in, bytes out.
//!
//! Layout (little-endian): magic `ZLKVBLK1`, namespace (u64), block hash (u64), token count (u32), payload bytes
//! (u32), the tokens (u32 each), the payload, then the CRC-32 (IEEE) of all that precedes
//! it.

use zl_common::block_hash::BlockHash;

use super::{Namespace, TierBlock};

const MAGIC: &[u8; 8] = b"ZLKVBLK1";
const HEADER: usize = 8 + 8 + 8 + 4 + 4;

/// Why a block file was not served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadFile {
    /// Shorter or longer than its header says (a torn or truncated write).
    #[error("{0} bytes: not the size its header gives")]
    Size(usize),
    /// Not a block file of this format.
    #[error("not a zerolayer KV block file")]
    Magic,
    /// A block of another model, dtype, block size or kernel set.
    #[error("a block of namespace {0:016x}")]
    Foreign(u64),
    /// Filed under another block's name.
    #[error("holds block {0:016x}")]
    Key(BlockHash),
    /// Not the shape this engine's blocks have.
    #[error("{tokens} tokens and {payload} payload bytes: not this engine's block shape")]
    Shape {
        /// Tokens it holds.
        tokens: usize,
        /// Payload bytes it holds.
        payload: usize,
    },
    /// The checksum does not match: the bytes were altered.
    #[error("checksum mismatch")]
    Checksum,
}

/// Bytes a block file of `tokens` tokens and `payload` payload bytes takes.
pub fn file_bytes(tokens: usize, payload: usize) -> usize {
    HEADER + 4 * tokens + payload + 4
}

/// The file for `block` of namespace `ns`.
pub fn encode(ns: Namespace, block: &TierBlock) -> Vec<u8> {
    let mut out = Vec::with_capacity(file_bytes(block.tokens.len(), block.payload.len()));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&ns.0.to_le_bytes());
    out.extend_from_slice(&block.hash.to_le_bytes());
    out.extend_from_slice(&(block.tokens.len() as u32).to_le_bytes());
    out.extend_from_slice(&(block.payload.len() as u32).to_le_bytes());
    for t in block.tokens.iter() {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&block.payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The block in `bytes`, checked to be block `hash` of namespace `ns` with `tokens` tokens and `payload` payload
/// bytes, unaltered.
pub fn decode(
    bytes: &[u8],
    ns: Namespace,
    hash: BlockHash,
    tokens: usize,
    payload: usize,
) -> Result<TierBlock, BadFile> {
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    if bytes.len() < HEADER + 4 {
        return Err(BadFile::Size(bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err(BadFile::Magic);
    }
    let (n, p) = (u32_at(24) as usize, u32_at(28) as usize);
    if bytes.len() != file_bytes(n, p) {
        return Err(BadFile::Size(bytes.len()));
    }
    let body = bytes.len() - 4;
    if crc32fast::hash(&bytes[..body]) != u32_at(body) {
        return Err(BadFile::Checksum);
    }
    if u64_at(8) != ns.0 {
        return Err(BadFile::Foreign(u64_at(8)));
    }
    if u64_at(16) != hash {
        return Err(BadFile::Key(u64_at(16)));
    }
    if (n, p) != (tokens, payload) {
        return Err(BadFile::Shape { tokens: n, payload: p });
    }
    let toks: Box<[u32]> = (0..n).map(|i| u32_at(HEADER + 4 * i)).collect();
    let start = HEADER + 4 * n;
    Ok(TierBlock { hash, tokens: toks, payload: bytes[start..start + p].into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TierBlock {
        TierBlock { hash: 0xfeed, tokens: vec![1, 2, 3, 4].into(), payload: (0..100u8).collect() }
    }

    #[test]
    fn a_block_reads_back_as_written() {
        let bytes = encode(Namespace(7), &sample());
        assert_eq!(bytes.len(), file_bytes(4, 100));
        assert_eq!(decode(&bytes, Namespace(7), 0xfeed, 4, 100), Ok(sample()));
    }

    #[test]
    fn every_kind_of_bad_file_is_refused() {
        let good = encode(Namespace(7), &sample());
        let (ns, h) = (Namespace(7), 0xfeed);
        assert_eq!(decode(&good[..good.len() - 1], ns, h, 4, 100), Err(BadFile::Size(good.len() - 1)));
        assert_eq!(decode(&good[..10], ns, h, 4, 100), Err(BadFile::Size(10)));
        assert_eq!(decode(&[], ns, h, 4, 100), Err(BadFile::Size(0)));
        assert_eq!(decode(&good, Namespace(8), h, 4, 100), Err(BadFile::Foreign(7)));
        assert_eq!(decode(&good, ns, 0xbeef, 4, 100), Err(BadFile::Key(0xfeed)));
        assert_eq!(decode(&good, ns, h, 8, 100), Err(BadFile::Shape { tokens: 4, payload: 100 }));
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(decode(&magic, ns, h, 4, 100), Err(BadFile::Magic));
        // Any flipped byte after the magic is caught by the checksum.
        for at in [9, 20, 40, good.len() - 60, good.len() - 5, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad, ns, h, 4, 100).is_err(), "byte {at} flipped");
        }
    }
}
