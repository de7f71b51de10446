//! The Llama family's forward pass (Llama, Mistral, Qwen2/3, SmolLM, and Gemma 3's variations on it: scaled
//! embeddings, post-norms, GeGLU, sliding-window layers with their own RoPE base), batched over sequences with a
//! paged KV cache.
//!
//! One step takes every sequence's new tokens together: each weight multiplies all rows of the step at once (one
//! matmul per weight for the whole batch), while attention runs per sequence over that sequence's own KV blocks.
//! Every per-row operation (norms, RoPE, attention, activation) reads only its own row, in a fixed order, so the
//! result for a sequence does not depend on what else is in the batch. No IO; weights arrive already loaded.

pub use super::config::{Activation, LlamaConfig, MAX_HEAD_DIM, MoeConfig, SlidingWindow};
pub(crate) use super::kernels::PARALLEL_ROWS;
use super::kernels::{Activations, AttentionShape, Input, Weight, attention_rows, dot_f32, per_row, team, with_simd};
pub use super::kv_store::{KvDtype, KvStore};
use super::lora::{LoraAdapter, Target, add_updates};
pub use super::moe::Experts;
use super::moe::gated;
pub use super::rope::RopeScaling;
use super::rope::RopeTable;
use super::rotation::{self, turn};
use crate::kv::pool::BlockId;

/// One transformer block's weights.
#[derive(Debug)]
pub struct Layer {
    /// RMSNorm before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection.
    pub wq: Weight,
    /// Key projection.
    pub wk: Weight,
    /// Value projection.
    pub wv: Weight,
    /// Query, key and value biases (Qwen2).
    pub qkv_bias: Option<(Vec<f32>, Vec<f32>, Vec<f32>)>,
    /// Per-head RMSNorm weights of queries and keys, applied before RoPE (Qwen3, Gemma 3).
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// RMSNorms of the attention's and the MLP's outputs before they join the residual stream (Gemma 3).
    pub post_norms: Option<(Vec<f32>, Vec<f32>)>,
    /// Attention output projection.
    pub wo: Weight,
    /// RMSNorm before the MLP.
    pub ffn_norm: Vec<f32>,
    /// The MLP.
    pub ffn: Ffn,
}

/// A layer's MLP: one, or a mixture of experts.
// One per layer, built once at load and never moved on a step's path: the dense variant's size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Ffn {
    /// One gated MLP.
    Dense {
        /// Gate projection.
        gate: Weight,
        /// Up projection.
        up: Weight,
        /// Down projection.
        down: Weight,
    },
    /// Experts a router picks from per token.
    Experts(Box<Experts>),
}

impl Ffn {
    /// The dense MLP's gate, up and down projections (`None` for experts).
    pub fn dense(&self) -> Option<(&Weight, &Weight, &Weight)> {
        match self {
            Ffn::Dense { gate, up, down } => Some((gate, up, down)),
            Ffn::Experts(_) => None,
        }
    }

    /// Every matrix.
    pub fn matrices(&self) -> Box<dyn Iterator<Item = &Weight> + '_> {
        match self {
            Ffn::Dense { gate, up, down } => Box::new([gate, up, down].into_iter()),
            Ffn::Experts(e) => Box::new(e.matrices()),
        }
    }

    /// Every matrix, mutably.
    fn matrices_mut(&mut self) -> Box<dyn Iterator<Item = &mut Weight> + '_> {
        match self {
            Ffn::Dense { gate, up, down } => Box::new([gate, up, down].into_iter()),
            Ffn::Experts(e) => Box::new(e.matrices_mut()),
        }
    }
}

/// A loaded Llama-family model.
#[derive(Debug)]
pub struct Llama {
    cfg: LlamaConfig,
    pub(crate) embed: Weight,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Vec<f32>,
    /// The LM head; `None` when tied to the embeddings.
    pub(crate) output: Option<Weight>,
    /// RoPE's angles.
    pub(crate) rope: RopeTable,
    /// The local layers' angles, when they have their own base.
    pub(crate) local_rope: Option<RopeTable>,
}

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug)]
pub struct BatchItem<'a> {
    /// Token ids to feed.
    pub tokens: &'a [u32],
    /// Position of the first of them.
    pub start: usize,
    /// The sequence's block table.
    pub blocks: &'a [BlockId],
    /// Its table in the sliding-window layers' own blocks (`KvLayout::window`), covering each row's window; empty
    /// when those layers share `blocks`.
    pub window_blocks: &'a [BlockId],
    /// Return logits for this many of the item's last tokens (0: none; 1: the last token's, what decoding needs;
    /// more: a speculative step verifying draft tokens, which needs the logits after each of them).
    pub logits: usize,
    /// The LoRA adapter its rows add (`None`: the base alone).
    pub adapter: Option<&'a LoraAdapter>,
}

/// A base model and the adapter its rows add (none: the base alone): what the evaluations run.
#[derive(Clone, Copy, Debug)]
pub struct Tuned<'a> {
    /// The base.
    pub llama: &'a Llama,
    /// The adapter applied at run time.
    pub adapter: Option<&'a LoraAdapter>,
}

impl<'a> From<&'a Llama> for Tuned<'a> {
    fn from(llama: &'a Llama) -> Self {
        Tuned { llama, adapter: None }
    }
}

/// Rows that attend together (`attention_rows`): runs of one item's consecutive rows, at most [`TILE_ROWS`] each,
/// as ranges of rows.
pub(crate) fn row_tiles(row_item: &[usize]) -> Vec<(usize, usize)> {
    let mut tiles = Vec::new();
    let mut a = 0;
    for r in 1..=row_item.len() {
        if r == row_item.len() || row_item[r] != row_item[a] || r - a == TILE_ROWS {
            tiles.push((a, r));
            a = r;
        }
    }
    tiles
}

/// Rows per attention tile: enough that a tile of keys read once serves many rows, few enough that a long
/// prompt's chunk still splits over every thread and the rows' scores stay small.
const TILE_ROWS: usize = 16;

#[cfg(test)]
#[test]
fn row_tiles_split_runs_of_one_item_at_the_tile_size() {
    let row_item: Vec<usize> = [vec![0; 35], vec![1], vec![2; 16], vec![3, 3]].concat();
    assert_eq!(row_tiles(&row_item), [(0, 16), (16, 32), (32, 35), (35, 36), (36, 52), (52, 54)]);
    assert!(row_tiles(&[]).is_empty());
}

/// The rows of a step: row r belongs to item `.0[r]`, at position `.1[r]` (the items' tokens one after another).
pub(crate) fn step_rows(items: &[BatchItem<'_>]) -> (Vec<usize>, Vec<usize>) {
    let mut row_item = Vec::new();
    let mut row_pos = Vec::new();
    for (i, item) in items.iter().enumerate() {
        for t in 0..item.tokens.len() {
            row_item.push(i);
            row_pos.push(item.start + t);
        }
    }
    (row_item, row_pos)
}

/// The rows whose logits the items asked for (each item's last `logits` rows), in order.
pub(crate) fn logit_rows(items: &[BatchItem<'_>]) -> Vec<usize> {
    let mut rows = Vec::new();
    let mut end = 0;
    for item in items {
        end += item.tokens.len();
        rows.extend(end - item.logits.min(item.tokens.len())..end);
    }
    rows
}

#[inline]
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// [`rms_norm`] of `x` into itself (the same operations: its scale is taken before any value changes).
#[inline]
fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = *v * scale * w;
    }
}

/// RMSNorm's scale of `x`: the reciprocal of its root mean square (with `eps`).
#[inline]
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mean = dot_f32(x, x) / x.len() as f32;
    1.0 / (mean + eps).sqrt()
}

impl Llama {
    /// Assemble a model from loaded weights.
    pub fn new(
        cfg: LlamaConfig,
        embed: Weight,
        layers: Vec<Layer>,
        norm: Vec<f32>,
        output: Option<Weight>,
    ) -> Result<Llama, String> {
        cfg.validate()?;
        if layers.len() != cfg.layers {
            return Err(format!("{} layers loaded, config says {}", layers.len(), cfg.layers));
        }
        let check = |name: &str, w: &Weight, rows: usize, cols: usize| {
            if w.rows() == rows && w.cols() == cols {
                Ok(())
            } else {
                Err(format!("{name} is {}x{}, expected {rows}x{cols}", w.rows(), w.cols()))
            }
        };
        let (h, kv, q) = (cfg.hidden, cfg.kv_dim(), cfg.heads * cfg.head_dim);
        check("embeddings", &embed, cfg.vocab, h)?;
        if let Some(out) = &output {
            check("output", out, cfg.vocab, h)?;
        }
        for (i, l) in layers.iter().enumerate() {
            check(&format!("layer {i} q"), &l.wq, q, h)?;
            check(&format!("layer {i} k"), &l.wk, kv, h)?;
            check(&format!("layer {i} v"), &l.wv, kv, h)?;
            check(&format!("layer {i} o"), &l.wo, h, q)?;
            match (&l.ffn, &cfg.moe) {
                (Ffn::Dense { gate, up, down }, None) => {
                    check(&format!("layer {i} gate"), gate, cfg.intermediate, h)?;
                    check(&format!("layer {i} up"), up, cfg.intermediate, h)?;
                    check(&format!("layer {i} down"), down, h, cfg.intermediate)?;
                }
                (Ffn::Experts(e), Some(moe)) => {
                    e.check(moe, h, cfg.intermediate).map_err(|e| format!("layer {i} {e}"))?
                }
                (Ffn::Dense { .. }, Some(_)) => {
                    return Err(format!("layer {i} has a dense MLP in a mixture-of-experts model"));
                }
                (Ffn::Experts(_), None) => return Err(format!("layer {i} has experts, the config none")),
            }
            if l.attn_norm.len() != h || l.ffn_norm.len() != h {
                return Err(format!("layer {i} norm width"));
            }
            // Per head (Qwen3, Gemma 3), or over all heads at once (OLMoE).
            if let Some((qn, kn)) = &l.qk_norm
                && (![cfg.head_dim, q].contains(&qn.len()) || ![cfg.head_dim, kv].contains(&kn.len()))
            {
                return Err(format!(
                    "layer {i} query/key norm widths {} and {} (expected the head width {}, or {q} and {kv})",
                    qn.len(),
                    kn.len(),
                    cfg.head_dim
                ));
            }
            if let Some((a, f)) = &l.post_norms
                && (a.len() != h || f.len() != h)
            {
                return Err(format!("layer {i} post-norm width"));
            }
        }
        if norm.len() != h {
            return Err("final norm width".into());
        }
        let rope = RopeTable::new(cfg.rope_theta, cfg.rotary(), cfg.context_length, &cfg.rope_scaling);
        let local_rope =
            cfg.sliding.map(|s| RopeTable::new(s.local_theta, cfg.rotary(), cfg.context_length, &RopeScaling::None));
        Ok(Llama { cfg, embed, layers, norm, output, rope, local_rope })
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The decoder layers.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// Every matrix, embeddings first.
    pub fn matrices(&self) -> impl Iterator<Item = &Weight> {
        let layers = self.layers.iter().flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo].into_iter().chain(l.ffn.matrices()));
        std::iter::once(&self.embed).chain(layers).chain(self.output.as_ref())
    }

    /// Quantize the activations of every matrix whose format has kernels for `width` to it (8 bits: the repacked
    /// formats but Q5_K, [`Weight::set_activations`]), of the formats in `formats` only when it is not empty
    /// (`"Q4_K"`, `"Q6_K"`, ...: [`Weight::format_name`]); the others keep 16. Returns the share of the matrices'
    /// bytes that take `width`, in [0, 1].
    pub fn set_activations(&mut self, width: Activations, formats: &[&str]) -> f64 {
        let layers = self
            .layers
            .iter_mut()
            .flat_map(|l| [&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo].into_iter().chain(l.ffn.matrices_mut()));
        let (mut taken, mut all) = (0, 0);
        for w in std::iter::once(&mut self.embed).chain(layers).chain(self.output.as_mut()) {
            all += w.memory_bytes();
            if (formats.is_empty() || formats.contains(&w.format_name())) && w.set_activations(width) {
                taken += w.memory_bytes();
            }
        }
        taken as f64 / all.max(1) as f64
    }

    /// Weights in memory, for people: `"100.5 MiB (Q4_K 7.6, Q5_0 51.2, Q8_0 32.0 MiB)"`.
    pub fn weights_summary(&self) -> String {
        let by = self.weight_bytes_by_format();
        let mib = |b: usize| b as f64 / 1048576.0;
        let parts: Vec<String> = by.iter().map(|(f, b)| format!("{f} {:.1}", mib(*b))).collect();
        format!("{:.1} MiB ({} MiB)", mib(by.values().sum()), parts.join(", "))
    }

    /// Bytes of weights one sequence's decode step reads: every matrix, but of a mixture of experts' only the
    /// share its tokens run (`used` of `experts`, on average).
    pub fn decode_bytes(&self) -> usize {
        let all: usize = self.matrices().map(Weight::memory_bytes).sum();
        let Some(moe) = &self.cfg.moe else { return all };
        let experts: usize = self
            .layers
            .iter()
            .filter_map(|l| match &l.ffn {
                Ffn::Experts(e) => {
                    Some(e.gate.iter().chain(&e.up).chain(&e.down).map(Weight::memory_bytes).sum::<usize>())
                }
                Ffn::Dense { .. } => None,
            })
            .sum();
        all - experts + experts * moe.used / moe.experts
    }

    /// Bytes of weights in memory per format (`"Q4_K"`, `"F32"`, ...), matrices only.
    pub fn weight_bytes_by_format(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut by = std::collections::BTreeMap::new();
        for w in self.matrices() {
            *by.entry(w.format_name()).or_insert(0) += w.memory_bytes();
        }
        by
    }

    /// The RoPE tables of a local or global layer.
    pub(crate) fn rope_table(&self, local: bool) -> &RopeTable {
        match (&self.local_rope, local) {
            (Some(t), true) => t,
            _ => &self.rope,
        }
    }

    #[inline]
    fn rope(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let hd = self.cfg.head_dim;
        // Only the leading `rotary` dimensions turn (all, but for partial rotary), in pairs within them.
        let half = self.cfg.rotary() / 2;
        for head in x.chunks_exact_mut(hd) {
            for i in 0..half {
                let (a, b) = if self.cfg.rope_interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }

    /// Add a sublayer's output rows to the residual stream, through the sublayer's post-norm first when the layer
    /// has one (Gemma 3).
    fn join_residual(&self, x: &mut [f32], out: &mut [f32], post: Option<&Vec<f32>>) {
        let (h, eps) = (self.cfg.hidden, self.cfg.rms_eps);
        if let Some(w) = post {
            per_row(out, h, |_, row| rms_norm_in_place(row, w, eps));
        }
        x.iter_mut().zip(out.iter()).for_each(|(a, b)| *a += b);
    }

    /// The layer's per-head query and key norms (if it has them), then RoPE on one row's query and key at position
    /// `pos`.
    #[inline]
    fn rotate_row(&self, layer: &Layer, local: bool, pos: usize, q: &mut [f32], k: &mut [f32]) {
        if let Some((qn, kn)) = &layer.qk_norm {
            // Each head by itself, or the whole row (a norm as wide as the row: OLMoE's).
            for (x, w) in
                q.chunks_exact_mut(qn.len()).map(|x| (x, qn)).chain(k.chunks_exact_mut(kn.len()).map(|x| (x, kn)))
            {
                rms_norm_in_place(x, w, self.cfg.rms_eps);
            }
        }
        let (mut cos, mut sin) = ([0f32; MAX_HEAD_DIM / 2], [0f32; MAX_HEAD_DIM / 2]);
        let half = self.cfg.rotary() / 2;
        self.rope_table(local).at(pos, &mut cos[..half], &mut sin[..half]);
        self.rope(q, &cos[..half], &sin[..half]);
        self.rope(k, &cos[..half], &sin[..half]);
    }

    /// Run one step. Writes the new tokens' keys and values into `kv` and returns the logits each item asked for
    /// (its last `logits` tokens'), in item and token order, one row of `vocab` values after another (no per-row copies:
    /// at 16 sequences they are 3 MB a step).
    pub fn forward(&self, items: &[BatchItem<'_>], kv: &mut KvStore) -> Vec<f32> {
        // On a pool thread: the serial parts between parallel kernels then share the cores with the pool's other
        // threads instead of competing with them from outside the pool.
        team::scope(|| with_simd(|| self.forward_inner(items, kv, true)))
    }

    /// [`Llama::forward`] up to the final norm: the hidden states (rows of `hidden` values) of the rows each item
    /// asked for, which an embedding model pools.
    pub fn forward_hidden(&self, items: &[BatchItem<'_>], kv: &mut KvStore) -> Vec<f32> {
        team::scope(|| with_simd(|| self.forward_inner(items, kv, false)))
    }

    /// One step; `head`: through the output matrix to logits, else the final norm's output.
    #[inline(always)]
    fn forward_inner(&self, items: &[BatchItem<'_>], kv: &mut KvStore, head: bool) -> Vec<f32> {
        let cfg = &self.cfg;
        let (h, hd, kvd) = (cfg.hidden, cfg.head_dim, cfg.kv_dim());
        let qd = cfg.heads * hd;
        let (row_item, row_pos) = step_rows(items);
        let (rotated, turn_width, value_width) = (kv.rotated(), rotation::width(hd), rotation::width(hd).min(64));
        let n = row_item.len();
        if n == 0 {
            return Vec::new();
        }
        assert!(row_pos.iter().all(|&p| p < cfg.context_length), "position beyond the context window");
        let mut x = vec![0f32; n * h];
        let mut r = 0;
        for item in items {
            for &tok in item.tokens {
                self.embed.row((tok as usize).min(cfg.vocab - 1), &mut x[r * h..(r + 1) * h]);
                r += 1;
            }
        }
        // Storage offsets of every position each item attends over, computed once for all layers and heads.
        let item_slots: Vec<Vec<usize>> = items
            .iter()
            .map(|item| (0..item.start + item.tokens.len()).map(|p| kv.slot(item.blocks, p)).collect())
            .collect();
        let window = cfg.sliding.map_or(usize::MAX, |s| s.window.max(1));
        // The sliding-window layers' offsets where they have their own blocks: from the first position the item's
        // first row attends to (earlier ones are handed back).
        let window_slots: Vec<Option<(usize, Vec<usize>)>> = items
            .iter()
            .map(|item| {
                (!item.window_blocks.is_empty()).then(|| {
                    let base = (item.start + 1).saturating_sub(window);
                    (base, (base..item.start + item.tokens.len()).map(|p| kv.slot(item.window_blocks, p)).collect())
                })
            })
            .collect();
        // Each row's adapter: rows add their own adapter's updates after each base matmul.
        let row_adapter: Vec<Option<&LoraAdapter>> = row_item.iter().map(|&i| items[i].adapter).collect();
        let adapted = row_adapter.iter().any(Option::is_some);
        let lora = |li: usize, x: &[f32], jobs: Vec<(Target, &mut [f32])>| add_updates(&row_adapter, li, x, jobs);
        // The rows whose logits the items asked for: past the last layer's attention, no other row is read.
        let last_rows = logit_rows(items);
        let mut kept: Option<Vec<Option<&LoraAdapter>>> = None;
        let mut hbuf = vec![0f32; n * h];
        let mut q = vec![0f32; n * qd];
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        let mut attn = vec![0f32; n * qd];
        let mut proj = vec![0f32; n * h];
        // The dense MLP's buffers (allocated at its first layer: a mixture of experts has its own).
        let (mut gate, mut up) = (Vec::new(), Vec::new());
        if let Some(scale) = cfg.embed_scale {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        for (li, layer) in self.layers.iter().enumerate() {
            let local = cfg.is_local(li);
            per_row(&mut hbuf, h, |r, o| rms_norm(&x[r * h..(r + 1) * h], &layer.attn_norm, cfg.rms_eps, o));
            Input::new(&hbuf, n).matmul(vec![(&layer.wq, &mut q), (&layer.wk, &mut k), (&layer.wv, &mut v)]);
            if adapted {
                lora(li, &hbuf, vec![(Target::Q, &mut q), (Target::K, &mut k), (Target::V, &mut v)]);
            }
            if let Some((bq, bk, bv)) = &layer.qkv_bias {
                for r in 0..n {
                    q[r * qd..(r + 1) * qd].iter_mut().zip(bq).for_each(|(a, b)| *a += b);
                    k[r * kvd..(r + 1) * kvd].iter_mut().zip(bk).for_each(|(a, b)| *a += b);
                    v[r * kvd..(r + 1) * kvd].iter_mut().zip(bv).for_each(|(a, b)| *a += b);
                }
            }
            // Each row's rotation reads only that row: one parallel pass for large batches. Then the new keys and
            // values go to their slots, in the cache's type.
            if n >= PARALLEL_ROWS {
                let rows = q.chunks_mut(qd).zip(k.chunks_mut(kvd)).enumerate().collect();
                team::for_each(rows, |(r, (qr, kr))| with_simd(|| self.rotate_row(layer, local, row_pos[r], qr, kr)));
            } else {
                for (r, (qr, kr)) in q.chunks_mut(qd).zip(k.chunks_mut(kvd)).enumerate() {
                    self.rotate_row(layer, local, row_pos[r], qr, kr);
                }
            }
            if rotated {
                // A 4-bit cache: keys, queries and values turned per head before rounding (`rotation`).
                per_row(&mut q, qd, |_, row| turn(row, turn_width));
                per_row(&mut k, kvd, |_, row| turn(row, turn_width));
                per_row(&mut v, kvd, |_, row| turn(row, value_width));
            }
            for (r, (kr, vr)) in k.chunks_exact(kvd).zip(v.chunks_exact(kvd)).enumerate() {
                let item = &items[row_item[r]];
                let table = if local && !item.window_blocks.is_empty() { item.window_blocks } else { item.blocks };
                let slot = kv.slot(table, row_pos[r]);
                kv.write(li, slot, kr, vr);
            }
            let kv_ref: &KvStore = kv;
            let shape =
                AttentionShape { heads: cfg.heads, kv_heads: cfg.kv_heads, head_dim: hd, scale: cfg.attention_scale() };
            // Rows of one item attend together, a tile of rows at a time (`attention_rows`).
            let groups = row_tiles(&row_item);
            let mut outs = Vec::with_capacity(groups.len());
            let mut rest = &mut attn[..];
            for &(a, b) in &groups {
                let (out, tail) = rest.split_at_mut((b - a) * qd);
                outs.push(out);
                rest = tail;
            }
            // Fewer tiles than threads (one long sequence decoding): each splits its own work over the threads, one
            // tile after another (a region inside a task would run on its thread alone).
            let split = groups.len() < rayon::current_num_threads();
            let tile = |(out, &(a, b)): (&mut [f32], &(usize, usize))| {
                let it = row_item[a];
                let (base, slots) = match (&window_slots[it], local) {
                    (Some((base, slots)), true) => (*base, &slots[..]),
                    _ => (0, &item_slots[it][..]),
                };
                let ranges: Vec<(usize, usize)> = (a..b)
                    .map(|r| {
                        let first = if local { (row_pos[r] + 1).saturating_sub(window) } else { 0 };
                        (first - base, row_pos[r] + 1 - base)
                    })
                    .collect();
                attention_rows(&q[a * qd..b * qd], slots, &ranges, kv_ref.layer(li), shape, split, out);
            };
            if split {
                outs.into_iter().zip(&groups).for_each(tile);
            } else {
                team::for_each(outs.into_iter().zip(&groups).collect(), tile);
            }
            if rotated {
                // The weighted sums of turned values, turned back.
                per_row(&mut attn, qd, |_, row| turn(row, value_width));
            }
            layer.wo.matmul(&attn, n, &mut proj);
            if adapted {
                lora(li, &attn, vec![(Target::O, &mut proj)]);
            }
            self.join_residual(&mut x, &mut proj, layer.post_norms.as_ref().map(|p| &p.0));
            let mut n = n;
            if li + 1 == self.layers.len() && last_rows.len() < n {
                // The last layer's MLP runs for the rows that give logits only (a prompt's last token, not its
                // 511 others): each row's result is its own, so nothing else changes.
                if last_rows.is_empty() {
                    return Vec::new();
                }
                x = last_rows.iter().flat_map(|&r| x[r * h..(r + 1) * h].iter().copied()).collect();
                kept = Some(last_rows.iter().map(|&r| row_adapter[r]).collect());
                n = last_rows.len();
                hbuf.truncate(n * h);
                proj.truncate(n * h);
            }
            let lora = |li: usize, x: &[f32], jobs: Vec<(Target, &mut [f32])>| match &kept {
                Some(adapters) => add_updates(adapters, li, x, jobs),
                None => lora(li, x, jobs),
            };
            per_row(&mut hbuf, h, |r, o| rms_norm(&x[r * h..(r + 1) * h], &layer.ffn_norm, cfg.rms_eps, o));
            match (&layer.ffn, &cfg.moe) {
                (Ffn::Experts(experts), Some(moe)) => experts.forward(moe, cfg.activation, &hbuf, n, &mut proj),
                (ffn, _) => {
                    let (w_gate, w_up, w_down) = ffn.dense().expect("a dense MLP (checked at assembly)");
                    if gate.len() != n * cfg.intermediate {
                        gate = vec![0f32; n * cfg.intermediate];
                        up = vec![0f32; n * cfg.intermediate];
                    }
                    Input::new(&hbuf, n).matmul(vec![(w_gate, &mut gate), (w_up, &mut up)]);
                    if adapted {
                        lora(li, &hbuf, vec![(Target::Gate, &mut gate), (Target::Up, &mut up)]);
                    }
                    gated(cfg.activation, &mut gate, &up, cfg.intermediate);
                    w_down.matmul(&gate, n, &mut proj);
                    if adapted {
                        lora(li, &gate, vec![(Target::Down, &mut proj)]);
                    }
                }
            }
            self.join_residual(&mut x, &mut proj, layer.post_norms.as_ref().map(|p| &p.1));
        }
        // Logits only for the rows each item asked for (its last ones), which the last layer kept in order (or all
        // rows, when every one asked).
        if last_rows.is_empty() {
            return Vec::new();
        }
        let m = last_rows.len();
        let mut normed = vec![0f32; m * h];
        for i in 0..m {
            rms_norm(&x[i * h..(i + 1) * h], &self.norm, cfg.rms_eps, &mut normed[i * h..(i + 1) * h]);
        }
        if !head {
            return normed;
        }
        let mut logits = vec![0f32; m * cfg.vocab];
        let output = self.output.as_ref().unwrap_or(&self.embed);
        output.matmul(&normed, m, &mut logits);
        if !matches!(output, Weight::F32 { .. } | Weight::Half { .. }) {
            per_row(&mut logits, cfg.vocab, |i, row| rescore_leaders(output, &normed[i * h..(i + 1) * h], row));
        }
        logits
    }
}

/// Logits within this distance of a row's largest are recomputed exactly (int8 activations move a logit by a few
/// hundredths; this covers it many times over).
const RESCORE_MARGIN: f32 = 1.0;

/// At most this many logits of a row are recomputed (the largest, when more are within the margin).
const RESCORE_MAX: usize = 16;

/// Recompute the leading logits of one row from the f32 hidden state and the dequantized output rows. The
/// integer kernel quantizes the hidden state to 8 bits per value, which can swap two nearly tied leading tokens
/// (the default model's "The" and "La" after "What is the capital of France?" are 0.003 apart); the tokens that
/// greedy decoding, top-k and top-p actually choose between are scored at full precision instead, for about
/// 16 x hidden multiply-adds per row. Per row only, so batch-invariant.
fn rescore_leaders(output: &Weight, hidden: &[f32], logits: &mut [f32]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut leaders: Vec<usize> = (0..logits.len()).filter(|&c| logits[c] >= max - RESCORE_MARGIN).collect();
    if leaders.len() > RESCORE_MAX {
        leaders.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        leaders.truncate(RESCORE_MAX);
    }
    let mut row = vec![0f32; hidden.len()];
    for c in leaders {
        output.row(c, &mut row);
        logits[c] = dot_f32(&row, hidden);
    }
}
