//! The block formats' kernel in AVX2: each tile unpacked once ([`TileBuf`], by `unpack.rs`) for every batch row, then [`super::avx2`]'s Q8_0 tile product per 16-value half, with the half's scale and
//! minimum: `columns_blocks`' reference operations in its order.

use std::arch::x86_64::*;

use super::super::QK;
use super::super::blocks::{HALVES, TileBuf, tile_s_at};
use super::super::quant::{QuantizedRows, XBlock};
use super::super::weight::{TILE, Weight};
use super::avx2::{PICK_A_HIGH, PICK_B_HIGH, chunk_sums, shuffle};
use super::simd::{load8f, row_blocks, tile_row_groups};
use super::unpack::unpack_avx2;

/// [`super::super::portable::columns_blocks`] in AVX2.
#[target_feature(enable = "avx2,fma")]
pub(super) fn columns_blocks_avx2(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    let Weight::Blocks { format, rows, cols, raw } = weight else { unreachable!("block formats only") };
    let mut buf = TileBuf::default();
    let end = c0 + out[0].len();
    for t in c0 / TILE..end.div_ceil(TILE) {
        // Unpacked once, read by every group of rows while it sits in L1.
        unpack_avx2(&mut buf, *format, raw, *rows, *cols, t);
        let min = format.has_min();
        tile_row_groups(out, c0, t, |n, r, acc| by_rows!(n, block_rows(&buf, min, xq, r, acc)));
    }
}

/// The unpacked tile for batch rows `r..r + R` into `acc[..R]`: per block and half, four chunks of four elements
/// of all eight features, sign-extended once for all rows to 16-bit pairs, each row's pair products summed in
/// i32 (exact: at most 16 * 128 * 32767), then the scale (and the minimum) as fused multiply-adds.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn block_rows<const R: usize>(buf: &TileBuf, min: bool, xq: &QuantizedRows, r: usize, acc: &mut [__m256]) {
    let bpr = xq.blocks_per_row;
    let (pick_a, pick_b) = (shuffle(&PICK_A_HIGH), shuffle(&PICK_B_HIGH));
    let mut a = [_mm256_setzero_ps(); R];
    let (xs, stride) = row_blocks::<R>(xq, r);
    let isums = &xq.isums[r * bpr * HALVES..(r + R) * bpr * HALVES];
    for (b, q) in buf.q.chunks_exact(8 * 32).enumerate().take(bpr) {
        let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
        for h in 0..HALVES {
            let mut s = [_mm256_setzero_si256(); R];
            chunk_sums(q, x, 4 * h..4 * h + 4, (pick_a, pick_b), &mut s);
            let at = tile_s_at(b, h, 0);
            let sw = load8f(&buf.s[at..]);
            for i in 0..R {
                a[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(sw, _mm256_set1_ps(x[i].d)), a[i]);
            }
            if min {
                let mw = load8f(&buf.m[at..]);
                for i in 0..R {
                    let xs = _mm256_set1_ps(isums[(i * bpr + b) * HALVES + h] as f32);
                    a[i] = _mm256_fmadd_ps(xs, _mm256_mul_ps(mw, _mm256_set1_ps(x[i].d)), a[i]);
                }
            }
        }
    }
    debug_assert_eq!(buf.q.len(), bpr * QK * 8);
    acc[..R].copy_from_slice(&a);
}
