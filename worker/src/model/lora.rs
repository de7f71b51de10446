//! LoRA adapters applied at run time over a loaded base: for each adapted matrix `W`, a row's output is
//! `W x + scale * B (A x)`, with `A` of `rank` rows over the matrix's inputs and `B` of `rank` columns over its
//! outputs. The base's weights are never touched, so one step can carry rows of the base and of several adapters
//! (each row adds only its own adapter's update, grouped by adapter as punica's SGMV does). Every row's update reads
//! only that row, in a fixed order, so a request gets the same bits alone and in any batch. Loading (PEFT and GGUF
//! files) is `lora_load`'s; merging into a float model (the reference) is `lora_merge`'s.

use super::config::LlamaConfig;

use super::kernels::{LowRank, f16_to_f32, low_rank_update, team, to_half_bits};

/// The largest rank accepted (PEFT's published adapters go up to 256).
pub const MAX_RANK: usize = 512;

/// A matrix of a decoder layer an adapter can update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Query projection.
    Q,
    /// Key projection.
    K,
    /// Value projection.
    V,
    /// Attention output projection.
    O,
    /// MLP gate projection.
    Gate,
    /// MLP up projection.
    Up,
    /// MLP down projection.
    Down,
}

impl Target {
    /// Every target, in layer order.
    pub const ALL: [Target; 7] = [Target::Q, Target::K, Target::V, Target::O, Target::Gate, Target::Up, Target::Down];

    /// The module's name in Hugging Face models and PEFT's `target_modules`.
    pub fn peft_name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The tensor's name in GGUF files (`blk.N.<name>.weight`).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Target::Q => "attn_q",
            Target::K => "attn_k",
            Target::V => "attn_v",
            Target::O => "attn_output",
            Target::Gate => "ffn_gate",
            Target::Up => "ffn_up",
            Target::Down => "ffn_down",
        }
    }

    /// The base matrix's (outputs, inputs) in a model of `cfg`'s shape.
    pub fn shape(self, cfg: &LlamaConfig) -> (usize, usize) {
        let (h, q, kv, im) = (cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_dim(), cfg.intermediate);
        match self {
            Target::Q => (q, h),
            Target::K | Target::V => (kv, h),
            Target::O => (h, q),
            Target::Gate | Target::Up => (im, h),
            Target::Down => (h, im),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One matrix's low-rank update, its factors held as IEEE halves (half the bytes a step reads; the widening is
/// exact and the arithmetic f32).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraPair {
    rank: usize,
    inputs: usize,
    outputs: usize,
    /// `A`: `rank` rows of `inputs`.
    a: Vec<u16>,
    /// `B`'s columns times the scale: `rank` rows of `outputs` (so a row's update is a sum of whole rows).
    bt: Vec<u16>,
}

/// The largest finite IEEE half.
const HALF_MAX: f32 = 65504.0;

impl LoraPair {
    /// The update `scale * B A` from `A` (`rank` rows of `inputs`, row-major) and `B` (`outputs` rows of `rank`),
    /// rounded to halves (`B` after the scale); a value beyond a half's range is refused.
    pub fn new(a: &[f32], b: &[f32], inputs: usize, outputs: usize, scale: f32) -> Result<LoraPair, String> {
        if inputs == 0 || !a.len().is_multiple_of(inputs) {
            return Err(format!("A has {} values, not whole rows of {inputs}", a.len()));
        }
        let rank = a.len() / inputs;
        if rank == 0 || rank > MAX_RANK {
            return Err(format!("rank {rank} is outside 1..={MAX_RANK}"));
        }
        if b.len() != outputs * rank {
            return Err(format!("B has {} values, expected {outputs}x{rank} (outputs x rank)", b.len()));
        }
        if !scale.is_finite() || a.iter().chain(b).any(|v| !v.is_finite()) {
            return Err("a value or the scale is not finite".into());
        }
        let mut bt = vec![0f32; rank * outputs];
        for j in 0..outputs {
            for k in 0..rank {
                bt[k * outputs + j] = b[j * rank + k] * scale;
            }
        }
        if let Some(v) = a.iter().chain(&bt).find(|v| v.abs() > HALF_MAX) {
            return Err(format!("a factor value ({v}, after the scale) is beyond a 16-bit float's range"));
        }
        Ok(LoraPair { rank, inputs, outputs, a: to_half_bits(a), bt: to_half_bits(&bt) })
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// (outputs, inputs).
    pub fn shape(&self) -> (usize, usize) {
        (self.outputs, self.inputs)
    }

    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        (self.a.len() + self.bt.len()) * 2
    }

    /// `out += scale * B (A x)` for each of `rows` (row index into `x`'s rows of `inputs`, its output):
    /// [`low_rank_update`].
    fn add_to_rows(&self, x: &[f32], rows: &mut [(usize, &mut [f32])]) {
        let w = LowRank { a: &self.a, bt: &self.bt, rank: self.rank, inputs: self.inputs, outputs: self.outputs };
        low_rank_update(w, x, rows);
    }

    /// Add the update's row `j` (`scale * (B A)[j]`, one value per input) to `row`: merging into a float weight.
    pub fn add_delta_row(&self, j: usize, row: &mut [f32]) {
        for k in 0..self.rank {
            let c = f16_to_f32(self.bt[k * self.outputs + j]);
            let a = &self.a[k * self.inputs..(k + 1) * self.inputs];
            row.iter_mut().zip(a).for_each(|(w, &a)| *w += c * f16_to_f32(a));
        }
    }

    /// Reorder the output features within each of `heads` heads of `head_dim` between the two RoPE layouts: from
    /// rotate-half (Hugging Face: pairs `i`, `i + half`) to interleaved (llama.cpp's Llama GGUF: pairs `2i`,
    /// `2i + 1`) when `to_interleaved`, back otherwise. llama.cpp's converter permutes Q and K rows so; an adapter
    /// made for one layout applies to a base in the other through this.
    pub(crate) fn permute_heads(&mut self, heads: usize, head_dim: usize, to_interleaved: bool) {
        let half = head_dim / 2;
        for k in 0..self.rank {
            let column = &mut self.bt[k * self.outputs..(k + 1) * self.outputs];
            for head in column.chunks_exact_mut(head_dim).take(heads) {
                let old = head.to_vec();
                for i in 0..half {
                    for j in 0..2 {
                        let (interleaved, split) = (2 * i + j, j * half + i);
                        if to_interleaved {
                            head[interleaved] = old[split];
                        } else {
                            head[split] = old[interleaved];
                        }
                    }
                }
            }
        }
    }
}

/// An adapter's updates, checked against the base it applies to.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraAdapter {
    /// Per decoder layer, per [`Target`] (in [`Target::ALL`]'s order).
    layers: Vec<[Option<LoraPair>; 7]>,
}

impl LoraAdapter {
    /// An adapter from each layer's updates, checked against `cfg` (the base's shape): one entry per base layer, each
    /// update the shape of the matrix it updates, at least one update.
    pub fn new(layers: Vec<[Option<LoraPair>; 7]>, cfg: &LlamaConfig) -> Result<LoraAdapter, String> {
        if layers.len() != cfg.layers {
            return Err(format!("{} layers of updates for a base of {} layers", layers.len(), cfg.layers));
        }
        for (i, pairs) in layers.iter().enumerate() {
            for (target, pair) in Target::ALL.iter().zip(pairs) {
                let Some(p) = pair else { continue };
                let (outputs, inputs) = target.shape(cfg);
                if p.shape() != (outputs, inputs) {
                    return Err(format!(
                        "layer {i} {}: the update is {}x{} (outputs x inputs), the base's matrix {outputs}x{inputs}",
                        target.peft_name(),
                        p.outputs,
                        p.inputs
                    ));
                }
            }
        }
        if layers.iter().all(|l| l.iter().all(Option::is_none)) {
            return Err("the adapter updates no matrix".into());
        }
        Ok(LoraAdapter { layers })
    }

    /// The largest rank of its updates.
    pub fn rank(&self) -> usize {
        self.pairs().map(|(_, _, p)| p.rank).max().unwrap_or(0)
    }

    /// The targets it updates in some layer, in layer order.
    pub fn targets(&self) -> Vec<Target> {
        Target::ALL.into_iter().filter(|t| self.layers.iter().any(|l| l[t.index()].is_some())).collect()
    }

    /// Bytes its updates hold.
    pub fn memory_bytes(&self) -> usize {
        self.pairs().map(|(_, _, p)| p.memory_bytes()).sum()
    }

    /// Layer `layer`'s update of `target`, if it has one.
    pub fn pair(&self, layer: usize, target: Target) -> Option<&LoraPair> {
        self.layers.get(layer).and_then(|l| l[target.index()].as_ref())
    }

    /// Every update: (layer, target, update).
    pub fn pairs(&self) -> impl Iterator<Item = (usize, Target, &LoraPair)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| Target::ALL.into_iter().zip(l).filter_map(move |(t, p)| p.as_ref().map(|p| (i, t, p))))
    }

    /// Convert Q's and K's updates between the RoPE layouts ([`LoraPair::permute_heads`]).
    pub(crate) fn permute_heads(&mut self, cfg: &LlamaConfig, to_interleaved: bool) {
        for layer in &mut self.layers {
            for (target, heads) in [(Target::Q, cfg.heads), (Target::K, cfg.kv_heads)] {
                if let Some(p) = &mut layer[target.index()] {
                    p.permute_heads(heads, cfg.head_dim, to_interleaved);
                }
            }
        }
    }
}

/// Add each row's adapter updates of layer `layer` to its rows of the outputs: `x` holds the input rows the
/// matrices of `jobs` share, each job's buffer their output rows (the base's result), `rows[r]` row `r`'s adapter
/// (none: the base alone). One parallel region for all the jobs.
pub(crate) fn add_updates(rows: &[Option<&LoraAdapter>], layer: usize, x: &[f32], jobs: Vec<(Target, &mut [f32])>) {
    let n = rows.len();
    if n == 0 || rows.iter().all(Option::is_none) {
        return;
    }
    // Tasks of at most GROUP_ROWS rows that share an update, in row order.
    let mut tasks: Vec<(&LoraPair, Rows<'_>)> = Vec::new();
    for (target, out) in jobs {
        let outputs = out.len() / n;
        let first = tasks.len();
        for (r, o) in out.chunks_exact_mut(outputs).enumerate() {
            let Some(p) = rows[r].and_then(|a| a.pair(layer, target)) else { continue };
            match tasks[first..].iter_mut().rev().find(|(q, _)| std::ptr::eq(*q, p)) {
                Some((_, group)) if group.len() < GROUP_ROWS => group.push((r, o)),
                _ => tasks.push((p, vec![(r, o)])),
            }
        }
    }
    team::for_each(tasks, |(p, mut group)| p.add_to_rows(x, &mut group));
}

/// Output rows of one task: (row index, the row).
type Rows<'a> = Vec<(usize, &'a mut [f32])>;

/// Rows one task of [`add_updates`] takes at most: enough that an update's weights, read once, serve many rows;
/// few enough that one sequence's long prompt still splits over every thread.
const GROUP_ROWS: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::kernels::test_values as values;

    #[test]
    fn a_rows_update_is_the_scaled_product_of_b_and_a() {
        let (inputs, outputs, rank) = (40, 24, 3);
        // Factors a half holds exactly (and a scale of 2 keeps them so), so the halves change nothing.
        let halves = |v: Vec<f32>| to_half_bits(&v).into_iter().map(f16_to_f32).collect::<Vec<f32>>();
        let (a, b, x) = (halves(values(1, rank * inputs)), halves(values(2, outputs * rank)), values(3, inputs));
        let pair = LoraPair::new(&a, &b, inputs, outputs, 2.0).unwrap();
        assert_eq!((pair.rank(), pair.shape()), (rank, (outputs, inputs)));
        let mut out = vec![1.0f32; outputs];
        pair.add_to_rows(&x, &mut [(0, &mut out[..])]);
        for (j, o) in out.iter().enumerate() {
            let want: f64 = 1.0
                + 2.0
                    * (0..rank)
                        .map(|k| {
                            b[j * rank + k] as f64 * (0..inputs).map(|i| (a[k * inputs + i] * x[i]) as f64).sum::<f64>()
                        })
                        .sum::<f64>();
            assert!((*o as f64 - want).abs() < 1e-4, "{j}: {o} vs {want}");
            let mut delta = vec![0f32; inputs];
            pair.add_delta_row(j, &mut delta);
            let merged: f64 = 1.0 + delta.iter().zip(&x).map(|(d, x)| (d * x) as f64).sum::<f64>();
            assert!((merged - want).abs() < 1e-4);
        }
    }

    #[test]
    fn many_rows_of_one_adapter_get_each_rows_bits_alone() {
        let (inputs, outputs) = (24, 40);
        let pair = LoraPair::new(&values(1, 3 * inputs), &values(2, outputs * 3), inputs, outputs, 0.7).unwrap();
        let x = values(3, 11 * inputs);
        let mut together = vec![0.5f32; 11 * outputs];
        let mut rows: Vec<(usize, &mut [f32])> = together.chunks_exact_mut(outputs).enumerate().collect();
        pair.add_to_rows(&x, &mut rows);
        for r in 0..11 {
            let mut alone = vec![0.5f32; outputs];
            pair.add_to_rows(&x, &mut [(r, &mut alone[..])]);
            assert_eq!(alone, together[r * outputs..(r + 1) * outputs], "row {r}");
        }
    }

    #[test]
    fn bad_shapes_and_values_are_refused_with_the_reason() {
        assert!(LoraPair::new(&[0.0; 10], &[0.0; 8], 4, 4, 1.0).unwrap_err().contains("not whole rows"));
        assert!(LoraPair::new(&[0.0; 8], &[0.0; 9], 4, 4, 1.0).unwrap_err().contains("expected 4x2"));
        assert!(LoraPair::new(&[f32::NAN; 8], &[0.0; 8], 4, 4, 1.0).unwrap_err().contains("finite"));
        assert!(LoraPair::new(&[], &[], 4, 4, 1.0).unwrap_err().contains("rank 0"));
        assert!(LoraPair::new(&[1.0; 4], &[1.0; 4], 4, 4, 7e4).unwrap_err().contains("16-bit float's range"));
    }

    #[test]
    fn the_layout_permutation_goes_there_and_back_as_llama_cpp_orders_rows() {
        // Two heads of 4: rotate-half rows [a0 a1 b0 b1] become interleaved [a0 b0 a1 b1].
        let b: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let mut p = LoraPair::new(&[1.0], &b, 1, 8, 1.0).unwrap();
        let original = p.clone();
        p.permute_heads(2, 4, true);
        let bt: Vec<f32> = p.bt.iter().map(|&h| f16_to_f32(h)).collect();
        assert_eq!(bt, [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        p.permute_heads(2, 4, false);
        assert_eq!(p, original);
    }

    #[test]
    fn rows_without_an_adapter_keep_the_bases_output_and_each_row_gets_its_own() {
        let cfg = LlamaConfig::tiny(1, 2, 1, 4);
        let make = |seed| {
            let mut layer: [Option<LoraPair>; 7] = Default::default();
            layer[Target::Up.index()] =
                Some(LoraPair::new(&values(seed, 2 * 8), &values(seed + 1, 16 * 2), 8, 16, 0.5).unwrap());
            LoraAdapter::new(vec![layer], &cfg).unwrap()
        };
        let (one, two) = (make(10), make(20));
        assert_eq!((one.rank(), one.targets()), (2, vec![Target::Up]));
        let x = values(5, 3 * 8);
        let mut out = [0f32; 3 * 16];
        add_updates(&[Some(&one), None, Some(&two)], 0, &x, vec![(Target::Up, &mut out[..])]);
        assert!(out[16..32].iter().all(|&v| v == 0.0));
        let mut alone = vec![0f32; 16];
        add_updates(&[Some(&two)], 0, &x[16..24], vec![(Target::Up, &mut alone[..])]);
        assert_eq!(alone, out[32..48]);
        // A target the adapter leaves alone changes nothing.
        let mut q = [0f32; 3 * 8];
        add_updates(&[Some(&one), None, Some(&two)], 0, &x, vec![(Target::Q, &mut q[..])]);
        assert!(q.iter().all(|&v| v == 0.0));
        // Checked against the base: a wrong layer count or shape is refused.
        assert!(LoraAdapter::new(vec![], &cfg).unwrap_err().contains("0 layers"));
        let mut wrong: [Option<LoraPair>; 7] = Default::default();
        wrong[Target::Down.index()] = Some(LoraPair::new(&values(1, 8), &values(2, 16), 8, 16, 1.0).unwrap());
        assert!(LoraAdapter::new(vec![wrong], &cfg).unwrap_err().contains("down_proj"));
    }
}
