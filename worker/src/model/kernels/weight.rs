//! The weight formats the kernels read: GGUF Q4_1 and Q8_0 repacked into tiles of eight output features, the
//! other GGUF block formats as the file stores them (`blocks.rs` unpacks them), f16 and bf16, and plain f32.
//! Parsing checks every size before a byte is copied; nothing here computes a product.

use half::{bf16 as Bf16, f16};

use super::blocks::{BlockFormat, HALVES, f16_to_f32, k_scale_min};
use super::quant::Activations;
use super::{Input, QK};

/// A weight matrix of `rows` (output features) by `cols` (input features), stored row-major.
#[derive(Clone, Debug)]
pub enum Weight {
    /// GGUF Q4_1: per block of 32, `x = d * q + m` with 4-bit `q`. Stored in tiles of [`TILE`] output features
    /// (the last tile padded with zero features), block by block, so that one vector holds the same elements of
    /// eight features and a kernel's lanes are output features: no horizontal sums.
    Q4_1 {
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 32).
        cols: usize,
        /// Scales' f16 bits (the file's, widened exactly by the kernels), `[tile][block][feature in tile]`.
        d: Vec<u16>,
        /// Minimums' f16 bits, laid out as `d`.
        m: Vec<u16>,
        /// Packed nibbles, 128 bytes per tile and block, as four 32-byte chunks: bytes `4j..4j + 4` of chunk `k`
        /// are bytes `4k..4k + 4` of feature `j`'s GGUF block (low nibbles are elements `4k..4k + 4`, high nibbles
        /// elements `16 + 4k..16 + 4k + 4`).
        qs: Vec<u8>,
        /// Whether its products take 8-bit activations ([`Weight::set_activations`]).
        eight: bool,
    },
    /// GGUF Q8_0: per block of 32, `x = d * q` with 8-bit `q`. Tiled like Q4_1.
    Q8_0 {
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 32).
        cols: usize,
        /// Scales' f16 bits, `[tile][block][feature in tile]`.
        d: Vec<u16>,
        /// Quants, 256 per tile and block, as eight 32-byte chunks: bytes `4j..4j + 4` of chunk `k` are elements
        /// `4k..4k + 4` of feature `j`'s block.
        qs: Vec<i8>,
        /// Whether its products take 8-bit activations ([`Weight::set_activations`]).
        eight: bool,
    },
    /// GGUF Q4_K or Q5_K repacked for a kernel that reads it directly: per block of 32, `x = d * sc * q - dmin *
    /// mn` with 4-bit (5-bit) `q`, 6-bit `sc` and `mn`, and `d` and `dmin` per super-block of 256 (f16 in the file,
    /// exact in f32). The nibbles tiled as Q4_1's (low nibbles elements 0..16, high ones 16..32), Q5_K's fifth
    /// bits in a plane as [`Weight::Legacy`]'s, so the kernel unpacks nothing per step; 152 (184) bytes per 256
    /// values and feature where the file has 144 (176). Computes what [`Weight::Blocks`] computes for the same
    /// file, bit for bit.
    Q4K {
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 256).
        cols: usize,
        /// Super-block scales, `[tile][super-block][feature in tile]`.
        d: Vec<f32>,
        /// Super-block minimum scales, laid out as `d`.
        dmin: Vec<f32>,
        /// Block scales, `[tile][block][feature in tile]`.
        sc: Vec<u8>,
        /// Block minimums, laid out as `sc`.
        mn: Vec<u8>,
        /// Nibbles, laid out as Q4_1's `qs`.
        qs: Vec<u8>,
        /// Q5_K's fifth bits, laid out as [`Weight::Legacy`]'s `qh` (empty for Q4_K).
        qh: Vec<u8>,
        /// Whether its products take 8-bit activations ([`Weight::set_activations`]; Q4_K only).
        eight: bool,
    },
    /// GGUF Q6_K repacked for a kernel that reads it directly: `x = d * sc * (q - 32)` with 6-bit `q`, an 8-bit
    /// signed `sc` per 16 values and `d` per super-block of 256 (f16 in the file, exact in f32). Each value's low
    /// four bits tiled as Q4_1's nibbles; its high two in a plane shared by two blocks, byte for byte where the
    /// nibbles are (bits 0-1 and 2-3 the first block's low and high nibble's values, 4-5 and 6-7 the second's).
    /// 212 bytes per 256 values and feature where the file has 210. Computes what [`Weight::Blocks`] computes for
    /// the same file, bit for bit.
    Q6K {
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 256).
        cols: usize,
        /// Super-block scales, `[tile][super-block][feature in tile]`.
        d: Vec<f32>,
        /// Scales per 16 values, `[tile][block][half][feature in tile]`.
        sc: Vec<i8>,
        /// Low four bits, laid out as Q4_1's `qs`.
        ql: Vec<u8>,
        /// High two bits, laid out as Q4_1's `qs` for half as many blocks (block `b` in entry `b / 2`).
        qh: Vec<u8>,
        /// Whether its products take 8-bit activations ([`Weight::set_activations`]).
        eight: bool,
    },
    /// GGUF Q4_0, Q5_0 and Q5_1 (llama.cpp's "legacy" 32-value blocks) repacked for a kernel that reads them
    /// directly: `x = d * (q - offset) + m` (offset 8, 16 and 0; `m` only in Q5_1). The nibbles tiled as Q4_1's
    /// (the files' own convention: low nibbles elements 0..16, high ones 16..32); the fifth bits in a plane shared
    /// by four blocks, byte for byte where the nibbles are (bits `2 * (b % 4)` and `2 * (b % 4) + 1` block `b`'s
    /// low and high nibble's); `d` and `m` kept as the file's f16. As many bytes as the file. Computes what
    /// [`Weight::Blocks`] computes for the same file, bit for bit.
    Legacy {
        /// Q4_0, Q5_0 or Q5_1.
        format: BlockFormat,
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 32).
        cols: usize,
        /// Scales' f16 bits, `[tile][block][feature in tile]`.
        d: Vec<u16>,
        /// Minimums' f16 bits (Q5_1; empty otherwise), laid out as `d`.
        m: Vec<u16>,
        /// Nibbles, laid out as Q4_1's `qs`.
        qs: Vec<u8>,
        /// Fifth bits (Q5_0 and Q5_1; empty for Q4_0), laid out as Q4_1's `qs` for a quarter as many blocks
        /// (rounded up): block `b` in entry `b / 4`.
        qh: Vec<u8>,
        /// Whether its products take 8-bit activations ([`Weight::set_activations`]).
        eight: bool,
    },
    /// A GGUF block format ([`BlockFormat`]) kept as the file stores it: row-major blocks, unpacked one tile at
    /// a time by the kernels.
    Blocks {
        /// The block format.
        format: BlockFormat,
        /// Output features.
        rows: usize,
        /// Input features (a multiple of the format's block).
        cols: usize,
        /// The file's blocks, row after row.
        raw: Vec<u8>,
    },
    /// 16-bit floats (IEEE half or bfloat16), row-major; widened to f32 a weight row at a time.
    Half {
        /// bfloat16 (true) or IEEE half (false).
        bf16: bool,
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// Row-major values' bits.
        w: Vec<u16>,
    },
    /// Plain f32.
    F32 {
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// Row-major values.
        w: Vec<f32>,
    },
}

/// A weight's bytes do not match its declared shape.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{format} weight of {rows}x{cols}: {problem}")]
pub struct WeightError {
    format: &'static str,
    rows: usize,
    cols: usize,
    problem: String,
}

pub(super) use super::TILE;

/// Where GGUF byte `i` (0..16) of feature `c`'s block `b` lives in the tiled Q4_1 layout.
#[inline(always)]
pub(super) fn q4_1_byte(blocks_per_row: usize, c: usize, b: usize, i: usize) -> usize {
    ((c / TILE) * blocks_per_row + b) * 128 + (i / 4) * 32 + (c % TILE) * 4 + i % 4
}

/// Where element `i` (0..32) of feature `c`'s block `b` lives in the tiled Q8_0 layout.
#[inline(always)]
pub(super) fn q8_0_at(blocks_per_row: usize, c: usize, b: usize, i: usize) -> usize {
    ((c / TILE) * blocks_per_row + b) * 256 + (i / 4) * 32 + (c % TILE) * 4 + i % 4
}

/// Where the scale (and Q4_1's minimum) of feature `c`'s block `b` live in the tiled layouts.
#[inline(always)]
pub(super) fn tile_scale(blocks_per_row: usize, c: usize, b: usize) -> usize {
    ((c / TILE) * blocks_per_row + b) * TILE + c % TILE
}

/// The f16 bits at `at`.
fn half_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(half_at(bytes, at))
}

/// Check that `raw` holds exactly the `rows x cols` blocks of a block format of `block_bytes` bytes per 32
/// values; returns the number of blocks.
fn check_blocks(
    format: &'static str,
    rows: usize,
    cols: usize,
    raw: &[u8],
    block_bytes: usize,
) -> Result<usize, WeightError> {
    let err = |problem: String| WeightError { format, rows, cols, problem };
    if !cols.is_multiple_of(QK) {
        return Err(err("input features are not a multiple of 32".into()));
    }
    let blocks = rows * cols / QK;
    if raw.len() != blocks * block_bytes {
        return Err(err(format!("{} bytes, expected {}", raw.len(), blocks * block_bytes)));
    }
    Ok(blocks)
}

/// The fifth bits of elements `e` and `16 + e` (0..16) of feature `c`'s block `b` into a fifth-bit plane
/// ([`Weight::Legacy`]'s `qh`): bits `2 * (b % 4)` and `2 * (b % 4) + 1` of the byte at the nibbles' position.
fn set_fifth_bits(qh: &mut [u8], bpr: usize, c: usize, b: usize, e: usize, (low, high): (u8, u8)) {
    qh[q4_1_byte(bpr.div_ceil(4), c, b / 4, e)] |= (low | (high << 1)) << (2 * (b % 4));
}

/// The fifth bit of element `i` (0..32) of feature `c`'s block `b` in a fifth-bit plane.
#[inline(always)]
fn fifth_bit(qh: &[u8], bpr: usize, c: usize, b: usize, i: usize) -> u8 {
    (qh[q4_1_byte(bpr.div_ceil(4), c, b / 4, i % 16)] >> (2 * (b % 4) + i / 16)) & 1
}

/// Check that `raw` holds exactly the `rows x cols` blocks of `format`.
fn check_super_blocks(format: BlockFormat, rows: usize, cols: usize, raw: &[u8]) -> Result<(), WeightError> {
    let err = |problem: String| WeightError { format: format.name(), rows, cols, problem };
    if !cols.is_multiple_of(format.elems()) {
        return Err(err(format!("input features are not a multiple of {}", format.elems())));
    }
    let expected = rows * cols / format.elems() * format.bytes();
    if raw.len() != expected {
        return Err(err(format!("{} bytes, expected {expected}", raw.len())));
    }
    Ok(())
}

impl Weight {
    /// Parse raw GGUF Q4_1 blocks (20 bytes each: f16 d, f16 m, 16 bytes of nibbles).
    pub fn from_q4_1(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        check_blocks("Q4_1", rows, cols, raw, 20)?;
        let (bpr, tiles) = (cols / QK, rows.div_ceil(TILE));
        let mut d = vec![0u16; tiles * bpr * TILE];
        let mut m = vec![0u16; tiles * bpr * TILE];
        let mut qs = vec![0u8; tiles * bpr * 128];
        for (i, block) in raw.chunks_exact(20).enumerate() {
            let (c, b) = (i / bpr, i % bpr);
            d[tile_scale(bpr, c, b)] = half_at(block, 0);
            m[tile_scale(bpr, c, b)] = half_at(block, 2);
            for (k, four) in block[4..20].chunks_exact(4).enumerate() {
                let at = q4_1_byte(bpr, c, b, 4 * k);
                qs[at..at + 4].copy_from_slice(four);
            }
        }
        Ok(Weight::Q4_1 { rows, cols, d, m, qs, eight: false })
    }

    /// Parse raw GGUF Q8_0 blocks (34 bytes each: f16 d, 32 signed bytes).
    pub fn from_q8_0(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        check_blocks("Q8_0", rows, cols, raw, 34)?;
        let (bpr, tiles) = (cols / QK, rows.div_ceil(TILE));
        let mut d = vec![0u16; tiles * bpr * TILE];
        let mut qs = vec![0i8; tiles * bpr * 256];
        for (i, block) in raw.chunks_exact(34).enumerate() {
            let (c, b) = (i / bpr, i % bpr);
            d[tile_scale(bpr, c, b)] = half_at(block, 0);
            for (e, &q) in block[2..34].iter().enumerate() {
                qs[q8_0_at(bpr, c, b, e)] = q as i8;
            }
        }
        Ok(Weight::Q8_0 { rows, cols, d, qs, eight: false })
    }

    /// Parse raw GGUF Q4_K super-blocks (144 bytes each: f16 d and dmin, 12 bytes of packed 6-bit scales and
    /// minimums, 128 bytes of nibbles) into [`Weight::Q4K`].
    pub fn from_q4_k(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        Weight::from_k_min(BlockFormat::Q4K, rows, cols, raw)
    }

    /// Parse raw GGUF Q5_K super-blocks (176 bytes each: Q4_K's and 32 bytes of fifth bits) into [`Weight::Q4K`].
    pub fn from_q5_k(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        Weight::from_k_min(BlockFormat::Q5K, rows, cols, raw)
    }

    fn from_k_min(format: BlockFormat, rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        check_super_blocks(format, rows, cols, raw)?;
        let high = format == BlockFormat::Q5K;
        let (bpr, tiles) = (cols / QK, rows.div_ceil(TILE));
        let mut d = vec![0f32; tiles * bpr / 8 * TILE];
        let mut dmin = vec![0f32; d.len()];
        let mut sc = vec![0u8; tiles * bpr * TILE];
        let mut mn = vec![0u8; sc.len()];
        let mut qs = vec![0u8; tiles * bpr * 128];
        let mut qh = vec![0u8; if high { tiles * bpr.div_ceil(4) * 128 } else { 0 }];
        let mut q = [0i8; 256];
        for (i, block) in raw.chunks_exact(format.bytes()).enumerate() {
            let (c, sb) = (i / (bpr / 8), i % (bpr / 8));
            d[tile_scale(bpr / 8, c, sb)] = f16_at(block, 0);
            dmin[tile_scale(bpr / 8, c, sb)] = f16_at(block, 2);
            format.quants(block, &mut q);
            for k in 0..8 {
                let b = sb * 8 + k;
                (sc[tile_scale(bpr, c, b)], mn[tile_scale(bpr, c, b)]) = k_scale_min(&block[4..16], k);
                let u = |e: usize| q[k * QK + e] as u8;
                for e in 0..16 {
                    qs[q4_1_byte(bpr, c, b, e)] = (u(e) & 0x0f) | ((u(e + 16) & 0x0f) << 4);
                    if high {
                        set_fifth_bits(&mut qh, bpr, c, b, e, (u(e) >> 4, u(e + 16) >> 4));
                    }
                }
            }
        }
        Ok(Weight::Q4K { rows, cols, d, dmin, sc, mn, qs, qh, eight: false })
    }

    /// Parse raw GGUF Q6_K super-blocks (210 bytes each: 128 bytes of low nibbles, 64 of high bit pairs, 16
    /// signed scales, f16 d) into [`Weight::Q6K`].
    pub fn from_q6_k(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        let format = BlockFormat::Q6K;
        check_super_blocks(format, rows, cols, raw)?;
        let (bpr, tiles) = (cols / QK, rows.div_ceil(TILE));
        let mut d = vec![0f32; tiles * bpr / 8 * TILE];
        let mut sc = vec![0i8; tiles * bpr * HALVES * TILE];
        let mut ql = vec![0u8; tiles * bpr * 128];
        let mut qh = vec![0u8; tiles * bpr / 2 * 128];
        let mut q = [0i8; 256];
        for (i, block) in raw.chunks_exact(format.bytes()).enumerate() {
            let (c, sb) = (i / (bpr / 8), i % (bpr / 8));
            d[tile_scale(bpr / 8, c, sb)] = f16_at(block, 208);
            format.quants(block, &mut q);
            for k in 0..8 {
                let b = sb * 8 + k;
                for h in 0..HALVES {
                    sc[tile_scale(bpr * HALVES, c, b * HALVES + h)] = block[192 + k * HALVES + h] as i8;
                }
                let u = |e: usize| (q[k * QK + e] + 32) as u8;
                for e in 0..16 {
                    ql[q4_1_byte(bpr, c, b, e)] = (u(e) & 0x0f) | ((u(e + 16) & 0x0f) << 4);
                    qh[q4_1_byte(bpr / 2, c, b / 2, e)] |= ((u(e) >> 4) | ((u(e + 16) >> 4) << 2)) << (4 * (b % 2));
                }
            }
        }
        Ok(Weight::Q6K { rows, cols, d, sc, ql, qh, eight: false })
    }

    /// Parse raw GGUF Q4_0, Q5_0 or Q5_1 blocks into [`Weight::Legacy`] (any other format: the blocks as they are).
    pub fn from_legacy(format: BlockFormat, rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        let (high, min) = match format {
            BlockFormat::Q4_0 => (false, false),
            BlockFormat::Q5_0 => (true, false),
            BlockFormat::Q5_1 => (true, true),
            _ => return Weight::from_blocks(format, rows, cols, raw.to_vec()),
        };
        check_super_blocks(format, rows, cols, raw)?;
        let (bpr, tiles) = (cols / QK, rows.div_ceil(TILE));
        let mut d = vec![0u16; tiles * bpr * TILE];
        let mut m = vec![0u16; if min { d.len() } else { 0 }];
        let mut qs = vec![0u8; tiles * bpr * 128];
        let mut qh = vec![0u8; if high { tiles * bpr.div_ceil(4) * 128 } else { 0 }];
        let half = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        for (i, block) in raw.chunks_exact(format.bytes()).enumerate() {
            let (c, b) = (i / bpr, i % bpr);
            d[tile_scale(bpr, c, b)] = half(block, 0);
            if min {
                m[tile_scale(bpr, c, b)] = half(block, 2);
            }
            let (bits, nibbles) = match format {
                BlockFormat::Q4_0 => (0, &block[2..18]),
                BlockFormat::Q5_0 => (u32::from_le_bytes([block[2], block[3], block[4], block[5]]), &block[6..22]),
                _ => (u32::from_le_bytes([block[4], block[5], block[6], block[7]]), &block[8..24]),
            };
            for (e, &byte) in nibbles.iter().enumerate() {
                qs[q4_1_byte(bpr, c, b, e)] = byte;
                if high {
                    set_fifth_bits(&mut qh, bpr, c, b, e, (((bits >> e) & 1) as u8, ((bits >> (e + 16)) & 1) as u8));
                }
            }
        }
        Ok(Weight::Legacy { format, rows, cols, d, m, qs, qh, eight: false })
    }

    /// Keep raw GGUF blocks of `format` (checked against the shape).
    pub fn from_blocks(format: BlockFormat, rows: usize, cols: usize, raw: Vec<u8>) -> Result<Weight, WeightError> {
        check_super_blocks(format, rows, cols, &raw)?;
        Ok(Weight::Blocks { format, rows, cols, raw })
    }

    /// Wrap 16-bit float bits: bfloat16 when `bf16`, IEEE half otherwise.
    pub fn from_half(bf16: bool, rows: usize, cols: usize, w: Vec<u16>) -> Result<Weight, WeightError> {
        if w.len() != rows * cols {
            let format = if bf16 { "BF16" } else { "F16" };
            return Err(WeightError { format, rows, cols, problem: format!("{} values", w.len()) });
        }
        Ok(Weight::Half { bf16, rows, cols, w })
    }

    /// Wrap f32 values.
    pub fn from_f32(rows: usize, cols: usize, w: Vec<f32>) -> Result<Weight, WeightError> {
        if w.len() != rows * cols {
            return Err(WeightError { format: "F32", rows, cols, problem: format!("{} values", w.len()) });
        }
        Ok(Weight::F32 { rows, cols, w })
    }

    /// The width of the activations this weight's products take (16 bits unless [`Weight::set_activations`]).
    pub fn activations(&self) -> Activations {
        match self {
            Weight::Q4_1 { eight: true, .. }
            | Weight::Q8_0 { eight: true, .. }
            | Weight::Q4K { eight: true, .. }
            | Weight::Q6K { eight: true, .. }
            | Weight::Legacy { eight: true, .. } => Activations::Eight,
            _ => Activations::Sixteen,
        }
    }

    /// Take activations of `width` where the format has kernels for 8-bit ones (the repacked formats but Q5_K,
    /// whose products take four bytes a lane with AVX-512 VNNI: `x86/int8.rs`); other formats keep 16 bits.
    /// Returns whether this one takes `width`.
    pub fn set_activations(&mut self, width: Activations) -> bool {
        match self {
            Weight::Q4K { qh, .. } if !qh.is_empty() => return width == Activations::Sixteen,
            Weight::Q4_1 { eight, .. }
            | Weight::Q8_0 { eight, .. }
            | Weight::Q4K { eight, .. }
            | Weight::Q6K { eight, .. }
            | Weight::Legacy { eight, .. } => *eight = width == Activations::Eight,
            _ => return width == Activations::Sixteen,
        }
        true
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        match self {
            Weight::Q4_1 { rows, .. }
            | Weight::Q8_0 { rows, .. }
            | Weight::Q4K { rows, .. }
            | Weight::Q6K { rows, .. }
            | Weight::Legacy { rows, .. }
            | Weight::Blocks { rows, .. }
            | Weight::Half { rows, .. }
            | Weight::F32 { rows, .. } => *rows,
        }
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        match self {
            Weight::Q4_1 { cols, .. }
            | Weight::Q8_0 { cols, .. }
            | Weight::Q4K { cols, .. }
            | Weight::Q6K { cols, .. }
            | Weight::Legacy { cols, .. }
            | Weight::Blocks { cols, .. }
            | Weight::Half { cols, .. }
            | Weight::F32 { cols, .. } => *cols,
        }
    }

    /// Row `r` as f32 (an embedding lookup).
    pub fn row(&self, r: usize, out: &mut [f32]) {
        match self {
            Weight::Q4_1 { cols, d, m, qs, .. } => {
                let bpr = cols / QK;
                for b in 0..bpr {
                    let at = tile_scale(bpr, r, b);
                    let (scale, min) = (f16_to_f32(d[at]), f16_to_f32(m[at]));
                    for j in 0..16 {
                        let q = qs[q4_1_byte(bpr, r, b, j)];
                        out[b * QK + j] = scale * f32::from(q & 0x0f) + min;
                        out[b * QK + j + 16] = scale * f32::from(q >> 4) + min;
                    }
                }
            }
            Weight::Q8_0 { cols, d, qs, .. } => {
                let bpr = cols / QK;
                for b in 0..bpr {
                    let scale = f16_to_f32(d[tile_scale(bpr, r, b)]);
                    for j in 0..QK {
                        out[b * QK + j] = scale * f32::from(qs[q8_0_at(bpr, r, b, j)]);
                    }
                }
            }
            Weight::Q4K { cols, d, dmin, sc, mn, .. } => {
                // `BlockFormat::row`'s arithmetic: `s * q + m`, with `s = d * sc` and `m = -(dmin * mn)`.
                let bpr = cols / QK;
                for b in 0..bpr {
                    let (at, sb) = (tile_scale(bpr, r, b), tile_scale(bpr / 8, r, b / 8));
                    let s = d[sb] * f32::from(sc[at]);
                    let m = -(dmin[sb] * f32::from(mn[at]));
                    for (i, o) in out[b * QK..(b + 1) * QK].iter_mut().enumerate() {
                        *o = s * f32::from(self.k_min_at(r, b, i)) + m;
                    }
                }
            }
            Weight::Q6K { cols, .. } => {
                let bpr = cols / QK;
                for b in 0..bpr {
                    for (i, o) in out[b * QK..(b + 1) * QK].iter_mut().enumerate() {
                        let (s, q) = self.q6_k_at(r, b, i);
                        *o = s * f32::from(q) + 0.0;
                    }
                }
            }
            Weight::Legacy { cols, .. } => {
                for b in 0..cols / QK {
                    for (i, o) in out[b * QK..(b + 1) * QK].iter_mut().enumerate() {
                        let (s, q, m) = self.legacy_at(r, b, i);
                        *o = s * f32::from(q) + m;
                    }
                }
            }
            Weight::Blocks { format, cols, raw, .. } => format.row(raw, *cols, r, out),
            Weight::Half { bf16, cols, w, .. } => widen_half(*bf16, &w[r * cols..(r + 1) * cols], out),
            Weight::F32 { cols, w, .. } => out.copy_from_slice(&w[r * cols..(r + 1) * cols]),
        }
    }

    /// The format's name, as GGUF tools write it.
    pub fn format_name(&self) -> &'static str {
        match self {
            Weight::Q4_1 { .. } => "Q4_1",
            Weight::Q8_0 { .. } => "Q8_0",
            Weight::Q4K { qh, .. } => ["Q5_K", "Q4_K"][usize::from(qh.is_empty())],
            Weight::Q6K { .. } => "Q6_K",
            Weight::Legacy { format, .. } => format.name(),
            Weight::Blocks { format, .. } => format.name(),
            Weight::Half { bf16: true, .. } => "BF16",
            Weight::Half { bf16: false, .. } => "F16",
            Weight::F32 { .. } => "F32",
        }
    }

    /// Bytes the weight holds in memory.
    pub fn memory_bytes(&self) -> usize {
        match self {
            Weight::Q4_1 { d, m, qs, .. } => 2 * (d.len() + m.len()) + qs.len(),
            Weight::Q8_0 { d, qs, .. } => 2 * d.len() + qs.len(),
            Weight::Q4K { d, dmin, sc, mn, qs, qh, .. } => {
                4 * (d.len() + dmin.len()) + sc.len() + mn.len() + qs.len() + qh.len()
            }
            Weight::Q6K { d, sc, ql, qh, .. } => 4 * d.len() + sc.len() + ql.len() + qh.len(),
            Weight::Legacy { d, m, qs, qh, .. } => 2 * (d.len() + m.len()) + qs.len() + qh.len(),
            Weight::Blocks { raw, .. } => raw.len(),
            Weight::Half { w, .. } => 2 * w.len(),
            Weight::F32 { w, .. } => 4 * w.len(),
        }
    }

    /// Element `i` (0..32) of feature `c`'s block `b` of a [`Weight::Q4K`]: its 4- or 5-bit integer.
    #[inline(always)]
    pub(super) fn k_min_at(&self, c: usize, b: usize, i: usize) -> u8 {
        let Weight::Q4K { cols, qs, qh, .. } = self else { unreachable!("Q4_K and Q5_K only") };
        let bpr = cols / QK;
        let low = (qs[q4_1_byte(bpr, c, b, i % 16)] >> (4 * (i / 16))) & 0x0f;
        low | if qh.is_empty() { 0 } else { fifth_bit(qh, bpr, c, b, i) << 4 }
    }

    /// Element `i` (0..32) of feature `c`'s block `b` of a [`Weight::Q6K`]: its scale `d * sc` and its signed
    /// 6-bit integer. The reference kernel and [`Weight::row`] read values through it.
    #[inline(always)]
    pub(super) fn q6_k_at(&self, c: usize, b: usize, i: usize) -> (f32, i8) {
        let Weight::Q6K { cols, d, sc, ql, qh, .. } = self else { unreachable!("Q6_K only") };
        let bpr = cols / QK;
        let (e, h) = (i % 16, i / 16);
        let low = (ql[q4_1_byte(bpr, c, b, e)] >> (4 * h)) & 0x0f;
        let high = (qh[q4_1_byte(bpr / 2, c, b / 2, e)] >> (4 * (b % 2) + 2 * h)) & 3;
        let s = d[tile_scale(bpr / 8, c, b / 8)] * f32::from(sc[tile_scale(bpr * HALVES, c, b * HALVES + h)]);
        (s, (low | (high << 4)) as i8 - 32)
    }

    /// Element `i` (0..32) of feature `c`'s block `b` of a [`Weight::Legacy`]: its scale, its integer (offset
    /// applied) and its block's minimum (zero but in Q5_1). The reference kernel and [`Weight::row`] read values
    /// through it.
    #[inline(always)]
    pub(super) fn legacy_at(&self, c: usize, b: usize, i: usize) -> (f32, i8, f32) {
        let Weight::Legacy { format, cols, d, m, qs, qh, .. } = self else { unreachable!("legacy formats only") };
        let bpr = cols / QK;
        let (e, h) = (i % 16, i / 16);
        let low = (qs[q4_1_byte(bpr, c, b, e)] >> (4 * h)) & 0x0f;
        let high = if qh.is_empty() { 0 } else { fifth_bit(qh, bpr, c, b, i) };
        let offset = format.offset();
        let at = tile_scale(bpr, c, b);
        let min = if m.is_empty() { 0.0 } else { f16_to_f32(m[at]) };
        (f16_to_f32(d[at]), (low | (high << 4)) as i8 - offset, min)
    }

    /// `out[r * rows + c] = x[r * cols ..] · W[c]` for `n` rows of `x`.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) {
        Input::new(x, n).matmul(vec![(self, out)]);
    }
}

/// 16-bit float bits widened to f32 (exact).
#[inline(always)]
pub(super) fn widen_half(bf16: bool, bits: &[u16], out: &mut [f32]) {
    if bf16 {
        for (o, &b) in out.iter_mut().zip(bits) {
            *o = Bf16::from_bits(b).to_f32();
        }
    } else {
        // The slice conversion uses F16C where the CPU has it (one detection per slice, not per value).
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        let halves: &[f16] = bits.reinterpret_cast();
        halves.convert_to_f32_slice(&mut out[..bits.len()]);
    }
}
