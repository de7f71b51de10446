//! The portable kernels and reductions: plain Rust for any CPU, and the reference whose every operation, in its
//! order, the SIMD levels in `x86/` reproduce bit for bit.

use super::QK;
use super::quant::QuantizedRows;
use super::weight::{Weight, q4_1_byte, q8_0_at, tile_scale};

/// Sum of eight lanes in a fixed tree order (the order the SIMD kernel's horizontal adds produce).
#[inline(always)]
pub(super) fn hsum(a: &[f32; 8]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// The portable integer kernel (weight quants times 16-bit activation quants); the reference the SIMD kernel must
/// match bit for bit. Per output, for each block in
/// order: the exact integer dot product of the weight and activation quants, times the product of the two scales,
/// as a fused multiply-add into one f32; for Q4_1 then the minimum times the activations' block sum, the same way.
pub(super) fn columns_int(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    let bpr = weight.cols() / QK;
    for (r, row) in out.iter_mut().enumerate() {
        for (c, o) in (c0..).zip(row.iter_mut()) {
            *o = match weight {
                Weight::Q4_1 { d, m, qs, .. } => {
                    let mut acc = 0f32;
                    for b in 0..bpr {
                        let x = &xq.blocks[xq.index(r, b)];
                        let mut isum = 0i32;
                        for j in 0..16 {
                            let q = qs[q4_1_byte(bpr, c, b, j)];
                            isum +=
                                i32::from(q & 0x0f) * i32::from(x.q[j]) + i32::from(q >> 4) * i32::from(x.q[j + 16]);
                        }
                        let at = tile_scale(bpr, c, b);
                        acc = (isum as f32).mul_add(d[at] * x.d, acc);
                        acc = m[at].mul_add(xq.sums[r * bpr + b], acc);
                    }
                    acc
                }
                Weight::Q8_0 { d, qs, .. } => {
                    let mut acc = 0f32;
                    for b in 0..bpr {
                        let x = &xq.blocks[xq.index(r, b)];
                        let mut isum = 0i32;
                        for (e, &xe) in x.q.iter().enumerate() {
                            isum += i32::from(qs[q8_0_at(bpr, c, b, e)]) * i32::from(xe);
                        }
                        acc = (isum as f32).mul_add(d[tile_scale(bpr, c, b)] * x.d, acc);
                    }
                    acc
                }
                Weight::F32 { .. } => unreachable!("f32 weights use the f32 kernel"),
            };
        }
    }
}

/// The f32 kernel (plain f32 weights): eight lanes per batch row in a fixed order.
pub(super) fn columns_f32(weight: &Weight, x: &[f32], c0: usize, out: &mut [&mut [f32]]) {
    let Weight::F32 { w, cols, .. } = weight else { unreachable!("quantized weights use the integer kernel") };
    let cols = *cols;
    // Weight row outside, batch rows inside: a weight row is read from memory once per step, not once per row.
    for i in 0..out.first().map_or(0, |row| row.len()) {
        let wc = &w[(c0 + i) * cols..(c0 + i + 1) * cols];
        for (r, row) in out.iter_mut().enumerate() {
            row[i] = dot_f32(wc, &x[r * cols..(r + 1) * cols]);
        }
    }
}

/// `e^x` in f32 from IEEE arithmetic only (Cephes' range reduction and polynomial, within 2 ulp of the true value
/// for normal results), so it vectorises inside loops and gives the same bits on every machine, unlike libm's
/// `expf`. Inputs are clamped to [-87.3, 88.0]: below, the result is about 1e-38 instead of a denormal or zero.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a libm call.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = (p * r * r + r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Sum with eight accumulators in a fixed order.
#[inline(always)]
pub fn sum_f32(a: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for c in a.chunks_exact(8) {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    finish_sum(&acc, a.chunks_exact(8).remainder())
}

/// [`sum_f32`]'s last step: its eight lanes in [`hsum`]'s order, then the values past the last full eight.
#[inline(always)]
pub(super) fn finish_sum(lanes: &[f32; 8], rest: &[f32]) -> f32 {
    hsum(lanes) + rest.iter().sum::<f32>()
}

/// Dot product with eight accumulators in a fixed order (vectorisable, and the same order for every call).
#[inline(always)]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut tail = 0f32;
    for i in chunks * 8..a.len().min(b.len()) {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}
