//! Perplexity, the yardstick of a model path's quality: the text's tokens in chunks of `context` (a BOS token first
//! when the model has one), each chunk run through the model from an empty cache, and the second half of each
//! chunk scored (the first half is context), as llama.cpp's `perplexity` does, so figures compare across engines.
//! `exp(mean negative log-likelihood)` of the scored tokens; lower is better.

use crate::kv::pool::BlockId;
use crate::model::llama::{BatchItem, KvStore, Llama};

/// Tokens per KV block of the scratch cache.
const BLOCK: usize = 16;

/// One perplexity measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Perplexity {
    /// `exp` of the mean negative log-likelihood of the scored tokens.
    pub value: f64,
    /// Chunks run.
    pub chunks: usize,
    /// Tokens scored.
    pub scored: usize,
}

/// The log-probability of `token` under `logits` (a numerically stable log-softmax, in f64).
fn log_prob(logits: &[f32], token: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits[token as usize] as f64 - max - sum.ln()
}

/// Perplexity of `model` over `tokens` in chunks of `context` tokens (BOS `bos` first, when given, counted in
/// the chunk). `None` when the text is shorter than one chunk.
pub fn perplexity(model: &Llama, tokens: &[u32], context: usize, bos: Option<u32>) -> Option<Perplexity> {
    let context = context.max(4);
    let body = context - usize::from(bos.is_some());
    let blocks: Vec<BlockId> = (0..context.div_ceil(BLOCK) as BlockId).collect();
    let mut kv = KvStore::new(model.config(), blocks.len(), BLOCK);
    let (mut nll, mut scored, mut chunks) = (0f64, 0usize, 0usize);
    for piece in tokens.chunks_exact(body) {
        let chunk: Vec<u32> = bos.into_iter().chain(piece.iter().copied()).collect();
        let first = chunk.len() / 2;
        // The first half in one prefill step, whose logits predict the first scored token; then one token at a
        // time, each step's logits predicting the next.
        let mut logits =
            model.forward(&[BatchItem { tokens: &chunk[..first], start: 0, blocks: &blocks, logits: 1 }], &mut kv);
        for at in first..chunk.len() {
            nll -= log_prob(&logits, chunk[at]);
            scored += 1;
            if at + 1 < chunk.len() {
                let step = BatchItem { tokens: &chunk[at..at + 1], start: at, blocks: &blocks, logits: 1 };
                logits = model.forward(&[step], &mut kv);
            }
        }
        chunks += 1;
    }
    (scored > 0).then(|| Perplexity { value: (nll / scored as f64).exp(), chunks, scored })
}
