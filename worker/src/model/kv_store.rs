//! The CPU's KV cache storage: keys and values of every layer in fixed-size blocks addressed by `BlockId`, as IEEE
//! half precision (`f16`, llama.cpp's default) or as 8-bit blocks (`q8`: 32 values share one f16 scale, llama.cpp's
//! `q8_0` cache type), 1.88x the tokens per byte.
//!
//! A value's slot is its offset in a layer's plane, the same for both types; an 8-bit plane keeps its scales apart,
//! one per 32 values (`slot / 32`), so a token's row must be whole blocks: the width of a row of keys
//! (`kv_heads * head_dim`) a multiple of 32, which every released model meets (head sizes 64, 128, 256).
//! Rounding is a pure function of the row either way: to nearest even for f16, and for q8 the scale is the block's
//! largest magnitude / 127 rounded to f16, each value `round(x / scale)`.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::config::LlamaConfig;
use super::kernels::KvPlane;
pub use crate::kv::dtype::KvDtype;
use crate::kv::dtype::Q8_BLOCK;
use crate::kv::pool::BlockId;
use crate::kv::window::{KvLayout, KvSizing};

/// One layer's keys or values.
#[derive(Debug)]
enum Plane {
    /// f16 bits (plain `u16` so a fresh store is zeroed memory the OS maps lazily).
    F16(Vec<u16>),
    /// 8-bit values and one f16 scale (bits) per 32 of them.
    Q8 { q: Vec<i8>, d: Vec<u16> },
    /// 4-bit values, two a byte (the even one in the low nibble), and one f16 scale (bits) per 32 of them.
    Q4 { q: Vec<u8>, d: Vec<u16> },
}

impl Plane {
    fn new(dtype: KvDtype, values: usize) -> Self {
        match dtype {
            KvDtype::F16 => Plane::F16(vec![0; values]),
            KvDtype::Q8 => Plane::Q8 { q: vec![0; values], d: vec![0; values.div_ceil(Q8_BLOCK)] },
            KvDtype::Q4 => Plane::Q4 { q: vec![0; values.div_ceil(2)], d: vec![0; values.div_ceil(Q8_BLOCK)] },
        }
    }

    /// Values it holds.
    fn values(&self) -> usize {
        match self {
            Plane::F16(b) => b.len(),
            Plane::Q8 { q, .. } => q.len(),
            Plane::Q4 { q, .. } => 2 * q.len(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Plane::F16(b) => 2 * b.len(),
            Plane::Q8 { q, d } => q.len() + 2 * d.len(),
            Plane::Q4 { q, d } => q.len() + 2 * d.len(),
        }
    }

    /// Store `row` at `slot`.
    fn write(&mut self, slot: usize, row: &[f32]) {
        match self {
            Plane::F16(b) => b[slot..slot + row.len()].reinterpret_cast_mut::<f16>().convert_from_f32_slice(row),
            Plane::Q8 { q, d } => {
                let (q, d) = (&mut q[slot..slot + row.len()], &mut d[slot / Q8_BLOCK..]);
                for ((x, q), d) in row.chunks(Q8_BLOCK).zip(q.chunks_mut(Q8_BLOCK)).zip(d.iter_mut()) {
                    *d = quantize_q8(x, q);
                }
            }
            Plane::Q4 { q, d } => {
                let (q, d) = (&mut q[slot / 2..(slot + row.len()) / 2], &mut d[slot / Q8_BLOCK..]);
                for ((x, q), d) in row.chunks(Q8_BLOCK).zip(q.chunks_mut(Q8_BLOCK / 2)).zip(d.iter_mut()) {
                    *d = quantize_q4(x, q);
                }
            }
        }
    }

    /// The byte ranges of values `[from, to)` (whole 32-value blocks): the values', then the scales'.
    fn append(&self, from: usize, to: usize, out: &mut Vec<u8>) {
        let scales = |d: &[u16], out: &mut Vec<u8>| {
            d[from / Q8_BLOCK..to / Q8_BLOCK].iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
        };
        match self {
            Plane::F16(b) => b[from..to].iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Plane::Q8 { q, d } => {
                out.extend(q[from..to].iter().map(|&x| x as u8));
                scales(d, out);
            }
            Plane::Q4 { q, d } => {
                out.extend_from_slice(&q[from / 2..to / 2]);
                scales(d, out);
            }
        }
    }

    /// Overwrite values `[from, to)` from `src` as [`Plane::append`] wrote them; returns the bytes read.
    fn load(&mut self, from: usize, to: usize, src: &[u8]) -> usize {
        let u16s = |dst: &mut [u16], src: &[u8]| {
            for (x, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *x = u16::from_le_bytes([b[0], b[1]]);
            }
            2 * dst.len()
        };
        match self {
            Plane::F16(b) => u16s(&mut b[from..to], src),
            Plane::Q8 { q, d } => {
                let n = to - from;
                for (x, &b) in q[from..to].iter_mut().zip(&src[..n]) {
                    *x = b as i8;
                }
                n + u16s(&mut d[from / Q8_BLOCK..to / Q8_BLOCK], &src[n..])
            }
            Plane::Q4 { q, d } => {
                let n = (to - from) / 2;
                q[from / 2..to / 2].copy_from_slice(&src[..n]);
                n + u16s(&mut d[from / Q8_BLOCK..to / Q8_BLOCK], &src[n..])
            }
        }
    }

    fn view(&self) -> KvPlane<'_> {
        match self {
            Plane::F16(b) => KvPlane::F16(b),
            Plane::Q8 { q, d } => KvPlane::Q8 { q, d },
            Plane::Q4 { q, d } => KvPlane::Q4 { q, d },
        }
    }
}

/// One block of up to 32 values to 8 bits: returns the scale's f16 bits (largest magnitude / 127, rounded to f16)
/// and writes each value as `round(x / scale)`, ties away from zero.
pub fn quantize_q8(x: &[f32], q: &mut [i8]) -> u16 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 127.0);
    let inv = if d.to_f32() > 0.0 { 1.0 / d.to_f32() } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    d.to_bits()
}

/// One block of 32 values to 4 bits, as llama.cpp's `q4_0`: the scale is the value of largest magnitude (with its
/// sign) / -8, rounded to f16, and each value `round(x / scale) + 8` clamped to 0..=15, stored two a byte (value
/// `2i` in byte `i`'s low nibble); a value reads back as `(nibble - 8) * scale`. Returns the scale's f16 bits.
pub fn quantize_q4(x: &[f32], q: &mut [u8]) -> u16 {
    let max = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = f16::from_f32(if max == 0.0 { 0.0 } else { max / -8.0 });
    let inv = if d.to_f32() != 0.0 { 1.0 / d.to_f32() } else { 0.0 };
    let nibble = |v: f32| ((v * inv).round() + 8.0).clamp(0.0, 15.0) as u8;
    for (q, pair) in q.iter_mut().zip(x.chunks(2)) {
        *q = nibble(pair[0]) | (pair.get(1).map_or(8, |&v| nibble(v)) << 4);
    }
    d.to_bits()
}

/// Keys and values of every layer, in fixed-size blocks addressed by `BlockId`, as `KvDtype` says. (bfloat16,
/// tried first, keeps too few mantissa bits: the bundled model's greedy answers drifted.)
#[derive(Debug)]
pub struct KvStore {
    block_size: usize,
    kv_dim: usize,
    k: Vec<Plane>,
    v: Vec<Plane>,
}

impl KvStore {
    /// f16 storage for `blocks` blocks of `block_size` tokens in every layer.
    pub fn new(cfg: &LlamaConfig, blocks: usize, block_size: usize) -> Self {
        Self::with_layout(cfg, &KvLayout::full(blocks), block_size)
    }

    /// Storage as `layout` says: its type, and the sliding-window layers' blocks apart when it says so. The
    /// caller checked the type suits the model ([`KvDtype::check`]).
    pub fn with_layout(cfg: &LlamaConfig, layout: &KvLayout, block_size: usize) -> Self {
        let dtype = layout.dtype;
        let per_layer = |li: usize| layout.blocks_of(cfg.is_local(li)) * block_size * cfg.kv_dim();
        KvStore {
            block_size,
            kv_dim: cfg.kv_dim(),
            k: (0..cfg.layers).map(|li| Plane::new(dtype, per_layer(li))).collect(),
            v: (0..cfg.layers).map(|li| Plane::new(dtype, per_layer(li))).collect(),
        }
    }

    /// What sizing a KV budget for `cfg` needs: a block's bytes (of `dtype`) over the full layers and over the
    /// sliding-window layers (keys and values), and the scheduler's bounds.
    pub fn sizing(
        cfg: &LlamaConfig,
        block_size: usize,
        max_running: usize,
        max_item: usize,
        dtype: KvDtype,
    ) -> KvSizing {
        let local = (0..cfg.layers).filter(|&li| cfg.is_local(li)).count();
        let bytes = |layers: usize| 2 * layers * block_size * dtype.bytes(cfg.kv_dim());
        KvSizing {
            full_block_bytes: bytes(cfg.layers - local),
            window: cfg.sliding.filter(|_| local > 0).map(|s| (bytes(local), s.window.max(1))),
            context: cfg.context_length,
            block_size,
            max_running,
            max_item,
            dtype,
        }
    }

    /// Bytes one token's keys and values take across all layers, stored as `dtype`.
    pub fn bytes_per_token(cfg: &LlamaConfig, dtype: KvDtype) -> usize {
        2 * cfg.layers * dtype.bytes(cfg.kv_dim())
    }

    /// Whether keys, queries and values are turned by the Hadamard rotation before the cache rounds them
    /// ([`super::rotation`]): for the 4-bit cache.
    pub fn rotated(&self) -> bool {
        matches!(self.k.first(), Some(Plane::Q4 { .. }))
    }

    /// Bytes the keys and values take.
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(Plane::bytes).sum()
    }

    /// Where position `pos` of a sequence with block table `blocks` lives in every layer's plane.
    pub(crate) fn slot(&self, blocks: &[BlockId], pos: usize) -> usize {
        (blocks[pos / self.block_size] as usize * self.block_size + pos % self.block_size) * self.kv_dim
    }

    /// Store one token's key and value rows (`kv_dim` each) of layer `li` at `slot`.
    pub(crate) fn write(&mut self, li: usize, slot: usize, key: &[f32], value: &[f32]) {
        self.k[li].write(slot, key);
        self.v[li].write(slot, value);
    }

    /// Bytes one block's keys and values take across every layer ([`KvStore::export`]'s length), when every layer
    /// has the same blocks (no sliding-window layers kept apart); `None` otherwise.
    pub fn block_bytes(&self) -> Option<usize> {
        let per = self.block_size * self.kv_dim;
        let blocks = self.k.first().map(|p| p.values() / per)?;
        self.k.iter().all(|p| p.values() == blocks * per).then(|| {
            let mut out = Vec::new();
            for p in self.k.iter().chain(&self.v) {
                p.append(0, per, &mut out);
            }
            out.len()
        })
    }

    /// Block `block`'s keys and values of every layer, as bytes (the lower tiers keep them): each layer's keys,
    /// then its values; each plane's values, then their scales.
    pub fn export(&self, block: BlockId) -> Vec<u8> {
        let per = self.block_size * self.kv_dim;
        let (from, to) = (block as usize * per, (block as usize + 1) * per);
        let mut out = Vec::new();
        for (k, v) in self.k.iter().zip(&self.v) {
            k.append(from, to, &mut out);
            v.append(from, to, &mut out);
        }
        out
    }

    /// Overwrite block `block` with what [`KvStore::export`] gave (of a store of the same model, type and block
    /// size). Panics on a payload of another length: the caller checked it ([`KvStore::block_bytes`]).
    pub fn import(&mut self, block: BlockId, payload: &[u8]) {
        let per = self.block_size * self.kv_dim;
        let (from, to) = (block as usize * per, (block as usize + 1) * per);
        let mut at = 0;
        for (k, v) in self.k.iter_mut().zip(&mut self.v) {
            at += k.load(from, to, &payload[at..]);
            at += v.load(from, to, &payload[at..]);
        }
        assert_eq!(at, payload.len(), "a block payload of another shape");
    }

    /// Layer `li`'s keys and values, for attention.
    pub(crate) fn layer(&self, li: usize) -> (KvPlane<'_>, KvPlane<'_>) {
        (self.k[li].view(), self.v[li].view())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_blocks_hold_values_within_half_a_step_of_their_scale() {
        let x: Vec<f32> = (0..32).map(|i| ((i * 7) % 13) as f32 * 0.37 - 2.0).collect();
        let mut q = [0i8; 32];
        let d = f16::from_bits(quantize_q8(&x, &mut q)).to_f32();
        assert!((d - 2.44 / 127.0).abs() < 1e-4, "scale {d}");
        for (&v, &q) in x.iter().zip(&q) {
            assert!((v - q as f32 * d).abs() <= d / 2.0 + 1e-6, "{v} as {q}");
        }
        // All zeros: scale 0, values 0 (no division by zero).
        assert_eq!(quantize_q8(&[0.0; 32], &mut q), 0);
        assert!(q.iter().all(|&v| v == 0));
    }

    #[test]
    fn q4_blocks_hold_values_within_half_a_step_of_their_scale_as_llama_cpp_rounds_them() {
        let x: Vec<f32> = (0..32).map(|i| ((i * 7) % 13) as f32 * 0.37 - 2.0).collect();
        let mut q = [0u8; 16];
        let d = f16::from_bits(quantize_q4(&x, &mut q)).to_f32();
        // The largest magnitude is 2.44 (positive): scale -0.305, so it reads back as -8 * scale exactly.
        assert!((d + 2.44 / 8.0).abs() < 1e-3, "scale {d}");
        for (i, &v) in x.iter().enumerate() {
            let nib = (q[i / 2] >> (4 * (i % 2))) & 15;
            assert!((v - (f32::from(nib) - 8.0) * d).abs() <= d.abs() / 2.0 + 1e-6, "{v} as {nib}");
        }
        let plane = KvPlane::Q4 { q: &q, d: &[quantize_q4(&x, &mut q.clone())] };
        assert_eq!(plane_value(plane, 5), (f32::from((q[2] >> 4) & 15) - 8.0) * d);
        assert_eq!(quantize_q4(&[0.0; 32], &mut q), 0);
        assert!(q.iter().all(|&v| v == 0x88));
        // 18 bytes per 32 values: 3.56x f16's tokens per byte.
        assert_eq!((KvDtype::Q4.bytes(192), KvDtype::F16.bytes(192)), (108, 384));
        assert!(KvDtype::Q4.check(72).unwrap_err().contains("--kv-dtype q4 needs"));
    }

    fn plane_value(p: KvPlane<'_>, at: usize) -> f32 {
        p.value(at)
    }

    #[test]
    fn q8_takes_34_bytes_per_32_values_and_needs_whole_blocks_per_row() {
        assert_eq!(KvDtype::Q8.bytes(192), 204);
        assert_eq!(KvDtype::F16.bytes(192), 384);
        assert!(KvDtype::Q8.check(192).is_ok());
        assert!(KvDtype::Q8.check(72).unwrap_err().contains("--kv-dtype f16"));
        assert!(KvDtype::F16.check(72).is_ok());
    }

    #[test]
    fn a_block_exported_and_imported_elsewhere_holds_the_same_values_in_every_type() {
        let cfg = LlamaConfig::tiny(2, 2, 1, 32);
        for dtype in [KvDtype::F16, KvDtype::Q8, KvDtype::Q4] {
            let layout = KvLayout::full(3).with_dtype(dtype);
            let (mut a, mut b) = (KvStore::with_layout(&cfg, &layout, 4), KvStore::with_layout(&cfg, &layout, 4));
            let row =
                |t: usize, li: usize| -> Vec<f32> { (0..32).map(|i| (i * 3 + t * 7 + li) as f32 * 0.01).collect() };
            // Block 1 of `a`, positions 4..8, every layer.
            for t in 0..4 {
                for li in 0..2 {
                    a.write(li, a.slot(&[0, 1], 4 + t), &row(t, li), &row(t + 9, li));
                }
            }
            let payload = a.export(1);
            assert_eq!(Some(payload.len()), a.block_bytes(), "{dtype:?}");
            assert_eq!(payload.len(), KvStore::sizing(&cfg, 4, 1, 1, dtype).full_block_bytes, "{dtype:?}");
            // Into block 2 of `b`: the same values read back, and the export of it is the same bytes.
            b.import(2, &payload);
            assert_eq!(b.export(2), payload);
            for li in 0..2 {
                let ((ak, av), (bk, bv)) = (a.layer(li), b.layer(li));
                for i in 0..4 * 32 {
                    assert_eq!(plane_value(ak, 4 * 32 + i), plane_value(bk, 8 * 32 + i), "{dtype:?}");
                    assert_eq!(plane_value(av, 4 * 32 + i), plane_value(bv, 8 * 32 + i), "{dtype:?}");
                }
            }
        }
    }
}
