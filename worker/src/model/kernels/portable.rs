//! The portable matmul kernels: plain Rust for any CPU, and the reference whose every operation, in its order,
//! the SIMD levels in `x86/` reproduce bit for bit.

use super::QK;
use super::blocks::{HALVES, SUB, TileBuf, f16_to_f32, tile_q_at, tile_s_at};
use super::math::dot_f32;
use super::quant::QuantizedRows;
use super::weight::{TILE, Weight, q4_1_byte, q8_0_at, tile_scale};

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
                        acc = (isum as f32).mul_add(f16_to_f32(d[at]) * x.d, acc);
                        acc = f16_to_f32(m[at]).mul_add(xq.sums[r * bpr + b], acc);
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
                        acc = (isum as f32).mul_add(f16_to_f32(d[tile_scale(bpr, c, b)]) * x.d, acc);
                    }
                    acc
                }
                Weight::Q4K { d, dmin, sc, mn, .. } => {
                    // `columns_blocks`' Q4_K and Q5_K arithmetic: per half, the integer sum times `s = d * sc` and
                    // the activations' half sum times `m = -(dmin * mn)`, each times the activations' scale.
                    let mut acc = 0f32;
                    for b in 0..bpr {
                        let x = &xq.blocks[xq.index(r, b)];
                        let (mut lo, mut hi) = (0i32, 0i32);
                        for j in 0..16 {
                            lo += i32::from(weight.k_min_at(c, b, j)) * i32::from(x.q[j]);
                            hi += i32::from(weight.k_min_at(c, b, j + 16)) * i32::from(x.q[j + 16]);
                        }
                        let (at, sb) = (tile_scale(bpr, c, b), tile_scale(bpr / 8, c, b / 8));
                        let s = d[sb] * f32::from(sc[at]);
                        let m = -(dmin[sb] * f32::from(mn[at]));
                        for (h, isum) in [lo, hi].into_iter().enumerate() {
                            acc = (isum as f32).mul_add(s * x.d, acc);
                            acc = (xq.isums[(r * bpr + b) * HALVES + h] as f32).mul_add(m * x.d, acc);
                        }
                    }
                    acc
                }
                Weight::Q6K { .. } => {
                    // `columns_blocks`' Q6_K arithmetic: per half, the integer sum times `d * sc` times the
                    // activations' scale (no minimum).
                    let mut acc = 0f32;
                    for b in 0..bpr {
                        let x = &xq.blocks[xq.index(r, b)];
                        for h in 0..HALVES {
                            let mut isum = 0i32;
                            let mut s = 0f32;
                            for i in h * SUB..(h + 1) * SUB {
                                let q;
                                (s, q) = weight.q6_k_at(c, b, i);
                                isum += i32::from(q) * i32::from(x.q[i]);
                            }
                            acc = (isum as f32).mul_add(s * x.d, acc);
                        }
                    }
                    acc
                }
                Weight::Legacy { format, .. } => {
                    // `columns_blocks`' arithmetic for these formats: per half, the integer sum times `d`, and for
                    // Q5_1 the activations' half sum times `m`, each times the activations' scale.
                    let mut acc = 0f32;
                    for b in 0..bpr {
                        let x = &xq.blocks[xq.index(r, b)];
                        for h in 0..HALVES {
                            let (mut isum, mut s, mut m) = (0i32, 0f32, 0f32);
                            for i in h * SUB..(h + 1) * SUB {
                                let q;
                                (s, q, m) = weight.legacy_at(c, b, i);
                                isum += i32::from(q) * i32::from(x.q[i]);
                            }
                            acc = (isum as f32).mul_add(s * x.d, acc);
                            if format.has_min() {
                                acc = (xq.isums[(r * bpr + b) * HALVES + h] as f32).mul_add(m * x.d, acc);
                            }
                        }
                    }
                    acc
                }
                Weight::Blocks { .. } => unreachable!("block formats use columns_blocks"),
                Weight::F32 { .. } | Weight::Half { .. } => unreachable!("float weights use the float kernel"),
            };
        }
    }
}

/// The reference kernel of the block formats ([`Weight::Blocks`]): tile by tile, the eight features unpacked to
/// integers and per-16 scales and minimums ([`TileBuf`]); per output, for each block in order and each of its two
/// halves: the exact integer dot product of the weight and activation quants, times the weight's scale times the
/// activations' scale, as a fused multiply-add into one f32; for formats with a minimum then the activation quants'
/// exact sum times the minimum times the activations' scale, the same way.
pub(super) fn columns_blocks(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    let Weight::Blocks { format, rows, cols, raw } = weight else { unreachable!("block formats only") };
    let bpr = cols / QK;
    let mut buf = TileBuf::default();
    let end = c0 + out.first().map_or(0, |row| row.len());
    for t in c0 / TILE..end.div_ceil(TILE) {
        buf.unpack(*format, raw, *rows, *cols, t);
        for (r, row) in out.iter_mut().enumerate() {
            for c in (t * TILE).max(c0)..((t + 1) * TILE).min(end) {
                let j = c % TILE;
                let mut acc = 0f32;
                for b in 0..bpr {
                    let x = &xq.blocks[xq.index(r, b)];
                    for h in 0..HALVES {
                        let mut isum = 0i32;
                        for i in h * SUB..(h + 1) * SUB {
                            isum += i32::from(buf.q[tile_q_at(b, j, i)]) * i32::from(x.q[i]);
                        }
                        let at = tile_s_at(b, h, j);
                        acc = (isum as f32).mul_add(buf.s[at] * x.d, acc);
                        if format.has_min() {
                            acc = (xq.isums[(r * bpr + b) * HALVES + h] as f32).mul_add(buf.m[at] * x.d, acc);
                        }
                    }
                }
                row[c - c0] = acc;
            }
        }
    }
}

/// Widens 16-bit float bits to f32 (`bf16` or IEEE half), exactly: [`widen_half`] or a SIMD level's copy of it.
pub(super) type Widen = fn(bool, &[u16], &mut [f32]);

/// The float kernel (f32, f16 and bf16 weights): each weight row widened to f32 (exactly, by `widen`), then eight
/// lanes per batch row in a fixed order.
#[inline(always)]
pub(super) fn columns_float(weight: &Weight, x: &[f32], c0: usize, out: &mut [&mut [f32]], widen: Widen) {
    let cols = weight.cols();
    let mut wide = Vec::new();
    // Weight row outside, batch rows inside: a weight row is read from memory once per step, not once per row.
    for i in 0..out.first().map_or(0, |row| row.len()) {
        let c = c0 + i;
        let wc = match weight {
            Weight::F32 { w, .. } => &w[c * cols..(c + 1) * cols],
            Weight::Half { bf16, w, .. } => {
                wide.resize(cols, 0f32);
                widen(*bf16, &w[c * cols..(c + 1) * cols], &mut wide);
                &wide[..]
            }
            _ => unreachable!("quantized weights use the integer kernels"),
        };
        for (r, row) in out.iter_mut().enumerate() {
            row[i] = dot_f32(wc, &x[r * cols..(r + 1) * cols]);
        }
    }
}
