//! Models: loading (GGUF, Hugging Face safetensors), the Llama-family forward pass and its kernels. Tokenizers and
//! chat templates are the `zl-text` crate's, shared with the frontend.

pub mod config;
pub mod embed;
pub mod gguf;
pub mod gguf_types;
pub mod hf;
pub mod kernels;
pub mod kv_store;
pub mod llama;
pub mod lora;
pub mod lora_load;
pub mod lora_merge;
pub mod moe;
pub mod rope;
pub mod rotation;

use kernels::Weight;
use llama::{Ffn, Layer, Llama};
use zl_text::TextTokenizer;

/// A model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The files are malformed or inconsistent.
    #[error("invalid model: {0}")]
    Format(String),
    /// A valid model of a kind this build cannot run.
    #[error("unsupported model: {0}")]
    Unsupported(String),
}

/// A model ready to run: weights, tokenizer and chat template.
#[derive(Debug)]
pub struct LoadedModel {
    /// The network.
    pub llama: Llama,
    /// Its tokenizer and chat template.
    pub tokenizer: TextTokenizer,
    /// Architecture family, e.g. "llama".
    pub family: String,
}

/// This process's resident memory in bytes (Linux's `/proc/self/statm`; `None` elsewhere), for the load logs.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Load a model: a `.gguf` file, or a Hugging Face directory (config.json, safetensors, tokenizer.json).
pub fn load(path: &std::path::Path) -> Result<LoadedModel, LoadError> {
    load_with(path, Precision::Native)
}

/// How a model's matrices are kept in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// As stored: every GGUF block format (Q4_0 to Q8_0, Q2_K to Q6_K) stays quantized and runs the integer
    /// kernels on 16-bit activations; f16 and bf16 stay 16-bit.
    #[default]
    Native,
    /// Every matrix dequantized to f32, activations in f32: the float reference path that quality is measured
    /// against (slow, and four to eight times the memory).
    Float,
}

/// [`load`] at `precision`.
pub fn load_with(path: &std::path::Path, precision: Precision) -> Result<LoadedModel, LoadError> {
    if path.is_dir() { hf::load_with(path, precision) } else { gguf::load_with(path, precision) }
}

/// Where a loader reads named tensors from (a GGUF file, a set of safetensors).
pub(crate) trait TensorSource {
    /// Whether the tensor exists.
    fn has(&self, name: &str) -> bool;
    /// A 1-D tensor as f32.
    fn vector(&mut self, name: &str) -> Result<Vec<f32>, LoadError>;
    /// A matrix, kept quantized where the kernels support its format.
    fn weight(&mut self, name: &str) -> Result<Weight, LoadError>;
    /// A matrix cut by rows into consecutive parts of `rows` rows each (they must add up to its rows): a fused
    /// projection (Phi-3's QKV and gate-up) as the separate matrices the kernels take, each in the file's format.
    fn split(&mut self, name: &str, rows: &[usize]) -> Result<Vec<Weight>, LoadError>;
    /// A stack of `count` matrices stored as one 3-D tensor (a mixture-of-experts layer's experts), one matrix each,
    /// in the file's format.
    fn experts(&mut self, name: &str, count: usize) -> Result<Vec<Weight>, LoadError>;
}

/// Check a fused matrix of `total` rows is cut into parts of `rows` rows.
pub(crate) fn check_split(name: &str, total: usize, rows: &[usize]) -> Result<(), LoadError> {
    if rows.iter().sum::<usize>() == total {
        Ok(())
    } else {
        Err(LoadError::Format(format!(
            "{name} has {total} rows, expected {} ({rows:?} fused)",
            rows.iter().sum::<usize>()
        )))
    }
}

/// The names of a decoder layer's tensors in one file format, after the layer's prefix.
pub(crate) struct LayerNames {
    /// Prefix of layer `i`'s tensor names.
    pub prefix: fn(usize) -> String,
    pub attn_norm: &'static str,
    pub q: &'static str,
    pub k: &'static str,
    pub v: &'static str,
    /// Q, K and V biases (Qwen2), loaded when the first exists.
    pub qkv_bias: [&'static str; 3],
    /// Per-head Q and K norms (Qwen3, Gemma 3), loaded when the first exists.
    pub qk_norm: [&'static str; 2],
    /// Post-attention and post-MLP norms (Gemma 3), loaded when the first exists.
    pub post_norms: [&'static str; 2],
    pub o: &'static str,
    pub ffn_norm: &'static str,
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
    /// Q, K and V fused in one matrix (Phi-3), used where `q` is absent.
    pub qkv: &'static str,
    /// Gate and up fused in one matrix, gate first (Phi-3), used where `gate` is absent.
    pub gate_up: &'static str,
    /// A mixture-of-experts layer's router and stacked gate, up and down experts.
    pub experts: [&'static str; 4],
    /// Its shared expert's gate, up and down, loaded when the first exists.
    pub shared_expert: [&'static str; 3],
}

/// Load `count` decoder layers, whatever the format: the same assembly for GGUF and safetensors.
pub(crate) fn load_layers(
    src: &mut impl TensorSource,
    cfg: &llama::LlamaConfig,
    names: &LayerNames,
) -> Result<Vec<Layer>, LoadError> {
    let mut layers = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let prefix = (names.prefix)(i);
        let p = |s: &str| format!("{prefix}{s}");
        let [bq, bk, bv] = names.qkv_bias;
        let qkv_bias =
            if src.has(&p(bq)) { Some((src.vector(&p(bq))?, src.vector(&p(bk))?, src.vector(&p(bv))?)) } else { None };
        let [nq, nk] = names.qk_norm;
        let qk_norm = if src.has(&p(nq)) { Some((src.vector(&p(nq))?, src.vector(&p(nk))?)) } else { None };
        let [pa, pf] = names.post_norms;
        let post_norms = if src.has(&p(pa)) { Some((src.vector(&p(pa))?, src.vector(&p(pf))?)) } else { None };
        let [wq, wk, wv] = if src.has(&p(names.q)) || !src.has(&p(names.qkv)) {
            [src.weight(&p(names.q))?, src.weight(&p(names.k))?, src.weight(&p(names.v))?]
        } else {
            let rows = [cfg.heads * cfg.head_dim, cfg.kv_dim(), cfg.kv_dim()];
            <[Weight; 3]>::try_from(src.split(&p(names.qkv), &rows)?)
                .map_err(|_| LoadError::Format(format!("{}: not three parts", p(names.qkv))))?
        };
        let ffn = match &cfg.moe {
            Some(moe) => load_experts(src, moe.experts, &prefix, names)?,
            None if src.has(&p(names.gate)) || !src.has(&p(names.gate_up)) => Ffn::Dense {
                gate: src.weight(&p(names.gate))?,
                up: src.weight(&p(names.up))?,
                down: src.weight(&p(names.down))?,
            },
            None => {
                let [gate, up] =
                    <[Weight; 2]>::try_from(src.split(&p(names.gate_up), &[cfg.intermediate, cfg.intermediate])?)
                        .map_err(|_| LoadError::Format(format!("{}: not two parts", p(names.gate_up))))?;
                Ffn::Dense { gate, up, down: src.weight(&p(names.down))? }
            }
        };
        layers.push(Layer {
            attn_norm: src.vector(&p(names.attn_norm))?,
            wq,
            wk,
            wv,
            qkv_bias,
            qk_norm,
            post_norms,
            wo: src.weight(&p(names.o))?,
            ffn_norm: src.vector(&p(names.ffn_norm))?,
            ffn,
        });
    }
    Ok(layers)
}

/// A mixture-of-experts layer's router, experts and shared expert (if any), by `names` after `prefix`.
fn load_experts(src: &mut impl TensorSource, count: usize, prefix: &str, names: &LayerNames) -> Result<Ffn, LoadError> {
    let p = |s: &str| format!("{prefix}{s}");
    let [router, gate, up, down] = names.experts;
    let [sg, su, sd] = names.shared_expert;
    let shared =
        if src.has(&p(sg)) { Some([src.weight(&p(sg))?, src.weight(&p(su))?, src.weight(&p(sd))?]) } else { None };
    Ok(Ffn::Experts(Box::new(llama::Experts {
        router: src.weight(&p(router))?,
        gate: src.experts(&p(gate), count)?,
        up: src.experts(&p(up), count)?,
        down: src.experts(&p(down), count)?,
        shared,
    })))
}
