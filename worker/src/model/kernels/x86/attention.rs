//! Attention over the f16 KV cache in AVX2, FMA and F16C: [`super::super::attention`]'s arithmetic, the same bits.

use std::arch::x86_64::*;

use super::super::attention::{AttentionShape, softmax_weights};
use super::super::math::hsum;
use super::simd::{load8f, store8f};

/// [`super::super::attention`]'s arithmetic (`head_dim` a multiple of 8) with the f16 cache widened by F16C.
/// Scores: each key chunk is widened once for up to four heads of its group, each head's eight lanes are kept,
/// and eight positions' lanes are summed at once. Values: per head, four output chunks stay in registers across
/// all positions.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn attention_avx2(
    q: &[f32],
    slots: &[usize],
    keys: &[u16],
    values: &[u16],
    shape: AttentionShape,
    out: &mut [f32],
) {
    let AttentionShape { heads, kv_heads, head_dim: hd, scale } = shape;
    let (group, n, chunks) = (heads / kv_heads, slots.len(), hd / 8);
    // weights[h * n + p]: head h, position p; scores first, then softmax weights in place.
    let mut weights = vec![0f32; heads * n];
    for g in 0..kv_heads {
        for h0 in (g * group..(g + 1) * group).step_by(4) {
            let key = |slot: usize| &keys[slot + g * hd..slot + (g + 1) * hd];
            let (q, w) = (&q[h0 * hd..], &mut weights[h0 * n..]);
            match ((g + 1) * group - h0).min(4) {
                4 => scores::<4>(q, hd, slots, key, scale, w),
                3 => scores::<3>(q, hd, slots, key, scale, w),
                2 => scores::<2>(q, hd, slots, key, scale, w),
                _ => scores::<1>(q, hd, slots, key, scale, w),
            }
        }
    }
    for w in weights.chunks_exact_mut(n.max(1)) {
        softmax_weights(w);
    }
    // Values: up to three heads of a group and four chunks at a time, so each widened value chunk serves every
    // head of the batch and the twelve accumulators stay in registers.
    for g in 0..kv_heads {
        for h0 in (g * group..(g + 1) * group).step_by(3) {
            let (batch, w) = (((g + 1) * group - h0).min(3), &weights[h0 * n..]);
            for c0 in (0..chunks).step_by(4) {
                let (at, o) = (g * hd + 8 * c0, &mut out[h0 * hd + 8 * c0..]);
                let v = Values { w, n, slots, values, at, hd };
                match (batch, (chunks - c0).min(4)) {
                    (3, 4) => v.sum::<3, 4>(o),
                    (3, 3) => v.sum::<3, 3>(o),
                    (3, 2) => v.sum::<3, 2>(o),
                    (3, _) => v.sum::<3, 1>(o),
                    (2, 4) => v.sum::<2, 4>(o),
                    (2, 3) => v.sum::<2, 3>(o),
                    (2, 2) => v.sum::<2, 2>(o),
                    (2, _) => v.sum::<2, 1>(o),
                    (_, 4) => v.sum::<1, 4>(o),
                    (_, 3) => v.sum::<1, 3>(o),
                    (_, 2) => v.sum::<1, 2>(o),
                    (_, _) => v.sum::<1, 1>(o),
                }
            }
        }
    }
}

/// Scaled scores of `B` consecutive heads (queries in `q`, `hd` each, sharing one KV head whose key at a
/// slot is `key(slot)`) for every position, into `out[i * n + p]` for head `i`: eight positions at a time, each
/// head's eight lanes per position kept on the stack and summed together.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn scores<'k, const B: usize>(
    q: &[f32],
    hd: usize,
    slots: &[usize],
    key: impl Fn(usize) -> &'k [u16],
    scale: f32,
    out: &mut [f32],
) {
    let n = slots.len();
    // The heads' queries chunk-major (`qt[c * B + i]` is head i's chunk c), so the inner loop runs on fixed-size
    // chunks without bounds checks.
    let mut qt = vec![[0f32; 8]; hd / 8 * B];
    for (c, qc) in qt.chunks_exact_mut(B).enumerate() {
        for (i, v) in qc.iter_mut().enumerate() {
            v.copy_from_slice(&q[i * hd + 8 * c..i * hd + 8 * c + 8]);
        }
    }
    let mut lanes = [[0f32; 64]; B];
    for (block, block_slots) in slots.chunks(8).enumerate() {
        // Two positions side by side: their chains of fused multiply-adds are independent, so they overlap.
        let mut pairs = block_slots.chunks_exact(2);
        for (pair, two) in pairs.by_ref().enumerate() {
            let ahead = block * 8 + 2 * pair + AHEAD;
            if let Some(&far) = slots.get(ahead) {
                prefetch_key(key(far));
            }
            if let Some(&far) = slots.get(ahead + 1) {
                prefetch_key(key(far));
            }
            let (k0, k1) = (key(two[0]), key(two[1]));
            let (mut a0, mut a1) = ([_mm256_setzero_ps(); B], [_mm256_setzero_ps(); B]);
            for ((c0, c1), qc) in k0.chunks_exact(8).zip(k1.chunks_exact(8)).zip(qt.chunks_exact(B)) {
                let (c0, c1) = (load8h(c0), load8h(c1));
                for i in 0..B {
                    let qv = load8f(&qc[i]);
                    a0[i] = _mm256_fmadd_ps(qv, c0, a0[i]);
                    a1[i] = _mm256_fmadd_ps(qv, c1, a1[i]);
                }
            }
            for (l, (x0, x1)) in lanes.iter_mut().zip(a0.iter().zip(&a1)) {
                store8f(&mut l[16 * pair..], *x0);
                store8f(&mut l[16 * pair + 8..], *x1);
            }
        }
        if let [slot] = *pairs.remainder() {
            let j = block_slots.len() - 1;
            let mut acc = [_mm256_setzero_ps(); B];
            for (kc, qc) in key(slot).chunks_exact(8).zip(qt.chunks_exact(B)) {
                let kc = load8h(kc);
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

/// The weighted sum of values for a batch of heads of one group: head `i`'s weights are `w[i * n..]`, its
/// value chunks start at `at` in every slot, and its output at `i * hd` of the output slice.
struct Values<'a> {
    w: &'a [f32],
    n: usize,
    slots: &'a [usize],
    values: &'a [u16],
    at: usize,
    hd: usize,
}

impl Values<'_> {
    /// `W` chunks of eight output values for `B` heads: `Σ_p w[p] * value_p` in position order, each widened
    /// chunk used by all `B` heads, the sums held in registers across all positions.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn sum<const B: usize, const W: usize>(&self, out: &mut [f32]) {
        let Values { w, n, slots, values, at, hd } = *self;
        let mut acc = [[_mm256_setzero_ps(); W]; B];
        for (p, &slot) in slots.iter().enumerate() {
            if let Some(&far) = slots.get(p + AHEAD) {
                prefetch(&values[far + at..]);
            }
            let value = values[slot + at..slot + at + 8 * W].chunks_exact(8);
            let mut wv = [_mm256_setzero_ps(); B];
            for (i, v) in wv.iter_mut().enumerate() {
                *v = _mm256_set1_ps(w[i * n + p]);
            }
            for (c, v) in value.enumerate() {
                let vc = load8h(v);
                for (a, &wi) in acc.iter_mut().zip(&wv) {
                    a[c] = _mm256_fmadd_ps(wi, vc, a[c]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (c, v) in a.iter().enumerate() {
                store8f(&mut out[i * hd + 8 * c..], *v);
            }
        }
    }
}

/// Each position's eight lanes summed as [`hsum`], times `scale`: eight positions per pass of
/// horizontal adds (whose pairings are `hsum`'s tree).
#[target_feature(enable = "avx2,fma")]
fn scores8(lanes: &[f32], scale: f32, out: &mut [f32]) {
    let full = out.len() / 8 * 8;
    let sc = _mm256_set1_ps(scale);
    for p in (0..full).step_by(8) {
        let v = |i: usize| load8f(&lanes[(p + i) * 8..]);
        let t1 = _mm256_hadd_ps(_mm256_hadd_ps(v(0), v(1)), _mm256_hadd_ps(v(2), v(3)));
        let t2 = _mm256_hadd_ps(_mm256_hadd_ps(v(4), v(5)), _mm256_hadd_ps(v(6), v(7)));
        let sum = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(t1, t2), _mm256_permute2f128_ps::<0x31>(t1, t2));
        store8f(&mut out[p..], _mm256_mul_ps(sum, sc));
    }
    for (p, o) in out.iter_mut().enumerate().skip(full) {
        *o = hsum(lanes[p * 8..p * 8 + 8].try_into().expect("eight lanes")) * scale;
    }
}

/// Positions ahead of the one being read whose KV lines are requested early: the KV blocks of a step come
/// from memory (the weights pushed them out of the caches since the last step).
const AHEAD: usize = 8;

/// Prefetch every cache line of one key (or value) head.
#[inline(always)]
fn prefetch_key(key: &[u16]) {
    for line in (0..key.len()).step_by(32) {
        prefetch(&key[line..]);
    }
}

/// A hint to bring the cache line holding `at[0]` into the caches. The slice index bounds-checks the address.
#[inline(always)]
fn prefetch(at: &[u16]) {
    let p: *const u16 = &at[0];
    // SAFETY: a prefetch never faults and reads nothing the program sees; `p` is a valid address anyway.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
}

/// Eight f16 values as f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn load8h(b: &[u16]) -> __m256 {
    let b = &b[..8];
    // SAFETY: `b` holds 8 readable u16s (16 bytes); the load is unaligned.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
}
