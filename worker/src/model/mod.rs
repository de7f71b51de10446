//! Models: loading (GGUF, Hugging Face safetensors), the Llama-family forward pass, kernels and tokenizers.

pub mod gguf;
pub mod hf;
pub mod kernels;
pub mod llama;
pub mod tokenizer;

use llama::Llama;
use tokenizer::TextTokenizer;

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
    if path.is_dir() { hf::load(path) } else { gguf::load(path) }
}
