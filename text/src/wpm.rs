//! WordPiece vocabularies from GGUF (`tokenizer.ggml.model = "bert"`: BERT, nomic-bert and the other encoder
//! embedding models) as a Hugging Face WordPiece tokenizer. llama.cpp's converter writes a word's first piece with
//! a leading `▁` and its continuations bare (the "phantom space" form of BERT's `##` prefix); this turns them back,
//! so the pieces match greedily, longest first, as both llama.cpp's and BERT's own tokenizers match them, after
//! BERT's normalizer (control characters dropped, CJK characters split off, lowercasing and accent stripping where
//! the file asks) and its split on whitespace and punctuation.

use std::collections::HashMap;

use tokenizers::Tokenizer;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;

use crate::{GgufVocab, TokenizerError};

/// The word-start marker of llama.cpp's converted vocabularies.
const WORD_START: &str = "\u{2581}";

/// BERT's continuation prefix.
const CONTINUATION: &str = "##";

/// A token as Hugging Face's WordPiece spells it: word starts bare, continuations with `##`, bracketed specials
/// (`[CLS]`) as they are.
fn hf_piece(token: &str) -> String {
    if token.starts_with('[') && token.ends_with(']') {
        return token.to_owned();
    }
    match token.strip_prefix(WORD_START) {
        Some(start) => start.to_owned(),
        None => format!("{CONTINUATION}{token}"),
    }
}

/// The WordPiece tokenizer of a GGUF "bert" vocabulary.
pub(crate) fn tokenizer(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let bad = |e: String| TokenizerError::Tokenizer(e);
    let mut ids: HashMap<String, u32> = HashMap::with_capacity(vocab.tokens.len());
    for (id, token) in vocab.tokens.iter().enumerate() {
        // The first of two tokens that spell the same piece keeps it, as llama.cpp's lookup does.
        ids.entry(hf_piece(token)).or_insert(id as u32);
    }
    let unk = vocab.unk.and_then(|id| vocab.tokens.get(id as usize)).cloned().ok_or_else(|| {
        bad("a WordPiece vocabulary needs its unknown token (tokenizer.ggml.unknown_token_id)".into())
    })?;
    let longest = vocab.tokens.iter().map(|t| t.chars().count()).max().unwrap_or(1);
    // The builder takes only its own map type: the model is read from its serialized form instead (from text: its
    // reader borrows strings).
    let json = serde_json::json!({
        "type": "WordPiece",
        "unk_token": hf_piece(&unk),
        "continuing_subword_prefix": CONTINUATION,
        // A word longer than every piece can still be matched piece by piece: only absurd ones are unknown whole.
        "max_input_chars_per_word": longest.max(100) * 10,
        "vocab": ids,
    });
    let model: WordPiece = serde_json::from_str(&json.to_string()).map_err(|e| bad(e.to_string()))?;
    let mut inner = Tokenizer::new(model);
    let strip = vocab.strip_accents.unwrap_or(vocab.lowercase);
    inner
        .with_normalizer(Some(BertNormalizer::new(true, true, Some(strip), vocab.lowercase)))
        .map_err(|e| bad(e.to_string()))?;
    inner.with_pre_tokenizer(Some(BertPreTokenizer));
    inner.with_decoder(Some(WordPieceDecoder::default()));
    Ok(inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::TextTokenizer;

    /// BERT's layout: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, then pieces.
    pub(crate) fn bert_vocab(lowercase: bool) -> GgufVocab {
        let mut tokens: Vec<String> = (0..100).map(|i| format!("[unused{i}]")).collect();
        tokens[0] = "[PAD]".into();
        tokens.extend(["[UNK]", "[CLS]", "[SEP]", "[MASK]"].map(str::to_owned));
        for piece in ["▁hello", "▁world", "▁play", "ing", "ed", "▁un", "believ", "able", "▁,", "▁!", "▁the", "s"]
        {
            tokens.push(piece.to_owned());
        }
        let mut token_types = vec![1; tokens.len()];
        for id in [0, 100, 101, 102, 103] {
            token_types[id] = 3;
        }
        GgufVocab {
            model: "bert".into(),
            tokens,
            token_types,
            unk: Some(100),
            bos: Some(101),
            sep: Some(102),
            lowercase,
            ..GgufVocab::default()
        }
    }

    #[test]
    fn words_split_into_their_longest_pieces_and_unknown_words_are_one_unknown() {
        let tok = TextTokenizer::from_gguf(&bert_vocab(true)).unwrap();
        let id = |s: &str| bert_vocab(true).tokens.iter().position(|t| t == s).unwrap() as u32;
        assert_eq!(
            tok.encode("Hello, playing the unbelievable!").unwrap(),
            [id("▁hello"), id("▁,"), id("▁play"), id("ing"), id("▁the"), id("▁un"), id("believ"), id("able"), id("▁!")]
        );
        // "xyz" has no pieces: one [UNK] for the whole word, as llama.cpp's WordPiece gives.
        assert_eq!(tok.encode("hello xyz").unwrap(), [id("▁hello"), 100]);
        // A document is wrapped in [CLS] ... [SEP]; chat-style encoding is not.
        assert_eq!(tok.encode_document("Hello").unwrap(), [101, id("▁hello"), 102]);
        let again = TextTokenizer::from_parts(&tok.to_parts().unwrap()).unwrap();
        assert_eq!(again.encode_document("World, played!").unwrap(), tok.encode_document("World, played!").unwrap());
        assert_eq!(tok.decode(&[id("▁play"), id("ing"), id("▁the")]).unwrap(), "playing the");
    }

    #[test]
    fn case_is_kept_where_the_file_does_not_ask_for_lowercase() {
        let tok = TextTokenizer::from_gguf(&bert_vocab(false)).unwrap();
        assert_eq!(tok.encode("Hello").unwrap(), [100]);
        assert_eq!(tok.encode("hello").unwrap().len(), 1);
        assert_ne!(tok.encode("hello").unwrap(), [100]);
    }

    #[test]
    fn a_vocabulary_without_an_unknown_token_is_refused() {
        let vocab = GgufVocab { unk: None, ..bert_vocab(true) };
        assert!(TextTokenizer::from_gguf(&vocab).unwrap_err().to_string().contains("unknown token"));
    }
}
