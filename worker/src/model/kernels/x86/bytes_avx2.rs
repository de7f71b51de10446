//! AVX2's byte products at one sequence for the legacy formats (Q4_0, Q5_0, Q5_1; what llama.cpp's "Q4_K_M" and
//! "Q5_K_M" files hold where rows are not a multiple of 256 wide): `bytes.rs`' split of the activations' 16-bit
//! quants into bytes (`q = 256 * hi + lo`, `QuantizedRows::byte_planes`) with AVX2's `vpmaddubsw`, which multiplies
//! an unsigned byte by a signed one and sums each adjacent pair into a saturating 16-bit lane. The weights go in
//! as their unsigned bytes `u` (the nibbles and the fifth bits joined, below 32), without the format's offset, so
//! `vpmaddubsw` takes them as they are: the high bytes (signed) times `u` (unsigned), and the low bytes (unsigned)
//! times `u` (signed, non-negative). No lane can saturate: a pair of high-byte products is at most `2 * 31 * 128`
//! in magnitude, four chunks' sums at most 31,744; a pair of low-byte products at most `2 * 255 * 31`, two chunks'
//! sums at most 31,620. Per 16-value half, `256 * (u · hi) + (u · lo)` widened to i32 (`vpmaddwd`), less the
//! offset times the half's activation sum (`QuantizedRows::isums`), is the exact integer `tiles.rs`' `legacy_tile`
//! sums; the scales then go on by the same operations in the same order: the same bits (the bit-for-bit tests run
//! the AVX2 level at one row).
//!
//! At one row the 16-bit kernel spends about 13 vector instructions (other than loads) per chunk of 32 weights:
//! the nibbles and fifth bits joined, the offset taken off, two shuffles and two shifts to widen them to 16-bit
//! pairs, two pair products and two additions. This one spends about 9 and a share of each half's widening.

use std::arch::x86_64::*;

use super::super::QK;
use super::super::blocks::{BlockFormat, HALVES};
use super::super::quant::QuantizedRows;
use super::super::weight::{TILE, Weight};
use super::simd::{
    broadcast4, half_nibbles, load8h, load32u, prefetch_legacy, row_blocks, rows_bytes, tile, tile_row_groups,
};

/// Batch rows up to which [`columns`] serves the legacy formats. Past one row the 16-bit kernel shares each chunk's
/// widening among the rows, where this one's products per row stay twice its.
pub(super) const MAX_ROWS: usize = 1;

/// Whether [`columns`] serves `weight` for `rows` batch rows.
pub(super) fn serves(weight: &Weight, rows: usize) -> bool {
    matches!(weight, Weight::Legacy { .. }) && rows <= MAX_ROWS
}

/// The byte-product kernel: for each tile of eight output features, every batch row (up to [`MAX_ROWS`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn columns(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    let Weight::Legacy { format, .. } = weight else { unreachable!("legacy formats only") };
    // The fifth bits and the minimum as constants: each format's loop without their branches.
    match format {
        BlockFormat::Q4_0 => sweep::<false, false>(weight, xq, c0, out),
        BlockFormat::Q5_0 => sweep::<true, false>(weight, xq, c0, out),
        _ => sweep::<true, true>(weight, xq, c0, out),
    }
}

/// [`columns`] for one format: a function of its own, so that its loop gets the registers to itself (as the tile
/// kernels' `sweep`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
fn sweep<const HIGH: bool, const MIN: bool>(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    let planes = xq.byte_planes();
    for t in c0 / TILE..(c0 + out[0].len()).div_ceil(TILE) {
        tile_row_groups(out, c0, t, |rows, r, acc| {
            assert!(rows <= MAX_ROWS, "{rows} rows");
            acc[0] = legacy_tile::<HIGH, MIN>(weight, xq, planes, t, r);
        });
    }
}

/// Bytes `n` (values below 16) with bit 4 taken from bit `h` (0 or 1) of the plane's bytes at the same positions.
/// The 16-bit shift carries bits between a lane's two bytes only into bits the mask drops: each byte's bit 4
/// comes from its own bit `h`.
#[target_feature(enable = "avx2")]
#[inline]
fn fifth_bit_at(n: __m256i, plane: __m256i, h: usize) -> __m256i {
    let at4 = if h == 0 { _mm256_slli_epi16::<4>(plane) } else { _mm256_slli_epi16::<3>(plane) };
    _mm256_or_si256(n, _mm256_and_si256(at4, _mm256_set1_epi8(0x10)))
}

/// `tiles.rs`' `legacy_tile` for one batch row `r` with byte products: per half, each chunk's unsigned weight bytes
/// times the row's high and low bytes, summed in 16-bit lanes, widened and joined, less the offset's share; then
/// `legacy_tile`'s scales (and Q5_1's minimum term), in its order.
#[target_feature(enable = "avx2,fma,f16c")]
fn legacy_tile<const HIGH: bool, const MIN: bool>(
    weight: &Weight,
    xq: &QuantizedRows,
    planes: &[u8],
    t: usize,
    r: usize,
) -> __m256 {
    let Weight::Legacy { format, cols, d, m, qs, qh, .. } = weight else { unreachable!("legacy formats only") };
    let bpr = cols / QK;
    assert_eq!((HIGH, MIN), (!qh.is_empty(), !m.is_empty()), "{format:?}'s planes");
    let offset = i32::from(format.offset());
    let (ones, shift8) = (_mm256_set1_epi16(1), _mm256_set1_epi16(256));
    let mut acc = _mm256_setzero_ps();
    let qs = tile(qs, t, bpr * 128);
    let qh = if HIGH { tile(qh, t, bpr.div_ceil(4) * 128) } else { &[] };
    let d = tile(d, t, bpr * TILE);
    let m = if MIN { tile(m, t, bpr * TILE) } else { &[] };
    let (xs, stride) = row_blocks::<1>(xq, r);
    let isums = &xq.isums[r * bpr * HALVES..(r + 1) * bpr * HALVES];
    for (b, q) in qs.chunks_exact(128).enumerate() {
        prefetch_legacy(b, q, d, qh, m);
        let [(xl, xh)] = rows_bytes::<1>(planes, bpr, r, b);
        let dv = load8h(&d[b * TILE..]);
        let xd = _mm256_set1_ps(xs[b * stride].d);
        // Both halves' sums, chunk by chunk: each chunk's nibbles and fifth bits are loaded once, the plane moved
        // once to this block's bits (the halves' fifth bits then at bits 0 and 1).
        let shift = _mm_cvtsi32_si128((2 * (b % 4)) as i32);
        let mut hi = [_mm256_setzero_si256(); HALVES];
        let mut lo = [[_mm256_setzero_si256(); 2]; HALVES];
        for k in 0..4 {
            let v = load32u(&q[k * 32..]);
            let plane = if HIGH { _mm256_srl_epi16(load32u(&qh[b / 4 * 128 + k * 32..]), shift) } else { v };
            for h in 0..HALVES {
                // Chunk k of half h: elements 16h + 4k.. of each feature, as unsigned bytes.
                let n = half_nibbles(v, h);
                let u = if HIGH { fifth_bit_at(n, plane, h) } else { n };
                let at = 16 * h + 4 * k;
                hi[h] = _mm256_add_epi16(hi[h], _mm256_maddubs_epi16(u, broadcast4(xh, at)));
                lo[h][k / 2] = _mm256_add_epi16(lo[h][k / 2], _mm256_maddubs_epi16(broadcast4(xl, at), u));
            }
        }
        for h in 0..HALVES {
            let isum = isums[b * HALVES + h];
            let low = _mm256_add_epi32(_mm256_madd_epi16(lo[h][0], ones), _mm256_madd_epi16(lo[h][1], ones));
            let s32 = _mm256_add_epi32(_mm256_madd_epi16(hi[h], shift8), low);
            let s32 = _mm256_sub_epi32(s32, _mm256_set1_epi32(offset * isum));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(dv, xd), acc);
            if MIN {
                let xsum = _mm256_set1_ps(isum as f32);
                acc = _mm256_fmadd_ps(xsum, _mm256_mul_ps(load8h(&m[b * TILE..]), xd), acc);
            }
        }
    }
    acc
}
