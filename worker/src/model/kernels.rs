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

/// The instruction set the kernels run on: the best this CPU has, or a lower one named by the environment variable
/// `ZL_KERNEL_ISA` (`portable`, `avx2` or `avx512-vnni`; for comparisons and tests). Every level computes the same
/// bits: only the speed changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2, FMA and F16C (x86-64 since 2013-2015).
    Avx2,
    /// AVX2 plus AVX-512 (F, BW) with VNNI's byte dot product for the integer matmuls (Ice Lake, Zen 4 and later).
    Avx512Vnni,
}

impl Isa {
    const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512Vnni];

    /// The name `ZL_KERNEL_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512-vnni",
        }
    }

    /// The best level this CPU runs (detected once per process).
    pub fn detected() -> Isa {
        static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx2") && has!("fma") && has!("f16c") {
                    return if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                        Isa::Avx512Vnni
                    } else {
                        Isa::Avx2
                    };
                }
            }
            Isa::Portable
        })
    }

    /// The level in use: [`Isa::detected`], lowered by `ZL_KERNEL_ISA` (a level above the CPU's, or an unknown
    /// name, is ignored with a warning). Read once per process.
    pub fn current() -> Isa {
        static CURRENT: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *CURRENT.get_or_init(|| {
            let detected = Isa::detected();
            let Ok(asked) = std::env::var("ZL_KERNEL_ISA") else { return detected };
            match Isa::ALL.into_iter().find(|isa| isa.name() == asked) {
                Some(isa) if isa <= detected => isa,
                _ => {
                    tracing::warn!(
                        asked,
                        detected = detected.name(),
                        "ZL_KERNEL_ISA is unknown or above this CPU's level; ignored"
                    );
                    detected
                }
            }
        })
    }
}

/// A weight matrix of `rows` (output features) by `cols` (input features), stored row-major.
#[derive(Clone, Debug)]
pub enum Weight {
    /// GGUF Q4_1: per block of 32, `x = d * q + m` with 4-bit `q`. Stored in tiles of [`TILE`] output features
    /// (the last tile padded with zero features), block by block, so that one vector holds the same elements of
    /// eight features and a kernel's lanes are output features: no horizontal sums.
    Q4_1 {
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 32).
        cols: usize,
        /// Scales, `[tile][block][feature in tile]`.
        d: Vec<f32>,
        /// Minimums, laid out as `d`.
        m: Vec<f32>,
        /// Packed nibbles, 128 bytes per tile and block, as four 32-byte chunks: bytes `4j..4j + 4` of chunk `k`
        /// are bytes `4k..4k + 4` of feature `j`'s GGUF block (low nibbles are elements `4k..4k + 4`, high nibbles
        /// elements `16 + 4k..16 + 4k + 4`).
        qs: Vec<u8>,
    },
    /// GGUF Q8_0: per block of 32, `x = d * q` with 8-bit `q`. Tiled like Q4_1.
    Q8_0 {
        /// Output features.
        rows: usize,
        /// Input features (a multiple of 32).
        cols: usize,
        /// Scales, `[tile][block][feature in tile]`.
        d: Vec<f32>,
        /// Quants, 256 per tile and block, as eight 32-byte chunks: bytes `4j..4j + 4` of chunk `k` are elements
        /// `4k..4k + 4` of feature `j`'s block.
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

/// Output features per tile of the Q4_1 layout.
const TILE: usize = 8;

/// Where GGUF byte `i` (0..16) of feature `c`'s block `b` lives in the tiled Q4_1 layout.
#[inline(always)]
fn q4_1_byte(blocks_per_row: usize, c: usize, b: usize, i: usize) -> usize {
    ((c / TILE) * blocks_per_row + b) * 128 + (i / 4) * 32 + (c % TILE) * 4 + i % 4
}

/// Where element `i` (0..32) of feature `c`'s block `b` lives in the tiled Q8_0 layout.
#[inline(always)]
fn q8_0_at(blocks_per_row: usize, c: usize, b: usize, i: usize) -> usize {
    ((c / TILE) * blocks_per_row + b) * 256 + (i / 4) * 32 + (c % TILE) * 4 + i % 4
}

/// Where the scale (and Q4_1's minimum) of feature `c`'s block `b` live in the tiled layouts.
#[inline(always)]
fn tile_scale(blocks_per_row: usize, c: usize, b: usize) -> usize {
    ((c / TILE) * blocks_per_row + b) * TILE + c % TILE
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
    if !cols.is_multiple_of(QK) {
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
        check_blocks("Q4_1", rows, cols, raw, 20)?;
        let (bpr, tiles) = (cols / QK, rows.div_ceil(TILE));
        let mut d = vec![0f32; tiles * bpr * TILE];
        let mut m = vec![0f32; tiles * bpr * TILE];
        let mut qs = vec![0u8; tiles * bpr * 128];
        for (i, block) in raw.chunks_exact(20).enumerate() {
            let (c, b) = (i / bpr, i % bpr);
            d[tile_scale(bpr, c, b)] = f16_at(block, 0);
            m[tile_scale(bpr, c, b)] = f16_at(block, 2);
            for (k, four) in block[4..20].chunks_exact(4).enumerate() {
                let at = q4_1_byte(bpr, c, b, 4 * k);
                qs[at..at + 4].copy_from_slice(four);
            }
        }
        Ok(Weight::Q4_1 { rows, cols, d, m, qs })
    }

    /// Parse raw GGUF Q8_0 blocks (34 bytes each: f16 d, 32 signed bytes).
    pub fn from_q8_0(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        check_blocks("Q8_0", rows, cols, raw, 34)?;
        let (bpr, tiles) = (cols / QK, rows.div_ceil(TILE));
        let mut d = vec![0f32; tiles * bpr * TILE];
        let mut qs = vec![0i8; tiles * bpr * 256];
        for (i, block) in raw.chunks_exact(34).enumerate() {
            let (c, b) = (i / bpr, i % bpr);
            d[tile_scale(bpr, c, b)] = f16_at(block, 0);
            for (e, &q) in block[2..34].iter().enumerate() {
                qs[q8_0_at(bpr, c, b, e)] = q as i8;
            }
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
                    let (scale, min) = (d[tile_scale(bpr, r, b)], m[tile_scale(bpr, r, b)]);
                    for j in 0..16 {
                        let q = qs[q4_1_byte(bpr, r, b, j)];
                        out[b * QK + j] = scale * f32::from(q & 0x0f) + min;
                        out[b * QK + j + 16] = scale * f32::from(q >> 4) + min;
                    }
                }
            }
            Weight::Q8_0 { cols, d, qs, .. } => {
                let bpr = cols / QK;
                for b in 0..bpr {
                    for j in 0..QK {
                        out[b * QK + j] = d[tile_scale(bpr, r, b)] * f32::from(qs[q8_0_at(bpr, r, b, j)]);
                    }
                }
            }
            Weight::F32 { cols, w, .. } => out.copy_from_slice(&w[r * cols..(r + 1) * cols]),
        }
    }

    /// `out[r * rows + c] = x[r * cols ..] · W[c]` for `n` rows of `x`.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) {
        Input::new(x, n).matmul(vec![(self, out)]);
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

    /// [`Weight::matmul`] for each `(weight, out)` over these activations, in one parallel region: weights that
    /// read the same input (Q, K and V; gate and up) quantize it once and share one hand-off to the pool's threads.
    pub fn matmul(&self, jobs: Vec<(&Weight, &mut [f32])>) {
        let (n, x) = (self.n, self.x);
        let mut tasks: Vec<ColumnTask<'_, '_>> = Vec::new();
        for (weight, out) in jobs {
            let (rows, cols) = (weight.rows(), weight.cols());
            assert_eq!(x.len(), n * cols, "input shape");
            assert_eq!(out.len(), n * rows, "output shape");
            if n == 0 {
                continue;
            }
            let xq = match weight {
                Weight::F32 { .. } => None,
                Weight::Q4_1 { .. } | Weight::Q8_0 { .. } => {
                    Some(self.quantized.get_or_init(|| QuantizedRows::quantize(x, cols)))
                }
            };
            // Each task fills a range of output columns for every batch row, written in place: its part of each
            // output row is split off, so tasks never share output memory.
            let ranges = column_tasks(rows);
            let first = tasks.len();
            tasks.extend(ranges.iter().map(|&(c0, _)| ColumnTask { weight, xq, c0, out: Vec::with_capacity(n) }));
            for row in out.chunks_exact_mut(rows) {
                let mut rest = row;
                for (task, &(c0, c1)) in tasks[first..].iter_mut().zip(&ranges) {
                    let (mine, after) = std::mem::take(&mut rest).split_at_mut(c1 - c0);
                    task.out.push(mine);
                    rest = after;
                }
            }
        }
        tasks.into_par_iter().for_each(|mut t| columns(t.weight, x, t.xq, t.c0, &mut t.out));
    }
}

/// One parallel task of [`Input::matmul`]: output columns `c0..` of one weight, for every batch row.
struct ColumnTask<'w, 'o> {
    weight: &'w Weight,
    xq: Option<&'w QuantizedRows>,
    c0: usize,
    /// Each batch row's slice of the task's columns.
    out: Vec<&'o mut [f32]>,
}

/// Column ranges for parallel tasks: `TASKS_PER_THREAD` per pool thread (more where a task would exceed
/// `MAX_COLS_PER_TASK`), made of whole units of two [`TILE`]s (the VNNI kernel's step) spread evenly, so the tasks
/// differ by one unit at most (576 columns on two threads: eight tasks of 64 or 80, four of each). Where the
/// boundaries fall never changes a result: each output is computed on its own.
fn column_tasks(rows: usize) -> Vec<(usize, usize)> {
    const UNIT: usize = 2 * TILE;
    let units = rows.div_ceil(UNIT);
    let tasks =
        (rayon::current_num_threads() * TASKS_PER_THREAD).max(units.div_ceil(MAX_COLS_PER_TASK / UNIT)).min(units);
    let at = |t: usize| (t * units / tasks * UNIT).min(rows);
    (0..tasks).map(|t| (at(t), at(t + 1))).collect()
}

/// Quantize one row group (up to [`ROW_GROUP`] rows of `x`) into its interleaved blocks and its rows' block sums.
#[inline(always)]
fn quantize_group(x: &[f32], cols: usize, blocks: &mut [XBlock], sums: &mut [f32]) {
    let (rows, bpr) = (x.len() / cols, cols / QK);
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
            sums[r * bpr + b] = sum_f32(block);
            blocks[b * rows + r] = XBlock::new(q, d);
        }
    }
}

/// One block of 32 activations quantized to signed bytes, as the integer kernels consume them: `x ≈ d * q`. One
/// cache line.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C, align(64))]
struct XBlock {
    q: [i8; QK],
    d: f32,
    /// The sum of `q`: the VNNI Q8_0 kernel multiplies the weights offset by 128 (unsigned bytes) and takes
    /// `128 * qsum` back off.
    qsum: i32,
}

impl XBlock {
    const ZERO: XBlock = XBlock { q: [0; QK], d: 0.0, qsum: 0 };

    /// A block of quants and their scale.
    #[inline(always)]
    fn new(q: [i8; QK], d: f32) -> XBlock {
        XBlock { q, d, qsum: q.iter().map(|&v| i32::from(v)).sum() }
    }

    /// Quants `4k..4k + 4` as one little-endian 32-bit word, for broadcasting to a kernel's lanes.
    #[inline(always)]
    fn quad(&self, k: usize) -> i32 {
        let q = &self.q[4 * k..4 * k + 4];
        i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
    }
}

/// Batch rows the SIMD kernel runs together; the quantized activations are laid out in groups of this many rows.
const ROW_GROUP: usize = 8;

/// A batch of activations quantized block by block, with each block's f32 sum (row-major) for the Q4_1 minimum
/// term. Blocks are stored in groups of [`ROW_GROUP`] rows,
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
        let (rows, bpr) = (x.len() / cols, cols / QK);
        let mut out = QuantizedRows {
            blocks: vec![XBlock::ZERO; rows * bpr],
            sums: vec![0f32; rows * bpr],
            rows,
            blocks_per_row: bpr,
        };
        out.blocks
            .par_chunks_mut(ROW_GROUP * bpr)
            .zip(out.sums.par_chunks_mut(ROW_GROUP * bpr))
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
}

/// Output columns `c0..c0 + out[r].len()` of every batch row `r` into `out[r]`. Quantized weights run the integer kernel (AVX2 with FMA
/// where the CPU has it, portable code otherwise: both compute the same exact integer lane sums and the same fused
/// multiply-adds in the same order, so results are identical on every machine); f32 weights run the f32 kernel.
fn columns(weight: &Weight, x: &[f32], xq: Option<&QuantizedRows>, c0: usize, out: &mut [&mut [f32]]) {
    match xq {
        None => columns_f32(weight, x, c0, out),
        Some(xq) => {
            #[cfg(target_arch = "x86_64")]
            if simd::available() {
                return simd::columns_int8(Isa::current(), weight, xq, c0, out);
            }
            columns_int8(weight, xq, c0, out)
        }
    }
}

/// Sum of eight lanes in a fixed tree order (the order the SIMD kernel's horizontal adds produce).
#[inline(always)]
fn hsum(a: &[f32; 8]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// The portable integer kernel; the reference the SIMD kernel must match bit for bit. Per output, for each block in
/// order: the exact integer dot product of the weight and activation quants, times the product of the two scales,
/// as a fused multiply-add into one f32; for Q4_1 then the minimum times the activations' block sum, the same way.
fn columns_int8(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
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
fn columns_f32(weight: &Weight, x: &[f32], c0: usize, out: &mut [&mut [f32]]) {
    let Weight::F32 { w, cols, .. } = weight else { unreachable!("quantized weights use the integer kernel") };
    let cols = *cols;
    for (r, row) in out.iter_mut().enumerate() {
        for (c, o) in (c0..).zip(row.iter_mut()) {
            *o = dot_f32(&w[c * cols..(c + 1) * cols], &x[r * cols..(r + 1) * cols]);
        }
    }
}

/// The AVX2 code: the integer kernel, attention over the f16 KV cache and activation quantization. Nothing else
/// in the worker needs `unsafe`: only the unaligned loads and stores here, and entering `#[target_feature]`
/// functions once `available()` has checked the CPU, do.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd {
    use super::{AttentionShape, Isa, QK, QuantizedRows, TILE, Weight, XBlock};
    use std::arch::x86_64::*;

    /// Whether the SIMD kernels run (the CPU has AVX2, FMA, and F16C for the f16 KV cache, and `ZL_KERNEL_ISA`
    /// does not ask for the portable code).
    pub(super) fn available() -> bool {
        Isa::current() >= Isa::Avx2
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

    /// [`super::attention_portable`]'s arithmetic (`head_dim` a multiple of 8) with the f16 cache widened by F16C.
    /// Scores: each key chunk is widened once for up to four heads of its group, each head's eight lanes are kept,
    /// and eight positions' lanes are summed at once. Values: per head, four output chunks stay in registers across
    /// all positions.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn attention_avx2(
        q: &[f32],
        slots: &[usize],
        keys: &[u16],
        values: &[u16],
        shape: AttentionShape,
        out: &mut [f32],
    ) {
        let AttentionShape { heads, kv_heads, head_dim: hd } = shape;
        let (group, n, chunks) = (heads / kv_heads, slots.len(), hd / 8);
        let scale = 1.0 / (hd as f32).sqrt();
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
            super::softmax_weights(w);
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

    /// Each position's eight lanes summed as [`super::hsum`], times `scale`: eight positions per pass of
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
            *o = super::hsum(lanes[p * 8..p * 8 + 8].try_into().expect("eight lanes")) * scale;
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

    /// Eight f32s stored. The slice index bounds-checks the write.
    #[inline(always)]
    fn store8f(out: &mut [f32], v: __m256) {
        let out = &mut out[..8];
        // SAFETY: `out` holds 8 writable f32s and the store is unaligned.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) }
    }

    /// Eight f16 values as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn load8h(b: &[u16]) -> __m256 {
        let b = &b[..8];
        // SAFETY: `b` holds 8 readable u16s (16 bytes); the load is unaligned.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
    }

    pub(super) fn quantize_group(x: &[f32], cols: usize, blocks: &mut [XBlock], sums: &mut [f32]) {
        // SAFETY: the caller checked `available()`, so the CPU has AVX2, FMA and F16C.
        unsafe { quantize_group_avx2(x, cols, blocks, sums) }
    }

    /// [`super::quantize_group`] in AVX2, block by block: the same maximum, the same scale, the same roundings
    /// and the block sum in `sum_f32`'s order, so the same bytes (for finite activations).
    #[target_feature(enable = "avx2,fma")]
    fn quantize_group_avx2(x: &[f32], cols: usize, blocks: &mut [XBlock], sums: &mut [f32]) {
        let (rows, bpr) = (x.len() / cols, cols / QK);
        let sign = _mm256_set1_ps(-0.0);
        let half = _mm256_set1_ps(0.5);
        // Dwords of the packed bytes back in element order (the packs interleave 128-bit lanes).
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for r in 0..rows {
            for b in 0..bpr {
                let block = &x[r * cols + b * QK..][..QK];
                let v = [load8f(block), load8f(&block[8..]), load8f(&block[16..]), load8f(&block[24..])];
                let abs = |v: __m256| _mm256_andnot_ps(sign, v);
                let m = _mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3])));
                let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
                let d = amax / 127.0;
                let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
                // Round half away from zero: add 0.5 with the value's sign, then truncate.
                let quant = |v: __m256| {
                    let t = _mm256_mul_ps(v, inv);
                    _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_or_ps(half, _mm256_and_ps(t, sign))))
                };
                let words =
                    [_mm256_packs_epi32(quant(v[0]), quant(v[1])), _mm256_packs_epi32(quant(v[2]), quant(v[3]))];
                let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words[0], words[1]), order);
                let mut q = [0i8; QK];
                // SAFETY: `q` is 32 writable bytes and the store is unaligned.
                unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes) };
                blocks[b * rows + r] = XBlock::new(q, d);
                let lanes = _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_setzero_ps(), v[0]), v[1]), v[2]),
                    v[3],
                );
                let mut acc = [0f32; 8];
                store8f(&mut acc, lanes);
                sums[r * bpr + b] = super::finish_sum(&acc, &[]);
            }
        }
    }

    /// Batch rows from which the VNNI kernel runs. Below, a step reads weights faster than it multiplies them and
    /// the AVX2 kernel's single stream of one tile at a time was about 10% faster end to end at one sequence. Both
    /// compute the same bits, so the choice never changes a result.
    const VNNI_MIN_ROWS: usize = 4;

    /// The integer kernel at level `isa` (at least AVX2; the caller checked the CPU has it).
    pub(super) fn columns_int8(isa: Isa, weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
        assert!(isa >= Isa::Avx2 && isa <= Isa::detected(), "{isa:?} on this CPU");
        // SAFETY: the assertion checked that the CPU has the level's features.
        unsafe {
            if isa == Isa::Avx512Vnni && out.len() >= VNNI_MIN_ROWS {
                tiled_columns_vnni(weight, xq, c0, out)
            } else {
                tiled_columns(weight, xq, c0, out)
            }
        }
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

    /// 32 bytes as a vector. The slice index bounds-checks the read.
    #[inline(always)]
    fn load32u(bytes: &[u8]) -> __m256i {
        let bytes = &bytes[..32];
        // SAFETY: `bytes` holds 32 readable bytes and the load is unaligned.
        unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
    }

    /// Batch rows a tile kernel runs together (one row group): their per-block integer sums, one chunk of
    /// unpacked weights and a broadcast activation take twelve of the sixteen vector registers, the f32
    /// accumulators stay in L1. Eight rows per pass unpack each weight chunk once for all of them; four were
    /// about 15% slower at 16 rows.
    const TILE_ROWS: usize = 8;
    const _: () = assert!(super::ROW_GROUP.is_multiple_of(TILE_ROWS), "a pass's rows share a row group");

    /// `$f::<R>(args)` for a row count known at run time (1 to [`TILE_ROWS`]): the kernels take it as a constant,
    /// so their per-row registers are fixed arrays.
    macro_rules! by_rows {
        ($rows:expr, $f:ident($($arg:expr),*)) => {
            match $rows {
                8 => $f::<8>($($arg),*),
                7 => $f::<7>($($arg),*),
                6 => $f::<6>($($arg),*),
                5 => $f::<5>($($arg),*),
                4 => $f::<4>($($arg),*),
                3 => $f::<3>($($arg),*),
                2 => $f::<2>($($arg),*),
                _ => $f::<1>($($arg),*),
            }
        };
    }
    const _: () = assert!(TILE_ROWS == 8, "by_rows! covers 1 to TILE_ROWS");

    /// The tiled integer kernels: for each tile of eight output features, a few batch rows at a time sweep the
    /// blocks.
    #[target_feature(enable = "avx2,fma")]
    fn tiled_columns(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
        // Tile by tile: its weights come from memory once and stay in L1 for every group of rows.
        for t in c0 / TILE..(c0 + out[0].len()).div_ceil(TILE) {
            one_tile(weight, xq, t, c0, out);
        }
    }

    /// Tile `t` for every batch row, a few rows at a time.
    #[target_feature(enable = "avx2,fma")]
    fn one_tile(weight: &Weight, xq: &QuantizedRows, t: usize, c0: usize, out: &mut [&mut [f32]]) {
        let n = out.len();
        let mut r = 0;
        while r < n {
            let tile = (n - r).min(TILE_ROWS);
            let mut acc = [_mm256_setzero_ps(); TILE_ROWS];
            by_rows!(tile, tile_rows(weight, xq, t, r, &mut acc));
            for (row, a) in out[r..r + tile].iter_mut().zip(acc) {
                let mut vals = [0f32; TILE];
                store8f(&mut vals, a);
                store_features(row, c0, t * TILE, &vals);
            }
            r += tile;
        }
    }

    /// Features `f0..f0 + vals.len()` of one output row whose slice `row` holds features `c0..`: the ones that
    /// fall in the slice (a task's range, or the matrix's end before a tile's padding features).
    #[inline(always)]
    fn store_features(row: &mut [f32], c0: usize, f0: usize, vals: &[f32]) {
        let (lo, hi) = (f0.max(c0), (f0 + vals.len()).min(c0 + row.len()));
        row[lo - c0..hi - c0].copy_from_slice(&vals[lo - f0..hi - f0]);
    }

    /// The VNNI integer kernels: two tiles (sixteen output features, one 512-bit vector) at a time, a few batch rows
    /// at a time; a last odd tile runs the AVX2 kernel (the same bits).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
    fn tiled_columns_vnni(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
        let (n, t1) = (out.len(), (c0 + out[0].len()).div_ceil(TILE));
        let mut t = c0 / TILE;
        while t + 2 <= t1 {
            let mut r = 0;
            while r < n {
                let tile = (n - r).min(TILE_ROWS);
                let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
                by_rows!(tile, pair_rows(weight, xq, t, r, &mut acc));
                for (row, a) in out[r..r + tile].iter_mut().zip(acc) {
                    let mut vals = [0f32; 2 * TILE];
                    // SAFETY: `vals` is 16 writable f32s and the store is unaligned.
                    unsafe { _mm512_storeu_ps(vals.as_mut_ptr(), a) };
                    store_features(row, c0, t * TILE, &vals);
                }
                r += tile;
            }
            t += 2;
        }
        if t < t1 {
            one_tile(weight, xq, t, c0, out);
        }
    }

    /// Tiles `t` and `t + 1` for batch rows `r..r + R` into `acc[..R]`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    fn pair_rows<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize, acc: &mut [__m512]) {
        let rows = match weight {
            Weight::Q4_1 { .. } => q4_1_pair::<R>(weight, xq, t, r),
            _ => q8_0_pair::<R>(weight, xq, t, r),
        };
        acc[..R].copy_from_slice(&rows);
    }

    /// Two 256-bit vectors (the same chunk of two tiles) as one 512-bit vector, `a` in the low half.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn join(a: __m256i, b: __m256i) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
    }

    /// Eight f32s of each of two tiles as one vector, the first in the low half.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn load_pair8f(a: &[f32], b: &[f32]) -> __m512 {
        _mm512_castsi512_ps(join(_mm256_castps_si256(load8f(a)), _mm256_castps_si256(load8f(b))))
    }

    /// Activation bytes `4k..4k + 4` of a block, in every 32-bit lane of a 512-bit vector.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn broadcast4_512(x: &XBlock, k: usize) -> __m512i {
        _mm512_set1_epi32(x.quad(k))
    }

    /// [`q4_1_tile`] for tiles `t` and `t + 1` at once with VNNI: `vpdpbusd` multiplies the unsigned nibbles by
    /// the signed activation bytes and adds each lane's four products to its i32 sum (exact, no 16-bit step), so
    /// a chunk costs one instruction per row and half of a block. Then the same conversions and fused
    /// multiply-adds as the reference, per lane (feature).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn q4_1_pair<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize) -> [__m512; R] {
        let Weight::Q4_1 { cols, d, m, qs, .. } = weight else { unreachable!("Q4_1 only") };
        let bpr = cols / QK;
        let low4 = _mm512_set1_epi8(0x0f);
        let mut acc = [_mm512_setzero_ps(); R];
        let (qa, qb) = (tile(qs, t, bpr * 128), tile(qs, t + 1, bpr * 128));
        let (da, db) = (tile(d, t, bpr * TILE), tile(d, t + 1, bpr * TILE));
        let (ma, mb) = (tile(m, t, bpr * TILE), tile(m, t + 1, bpr * TILE));
        let (xs, stride) = row_blocks::<R>(xq, r);
        let sums = &xq.sums[r * bpr..(r + R) * bpr];
        for b in 0..bpr {
            let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
            // Low and high nibbles in separate sums: shorter dependency chains (the sum is exact either way).
            let (mut s, mut h) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
            for k in 0..4 {
                let v = join(load32u(&qa[b * 128 + k * 32..]), load32u(&qb[b * 128 + k * 32..]));
                let lo = _mm512_and_si512(v, low4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
                for i in 0..R {
                    s[i] = _mm512_dpbusd_epi32(s[i], lo, broadcast4_512(&x[i], k));
                    h[i] = _mm512_dpbusd_epi32(h[i], hi, broadcast4_512(&x[i], k + 4));
                }
            }
            for i in 0..R {
                s[i] = _mm512_add_epi32(s[i], h[i]);
            }
            let dw = load_pair8f(&da[b * TILE..], &db[b * TILE..]);
            let mw = load_pair8f(&ma[b * TILE..], &mb[b * TILE..]);
            for i in 0..R {
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(x[i].d));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), scale, acc[i]);
                acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sums[i * bpr + b]), acc[i]);
            }
        }
        acc
    }

    /// [`q8_0_tile`] for tiles `t` and `t + 1` at once with VNNI. `vpdpbusd` wants one unsigned operand, so the
    /// weights are offset by 128 (their sign bit flipped: once per chunk for all rows) and each row's block sum
    /// takes `128 * sum(q)` back off: `sum((w + 128) * x) - 128 * sum(x) = sum(w * x)`, exact in i32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn q8_0_pair<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize) -> [__m512; R] {
        let Weight::Q8_0 { cols, d, qs, .. } = weight else { unreachable!("Q8_0 only") };
        let bpr = cols / QK;
        let flip = _mm512_set1_epi8(i8::MIN);
        let mut acc = [_mm512_setzero_ps(); R];
        let (qa, qb) = (tile(qs, t, bpr * 256), tile(qs, t + 1, bpr * 256));
        let (da, db) = (tile(d, t, bpr * TILE), tile(d, t + 1, bpr * TILE));
        let (xs, stride) = row_blocks::<R>(xq, r);
        for b in 0..bpr {
            let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
            let mut s = [_mm512_setzero_si512(); R];
            for k in 0..8 {
                let w = join(load32(&qa[b * 256 + k * 32..]), load32(&qb[b * 256 + k * 32..]));
                let offset = _mm512_xor_si512(w, flip);
                for i in 0..R {
                    s[i] = _mm512_dpbusd_epi32(s[i], offset, broadcast4_512(&x[i], k));
                }
            }
            let dw = load_pair8f(&da[b * TILE..], &db[b * TILE..]);
            for i in 0..R {
                let isum = _mm512_sub_epi32(s[i], _mm512_set1_epi32(x[i].qsum << 7));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(x[i].d)), acc[i]);
            }
        }
        acc
    }

    /// Tile `t` for batch rows `r..r + R` into `acc[..R]`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn tile_rows<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize, acc: &mut [__m256]) {
        let rows = match weight {
            Weight::Q4_1 { .. } => q4_1_tile::<R>(weight, xq, t, r),
            _ => q8_0_tile::<R>(weight, xq, t, r),
        };
        acc[..R].copy_from_slice(&rows);
    }

    /// The activation blocks of batch rows `r..r + R`, block after block: block `b` of row `r + i` is at
    /// `blocks[b * stride + i]`. The rows must share a row group.
    #[inline(always)]
    fn row_blocks<const R: usize>(xq: &QuantizedRows, r: usize) -> (&[XBlock], usize) {
        let first = xq.index(r, 0);
        let stride = if xq.blocks_per_row > 1 { xq.index(r, 1) - first } else { 1 };
        assert_eq!(xq.index(r + R - 1, 0), first + R - 1, "the rows share a row group");
        let last = first + (xq.blocks_per_row - 1) * stride + R;
        (&xq.blocks[first..last], stride)
    }

    /// Activation bytes `4k..4k + 4` of a block, in every 32-bit lane.
    #[inline(always)]
    fn broadcast4(x: &XBlock, k: usize) -> __m256i {
        // SAFETY: only called from this module's AVX2 kernels, which run where `available()` said the CPU has it.
        unsafe { _mm256_set1_epi32(x.quad(k)) }
    }

    /// Tile `t`'s part of a tiled array holding `len` entries per tile.
    #[inline(always)]
    fn tile<T>(v: &[T], t: usize, len: usize) -> &[T] {
        &v[t * len..(t + 1) * len]
    }

    /// Tile `t`'s eight features for batch rows `r..r + R` (row `r + i` in lane vector `i`). Per block, a chunk of four
    /// elements of all eight features at a time (unpacked once for all rows), each row's byte-products (each lane
    /// a feature, the row's four activation bytes broadcast to all lanes) summed in i16; then per row the sum
    /// widened to i32 once, the scales and the minimum term as fused multiply-adds: the operations of
    /// `columns_int8`'s Q4_1 reference, in its order, whatever `R` is. (The integer sum is exact in any order.)
    #[target_feature(enable = "avx2,fma")]
    fn q4_1_tile<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize) -> [__m256; R] {
        let Weight::Q4_1 { cols, d, m, qs, .. } = weight else { unreachable!("Q4_1 only") };
        let bpr = cols / QK;
        let ones = _mm256_set1_epi16(1);
        let low4 = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); R];
        let qs = tile(qs, t, bpr * 128);
        let (d, m) = (tile(d, t, bpr * TILE), tile(m, t, bpr * TILE));
        let (xs, stride) = row_blocks::<R>(xq, r);
        let sums = &xq.sums[r * bpr..(r + R) * bpr];
        for (b, ((q, dv), mv)) in qs.chunks_exact(128).zip(d.chunks_exact(TILE)).zip(m.chunks_exact(TILE)).enumerate() {
            let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
            let mut s = [_mm256_setzero_si256(); R];
            // Chunk k holds elements 4k..4k + 4 (low nibbles) and 16 + 4k.. (high nibbles) of every feature. Each
            // product pair is at most 2 * 15 * 127 = 3810, so a block's eight of them sum within i16.
            for k in 0..4 {
                let v = load32u(&q[k * 32..]);
                let lo = _mm256_and_si256(v, low4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
                for i in 0..R {
                    s[i] = _mm256_add_epi16(s[i], _mm256_maddubs_epi16(lo, broadcast4(&x[i], k)));
                    s[i] = _mm256_add_epi16(s[i], _mm256_maddubs_epi16(hi, broadcast4(&x[i], k + 4)));
                }
            }
            let (dw, mw) = (load8f(dv), load8f(mv));
            for i in 0..R {
                let isum = _mm256_madd_epi16(s[i], ones);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(x[i].d)), acc[i]);
                acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sums[i * bpr + b]), acc[i]);
            }
        }
        acc
    }

    /// [`q4_1_tile`] for Q8_0: per block, a chunk of four elements of all eight features at a time (their
    /// magnitudes taken once for all rows), each row's byte-products of the magnitudes with its activations
    /// carrying the weights' signs (each pair at most 2 * 128 * 127, so each is widened to i32 before the next is
    /// added), then the scales as one fused multiply-add: `columns_int8`'s Q8_0 reference.
    #[target_feature(enable = "avx2,fma")]
    fn q8_0_tile<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize) -> [__m256; R] {
        let Weight::Q8_0 { cols, d, qs, .. } = weight else { unreachable!("Q8_0 only") };
        let bpr = cols / QK;
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        let qs = tile(qs, t, bpr * 256);
        let d = tile(d, t, bpr * TILE);
        let (xs, stride) = row_blocks::<R>(xq, r);
        for (b, (q, dv)) in qs.chunks_exact(256).zip(d.chunks_exact(TILE)).enumerate() {
            let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
            let mut s = [_mm256_setzero_si256(); R];
            for k in 0..8 {
                let w = load32(&q[k * 32..]);
                let mag = _mm256_sign_epi8(w, w);
                for i in 0..R {
                    let xk = _mm256_sign_epi8(broadcast4(&x[i], k), w);
                    s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, xk), ones));
                }
            }
            let dw = load8f(dv);
            for i in 0..R {
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(dw, _mm256_set1_ps(x[i].d)), acc[i]);
            }
        }
        acc
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

/// Attention scores of one head, in place, to softmax weights: `exp(s - max)` times the reciprocal of their sum.
#[inline(always)]
fn softmax_weights(s: &mut [f32]) {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
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
}

/// Attention of one query row (all heads, `q` is `heads * head_dim`) over the positions whose keys and values
/// start at `slots` in one layer's KV storage (f16 bits; each slot holds `kv_heads * head_dim` values; grouped-query
/// heads share theirs). The arithmetic is [`attention_portable`]'s, in fixed orders that depend only on this row,
/// never on the batch; the SIMD code computes the same bits.
pub fn attention(q: &[f32], slots: &[usize], keys: &[u16], values: &[u16], shape: AttentionShape, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::available() && shape.head_dim.is_multiple_of(8) {
        return simd::attention(q, slots, keys, values, shape, out);
    }
    attention_portable(q, slots, keys, values, shape, out);
}

/// The reference attention arithmetic. Per head: each score is the query-key dot product in eight lanes (element
/// `i` into lane `i % 8` by fused multiply-add), summed as [`hsum`], times `1/sqrt(head_dim)`; the scores become
/// [`softmax_weights`]; the output is the weighted sum of values, one fused multiply-add per position in order.
fn attention_portable(
    q: &[f32],
    slots: &[usize],
    keys: &[u16],
    values: &[u16],
    shape: AttentionShape,
    out: &mut [f32],
) {
    let AttentionShape { heads, kv_heads, head_dim: hd } = shape;
    let (group, n) = (heads / kv_heads, slots.len());
    let scale = 1.0 / (hd as f32).sqrt();
    let mut weights = vec![0f32; heads * n];
    for (h, w) in weights.chunks_exact_mut(n.max(1)).enumerate() {
        let (g, qh) = (h / group, &q[h * hd..(h + 1) * hd]);
        for (wp, &slot) in w.iter_mut().zip(slots) {
            let mut lanes = [0f32; 8];
            for (i, (&a, &b)) in qh.iter().zip(&keys[slot + g * hd..slot + (g + 1) * hd]).enumerate() {
                lanes[i % 8] = a.mul_add(widen(b), lanes[i % 8]);
            }
            *wp = hsum(&lanes) * scale;
        }
        softmax_weights(w);
    }
    out.fill(0.0);
    for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
        let g = h / group;
        for (&wp, &slot) in weights[h * n..(h + 1) * n].iter().zip(slots) {
            for (o, &v) in oh.iter_mut().zip(&values[slot + g * hd..slot + (g + 1) * hd]) {
                *o = wp.mul_add(widen(v), *o);
            }
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
    finish_sum(&acc, a.chunks_exact(8).remainder())
}

/// [`sum_f32`]'s last step: its eight lanes in [`hsum`]'s order, then the values past the last full eight.
#[inline(always)]
fn finish_sum(lanes: &[f32; 8], rest: &[f32]) -> f32 {
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
        for q in [
            Weight::from_q4_1(rows, cols, &q4_1_raw(&w)).unwrap(),
            Weight::from_q8_0(rows, cols, &q8_0_raw(&w)).unwrap(),
        ] {
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
            for n in [1, 3, 4, 9, 16] {
                let mut x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut seed) * 3.0).collect();
                // An all-zero block, a negative zero, and a block whose scale is exactly 1 and whose other values
                // are halves (the rounding's ties).
                x[..QK].fill(0.0);
                x[QK] = -0.0;
                for (i, v) in x[2 * QK..3 * QK].iter_mut().enumerate() {
                    *v = if i == 0 { -127.0 } else { i as f32 - 16.5 };
                }
                let xq = QuantizedRows::quantize(&x, cols);
                let run = |kernel: &dyn Fn(&mut [&mut [f32]])| {
                    let mut vals = vec![0f32; n * rows];
                    kernel(&mut vals.chunks_mut(rows).collect::<Vec<_>>());
                    vals
                };
                let reference = run(&|out| columns_int8(&weight, &xq, 0, out));
                assert_eq!(run(&|out| columns(&weight, &x, Some(&xq), 0, out)), reference);
                #[cfg(target_arch = "x86_64")]
                for isa in Isa::ALL.into_iter().filter(|&isa| isa >= Isa::Avx2 && isa <= Isa::detected()) {
                    // All columns, then in two parts split after one tile (so pairs of tiles start on an odd one),
                    // as a task would.
                    assert_eq!(run(&|out| simd::columns_int8(isa, &weight, &xq, 0, out)), reference, "{isa:?}");
                    let split = run(&|out| {
                        let mut parts: (Vec<&mut [f32]>, Vec<&mut [f32]>) =
                            out.iter_mut().map(|row| row.split_at_mut(TILE)).unzip();
                        simd::columns_int8(isa, &weight, &xq, 0, &mut parts.0);
                        simd::columns_int8(isa, &weight, &xq, TILE, &mut parts.1);
                    });
                    assert_eq!(split, reference, "{isa:?} split");
                }
                // The portable quantizer, group by group, gives the same bytes.
                let bpr = cols / QK;
                for (g, xg) in x.chunks(ROW_GROUP * cols).enumerate() {
                    let rows_here = xg.len() / cols;
                    let mut blocks = vec![XBlock::ZERO; rows_here * bpr];
                    let mut sums = vec![0f32; rows_here * bpr];
                    quantize_group(xg, cols, &mut blocks, &mut sums);
                    let at = g * ROW_GROUP * bpr;
                    assert!(blocks.iter().zip(&xq.blocks[at..]).all(|(a, b)| a == b));
                    assert_eq!(sums[..], xq.sums[g * ROW_GROUP * bpr..][..sums.len()]);
                }
            }
        }
        // Groups of 3 (head_dim 24: a partial block of output chunks), 5 (more than the SIMD path's 4 heads at a
        // time), 1 and 3 (head_dim 64); 5 positions (no full pass of eight scores) and 11 (one, and a tail). A
        // head_dim of 20 runs the portable code on every machine.
        for (heads, kv_heads, head_dim) in [(6, 2, 24), (10, 2, 16), (4, 4, 64), (9, 3, 64), (6, 2, 20)] {
            for positions in [&[3, 0, 7, 9, 1][..], &[3, 0, 7, 9, 1, 2, 4, 5, 6, 8, 10]] {
                let shape = AttentionShape { heads, kv_heads, head_dim };
                let kvd = shape.kv_heads * shape.head_dim;
                let keys: Vec<u16> = (0..11 * kvd).map(|_| f16::from_f32(lcg(&mut seed)).to_bits()).collect();
                let values: Vec<u16> = (0..11 * kvd).map(|_| f16::from_f32(lcg(&mut seed)).to_bits()).collect();
                let q: Vec<f32> = (0..shape.heads * shape.head_dim).map(|_| lcg(&mut seed)).collect();
                let slots: Vec<usize> = positions.iter().map(|s| s * kvd).collect();
                let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                attention(&q, &slots, &keys, &values, shape, &mut a);
                attention_portable(&q, &slots, &keys, &values, shape, &mut b);
                assert_eq!(a, b, "{shape:?}");
                // Attention is a convex combination of the values: each output lies within the values' range.
                assert!(a.iter().all(|v| v.abs() <= 1.0));
            }
        }
    }

    #[test]
    fn several_weights_over_one_input_match_one_at_a_time() {
        let (cols, n) = (96, 6);
        let mut seed = 5;
        let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut seed)).collect();
        let values = |rows: usize, seed: &mut u64| (0..rows * cols).map(|_| lcg(seed)).collect::<Vec<f32>>();
        let weights = [
            Weight::from_q4_1(40, cols, &q4_1_raw(&values(40, &mut seed))).unwrap(),
            Weight::from_f32(24, cols, values(24, &mut seed)).unwrap(),
            Weight::from_q8_0(72, cols, &q8_0_raw(&values(72, &mut seed))).unwrap(),
        ];
        let mut together: Vec<Vec<f32>> = weights.iter().map(|w| vec![0f32; n * w.rows()]).collect();
        Input::new(&x, n).matmul(weights.iter().zip(together.iter_mut()).map(|(w, o)| (w, &mut o[..])).collect());
        for (w, got) in weights.iter().zip(&together) {
            let mut alone = vec![0f32; n * w.rows()];
            w.matmul(&x, n, &mut alone);
            assert_eq!(got, &alone);
        }
    }

    #[test]
    fn column_tasks_cover_the_columns_in_even_whole_units() {
        for rows in [1, 8, 16, 37, 192, 576, 1536, 49152, 49153] {
            let tasks = column_tasks(rows);
            assert_eq!(tasks[0].0, 0);
            assert_eq!(tasks.last().unwrap().1, rows);
            assert!(tasks.windows(2).all(|w| w[0].1 == w[1].0), "{rows}: contiguous");
            assert!(tasks.iter().all(|&(a, b)| a < b && a % (2 * TILE) == 0 && b - a <= MAX_COLS_PER_TASK));
            let units: Vec<usize> = tasks.iter().map(|&(a, b)| (b - a).div_ceil(2 * TILE)).collect();
            let (lo, hi) = (units.iter().min().unwrap(), units.iter().max().unwrap());
            assert!(hi - lo <= 1, "{rows}: {tasks:?}");
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

    #[test]
    fn attention_matches_a_naive_softmax() {
        let shape = AttentionShape { heads: 9, kv_heads: 3, head_dim: 64 };
        let kvd = 192;
        let n = 13;
        let mut seed = 5u64;
        let mut rnd = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let keys: Vec<u16> = (0..n * kvd).map(|_| f16::from_f32(rnd()).to_bits()).collect();
        let values: Vec<u16> = (0..n * kvd).map(|_| f16::from_f32(rnd()).to_bits()).collect();
        let q: Vec<f32> = (0..576).map(|_| rnd()).collect();
        let slots: Vec<usize> = (0..n).map(|p| p * kvd).collect();
        let mut out = vec![0f32; 576];
        attention(&q, &slots, &keys, &values, shape, &mut out);
        let mut port = vec![0f32; 576];
        attention_portable(&q, &slots, &keys, &values, shape, &mut port);
        for h in 0..9 {
            let g = h / 3;
            let s: Vec<f64> = (0..n)
                .map(|p| {
                    (0..64).map(|i| q[h * 64 + i] as f64 * widen(keys[p * kvd + g * 64 + i]) as f64).sum::<f64>() / 8.0
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..64 {
                let want: f64 = (0..n).map(|p| e[p] / z * widen(values[p * kvd + g * 64 + i]) as f64).sum();
                assert!((out[h * 64 + i] as f64 - want).abs() < 1e-4, "simd h{h} i{i}: {} vs {want}", out[h * 64 + i]);
                assert!(
                    (port[h * 64 + i] as f64 - want).abs() < 1e-4,
                    "portable h{h} i{i}: {} vs {want}",
                    port[h * 64 + i]
                );
            }
        }
    }
}
