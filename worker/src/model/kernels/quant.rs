//! Activations quantized for the integer kernels: each row on its own, per block of 32, to 16-bit integers and
//! one scale, laid out in row groups so a kernel sweeping a group reads one sequential stream.
//!
//! Sixteen bits by default: with 8-bit activations (llama.cpp's Q8_0/Q8_1 convention) the bundled model's greedy
//! answers agreed with the float reference path on about 13 of 20 questions, with 16 bits on all of them (see
//! docs/worker.md, "Quality"). Eight bits ([`Activations::Eight`]) where a weight asks for them
//! (`--activations 8`): the same blocks, the quants within ±127, so every kernel still computes them (exact integer
//! sums, the same bits at every level), and a signed byte copy of them ([`QuantizedRows::bytes`]) for the kernels
//! that take a product of four bytes per lane (`x86/int8.rs`).

use super::QK;
use super::blocks::{HALVES, SUB};
use super::math::sum_f32;

/// Quantize one row group (up to [`ROW_GROUP`] rows of `x`) into its interleaved blocks and its rows' block sums.
#[inline(always)]
pub(super) fn quantize_group(x: &[f32], cols: usize, blocks: &mut [XBlock], sums: &mut [f32], qmax: f32) {
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
            let d = amax / qmax;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut q = [0i16; QK];
            for (qv, &v) in q.iter_mut().zip(block) {
                // Round half away from zero without a libm call; |v * inv| <= qmax (plus a rounding) by
                // construction, and the conversion saturates.
                let t = v * inv;
                *qv = (t + 0.5f32.copysign(t)) as i16;
            }
            sums[r * bpr + b] = sum_f32(block);
            blocks[b * rows + r] = XBlock::new(q, d);
        }
    }
}

/// A row group quantizer: [`quantize_group`]'s signature, which every SIMD level's copy shares.
pub(super) type QuantizeGroup = fn(&[f32], usize, &mut [XBlock], &mut [f32], f32);

/// How wide a weight's activations are quantized: 16-bit integers (the float path's greedy answers) or 8-bit ones
/// (llama.cpp's width; twice the products per instruction where a kernel takes bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activations {
    #[default]
    /// 16-bit quants (the default).
    Sixteen,
    /// 8-bit quants.
    Eight,
}

impl Activations {
    /// The formats whose matrices take 8-bit activations by default (`zl-worker serve --activations auto`): those
    /// on which the 8-bit activations rule held (docs/worker.md, "8-bit activations"; `scripts/eval-activations`).
    /// Q4_0 (+0.46% perplexity on SmolLM2, within the rule but at its edge on the one file) and Q4_1 (where the
    /// rule fails: +1.44%, the bundled model) keep 16 bits; so does Q8_0, where the rule held, as it is the bundled
    /// model's other format (its embeddings and output), whose 16-bit greedy answers the examples and tests rely on.
    pub const EIGHT_BY_DEFAULT: &'static [&'static str] = &["Q4_K", "Q6_K", "Q5_0", "Q5_1"];

    /// A line for people: the width and the share of the weights' bytes (`share`, in [0, 1]) that take it.
    pub fn note(self, share: f64) -> String {
        format!("{}-bit activations for {:.0}% of the weights' bytes (the others 16-bit)", self.bits(), share * 100.0)
    }

    /// The largest quant magnitude: a block's largest value maps to it.
    pub(super) fn qmax(self) -> f32 {
        match self {
            Activations::Sixteen => 32767.0,
            Activations::Eight => 127.0,
        }
    }

    /// The width in bits (8 or 16).
    pub fn bits(self) -> u32 {
        match self {
            Activations::Sixteen => 16,
            Activations::Eight => 8,
        }
    }
}

impl std::str::FromStr for Activations {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "16" => Ok(Activations::Sixteen),
            "8" => Ok(Activations::Eight),
            other => Err(format!("activations: {other:?} is not 8 or 16")),
        }
    }
}

/// One block of 32 activations quantized to 16-bit integers, as the integer kernels consume them: `x ≈ d * q`.
/// A weight's block product with it is an exact 32-bit integer (at most 32 * 128 * 32767 in magnitude).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub(super) struct XBlock {
    pub(super) q: [i16; QK],
    pub(super) d: f32,
}

impl XBlock {
    pub(super) const ZERO: XBlock = XBlock { q: [0; QK], d: 0.0 };

    /// A block of quants and their scale.
    #[inline(always)]
    pub(super) fn new(q: [i16; QK], d: f32) -> XBlock {
        XBlock { q, d }
    }
}

/// Rows per group of [`QuantizedRows::byte_planes`] (the tile unit's 16 rows).
pub(super) const PLANE_ROWS: usize = 16;

/// Where row `r`'s block `b` starts in [`QuantizedRows::byte_planes`] (`bpr` blocks per row): its 32 low bytes,
/// and [`PLANE_ROWS`] `* 32` bytes further its 32 high bytes.
#[inline(always)]
pub(super) fn plane_at(bpr: usize, r: usize, b: usize) -> usize {
    ((r / PLANE_ROWS * bpr + b) * 2 * PLANE_ROWS + r % PLANE_ROWS) * QK
}

/// Batch rows the SIMD kernel runs together; the quantized activations are laid out in groups of this many rows.
pub(super) const ROW_GROUP: usize = 8;

/// A batch of activations quantized block by block, with each block's f32 sum (row-major) for the Q4_1 minimum
/// term and each 16 quants' exact integer sum (row-major, `[row][block][half]`) for the other formats' minimums. Blocks are stored in groups of [`ROW_GROUP`] rows,
/// interleaved block by block (`[group][block][row in group]`), so a kernel sweeping a group reads one sequential
/// stream. Each row is quantized on its own, so a row's values never depend on the rest of the batch; only where
/// they are stored does.
#[derive(Debug)]
pub(super) struct QuantizedRows {
    pub(super) blocks: Vec<XBlock>,
    pub(super) sums: Vec<f32>,
    pub(super) isums: Vec<i32>,
    /// With eight bits, `isums` as f32 (exact), which the 8-bit kernels broadcast from memory (empty with sixteen).
    pub(super) fsums: Vec<f32>,
    pub(super) rows: usize,
    pub(super) blocks_per_row: usize,
    /// The quants' width.
    pub(super) width: Activations,
    /// With eight bits, each block's quants as signed bytes, 32 per block where [`QuantizedRows::index`] puts the
    /// block (empty with sixteen).
    pub(super) bytes: Vec<i8>,
    /// [`QuantizedRows::byte_planes`], made on first use.
    planes: std::sync::OnceLock<Vec<u8>>,
    /// [`QuantizedRows::high_sums`], made on first use.
    high_sums: std::sync::OnceLock<Vec<i32>>,
}

impl QuantizedRows {
    /// Quantize `x` (rows of `cols` values) to `width`, one row group per parallel task, each by `group`
    /// ([`quantize_group`] or a SIMD level's copy of it: the same arithmetic either way; `mod.rs` chooses).
    pub(super) fn quantize(x: &[f32], cols: usize, group: QuantizeGroup, width: Activations) -> QuantizedRows {
        debug_assert_eq!(cols % QK, 0);
        let (rows, bpr) = (x.len() / cols, cols / QK);
        let eight = width == Activations::Eight;
        let mut out = QuantizedRows {
            blocks: vec![XBlock::ZERO; rows * bpr],
            sums: vec![0f32; rows * bpr],
            isums: vec![0i32; rows * bpr * HALVES],
            fsums: Vec::new(),
            rows,
            blocks_per_row: bpr,
            width,
            bytes: vec![0i8; if eight { rows * bpr * QK } else { 0 }],
            planes: std::sync::OnceLock::new(),
            high_sums: std::sync::OnceLock::new(),
        };
        let mut bytes: Vec<&mut [i8]> = out.bytes.chunks_mut(ROW_GROUP * bpr * QK).collect();
        bytes.resize_with(rows.div_ceil(ROW_GROUP), Default::default);
        let groups: Vec<_> = out
            .blocks
            .chunks_mut(ROW_GROUP * bpr)
            .zip(out.sums.chunks_mut(ROW_GROUP * bpr))
            .zip(x.chunks(ROW_GROUP * cols))
            .zip(out.isums.chunks_mut(ROW_GROUP * bpr * HALVES))
            .zip(bytes)
            .collect();
        super::team::for_each(groups, |((((blocks, sums), x), isums), bytes)| {
            group(x, cols, blocks, sums, width.qmax());
            // The blocks' order within the group is the bytes' (within ±127 with eight bits: exact).
            for (block, out) in blocks.iter().zip(bytes.chunks_exact_mut(QK)) {
                for (o, &q) in out.iter_mut().zip(&block.q) {
                    *o = q as i8;
                }
            }
            // Exact integer sums: the same at every level, so computed here once for all of them.
            let rows = x.len() / cols;
            for (i, isum) in isums.iter_mut().enumerate() {
                let (r, b, h) = (i / (bpr * HALVES), i / HALVES % bpr, i % HALVES);
                let q = &blocks[b * rows + r].q[h * SUB..(h + 1) * SUB];
                *isum = q.iter().map(|&v| i32::from(v)).sum();
            }
        });
        if eight {
            out.fsums = out.isums.iter().map(|&v| v as f32).collect();
        }
        out
    }

    /// Each quant split into its bytes, `q = 256 * hi + lo` (`lo` unsigned, `hi` signed), for the 8-bit products
    /// (the tile unit's, AVX-512 VNNI's): per group of [`PLANE_ROWS`] rows (the last padded with zero rows) and
    /// block, the rows' 32 low bytes, then their 32 high bytes (`[group][block][lo, hi][row][element]`: row `r`'s
    /// block `b` at [`plane_at`]). Made once per batch, on first use.
    pub(super) fn byte_planes(&self) -> &[u8] {
        self.planes.get_or_init(|| {
            let bpr = self.blocks_per_row;
            let group = bpr * 2 * PLANE_ROWS * QK;
            let mut bytes = vec![0u8; self.rows.div_ceil(PLANE_ROWS) * group];
            // A group of rows per task (a prompt's are hundreds of rows).
            super::team::for_each(bytes.chunks_mut(group).enumerate().collect(), |(g, planes)| {
                for r in g * PLANE_ROWS..((g + 1) * PLANE_ROWS).min(self.rows) {
                    for b in 0..bpr {
                        let at = plane_at(bpr, r, b) - g * group;
                        let (lo, hi) = planes[at..].split_at_mut(PLANE_ROWS * QK);
                        for ((lo, hi), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&self.blocks[self.index(r, b)].q) {
                            *lo = q as u8;
                            *hi = (q >> 8) as u8;
                        }
                    }
                }
            });
            bytes
        })
    }

    /// Each block's sum of its quants' high bytes (`[row][block]`): a signed weight's product with the high bytes
    /// is taken as `(w + 128) · hi - 128 * sum(hi)`. Made on first use.
    pub(super) fn high_sums(&self) -> &[i32] {
        self.high_sums.get_or_init(|| {
            let bpr = self.blocks_per_row;
            (0..self.rows * bpr)
                .map(|i| self.blocks[self.index(i / bpr, i % bpr)].q.iter().map(|&q| i32::from(q >> 8)).sum())
                .collect()
        })
    }

    /// Where block `b` of row `r` is stored.
    #[inline(always)]
    pub(super) fn index(&self, r: usize, b: usize) -> usize {
        let group = r / ROW_GROUP;
        let in_group = (self.rows - group * ROW_GROUP).min(ROW_GROUP);
        group * ROW_GROUP * self.blocks_per_row + b * in_group + r % ROW_GROUP
    }
}
