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
//! Quantized weights stay quantized in memory: Q4_1, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K repacked at load
//! into tiles their kernels read directly, Q2_K and Q3_K as the file's blocks (unpacked a tile per step); f16 and
//! bf16 as 16-bit floats. Each activation row is quantized per block of 32 to 16-bit integers on its own (to 8-bit
//! ones for a weight that takes them: [`Activations`]), and every block product is an exact integer dot product,
//! scaled and accumulated in a fixed order (the AMX tile unit, AVX-512 VNNI or AVX2 where the CPU has it, portable
//! code otherwise, the same bits at every level).
//! Attention over the KV cache (f16 or 8-bit blocks) and the `exp` the model needs live here too, under the same
//! rules.
//!
//! This file holds every instruction-set dispatch (matmul columns, activation quantization, attention, and
//! [`with_simd`]) and the split of a matmul into parallel column tasks; one file per concern beside it, the way
//! candle's `cpu/` keeps one interface that each instruction set implements. None of them imports another level:
//! - `isa.rs`: the level in use ([`Isa`]);
//! - `math.rs`: the fixed-order sums, dot products and `exp` everything shares;
//! - `weight.rs`: the tiled weight formats and their parsing from GGUF blocks;
//! - `quant.rs`: activations quantized to 16-bit (or 8-bit) blocks, laid out for the kernels;
//! - `portable.rs`: the reference matmul kernels every SIMD level must match bit for bit;
//! - `attention.rs`: the reference attention over the KV cache (f16 or 8-bit) and the pieces every level shares;
//! - `blocks.rs`: the GGUF block formats' decoding, the reference the repacked layouts are checked against;
//! - `team.rs`: the forward step's fork-join (the pool's threads polling for the next parallel region);
//! - `x86/`: the SIMD levels (AVX2, AVX-512, AMX), where the worker's `unsafe` lives (besides `team.rs`'s lending
//!   of a closure and of each task's slot, and `isa.rs`'s request for the AMX state).

mod attention;
mod blocks;
mod isa;
mod low_rank;
mod math;
mod portable;
mod quant;
#[allow(unsafe_code)] // lends the leader's closure and each task's slot to its helpers for one region (SAFETY notes)
pub mod team;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_blocks;
mod weight;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86;

pub use attention::{AttentionShape, KvPlane};
pub use blocks::BlockFormat;
pub(crate) use blocks::f16_to_f32;
pub use isa::Isa;
#[cfg(test)]
pub(crate) use low_rank::test_values;
pub use low_rank::{LowRank, to_half_bits};
pub use math::{dot_f32, dot4_f32, exp_f32, sum_f32};
pub use quant::Activations;
pub use weight::{Weight, WeightError};

use attention::attention_portable;
use portable::{columns_blocks, columns_float, columns_int};
use quant::{QuantizeGroup, QuantizedRows, quantize_group};

/// Elements per quantization block.
pub const QK: usize = 32;

/// Output features per tile of the tiled weight layouts (Q4_1, Q8_0, and the block formats' unpacked tiles).
const TILE: usize = 8;

/// Parallel tasks per pool thread for one matmul of a few rows (a decode step of up to [`FEW_ROWS`] sequences).
/// Under rayon two beat four (hand-offs weighed more than uneven finishes: SmolLM2 Q4_K_M at one sequence 1.05x,
/// medians of nine alternating rounds); with the step's team a task is claimed by an atomic add, and four beat two:
/// medians of alternating rounds on an Intel Xeon, 2 threads, `zl-worker bench --concurrency 1`: Q4_1 152 against
/// 148 tok/s (five rounds, four ahead in each), Q4_K_M 140 against 139 (three); eight no better. Since the kernels
/// hint their weights ahead (each task's stream starts cold), two again: Q4_1 at one sequence 1.03x four, 1.13x
/// eight, 1.3x sixteen (three alternating rounds each), at four sequences 1.04x four.
const TASKS_PER_THREAD_FEW: usize = 2;

/// Parallel tasks per pool thread for one matmul of more rows: enough that threads finish together, few enough to
/// amortise scheduling (two instead cost 3% at 16 sequences, one 12%).
const TASKS_PER_THREAD: usize = 4;

/// Batch rows up to which a matmul runs [`TASKS_PER_THREAD_FEW`] tasks per thread.
const FEW_ROWS: usize = 4;

/// Output columns of one task never exceed this (keeps a task's weights within L2).
const MAX_COLS_PER_TASK: usize = 256;

/// Activations for one or more matmuls: `n` rows of f32, quantized for the integer kernels on first use.
#[derive(Debug)]
pub struct Input<'a> {
    x: &'a [f32],
    n: usize,
    /// Quantized to 16 and to 8 bits, each on first use by a weight that takes that width.
    quantized: [std::sync::OnceLock<QuantizedRows>; 2],
}

impl<'a> Input<'a> {
    /// `n` rows of equal width.
    pub fn new(x: &'a [f32], n: usize) -> Self {
        Input { x, n, quantized: Default::default() }
    }

    /// [`Weight::matmul`] for each `(weight, out)` over these activations, in one parallel region: weights that
    /// read the same input (Q, K and V; gate and up) quantize it once and share one hand-off to the pool's threads.
    pub fn matmul(&self, jobs: Vec<(&Weight, &mut [f32])>) {
        matmul_groups(vec![(self, jobs)]);
    }

    /// This input's tasks for `jobs`, each weight cut into about `1 / share` of the column tasks one matmul would
    /// have (at least one), appended to `tasks`.
    fn tasks<'s, 'o>(
        &'s self,
        jobs: Vec<(&'s Weight, &'o mut [f32])>,
        share: usize,
        tasks: &mut Vec<ColumnTask<'s, 'o>>,
    ) {
        let (n, x) = (self.n, self.x);
        for (weight, out) in jobs {
            let (rows, cols) = (weight.rows(), weight.cols());
            assert_eq!(x.len(), n * cols, "input shape");
            assert_eq!(out.len(), n * rows, "output shape");
            if n == 0 {
                continue;
            }
            let xq = match weight {
                Weight::F32 { .. } | Weight::Half { .. } => None,
                Weight::Q4_1 { .. }
                | Weight::Q8_0 { .. }
                | Weight::Q4K { .. }
                | Weight::Q6K { .. }
                | Weight::Legacy { .. }
                | Weight::Blocks { .. } => {
                    let width = weight.activations();
                    Some(
                        self.quantized[usize::from(width == Activations::Eight)]
                            .get_or_init(|| QuantizedRows::quantize(x, cols, group_quantizer(), width)),
                    )
                }
            };
            #[cfg(target_arch = "x86_64")]
            if let Some(xq) = xq {
                x86::prepare(Isa::current(), weight, xq);
            }
            // Each task fills a range of output columns for every batch row, written in place: its part of each
            // output row is split off, so tasks never share output memory.
            let ranges = column_tasks(rows, n, share);
            let first = tasks.len();
            tasks.extend(ranges.iter().map(|&(c0, _)| ColumnTask { weight, x, xq, c0, out: Vec::with_capacity(n) }));
            for row in out.chunks_exact_mut(rows) {
                let mut rest = row;
                for (task, &(c0, c1)) in tasks[first..].iter_mut().zip(&ranges) {
                    let (mine, after) = std::mem::take(&mut rest).split_at_mut(c1 - c0);
                    task.out.push(mine);
                    rest = after;
                }
            }
        }
    }
}

/// Matmuls over one input: each weight and the output it fills.
pub type Jobs<'w, 'o> = Vec<(&'w Weight, &'o mut [f32])>;

/// [`Input::matmul`] of several inputs, each with its own weights (a mixture of experts' rows, grouped by expert),
/// in one parallel region: one hand-off to the pool's threads for all of them, each weight cut into fewer tasks
/// the more groups share the region. Every output is computed as one [`Input::matmul`] would compute it.
pub fn matmul_groups(groups: Vec<(&Input<'_>, Jobs<'_, '_>)>) {
    let share = groups.len().max(1);
    let mut tasks: Vec<ColumnTask<'_, '_>> = Vec::new();
    for (input, jobs) in groups {
        input.tasks(jobs, share, &mut tasks);
    }
    team::for_each(tasks, |mut t| columns(t.weight, t.x, t.xq, t.c0, &mut t.out));
}

/// One parallel task of [`Input::matmul`]: output columns `c0..` of one weight, for every batch row.
struct ColumnTask<'w, 'o> {
    weight: &'w Weight,
    /// The input rows (f32, for the float kernels).
    x: &'w [f32],
    xq: Option<&'w QuantizedRows>,
    c0: usize,
    /// Each batch row's slice of the task's columns.
    out: Vec<&'o mut [f32]>,
}

/// Column ranges for parallel tasks of a matmul over `n` batch rows: `TASKS_PER_THREAD` per pool thread
/// (`TASKS_PER_THREAD_FEW` for a few rows; more where a task would exceed `MAX_COLS_PER_TASK`), made of whole units
/// of two [`TILE`]s spread evenly, so the tasks differ by one unit at most (576 columns on two threads: eight tasks
/// of 64 or 80, four of each); `share` weights in one region divide that count between them. Where the boundaries
/// fall never changes a result: each output is computed on its own.
fn column_tasks(rows: usize, n: usize, share: usize) -> Vec<(usize, usize)> {
    const UNIT: usize = 2 * TILE;
    let units = rows.div_ceil(UNIT);
    let per_thread = if n <= FEW_ROWS { TASKS_PER_THREAD_FEW } else { TASKS_PER_THREAD };
    let wanted = (rayon::current_num_threads() * per_thread).div_ceil(share.max(1));
    let tasks = wanted.max(units.div_ceil(MAX_COLS_PER_TASK / UNIT)).min(units).max(1);
    let at = |t: usize| (t * units / tasks * UNIT).min(rows);
    (0..tasks).map(|t| (at(t), at(t + 1))).collect()
}

/// Output columns `c0..c0 + out[r].len()` of every batch row `r` into `out[r]`. Quantized weights run the integer kernel (AVX2 with FMA
/// where the CPU has it, portable code otherwise: both compute the same exact integer lane sums and the same fused
/// multiply-adds in the same order, so results are identical on every machine); f32 weights run the f32 kernel.
fn columns(weight: &Weight, x: &[f32], xq: Option<&QuantizedRows>, c0: usize, out: &mut [&mut [f32]]) {
    match (xq, weight) {
        (None, _) => with_simd(|| columns_float(weight, x, c0, out, half_widener())),
        (Some(xq), Weight::Blocks { .. }) => {
            #[cfg(target_arch = "x86_64")]
            if x86::available() {
                return x86::columns_blocks(Isa::current(), weight, xq, c0, out);
            }
            columns_blocks(weight, xq, c0, out)
        }
        (Some(xq), _) => {
            #[cfg(target_arch = "x86_64")]
            if x86::available() {
                return x86::columns_int(Isa::current(), weight, xq, c0, out);
            }
            columns_int(weight, xq, c0, out)
        }
    }
}

/// Attention of one query row (all heads, `q` is `heads * head_dim`) over the positions whose keys and values
/// start at `slots` in one layer's KV storage (f16, or 8-bit blocks; each slot holds `kv_heads * head_dim` values;
/// grouped-query heads share theirs). The arithmetic is [`attention_portable`]'s, in fixed orders that depend only on this row,
/// never on the batch; the SIMD code computes the same bits.
pub fn attention(
    q: &[f32],
    slots: &[usize],
    keys: KvPlane<'_>,
    values: KvPlane<'_>,
    shape: AttentionShape,
    out: &mut [f32],
) {
    attention_rows(q, slots, &[(0, slots.len())], (keys, values), shape, false, out);
}

/// [`attention`] of several query rows that read one sequence's KV (a prefill chunk's rows): row `i`'s queries
/// are `q[i * heads * head_dim..]`, its output goes to the same place in `out`, and it attends over
/// `slots[ranges[i].0..ranges[i].1]`. Every row gets [`attention`]'s result for it alone, bit for bit. With
/// `split` (for a step with fewer row groups than threads: one long sequence decoding), a long range's work is
/// spread over the threads in tiles of positions (the flash-attention tiling, with the softmax kept whole), each
/// part still computed whole, so the bits stay the same; without, each row's range goes in one pass, which measured
/// faster on one thread (docs/worker.md). `kv`: the layer's keys and values.
pub fn attention_rows(
    q: &[f32],
    slots: &[usize],
    ranges: &[(usize, usize)],
    kv: (KvPlane<'_>, KvPlane<'_>),
    shape: AttentionShape,
    split: bool,
    out: &mut [f32],
) {
    attention_rows_at(Isa::current(), q, slots, ranges, kv, shape, split, out);
}

/// [`attention_rows`] at level `isa` (one the CPU has; every level computes the same bits).
#[allow(clippy::too_many_arguments)]
fn attention_rows_at(
    isa: Isa,
    q: &[f32],
    slots: &[usize],
    ranges: &[(usize, usize)],
    kv: (KvPlane<'_>, KvPlane<'_>),
    shape: AttentionShape,
    split: bool,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && shape.head_dim.is_multiple_of(8) {
        return x86::attention_rows(isa, q, slots, ranges, kv, shape, split, out);
    }
    let _ = (isa, split);
    let (keys, values) = kv;
    let qd = shape.heads * shape.head_dim;
    for ((q, out), &(lo, hi)) in q.chunks_exact(qd).zip(out.chunks_exact_mut(qd)).zip(ranges) {
        attention_portable(q, &slots[lo..hi], keys, values, shape, out);
    }
}

/// The 16-bit float widener of the level in use.
fn half_widener() -> portable::Widen {
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        return x86::widen_half;
    }
    weight::widen_half
}

/// The row group quantizer of the level in use.
fn group_quantizer() -> QuantizeGroup {
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        return x86::quantize_group;
    }
    quantize_group
}

/// A hint to fetch into the first-level cache the line `ahead` bytes past the start of `v` (the kernels hint their
/// weights this way; `zl-worker bench`'s bandwidth ceiling reads with it too). Nothing on other architectures.
#[inline]
pub fn prefetch_ahead<T>(v: &[T], ahead: usize) {
    #[cfg(target_arch = "x86_64")]
    x86::prefetch_at(v, ahead);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (v, ahead);
}

/// Add a low-rank update (a LoRA adapter's, for one matrix) to each of `rows` (row index into `x`'s rows, that
/// row's output), at the SIMD level in use; see `low_rank.rs`.
pub fn low_rank_update(w: LowRank<'_>, x: &[f32], rows: &mut [(usize, &mut [f32])]) {
    assert!(w.a.len() == w.rank * w.inputs && w.bt.len() == w.rank * w.outputs, "low-rank factor shapes");
    assert!(rows.iter().all(|(r, o)| (r + 1) * w.inputs <= x.len() && o.len() == w.outputs), "row shapes");
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        return x86::low_rank_rows(w, x, rows);
    }
    low_rank::low_rank_rows(w, x, rows)
}

/// Batch rows from which the per-row work (norms, RoPE and the new keys' and values' conversion, the gated
/// activation, adapters' updates, the engine's sampling) is spread over the pool; below it a dispatch costs more
/// than it saves.
pub const PARALLEL_ROWS: usize = 4;

/// `f(row, out_row)` for every row of `out` (rows of `width`), in parallel for large batches. Each row is computed
/// on its own, so splitting never changes a result.
pub fn per_row(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() / width.max(1) >= PARALLEL_ROWS {
        team::for_each(out.chunks_mut(width).enumerate().collect(), |(r, o)| with_simd(|| f(r, o)));
    } else {
        out.chunks_mut(width).enumerate().for_each(|(r, o)| f(r, o));
    }
}

/// Run `f` compiled for AVX2 where the CPU has it (the same IEEE operations either way, as Rust never fuses a
/// multiply and an add on its own; only the vector width changes). `f` and what it calls should be `#[inline]`.
#[inline(always)]
pub fn with_simd<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        return x86::run(f);
    }
    f()
}
