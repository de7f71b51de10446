//! Models: loading (GGUF, Hugging Face safetensors), the Llama-family forward pass and its kernels. Tokenizers and
//! chat templates are the `zl-text` crate's, shared with the frontend.

pub mod gguf;
pub mod hf;
pub mod kernels;
pub mod llama;

use kernels::Weight;
use llama::{Layer, Llama};
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

/// Load a model: a `.gguf` file, or a Hugging Face directory (config.json, safetensors, tokenizer.json).
pub fn load(path: &std::path::Path) -> Result<LoadedModel, LoadError> {
    load_with(path, Precision::Native)
}

/// How a model's matrices are kept in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// As stored: Q4_1 and Q8_0 stay quantized and run the integer kernels on int8 activations.
    #[default]
    Native,
    /// Every matrix dequantized to f32, activations in f32: the float reference path that quality is measured
    /// against (slow, and four to eight times the memory).
    Float,
}

/// [`load`] at `precision` (Hugging Face safetensors load as f32 either way).
pub fn load_with(path: &std::path::Path, precision: Precision) -> Result<LoadedModel, LoadError> {
    if path.is_dir() { hf::load(path) } else { gguf::load_with(path, precision) }
}

/// Where a loader reads named tensors from (a GGUF file, a set of safetensors).
pub(crate) trait TensorSource {
    /// Whether the tensor exists.
    fn has(&self, name: &str) -> bool;
    /// A 1-D tensor as f32.
    fn vector(&mut self, name: &str) -> Result<Vec<f32>, LoadError>;
    /// A matrix, kept quantized where the kernels support its format.
    fn weight(&mut self, name: &str) -> Result<Weight, LoadError>;
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
    pub o: &'static str,
    pub ffn_norm: &'static str,
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
}

/// Load `count` decoder layers, whatever the format: the same assembly for GGUF and safetensors.
pub(crate) fn load_layers(
    src: &mut impl TensorSource,
    count: usize,
    names: &LayerNames,
) -> Result<Vec<Layer>, LoadError> {
    let mut layers = Vec::with_capacity(count);
    for i in 0..count {
        let prefix = (names.prefix)(i);
        let p = |s: &str| format!("{prefix}{s}");
        let [bq, bk, bv] = names.qkv_bias;
        let qkv_bias =
            if src.has(&p(bq)) { Some((src.vector(&p(bq))?, src.vector(&p(bk))?, src.vector(&p(bv))?)) } else { None };
        layers.push(Layer {
            attn_norm: src.vector(&p(names.attn_norm))?,
            wq: src.weight(&p(names.q))?,
            wk: src.weight(&p(names.k))?,
            wv: src.weight(&p(names.v))?,
            qkv_bias,
            wo: src.weight(&p(names.o))?,
            ffn_norm: src.vector(&p(names.ffn_norm))?,
            w_gate: src.weight(&p(names.gate))?,
            w_up: src.weight(&p(names.up))?,
            w_down: src.weight(&p(names.down))?,
        });
    }
    Ok(layers)
}
