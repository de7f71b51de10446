//! The scalar arithmetic every kernel shares, in fixed orders: lane sums, sums, dot products and `exp`. A leaf:
//! the reference kernels, the activation quantizer, attention and every SIMD level build on it, and it on nothing.

/// Sum of eight lanes in a fixed tree order (the order the SIMD kernel's horizontal adds produce).
#[inline(always)]
pub(super) fn hsum(a: &[f32; 8]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// [`exp_f32`]'s constants: the inputs' range, `log2(e)`, `ln(2)` in two parts, the rounding constant and the
/// polynomial's coefficients, highest first (the SIMD levels' `exp` computes its operations with them in its order).
pub(super) mod exp {
    pub(in super::super) const MIN: f32 = -87.3;
    pub(in super::super) const MAX: f32 = 88.0;
    pub(in super::super) const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub(in super::super) const LN2_HI: f32 = 0.693_359_4;
    pub(in super::super) const LN2_LO: f32 = -2.121_944_4e-4;
    /// Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a libm call.
    pub(in super::super) const ROUND: f32 = 12_582_912.0;
    pub(in super::super) const POLY: [f32; 6] =
        [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
}

/// `e^x` in f32 from IEEE arithmetic only (Cephes' range reduction and polynomial, within 2 ulp of the true value
/// for normal results), so it vectorises inside loops and gives the same bits on every machine, unlike libm's
/// `expf`. Inputs are clamped to [-87.3, 88.0]: below, the result is about 1e-38 instead of a denormal or zero.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    use exp::{LN2_HI, LN2_LO, LOG2E, POLY, ROUND};
    let x = x.clamp(exp::MIN, exp::MAX);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    // The integer n is also the low bits of `t` (an integer conversion of `n` with its range checks would keep
    // the loop from vectorising).
    let k = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = POLY[0];
    for c in &POLY[1..] {
        p = p * r + c;
    }
    let y = (p * r * r + r) + 1.0;
    y * f32::from_bits(((k + 127) as u32) << 23)
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

/// Four [`dot_f32`]s of equally long pairs `a[i]`, `x[i]` at once: each result's operations in [`dot_f32`]'s
/// order (the same bits), four dependency chains in flight instead of one.
#[inline(always)]
pub fn dot4_f32(a: [&[f32]; 4], x: [&[f32]; 4]) -> [f32; 4] {
    let mut acc = [[0f32; 8]; 4];
    let len = a[0].len();
    let chunks = len / 8;
    for i in 0..chunks {
        for ((acc, a), x) in acc.iter_mut().zip(&a).zip(&x) {
            let (ca, cx) = (&a[i * 8..i * 8 + 8], &x[i * 8..i * 8 + 8]);
            for l in 0..8 {
                acc[l] += ca[l] * cx[l];
            }
        }
    }
    let mut out = [0f32; 4];
    for (((o, acc), a), x) in out.iter_mut().zip(&acc).zip(&a).zip(&x) {
        let mut tail = 0f32;
        for i in chunks * 8..len.min(a.len()).min(x.len()) {
            tail += a[i] * x[i];
        }
        *o = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
    }
    out
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
