//! OpenAI's legacy Completions API, `POST /v1/completions`: a prompt continued as is (no chat template), as a
//! `text_completion` object or its chunks ending with `data: [DONE]`; `echo` puts the prompt in front of the
//! answer, and `logprobs` N gives each token's log-probability with its N likeliest alternatives (the prompt's
//! too with `echo`), in the legacy columns (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).

use std::sync::Arc;

use serde_json::{Value, json};
use zl_client::card::Card;

use crate::cache::FinishInfo;
use crate::dialect::Dialect;
use crate::error::{ApiError, ErrorFormat};
use crate::events::Logprobs;
use crate::gateway::{GenEvent, GenRequest, LogprobRequest, Meta, Prepared, RawPrompt};
use crate::ids::{random_id, unix_now};
use crate::logprobs::Columns;
use crate::openai::{DONE, finish_reason, stream_error, usage};
use crate::request::Fields;

/// OpenAI's default output limit for completions.
const DEFAULT_MAX_TOKENS: u32 = 16;

/// The prompt of a completions request: one string or one token array (a list holding one of either is the
/// same).
fn prompt(f: &Fields<'_>) -> Result<RawPrompt, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("prompt", format!("prompt: {m}"));
    let tokens = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("a token array holds non-negative integer token ids"))
    };
    let one = match f.get("prompt") {
        None => return Err(bad("Field required")),
        Some(Value::String(s)) => RawPrompt::Text(s.clone()),
        Some(Value::Array(items)) if items.is_empty() => return Err(bad("must not be empty")),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => RawPrompt::Tokens(tokens(items)?),
        Some(Value::Array(items)) if items.len() == 1 => match &items[0] {
            Value::String(s) => RawPrompt::Text(s.clone()),
            Value::Array(t) => RawPrompt::Tokens(tokens(t)?),
            _ => return Err(bad("expected a string, a list of strings, or token arrays")),
        },
        Some(Value::Array(items)) => {
            return Err(bad(&format!(
                "{} prompts in one request: this server completes one prompt per request (send them as \
                 separate requests, which it batches)",
                items.len()
            )));
        }
        Some(_) => return Err(bad("expected a string, a list of strings, or token arrays")),
    };
    let empty = match &one {
        RawPrompt::Text(t) => t.is_empty(),
        RawPrompt::Tokens(t) => t.is_empty(),
    };
    if empty {
        return Err(bad("must not be empty"));
    }
    Ok(one)
}

/// Parse a `POST /v1/completions` body.
pub fn parse(body: &Value) -> Result<(GenRequest, Options), ApiError> {
    let f = Fields::of(body)?;
    let model = f.required_string("model")?;
    if model.is_empty() {
        return Err(ApiError::invalid_param("model", "model: must not be empty"));
    }
    let raw = prompt(&f)?;
    if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param("suffix", "suffix: insertion (fill-in-the-middle) is not supported"));
    }
    for name in ["n", "best_of"] {
        if f.integer(name, 1, 128)?.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid_param(name, format!("{name}: only 1 is supported")));
        }
    }
    let penalties = crate::request::penalties(&f)?;
    let max_tokens = f.integer("max_tokens", 1, u64::from(u32::MAX))?.map_or(DEFAULT_MAX_TOKENS, |m| m as u32);
    let temperature = f.number("temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32;
    let top_p = match f.number("top_p", 0.0, 1.0)? {
        Some(0.0) => return Err(ApiError::invalid_param("top_p", "top_p: must be greater than 0")),
        Some(p) => p as f32,
        None => 1.0,
    };
    let top_k = f.integer("top_k", 0, u64::from(u32::MAX))?.unwrap_or(0) as u32;
    let stream = f.boolean("stream")?.unwrap_or(false);
    let include_usage = crate::openai::include_usage(&f, stream)?;
    let echo = f.boolean("echo")?.unwrap_or(false);
    let logprobs = f
        .integer("logprobs", 0, u64::from(zl_wire::message::MAX_TOP_LOGPROBS))?
        .map(|n| LogprobRequest { top: n as u8, prompt: echo });
    let req = GenRequest {
        model: model.to_owned(),
        system: None,
        messages: vec![],
        max_tokens: Some(max_tokens),
        temperature,
        top_p,
        top_k,
        stop: f.stop_list("stop", true)?,
        seed: f.integer("seed", 0, u64::MAX)?,
        stream,
        user: f.string("user")?.filter(|u| !u.is_empty()).map(str::to_owned),
        tools: Default::default(),
        grammar: None,
        raw: Some(raw),
        prefill: None,
        thinking: Default::default(),
        penalties,
        logprobs,
    };
    Ok((req, Options { echo, include_usage }))
}

/// The completions-only options of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Put the prompt in front of the answer.
    pub echo: bool,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
}

/// `POST /v1/completions` as a [`Dialect`].
#[derive(Debug)]
pub struct Completions {
    options: Options,
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
    /// The prompt as the client gave it (for `echo`), once prepared.
    prompt: String,
    /// The model's card, for naming tokens, when log-probabilities are asked for.
    card: Option<Arc<Card>>,
    /// Columns not sent yet (a stream) or all of them (a complete answer).
    columns: Columns,
    /// A stream's echoed prompt still to send (it goes with its log-probabilities, once they are all in).
    echo_pending: bool,
}

impl Completions {
    fn chunk(&self, text: &str, logprobs: Value, finish: Option<&'static str>) -> String {
        let data = json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
        });
        format!("data: {data}\n\n")
    }

    /// The columns gathered so far (going on from their text), or null without log-probabilities.
    fn take_columns(&mut self) -> Value {
        if self.card.is_none() {
            return Value::Null;
        }
        let next = Columns::at(self.columns.offset());
        std::mem::replace(&mut self.columns, next).value()
    }

    /// The echoed prompt's chunk, when it is still to send: first, before any output.
    fn flush_echo(&mut self) -> String {
        if !std::mem::take(&mut self.echo_pending) {
            return String::new();
        }
        let logprobs = self.take_columns();
        let prompt = self.prompt.clone();
        self.chunk(&prompt, logprobs, None)
    }
}

impl Dialect for Completions {
    const API: &'static str = "completions";
    const ERRORS: ErrorFormat = ErrorFormat::OpenAi;

    fn parse(body: &Value) -> Result<(GenRequest, Self), ApiError> {
        let (req, options) = parse(body)?;
        let prompt = match &req.raw {
            Some(RawPrompt::Text(t)) => t.clone(),
            _ => String::new(),
        };
        let writer = Completions {
            options,
            id: String::new(),
            created: 0,
            model: String::new(),
            fingerprint: String::new(),
            prompt,
            card: None,
            columns: Columns::default(),
            echo_pending: false,
        };
        Ok((req, writer))
    }

    fn prepared(&mut self, prepared: &Prepared) {
        let weights = &prepared.card.weights;
        self.fingerprint = format!("zl-{}", &weights[..weights.len().min(12)]);
        if self.prompt.is_empty() {
            // Given as tokens: their text.
            self.prompt.clone_from(&prepared.prompt);
        }
        if prepared.logprobs.is_some() {
            self.card = Some(prepared.card.clone());
            // The prompt's first token has no log-probability (nothing precedes it).
            if let (true, Some(&first)) = (self.options.echo, prepared.tokens.first()) {
                self.columns.first(&prepared.card, first);
                // A stream sends the echoed prompt once its log-probabilities are in, before any output.
                self.echo_pending = true;
            }
        }
    }

    fn routed(&mut self, meta: &Meta) {
        self.id = random_id("cmpl-", 24);
        self.created = unix_now();
        self.model.clone_from(&meta.model);
    }

    fn stream_head(&self) -> String {
        // The echoed prompt goes first; with log-probabilities, once its own are in (`flush_echo`).
        match (self.options.echo, self.card.is_some()) {
            (true, false) => self.chunk(&self.prompt, Value::Null, None),
            _ => String::new(),
        }
    }

    fn render_event(&mut self, event: &GenEvent) -> String {
        match event {
            GenEvent::Logprobs(l) if l.prompt_start.is_some() => {
                self.logprobs(l);
                String::new()
            }
            GenEvent::Logprobs(l) => {
                let out = self.flush_echo();
                self.logprobs(l);
                out
            }
            GenEvent::Delta(d) => {
                let mut out = self.flush_echo();
                let logprobs = self.take_columns();
                out += &self.chunk(d, logprobs, None);
                out
            }
            GenEvent::Finish(f) => {
                let mut out = self.flush_echo();
                let logprobs = self.take_columns();
                out += &self.chunk("", logprobs, Some(finish_reason(f.stop_reason, false)));
                if self.options.include_usage {
                    let data = json!({
                        "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                        "system_fingerprint": self.fingerprint, "choices": [], "usage": usage(f),
                    });
                    out += &format!("data: {data}\n\n");
                }
                out + DONE
            }
        }
    }

    fn render_error(error: &ApiError) -> String {
        stream_error(error)
    }

    fn logprobs(&mut self, logprobs: &Logprobs) {
        if let Some(card) = &self.card
            && (logprobs.prompt_start.is_none() || self.options.echo)
        {
            self.columns.add(card, logprobs);
        }
    }

    fn final_body(&mut self, text: &str, finish: &FinishInfo) -> Value {
        let text = if self.options.echo { format!("{}{text}", self.prompt) } else { text.to_owned() };
        let logprobs = self.take_columns();
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{
                "text": text,
                "index": 0,
                "logprobs": logprobs,
                "finish_reason": finish_reason(finish.stop_reason, false),
            }],
            "usage": usage(finish),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn with(extra: Value) -> Result<(GenRequest, Options), ApiError> {
        let mut body = json!({"model": "m", "prompt": "Once upon a time"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        parse(&body)
    }

    #[test]
    fn prompts_in_every_accepted_shape() {
        let (r, o) = with(json!({})).unwrap();
        assert_eq!(r.raw, Some(RawPrompt::Text("Once upon a time".into())));
        assert_eq!((r.max_tokens, r.logprobs, o), (Some(16), None, Options::default()));
        assert_eq!(with(json!({"prompt": ["x"]})).unwrap().0.raw, Some(RawPrompt::Text("x".into())));
        assert_eq!(with(json!({"prompt": [1, 2]})).unwrap().0.raw, Some(RawPrompt::Tokens(vec![1, 2])));
        assert_eq!(with(json!({"prompt": [[3]]})).unwrap().0.raw, Some(RawPrompt::Tokens(vec![3])));
        let (r, o) =
            with(json!({"logprobs": 5, "echo": true, "stream": true, "stream_options": {"include_usage": true}}))
                .unwrap();
        assert_eq!(r.logprobs, Some(LogprobRequest { top: 5, prompt: true }));
        assert_eq!(o, Options { echo: true, include_usage: true });
        assert_eq!(with(json!({"logprobs": 0})).unwrap().0.logprobs, Some(LogprobRequest { top: 0, prompt: false }));
    }

    #[test]
    fn penalties_and_biases_are_read_as_openai_defines_them() {
        let (r, _) = with(json!({"frequency_penalty": 0.5, "presence_penalty": -1, "logit_bias": {"50": -100, "7": 3.5}, "min_p": 0.1})).unwrap();
        let p = r.penalties.unwrap();
        assert_eq!((p.frequency, p.presence, p.min_p), (0.5, -1.0, 0.1));
        assert_eq!(p.logit_bias, vec![(7, 3.5), (50, -100.0)]);
        assert_eq!(with(json!({"frequency_penalty": 0, "logit_bias": {}})).unwrap().0.penalties, None);
    }

    #[test]
    fn what_it_cannot_honour_is_refused_by_name() {
        let param = |extra: Value| with(extra).unwrap_err().param.unwrap();
        assert_eq!(param(json!({"suffix": "end"})), "suffix");
        assert_eq!(param(json!({"n": 2})), "n");
        assert_eq!(param(json!({"best_of": 3})), "best_of");
        assert_eq!(param(json!({"frequency_penalty": 2.5})), "frequency_penalty");
        assert_eq!(param(json!({"repetition_penalty": 1.1})), "repetition_penalty");
        assert_eq!(param(json!({"logit_bias": {"x": -100}})), "logit_bias");
        assert_eq!(param(json!({"logit_bias": {"5": -101}})), "logit_bias");
        assert_eq!(param(json!({"min_p": 1.5})), "min_p");
        assert_eq!(param(json!({"logprobs": 21})), "logprobs");
        assert_eq!(param(json!({"prompt": ["a", "b"]})), "prompt");
        assert_eq!(param(json!({"prompt": ""})), "prompt");
        assert_eq!(param(json!({"prompt": [-1]})), "prompt");
        assert_eq!(param(json!({"prompt": [1.5]})), "prompt");
        // Neutral values are what the server does anyway.
        assert!(
            with(json!({"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}, "n": 1, "suffix": ""}))
                .is_ok()
        );
    }
}
