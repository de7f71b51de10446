//! Perplexity, the yardstick of a model path's quality: the text's tokens in chunks of `context` (a BOS token first
//! when the model has one), each chunk run through the model from an empty cache, and the second half of each
//! chunk scored (the first half is context), as llama.cpp's `perplexity` does, so figures compare across engines.
//! `exp(mean negative log-likelihood)` of the scored tokens; lower is better.

use crate::kv::pool::BlockId;
use crate::kv::window::KvLayout;
use crate::model::llama::{BatchItem, KvDtype, KvStore, Tuned};

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

/// Perplexity of `model` over `tokens` the way llama.cpp's `perplexity` computes it: the text's tokens (after
/// `bos`, when the model has one) in chunks of `context`, each chunk's first token replaced by `bos`, each chunk
/// run from an empty cache in one prefill, and every token of its second half but the first scored from the
/// logits of the position before it, keys and values cached as `kv` says. `None` when the text is shorter than one
/// chunk.
pub fn perplexity<'a>(
    model: impl Into<Tuned<'a>>,
    tokens: &[u32],
    context: usize,
    bos: Option<u32>,
    kv: KvDtype,
) -> Option<Perplexity> {
    let context = context.max(4);
    let all: Vec<u32> = bos.into_iter().chain(tokens.iter().copied()).collect();
    let (mut nll, mut scored) = (0f64, 0usize);
    let chunks = all.chunks_exact(context).count();
    score_chunks(model, all.chunks_exact(context), bos, kv, |_, row, next| {
        nll -= log_prob(row, next);
        scored += 1;
    });
    (scored > 0).then(|| Perplexity { value: (nll / scored as f64).exp(), chunks, scored })
}

/// Run each chunk (its first token replaced by `bos`, when given) from an empty cache in one prefill, and hand
/// `row` the chunk's index, the logits of each scored position (the second half of the chunk but its last token,
/// in order) and the token after it. Keys and values are cached as `kv` says.
pub fn score_chunks<'a, 'm>(
    model: impl Into<Tuned<'m>>,
    chunks: impl Iterator<Item = &'a [u32]>,
    bos: Option<u32>,
    kv: KvDtype,
    mut row: impl FnMut(usize, &[f32], u32),
) {
    let Tuned { llama: model, adapter } = model.into();
    let vocab = model.config().vocab;
    let mut scratch: Option<(usize, Vec<BlockId>, KvStore)> = None;
    for (c, piece) in chunks.enumerate() {
        let context = piece.len();
        if scratch.as_ref().is_none_or(|(len, _, _)| *len != context) {
            let blocks: Vec<BlockId> = (0..context.div_ceil(BLOCK) as BlockId).collect();
            let layout = KvLayout::full(blocks.len()).with_dtype(kv);
            scratch = Some((context, blocks, KvStore::with_layout(model.config(), &layout, BLOCK)));
        }
        let (_, blocks, kv) = scratch.as_mut().expect("just made");
        let mut chunk = piece.to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        // Positions first..context - 1 predict the tokens after them; one step computes them all (the same bits
        // as token by token: every row is computed on its own).
        let first = context / 2;
        let rows = context - 1 - first;
        let item =
            BatchItem { tokens: &chunk[..context - 1], start: 0, blocks, window_blocks: &[], logits: rows, adapter };
        let logits = model.forward(&[item], kv);
        for (i, logits) in logits.chunks_exact(vocab).enumerate() {
            row(c, logits, chunk[first + 1 + i]);
        }
    }
}
