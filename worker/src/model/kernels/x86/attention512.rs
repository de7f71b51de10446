//! The AVX-512 level's attention kernels (`attention.rs` runs them): the scores and the weighted sums of values in
//! 512-bit vectors, which hold two positions' eight lanes (scores) or sixteen output values (values). Every lane's
//! chain of fused multiply-adds is the AVX2 level's, in the same order, so the bits are the same; only twice as many
//! lanes go through each instruction.

use std::arch::x86_64::*;

use super::attention_parts::{AHEAD, Key, Source, Values, scores8};
use super::simd::{load8f, store8f};

/// Scaled scores of `B` consecutive heads for every position in `slots`, as `attention::scores` computes them:
/// four positions at a time, each pair's keys side by side in one vector against the query chunk in both halves.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline]
pub(super) fn scores_avx512<S: Source, const B: usize>(
    q: &[f32],
    hd: usize,
    slots: &[usize],
    key: Key<S>,
    scale: f32,
    n: usize,
    out: &mut [f32],
) {
    // The heads' queries chunk-major (`qt[c * B + i]` is head i's chunk c), each chunk twice over.
    let mut qt = vec![[0f32; 16]; hd / 8 * B];
    for (c, qc) in qt.chunks_exact_mut(B).enumerate() {
        for (i, v) in qc.iter_mut().enumerate() {
            let chunk = &q[i * hd + 8 * c..i * hd + 8 * c + 8];
            v[..8].copy_from_slice(chunk);
            v[8..].copy_from_slice(chunk);
        }
    }
    let mut lanes = [[0f32; 64]; B];
    for (block, block_slots) in slots.chunks(8).enumerate() {
        // Four positions: two vectors of two per head, so their chains of multiply-adds overlap.
        let mut quads = block_slots.chunks_exact(4);
        for (quad, four) in quads.by_ref().enumerate() {
            for far in slots.iter().skip(block * 8 + 4 * quad + AHEAD).take(4) {
                key.keys.prefetch(far + key.at, key.hd);
            }
            let k = [four[0] + key.at, four[1] + key.at, four[2] + key.at, four[3] + key.at];
            let mut acc = [[_mm512_setzero_ps(); 2]; B];
            for (c, qc) in qt.chunks_exact(B).enumerate() {
                let lo = pair(key.keys.load8(k[0] + 8 * c), key.keys.load8(k[1] + 8 * c));
                let hi = pair(key.keys.load8(k[2] + 8 * c), key.keys.load8(k[3] + 8 * c));
                for (a, qv) in acc.iter_mut().zip(qc) {
                    let qv = load16f(qv);
                    a[0] = _mm512_fmadd_ps(qv, lo, a[0]);
                    a[1] = _mm512_fmadd_ps(qv, hi, a[1]);
                }
            }
            for (l, a) in lanes.iter_mut().zip(&acc) {
                store16f(&mut l[32 * quad..], a[0]);
                store16f(&mut l[32 * quad + 16..], a[1]);
            }
        }
        // The rest of the block one position at a time, as the AVX2 level's remainder.
        for (j, &slot) in block_slots.iter().enumerate().skip(block_slots.len() / 4 * 4) {
            let mut acc = [_mm256_setzero_ps(); B];
            for (c, qc) in qt.chunks_exact(B).enumerate() {
                let kc = key.keys.load8(slot + key.at + 8 * c);
                for (a, qv) in acc.iter_mut().zip(qc) {
                    *a = _mm256_fmadd_ps(load8f(qv), kc, *a);
                }
            }
            for (l, a) in lanes.iter_mut().zip(&acc) {
                store8f(&mut l[8 * j..], *a);
            }
        }
        let p0 = block * 8;
        for (i, l) in lanes.iter().enumerate() {
            scores8(&l[..8 * block_slots.len()], scale, &mut out[i * n + p0..i * n + p0 + block_slots.len()]);
        }
    }
}

/// [`Values::sum`]'s arithmetic for `width` chunks of eight (even: head widths a multiple of 16; at most eight),
/// sixteen output values per vector.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline]
pub(super) fn values_avx512<S: Source, const B: usize>(v: &Values<'_, S>, out: &mut [f32], width: usize) {
    match width / 2 {
        4 => sum::<S, B, 4>(v, out),
        3 => sum::<S, B, 3>(v, out),
        2 => sum::<S, B, 2>(v, out),
        _ => sum::<S, B, 1>(v, out),
    }
}

/// `W` vectors of sixteen output values for `B` heads: `w[p] * value_p` added in position order, the sums held in
/// registers across the positions.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline]
fn sum<S: Source, const B: usize, const W: usize>(v: &Values<'_, S>, out: &mut [f32]) {
    let Values { w, n, slots, values, at, hd } = *v;
    let mut acc = [[_mm512_setzero_ps(); W]; B];
    for (i, a) in acc.iter_mut().enumerate() {
        for (c, x) in a.iter_mut().enumerate() {
            *x = load16f(&out[i * hd + 16 * c..]);
        }
    }
    for (p, &slot) in slots.iter().enumerate() {
        if let Some(&far) = slots.get(p + AHEAD) {
            values.prefetch(far + at, 16 * W);
        }
        let mut wv = [_mm512_setzero_ps(); B];
        for (i, x) in wv.iter_mut().enumerate() {
            *x = _mm512_set1_ps(w[i * n + p]);
        }
        for c in 0..W {
            let vc = values.load16(slot + at + 16 * c);
            for (a, &wi) in acc.iter_mut().zip(&wv) {
                a[c] = _mm512_fmadd_ps(wi, vc, a[c]);
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        for (c, x) in a.iter().enumerate() {
            store16f(&mut out[i * hd + 16 * c..], *x);
        }
    }
}

/// Two 256-bit vectors as the halves of one.
#[target_feature(enable = "avx512f")]
#[inline]
fn pair(lo: __m256, hi: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi)))
}

/// Sixteen f32s as a vector. The slice index bounds-checks the read.
#[inline(always)]
fn load16f(values: &[f32]) -> __m512 {
    let values = &values[..16];
    // SAFETY: `values` holds 16 readable f32s and the load is unaligned; the caller runs with AVX-512.
    unsafe { _mm512_loadu_ps(values.as_ptr()) }
}

/// A vector into sixteen f32s. The slice index bounds-checks the write.
#[inline(always)]
fn store16f(out: &mut [f32], v: __m512) {
    let out = &mut out[..16];
    // SAFETY: `out` holds 16 writable f32s and the store is unaligned; the caller runs with AVX-512.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) }
}
