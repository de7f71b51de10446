//! SentencePiece vocabularies from GGUF (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, Gemma, Phi-3) as a
//! Hugging Face BPE tokenizer, the way Hugging Face converts them: merges ranked by the score of the piece they
//! make (so merging the best-scored adjacent pair first, as llama.cpp's SentencePiece tokenizer does), bytes
//! without a piece written as `<0xXX>` tokens, spaces as `▁` (one in front when `add_space_prefix`).

use std::collections::HashMap;

use tokenizers::Tokenizer;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence};

use crate::{GgufVocab, TokenizerError};

/// SentencePiece's word boundary.
const SPACE: &str = "\u{2581}";

/// Token types whose pieces take part in merges (normal and user-defined); control, unknown, unused and byte
/// tokens do not.
fn mergeable(ty: Option<&i32>) -> bool {
    matches!(ty, None | Some(1) | Some(4))
}

/// The BPE tokenizer of a SentencePiece vocabulary.
pub(crate) fn tokenizer(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let bad = |e: String| TokenizerError::Tokenizer(e);
    if vocab.scores.len() != vocab.tokens.len() {
        return Err(bad(format!(
            "a SentencePiece vocabulary needs a score per token ({} scores for {} tokens)",
            vocab.scores.len(),
            vocab.tokens.len()
        )));
    }
    let ids: HashMap<&str, u32> = vocab.tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i as u32)).collect();
    let part = |s: &str| ids.get(s).copied().filter(|&id| mergeable(vocab.token_types.get(id as usize)));
    // Every split of every piece into two pieces, ranked by the piece's score (best first; ties by the parts' ids).
    let mut ranked: Vec<(f32, u32, u32)> = Vec::new();
    for (id, piece) in vocab.tokens.iter().enumerate() {
        if !mergeable(vocab.token_types.get(id)) {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            if let (Some(l), Some(r)) = (part(&piece[..at]), part(&piece[at..])) {
                ranked.push((vocab.scores[id], l, r));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges: Vec<(String, String)> = ranked
        .into_iter()
        .map(|(_, l, r)| (vocab.tokens[l as usize].clone(), vocab.tokens[r as usize].clone()))
        .collect();
    let map: Vocab = vocab.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut bpe = BPE::builder().vocab_and_merges(map, merges).byte_fallback(true);
    if let Some(unk) = vocab.unk.and_then(|id| vocab.tokens.get(id as usize)) {
        bpe = bpe.unk_token(unk.clone());
    }
    let bpe = bpe.build().map_err(|e| bad(e.to_string()))?;
    let mut inner = Tokenizer::new(bpe);
    let replace = Replace::new(" ", SPACE).map_err(|e| bad(e.to_string()))?;
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if vocab.add_space_prefix {
        normalizers.push(Prepend::new(SPACE.to_owned()).into());
    }
    normalizers.push(replace.into());
    inner.with_normalizer(Some(NormalizerSequence::new(normalizers))).map_err(|e| bad(e.to_string()))?;
    let mut decoders: Vec<DecoderWrapper> =
        vec![Replace::new(SPACE, " ").map_err(|e| bad(e.to_string()))?.into(), ByteFallback::default().into()];
    decoders.push(Fuse::default().into());
    if vocab.add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Pieces with scores (higher merges first), three bytes as `<0xXX>` tokens, control tokens first.
    fn vocab(add_space_prefix: bool) -> GgufVocab {
        let pieces: [(&str, f32, i32); 14] = [
            ("<unk>", 0.0, 2),
            ("<s>", 0.0, 3),
            ("</s>", 0.0, 3),
            ("<0x0A>", 0.0, 6),
            ("<0xC3>", 0.0, 6),
            ("<0xA9>", 0.0, 6),
            ("\u{2581}", -1.0, 1),
            ("h", -2.0, 1),
            ("e", -3.0, 1),
            ("l", -4.0, 1),
            ("o", -5.0, 1),
            ("ll", -6.0, 1),
            ("\u{2581}he", -7.0, 1),
            ("he", -8.0, 1),
        ];
        GgufVocab {
            model: "llama".into(),
            tokens: pieces.iter().map(|p| p.0.to_owned()).collect(),
            scores: pieces.iter().map(|p| p.1).collect(),
            token_types: pieces.iter().map(|p| p.2).collect(),
            unk: Some(0),
            eos: Some(2),
            add_space_prefix,
            ..GgufVocab::default()
        }
    }

    fn ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
        tok.encode(text, false).unwrap().get_ids().to_vec()
    }

    #[test]
    fn merges_follow_the_scores_and_bytes_fall_back() {
        let tok = tokenizer(&vocab(false)).unwrap();
        // "hello": "ll" (-6) merges before "he" (-8); no "▁" in front without the prefix.
        assert_eq!(ids(&tok, "hello"), vec![13, 11, 10]);
        // A space becomes "▁", which merges with "he" into "▁he" (-7) before "he" alone could.
        assert_eq!(ids(&tok, "o he"), vec![10, 12]);
        // "é" (C3 A9) and a newline have no piece: their bytes.
        assert_eq!(ids(&tok, "é\n"), vec![4, 5, 3]);
        assert_eq!(tok.decode(&[13, 11, 10, 12, 4, 5, 3], false).unwrap(), "hello heé\n");
    }

    #[test]
    fn the_space_prefix_is_added_and_stripped() {
        let tok = tokenizer(&vocab(true)).unwrap();
        assert_eq!(ids(&tok, "he"), vec![12]);
        assert_eq!(tok.decode(&[12, 11, 10], false).unwrap(), "hello");
    }

    #[test]
    fn a_vocabulary_without_scores_is_refused() {
        let mut v = vocab(false);
        v.scores.pop();
        assert!(tokenizer(&v).unwrap_err().to_string().contains("a score per token"));
    }
}
