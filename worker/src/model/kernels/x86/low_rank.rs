//! The low-rank update of LoRA adapters ([`super::super::low_rank`]'s portable loops) in AVX2, every level above
//! running it too: each `A x` dot product one eight-lane accumulator, up to four batch rows sharing each load of
//! `A`; each eight outputs of `B' t` kept in a register across the rank. Every value's operations are the portable
//! code's, in its order (a product rounded, then added; the same horizontal sum), so the bits are the same; the
//! half factors are widened eight at a time with F16C (exact, as the portable widening).

use std::arch::x86_64::*;

use super::super::LowRank;
use super::super::blocks::f16_to_f32;
use super::simd::{load8f, store8f};

/// Eight IEEE halves widened. The slice index bounds-checks the read.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load8h(bits: &[u16]) -> __m256 {
    let bits = &bits[..8];
    // SAFETY: `bits` holds 16 readable bytes and the load is unaligned.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(bits.as_ptr().cast()) })
}

/// [`super::super::low_rank::low_rank_rows`] in AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn low_rank_rows_avx2(w: LowRank<'_>, x: &[f32], rows: &mut [(usize, &mut [f32])]) {
    let (rank, inputs, outputs) = (w.rank, w.inputs, w.outputs);
    let mut t = vec![0f32; rows.len() * rank];
    let input = |r: usize| &x[r * inputs..(r + 1) * inputs];
    // Two rows of A by up to four batch rows: eight dependency chains in flight.
    let mut k = 0;
    while k < rank {
        let pair = (rank - k).min(2);
        let a: [&[u16]; 2] = std::array::from_fn(|q| &w.a[(k + q.min(pair - 1)) * inputs..][..inputs]);
        let mut i = 0;
        while i < rows.len() {
            let n = (rows.len() - i).min(4);
            let xs: [&[f32]; 4] = std::array::from_fn(|j| input(rows[i + j.min(n - 1)].0));
            let dots = match (pair, n) {
                (2, 4) => dots::<2, 4>(a, xs),
                (2, 3) => dots::<2, 3>(a, xs),
                (2, 2) => dots::<2, 2>(a, xs),
                (2, _) => dots::<2, 1>(a, xs),
                (_, 4) => dots::<1, 4>(a, xs),
                (_, 3) => dots::<1, 3>(a, xs),
                (_, 2) => dots::<1, 2>(a, xs),
                _ => dots::<1, 1>(a, xs),
            };
            for (q, dots) in dots.into_iter().take(pair).enumerate() {
                for (j, d) in dots.into_iter().take(n).enumerate() {
                    t[(i + j) * rank + k + q] = d;
                }
            }
            i += n;
        }
        k += pair;
    }
    for (i, (_, out)) in rows.iter_mut().enumerate() {
        add_columns(&w.bt[..rank * outputs], outputs, &t[i * rank..(i + 1) * rank], out);
    }
}

/// The dot products of the first `K` of `a` with the first `N` of `xs`, each as `dot_f32` computes it alone.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn dots<const K: usize, const N: usize>(a: [&[u16]; 2], xs: [&[f32]; 4]) -> [[f32; 4]; 2] {
    let chunks = a[0].len() / 8;
    let mut acc = [[_mm256_setzero_ps(); N]; K];
    for c in 0..chunks {
        let vx: [__m256; N] = std::array::from_fn(|j| load8f(&xs[j][c * 8..]));
        for (acc, a) in acc.iter_mut().zip(a) {
            let va = load8h(&a[c * 8..]);
            for (acc, &vx) in acc.iter_mut().zip(&vx) {
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(va, vx));
            }
        }
    }
    let mut out = [[0f32; 4]; 2];
    for ((out, acc), a) in out.iter_mut().zip(acc).zip(a) {
        for ((o, acc), x) in out.iter_mut().zip(acc).zip(xs) {
            let mut tail = 0f32;
            for (&a, &x) in a[chunks * 8..].iter().zip(&x[chunks * 8..]) {
                tail += f16_to_f32(a) * x;
            }
            *o = sum8(acc) + tail;
        }
    }
    out
}

/// `((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7))`, `dot_f32`'s order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn sum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let low = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    let high = _mm_movehl_ps(s, s);
    let high = _mm_add_ss(high, _mm_shuffle_ps::<1>(high, high));
    _mm_cvtss_f32(_mm_add_ss(low, high))
}

/// `out[j] += t[k] * bt[k][j]` for each `k` in order, each output's sum kept in a register (64 outputs at a time
/// for eight chains in flight, then eight, then one).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn add_columns(bt: &[u16], outputs: usize, t: &[f32], out: &mut [f32]) {
    let mut j = 0;
    while j + 64 <= outputs {
        let mut acc: [__m256; 8] = std::array::from_fn(|q| load8f(&out[j + 8 * q..]));
        for (k, &c) in t.iter().enumerate() {
            let (c, column) = (_mm256_set1_ps(c), &bt[k * outputs + j..]);
            for (q, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(c, load8h(&column[8 * q..])));
            }
        }
        for (q, acc) in acc.into_iter().enumerate() {
            store8f(&mut out[j + 8 * q..], acc);
        }
        j += 64;
    }
    while j + 8 <= outputs {
        let mut acc = load8f(&out[j..]);
        for (k, &c) in t.iter().enumerate() {
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(c), load8h(&bt[k * outputs + j..])));
        }
        store8f(&mut out[j..], acc);
        j += 8;
    }
    for (j, o) in out.iter_mut().enumerate().skip(j) {
        for (k, &c) in t.iter().enumerate() {
            *o += c * f16_to_f32(bt[k * outputs + j]);
        }
    }
}
