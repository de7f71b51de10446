//! Embedding models: a GGUF file that says how its token states pool into one vector (`{arch}.pooling_type`),
//! or an encoder of the BERT family. Decoders (Qwen3-Embedding and the like) run the Llama-family forward pass
//! with causal attention up to the final norm; encoders run [`bert`]'s bidirectional one. Each input's vector is
//! its token states pooled as the file says (mean, first token, last token) and L2-normalised, as llama.cpp's
//! `llama-embedding` makes them.

pub mod bert;

use std::path::Path;

use super::gguf::{self, Reader, meta_string, meta_usize};
use super::kv_store::KvStore;
use super::llama::{BatchItem, Llama};
use super::{LoadError, Precision};
use crate::kv::pool::BlockId;
use bert::Bert;
use zl_text::TextTokenizer;

/// How an input's token states become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Their mean.
    Mean,
    /// The first token's (BERT's `[CLS]`).
    Cls,
    /// The last token's (decoders: the only one that has read the whole input).
    Last,
}

impl Pooling {
    /// llama.cpp's `pooling_type` values: 1 mean, 2 CLS, 3 last (0 none and 4 rank are not embeddings).
    pub fn from_gguf(value: usize) -> Option<Pooling> {
        match value {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// The name model cards and `/v1/models` use.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// Pool `rows` (one input's token states, `width` each) into `out`.
    pub fn pool(self, rows: &[f32], width: usize, out: &mut [f32]) {
        let n = rows.len() / width;
        match self {
            Pooling::Cls => out.copy_from_slice(&rows[..width]),
            Pooling::Last => out.copy_from_slice(&rows[(n - 1) * width..]),
            Pooling::Mean => {
                out.fill(0.0);
                for row in rows.chunks_exact(width) {
                    out.iter_mut().zip(row).for_each(|(o, v)| *o += v);
                }
                out.iter_mut().for_each(|o| *o /= n as f32);
            }
        }
    }
}

/// Scale `v` to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}

/// The network under an embedding model.
#[derive(Debug)]
pub enum Net {
    /// A Llama-family decoder (causal), with the scratch KV store its forward pass writes.
    Decoder {
        /// The network.
        llama: Box<Llama>,
        /// Scratch keys and values and how many blocks they hold, grown to the largest batch seen.
        kv: Option<(usize, KvStore)>,
    },
    /// A BERT-family encoder (bidirectional).
    Encoder(Box<Bert>),
}

/// A loaded embedding model.
#[derive(Debug)]
pub struct EmbeddingModel {
    /// The network.
    pub net: Net,
    /// Its tokenizer (documents are wrapped as the file says: [`TextTokenizer::encode_document`]).
    pub tokenizer: TextTokenizer,
    /// Architecture, e.g. "bert".
    pub family: String,
    /// How token states pool.
    pub pooling: Pooling,
    /// Width of its vectors.
    pub dims: usize,
    /// The longest input in tokens.
    pub context_length: usize,
}

/// Tokens per block of the decoders' scratch KV store.
const BLOCK: usize = 16;

/// The encoder architectures (always embedding models).
const ENCODERS: [&str; 2] = ["bert", "nomic-bert"];

/// Whether the file at `path` holds an embedding model: a GGUF file of an encoder architecture, or one whose
/// `{arch}.pooling_type` says how to pool (1 mean, 2 CLS, 3 last). A directory (safetensors) is a generative model.
pub fn is_embedding(path: &Path) -> Result<bool, LoadError> {
    if path.is_dir() {
        return Ok(false);
    }
    let (content, _) = gguf::read_content(path)?;
    let arch = meta_string(&content, "general.architecture").unwrap_or_default();
    Ok(ENCODERS.contains(&arch.as_str()) || content.metadata.contains_key(&format!("{arch}.pooling_type")))
}

/// Load the embedding model at `path` (a GGUF file [`is_embedding`] accepts).
pub fn load(path: &Path, precision: Precision) -> Result<EmbeddingModel, LoadError> {
    let (content, file) = gguf::read_content(path)?;
    let arch = meta_string(&content, "general.architecture").unwrap_or_default();
    let encoder = ENCODERS.contains(&arch.as_str());
    let pooling = match meta_usize(&content, &format!("{arch}.pooling_type")) {
        Ok(value) => Pooling::from_gguf(value).ok_or_else(|| {
            LoadError::Unsupported(format!(
                "{arch}.pooling_type {value}: only pooled embeddings are served (1 mean, 2 CLS, 3 last; not 0, one \
                 vector per token, or 4, reranking)"
            ))
        })?,
        // An encoder that does not say: sentence-transformers' default.
        Err(_) if encoder => Pooling::Mean,
        Err(e) => return Err(e),
    };
    if !encoder {
        drop(content);
        let loaded = gguf::load_with(path, precision)?;
        let cfg = loaded.llama.config();
        let (dims, context_length) = (cfg.hidden, cfg.context_length);
        return Ok(EmbeddingModel {
            net: Net::Decoder { llama: Box::new(loaded.llama), kv: None },
            tokenizer: loaded.tokenizer,
            family: loaded.family,
            pooling,
            dims,
            context_length,
        });
    }
    let vocab = gguf::vocab(&content)?;
    let mut r = Reader::new(&content, file, precision);
    let bert = Bert::load(&content, &mut r, &arch, vocab.tokens.len())?;
    drop(r);
    let tokenizer = TextTokenizer::from_gguf(&vocab).map_err(|e| LoadError::Format(e.to_string()))?;
    let (dims, context_length) = (bert.config().hidden, bert.config().context_length);
    Ok(EmbeddingModel { net: Net::Encoder(Box::new(bert)), tokenizer, family: arch, pooling, dims, context_length })
}

impl EmbeddingModel {
    /// Bytes of its matrices in memory.
    pub fn weight_bytes(&self) -> usize {
        match &self.net {
            Net::Decoder { llama, .. } => llama.weight_bytes_by_format().values().sum(),
            Net::Encoder(bert) => bert.weight_bytes(),
        }
    }

    /// One unit vector per input (each 1 to `context_length` tokens), computed together. Each input's vector is
    /// its own: batching never changes it.
    pub fn embed(&mut self, inputs: &[&[u32]]) -> Vec<Vec<f32>> {
        let d = self.dims;
        // Every token's state (encoders, mean pooling) or the pooled ones only.
        let (states, rows_of): (Vec<f32>, Vec<usize>) = match &mut self.net {
            Net::Encoder(bert) => (bert.forward(inputs), inputs.iter().map(|i| i.len()).collect()),
            Net::Decoder { llama, kv } => {
                let per: Vec<usize> = inputs.iter().map(|i| i.len().div_ceil(BLOCK)).collect();
                let blocks = per.iter().sum::<usize>();
                if kv.as_ref().is_none_or(|(held, _)| *held < blocks) {
                    *kv = None;
                    *kv = Some((blocks, KvStore::new(llama.config(), blocks, BLOCK)));
                }
                let (_, store) = kv.as_mut().expect("allocated above");
                let mut next = 0;
                let tables: Vec<Vec<BlockId>> = per
                    .iter()
                    .map(|&n| {
                        next += n;
                        (next - n..next).map(|b| b as BlockId).collect()
                    })
                    .collect();
                // Last-token pooling reads one state per input; the others every one.
                let wanted = |i: &[u32]| if self.pooling == Pooling::Last { 1 } else { i.len() };
                let items: Vec<BatchItem<'_>> = inputs
                    .iter()
                    .zip(&tables)
                    .map(|(i, blocks)| BatchItem {
                        tokens: i,
                        start: 0,
                        blocks,
                        window_blocks: &[],
                        logits: wanted(i),
                        adapter: None,
                    })
                    .collect();
                (llama.forward_hidden(&items, store), inputs.iter().map(|i| wanted(i)).collect())
            }
        };
        let mut at = 0;
        rows_of
            .iter()
            .map(|&rows| {
                let mut v = vec![0f32; d];
                self.pooling.pool(&states[at * d..(at + rows) * d], d, &mut v);
                at += rows;
                normalize(&mut v);
                v
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_takes_the_mean_the_first_or_the_last_state() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0];
        let mut out = [0f32; 2];
        Pooling::Mean.pool(&rows, 2, &mut out);
        assert_eq!(out, [3.0, 5.0]);
        Pooling::Cls.pool(&rows, 2, &mut out);
        assert_eq!(out, [1.0, 2.0]);
        Pooling::Last.pool(&rows, 2, &mut out);
        assert_eq!(out, [5.0, 9.0]);
        assert_eq!(
            [1, 2, 3, 4].map(Pooling::from_gguf),
            [Some(Pooling::Mean), Some(Pooling::Cls), Some(Pooling::Last), None]
        );
    }

    #[test]
    fn vectors_are_scaled_to_unit_length_and_zero_stays_zero() {
        let mut v = [3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = [0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, [0.0, 0.0]);
    }
}
