//! The activation quantizer in AVX2 (every level above runs it too).

use std::arch::x86_64::*;

use super::super::QK;
use super::super::math::finish_sum;
use super::super::quant::XBlock;
use super::simd::{load8f, store8f};

/// [`super::super::quant::quantize_group`] in AVX2, block by block: the same maximum, the same scale, the same roundings
/// and the block sum in `sum_f32`'s order, so the same quants (for finite activations).
#[target_feature(enable = "avx2,fma")]
pub(super) fn quantize_group_avx2(x: &[f32], cols: usize, blocks: &mut [XBlock], sums: &mut [f32], qmax: f32) {
    let (rows, bpr) = (x.len() / cols, cols / QK);
    let sign = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.5);
    for r in 0..rows {
        for b in 0..bpr {
            let block = &x[r * cols + b * QK..][..QK];
            let v = [load8f(block), load8f(&block[8..]), load8f(&block[16..]), load8f(&block[24..])];
            let abs = |v: __m256| _mm256_andnot_ps(sign, v);
            let m = _mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3])));
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
            let d = amax / qmax;
            let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
            // Round half away from zero: add 0.5 with the value's sign, then truncate (and saturate, as `as` does).
            let quant = |v: __m256| {
                let t = _mm256_mul_ps(v, inv);
                _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_or_ps(half, _mm256_and_ps(t, sign))))
            };
            // The pack interleaves 64-bit quarters of its two inputs; the permute puts them back in element order.
            let pack = |a: __m256, b: __m256| {
                _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(quant(a), quant(b)))
            };
            let mut q = [0i16; QK];
            // SAFETY: `q` is 64 writable bytes and the stores are unaligned.
            unsafe {
                _mm256_storeu_si256(q.as_mut_ptr().cast(), pack(v[0], v[1]));
                _mm256_storeu_si256(q[16..].as_mut_ptr().cast(), pack(v[2], v[3]));
            }
            blocks[b * rows + r] = XBlock::new(q, d);
            let lanes =
                _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_setzero_ps(), v[0]), v[1]), v[2]), v[3]);
            let mut acc = [0f32; 8];
            store8f(&mut acc, lanes);
            sums[r * bpr + b] = finish_sum(&acc, &[]);
        }
    }
}
