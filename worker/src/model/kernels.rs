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
//! Quantized weights stay quantized in memory (GGUF Q4_1 and Q8_0, the formats of the bundled model) and are
//! dequantized one block of 32 at a time inside the kernel, against f32 activations. Other formats are dequantized
//! to f32 at load.

use half::f16;
use rayon::prelude::*;

/// Elements per quantization block.
pub const QK: usize = 32;

/// Output columns per parallel task: big enough to amortise scheduling, small enough to balance two to 64 cores.
const COLS_PER_TASK: usize = 64;

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
        /// Per-block minimums.
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

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

impl Weight {
    /// Parse raw GGUF Q4_1 blocks (20 bytes each: f16 d, f16 m, 16 bytes of nibbles).
    pub fn from_q4_1(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        let err = |problem: String| WeightError { format: "Q4_1", rows, cols, problem };
        if cols % QK != 0 {
            return Err(err("input features are not a multiple of 32".into()));
        }
        let blocks = rows * cols / QK;
        if raw.len() != blocks * 20 {
            return Err(err(format!("{} bytes, expected {}", raw.len(), blocks * 20)));
        }
        let mut d = Vec::with_capacity(blocks);
        let mut m = Vec::with_capacity(blocks);
        let mut qs = Vec::with_capacity(blocks * 16);
        for block in raw.chunks_exact(20) {
            d.push(f16_at(block, 0));
            m.push(f16_at(block, 2));
            qs.extend_from_slice(&block[4..20]);
        }
        Ok(Weight::Q4_1 { rows, cols, d, m, qs })
    }

    /// Parse raw GGUF Q8_0 blocks (34 bytes each: f16 d, 32 signed bytes).
    pub fn from_q8_0(rows: usize, cols: usize, raw: &[u8]) -> Result<Weight, WeightError> {
        let err = |problem: String| WeightError { format: "Q8_0", rows, cols, problem };
        if cols % QK != 0 {
            return Err(err("input features are not a multiple of 32".into()));
        }
        let blocks = rows * cols / QK;
        if raw.len() != blocks * 34 {
            return Err(err(format!("{} bytes, expected {}", raw.len(), blocks * 34)));
        }
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
                    let q = &qs[blk * 16..blk * 16 + 16];
                    for j in 0..16 {
                        out[b * QK + j] = d[blk] * f32::from(q[j] & 0x0f) + m[blk];
                        out[b * QK + j + 16] = d[blk] * f32::from(q[j] >> 4) + m[blk];
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
        let (rows, cols) = (self.rows(), self.cols());
        assert_eq!(x.len(), n * cols, "input shape");
        assert_eq!(out.len(), n * rows, "output shape");
        if n == 0 {
            return;
        }
        // Each task fills a range of output columns for every batch row and returns them column-major; they are
        // scattered afterwards, so tasks never share output memory.
        let results: Vec<(usize, Vec<f32>)> =
            column_tasks(rows).map(|(c0, c1)| (c0, columns(self, x, n, c0, c1))).collect();
        for (c0, vals) in results {
            let width = vals.len() / n;
            for dc in 0..width {
                for r in 0..n {
                    out[r * rows + c0 + dc] = vals[dc * n + r];
                }
            }
        }
    }

    /// Block `b` of row `c` as f32 values.
    #[inline(always)]
    fn block(&self, c: usize, b: usize, w: &mut [f32; QK]) {
        match self {
            Weight::Q4_1 { cols, d, m, qs, .. } => {
                let blk = c * (cols / QK) + b;
                let q = &qs[blk * 16..blk * 16 + 16];
                let (d, m) = (d[blk], m[blk]);
                for j in 0..16 {
                    w[j] = d * f32::from(q[j] & 0x0f) + m;
                    w[j + 16] = d * f32::from(q[j] >> 4) + m;
                }
            }
            Weight::Q8_0 { cols, d, qs, .. } => {
                let blk = c * (cols / QK) + b;
                let q = &qs[blk * QK..blk * QK + QK];
                let d = d[blk];
                for j in 0..QK {
                    w[j] = d * f32::from(q[j]);
                }
            }
            Weight::F32 { cols, w: values, .. } => {
                w.copy_from_slice(&values[c * cols + b * QK..c * cols + b * QK + QK]);
            }
        }
    }
}

/// Column ranges for parallel tasks, run on rayon's pool, results in order.
fn column_tasks(rows: usize) -> impl IndexedParallelIterator<Item = (usize, usize)> {
    (0..rows.div_ceil(COLS_PER_TASK))
        .into_par_iter()
        .map(move |t| (t * COLS_PER_TASK, ((t + 1) * COLS_PER_TASK).min(rows)))
}

/// Output columns `c0..c1` for all `n` rows, column-major. Uses AVX2 where the CPU has it: the arithmetic is the
/// same IEEE operations in the same order either way, so results are identical on every x86-64 machine.
fn columns(weight: &Weight, x: &[f32], n: usize, c0: usize, c1: usize) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[allow(unsafe_code)]
        // SAFETY: `columns_avx2` only needs AVX2, which the CPU was just checked to have.
        return unsafe { columns_avx2(weight, x, n, c0, c1) };
    }
    columns_generic(weight, x, n, c0, c1)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn columns_avx2(weight: &Weight, x: &[f32], n: usize, c0: usize, c1: usize) -> Vec<f32> {
    columns_generic(weight, x, n, c0, c1)
}

/// The kernel: for each weight row, dequantize one block of 32 at a time (kept in registers) and multiply it into
/// every batch row, accumulating eight lanes per row in a fixed order. Weight bytes are read once per call.
#[inline(always)]
fn columns_generic(weight: &Weight, x: &[f32], n: usize, c0: usize, c1: usize) -> Vec<f32> {
    let cols = weight.cols();
    let mut vals = vec![0f32; (c1 - c0) * n];
    if cols % QK != 0 {
        // Only plain f32 weights can have such widths (quantized formats are checked at load).
        if let Weight::F32 { w, .. } = weight {
            for c in c0..c1 {
                for r in 0..n {
                    vals[(c - c0) * n + r] = dot_f32(&w[c * cols..(c + 1) * cols], &x[r * cols..(r + 1) * cols]);
                }
            }
        }
        return vals;
    }
    let blocks = cols / QK;
    let mut acc = vec![[0f32; 8]; n];
    let mut w = [0f32; QK];
    for c in c0..c1 {
        acc.iter_mut().for_each(|a| *a = [0.0; 8]);
        for b in 0..blocks {
            weight.block(c, b, &mut w);
            for (r, a) in acc.iter_mut().enumerate() {
                let xr = &x[r * cols + b * QK..r * cols + b * QK + QK];
                // Four independent products, summed as a tree, then one add into the accumulator: a short
                // dependency chain per block, and a fixed order.
                for l in 0..8 {
                    let p0 = w[l] * xr[l];
                    let p1 = w[8 + l] * xr[8 + l];
                    let p2 = w[16 + l] * xr[16 + l];
                    let p3 = w[24 + l] * xr[24 + l];
                    a[l] += (p0 + p1) + (p2 + p3);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            vals[(c - c0) * n + r] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        }
    }
    vals
}

/// Dot product with eight accumulators in a fixed order (vectorisable, and the same order for every call).
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
        let mut q8 = Vec::new();
        for block in w.chunks(QK) {
            let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
            q8.extend(f16::from_f32(amax / 127.0).to_le_bytes());
            q8.extend(block.iter().map(|v| ((v / (amax / 127.0)).round() as i8) as u8));
        }
        let weights = [
            Weight::from_f32(rows, cols, w.clone()).unwrap(),
            Weight::from_q4_1(rows, cols, &q4_1_raw(&w)).unwrap(),
            Weight::from_q8_0(rows, cols, &q8).unwrap(),
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

    #[test]
    fn wrong_sizes_are_refused() {
        assert!(Weight::from_q4_1(2, 32, &[0; 39]).is_err());
        assert!(Weight::from_q4_1(2, 30, &[0; 40]).is_err());
        assert!(Weight::from_q8_0(1, 32, &[0; 33]).is_err());
        assert!(Weight::from_f32(2, 2, vec![0.0; 3]).is_err());
    }
}
