//! The shape and constants of a Llama-family model, as its file states them.

use super::rope::RopeScaling;

/// The widest attention head supported (Gemma 3 and Qwen3 use 256 and 128).
pub const MAX_HEAD_DIM: usize = 512;

/// The most experts a mixture-of-experts layer may have (gpt-oss and Qwen3-MoE have 128, DeepSeek 256).
pub const MAX_EXPERTS: usize = 512;

/// Shape and constants of a Llama-family model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LlamaConfig {
    /// Model width.
    pub hidden: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Query-key products times this instead of `1/sqrt(head_dim)` (Gemma 3 27B: `1/sqrt(query_pre_attn_scalar)`).
    pub attn_scale: Option<f32>,
    /// RoPE rotates only this many leading dimensions of each head (Phi-4-mini's partial rotary: 96 of 128); `None`
    /// rotates whole heads.
    pub rotary_dims: Option<usize>,
    /// Vocabulary size.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Context window in tokens.
    pub context_length: usize,
    /// RoPE rotates adjacent pairs (GGUF's layout, whose Q/K weights are permuted for it) rather than the two
    /// halves of each head (Hugging Face's layout).
    pub rope_interleaved: bool,
    /// How RoPE's frequencies are stretched for contexts past the pretraining length.
    pub rope_scaling: RopeScaling,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// Embeddings multiplied by this (Gemma: the square root of the width); `None` is 1.
    pub embed_scale: Option<f32>,
    /// Sliding-window attention (Gemma 3): every layer attends over its last `window` positions only, except each
    /// `every`-th (layers `every - 1`, `2 * every - 1`, ...), which attends over all; local layers use their own
    /// RoPE base and no scaling.
    pub sliding: Option<SlidingWindow>,
    /// Mixture-of-experts MLPs (Mixtral, Qwen3-MoE, OLMoE): every layer's MLP is `experts` MLPs of
    /// `intermediate` width each, of which a router picks `used` per token; `None`: dense.
    pub moe: Option<MoeConfig>,
}

/// A mixture-of-experts MLP's routing, as the file states it (llama.cpp's `build_moe_ffn`, softmax gating).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token runs.
    pub used: usize,
    /// The chosen experts' weights divided by their sum (Mixtral, Qwen3-MoE), or left as softmax gave them (OLMoE).
    pub normalize: bool,
    /// The chosen weights times this (1: as they are).
    pub scale: f32,
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen).
    #[default]
    Silu,
    /// GeGLU with GELU's tanh approximation (Gemma).
    GeluTanh,
}

/// Gemma 3's interleaved local and global attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer attends over, its own included.
    pub window: usize,
    /// Every this many layers, one is global (the last of each group).
    pub every: usize,
    /// RoPE base of the local layers.
    pub local_theta: f32,
}

impl LlamaConfig {
    /// A plain Llama shape for unit tests: `layers` layers of `heads` query heads and `kv_heads` KV heads of
    /// `head_dim`, a hidden width of `heads * head_dim`, a vocabulary of 4, no window, no experts.
    #[cfg(test)]
    pub(crate) fn tiny(layers: usize, heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        LlamaConfig {
            hidden: heads * head_dim,
            intermediate: 16,
            layers,
            heads,
            kv_heads,
            head_dim,
            attn_scale: None,
            rotary_dims: None,
            vocab: 4,
            rms_eps: 1e-5,
            rope_theta: 10000.0,
            context_length: 64,
            rope_interleaved: false,
            rope_scaling: RopeScaling::None,
            activation: Activation::Silu,
            embed_scale: None,
            sliding: None,
            moe: None,
        }
    }

    /// Whether layer `layer` attends over a sliding window.
    pub fn is_local(&self, layer: usize) -> bool {
        self.sliding.is_some_and(|s| !(layer + 1).is_multiple_of(s.every))
    }
}

impl LlamaConfig {
    /// What query-key products are multiplied by.
    pub fn attention_scale(&self) -> f32 {
        self.attn_scale.unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    /// The leading dimensions of each head RoPE rotates.
    pub fn rotary(&self) -> usize {
        self.rotary_dims.unwrap_or(self.head_dim)
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Check the shape is consistent.
    pub fn validate(&self) -> Result<(), String> {
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!("{} heads cannot share {} key/value heads", self.heads, self.kv_heads));
        }
        if !self.head_dim.is_multiple_of(2) || self.head_dim == 0 {
            return Err(format!("head width {} must be even", self.head_dim));
        }
        if self.layers == 0 || self.hidden == 0 || self.vocab == 0 || self.context_length == 0 {
            return Err("empty model dimensions".into());
        }
        if self.head_dim > MAX_HEAD_DIM {
            return Err(format!("head width {} is above the {MAX_HEAD_DIM} this build supports", self.head_dim));
        }
        if let Some(m) = &self.moe
            && (m.used == 0 || m.used > m.experts || m.experts > MAX_EXPERTS)
        {
            return Err(format!(
                "{} of {} experts per token (at most {MAX_EXPERTS} experts are supported)",
                m.used, m.experts
            ));
        }
        let rotary = self.rotary();
        if rotary == 0 || !rotary.is_multiple_of(2) || rotary > self.head_dim {
            return Err(format!("RoPE over {rotary} of each head's {} dimensions", self.head_dim));
        }
        if let Some(f) = self.rope_scaling.factors()
            && f.len() != rotary / 2
        {
            return Err(format!("{} RoPE frequency factors for {rotary} rotated dimensions", f.len()));
        }
        Ok(())
    }
}
