//! Log-probabilities in OpenAI's two shapes: Chat Completions' `logprobs.content` (a list of tokens, each with its
//! bytes and its most likely alternatives) and the legacy Completions' columns (`tokens`, `token_logprobs`,
//! `top_logprobs` as token -> log-probability maps, `text_offset`). Tokens are named by their bytes in the model's
//! vocabulary, as the worker's tokenizer has them.

use serde_json::{Map, Value, json};
use zl_client::card::Card;

use crate::events::Logprobs;

/// What OpenAI writes for a log-probability of minus infinity (JSON has no infinities).
const FLOOR: f64 = -9999.0;

fn number(lp: f32) -> f64 {
    if lp.is_finite() { f64::from(lp) } else { FLOOR }
}

/// A token's text: its bytes as UTF-8, a partial character replaced (its bytes are given apart).
fn text(card: &Card, token: u32) -> String {
    String::from_utf8_lossy(card.token_bytes(token)).into_owned()
}

/// One token of Chat Completions' `logprobs.content`.
fn chat_entry(card: &Card, token: u32, lp: f32, top: &[(u32, f32)]) -> Value {
    let alt = |t: u32, lp: f32| json!({"token": text(card, t), "logprob": number(lp), "bytes": card.token_bytes(t)});
    let mut entry = alt(token, lp);
    entry["top_logprobs"] = top.iter().map(|&(t, lp)| alt(t, lp)).collect();
    entry
}

/// Chat Completions' `logprobs.content` entries of the output tokens in `logprobs` (prompt runs are skipped).
pub fn chat_content(card: &Card, logprobs: &Logprobs) -> Vec<Value> {
    if logprobs.prompt_start.is_some() {
        return Vec::new();
    }
    logprobs.entries().map(|(t, lp, top)| chat_entry(card, t, lp, top)).collect()
}

/// The `logprobs` object of a choice: `{"content": [...], "refusal": null}`.
pub fn chat_object(content: Vec<Value>) -> Value {
    json!({"content": content, "refusal": null})
}

/// The legacy Completions `logprobs` object, built a run at a time.
#[derive(Clone, Debug, Default)]
pub struct Columns {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
    /// Bytes of text so far (offsets count from the start of the choice's text).
    offset: usize,
}

impl Columns {
    /// Columns whose first offset is `offset` (a stream's later chunks go on from where the text is).
    pub fn at(offset: usize) -> Self {
        Columns { offset, ..Columns::default() }
    }

    /// The first token of an echoed prompt: it has no log-probability (nothing precedes it).
    pub fn first(&mut self, card: &Card, token: u32) {
        self.push(card, token, Value::Null, Value::Null);
    }

    /// A run of tokens with their log-probabilities.
    pub fn add(&mut self, card: &Card, logprobs: &Logprobs) {
        for (t, lp, top) in logprobs.entries() {
            let mut map = Map::new();
            for &(alt, alt_lp) in top {
                // A token whose text another alternative already has (partial characters) keeps the likelier.
                map.entry(text(card, alt)).or_insert_with(|| json!(number(alt_lp)));
            }
            self.push(card, t, json!(number(lp)), Value::Object(map));
        }
    }

    fn push(&mut self, card: &Card, token: u32, lp: Value, top: Value) {
        self.tokens.push(Value::String(text(card, token)));
        self.token_logprobs.push(lp);
        self.top_logprobs.push(top);
        self.text_offset.push(json!(self.offset));
        self.offset += card.token_bytes(token).len();
    }

    /// Bytes of text the tokens added so far stand for, from the first offset.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The object.
    pub fn value(self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}
