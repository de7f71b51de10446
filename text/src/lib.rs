//! Tokenizers and chat templates: a Hugging Face `tokenizer.json`, or a byte-level BPE tokenizer rebuilt from a
//! GGUF file's own `tokenizer.ggml.*` metadata (as llama.cpp does), and the model's Jinja chat template rendered
//! with minijinja (ChatML when the model has none). Shared by the worker (which generates with it) and the frontend
//! (which counts, checks and hashes prompts with the very same tokenizer, sent over as a model card).

use std::collections::HashMap;
use std::sync::Arc;

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

mod bytes;
mod spm;
mod wpm;
pub use bytes::SPECIAL_MARKER;

/// ChatML, used when a model ships no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
     message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A tokenizer or template problem.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to parse or render.
    #[error("chat template: {0}")]
    Template(String),
}

/// One chat message, already flattened to text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    /// "system", "user" or "assistant".
    pub role: String,
    /// The text.
    pub content: String,
}

/// GGUF tokenizer metadata, as read from the file.
#[derive(Debug, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE), "llama" (SentencePiece) or "bert" (WordPiece).
    pub model: String,
    /// `tokenizer.ggml.pre`, e.g. "smollm".
    pub pre: String,
    /// Token strings by id.
    pub tokens: Vec<String>,
    /// Merge rules, "left right" (byte-level BPE).
    pub merges: Vec<String>,
    /// Piece scores by id (SentencePiece).
    pub scores: Vec<f32>,
    /// Whether a space goes in front of the text (SentencePiece's `add_dummy_prefix`).
    pub add_space_prefix: bool,
    /// The unknown token's id (SentencePiece).
    pub unk: Option<u32>,
    /// Token types by id (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub token_types: Vec<i32>,
    /// End-of-sequence token id.
    pub eos: Option<u32>,
    /// The token a text starts with, when the file asks for one (`tokenizer.ggml.add_bos_token`): chat templates
    /// write it as `bos_token`.
    pub bos: Option<u32>,
    /// Chat template.
    pub chat_template: Option<String>,
    /// A document (an embedding input) ends with the end-of-sequence token (`tokenizer.ggml.add_eos_token`).
    pub add_eos: bool,
    /// A WordPiece document ends with this separator (BERT's `[SEP]`; it starts with `bos`, BERT's `[CLS]`).
    pub sep: Option<u32>,
    /// WordPiece: lowercase the text first (`tokenizer.ggml.normalizer.lowercase`).
    pub lowercase: bool,
    /// WordPiece: strip accents (`tokenizer.ggml.normalizer.strip_accents`; `None`: when lowercasing).
    pub strip_accents: Option<bool>,
}

/// A tokenizer in portable form: what a worker sends a frontend in a model card, so both tokenise alike.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerParts {
    /// A Hugging Face `tokenizer.json` document.
    pub tokenizer_json: String,
    /// The Jinja chat template.
    pub chat_template: String,
    /// Beginning-of-sequence token string.
    pub bos: String,
    /// End-of-sequence token string.
    pub eos: String,
    /// Token ids that end a turn.
    pub stop_ids: Vec<u32>,
}

/// A model's tokenizer, stop tokens and chat template.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Token ids that end a turn (EOS, `<|im_end|>`, `<|eot_id|>`, ...).
    pub stop_ids: Vec<u32>,
    template: String,
    /// The template compiled once (or why it does not compile, reported when rendering).
    compiled: Arc<Result<minijinja::Environment<'static>, String>>,
    bos: String,
    eos: String,
    /// The longest token's text in bytes (see [`TextTokenizer::max_token_bytes`]).
    max_token_bytes: usize,
}

/// The longest vocabulary entry, in bytes of its stored form. Every tokenizer family stores a token in at least
/// as many bytes as it decodes to (byte-level BPE maps each byte to a one- or two-byte character, SentencePiece
/// spells a space as the three-byte `▁` and byte fallbacks as `<0xNN>`), so this bounds the bytes of text one
/// token can stand for.
fn longest_token(inner: &Tokenizer) -> usize {
    inner.get_vocab(true).keys().map(String::len).max().unwrap_or(1).max(1)
}

/// The environment chat templates render in: the template under "chat", and `raise_exception`.
fn compile(template: &str) -> Result<minijinja::Environment<'static>, String> {
    let mut env = minijinja::Environment::new();
    env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_template_owned("chat", template.to_owned()).map_err(|e| e.to_string())?;
    Ok(env)
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer").field("stop_ids", &self.stop_ids).finish_non_exhaustive()
    }
}

/// Turn names that end a turn in the common chat formats.
const END_OF_TURN: [&str; 6] = ["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>", "<|end|>", "<end_of_turn>"];

impl TextTokenizer {
    /// The one place a tokenizer is put together: every constructor ends here, so derived facts (the longest
    /// token) are computed alike.
    fn assemble(
        inner: Tokenizer,
        stop_ids: Vec<u32>,
        template: String,
        compiled: Result<minijinja::Environment<'static>, String>,
        bos: String,
        eos: String,
    ) -> TextTokenizer {
        let max_token_bytes = longest_token(&inner);
        TextTokenizer { inner, stop_ids, template, compiled: Arc::new(compiled), bos, eos, max_token_bytes }
    }

    /// Rebuild a tokenizer from GGUF metadata: byte-level BPE ("gpt2"), SentencePiece ("llama") or WordPiece
    /// ("bert").
    pub fn from_gguf(vocab: &GgufVocab) -> Result<TextTokenizer, TokenizerError> {
        let mut inner = match vocab.model.as_str() {
            "gpt2" => Self::byte_level(vocab)?,
            "llama" => spm::tokenizer(vocab)?,
            "bert" => wpm::tokenizer(vocab)?,
            other => {
                return Err(TokenizerError::Tokenizer(format!(
                    "GGUF tokenizer model {other:?} is not supported (byte-level BPE, \"gpt2\", SentencePiece, \
                     \"llama\", and WordPiece, \"bert\", are)"
                )));
            }
        };
        if let Some(wrap) = document_wrap(vocab)? {
            inner.with_post_processor(Some(wrap));
        }
        // Control and user-defined tokens are matched whole in the input (chat markers like <|im_start|>).
        let specials: Vec<AddedToken> = vocab
            .tokens
            .iter()
            .zip(&vocab.token_types)
            .filter(|(_, t)| **t == 3 || **t == 4)
            .map(|(s, t)| AddedToken::from(s.clone(), *t == 3))
            .collect();
        inner.add_special_tokens(specials).map_err(|e| TokenizerError::Tokenizer(e.to_string()))?;
        let eos = vocab.eos.and_then(|id| vocab.tokens.get(id as usize)).cloned().unwrap_or_default();
        let mut stop_ids: Vec<u32> = vocab.eos.into_iter().collect();
        for name in END_OF_TURN {
            if let Some(id) = vocab.tokens.iter().position(|t| t == name) {
                stop_ids.push(id as u32);
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let template = vocab.chat_template.clone().unwrap_or_else(|| CHATML_TEMPLATE.to_owned());
        let compiled = compile(&template);
        let bos = vocab.bos.and_then(|id| vocab.tokens.get(id as usize)).cloned().unwrap_or_default();
        Ok(TextTokenizer::assemble(inner, stop_ids, template, compiled, bos, eos))
    }

    /// A byte-level BPE tokenizer (GPT-2's scheme) from GGUF metadata.
    fn byte_level(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
        let ids: Vocab = vocab.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let merges = vocab
            .merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| TokenizerError::Tokenizer(format!("bad merge {m:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(ids, merges)
            .build()
            .map_err(|e| TokenizerError::Tokenizer(e.to_string()))?;
        let mut inner = Tokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, true, true);
        // Pre-tokenizers by `tokenizer.ggml.pre`: the digit split is what SmolLM's and StarCoder's tokenizer.json
        // declare; plain GPT-2 byte-level for the rest.
        let pre: PreTokenizerWrapper = match vocab.pre.as_str() {
            "smollm" | "starcoder" | "refact" => {
                Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
            }
            _ => byte_level.into(),
        };
        inner.with_pre_tokenizer(Some(pre));
        inner.with_decoder(Some(ByteLevel::default()));
        Ok(inner)
    }

    /// Load a Hugging Face `tokenizer.json`, with the chat template and special tokens of `tokenizer_config.json`
    /// when given.
    pub fn from_hf(tokenizer_json: &[u8], tokenizer_config: Option<&[u8]>) -> Result<TextTokenizer, TokenizerError> {
        let inner = Tokenizer::from_bytes(tokenizer_json).map_err(|e| TokenizerError::Tokenizer(e.to_string()))?;
        let config: HashMap<String, serde_json::Value> = match tokenizer_config {
            Some(bytes) => serde_json::from_slice(bytes).map_err(|e| TokenizerError::Tokenizer(e.to_string()))?,
            None => HashMap::new(),
        };
        let token_str = |key: &str| match config.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()).map(str::to_owned),
            _ => None,
        };
        let eos = token_str("eos_token").unwrap_or_default();
        let mut stop_ids = Vec::new();
        for name in END_OF_TURN.iter().copied().chain(std::iter::once(eos.as_str())) {
            if let Some(id) = inner.token_to_id(name) {
                stop_ids.push(id);
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let template = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            _ => CHATML_TEMPLATE.to_owned(),
        };
        let bos = token_str("bos_token").unwrap_or_default();
        let compiled = compile(&template);
        Ok(TextTokenizer::assemble(inner, stop_ids, template, compiled, bos, eos))
    }

    /// This tokenizer in portable form.
    pub fn to_parts(&self) -> Result<TokenizerParts, TokenizerError> {
        Ok(TokenizerParts {
            tokenizer_json: self.inner.to_string(false).map_err(|e| TokenizerError::Tokenizer(e.to_string()))?,
            chat_template: self.template.clone(),
            bos: self.bos.clone(),
            eos: self.eos.clone(),
            stop_ids: self.stop_ids.clone(),
        })
    }

    /// Rebuild a tokenizer from its portable form; the template is checked to parse.
    pub fn from_parts(parts: &TokenizerParts) -> Result<TextTokenizer, TokenizerError> {
        let inner = Tokenizer::from_bytes(parts.tokenizer_json.as_bytes())
            .map_err(|e| TokenizerError::Tokenizer(e.to_string()))?;
        let compiled = compile(&parts.chat_template).map_err(TokenizerError::Template)?;
        Ok(TextTokenizer::assemble(
            inner,
            parts.stop_ids.clone(),
            parts.chat_template.clone(),
            Ok(compiled),
            parts.bos.clone(),
            parts.eos.clone(),
        ))
    }

    /// The beginning-of-sequence token's text, when the model's file asks for one at the start of a text (empty
    /// otherwise).
    pub fn bos_text(&self) -> &str {
        &self.bos
    }

    /// Token ids of `text`; special-token markers in it are matched as special tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(|e| TokenizerError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of `text` as a document to embed: with the special tokens the model's tokenizer puts around a
    /// text (BERT's `[CLS]` and `[SEP]`, a file's BOS and EOS where it asks for them), as llama.cpp's and Hugging
    /// Face's tokenizers add them.
    pub fn encode_document(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, true).map_err(|e| TokenizerError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner.decode(ids, true).map_err(|e| TokenizerError::Tokenizer(e.to_string()))
    }

    /// The most bytes of text one token can stand for: a text of `n` bytes needs at least `n / max_token_bytes`
    /// tokens, so a text longer than `context * max_token_bytes` bytes can never fit a context window. Lets a
    /// caller refuse a huge prompt without tokenizing it.
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// The vocabulary size the tokenizer knows (added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Render `messages` with the model's chat template, ending with the assistant's turn opener.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
        self.render_chat_with_tools(messages, None)
    }

    /// Whether the chat template reads a `tools` variable (it writes offered tools its own way).
    pub fn knows_tools(&self) -> bool {
        self.template.contains("tools")
    }

    /// [`TextTokenizer::render_chat`], giving the template `tools` (OpenAI's function format) when there are any.
    pub fn render_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
    ) -> Result<String, TokenizerError> {
        self.render_chat_thinking(messages, tools, None)
    }

    /// Whether the chat template has a thinking section (`<think>` ... `</think>`, as Qwen3's).
    pub fn has_thinking(&self) -> bool {
        self.template.contains("<think>")
    }

    /// [`TextTokenizer::render_chat_with_tools`] with the template's thinking switch (`enable_thinking`, as
    /// Qwen3's templates read it) set, or left to the template's default (`None`).
    pub fn render_chat_thinking(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        thinking: Option<bool>,
    ) -> Result<String, TokenizerError> {
        let env = self.compiled.as_ref().as_ref().map_err(|e| TokenizerError::Template(e.clone()))?;
        let tmpl = env.get_template("chat").map_err(|e| TokenizerError::Template(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => tools,
            enable_thinking => thinking,
            add_generation_prompt => true,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(|e| TokenizerError::Template(e.to_string()))
    }

    /// Incremental detokenizer for one sequence.
    pub fn stream(&self) -> Detokenizer {
        Detokenizer::default()
    }
}

/// The special tokens a GGUF vocabulary puts around a document, as a post-processor: WordPiece starts with its
/// BOS (`[CLS]`) and ends with its separator; the others start with BOS where the file adds one and end with EOS
/// where it says `add_eos_token`. `None`: nothing to add.
fn document_wrap(vocab: &GgufVocab) -> Result<Option<TemplateProcessing>, TokenizerError> {
    let bad = |e: String| TokenizerError::Tokenizer(format!("the document template: {e}"));
    let end = if vocab.model == "bert" { vocab.sep } else { vocab.eos.filter(|_| vocab.add_eos) };
    let named = |id: Option<u32>| -> Result<Option<(String, u32)>, TokenizerError> {
        let Some(id) = id else { return Ok(None) };
        let token = vocab.tokens.get(id as usize).ok_or_else(|| bad(format!("token {id} is not in the vocabulary")))?;
        // The template language reads `$` and `:` and splits on spaces: such a token cannot be named in it.
        if token.is_empty() || token.starts_with('$') || token.contains([':', ' ']) {
            return Err(bad(format!("token {token:?} cannot be written in a template")));
        }
        Ok(Some((token.clone(), id)))
    };
    let (start, end) = (named(vocab.bos)?, named(end)?);
    if start.is_none() && end.is_none() {
        return Ok(None);
    }
    let pieces: Vec<String> = start
        .iter()
        .map(|(t, _)| t.clone())
        .chain(std::iter::once("$A".to_owned()))
        .chain(end.iter().map(|(t, _)| t.clone()))
        .collect();
    let mut specials: Vec<(String, u32)> = start.into_iter().chain(end).collect();
    specials.dedup();
    TemplateProcessing::builder()
        .try_single(pieces.join(" "))
        .map_err(bad)?
        .special_tokens(specials)
        .build()
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

/// Turns a growing list of token ids into text deltas. It decodes only a short window (the tokens since the last
/// emitted text plus the ones before them, for context), and holds back an incomplete UTF-8 character.
#[derive(Debug, Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl Detokenizer {
    /// Add one token; returns the new, complete text (possibly empty).
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let now = tok.decode(&self.ids[self.prefix..])?;
        // A trailing U+FFFD means the last token ended inside a multi-byte character: wait for more.
        if now.len() <= before.len() || now.ends_with('\u{fffd}') || !now.is_char_boundary(before.len()) {
            return Ok(String::new());
        }
        let delta = now[before.len()..].to_owned();
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(delta)
    }
}

/// A small byte-level vocabulary (the 256 byte tokens, a few merges, ChatML markers) for tests of crates that need
/// a real tokenizer but not a real model.
pub mod testing {
    use super::GgufVocab;
    use crate::bytes::byte_char;

    /// Byte tokens 0..256, merges for "he", "ll", "hell", "hello", then `<|endoftext|>` (260),
    /// `<|im_start|>` (261) and `<|im_end|>` (262, the end of sequence).
    pub fn tiny_vocab() -> GgufVocab {
        let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
        let merges = vec!["h e".to_owned(), "l l".to_owned(), "he ll".to_owned(), "hell o".to_owned()];
        tokens.extend(["he", "ll", "hell", "hello"].map(str::to_owned));
        let mut token_types = vec![1; tokens.len()];
        for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
            tokens.push(special.to_owned());
            token_types.push(3);
        }
        GgufVocab {
            model: "gpt2".into(),
            pre: "smollm".into(),
            eos: Some(tokens.len() as u32 - 1),
            tokens,
            merges,
            token_types,
            chat_template: None,
            ..GgufVocab::default()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn tokenizer_survives_its_portable_form() {
        let tok = TextTokenizer::from_gguf(&testing::tiny_vocab()).unwrap();
        let again = TextTokenizer::from_parts(&tok.to_parts().unwrap()).unwrap();
        let chat = [ChatMessage { role: "user".into(), content: "hello 123, héllo!".into() }];
        let text = tok.render_chat(&chat).unwrap();
        assert_eq!(again.render_chat(&chat).unwrap(), text);
        let ids = tok.encode(&text).unwrap();
        assert_eq!(again.encode(&text).unwrap(), ids);
        assert!(ids.contains(&262), "<|im_end|> is one special token: {ids:?}");
        assert!(ids.contains(&259), "hello merges into one token: {ids:?}");
        assert_eq!(tok.decode(&ids).unwrap(), again.decode(&ids).unwrap());
        assert_eq!(again.stop_ids, tok.stop_ids);
    }

    #[test]
    fn templates_that_know_tools_are_given_them() {
        let mut vocab = testing::tiny_vocab();
        assert!(!TextTokenizer::from_gguf(&vocab).unwrap().knows_tools());
        vocab.chat_template = Some(
            "{% if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
                .into(),
        );
        let tok = TextTokenizer::from_gguf(&vocab).unwrap();
        assert!(tok.knows_tools());
        let chat = [ChatMessage { role: "user".into(), content: "hi".into() }];
        let tools = [serde_json::json!({"type": "function", "function": {"name": "now"}})];
        assert_eq!(tok.render_chat_with_tools(&chat, Some(&tools)).unwrap(), "[now]hi");
        assert_eq!(tok.render_chat(&chat).unwrap(), "hi");
    }

    #[test]
    fn no_text_has_more_bytes_than_its_tokens_can_stand_for() {
        let tok = TextTokenizer::from_gguf(&testing::tiny_vocab()).unwrap();
        let bound = tok.max_token_bytes();
        assert!(bound >= 1);
        for text in ["", "a", "hello world", "   many    spaces   ", "ünïcödé ✓ 日本語 🎉", &"ab".repeat(500)]
        {
            let tokens = tok.encode(text).unwrap().len();
            assert!(text.len() <= tokens * bound, "{text:?}: {} bytes, {tokens} tokens of at most {bound}", text.len());
        }
        let again = TextTokenizer::from_parts(&tok.to_parts().unwrap()).unwrap();
        assert_eq!(again.max_token_bytes(), bound);
    }

    #[test]
    fn a_broken_card_is_an_error_not_a_panic() {
        let mut parts = TextTokenizer::from_gguf(&testing::tiny_vocab()).unwrap().to_parts().unwrap();
        parts.chat_template = "{% for %}".into();
        assert!(TextTokenizer::from_parts(&parts).is_err());
        parts.tokenizer_json = "{".into();
        assert!(TextTokenizer::from_parts(&parts).is_err());
    }
}
