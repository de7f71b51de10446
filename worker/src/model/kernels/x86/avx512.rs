//! The AVX-512 VNNI level: the integer kernels two tiles (sixteen output features) at a time with `vpdpbusd`,
//! exact integer sums and then the portable reference's scale arithmetic per lane.

use std::arch::x86_64::*;

use super::super::quant::{QuantizedRows, XBlock};
use super::super::weight::TILE;
use super::super::{QK, Weight};
use super::avx2::one_tile;
use super::{TILE_ROWS, load8f, load32, load32u, row_blocks, store_features, tile};

/// The VNNI integer kernels: two tiles (sixteen output features, one 512-bit vector) at a time, a few batch rows
/// at a time; a last odd tile runs the AVX2 kernel (the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
pub(super) fn tiled_columns_vnni(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    let (n, t1) = (out.len(), (c0 + out[0].len()).div_ceil(TILE));
    let mut t = c0 / TILE;
    while t + 2 <= t1 {
        let mut r = 0;
        while r < n {
            let tile = (n - r).min(TILE_ROWS);
            let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
            by_rows!(tile, pair_rows(weight, xq, t, r, &mut acc));
            for (row, a) in out[r..r + tile].iter_mut().zip(acc) {
                let mut vals = [0f32; 2 * TILE];
                // SAFETY: `vals` is 16 writable f32s and the store is unaligned.
                unsafe { _mm512_storeu_ps(vals.as_mut_ptr(), a) };
                store_features(row, c0, t * TILE, &vals);
            }
            r += tile;
        }
        t += 2;
    }
    if t < t1 {
        one_tile(weight, xq, t, c0, out);
    }
}

/// Tiles `t` and `t + 1` for batch rows `r..r + R` into `acc[..R]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn pair_rows<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize, acc: &mut [__m512]) {
    let rows = match weight {
        Weight::Q4_1 { .. } => q4_1_pair::<R>(weight, xq, t, r),
        _ => q8_0_pair::<R>(weight, xq, t, r),
    };
    acc[..R].copy_from_slice(&rows);
}

/// Two 256-bit vectors (the same chunk of two tiles) as one 512-bit vector, `a` in the low half.
#[target_feature(enable = "avx512f")]
#[inline]
fn join(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// Eight f32s of each of two tiles as one vector, the first in the low half.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_pair8f(a: &[f32], b: &[f32]) -> __m512 {
    _mm512_castsi512_ps(join(_mm256_castps_si256(load8f(a)), _mm256_castps_si256(load8f(b))))
}

/// Activation bytes `4k..4k + 4` of a block, in every 32-bit lane of a 512-bit vector.
#[target_feature(enable = "avx512f")]
#[inline]
fn broadcast4_512(x: &XBlock, k: usize) -> __m512i {
    _mm512_set1_epi32(x.quad(k))
}

/// [`super::avx2`]'s Q4_1 tile for tiles `t` and `t + 1` at once with VNNI: `vpdpbusd` multiplies the unsigned nibbles by
/// the signed activation bytes and adds each lane's four products to its i32 sum (exact, no 16-bit step), so
/// a chunk costs one instruction per row and half of a block. Then the same conversions and fused
/// multiply-adds as the reference, per lane (feature).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn q4_1_pair<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize) -> [__m512; R] {
    let Weight::Q4_1 { cols, d, m, qs, .. } = weight else { unreachable!("Q4_1 only") };
    let bpr = cols / QK;
    let low4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); R];
    let (qa, qb) = (tile(qs, t, bpr * 128), tile(qs, t + 1, bpr * 128));
    let (da, db) = (tile(d, t, bpr * TILE), tile(d, t + 1, bpr * TILE));
    let (ma, mb) = (tile(m, t, bpr * TILE), tile(m, t + 1, bpr * TILE));
    let (xs, stride) = row_blocks::<R>(xq, r);
    let sums = &xq.sums[r * bpr..(r + R) * bpr];
    for b in 0..bpr {
        let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
        // Low and high nibbles in separate sums: shorter dependency chains (the sum is exact either way).
        let (mut s, mut h) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
        for k in 0..4 {
            let v = join(load32u(&qa[b * 128 + k * 32..]), load32u(&qb[b * 128 + k * 32..]));
            let lo = _mm512_and_si512(v, low4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
            for i in 0..R {
                s[i] = _mm512_dpbusd_epi32(s[i], lo, broadcast4_512(&x[i], k));
                h[i] = _mm512_dpbusd_epi32(h[i], hi, broadcast4_512(&x[i], k + 4));
            }
        }
        for i in 0..R {
            s[i] = _mm512_add_epi32(s[i], h[i]);
        }
        let dw = load_pair8f(&da[b * TILE..], &db[b * TILE..]);
        let mw = load_pair8f(&ma[b * TILE..], &mb[b * TILE..]);
        for i in 0..R {
            let scale = _mm512_mul_ps(dw, _mm512_set1_ps(x[i].d));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), scale, acc[i]);
            acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sums[i * bpr + b]), acc[i]);
        }
    }
    acc
}

/// [`super::avx2`]'s Q8_0 tile for tiles `t` and `t + 1` at once with VNNI. `vpdpbusd` wants one unsigned operand, so the
/// weights are offset by 128 (their sign bit flipped: once per chunk for all rows) and each row's block sum
/// takes `128 * sum(q)` back off: `sum((w + 128) * x) - 128 * sum(x) = sum(w * x)`, exact in i32.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn q8_0_pair<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize) -> [__m512; R] {
    let Weight::Q8_0 { cols, d, qs, .. } = weight else { unreachable!("Q8_0 only") };
    let bpr = cols / QK;
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); R];
    let (qa, qb) = (tile(qs, t, bpr * 256), tile(qs, t + 1, bpr * 256));
    let (da, db) = (tile(d, t, bpr * TILE), tile(d, t + 1, bpr * TILE));
    let (xs, stride) = row_blocks::<R>(xq, r);
    for b in 0..bpr {
        let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
        let mut s = [_mm512_setzero_si512(); R];
        for k in 0..8 {
            let w = join(load32(&qa[b * 256 + k * 32..]), load32(&qb[b * 256 + k * 32..]));
            let offset = _mm512_xor_si512(w, flip);
            for i in 0..R {
                s[i] = _mm512_dpbusd_epi32(s[i], offset, broadcast4_512(&x[i], k));
            }
        }
        let dw = load_pair8f(&da[b * TILE..], &db[b * TILE..]);
        for i in 0..R {
            let isum = _mm512_sub_epi32(s[i], _mm512_set1_epi32(x[i].qsum << 7));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(x[i].d)), acc[i]);
        }
    }
    acc
}
