//! The softmax of attention scores in AVX2: [`softmax_weights`]'s operations in its order, so the same bits, with
//! its `exp` four vectors at a time, each step for all four before the next. Written per element, the
//! autovectorised loop ran one vector's chain of some thirty dependent operations at a time, and the scheduler
//! waited on it (`perf annotate` of a 4,096-token prefill: about 23 cycles a vector of eight, 8.7% of the prefill).

use std::arch::x86_64::*;

use super::super::math::{exp, exp_f32, finish_sum};
use super::simd::{load8f, store8f};

#[cfg(test)]
use super::super::attention::softmax_weights;

/// Vectors of scores whose `exp` steps run side by side.
const WAYS: usize = 4;

/// [`softmax_weights`] in AVX2, the same bits: the maximum in eight lanes, then `exp(s - max)` and the lanes' sum
/// in one pass (each lane's additions in the chunks' order, as [`super::super::math::sum_f32`] adds them), then
/// every weight times the reciprocal of the sum.
#[target_feature(enable = "avx2")]
pub(super) fn softmax_avx2(s: &mut [f32]) {
    // Four running maxima (any order gives the same maximum), so that one `vmaxps` does not wait on the last.
    let mut m = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
    let mut fours = s.chunks_exact(32);
    for c in &mut fours {
        for (i, m) in m.iter_mut().enumerate() {
            // `f32::max`'s choice where a score is NaN: the other argument.
            *m = _mm256_max_ps(load8f(&c[8 * i..]), *m);
        }
    }
    for c in fours.remainder().chunks_exact(8) {
        m[0] = _mm256_max_ps(load8f(c), m[0]);
    }
    let mut lanes = [0f32; 8];
    store8f(&mut lanes, _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])));
    let rest = s.chunks_exact(8).remainder();
    let max = lanes.iter().chain(rest).copied().fold(f32::NEG_INFINITY, f32::max);
    let mv = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let mut groups = s.chunks_exact_mut(8 * WAYS);
    for g in &mut groups {
        let mut x = [_mm256_setzero_ps(); WAYS];
        for (i, x) in x.iter_mut().enumerate() {
            *x = _mm256_sub_ps(load8f(&g[8 * i..]), mv);
        }
        for (i, e) in exp8(x).into_iter().enumerate() {
            store8f(&mut g[8 * i..], e);
            sum = _mm256_add_ps(sum, e);
        }
    }
    let tail = groups.into_remainder();
    let mut chunks = tail.chunks_exact_mut(8);
    for c in &mut chunks {
        let [e] = exp8([_mm256_sub_ps(load8f(c), mv)]);
        store8f(c, e);
        sum = _mm256_add_ps(sum, e);
    }
    let rest = chunks.into_remainder();
    for v in rest.iter_mut() {
        *v = exp_f32(*v - max);
    }
    store8f(&mut lanes, sum);
    let inv = 1.0 / finish_sum(&lanes, rest);
    let iv = _mm256_set1_ps(inv);
    let mut chunks = s.chunks_exact_mut(8);
    for c in &mut chunks {
        store8f(c, _mm256_mul_ps(load8f(c), iv));
    }
    chunks.into_remainder().iter_mut().for_each(|v| *v *= inv);
}

/// [`exp_f32`] of `N` vectors, its operations in its order (a multiply and an addition, never fused), each step
/// for every vector before the next, so that their chains overlap.
#[target_feature(enable = "avx2")]
#[inline]
fn exp8<const N: usize>(x: [__m256; N]) -> [__m256; N] {
    let c = _mm256_set1_ps;
    let (lo, hi, log2e, round) = (c(exp::MIN), c(exp::MAX), c(exp::LOG2E), c(exp::ROUND));
    let (ln2_hi, ln2_lo, one) = (c(exp::LN2_HI), c(exp::LN2_LO), c(1.0));
    let mut x = x;
    let (mut n, mut k, mut r, mut p) = ([c(0.0); N], [_mm256_setzero_si256(); N], [c(0.0); N], [c(exp::POLY[0]); N]);
    for x in &mut x {
        // `f32::clamp`: a NaN stays NaN (the second operand is returned where either is NaN).
        *x = _mm256_min_ps(hi, _mm256_max_ps(lo, *x));
    }
    for i in 0..N {
        let t = _mm256_add_ps(_mm256_mul_ps(x[i], log2e), round);
        n[i] = _mm256_sub_ps(t, round);
        k[i] = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(round));
    }
    for i in 0..N {
        r[i] = _mm256_sub_ps(_mm256_sub_ps(x[i], _mm256_mul_ps(n[i], ln2_hi)), _mm256_mul_ps(n[i], ln2_lo));
    }
    for &coef in &exp::POLY[1..] {
        for i in 0..N {
            p[i] = _mm256_add_ps(_mm256_mul_ps(p[i], r[i]), c(coef));
        }
    }
    let mut y = [c(0.0); N];
    for i in 0..N {
        let pr = _mm256_mul_ps(_mm256_mul_ps(p[i], r[i]), r[i]);
        let two_k = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(k[i], _mm256_set1_epi32(127))));
        y[i] = _mm256_mul_ps(_mm256_add_ps(_mm256_add_ps(pr, r[i]), one), two_k);
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_avx2_softmax_gives_the_reference_bits() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let mut seed = 5u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 40) as f32 / (1u64 << 24) as f32
        };
        // Every length up to three groups and a tail, and a long row; scores from tiny to past the clamp.
        for len in (0..100).chain([1000, 4097]) {
            for spread in [0.01f32, 1.0, 30.0, 400.0] {
                let s: Vec<f32> = (0..len).map(|_| (next() - 0.5) * spread).collect();
                let (mut want, mut got) = (s.clone(), s.clone());
                softmax_weights(&mut want);
                // SAFETY: the CPU has AVX2 (checked above).
                unsafe { softmax_avx2(&mut got) };
                let (want, got): (Vec<u32>, Vec<u32>) =
                    (want.iter().map(|v| v.to_bits()).collect(), got.iter().map(|v| v.to_bits()).collect());
                assert_eq!(want, got, "{len} scores spread over {spread}");
            }
        }
    }
}
