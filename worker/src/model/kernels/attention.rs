//! Attention of one query row over the paged KV cache (f16, or 8-bit blocks): the reference arithmetic (which the
//! SIMD levels reproduce bit for bit; `mod.rs` chooses among them) and the pieces every level shares.

use half::f16;

use super::math::{exp_f32, hsum, sum_f32};

/// A half-precision value (its bits) as f32 (exact).
#[inline(always)]
pub(super) fn widen(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

/// One layer's keys or values in the cache: offsets into it are slots plus the offset in the row.
#[derive(Clone, Copy, Debug)]
pub enum KvPlane<'a> {
    /// f16 bits.
    F16(&'a [u16]),
    /// 8-bit values, and the f16 bits of one scale per 32 of them.
    Q8 {
        /// The values.
        q: &'a [i8],
        /// The scales.
        d: &'a [u16],
    },
    /// 4-bit values two a byte (value `2i` in byte `i`'s low nibble, each `nibble - 8`), and the f16 bits of one
    /// scale per 32 of them.
    Q4 {
        /// The values.
        q: &'a [u8],
        /// The scales.
        d: &'a [u16],
    },
}

impl KvPlane<'_> {
    /// The value at `at` as f32, exactly: the f16 widened, or the 8-bit integer times its block's scale (at most
    /// 7 + 11 significant bits: the product is exact in f32, so a SIMD level computing it gets the same bits).
    #[inline(always)]
    pub(super) fn get(&self, at: usize) -> f32 {
        match *self {
            KvPlane::F16(b) => widen(b[at]),
            KvPlane::Q8 { q, d } => f32::from(q[at]) * widen(d[at / 32]),
            KvPlane::Q4 { q, d } => (f32::from((q[at / 2] >> (4 * (at % 2))) & 15) - 8.0) * widen(d[at / 32]),
        }
    }

    /// [`KvPlane::get`], for tests and tools outside the kernels.
    pub fn value(&self, at: usize) -> f32 {
        self.get(at)
    }
}

/// Attention scores of one head, in place, to softmax weights: `exp(s - max)` times the reciprocal of their sum.
/// (The maximum is taken in eight lanes, so it vectorises; any order gives the same maximum.)
#[inline(always)]
pub(super) fn softmax_weights(s: &mut [f32]) {
    let mut lanes = [f32::NEG_INFINITY; 8];
    for c in s.chunks_exact(8) {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let rest = s.chunks_exact(8).remainder();
    let max = lanes.iter().chain(rest).copied().fold(f32::NEG_INFINITY, f32::max);
    s.iter_mut().for_each(|v| *v = exp_f32(*v - max));
    let inv = 1.0 / sum_f32(s);
    s.iter_mut().for_each(|v| *v *= inv);
}

/// Head layout of an attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// What the query-key products are multiplied by: `1/sqrt(head_dim)` but for models that say otherwise
    /// (Gemma 3 27B).
    pub scale: f32,
}

impl AttentionShape {
    /// The shape with the usual scale, `1/sqrt(head_dim)`.
    pub fn new(heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        AttentionShape { heads, kv_heads, head_dim, scale: 1.0 / (head_dim as f32).sqrt() }
    }
}

/// The reference attention arithmetic. Per head: each score is the query-key dot product in eight lanes (element
/// `i` into lane `i % 8` by fused multiply-add), summed as [`hsum`], times `1/sqrt(head_dim)`; the scores become
/// [`softmax_weights`]; the output is the weighted sum of values, one fused multiply-add per position in order.
pub(super) fn attention_portable(
    q: &[f32],
    slots: &[usize],
    keys: KvPlane<'_>,
    values: KvPlane<'_>,
    shape: AttentionShape,
    out: &mut [f32],
) {
    let AttentionShape { heads, kv_heads, head_dim: hd, scale } = shape;
    let (group, n) = (heads / kv_heads, slots.len());
    let mut weights = vec![0f32; heads * n];
    for (h, w) in weights.chunks_exact_mut(n.max(1)).enumerate() {
        let (g, qh) = (h / group, &q[h * hd..(h + 1) * hd]);
        for (wp, &slot) in w.iter_mut().zip(slots) {
            let mut lanes = [0f32; 8];
            for (i, &a) in qh.iter().enumerate() {
                lanes[i % 8] = a.mul_add(keys.get(slot + g * hd + i), lanes[i % 8]);
            }
            *wp = hsum(&lanes) * scale;
        }
        softmax_weights(w);
    }
    out.fill(0.0);
    for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
        let g = h / group;
        for (&wp, &slot) in weights[h * n..(h + 1) * n].iter().zip(slots) {
            for (i, o) in oh.iter_mut().enumerate() {
                *o = wp.mul_add(values.get(slot + g * hd + i), *o);
            }
        }
    }
}
