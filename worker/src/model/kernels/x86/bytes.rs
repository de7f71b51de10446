//! AVX-512 VNNI's byte products for the few batch rows of decode (Q4_1 and Q8_0, up to [`MAX_ROWS`] rows): the
//! activations' 16-bit quants split into their bytes (`q = 256 * hi + lo`, `QuantizedRows::byte_planes`, as the
//! tile unit takes them), so each `vpdpbusd` sums four byte products per lane where `vpdpwssd` sums two 16-bit
//! ones, and the weights go in as bytes: Q4_1's nibbles masked in place, Q8_0's bytes as they are, where the 16-bit
//! kernels (`tiles.rs`) shuffle every chunk into 16-bit pairs first. `vpdpbusd` multiplies an unsigned byte by a
//! signed one: the low bytes (unsigned) times the weights (signed), the weights times the high bytes (signed) with
//! the weights unsigned (Q4_1's nibbles are; Q8_0's are taken as `w + 128`, and `128 * sum(hi)` taken off again:
//! `QuantizedRows::high_sums`). Each block's sum `256 * (w · hi) + (w · lo)` is the exact integer the 16-bit
//! kernels sum, and the scales are then applied by the same operations in the same order: the same bits (the
//! bit-for-bit tests run this level at one and two rows).
//!
//! At one sequence the 16-bit kernel waited on its weight loads (keeping the scales as f16, a seventh fewer bytes
//! read, left one-sequence decode where it was; hinting the weights ahead, `simd.rs`'s `prefetch`, gave 1.5x) and
//! on its instructions: at one row this kernel spends 7 (Q4_1) and 3 (Q8_0) vector instructions (other than loads)
//! per 32 weight bytes where the 16-bit one spends 12 and 7.

use std::arch::x86_64::*;

use super::super::QK;
use super::super::quant::QuantizedRows;
use super::super::weight::{TILE, Weight};
use super::simd::{broadcast4, load8h, load32, load32u, prefetch, row_blocks, rows_bytes, tile, tile_row_groups};

/// Batch rows up to which the byte products serve Q8_0 (one row for Q4_1). Each row's products take twice the
/// activation loads of the 16-bit kernel's (high and low bytes), which share each chunk's widening among the rows:
/// `zl-worker bench` measured 1.05x (Q4_1) and 1.10x (Q8_0) at one sequence, 1.07x (Q8_0) and 0.94x (Q4_1) at
/// two, 0.83-0.91x at three; with the weights hinted ahead, Q4_1 at two and three rows 0.98-1.03x (left out: no
/// gain), Q8_0 at three 0.91-0.96x.
pub(super) const MAX_ROWS: usize = 2;

/// Whether [`columns`] serves `weight` for `rows` batch rows.
pub(super) fn serves(weight: &Weight, rows: usize) -> bool {
    match weight {
        Weight::Q4_1 { .. } => rows == 1,
        Weight::Q8_0 { .. } => rows <= MAX_ROWS,
        _ => false,
    }
}

/// Whether `weight`'s quants are signed (their products with the high bytes then need `QuantizedRows::high_sums`).
pub(super) fn signed(weight: &Weight) -> bool {
    matches!(weight, Weight::Q8_0 { .. })
}

/// The byte-product kernel: for each tile of eight output features, every batch row (up to [`MAX_ROWS`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn columns(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    let planes = (xq.byte_planes(), if signed(weight) { xq.high_sums() } else { &[] });
    for t in c0 / TILE..(c0 + out[0].len()).div_ceil(TILE) {
        tile_row_groups(out, c0, t, |rows, r, acc| match rows {
            1 => tile_rows::<1>(weight, xq, planes, t, r, acc),
            _ => tile_rows::<MAX_ROWS>(weight, xq, planes, t, r, acc),
        });
    }
}

/// The activations' byte planes and high-byte sums.
type Planes<'a> = (&'a [u8], &'a [i32]);

/// Tile `t` for batch rows `r..r + R` into `acc[..R]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn tile_rows<const R: usize>(
    weight: &Weight,
    xq: &QuantizedRows,
    p: Planes<'_>,
    t: usize,
    r: usize,
    acc: &mut [__m256],
) {
    let rows = match weight {
        Weight::Q4_1 { .. } => q4_1_tile::<R>(weight, xq, p.0, t, r),
        _ => q8_0_tile::<R>(weight, xq, p, t, r),
    };
    acc[..R].copy_from_slice(&rows);
}

/// `256 * hi + lo`, each the sum of two accumulators (exact i32: at most 32 * 255 * 255 per block).
#[target_feature(enable = "avx2")]
#[inline]
fn join(hi: [__m256i; 2], lo: [__m256i; 2]) -> __m256i {
    let hi = _mm256_add_epi32(hi[0], hi[1]);
    _mm256_add_epi32(_mm256_slli_epi32::<8>(hi), _mm256_add_epi32(lo[0], lo[1]))
}

/// `tiles.rs`' `q4_1_tile` with byte products: per chunk (four elements of each of eight features), the low and
/// the high nibbles masked in place, times each row's high bytes (nibbles unsigned) and low bytes (unsigned, the
/// nibbles as signed); then `q4_1_tile`'s scales and minimum term, in its order.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4_1_tile<const R: usize>(weight: &Weight, xq: &QuantizedRows, planes: &[u8], t: usize, r: usize) -> [__m256; R] {
    let Weight::Q4_1 { cols, d, m, qs, .. } = weight else { unreachable!("Q4_1 only") };
    let bpr = cols / QK;
    let low4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); R];
    let qs = tile(qs, t, bpr * 128);
    let (d, m) = (tile(d, t, bpr * TILE), tile(m, t, bpr * TILE));
    let (xs, stride) = row_blocks::<R>(xq, r);
    let sums = &xq.sums[r * bpr..(r + R) * bpr];
    for b in 0..bpr {
        let q = &qs[b * 128..(b + 1) * 128];
        prefetch(q, 128);
        prefetch(&d[b * TILE..], 2 * TILE);
        prefetch(&m[b * TILE..], 2 * TILE);
        let x = rows_bytes::<R>(planes, bpr, r, b);
        // Two accumulators each for the high and low bytes: shorter chains of `vpdpbusd`.
        let (mut hi, mut lo) = ([[_mm256_setzero_si256(); 2]; R], [[_mm256_setzero_si256(); 2]; R]);
        for k in 0..4 {
            // Chunk k: elements 4k..4k + 4 of each feature in the low nibbles, 16 + 4k.. in the high ones.
            let v = load32u(&q[k * 32..]);
            let n = [_mm256_and_si256(v, low4), _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4)];
            for i in 0..R {
                let (xl, xh) = x[i];
                for (h, &nh) in n.iter().enumerate() {
                    let at = 16 * h + 4 * k;
                    hi[i][h] = _mm256_dpbusd_epi32(hi[i][h], nh, broadcast4(xh, at));
                    lo[i][h] = _mm256_dpbusd_epi32(lo[i][h], broadcast4(xl, at), nh);
                }
            }
        }
        let (dw, mw) = (load8h(&d[b * TILE..]), load8h(&m[b * TILE..]));
        for i in 0..R {
            let s = join(hi[i], lo[i]);
            let xd = _mm256_set1_ps(xs[b * stride + i].d);
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, xd), acc[i]);
            acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sums[i * bpr + b]), acc[i]);
        }
    }
    acc
}

/// `tiles.rs`' `q8_0_tile` with byte products: per chunk, each row's low bytes times the weights, and the weights
/// plus 128 (unsigned) times its high bytes, less `128 * sum(hi)` per block; then `q8_0_tile`'s scales.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q8_0_tile<const R: usize>(weight: &Weight, xq: &QuantizedRows, p: Planes<'_>, t: usize, r: usize) -> [__m256; R] {
    let Weight::Q8_0 { cols, d, qs, .. } = weight else { unreachable!("Q8_0 only") };
    let (planes, high_sums) = p;
    let bpr = cols / QK;
    let flip = _mm256_set1_epi8(i8::MIN);
    let mut acc = [_mm256_setzero_ps(); R];
    let qs = tile(qs, t, bpr * 256);
    let d = tile(d, t, bpr * TILE);
    let (xs, stride) = row_blocks::<R>(xq, r);
    for b in 0..bpr {
        let q = &qs[b * 256..(b + 1) * 256];
        prefetch(q, 256);
        prefetch(&d[b * TILE..], 2 * TILE);
        let x = rows_bytes::<R>(planes, bpr, r, b);
        let (mut hi, mut lo) = ([[_mm256_setzero_si256(); 2]; R], [[_mm256_setzero_si256(); 2]; R]);
        for k in 0..8 {
            // Chunk k: elements 4k..4k + 4 of each feature.
            let w = load32(&q[k * 32..]);
            let wu = _mm256_xor_si256(w, flip);
            for i in 0..R {
                let (xl, xh) = x[i];
                hi[i][k % 2] = _mm256_dpbusd_epi32(hi[i][k % 2], wu, broadcast4(xh, 4 * k));
                lo[i][k % 2] = _mm256_dpbusd_epi32(lo[i][k % 2], broadcast4(xl, 4 * k), w);
            }
        }
        let dw = load8h(&d[b * TILE..]);
        for i in 0..R {
            hi[i][0] = _mm256_sub_epi32(hi[i][0], _mm256_set1_epi32(128 * high_sums[(r + i) * bpr + b]));
            let s = join(hi[i], lo[i]);
            let xd = _mm256_set1_ps(xs[b * stride + i].d);
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, xd), acc[i]);
        }
    }
    acc
}
