//! The GGUF block formats kept as the file stores them (Q4_0, Q5_0, Q5_1 and the K-quants Q2_K to Q6_K): their
//! bytes stay in memory unchanged, and a kernel unpacks one tile of eight output features at a time into small
//! integers and per-16 scales ([`TileBuf`]), shared by every batch row of the step. Decoding is exact: every
//! value is `s * q + m` with an integer `q` (at most 8 bits), and `s` and `m` are products of an f16 and a small
//! integer, which f32 holds exactly. A leaf beside `weight.rs`: no product is computed here.

use super::{QK, TILE};

/// Elements per sub-block: the scale granularity every format is unpacked to (K-quants with 32-element
/// sub-blocks repeat their scale for both halves).
pub(super) const SUB: usize = 16;

/// Sub-blocks per 32-element block.
pub(super) const HALVES: usize = QK / SUB;

/// An IEEE half's bits as f32, exactly, inline (the `half` crate's conversion is a call and a CPU-feature check
/// per value, which cost the block kernels half their time at one row).
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let (exp, man) = (u32::from((h >> 10) & 0x1f), u32::from(h & 0x3ff));
    match exp {
        0 => {
            // Zero or subnormal: man * 2^-24, exact in f32.
            let v = man as f32 * (1.0 / 16_777_216.0);
            f32::from_bits(v.to_bits() | sign)
        }
        31 => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// A GGUF block format with its bytes kept as the file has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockFormat {
    /// 32 values: f16 `d`, 4-bit `q`; `x = d * (q - 8)`.
    Q4_0,
    /// 32 values: f16 `d`, 5-bit `q`; `x = d * (q - 16)`.
    Q5_0,
    /// 32 values: f16 `d` and `m`, 5-bit `q`; `x = d * q + m`.
    Q5_1,
    /// 256 values: 2-bit `q`, 4-bit scales and minimums per 16.
    Q2K,
    /// 256 values: 3-bit `q`, 6-bit signed scales per 16.
    Q3K,
    /// 256 values: 4-bit `q`, 6-bit scales and minimums per 32.
    Q4K,
    /// 256 values: 5-bit `q`, 6-bit scales and minimums per 32.
    Q5K,
    /// 256 values: 6-bit `q`, 8-bit signed scales per 16.
    Q6K,
}

impl BlockFormat {
    /// Every block format, for tests and listings.
    pub const ALL: [BlockFormat; 8] = [
        BlockFormat::Q4_0,
        BlockFormat::Q5_0,
        BlockFormat::Q5_1,
        BlockFormat::Q2K,
        BlockFormat::Q3K,
        BlockFormat::Q4K,
        BlockFormat::Q5K,
        BlockFormat::Q6K,
    ];

    /// The name GGUF tools use.
    pub fn name(self) -> &'static str {
        match self {
            BlockFormat::Q4_0 => "Q4_0",
            BlockFormat::Q5_0 => "Q5_0",
            BlockFormat::Q5_1 => "Q5_1",
            BlockFormat::Q2K => "Q2_K",
            BlockFormat::Q3K => "Q3_K",
            BlockFormat::Q4K => "Q4_K",
            BlockFormat::Q5K => "Q5_K",
            BlockFormat::Q6K => "Q6_K",
        }
    }

    /// Values per block (a super-block for the K-quants).
    pub fn elems(self) -> usize {
        match self {
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => 32,
            _ => 256,
        }
    }

    /// Bytes per block.
    pub fn bytes(self) -> usize {
        match self {
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q5_0 => 22,
            BlockFormat::Q5_1 => 24,
            BlockFormat::Q2K => 84,
            BlockFormat::Q3K => 110,
            BlockFormat::Q4K => 144,
            BlockFormat::Q5K => 176,
            BlockFormat::Q6K => 210,
        }
    }

    /// Where a block's f16 scale fields (`d`, and `dmin` or `m`) sit, in bytes from its start.
    pub fn f16_fields(self) -> &'static [usize] {
        match self {
            BlockFormat::Q4_0 | BlockFormat::Q5_0 => &[0],
            BlockFormat::Q5_1 | BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
            BlockFormat::Q2K => &[80, 82],
            BlockFormat::Q3K => &[108],
            BlockFormat::Q6K => &[208],
        }
    }

    /// What a legacy format takes off its unsigned quants (Q4_0's nibbles 8, Q5_0's five bits 16; Q5_1 has a
    /// minimum instead, and the other formats none): its quants are `u - offset`.
    pub(super) fn offset(self) -> i8 {
        match self {
            BlockFormat::Q4_0 => 8,
            BlockFormat::Q5_0 => 16,
            _ => 0,
        }
    }

    /// Whether values carry an additive minimum (`x = s * q + m` with `m` not zero).
    pub(super) fn has_min(self) -> bool {
        matches!(self, BlockFormat::Q5_1 | BlockFormat::Q2K | BlockFormat::Q4K | BlockFormat::Q5K)
    }

    /// Decode one block: its integers into `q` (`elems()` values) and each 16 values' scale and minimum into `s`
    /// and `m` (`elems() / 16` each), so that value `e` is `s[e / 16] * q[e] + m[e / 16]`.
    #[inline(always)]
    pub(super) fn decode(self, b: &[u8], q: &mut [i8], s: &mut [f32], m: &mut [f32]) {
        self.quants(b, q);
        self.scales(b, s, m);
    }

    /// One block's integers into `q` (`elems()` values): [`BlockFormat::decode`]'s first half (the SIMD levels
    /// decode them their own way, to the same values).
    #[inline(always)]
    pub(super) fn quants(self, b: &[u8], q: &mut [i8]) {
        match self {
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
                let (qh, qs) = match self {
                    BlockFormat::Q4_0 => (0, &b[2..18]),
                    BlockFormat::Q5_0 => (u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &b[6..22]),
                    _ => (u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24]),
                };
                let offset = self.offset();
                for j in 0..16 {
                    let lo = (qs[j] & 0x0f) | ((((qh >> j) & 1) as u8) << 4);
                    let hi = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                    q[j] = lo as i8 - offset;
                    q[j + 16] = hi as i8 - offset;
                }
            }
            BlockFormat::Q2K => {
                let qs = &b[16..80];
                for n in 0..2 {
                    for j in 0..4 {
                        for l in 0..32 {
                            q[n * 128 + j * 32 + l] = ((qs[n * 32 + l] >> (2 * j)) & 3) as i8;
                        }
                    }
                }
            }
            BlockFormat::Q3K => {
                let (hmask, qs) = (&b[0..32], &b[32..96]);
                for n in 0..2 {
                    for j in 0..4 {
                        let bit = 1u8 << (n * 4 + j);
                        for l in 0..32 {
                            let low = ((qs[n * 32 + l] >> (2 * j)) & 3) as i8;
                            q[n * 128 + j * 32 + l] = low - if hmask[l] & bit != 0 { 0 } else { 4 };
                        }
                    }
                }
            }
            BlockFormat::Q4K | BlockFormat::Q5K => {
                let (qh, qs) =
                    if self == BlockFormat::Q5K { (&b[16..48], &b[48..176]) } else { (&[0u8; 32][..], &b[16..144]) };
                for j in 0..4 {
                    for l in 0..32 {
                        let byte = qs[j * 32 + l];
                        let lo = (byte & 0x0f) | (((qh[l] >> (2 * j)) & 1) << 4);
                        let hi = (byte >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4);
                        q[j * 64 + l] = lo as i8;
                        q[j * 64 + 32 + l] = hi as i8;
                    }
                }
            }
            BlockFormat::Q6K => {
                let (ql, qh) = (&b[0..128], &b[128..192]);
                for n in 0..2 {
                    for l in 0..32 {
                        let (l0, l1, h) = (ql[n * 64 + l], ql[n * 64 + 32 + l], qh[n * 32 + l]);
                        let at = n * 128 + l;
                        q[at] = ((l0 & 0x0f) | ((h & 3) << 4)) as i8 - 32;
                        q[at + 32] = ((l1 & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32;
                        q[at + 64] = ((l0 >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                        q[at + 96] = ((l1 >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                    }
                }
            }
        }
    }

    /// One block's scale and minimum per 16 values into `s` and `m` (`elems() / 16` each): [`BlockFormat::decode`]'s
    /// second half, which every level shares.
    #[inline(always)]
    pub(super) fn scales(self, b: &[u8], s: &mut [f32], m: &mut [f32]) {
        let half = |at: usize| f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]));
        match self {
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
                s[..2].fill(half(0));
                m[..2].fill(if self == BlockFormat::Q5_1 { half(2) } else { 0.0 });
            }
            BlockFormat::Q2K => {
                let (d, dmin) = (half(80), half(82));
                for (i, &sc) in b[0..16].iter().enumerate() {
                    s[i] = d * f32::from(sc & 0x0f);
                    m[i] = -(dmin * f32::from(sc >> 4));
                }
            }
            BlockFormat::Q3K => {
                let (packed, d) = (&b[96..108], half(108));
                for (i, si) in s[..16].iter_mut().enumerate() {
                    // Scale i: its low four bits from byte i % 8 (low nibble for i < 8), its high two bits from
                    // byte 8 + i % 4 at bit 2 * (i / 4).
                    let low = if i < 8 { packed[i] & 0x0f } else { packed[i - 8] >> 4 };
                    let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
                    *si = d * f32::from(i16::from(low | (high << 4)) - 32);
                }
                m[..16].fill(0.0);
            }
            BlockFormat::Q4K | BlockFormat::Q5K => {
                let (d, dmin) = (half(0), half(2));
                for i in 0..8 {
                    let (sc, mn) = k_scale_min(&b[4..16], i);
                    s[2 * i..2 * i + 2].fill(d * f32::from(sc));
                    m[2 * i..2 * i + 2].fill(-(dmin * f32::from(mn)));
                }
            }
            BlockFormat::Q6K => {
                let d = half(208);
                for (si, &sc) in s[..16].iter_mut().zip(&b[192..208]) {
                    *si = d * f32::from(sc as i8);
                }
                m[..16].fill(0.0);
            }
        }
    }

    /// Row `r` of a row-major matrix of `cols` values in this format, as f32 (an embedding lookup).
    pub(super) fn row(self, raw: &[u8], cols: usize, r: usize, out: &mut [f32]) {
        let (elems, bytes) = (self.elems(), self.bytes());
        let per_row = cols / elems * bytes;
        let mut q = [0i8; 256];
        let (mut s, mut m) = ([0f32; 16], [0f32; 16]);
        for (block, out) in raw[r * per_row..(r + 1) * per_row].chunks_exact(bytes).zip(out.chunks_exact_mut(elems)) {
            self.decode(block, &mut q, &mut s, &mut m);
            for (e, o) in out.iter_mut().enumerate() {
                *o = s[e / SUB] * f32::from(q[e]) + m[e / SUB];
            }
        }
    }
}

/// Block `i`'s (0..8) 6-bit scale and minimum from a Q4_K or Q5_K super-block's 12 packed bytes.
#[inline(always)]
pub(super) fn k_scale_min(packed: &[u8], i: usize) -> (u8, u8) {
    if i < 4 {
        (packed[i] & 63, packed[i + 4] & 63)
    } else {
        ((packed[i + 4] & 0x0f) | ((packed[i - 4] >> 6) << 4), (packed[i + 4] >> 4) | ((packed[i] >> 6) << 4))
    }
}

/// One tile of a block-format weight unpacked for the integer kernels: eight features' integers in the Q8_0
/// tile layout (per 32-element block, eight 32-byte chunks; bytes `4j..4j + 4` of chunk `k` are elements
/// `4k..4k + 4` of feature `j`), and per block, half and feature the scale and the minimum.
#[derive(Debug, Default)]
pub(super) struct TileBuf {
    pub(super) q: Vec<i8>,
    /// `[block][half][feature]`.
    pub(super) s: Vec<f32>,
    /// Laid out as `s`; all zero for formats without a minimum.
    pub(super) m: Vec<f32>,
}

/// Where element `i` (0..32) of feature `j` (0..8) of block `b` lives in [`TileBuf::q`].
#[inline(always)]
pub(super) fn tile_q_at(b: usize, j: usize, i: usize) -> usize {
    b * 256 + (i / 4) * 32 + j * 4 + i % 4
}

/// Where the scale of half `h` of block `b` of feature `j` lives in [`TileBuf::s`] and [`TileBuf::m`].
#[inline(always)]
pub(super) fn tile_s_at(b: usize, h: usize, j: usize) -> usize {
    (b * HALVES + h) * TILE + j
}

impl TileBuf {
    /// Unpack tile `t` (features `8t..8t + 8`; those past `rows` are zero) of a `rows x cols` matrix: the
    /// reference the SIMD levels' unpacking matches byte for byte.
    #[inline(always)]
    pub(super) fn unpack(&mut self, format: BlockFormat, raw: &[u8], rows: usize, cols: usize, t: usize) {
        let features = self.unpack_scales(format, raw, rows, cols, t);
        let blocks_per_block = format.elems() / QK;
        let mut q = [0i8; 256];
        for j in 0..features {
            for (sb, block) in feature_blocks(format, raw, cols, t * TILE + j).enumerate() {
                format.quants(block, &mut q);
                for k in 0..blocks_per_block {
                    let b = sb * blocks_per_block + k;
                    let src: &[i8; QK] = q[k * QK..(k + 1) * QK].try_into().expect("a block is 32 values");
                    let dst: &mut [i8; 256] = (&mut self.q[b * 256..(b + 1) * 256]).try_into().expect("256 bytes");
                    for chunk in 0..QK / 4 {
                        dst[chunk * 32 + j * 4..chunk * 32 + j * 4 + 4].copy_from_slice(&src[chunk * 4..chunk * 4 + 4]);
                    }
                }
            }
        }
    }

    /// The part of [`TileBuf::unpack`] every level shares: the buffer sized for tile `t` (zeroed where the tile is
    /// a matrix's last, partial one), and every feature's scales and minimums written. Returns the tile's number
    /// of features (at most [`TILE`]); the quants are left to the caller.
    #[inline(always)]
    pub(super) fn unpack_scales(
        &mut self,
        format: BlockFormat,
        raw: &[u8],
        rows: usize,
        cols: usize,
        t: usize,
    ) -> usize {
        let bpr = cols / QK;
        let blocks_per_block = format.elems() / QK;
        // Every entry of the features the matrix has is written; only a last, partial tile's padding features
        // need zeros (and only when the buffer is new or was last used for a full tile: zeroed always).
        self.q.resize(bpr * 256, 0);
        self.s.resize(bpr * HALVES * TILE, 0.0);
        self.m.resize(bpr * HALVES * TILE, 0.0);
        let features = TILE.min(rows.saturating_sub(t * TILE));
        if features < TILE {
            self.q.fill(0);
            self.s.fill(0.0);
            self.m.fill(0.0);
        }
        let (mut s, mut m) = ([0f32; 16], [0f32; 16]);
        for j in 0..features {
            for (sb, block) in feature_blocks(format, raw, cols, t * TILE + j).enumerate() {
                format.scales(block, &mut s, &mut m);
                for k in 0..blocks_per_block {
                    for h in 0..HALVES {
                        let at = tile_s_at(sb * blocks_per_block + k, h, j);
                        self.s[at] = s[k * HALVES + h];
                        self.m[at] = m[k * HALVES + h];
                    }
                }
            }
        }
        features
    }
}

/// Output feature `c`'s blocks (super-blocks for the K-quants) in a row-major matrix of `cols` values per row.
#[inline(always)]
pub(super) fn feature_blocks(
    format: BlockFormat,
    raw: &[u8],
    cols: usize,
    c: usize,
) -> std::slice::ChunksExact<'_, u8> {
    let per_row = cols / format.elems() * format.bytes();
    raw[c * per_row..(c + 1) * per_row].chunks_exact(format.bytes())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_inline_half_conversion_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let (ours, reference) = (super::f16_to_f32(h), half::f16::from_bits(h).to_f32());
            assert!(ours.to_bits() == reference.to_bits() || (ours.is_nan() && reference.is_nan()), "{h:#06x}");
        }
    }
}
