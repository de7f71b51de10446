//! Batched matrix kernels for the CPU: `out[r, c] = x[r, :] · W[c, :]` for every row `r` of a batch.
//!
//! Two properties matter more than peak speed here:
//! - **Weights stream once per step.** The loop runs over weight rows outside and batch rows inside, so a step with
//!   16 sequences reads each weight byte once, not 16 times: decode throughput scales with the batch instead of with
//!   memory bandwidth.
//! - **Batch invariance.** Each output element is computed by the same code in the same order whatever the batch
//!   size, the row's place in the batch, or the thread that runs it; so a sequence gets bit-identical logits alone
//!   or batched, which makes seeded sampling reproducible and the response cache safe.
//!
//! Quantized weights stay quantized in memory (GGUF Q4_1 and Q8_0, the formats of the bundled model). Each
//! activation row is quantized per block of 32 to int8 on its own, and every block product is an exact integer
//! dot product, scaled and accumulated in a fixed order (AVX2 where the CPU has it, portable code otherwise, the
//! same bits either way). Other formats are dequantized to f32 at load and use the f32 kernel. Attention over the
//! f16 KV cache and the `exp` the model needs live here too, under the same rules.

use half::f16;
use rayon::prelude::*;

/// Elements per quantization block.
pub const QK: usize = 32;

/// Parallel tasks per pool thread for one matmul: enough that threads finish together, few enough to amortise
/// scheduling.
const TASKS_PER_THREAD: usize = 4;

/// Output columns of one task never exceed this (keeps a task's weights within L2).
const MAX_COLS_PER_TASK: usize = 256;

/// A weight matrix of `rows` (output features) by `cols` (input features), stored row-major.
#[derive(Clone, Debug)]
pub enum Weight {
    /// GGUF Q4_1: per block of 32, `x = d * q + m` with 4-bit `q`.
    Q4_1 {
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 32).
        cols: usize,
        /// Per-block scales.
        d: Vec<f32>,
        /// Per-block minimums, each row padded with zeros to a multiple of eight blocks ([`padded_blocks`]) so the
        /// minimum term runs eight blocks at a time.
        m: Vec<f32>,
        /// Packed nibbles, 16 bytes per block: low nibbles are elements 0..16, high nibbles 16..32.
        qs: Vec<u8>,
    },
    /// GGUF Q8_0: per block of 32, `x = d * q` with 8-bit `q`.
    Q8_0 {
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 32).
        cols: usize,
        /// Per-block scales.
        d: Vec<f32>,
        /// Quants, 32 per block.
        qs: Vec<i8>,
    },
    /// Plain f32.
    F32 {
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// Row-major values.
        w: Vec<f32>,
    },
}

/// A weight's bytes do not match its declared shape.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{format} weight of {rows}x{cols}: {problem}")]
pub struct WeightError {
    format: &'static str,
    rows: usize,
    cols: usize,
    problem: String,
}

/// Blocks per row rounded up to a multiple of eight: the stride of per-block minimums and activation sums.
fn padded_blocks(cols: usize) -> usize {
    (cols / QK).div_ceil(8) * 8
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Check that `raw` holds exactly the `rows x cols` blocks of a block format of `block_bytes` bytes per 32
/// values; returns the number of blocks.
fn check_blocks(
    format: &'static str,
    rows: usize,
    cols: usize,
    raw: &[u8],
    block_bytes: usize,
) -> Result<usize, WeightError> {
    let err = |problem: String| WeightError { format, rows, cols, problem };
    if cols % QK != 0 {
        return Err(err("input features are not a multiple of 32".into()));
    }
    let blocks = rows * cols / QK;
    if raw.len() != blocks * block_bytes {
        return Err(err(format!("{} bytes, expected {}", raw.len(), blocks * block_bytes)));
    }
    Ok(blocks)
}

impl Weight {
    /// Parse raw GGUF Q4_1 blocks (20 bytes each: f16 d, f16 m, 16 bytes of nibbles).
    pub fn from_q4_1(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        let blocks = check_blocks("Q4_1", rows, cols, raw, 20)?;
        let (bpr, padded) = (cols / QK, padded_blocks(cols));
        let mut d = Vec::with_capacity(blocks);
        let mut m = vec![0f32; rows * padded];
        let mut qs = Vec::with_capacity(blocks * 16);
        for (i, block) in raw.chunks_exact(20).enumerate() {
            d.push(f16_at(block, 0));
            m[(i / bpr) * padded + i % bpr] = f16_at(block, 2);
            qs.extend_from_slice(&block[4..20]);
        }
        Ok(Weight::Q4_1 { rows, cols, d, m, qs })
    }

    /// Parse raw GGUF Q8_0 blocks (34 bytes each: f16 d, 32 signed bytes).
    pub fn from_q8_0(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        let blocks = check_blocks("Q8_0", rows, cols, raw, 34)?;
        let mut d = Vec::with_capacity(blocks);
        let mut qs = Vec::with_capacity(blocks * QK);
        for block in raw.chunks_exact(34) {
            d.push(f16_at(block, 0));
            qs.extend(block[2..34].iter().map(|&b| b as i8));
        }
        Ok(Weight::Q8_0 { rows, cols, d, qs })
    }

    /// Wrap f32 values.
    pub fn from_f32(rows: usize, cols: usize, w: Vec<f32>) -> Result<Weight, WeightError> {
        if w.len() != rows * cols {
            return Err(WeightError { format: "F32", rows, cols, problem: format!("{} values", w.len()) });
        }
        Ok(Weight::F32 { rows, cols, w })
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        match self {
            Weight::Q4_1 { rows, .. } | Weight::Q8_0 { rows, .. } | Weight::F32 { rows, .. } => *rows,
        }
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        match self {
            Weight::Q4_1 { cols, .. } | Weight::Q8_0 { cols, .. } | Weight::F32 { cols, .. } => *cols,
        }
    }

    /// Row `r` as f32 (an embedding lookup).
    pub fn row(&self, r: usize, out: &mut [f32]) {
        match self {
            Weight::Q4_1 { cols, d, m, qs, .. } => {
                let bpr = cols / QK;
                for b in 0..bpr {
                    let blk = r * bpr + b;
                    let min = m[r * padded_blocks(*cols) + b];
                    let q = &qs[blk * 16..blk * 16 + 16];
                    for j in 0..16 {
                        out[b * QK + j] = d[blk] * f32::from(q[j] & 0x0f) + min;
                        out[b * QK + j + 16] = d[blk] * f32::from(q[j] >> 4) + min;
                    }
                }
            }
            Weight::Q8_0 { cols, d, qs, .. } => {
                let bpr = cols / QK;
                for b in 0..bpr {
                    let blk = r * bpr + b;
                    for j in 0..QK {
                        out[b * QK + j] = d[blk] * f32::from(qs[blk * QK + j]);
                    }
                }
            }
            Weight::F32 { cols, w, .. } => out.copy_from_slice(&w[r * cols..(r + 1) * cols]),
        }
    }

    /// `out[r * rows + c] = x[r * cols ..] · W[c]` for `n` rows of `x`.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) {
        self.matmul_input(&Input::new(x, n), out);
    }

    /// [`Weight::matmul`] over a prepared input, so several weights that read the same activations (Q, K and V;
    /// gate and up) quantize them once.
    pub fn matmul_input(&self, input: &Input<'_>, out: &mut [f32]) {
        let (rows, cols, n, x) = (self.rows(), self.cols(), input.n, input.x);
        assert_eq!(x.len(), n * cols, "input shape");
        assert_eq!(out.len(), n * rows, "output shape");
        if n == 0 {
            return;
        }
        // Each task fills a range of output columns for every batch row and returns them row-major; they are
        // copied into place afterwards, so tasks never share output memory.
        let xq = match self {
            Weight::F32 { .. } => None,
            Weight::Q4_1 { .. } | Weight::Q8_0 { .. } => {
                Some(input.quantized.get_or_init(|| QuantizedRows::quantize(x, cols)))
            }
        };
        let results: Vec<(usize, Vec<f32>)> =
            column_tasks(rows).map(|(c0, c1)| (c0, columns(self, x, xq, n, c0, c1))).collect();
        for (c0, vals) in results {
            let width = vals.len() / n;
            for (r, chunk) in vals.chunks_exact(width).enumerate() {
                out[r * rows + c0..r * rows + c0 + width].copy_from_slice(chunk);
            }
        }
    }
}

/// Activations for one or more matmuls: `n` rows of f32, quantized for the integer kernels on first use.
#[derive(Debug)]
pub struct Input<'a> {
    x: &'a [f32],
    n: usize,
    quantized: std::sync::OnceLock<QuantizedRows>,
}

impl<'a> Input<'a> {
    /// `n` rows of equal width.
    pub fn new(x: &'a [f32], n: usize) -> Self {
        Input { x, n, quantized: std::sync::OnceLock::new() }
    }
}

/// Column ranges for parallel tasks, run on rayon's pool, results in order. Ranges are split evenly over the
/// pool's threads (a 192-column matmul on two threads is 8 tasks of 24, not 3 of 64 with one thread idle for a
/// third of it). Where the boundaries fall never changes a result: each output is computed on its own.
fn column_tasks(rows: usize) -> impl IndexedParallelIterator<Item = (usize, usize)> {
    let per = rows.div_ceil(rayon::current_num_threads() * TASKS_PER_THREAD).clamp(8, MAX_COLS_PER_TASK);
    (0..rows.div_ceil(per)).into_par_iter().map(move |t| (t * per, ((t + 1) * per).min(rows)))
}

/// Quantize one row group (up to [`ROW_GROUP`] rows of `x`) into its interleaved blocks and its rows' padded
/// block sums.
#[inline(always)]
fn quantize_group(x: &[f32], cols: usize, blocks: &mut [XBlock], sums: &mut [f32]) {
    let (rows, bpr) = (x.len() / cols, cols / QK);
    let padded = sums.len() / rows.max(1);
    // Plain loops over fixed-size arrays with eight-lane reductions in a fixed order: they vectorise.
    for r in 0..rows {
        for b in 0..bpr {
            let block: &[f32; QK] = x[r * cols + b * QK..][..QK].try_into().expect("a block is 32 values");
            let mut amax = [0f32; 8];
            for c in 0..QK / 8 {
                for l in 0..8 {
                    amax[l] = amax[l].max(block[c * 8 + l].abs());
                }
            }
            let amax = amax.iter().fold(0f32, |a, &v| a.max(v));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut q = [0i8; QK];
            for (qv, &v) in q.iter_mut().zip(block) {
                // Round half away from zero without a libm call; |v * inv| <= 127 by construction.
                let t = v * inv;
                *qv = (t + 0.5f32.copysign(t)) as i8;
            }
            sums[r * padded + b] = sum_f32(block);
            blocks[b * rows + r] = XBlock { q, d: [d; 8] };
        }
    }
}

/// One block of 32 activations quantized to signed bytes, as the integer kernels consume them: `x ≈ d * q`, with
/// the scale stored eight times over so the SIMD kernel multiplies by it straight from memory. One cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct XBlock {
    q: [i8; QK],
    d: [f32; 8],
}

/// Batch rows the SIMD kernel runs together; the quantized activations are laid out in groups of this many rows.
const ROW_GROUP: usize = 8;

/// A batch of activations quantized block by block, with each block's exact f32 sum (row-major, rows padded with
/// zeros to [`padded_blocks`]) for the Q4_1 minimum term. Blocks are stored in groups of [`ROW_GROUP`] rows,
/// interleaved block by block (`[group][block][row in group]`), so a kernel sweeping a group reads one sequential
/// stream. Each row is quantized on its own, so a row's values never depend on the rest of the batch; only where
/// they are stored does.
#[derive(Debug)]
struct QuantizedRows {
    blocks: Vec<XBlock>,
    sums: Vec<f32>,
    rows: usize,
    blocks_per_row: usize,
}

impl QuantizedRows {
    /// Quantize `x` (rows of `cols` values), one row group per parallel task, with AVX2 code where the CPU has
    /// it (the same arithmetic either way).
    fn quantize(x: &[f32], cols: usize) -> QuantizedRows {
        debug_assert_eq!(cols % QK, 0);
        let (rows, bpr, padded) = (x.len() / cols, cols / QK, padded_blocks(cols));
        let mut out = QuantizedRows {
            blocks: vec![XBlock { q: [0; QK], d: [0.0; 8] }; rows * bpr],
            sums: vec![0f32; rows * padded],
            rows,
            blocks_per_row: bpr,
        };
        out.blocks
            .par_chunks_mut(ROW_GROUP * bpr)
            .zip(out.sums.par_chunks_mut(ROW_GROUP * padded))
            .zip(x.par_chunks(ROW_GROUP * cols))
            .for_each(|((blocks, sums), x)| {
                #[cfg(target_arch = "x86_64")]
                if simd::available() {
                    return simd::quantize_group(x, cols, blocks, sums);
                }
                quantize_group(x, cols, blocks, sums);
            });
        out
    }

    /// Where block `b` of row `r` is stored.
    #[inline(always)]
    fn index(&self, r: usize, b: usize) -> usize {
        let group = r / ROW_GROUP;
        let in_group = (self.rows - group * ROW_GROUP).min(ROW_GROUP);
        group * ROW_GROUP * self.blocks_per_row + b * in_group + r % ROW_GROUP
    }

    /// The blocks of the group starting at row `r` (a multiple of [`ROW_GROUP`]) holding `len` rows.
    #[inline(always)]
    fn group(&self, r: usize, len: usize) -> &[XBlock] {
        &self.blocks[r * self.blocks_per_row..(r + len) * self.blocks_per_row]
    }
}

/// Output columns `c0..c1` for all `n` rows, row-major. Quantized weights run the integer kernel (AVX2 with FMA
/// where the CPU has it, portable code otherwise: both compute the same exact integer lane sums and the same fused
/// multiply-adds in the same order, so results are identical on every machine); f32 weights run the f32 kernel.
fn columns(weight: &Weight, x: &[f32], xq: Option<&QuantizedRows>, n: usize, c0: usize, c1: usize) -> Vec<f32> {
    match xq {
        None => columns_f32(weight, x, n, c0, c1),
        Some(xq) => {
            #[cfg(target_arch = "x86_64")]
            if simd::available() {
                return simd::columns_int8(weight, xq, n, c0, c1);
            }
            columns_int8(weight, xq, n, c0, c1)
        }
    }
}

/// Per weight block, eight lanes of exact integer sums: lane `l` sums elements `4l..4l+4` of the block's
/// weight-quant × activation-quant products. (The SIMD kernel's madd lanes hold the same sums.)
#[inline(always)]
fn lane_sums(w: &[i32; QK], xq: &[i8]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (l, lane) in lanes.iter_mut().enumerate() {
        for k in 4 * l..4 * l + 4 {
            *lane += w[k] * i32::from(xq[k]);
        }
    }
    lanes
}

/// Integer block quants of row `c`, block `b`, and the block's scale.
#[inline(always)]
fn int_block(weight: &Weight, c: usize, b: usize, w: &mut [i32; QK]) -> f32 {
    match weight {
        Weight::Q4_1 { cols, d, qs, .. } => {
            let blk = c * (cols / QK) + b;
            let q = &qs[blk * 16..blk * 16 + 16];
            for j in 0..16 {
                w[j] = i32::from(q[j] & 0x0f);
                w[j + 16] = i32::from(q[j] >> 4);
            }
            d[blk]
        }
        Weight::Q8_0 { cols, d, qs, .. } => {
            let blk = c * (cols / QK) + b;
            for (wv, &q) in w.iter_mut().zip(&qs[blk * QK..blk * QK + QK]) {
                *wv = i32::from(q);
            }
            d[blk]
        }
        Weight::F32 { .. } => unreachable!("f32 weights use the f32 kernel"),
    }
}

/// Sum of eight lanes in a fixed tree order (the order the SIMD kernel's horizontal adds produce).
#[inline(always)]
fn hsum(a: &[f32; 8]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// The portable integer kernel; the reference the SIMD kernel must match bit for bit.
fn columns_int8(weight: &Weight, xq: &QuantizedRows, n: usize, c0: usize, c1: usize) -> Vec<f32> {
    let blocks = weight.cols() / QK;
    let (width, padded) = (c1 - c0, padded_blocks(weight.cols()));
    let mut vals = vec![0f32; width * n];
    let mut w = [0i32; QK];
    for c in c0..c1 {
        for r in 0..n {
            // First the Q4_1 minimum term, `Σ_b m[c, b] * sum(x[r, block b])`, eight blocks per lane step; then
            // the blocks' scaled integer dot products into the same lanes.
            let mut acc = [0f32; 8];
            if let Weight::Q4_1 { m, .. } = weight {
                let (m, s) = (&m[c * padded..(c + 1) * padded], &xq.sums[r * padded..(r + 1) * padded]);
                for (m8, s8) in m.chunks_exact(8).zip(s.chunks_exact(8)) {
                    for l in 0..8 {
                        acc[l] = m8[l].mul_add(s8[l], acc[l]);
                    }
                }
            }
            for b in 0..blocks {
                let x = &xq.blocks[xq.index(r, b)];
                let dw = int_block(weight, c, b, &mut w);
                let lanes = lane_sums(&w, &x.q);
                for l in 0..8 {
                    acc[l] = (lanes[l] as f32).mul_add(dw * x.d[l], acc[l]);
                }
            }
            vals[r * width + c - c0] = hsum(&acc);
        }
    }
    vals
}

/// The f32 kernel (plain f32 weights): eight lanes per batch row in a fixed order.
fn columns_f32(weight: &Weight, x: &[f32], n: usize, c0: usize, c1: usize) -> Vec<f32> {
    let Weight::F32 { w, cols, .. } = weight else { unreachable!("quantized weights use the integer kernel") };
    let cols = *cols;
    let width = c1 - c0;
    let mut vals = vec![0f32; width * n];
    for c in c0..c1 {
        for r in 0..n {
            vals[r * width + c - c0] = dot_f32(&w[c * cols..(c + 1) * cols], &x[r * cols..(r + 1) * cols]);
        }
    }
    vals
}

/// The AVX2 code: the integer kernel, attention over the f16 KV cache and activation quantization. Nothing else
/// in the worker needs `unsafe`: only the unaligned loads and stores here, and entering `#[target_feature]`
/// functions once `available()` has checked the CPU, do.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd {
    use super::{AttentionShape, QK, QuantizedRows, Weight, XBlock};
    use std::arch::x86_64::*;

    /// Whether this CPU runs the SIMD kernels (AVX2, FMA, and F16C for the f16 KV cache).
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }

    pub(super) fn run<T>(f: impl FnOnce() -> T) -> T {
        // SAFETY: the caller checked `available()`, so the CPU has AVX2, FMA and F16C.
        unsafe { run_avx2(f) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn run_avx2<T>(f: impl FnOnce() -> T) -> T {
        f()
    }

    pub(super) fn attention(
        q: &[f32],
        slots: &[usize],
        keys: &[u16],
        values: &[u16],
        shape: AttentionShape,
        out: &mut [f32],
    ) {
        // SAFETY: the caller checked `available()`, so the CPU has AVX2, FMA and F16C.
        unsafe { attention_avx2(q, slots, keys, values, shape, out) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn attention_avx2(
        q: &[f32],
        slots: &[usize],
        keys: &[u16],
        values: &[u16],
        shape: AttentionShape,
        out: &mut [f32],
    ) {
        super::attention_with(q, slots, keys, values, shape, out, &Avx2);
    }

    /// [`super::KvMath`] with explicit vectors (F16C conversions).
    struct Avx2;

    impl super::KvMath for Avx2 {
        #[inline(always)]
        fn dot(&self, a: &[f32], b: &[u16]) -> f32 {
            // SAFETY: only constructed inside `attention_avx2`, which runs when `available()` said the CPU has
            // AVX2, FMA and F16C.
            unsafe { dot_f16(a, b) }
        }

        #[inline(always)]
        fn axpy(&self, o: &mut [f32], w: f32, b: &[u16]) {
            // SAFETY: as for `dot`.
            unsafe { axpy_f16(o, w, b) }
        }

        #[inline(always)]
        fn dot_heads(&self, q: &[f32], b: &[u16], out: &mut [f32]) {
            for (qs, os) in q.chunks(4 * b.len()).zip(out.chunks_mut(4)) {
                // SAFETY: as for `dot`.
                unsafe { dot_heads_f16(qs, b, os) }
            }
        }

        #[inline(always)]
        fn axpy_heads(&self, o: &mut [f32], w: &[f32], b: &[u16]) {
            for (os, ws) in o.chunks_mut(4 * b.len()).zip(w.chunks(4)) {
                // SAFETY: as for `dot`.
                unsafe { axpy_heads_f16(os, ws, b) }
            }
        }
    }

    /// Up to four heads' `dot_f16` with one key: each 8-value chunk of the key is widened once. Per head, the same
    /// lanes, operations and order as `dot_f16`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn dot_heads_f16(q: &[f32], b: &[u16], out: &mut [f32]) {
        let (hd, heads) = (b.len(), out.len().min(4));
        let mut acc = [_mm256_setzero_ps(); 4];
        for k in 0..hd / 8 {
            let kb = load8h(&b[8 * k..]);
            for (h, a) in acc.iter_mut().enumerate().take(heads) {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(load8f(&q[h * hd + 8 * k..]), kb));
            }
        }
        for (h, o) in out.iter_mut().enumerate().take(heads) {
            let mut tail = 0f32;
            for i in hd / 8 * 8..hd {
                tail += q[h * hd + i] * super::widen(b[i]);
            }
            let pairs = _mm256_hadd_ps(acc[h], acc[h]);
            let quads = _mm256_hadd_ps(pairs, pairs);
            let sum = _mm_add_ss(_mm256_castps256_ps128(quads), _mm256_extractf128_ps::<1>(quads));
            *o = _mm_cvtss_f32(sum) + tail;
        }
    }

    /// Up to four heads' `axpy_f16` with one value: each 8-value chunk widened once; per head the same operations.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn axpy_heads_f16(o: &mut [f32], w: &[f32], b: &[u16]) {
        let hd = b.len();
        let heads = w.len().min(o.len() / hd.max(1));
        let n = hd / 8 * 8;
        for k in 0..n / 8 {
            let vb = load8h(&b[8 * k..]);
            for (h, &wh) in w.iter().enumerate().take(heads) {
                let co = &mut o[h * hd + 8 * k..h * hd + 8 * k + 8];
                let sum = _mm256_add_ps(load8f(co), _mm256_mul_ps(_mm256_set1_ps(wh), vb));
                // SAFETY: `co` is 8 writable f32s; the store is unaligned.
                unsafe { _mm256_storeu_ps(co.as_mut_ptr(), sum) };
            }
        }
        for (h, &wh) in w.iter().enumerate().take(heads) {
            for i in n..hd {
                o[h * hd + i] += wh * super::widen(b[i]);
            }
        }
    }

    /// Eight f16 values as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn load8h(b: &[u16]) -> __m256 {
        let b = &b[..8];
        // SAFETY: `b` holds 8 readable u16s (16 bytes); the load is unaligned.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn dot_f16(a: &[f32], b: &[u16]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
            acc = _mm256_add_ps(acc, _mm256_mul_ps(load8f(ca), load8h(cb)));
        }
        let mut tail = 0f32;
        for i in a.len() / 8 * 8..a.len().min(b.len()) {
            tail += a[i] * super::widen(b[i]);
        }
        // ((0+1)+(2+3)) + ((4+5)+(6+7)), as `super::hsum`.
        let pairs = _mm256_hadd_ps(acc, acc);
        let quads = _mm256_hadd_ps(pairs, pairs);
        let sum = _mm_add_ss(_mm256_castps256_ps128(quads), _mm256_extractf128_ps::<1>(quads));
        _mm_cvtss_f32(sum) + tail
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn axpy_f16(o: &mut [f32], w: f32, b: &[u16]) {
        let wv = _mm256_set1_ps(w);
        let n = o.len().min(b.len()) / 8 * 8;
        for (co, cb) in o[..n].chunks_exact_mut(8).zip(b.chunks_exact(8)) {
            let sum = _mm256_add_ps(load8f(co), _mm256_mul_ps(wv, load8h(cb)));
            // SAFETY: `co` is 8 writable f32s; the store is unaligned.
            unsafe { _mm256_storeu_ps(co.as_mut_ptr(), sum) };
        }
        for (oi, &bi) in o[n..].iter_mut().zip(&b[n..]) {
            *oi += w * super::widen(bi);
        }
    }

    pub(super) fn quantize_group(x: &[f32], cols: usize, blocks: &mut [XBlock], sums: &mut [f32]) {
        // SAFETY: the caller checked `available()`, so the CPU has AVX2, FMA and F16C.
        unsafe { quantize_group_avx2(x, cols, blocks, sums) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn quantize_group_avx2(x: &[f32], cols: usize, blocks: &mut [XBlock], sums: &mut [f32]) {
        super::quantize_group(x, cols, blocks, sums);
    }

    pub(super) fn columns_int8(weight: &Weight, xq: &QuantizedRows, n: usize, c0: usize, c1: usize) -> Vec<f32> {
        // SAFETY: the caller checked `available()`, so the CPU has AVX2, FMA and F16C.
        unsafe { columns_avx2(weight, xq, n, c0, c1) }
    }

    /// 32 bytes as a vector. The slice index bounds-checks the read.
    #[inline(always)]
    fn load32(bytes: &[i8]) -> __m256i {
        let bytes = &bytes[..32];
        // SAFETY: `bytes` holds 32 readable bytes and the load is unaligned.
        unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
    }

    /// Eight f32s as a vector. The slice index bounds-checks the read.
    #[inline(always)]
    fn load8f(values: &[f32]) -> __m256 {
        let values = &values[..8];
        // SAFETY: `values` holds 8 readable f32s and the load is unaligned.
        unsafe { _mm256_loadu_ps(values.as_ptr()) }
    }

    /// 16 bytes as a vector. The slice index bounds-checks the read.
    #[inline(always)]
    fn load16(bytes: &[u8]) -> __m128i {
        let bytes = &bytes[..16];
        // SAFETY: `bytes` holds 16 readable bytes and the load is unaligned.
        unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn columns_avx2(weight: &Weight, xq: &QuantizedRows, n: usize, c0: usize, c1: usize) -> Vec<f32> {
        let width = c1 - c0;
        let mut vals = vec![0f32; width * n];
        // A group of batch rows at a time (their activations stay in L1) sweeps the task's columns (whose weights stay
        // in L2).
        let mut r = 0;
        while r < n {
            let tile = (n - r).min(super::ROW_GROUP);
            for c in c0..c1 {
                let out = &mut vals[r * width + c - c0..];
                match tile {
                    8 => rows::<8>(weight, xq, c, r, out, width),
                    7 => rows::<7>(weight, xq, c, r, out, width),
                    6 => rows::<6>(weight, xq, c, r, out, width),
                    5 => rows::<5>(weight, xq, c, r, out, width),
                    4 => rows::<4>(weight, xq, c, r, out, width),
                    3 => rows::<3>(weight, xq, c, r, out, width),
                    2 => rows::<2>(weight, xq, c, r, out, width),
                    _ => rows::<1>(weight, xq, c, r, out, width),
                }
            }
            r += tile;
        }
        vals
    }

    /// Output column `c` for batch rows `r..r + R` (written to `out[i * stride]`), accumulators held in registers
    /// across the whole row of blocks. Every row runs the same operations in the same order whatever `R` is, so
    /// tiling never changes a result.
    #[target_feature(enable = "avx2,fma")]
    fn rows<const R: usize>(weight: &Weight, xq: &QuantizedRows, c: usize, r: usize, out: &mut [f32], stride: usize) {
        let blocks = weight.cols() / QK;
        let ones = _mm256_set1_epi16(1);
        let low4 = _mm_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); R];
        let xt = xq.group(r, R);
        // First the Q4_1 minimum term, `Σ_b m[c, b] * sum(x[r, block b])`, eight blocks at a time, then the blocks.
        if let Weight::Q4_1 { m, .. } = weight {
            let padded = super::padded_blocks(weight.cols());
            let m = &m[c * padded..(c + 1) * padded];
            let sums = &xq.sums[r * padded..(r + R) * padded];
            for k in (0..padded).step_by(8) {
                let m8 = load8f(&m[k..]);
                for i in 0..R {
                    acc[i] = _mm256_fmadd_ps(m8, load8f(&sums[i * padded + k..]), acc[i]);
                }
            }
        }
        match weight {
            Weight::Q4_1 { d, qs, .. } => {
                let d = &d[c * blocks..(c + 1) * blocks];
                let qs = &qs[c * blocks * 16..(c + 1) * blocks * 16];
                // Zipped iterators: no index arithmetic or bounds checks inside the loop.
                for ((q, &dv), xg) in qs.chunks_exact(16).zip(d).zip(xt.chunks_exact(R)) {
                    let q = load16(q);
                    let lo = _mm_and_si128(q, low4);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), low4);
                    let w = _mm256_set_m128i(hi, lo);
                    let dw = _mm256_set1_ps(dv);
                    for (i, x) in xg.iter().enumerate() {
                        // Products of 4-bit by signed 8-bit quants fit i16; lane l holds elements 4l..4l+4 as i32.
                        let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(w, load32(&x.q)), ones);
                        let scale = _mm256_mul_ps(dw, load8f(&x.d));
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc[i]);
                    }
                }
            }
            Weight::Q8_0 { d, qs, .. } => {
                let d = &d[c * blocks..(c + 1) * blocks];
                let qs = &qs[c * blocks * QK..(c + 1) * blocks * QK];
                for ((q, &dv), xg) in qs.chunks_exact(QK).zip(d).zip(xt.chunks_exact(R)) {
                    let q = load32(q);
                    // maddubs takes unsigned bytes first: |w| times x with w's sign moved onto x.
                    let w = _mm256_sign_epi8(q, q);
                    let dw = _mm256_set1_ps(dv);
                    for (i, x) in xg.iter().enumerate() {
                        let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_sign_epi8(load32(&x.q), q)), ones);
                        let scale = _mm256_mul_ps(dw, load8f(&x.d));
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc[i]);
                    }
                }
            }
            Weight::F32 { .. } => unreachable!("f32 weights use the f32 kernel"),
        }
        // Horizontal sums of up to four rows at once: lane order ((0+1)+(2+3)) + ((4+5)+(6+7)), as `hsum`.
        let zero = _mm256_setzero_ps();
        let lane = |i: usize| if i < R { acc[i] } else { zero };
        for base in (0..R).step_by(4) {
            let quad = _mm256_hadd_ps(
                _mm256_hadd_ps(lane(base), lane(base + 1)),
                _mm256_hadd_ps(lane(base + 2), lane(base + 3)),
            );
            let sums = _mm_add_ps(_mm256_castps256_ps128(quad), _mm256_extractf128_ps::<1>(quad));
            let mut four = [0f32; 4];
            // SAFETY: `four` is 4 writable f32s and the store is unaligned.
            unsafe { _mm_storeu_ps(four.as_mut_ptr(), sums) };
            for (i, v) in four.iter().take(R - base).enumerate() {
                out[(base + i) * stride] = *v;
            }
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

/// Run `f` compiled for AVX2 where the CPU has it (the same IEEE operations either way, as Rust never fuses a
/// multiply and an add on its own; only the vector width changes). `f` and what it calls should be `#[inline]`.
#[inline(always)]
pub fn with_simd<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        return simd::run(f);
    }
    f()
}

/// A half-precision value (its bits) as f32 (exact).
#[inline(always)]
fn widen(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

/// The two operations attention does on the f16 KV cache. The portable and the SIMD implementations compute the
/// same lanes in the same order with the same IEEE operations (f16 to f32 is exact; no fused multiply-add), so
/// they agree bit for bit.
trait KvMath {
    /// `a · b` with eight accumulators (lane `l` takes elements `l, l+8, ...`), summed as [`hsum`], plus the tail.
    fn dot(&self, a: &[f32], b: &[u16]) -> f32;
    /// `o[i] += w * b[i]`.
    fn axpy(&self, o: &mut [f32], w: f32, b: &[u16]);

    /// [`KvMath::dot`] of each head's query (consecutive in `q`, `b.len()` values each) with the same key `b`,
    /// into `out` (grouped-query heads share a key; a SIMD implementation widens it once for all of them).
    fn dot_heads(&self, q: &[f32], b: &[u16], out: &mut [f32]) {
        for (qh, o) in q.chunks_exact(b.len()).zip(out) {
            *o = self.dot(qh, b);
        }
    }

    /// [`KvMath::axpy`] of the same value `b` into each head's output (consecutive in `o`) with that head's weight.
    fn axpy_heads(&self, o: &mut [f32], w: &[f32], b: &[u16]) {
        for (oh, &wh) in o.chunks_exact_mut(b.len()).zip(w) {
            self.axpy(oh, wh, b);
        }
    }
}

/// Portable [`KvMath`].
struct Portable;

impl KvMath for Portable {
    #[inline(always)]
    fn dot(&self, a: &[f32], b: &[u16]) -> f32 {
        let mut acc = [0f32; 8];
        for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
            for l in 0..8 {
                acc[l] += ca[l] * widen(cb[l]);
            }
        }
        let mut tail = 0f32;
        for i in a.len() / 8 * 8..a.len().min(b.len()) {
            tail += a[i] * widen(b[i]);
        }
        hsum(&acc) + tail
    }

    #[inline(always)]
    fn axpy(&self, o: &mut [f32], w: f32, b: &[u16]) {
        for (oi, &bi) in o.iter_mut().zip(b) {
            *oi += w * widen(bi);
        }
    }
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
}

/// Attention of one query row (all heads, `q` is `heads * head_dim`) over the positions whose keys and values
/// start at `slots` in one layer's KV storage (f16 bits; each slot holds `kv_heads * head_dim` values). Each
/// position's keys and values are read once for all heads (grouped-query heads share them); the softmax and the
/// weighted sum of values run in fixed orders that depend only on this row, never on the batch.
pub fn attention(q: &[f32], slots: &[usize], keys: &[u16], values: &[u16], shape: AttentionShape, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        return simd::attention(q, slots, keys, values, shape, out);
    }
    attention_with(q, slots, keys, values, shape, out, &Portable);
}

/// The attention arithmetic over a [`KvMath`].
#[inline(always)]
fn attention_with(
    q: &[f32],
    slots: &[usize],
    keys: &[u16],
    values: &[u16],
    shape: AttentionShape,
    out: &mut [f32],
    kv: &impl KvMath,
) {
    let AttentionShape { heads, kv_heads, head_dim: hd } = shape;
    let (group, kvd, n) = (heads / kv_heads, kv_heads * hd, slots.len());
    let scale = 1.0 / (hd as f32).sqrt();
    // Positions outer, heads inner: each position's keys and values (all KV heads, contiguous) are read once.
    // scores[h * n + p]: head h, position p.
    let mut scores = vec![0f32; heads * n];
    let mut dots = vec![0f32; group];
    for (p, &slot) in slots.iter().enumerate() {
        let key = &keys[slot..slot + kvd];
        for (g, qg) in q.chunks_exact(group * hd).enumerate() {
            kv.dot_heads(qg, &key[g * hd..(g + 1) * hd], &mut dots);
            for (i, d) in dots.iter().enumerate() {
                scores[(g * group + i) * n + p] = d * scale;
            }
        }
    }
    let mut inv = vec![0f32; heads];
    for (s, inv) in scores.chunks_exact_mut(n.max(1)).zip(&mut inv) {
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        s.iter_mut().for_each(|v| *v = exp_f32(*v - max));
        *inv = 1.0 / sum_f32(s);
    }
    out.fill(0.0);
    let mut weights = vec![0f32; group];
    for (p, &slot) in slots.iter().enumerate() {
        let value = &values[slot..slot + kvd];
        for (g, og) in out.chunks_exact_mut(group * hd).enumerate() {
            for (i, w) in weights.iter_mut().enumerate() {
                let h = g * group + i;
                *w = scores[h * n + p] * inv[h];
            }
            kv.axpy_heads(og, &weights, &value[g * hd..(g + 1) * hd]);
        }
    }
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
    hsum(&acc) + a.chunks_exact(8).remainder().iter().sum::<f32>()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn q4_1_raw(values: &[f32]) -> Vec<u8> {
        let mut raw = Vec::new();
        for block in values.chunks(QK) {
            let min = block.iter().copied().fold(f32::INFINITY, f32::min);
            let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let d = (max - min) / 15.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            raw.extend(f16::from_f32(d).to_le_bytes());
            raw.extend(f16::from_f32(min).to_le_bytes());
            for j in 0..16 {
                let lo = ((block[j] - min) * inv).round().clamp(0.0, 15.0) as u8;
                let hi = ((block[j + 16] - min) * inv).round().clamp(0.0, 15.0) as u8;
                raw.push(lo | (hi << 4));
            }
        }
        raw
    }

    #[test]
    fn quantized_matmul_matches_dequantized_f32() {
        let (rows, cols, n) = (70, 64, 5);
        let mut seed = 1;
        let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut seed)).collect();
        let q = Weight::from_q4_1(rows, cols, &q4_1_raw(&w)).unwrap();
        let mut deq = vec![0f32; rows * cols];
        for r in 0..rows {
            q.row(r, &mut deq[r * cols..(r + 1) * cols]);
        }
        let f = Weight::from_f32(rows, cols, deq).unwrap();
        let mut a = vec![0f32; n * rows];
        let mut b = vec![0f32; n * rows];
        q.matmul(&x, n, &mut a);
        f.matmul(&x, n, &mut b);
        for (u, v) in a.iter().zip(&b) {
            assert!((u - v).abs() < 0.05 * (1.0 + v.abs()), "{u} vs {v}");
        }
    }

    #[test]
    fn every_kernel_is_batch_invariant() {
        let (rows, cols) = (130, 96);
        let mut seed = 7;
        let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..17 * cols).map(|_| lcg(&mut seed)).collect();
        let weights = [
            Weight::from_f32(rows, cols, w.clone()).unwrap(),
            Weight::from_q4_1(rows, cols, &q4_1_raw(&w)).unwrap(),
            Weight::from_q8_0(rows, cols, &q8_0_raw(&w)).unwrap(),
        ];
        for weight in &weights {
            let mut batched = vec![0f32; 17 * rows];
            weight.matmul(&x, 17, &mut batched);
            for r in [0, 5, 16] {
                let mut alone = vec![0f32; rows];
                weight.matmul(&x[r * cols..(r + 1) * cols], 1, &mut alone);
                assert_eq!(alone, batched[r * rows..(r + 1) * rows], "row {r} differs alone vs batched");
            }
        }
    }

    fn q8_0_raw(values: &[f32]) -> Vec<u8> {
        let mut raw = Vec::new();
        for block in values.chunks(QK) {
            let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
            raw.extend(f16::from_f32(amax / 127.0).to_le_bytes());
            raw.extend(block.iter().map(|v| ((v / (amax / 127.0)).round() as i8) as u8));
        }
        raw
    }

    #[test]
    fn simd_and_portable_kernels_agree_bit_for_bit() {
        let (rows, cols) = (37, 288);
        let mut seed = 11;
        let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
        for weight in [
            Weight::from_q4_1(rows, cols, &q4_1_raw(&w)).unwrap(),
            Weight::from_q8_0(rows, cols, &q8_0_raw(&w)).unwrap(),
        ] {
            for n in [1, 3, 4, 9] {
                let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut seed) * 3.0).collect();
                let xq = QuantizedRows::quantize(&x, cols);
                assert_eq!(columns(&weight, &x, Some(&xq), n, 0, rows), columns_int8(&weight, &xq, n, 0, rows));
                // The portable quantizer, group by group, gives the same bytes.
                let bpr = cols / QK;
                for (g, xg) in x.chunks(ROW_GROUP * cols).enumerate() {
                    let rows_here = xg.len() / cols;
                    let mut blocks = vec![XBlock { q: [0; QK], d: [0.0; 8] }; rows_here * bpr];
                    let mut sums = vec![0f32; rows_here * padded_blocks(cols)];
                    quantize_group(xg, cols, &mut blocks, &mut sums);
                    let at = g * ROW_GROUP * bpr;
                    assert!(blocks.iter().zip(&xq.blocks[at..]).all(|(a, b)| a.q == b.q && a.d == b.d));
                    assert_eq!(sums[..], xq.sums[g * ROW_GROUP * padded_blocks(cols)..][..sums.len()]);
                }
            }
        }
        // Groups of 3 (with a tail inside each head), 5 (more than the SIMD path's 4 heads at a time) and 1.
        for (heads, kv_heads, head_dim) in [(6, 2, 20), (10, 2, 16), (4, 4, 64)] {
            let shape = AttentionShape { heads, kv_heads, head_dim };
            let kvd = shape.kv_heads * shape.head_dim;
            let keys: Vec<u16> = (0..10 * kvd).map(|_| f16::from_f32(lcg(&mut seed)).to_bits()).collect();
            let values: Vec<u16> = (0..10 * kvd).map(|_| f16::from_f32(lcg(&mut seed)).to_bits()).collect();
            let q: Vec<f32> = (0..shape.heads * shape.head_dim).map(|_| lcg(&mut seed)).collect();
            let slots: Vec<usize> = [3, 0, 7, 9, 1].iter().map(|s| s * kvd).collect();
            let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            attention(&q, &slots, &keys, &values, shape, &mut a);
            // `Portable` keeps the trait's head-by-head `dot_heads`/`axpy_heads`: the SIMD path's grouped calls must
            // equal it exactly.
            attention_with(&q, &slots, &keys, &values, shape, &mut b, &Portable);
            assert_eq!(a, b, "{shape:?}");
            // Attention is a convex combination of the values: each output lies within the values' range.
            assert!(a.iter().all(|v| v.abs() <= 1.0));
        }
    }

    #[test]
    fn exp_f32_is_accurate_and_total() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (f64::from(exp_f32(x)), f64::from(x).exp());
            assert!(((got - want) / want).abs() < 3e-7, "exp({x}) = {got}, want {want}");
            x += 0.0137;
        }
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-1000.0) < 1e-37 && exp_f32(-1000.0) >= 0.0);
        assert!(exp_f32(1000.0).is_finite());
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(with_simd(|| exp_f32(1.5)), exp_f32(1.5));
    }

    #[test]
    fn wrong_sizes_are_refused() {
        assert!(Weight::from_q4_1(2, 32, &[0; 39]).is_err());
        assert!(Weight::from_q4_1(2, 30, &[0; 40]).is_err());
        assert!(Weight::from_q8_0(1, 32, &[0; 33]).is_err());
        assert!(Weight::from_f32(2, 2, vec![0.0; 3]).is_err());
    }
}
