//! The portable matmul kernels: plain Rust for any CPU, and the reference whose every operation, in its order,
//! the SIMD levels in `x86/` reproduce bit for bit.

use super::QK;
use super::math::dot_f32;
use super::quant::QuantizedRows;
use super::weight::{Weight, q4_1_byte, q8_0_at, tile_scale};

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
