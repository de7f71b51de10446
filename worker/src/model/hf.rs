//! Loading a Hugging Face model directory: `config.json`, one or more `*.safetensors` shards, `tokenizer.json` and
//! (optionally) `tokenizer_config.json` with the chat template. Llama, Mistral, Qwen2/3, Phi-3, Gemma 3 (text) and
//! SmolLM layouts; f16 and
//! bf16 matrices stay 16-bit in memory (widened a row at a time by the kernels), other float types become f32.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::kernels::Weight;
use super::llama::{Activation, Llama, LlamaConfig, RopeScaling, SlidingWindow};
use super::{LayerNames, LoadError, LoadedModel, Precision, TensorSource, load_layers};
use zl_text::TextTokenizer;

/// The fields of `config.json` this loader reads.
#[derive(Debug, serde::Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: bool,
    rope_scaling: Option<HfRopeScaling>,
    /// Phi-3: the pretraining context, beside `rope_scaling`.
    original_max_position_embeddings: Option<usize>,
    /// Phi-4-mini rotates only part of each head.
    partial_rotary_factor: Option<f32>,
    /// Gemma 3: positions a local layer attends over.
    sliding_window: Option<usize>,
    /// Gemma 3: one global layer in this many (older configs).
    sliding_window_pattern: Option<usize>,
    /// Gemma 3: `sliding_attention` or `full_attention` per layer (newer configs).
    layer_types: Option<Vec<String>>,
    /// Gemma 3: the local layers' RoPE base.
    rope_local_base_freq: Option<f32>,
    /// Gemma 3: queries are scaled by 1/sqrt(this) (the head width, but for the 27B model).
    query_pre_attn_scalar: Option<f32>,
    /// Gemma 2's soft-capping, which Gemma 3 dropped.
    attn_logit_softcapping: Option<f32>,
    final_logit_softcapping: Option<f32>,
}

impl HfConfig {
    /// Gemma 3's interleaving: one global layer in every `every`, the last of each group (`layer_types`, or
    /// `sliding_window_pattern`, default 6).
    fn gemma_pattern(&self) -> Result<usize, LoadError> {
        let Some(types) = &self.layer_types else { return Ok(self.sliding_window_pattern.unwrap_or(6)) };
        let every = types.iter().position(|t| t == "full_attention").map_or(types.len() + 1, |i| i + 1);
        let periodic = types.iter().enumerate().all(|(i, t)| (t == "full_attention") == (i + 1).is_multiple_of(every));
        if !periodic {
            return Err(LoadError::Unsupported(format!(
                "layer_types {types:?}: this build runs one global layer every N, the last of each group"
            )));
        }
        Ok(every)
    }
}

/// `config.json`'s `rope_scaling` (`rope_type`, or `type` in older files).
#[derive(Debug, serde::Deserialize)]
struct HfRopeScaling {
    #[serde(alias = "type")]
    rope_type: String,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    /// LongRoPE (Phi-3): per-frequency factors within and past the pretraining context.
    short_factor: Option<Vec<f32>>,
    long_factor: Option<Vec<f32>>,
    /// LongRoPE's and YaRN's cosine and sine scale, where the file sets it.
    attention_factor: Option<f32>,
    /// YaRN: turns within the pretraining context bounding the blend (defaults 32 and 1).
    beta_fast: Option<f32>,
    beta_slow: Option<f32>,
    /// DeepSeek's YaRN variants; refused.
    mscale: Option<f32>,
    mscale_all_dim: Option<f32>,
    truncate: Option<bool>,
}

impl HfRopeScaling {
    /// The scaling of a model serving `context` tokens, pretrained on `original` (where the config says).
    fn scaling(&self, context: usize, original: Option<usize>) -> Result<RopeScaling, LoadError> {
        let need = |v: Option<f32>, name: &str| {
            v.ok_or_else(|| LoadError::Format(format!("config.json: rope_scaling {:?} needs {name}", self.rope_type)))
        };
        match self.rope_type.as_str() {
            "default" => Ok(RopeScaling::None),
            "linear" => Ok(RopeScaling::Linear { factor: need(self.factor, "factor")? }),
            "llama3" => Ok(RopeScaling::Llama3 {
                factor: need(self.factor, "factor")?,
                low_freq_factor: need(self.low_freq_factor, "low_freq_factor")?,
                high_freq_factor: need(self.high_freq_factor, "high_freq_factor")?,
                original_context: self.original_max_position_embeddings.ok_or_else(|| {
                    LoadError::Format("config.json: rope_scaling llama3 needs original_max_position_embeddings".into())
                })?,
            }),
            "longrope" | "su" => {
                let original = self.original_max_position_embeddings.or(original).unwrap_or(context);
                let pick = if context > original { &self.long_factor } else { &self.short_factor };
                let factors = pick.clone().ok_or_else(|| {
                    LoadError::Format("config.json: rope_scaling longrope needs short_factor and long_factor".into())
                })?;
                // Hugging Face's default: sqrt(1 + ln(context / original) / ln(original)), 1 within the original.
                let scale = context as f64 / original.max(2) as f64;
                let default =
                    if scale <= 1.0 { 1.0 } else { (1.0 + scale.ln() / (original.max(2) as f64).ln()).sqrt() };
                Ok(RopeScaling::LongRope { factors, mscale: self.attention_factor.unwrap_or(default as f32) })
            }
            "yarn" => {
                if self.mscale.is_some() || self.mscale_all_dim.is_some() || self.truncate == Some(false) {
                    return Err(LoadError::Unsupported(
                        "YaRN with mscale, mscale_all_dim or truncate false (DeepSeek's variants)".into(),
                    ));
                }
                let factor = need(self.factor, "factor")?;
                // Hugging Face's fallback: the served context.
                let original = self.original_max_position_embeddings.or(original).unwrap_or(context);
                let default = if factor > 1.0 { 1.0 + 0.1 * factor.ln() } else { 1.0 };
                Ok(RopeScaling::Yarn {
                    factor,
                    original_context: original,
                    beta_fast: self.beta_fast.unwrap_or(32.0),
                    beta_slow: self.beta_slow.unwrap_or(1.0),
                    mscale: self.attention_factor.unwrap_or(default),
                })
            }
            other => {
                Err(LoadError::Unsupported(format!("RoPE scaling {other:?} (linear, llama3, longrope and yarn are)")))
            }
        }
    }
}

struct Tensors {
    all: HashMap<String, Tensor>,
    /// Widen every matrix to f32 (the float reference path).
    float: bool,
    /// Gemma stores each RMSNorm weight as `w - 1` (it multiplies by `1 + w`): add the 1 back on load, as
    /// llama.cpp's converter does.
    norms_minus_one: bool,
}

impl Tensors {
    fn take(&mut self, name: &str) -> Result<Tensor, LoadError> {
        self.all.remove(name).ok_or_else(|| LoadError::Format(format!("tensor {name} is missing")))
    }

    fn values(t: &Tensor, name: &str) -> Result<Vec<f32>, LoadError> {
        t.to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| LoadError::Format(format!("{name}: {e}")))
    }
}

impl TensorSource for Tensors {
    fn has(&self, name: &str) -> bool {
        self.all.contains_key(name)
    }

    fn vector(&mut self, name: &str) -> Result<Vec<f32>, LoadError> {
        let t = self.take(name)?;
        let mut values = Self::values(&t, name)?;
        if self.norms_minus_one && name.ends_with("norm.weight") {
            values.iter_mut().for_each(|v| *v += 1.0);
        }
        Ok(values)
    }

    fn weight(&mut self, name: &str) -> Result<Weight, LoadError> {
        let t = self.take(name)?;
        self.convert(t, name)
    }

    fn experts(&mut self, name: &str, _count: usize) -> Result<Vec<Weight>, LoadError> {
        Err(LoadError::Unsupported(format!("{name}: stacked experts from safetensors")))
    }

    fn split(&mut self, name: &str, rows: &[usize]) -> Result<Vec<Weight>, LoadError> {
        let t = self.take(name)?;
        super::check_split(name, t.dims().first().copied().unwrap_or(0), rows)?;
        let mut at = 0;
        let mut parts = Vec::with_capacity(rows.len());
        for &r in rows {
            let part = t
                .narrow(0, at, r)
                .and_then(|p| p.contiguous())
                .map_err(|e| LoadError::Format(format!("{name}: {e}")))?;
            parts.push(self.convert(part, name)?);
            at += r;
        }
        Ok(parts)
    }
}

impl Tensors {
    /// A matrix tensor as a kernel weight: 16-bit floats as they are, others widened to f32.
    fn convert(&self, t: Tensor, name: &str) -> Result<Weight, LoadError> {
        let [rows, cols] = t.dims()[..] else {
            return Err(LoadError::Format(format!("{name} has shape {:?}, expected a matrix", t.dims())));
        };
        let bad = |e: String| LoadError::Format(format!("{name}: {e}"));
        match t.dtype() {
            DType::F16 | DType::BF16 if !self.float => {
                // The 16 bits as they are (a bit cast, not a conversion).
                let raw = match t.dtype() {
                    DType::F16 => t
                        .flatten_all()
                        .and_then(|t| t.to_vec1::<half::f16>())
                        .map(|v| v.into_iter().map(half::f16::to_bits).collect::<Vec<u16>>()),
                    _ => t
                        .flatten_all()
                        .and_then(|t| t.to_vec1::<half::bf16>())
                        .map(|v| v.into_iter().map(half::bf16::to_bits).collect::<Vec<u16>>()),
                }
                .map_err(|e| bad(e.to_string()))?;
                Weight::from_half(t.dtype() == DType::BF16, rows, cols, raw).map_err(|e| bad(e.to_string()))
            }
            _ => Weight::from_f32(rows, cols, Self::values(&t, name)?).map_err(|e| bad(e.to_string())),
        }
    }
}

/// The weight shards of a model directory, in name order (the order they are loaded and hashed in).
pub fn shards(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| LoadError::Io(dir.display().to_string(), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    if shards.is_empty() {
        return Err(LoadError::Format(format!("no .safetensors files in {}", dir.display())));
    }
    Ok(shards)
}

/// Load a model directory, its matrices in their own precision.
pub fn load(dir: &Path) -> Result<LoadedModel, LoadError> {
    load_with(dir, Precision::Native)
}

/// Load a model directory at `precision`: 16-bit matrices as they are, or every matrix widened to f32.
pub fn load_with(dir: &Path, precision: Precision) -> Result<LoadedModel, LoadError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|e| LoadError::Io(path.display().to_string(), e))
    };
    let config: HfConfig =
        serde_json::from_slice(&read("config.json")?).map_err(|e| LoadError::Format(format!("config.json: {e}")))?;
    let family = match config.model_type.as_deref().unwrap_or("llama") {
        // Gemma 3's text-only checkpoints (270M, 1B); the family is named as its GGUF files name it.
        "gemma3_text" => "gemma3".to_owned(),
        "gemma3" => {
            return Err(LoadError::Unsupported(
                "model_type \"gemma3\" (the multimodal checkpoint, its text model under text_config): use a \
                 text-only checkpoint (gemma3_text) or a GGUF file"
                    .into(),
            ));
        }
        other => other.to_owned(),
    };
    if matches!(family.as_str(), "mixtral" | "qwen2_moe" | "qwen3_moe" | "olmoe" | "gpt_oss") {
        return Err(LoadError::Unsupported(format!(
            "model_type {family:?} from safetensors: mixture-of-experts models are served from GGUF files \
             (llama.cpp's convert_hf_to_gguf.py writes one)"
        )));
    }
    if !matches!(family.as_str(), "llama" | "mistral" | "qwen2" | "qwen3" | "phi3" | "gemma3") {
        return Err(LoadError::Unsupported(format!(
            "model_type {family:?} (llama, mistral, qwen2, qwen3, phi3 and gemma3_text are)"
        )));
    }
    let gemma = family == "gemma3";
    if config.attn_logit_softcapping.is_some() || config.final_logit_softcapping.is_some() {
        return Err(LoadError::Unsupported("logit soft-capping (Gemma 2's): this build has none".into()));
    }
    let context_length = config.max_position_embeddings.unwrap_or(4096);
    let head_dim = config.head_dim.unwrap_or(config.hidden_size / config.num_attention_heads.max(1));
    // Partial rotary (Phi-4-mini's 0.75): Hugging Face turns `int(head_dim * factor)` leading dimensions.
    let rotary_dims = config.partial_rotary_factor.filter(|&f| f < 1.0).map(|f| (head_dim as f32 * f) as usize);
    let cfg = LlamaConfig {
        hidden: config.hidden_size,
        intermediate: config.intermediate_size,
        layers: config.num_hidden_layers,
        heads: config.num_attention_heads,
        kv_heads: config.num_key_value_heads.unwrap_or(config.num_attention_heads),
        head_dim,
        rotary_dims,
        vocab: config.vocab_size,
        rms_eps: config.rms_norm_eps.unwrap_or(1e-5),
        rope_theta: config.rope_theta.unwrap_or(10_000.0),
        context_length,
        rope_interleaved: false,
        rope_scaling: match &config.rope_scaling {
            Some(s) => s.scaling(context_length, config.original_max_position_embeddings)?,
            None => RopeScaling::None,
        },
        ..LlamaConfig::default()
    };
    let cfg = if gemma {
        // Queries scaled by 1/sqrt(query_pre_attn_scalar): the head width but for the 27B model (168 for 128).
        let attn_scale =
            config.query_pre_attn_scalar.filter(|s| (s - cfg.head_dim as f32).abs() > 0.5).map(|s| 1.0 / s.sqrt());
        let window = config
            .sliding_window
            .ok_or_else(|| LoadError::Format("config.json: a gemma3_text model needs sliding_window".into()))?;
        LlamaConfig {
            attn_scale,
            activation: Activation::GeluTanh,
            embed_scale: Some((cfg.hidden as f32).sqrt()),
            sliding: Some(SlidingWindow {
                window,
                every: config.gemma_pattern()?,
                local_theta: config.rope_local_base_freq.unwrap_or(10_000.0),
            }),
            ..cfg
        }
    } else {
        cfg
    };
    cfg.validate().map_err(LoadError::Format)?;
    let shards = shards(dir)?;
    let mut all = HashMap::new();
    for shard in &shards {
        let tensors = candle_core::safetensors::load(shard, &Device::Cpu)
            .map_err(|e| LoadError::Format(format!("{}: {e}", shard.display())))?;
        all.extend(tensors);
    }
    let mut t = Tensors { all, float: precision == Precision::Float, norms_minus_one: gemma };
    let embed = t.weight("model.embed_tokens.weight")?;
    let names = LayerNames {
        prefix: |i| format!("model.layers.{i}."),
        attn_norm: "input_layernorm.weight",
        q: "self_attn.q_proj.weight",
        k: "self_attn.k_proj.weight",
        v: "self_attn.v_proj.weight",
        qkv_bias: ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"],
        qk_norm: ["self_attn.q_norm.weight", "self_attn.k_norm.weight"],
        // Gemma 3: norms after attention and after the MLP, and its own name for the norm before the MLP.
        post_norms: if gemma {
            ["post_attention_layernorm.weight", "post_feedforward_layernorm.weight"]
        } else {
            ["", ""]
        },
        o: "self_attn.o_proj.weight",
        ffn_norm: if gemma { "pre_feedforward_layernorm.weight" } else { "post_attention_layernorm.weight" },
        gate: "mlp.gate_proj.weight",
        up: "mlp.up_proj.weight",
        down: "mlp.down_proj.weight",
        qkv: "self_attn.qkv_proj.weight",
        gate_up: "mlp.gate_up_proj.weight",
        // Mixture-of-experts checkpoints are refused above.
        experts: ["", "", "", ""],
        shared_expert: ["", "", ""],
    };
    let layers = load_layers(&mut t, &cfg, &names)?;
    let norm = t.vector("model.norm.weight")?;
    let output =
        // Gemma ties them whether its config says so or not.
        if (config.tie_word_embeddings || gemma) && !t.has("lm_head.weight") {
            None
        } else {
            Some(t.weight("lm_head.weight")?)
        };
    let llama = Llama::new(cfg, embed, layers, norm, output).map_err(LoadError::Format)?;
    let tokenizer_config = read("tokenizer_config.json").ok();
    let tokenizer = TextTokenizer::from_hf(&read("tokenizer.json")?, tokenizer_config.as_deref())
        .map_err(|e| LoadError::Format(e.to_string()))?;
    Ok(LoadedModel { llama, tokenizer, family })
}
