//! The BERT family's encoder, as llama.cpp's graph for `bert` and `nomic-bert` runs it: token embeddings plus
//! token type 0's and learned positions' through a LayerNorm, then post-norm blocks of bidirectional attention and
//! an MLP (GELU for BERT; SwiGLU and RoPE for nomic-bert), every sublayer's output added to its input and
//! LayerNormed. No KV cache: every input is computed whole in one pass.

use super::super::gguf::{Reader, meta_f32, meta_usize};
use super::super::kernels::{Input, Weight, dot_f32, per_row, team, with_simd};
use super::super::llama::Activation;
use super::super::moe::{activate, gated};
use super::super::rope::{RopeScaling, RopeTable};
use super::super::{LoadError, TensorSource};
use candle_core::quantized::gguf_file::Content;

/// Which member of the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// BERT (bge, MiniLM, e5): learned positions, GELU MLP, biases.
    Bert,
    /// nomic-bert: RoPE, SwiGLU MLP, a fused QKV matrix.
    Nomic,
}

/// An encoder's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Model width.
    pub hidden: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// LayerNorm epsilon.
    pub eps: f32,
    /// Longest input in tokens.
    pub context_length: usize,
    /// Which member of the family.
    pub flavor: Flavor,
}

impl BertConfig {
    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// A LayerNorm's weight and bias.
#[derive(Debug)]
struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

impl Norm {
    fn load(r: &mut Reader<'_>, name: &str) -> Result<Norm, LoadError> {
        Ok(Norm { weight: r.vector(&format!("{name}.weight"))?, bias: r.vector(&format!("{name}.bias"))? })
    }

    /// `(x - mean) / sqrt(var + eps) * weight + bias`, in place (llama.cpp's `ggml_norm` then the affine part).
    #[inline]
    fn apply(&self, x: &mut [f32], eps: f32) {
        let n = x.len() as f32;
        let mean = x.iter().sum::<f32>() / n;
        x.iter_mut().for_each(|v| *v -= mean);
        let var = dot_f32(x, x) / n;
        let scale = 1.0 / (var + eps).sqrt();
        for ((v, w), b) in x.iter_mut().zip(&self.weight).zip(&self.bias) {
            *v = *v * scale * w + b;
        }
    }
}

/// One block.
#[derive(Debug)]
struct Block {
    q: Weight,
    k: Weight,
    v: Weight,
    /// Q, K and V biases (BERT).
    qkv_bias: Option<[Vec<f32>; 3]>,
    o: Weight,
    o_bias: Option<Vec<f32>>,
    attn_norm: Norm,
    up: Weight,
    up_bias: Option<Vec<f32>>,
    /// The SwiGLU gate (nomic-bert).
    gate: Option<Weight>,
    down: Weight,
    down_bias: Option<Vec<f32>>,
    out_norm: Norm,
}

/// A loaded encoder.
#[derive(Debug)]
pub struct Bert {
    cfg: BertConfig,
    embed: Weight,
    /// Token type 0's embedding (every token is "sentence A").
    type0: Option<Vec<f32>>,
    /// Learned position embeddings, `context_length` rows (BERT).
    positions: Option<Vec<f32>>,
    embed_norm: Norm,
    blocks: Vec<Block>,
    /// RoPE's angles (nomic-bert).
    rope: Option<RopeTable>,
}

/// `bias` added to each row of `x` (rows of `bias.len()`).
fn add_bias(x: &mut [f32], bias: Option<&Vec<f32>>) {
    if let Some(b) = bias {
        x.chunks_exact_mut(b.len()).for_each(|row| row.iter_mut().zip(b).for_each(|(v, b)| *v += b));
    }
}

impl Bert {
    /// Load the encoder of architecture `arch` ("bert" or "nomic-bert") from an open GGUF file.
    pub(crate) fn load(content: &Content, r: &mut Reader<'_>, arch: &str, vocab: usize) -> Result<Bert, LoadError> {
        let key = |k: &str| format!("{arch}.{k}");
        let flavor = if arch == "nomic-bert" { Flavor::Nomic } else { Flavor::Bert };
        let heads = meta_usize(content, &key("attention.head_count"))?;
        let cfg = BertConfig {
            hidden: meta_usize(content, &key("embedding_length"))?,
            intermediate: meta_usize(content, &key("feed_forward_length"))?,
            layers: meta_usize(content, &key("block_count"))?,
            heads,
            kv_heads: meta_usize(content, &key("attention.head_count_kv")).unwrap_or(heads),
            eps: meta_f32(content, &key("attention.layer_norm_epsilon")).unwrap_or(1e-12),
            context_length: meta_usize(content, &key("context_length")).unwrap_or(512),
            flavor,
        };
        if cfg.heads == 0
            || cfg.kv_heads == 0
            || !cfg.hidden.is_multiple_of(cfg.heads)
            || !cfg.heads.is_multiple_of(cfg.kv_heads)
            || cfg.layers == 0
            || !cfg.head_dim().is_multiple_of(2)
        {
            return Err(LoadError::Format(format!(
                "{arch}: {} wide with {} heads ({} key/value heads) is not a valid shape",
                cfg.hidden, cfg.heads, cfg.kv_heads
            )));
        }
        let embed = r.weight("token_embd.weight")?;
        if embed.rows() != vocab || embed.cols() != cfg.hidden {
            return Err(LoadError::Format(format!(
                "token_embd.weight is {}x{}, the vocabulary and width say {vocab}x{}",
                embed.rows(),
                embed.cols(),
                cfg.hidden
            )));
        }
        let h = cfg.hidden;
        let type0 = match r.has("token_types.weight") {
            true => Some(
                r.vector("token_types.weight")?
                    .get(..h)
                    .map(<[f32]>::to_vec)
                    .ok_or_else(|| LoadError::Format("token_types.weight has no row for token type 0".into()))?,
            ),
            false => None,
        };
        let positions = match flavor {
            Flavor::Bert => {
                let p = r.vector("position_embd.weight")?;
                if p.len() < cfg.context_length * h {
                    return Err(LoadError::Format(format!(
                        "position_embd.weight holds {} positions, the context is {}",
                        p.len() / h,
                        cfg.context_length
                    )));
                }
                Some(p)
            }
            Flavor::Nomic => None,
        };
        let rope = (flavor == Flavor::Nomic).then(|| {
            let theta = meta_f32(content, &key("rope.freq_base")).unwrap_or(10_000.0);
            RopeTable::new(theta, cfg.head_dim(), cfg.context_length, &RopeScaling::None)
        });
        let embed_norm = Norm::load(r, "token_embd_norm")?;
        let mut blocks = Vec::with_capacity(cfg.layers);
        let kvd = cfg.kv_heads * cfg.head_dim();
        for i in 0..cfg.layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            let optional = |r: &mut Reader<'_>, name: String| -> Result<Option<Vec<f32>>, LoadError> {
                if r.has(&name) { r.vector(&name).map(Some) } else { Ok(None) }
            };
            let [q, k, v] = if r.has(&p("attn_q.weight")) {
                [r.weight(&p("attn_q.weight"))?, r.weight(&p("attn_k.weight"))?, r.weight(&p("attn_v.weight"))?]
            } else {
                <[Weight; 3]>::try_from(r.split(&p("attn_qkv.weight"), &[h, kvd, kvd])?)
                    .map_err(|_| LoadError::Format(format!("{}: not three parts", p("attn_qkv.weight"))))?
            };
            let qkv_bias = match (optional(r, p("attn_q.bias"))?, r.has(&p("attn_qkv.bias"))) {
                (Some(bq), _) => Some([bq, r.vector(&p("attn_k.bias"))?, r.vector(&p("attn_v.bias"))?]),
                (None, true) => {
                    let all = r.vector(&p("attn_qkv.bias"))?;
                    if all.len() != h + 2 * kvd {
                        return Err(LoadError::Format(format!("{} has {} values", p("attn_qkv.bias"), all.len())));
                    }
                    Some([all[..h].to_vec(), all[h..h + kvd].to_vec(), all[h + kvd..].to_vec()])
                }
                (None, false) => None,
            };
            blocks.push(Block {
                q,
                k,
                v,
                qkv_bias,
                o: r.weight(&p("attn_output.weight"))?,
                o_bias: optional(r, p("attn_output.bias"))?,
                attn_norm: Norm::load(r, &p("attn_output_norm"))?,
                up: r.weight(&p("ffn_up.weight"))?,
                up_bias: optional(r, p("ffn_up.bias"))?,
                gate: match flavor {
                    Flavor::Nomic => Some(r.weight(&p("ffn_gate.weight"))?),
                    Flavor::Bert => None,
                },
                down: r.weight(&p("ffn_down.weight"))?,
                down_bias: optional(r, p("ffn_down.bias"))?,
                out_norm: Norm::load(r, &p("layer_output_norm"))?,
            });
        }
        Ok(Bert { cfg, embed, type0, positions, embed_norm, blocks, rope })
    }

    /// Its shape.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// Bytes of its matrices in memory.
    pub fn weight_bytes(&self) -> usize {
        let block = |b: &Block| {
            [&b.q, &b.k, &b.v, &b.o, &b.up, &b.down].iter().map(|w| w.memory_bytes()).sum::<usize>()
                + b.gate.as_ref().map_or(0, Weight::memory_bytes)
        };
        self.embed.memory_bytes() + self.blocks.iter().map(block).sum::<usize>()
    }

    /// The last block's output for every token of every input (rows of `hidden`, inputs one after another). Each
    /// input attends over itself only, every token to every token.
    pub fn forward(&self, inputs: &[&[u32]]) -> Vec<f32> {
        team::scope(|| with_simd(|| self.forward_inner(inputs)))
    }

    #[inline(always)]
    fn forward_inner(&self, inputs: &[&[u32]]) -> Vec<f32> {
        let cfg = &self.cfg;
        let (h, hd) = (cfg.hidden, cfg.head_dim());
        let kvd = cfg.kv_heads * hd;
        // Row r: its input's first row and end, and its position.
        let mut spans = Vec::new();
        let mut pos = Vec::new();
        let mut at = 0;
        for input in inputs {
            for p in 0..input.len() {
                spans.push((at, at + input.len()));
                pos.push(p);
            }
            at += input.len();
        }
        let n = pos.len();
        let mut x = vec![0f32; n * h];
        let tokens: Vec<u32> = inputs.iter().flat_map(|i| i.iter().copied()).collect();
        per_row(&mut x, h, |r, row| {
            self.embed.row((tokens[r] as usize).min(self.embed.rows() - 1), row);
            if let Some(t) = &self.type0 {
                row.iter_mut().zip(t).for_each(|(v, t)| *v += t);
            }
            if let Some(p) = &self.positions {
                let at = pos[r].min(cfg.context_length - 1) * h;
                row.iter_mut().zip(&p[at..at + h]).for_each(|(v, p)| *v += p);
            }
            self.embed_norm.apply(row, cfg.eps);
        });
        let (mut q, mut k, mut v) = (vec![0f32; n * h], vec![0f32; n * kvd], vec![0f32; n * kvd]);
        let mut attn = vec![0f32; n * h];
        let mut proj = vec![0f32; n * h];
        let (mut up, mut gate) = (vec![0f32; n * cfg.intermediate], vec![0f32; n * cfg.intermediate]);
        let scale = 1.0 / (hd as f32).sqrt();
        for b in &self.blocks {
            Input::new(&x, n).matmul(vec![(&b.q, &mut q), (&b.k, &mut k), (&b.v, &mut v)]);
            if let Some([bq, bk, bv]) = &b.qkv_bias {
                add_bias(&mut q, Some(bq));
                add_bias(&mut k, Some(bk));
                add_bias(&mut v, Some(bv));
            }
            if let Some(rope) = &self.rope {
                per_row(&mut q, h, |r, row| rotate(rope, hd, pos[r], row));
                per_row(&mut k, kvd, |r, row| rotate(rope, hd, pos[r], row));
            }
            let group = cfg.heads / cfg.kv_heads;
            per_row(&mut attn, h, |r, out| {
                let (lo, hi) = spans[r];
                let mut scores = vec![0f32; hi - lo];
                for head in 0..cfg.heads {
                    let kv = (head / group) * hd;
                    let qh = &q[r * h + head * hd..r * h + (head + 1) * hd];
                    for (j, s) in scores.iter_mut().enumerate() {
                        *s = dot_f32(qh, &k[(lo + j) * kvd + kv..(lo + j) * kvd + kv + hd]) * scale;
                    }
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut sum = 0f32;
                    scores.iter_mut().for_each(|s| {
                        *s = (*s - max).exp();
                        sum += *s;
                    });
                    let o = &mut out[head * hd..(head + 1) * hd];
                    o.fill(0.0);
                    for (j, s) in scores.iter().enumerate() {
                        let w = s / sum;
                        let vj = &v[(lo + j) * kvd + kv..(lo + j) * kvd + kv + hd];
                        o.iter_mut().zip(vj).for_each(|(o, v)| *o += w * v);
                    }
                }
            });
            b.o.matmul(&attn, n, &mut proj);
            add_bias(&mut proj, b.o_bias.as_ref());
            // Post-norm: the sublayer's output plus its input, normalized, is the next input.
            proj.iter_mut().zip(&x).for_each(|(p, x)| *p += x);
            per_row(&mut proj, h, |_, row| b.attn_norm.apply(row, cfg.eps));
            std::mem::swap(&mut x, &mut proj);
            match &b.gate {
                Some(g) => {
                    Input::new(&x, n).matmul(vec![(g, &mut gate), (&b.up, &mut up)]);
                    gated(Activation::Silu, &mut gate, &up, cfg.intermediate);
                }
                None => {
                    b.up.matmul(&x, n, &mut gate);
                    add_bias(&mut gate, b.up_bias.as_ref());
                    // llama.cpp's GELU is the tanh approximation.
                    per_row(&mut gate, cfg.intermediate, |_, row| {
                        row.iter_mut().for_each(|g| *g = activate(Activation::GeluTanh, *g))
                    });
                }
            }
            b.down.matmul(&gate, n, &mut proj);
            add_bias(&mut proj, b.down_bias.as_ref());
            proj.iter_mut().zip(&x).for_each(|(p, x)| *p += x);
            per_row(&mut proj, h, |_, row| b.out_norm.apply(row, cfg.eps));
            std::mem::swap(&mut x, &mut proj);
        }
        x
    }
}

/// RoPE over each head of one row at `pos`, NeoX style (the two halves of a head turn together).
#[inline]
fn rotate(rope: &RopeTable, hd: usize, pos: usize, row: &mut [f32]) {
    let half = hd / 2;
    let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
    rope.at(pos, &mut cos, &mut sin);
    for head in row.chunks_exact_mut(hd) {
        for i in 0..half {
            let (x0, x1) = (head[i], head[i + half]);
            head[i] = x0 * cos[i] - x1 * sin[i];
            head[i + half] = x0 * sin[i] + x1 * cos[i];
        }
    }
}
