//! Loading a Llama-family GGUF file: shape from `llama.*` metadata, tokenizer from `tokenizer.ggml.*`, every matrix
//! kept in its own format (each block format, f16, bf16, f32); a type without a kernel is refused by name.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};

use super::gguf_types::{tensor_types, type_name};
use super::kernels::{BlockFormat, Weight};
use super::llama::{Activation, Llama, LlamaConfig, MoeConfig, RopeScaling, SlidingWindow};
use super::{LayerNames, LoadError, LoadedModel, Precision, TensorSource, load_layers};
use zl_text::{GgufVocab, TextTokenizer};

pub(crate) fn meta<'a>(content: &'a Content, key: &str) -> Result<&'a Value, LoadError> {
    content.metadata.get(key).ok_or_else(|| LoadError::Format(format!("GGUF metadata {key} is missing")))
}

pub(crate) fn meta_usize(content: &Content, key: &str) -> Result<usize, LoadError> {
    let v = meta(content, key)?;
    let n = match v {
        Value::U8(x) => u64::from(*x),
        Value::U16(x) => u64::from(*x),
        Value::U32(x) => u64::from(*x),
        Value::U64(x) => *x,
        Value::I32(x) if *x >= 0 => *x as u64,
        Value::I64(x) if *x >= 0 => *x as u64,
        other => return Err(LoadError::Format(format!("GGUF metadata {key} is not a count: {other:?}"))),
    };
    usize::try_from(n).map_err(|_| LoadError::Format(format!("GGUF metadata {key} is too large")))
}

pub(crate) fn meta_f32(content: &Content, key: &str) -> Result<f32, LoadError> {
    match meta(content, key)? {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        other => Err(LoadError::Format(format!("GGUF metadata {key} is not a number: {other:?}"))),
    }
}

pub(crate) fn meta_string(content: &Content, key: &str) -> Option<String> {
    content.metadata.get(key).and_then(|v| v.to_string().ok()).cloned()
}

/// A metadata array, each value read by `f`.
fn list<T>(content: &Content, key: &str, f: impl Fn(&Value) -> candle_core::Result<T>) -> Result<Vec<T>, LoadError> {
    let bad = |e: candle_core::Error| LoadError::Format(format!("{key}: {e}"));
    meta(content, key)?.to_vec().map_err(bad)?.iter().map(|v| f(v).map_err(bad)).collect()
}

/// [`list`], empty when the key is absent.
fn optional_list<T>(
    content: &Content,
    key: &str,
    f: impl Fn(&Value) -> candle_core::Result<T>,
) -> Result<Vec<T>, LoadError> {
    if content.metadata.contains_key(key) { list(content, key, f) } else { Ok(Vec::new()) }
}

fn strings(content: &Content, key: &str) -> Result<Vec<String>, LoadError> {
    list(content, key, |v| v.to_string().cloned())
}

/// Read the tokenizer metadata.
pub fn vocab(content: &Content) -> Result<GgufVocab, LoadError> {
    let id = |key: &str| content.metadata.get(key).and_then(|v| v.to_u32().ok());
    let flag = |key: &str| match content.metadata.get(key) {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    };
    let model = meta_string(content, "tokenizer.ggml.model").unwrap_or_default();
    // WordPiece (BERT): a document is [CLS] text [SEP], whatever add_bos says; llama.cpp's defaults are BERT's ids
    // where the file names none.
    let wordpiece = model == "bert";
    let bos = match wordpiece {
        true => id("tokenizer.ggml.bos_token_id").or(id("tokenizer.ggml.cls_token_id")).or(Some(101)),
        false => starts_with_bos(content),
    };
    Ok(GgufVocab {
        pre: meta_string(content, "tokenizer.ggml.pre").unwrap_or_default(),
        tokens: strings(content, "tokenizer.ggml.tokens")?,
        merges: strings(content, "tokenizer.ggml.merges").unwrap_or_default(),
        token_types: optional_list(content, "tokenizer.ggml.token_type", Value::to_i32)?,
        scores: optional_list(content, "tokenizer.ggml.scores", Value::to_f32)?,
        // SentencePiece's default; Gemma's files say false.
        add_space_prefix: flag("tokenizer.ggml.add_space_prefix") != Some(false),
        unk: id("tokenizer.ggml.unknown_token_id").or(wordpiece.then_some(100)),
        eos: id("tokenizer.ggml.eos_token_id"),
        bos,
        chat_template: meta_string(content, "tokenizer.chat_template"),
        add_eos: flag("tokenizer.ggml.add_eos_token").unwrap_or(false),
        sep: id("tokenizer.ggml.seperator_token_id").or(wordpiece.then_some(102)),
        lowercase: flag("tokenizer.ggml.normalizer.lowercase").unwrap_or(false),
        strip_accents: flag("tokenizer.ggml.normalizer.strip_accents"),
        model,
    })
}

/// Reads named tensors from an open GGUF file.
pub(crate) struct Reader<'a> {
    content: &'a Content,
    file: BufReader<File>,
    /// Dequantize every matrix to f32 (the float reference path).
    float: bool,
}

impl<'a> Reader<'a> {
    /// A reader of `file`, whose metadata is `content`; `float`: every matrix dequantized to f32.
    pub(crate) fn new(content: &'a Content, file: BufReader<File>, precision: Precision) -> Reader<'a> {
        Reader { content, file, float: precision == Precision::Float }
    }

    fn tensor(&mut self, name: &str) -> Result<QTensor, LoadError> {
        self.content.tensor(&mut self.file, name, &Device::Cpu).map_err(|e| LoadError::Format(format!("{name}: {e}")))
    }

    /// All of a tensor's values as f32, whatever its GGUF type.
    fn dequantized(t: &QTensor, name: &str) -> Result<Vec<f32>, LoadError> {
        t.dequantize(&Device::Cpu)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| LoadError::Format(format!("{name}: {e}")))
    }
}

impl TensorSource for Reader<'_> {
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn vector(&mut self, name: &str) -> Result<Vec<f32>, LoadError> {
        let t = self.tensor(name)?;
        Self::dequantized(&t, name)
    }

    fn weight(&mut self, name: &str) -> Result<Weight, LoadError> {
        let rows = self.content.tensor_infos.get(name).map_or(0, |t| t.shape.dims().first().copied().unwrap_or(0));
        let mut parts = self.split(name, &[rows])?;
        parts.pop().ok_or_else(|| LoadError::Format(format!("{name}: empty")))
    }

    fn split(&mut self, name: &str, parts: &[usize]) -> Result<Vec<Weight>, LoadError> {
        let t = self.tensor(name)?;
        let dims = t.shape().dims().to_vec();
        let [rows, cols] = dims[..] else {
            return Err(LoadError::Format(format!("{name} has shape {dims:?}, expected a matrix")));
        };
        super::check_split(name, rows, parts)?;
        let bad = |e: super::kernels::WeightError| LoadError::Format(format!("{name}: {e}"));
        let starts = parts.iter().scan(0, |at, &r| {
            *at += r;
            Some((*at - r, r))
        });
        if self.float || t.dtype() == GgmlDType::F32 {
            let values = Self::dequantized(&t, name)?;
            if let [whole] = parts {
                // One part (every unfused matrix): the values as they are, no copy.
                return Ok(vec![Weight::from_f32(*whole, cols, values).map_err(bad)?]);
            }
            return starts
                .map(|(at, r)| Weight::from_f32(r, cols, values[at * cols..(at + r) * cols].to_vec()).map_err(bad))
                .collect();
        }
        let data = t.data().map_err(|e| LoadError::Format(format!("{name}: {e}")))?;
        // Every GGUF type stores a row as whole blocks: rows are byte ranges.
        let per_row = data.len() / rows.max(1);
        starts.map(|(at, r)| from_bytes(name, t.dtype(), r, cols, &data[at * per_row..(at + r) * per_row])).collect()
    }

    fn experts(&mut self, name: &str, count: usize) -> Result<Vec<Weight>, LoadError> {
        self.stacked(name, count)
    }
}

impl Reader<'_> {
    /// [`TensorSource::experts`]: the 3-D tensor's bytes (or values) cut into `count` matrices.
    fn stacked(&mut self, name: &str, count: usize) -> Result<Vec<Weight>, LoadError> {
        let t = self.tensor(name)?;
        let dims = t.shape().dims().to_vec();
        let [n, rows, cols] = dims[..] else {
            return Err(LoadError::Format(format!("{name} has shape {dims:?}, expected {count} stacked matrices")));
        };
        if n != count {
            return Err(LoadError::Format(format!("{name} stacks {n} matrices, the file says {count} experts")));
        }
        let bad = |e: super::kernels::WeightError| LoadError::Format(format!("{name}: {e}"));
        if self.float || t.dtype() == GgmlDType::F32 {
            let values = Self::dequantized(&t, name)?;
            return values
                .chunks_exact(rows * cols)
                .map(|m| Weight::from_f32(rows, cols, m.to_vec()).map_err(bad))
                .collect();
        }
        let data = t.data().map_err(|e| LoadError::Format(format!("{name}: {e}")))?;
        let per = data.len() / n.max(1);
        data.chunks_exact(per.max(1)).map(|m| from_bytes(name, t.dtype(), rows, cols, m)).collect()
    }
}

/// A matrix of `rows` by `cols` from its bytes as GGUF type `dtype` stores them, in that format where a kernel has it.
fn from_bytes(name: &str, dtype: GgmlDType, rows: usize, cols: usize, data: &[u8]) -> Result<Weight, LoadError> {
    let bad = |e: super::kernels::WeightError| LoadError::Format(format!("{name}: {e}"));
    let blocks = |format: BlockFormat| Weight::from_blocks(format, rows, cols, data.to_vec()).map_err(bad);
    let half = |bf16: bool| {
        let bits = data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        Weight::from_half(bf16, rows, cols, bits).map_err(bad)
    };
    match dtype {
        GgmlDType::Q4_1 => Weight::from_q4_1(rows, cols, data).map_err(bad),
        GgmlDType::Q8_0 => Weight::from_q8_0(rows, cols, data).map_err(bad),
        GgmlDType::Q4_0 => Weight::from_legacy(BlockFormat::Q4_0, rows, cols, data).map_err(bad),
        GgmlDType::Q5_0 => Weight::from_legacy(BlockFormat::Q5_0, rows, cols, data).map_err(bad),
        GgmlDType::Q5_1 => Weight::from_legacy(BlockFormat::Q5_1, rows, cols, data).map_err(bad),
        GgmlDType::Q2K => blocks(BlockFormat::Q2K),
        GgmlDType::Q3K => blocks(BlockFormat::Q3K),
        GgmlDType::Q4K => Weight::from_q4_k(rows, cols, data).map_err(bad),
        GgmlDType::Q5K => Weight::from_q5_k(rows, cols, data).map_err(bad),
        GgmlDType::Q6K => Weight::from_q6_k(rows, cols, data).map_err(bad),
        GgmlDType::F16 => half(false),
        GgmlDType::BF16 => half(true),
        other => Err(unsupported_type(name, &format!("{other:?}"))),
    }
}

/// Gemma's turn format, for files that carry no template (system text goes in front of the first user turn).
const GEMMA_TEMPLATE: &str = "{{ bos_token }}{% set system = namespace(text='') %}{% for m in messages %}\
{% if m['role'] == 'system' %}{% set system.text = m['content'] + '\n\n' %}{% else %}<start_of_turn>\
{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{% if m['role'] == 'user' %}{{ system.text }}\
{% set system.text = '' %}{% endif %}{{ m['content'] }}<end_of_turn>\n{% endif %}{% endfor %}\
{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";

/// A tensor of a type without a kernel: never widened to f32 behind the user's back.
fn unsupported_type(tensor: &str, ty: &str) -> LoadError {
    LoadError::Unsupported(format!(
        "tensor {tensor} is {ty}, a GGUF type this build has no kernel for (supported: F32, F16, BF16, Q4_0, Q4_1, \
         Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K); requantize the file to one of them, e.g. with llama.cpp's \
         llama-quantize"
    ))
}

/// Read a GGUF file's header and metadata; a tensor of a type the reader does not know is named with its type.
pub(crate) fn read_content(path: &Path) -> Result<(Content, BufReader<File>), LoadError> {
    let io = |e: std::io::Error| LoadError::Io(path.display().to_string(), e);
    let mut file = BufReader::new(File::open(path).map_err(io)?);
    match Content::read(&mut file) {
        Ok(content) => Ok((content, file)),
        Err(e) => {
            let mut again = BufReader::new(File::open(path).map_err(io)?);
            let known = |ty: u32| matches!(ty, 0..=3 | 6..=15 | 30);
            if let Ok(types) = tensor_types(&mut again)
                && let Some((name, ty)) = types.into_iter().find(|&(_, ty)| !known(ty))
            {
                return Err(unsupported_type(&name, &type_name(ty)));
            }
            Err(LoadError::Format(format!("not a GGUF file: {e}")))
        }
    }
}

/// Whether llama.cpp's files of architecture `arch` hold Q and K for adjacent-pair RoPE: its converter permutes
/// Llama's and Mistral's rows so (Mixtral's too); Qwen, Gemma, Phi-3 and OLMoE keep NeoX halves.
pub(crate) fn rope_interleaved(arch: &str) -> bool {
    !matches!(arch, "qwen2" | "qwen3" | "qwen3moe" | "gemma3" | "phi3" | "olmoe")
}

/// The GGUF architectures this build runs.
const SUPPORTED: [&str; 8] = ["llama", "mistral", "qwen2", "qwen3", "qwen3moe", "olmoe", "gemma3", "phi3"];

/// A mixture of experts' routing from the file (`{arch}.expert_count` > 0), as llama.cpp's graph for `arch` runs
/// it: softmax gating, the chosen weights renormalized but for OLMoE's, scaled by `expert_weights_scale`.
fn experts_config(content: &Content, arch: &str, r: &Reader<'_>) -> Result<Option<MoeConfig>, LoadError> {
    let key = |k: &str| format!("{arch}.{k}");
    let experts = meta_usize(content, &key("expert_count")).unwrap_or(0);
    if experts == 0 {
        if matches!(arch, "qwen3moe" | "olmoe") {
            return Err(LoadError::Format(format!("{arch} without {arch}.expert_count")));
        }
        return Ok(None);
    }
    if !matches!(arch, "llama" | "mistral" | "qwen3moe" | "olmoe") {
        return Err(LoadError::Unsupported(format!(
            "{arch} with experts (mixture-of-experts runs for Mixtral-style llama, qwen3moe and olmoe)"
        )));
    }
    if !r.has("blk.0.ffn_gate_exps.weight") && r.has("blk.0.ffn_gate.0.weight") {
        return Err(LoadError::Unsupported(
            "experts stored one tensor each (an old Mixtral conversion): convert the model again with a current \
             llama.cpp, which stacks each layer's experts (ffn_gate_exps)"
                .into(),
        ));
    }
    Ok(Some(MoeConfig {
        experts,
        used: meta_usize(content, &key("expert_used_count"))?,
        normalize: arch != "olmoe",
        scale: meta_f32(content, &key("expert_weights_scale")).unwrap_or(1.0),
    }))
}

/// The BOS token a GGUF model's text starts with, as llama.cpp decides it: `tokenizer.ggml.bos_token_id` when
/// `tokenizer.ggml.add_bos_token` is true (absent: true for SentencePiece vocabularies, false for BPE ones).
pub fn bos_token(path: &Path) -> Result<Option<u32>, LoadError> {
    let (content, _) = read_content(path)?;
    Ok(starts_with_bos(&content))
}

/// [`bos_token`] from read metadata.
fn starts_with_bos(content: &Content) -> Option<u32> {
    let add = match content.metadata.get("tokenizer.ggml.add_bos_token") {
        Some(Value::Bool(b)) => *b,
        _ => meta_string(content, "tokenizer.ggml.model").as_deref() == Some("llama"),
    };
    if add { meta_usize(content, "tokenizer.ggml.bos_token_id").ok().map(|id| id as u32) } else { None }
}

/// Load a GGUF model file.
pub fn load(path: &Path) -> Result<LoadedModel, LoadError> {
    load_with(path, Precision::Native)
}

/// Load a GGUF model file at `precision`: its own formats, or every matrix dequantized to f32.
pub fn load_with(path: &Path, precision: Precision) -> Result<LoadedModel, LoadError> {
    let (content, file) = read_content(path)?;
    let arch = meta_string(&content, "general.architecture").unwrap_or_default();
    if !SUPPORTED.contains(&arch.as_str()) {
        return Err(LoadError::Unsupported(format!(
            "GGUF architecture {arch:?} (supported: {}; mixture-of-experts: Mixtral-style llama, qwen3moe, olmoe)",
            SUPPORTED.join(", ")
        )));
    }
    let gemma = arch == "gemma3";
    let key = |k: &str| format!("{arch}.{k}");
    let mut r = Reader::new(&content, file, precision);
    let context_length = meta_usize(&content, &key("context_length")).unwrap_or(4096);
    let rope_scaling = if r.has("rope_freqs.weight") {
        RopeScaling::Factors(r.vector("rope_freqs.weight")?)
    } else if r.has("rope_factors_long.weight") {
        // Phi-3's LongRoPE, as llama.cpp reads it: the long factors when the context served is past the
        // pretraining one (it always is for the 128k files, which serve their whole context), else the short.
        let original = meta_usize(&content, &key("rope.scaling.original_context_length")).unwrap_or(context_length);
        let which = if context_length > original { "rope_factors_long.weight" } else { "rope_factors_short.weight" };
        let mscale = meta_f32(&content, &key("rope.scaling.attn_factor")).unwrap_or(1.0);
        RopeScaling::LongRope { factors: r.vector(which)?, mscale }
    } else {
        match meta_string(&content, &key("rope.scaling.type")).as_deref() {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear { factor: meta_f32(&content, &key("rope.scaling.factor"))? },
            Some("yarn") => {
                if content.metadata.contains_key(&key("rope.scaling.yarn_log_multiplier")) {
                    return Err(LoadError::Unsupported("YaRN with a log multiplier (DeepSeek's)".into()));
                }
                let factor = meta_f32(&content, &key("rope.scaling.factor"))?;
                let attn = meta_f32(&content, &key("rope.scaling.attn_factor")).unwrap_or(1.0);
                RopeScaling::Yarn {
                    factor,
                    original_context: meta_usize(&content, &key("rope.scaling.original_context_length"))
                        .unwrap_or(context_length),
                    beta_fast: meta_f32(&content, &key("rope.scaling.yarn_beta_fast")).unwrap_or(32.0),
                    beta_slow: meta_f32(&content, &key("rope.scaling.yarn_beta_slow")).unwrap_or(1.0),
                    // llama.cpp's: 1 + 0.1 ln(factor) (for a stretch), times the file's attention factor.
                    mscale: attn * if factor > 1.0 { 1.0 + 0.1 * factor.ln() } else { 1.0 },
                }
            }
            Some(other) => {
                return Err(LoadError::Unsupported(format!("RoPE scaling {other:?} (linear, llama3 and yarn are)")));
            }
        }
    };
    let hidden = meta_usize(&content, &key("embedding_length"))?;
    let layers = meta_usize(&content, &key("block_count"))?;
    let heads = meta_usize(&content, &key("attention.head_count"))?;
    let head_dim = meta_usize(&content, &key("attention.key_length")).unwrap_or(hidden / heads.max(1));
    // Partial rotary (Phi-4-mini: 96 of 128) where the file says fewer dimensions turn than a head has.
    let rotary_dims = meta_usize(&content, &key("rope.dimension_count")).ok().filter(|&r| r != head_dim);
    let vocab_meta = vocab(&content)?;
    let moe = experts_config(&content, &arch, &r)?;
    // A mixture of experts' MLPs are `expert_feed_forward_length` wide where the file says (Qwen3-MoE).
    let intermediate = match moe {
        Some(_) => meta_usize(&content, &key("expert_feed_forward_length"))
            .or_else(|_| meta_usize(&content, &key("feed_forward_length")))?,
        None => meta_usize(&content, &key("feed_forward_length"))?,
    };
    let cfg = LlamaConfig {
        hidden,
        intermediate,
        layers,
        heads,
        kv_heads: meta_usize(&content, &key("attention.head_count_kv")).unwrap_or(heads),
        head_dim,
        rotary_dims,
        vocab: vocab_meta.tokens.len(),
        rms_eps: meta_f32(&content, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        rope_theta: meta_f32(&content, &key("rope.freq_base")).unwrap_or(10_000.0),
        context_length,
        rope_interleaved: rope_interleaved(&arch),
        rope_scaling,
        activation: if gemma { Activation::GeluTanh } else { Activation::Silu },
        embed_scale: gemma.then(|| (hidden as f32).sqrt()),
        // Gemma 3: five local layers to one global, local RoPE base 10,000 (llama.cpp's defaults for the family,
        // where the file does not say).
        sliding: match meta_usize(&content, &key("attention.sliding_window")) {
            Ok(window) if gemma => Some(SlidingWindow {
                window,
                every: meta_usize(&content, &key("attention.sliding_window_pattern")).unwrap_or(6),
                local_theta: meta_f32(&content, &key("rope.freq_base_swa")).unwrap_or(10_000.0),
            }),
            _ => None,
        },
        attn_scale: if gemma { gemma3_attention_scale(layers, hidden, heads, head_dim) } else { None },
        moe,
    };
    cfg.validate().map_err(LoadError::Format)?;
    let embed = r.weight("token_embd.weight")?;
    let names = LayerNames {
        prefix: |i| format!("blk.{i}."),
        attn_norm: "attn_norm.weight",
        q: "attn_q.weight",
        k: "attn_k.weight",
        v: "attn_v.weight",
        qkv_bias: ["attn_q.bias", "attn_k.bias", "attn_v.bias"],
        qk_norm: ["attn_q_norm.weight", "attn_k_norm.weight"],
        post_norms: ["post_attention_norm.weight", "post_ffw_norm.weight"],
        o: "attn_output.weight",
        ffn_norm: "ffn_norm.weight",
        gate: "ffn_gate.weight",
        up: "ffn_up.weight",
        down: "ffn_down.weight",
        qkv: "attn_qkv.weight",
        gate_up: "ffn_up.weight",
        experts: ["ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"],
        shared_expert: ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"],
    };
    let layers = load_layers(&mut r, &cfg, &names)?;
    let norm = r.vector("output_norm.weight")?;
    let output = if r.has("output.weight") { Some(r.weight("output.weight")?) } else { None };
    // The metadata (a large vocabulary's strings) is freed before the tokenizer is built, which reuses the memory.
    drop(r);
    drop(content);
    let llama = Llama::new(cfg, embed, layers, norm, output).map_err(LoadError::Format)?;
    let mut vocab_meta = vocab_meta;
    if gemma && vocab_meta.chat_template.is_none() {
        vocab_meta.chat_template = Some(GEMMA_TEMPLATE.to_owned());
    }
    let tokenizer = TextTokenizer::from_gguf(&vocab_meta).map_err(|e| LoadError::Format(e.to_string()))?;
    Ok(LoadedModel { llama, tokenizer, family: arch })
}

/// Gemma 3's attention scale where it is not `1/sqrt(head_dim)`: GGUF has no key for it, so llama.cpp tells the 27B
/// model by its 62 layers and scales by `1/sqrt(width / heads)` (Hugging Face's `query_pre_attn_scalar` 168).
fn gemma3_attention_scale(layers: usize, hidden: usize, heads: usize, head_dim: usize) -> Option<f32> {
    let per_head = hidden / heads.max(1);
    (layers == 62 && per_head != head_dim).then(|| 1.0 / (per_head as f32).sqrt())
}

#[cfg(test)]
mod tests {
    use super::gemma3_attention_scale;

    #[test]
    fn gemma3_27b_scales_attention_by_its_width_per_head_as_llama_cpp_does() {
        // 27B: 5376 wide, 32 heads of 128: queries by 1/sqrt(168), Hugging Face's query_pre_attn_scalar.
        assert_eq!(gemma3_attention_scale(62, 5376, 32, 128), Some(1.0 / 168f32.sqrt()));
        // 270M (18 layers), 1B, 4B, 12B: the head width's, the default.
        assert_eq!(gemma3_attention_scale(18, 640, 4, 256), None);
        assert_eq!(gemma3_attention_scale(48, 3840, 16, 256), None);
    }
}
