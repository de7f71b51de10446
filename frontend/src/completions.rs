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
use crate::openai::{Head, MAX_CHOICES, finish_reason, stream_error, usage};
use crate::request::Fields;

/// OpenAI's default output limit for completions.
const DEFAULT_MAX_TOKENS: u32 = 16;

/// The prompts of a completions request: one string or one token array, or a list of either (each its own
/// choices, in order).
fn prompts(f: &Fields<'_>) -> Result<Vec<RawPrompt>, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("prompt", format!("prompt: {m}"));
    let tokens = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("a token array holds non-negative integer token ids"))
    };
    let shape = || bad("expected a string, a list of strings, or token arrays");
    let all = match f.get("prompt") {
        None => return Err(bad("Field required")),
        Some(Value::String(s)) => vec![RawPrompt::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad("must not be empty")),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => vec![RawPrompt::Tokens(tokens(items)?)],
        Some(Value::Array(items)) if items.len() > MAX_CHOICES as usize => {
            return Err(bad(&format!("at most {MAX_CHOICES} prompts in one request, got {}", items.len())));
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(RawPrompt::Text(s.clone())),
                Value::Array(t) => Ok(RawPrompt::Tokens(tokens(t)?)),
                _ => Err(shape()),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(shape()),
    };
    for (i, one) in all.iter().enumerate() {
        let empty = match one {
            RawPrompt::Text(t) => t.is_empty(),
            RawPrompt::Tokens(t) => t.is_empty(),
        };
        if empty {
            return Err(match all.len() {
                1 => bad("must not be empty"),
                _ => bad(&format!("prompt {i} must not be empty")),
            });
        }
    }
    Ok(all)
}

/// Parse a `POST /v1/completions` body: one request per prompt (in order), and the options they share.
pub fn parse(body: &Value) -> Result<(Vec<GenRequest>, Options), ApiError> {
    let f = Fields::of(body)?;
    let model = f.required_string("model")?;
    if model.is_empty() {
        return Err(ApiError::invalid_param("model", "model: must not be empty"));
    }
    let raws = prompts(&f)?;
    if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param("suffix", "suffix: insertion (fill-in-the-middle) is not supported"));
    }
    let n = f.integer("n", 1, u64::from(MAX_CHOICES))?.unwrap_or(1) as u32;
    if raws.len() as u64 * u64::from(n) > u64::from(MAX_CHOICES) {
        return Err(ApiError::invalid_param(
            "n",
            format!("n: {} prompts times n={n} is more than {MAX_CHOICES} choices in one request", raws.len()),
        ));
    }
    // Choosing the best of several by their log-probability is not done here: each choice is returned.
    if f.integer("best_of", 1, u64::from(MAX_CHOICES))?.is_some_and(|b| b != u64::from(n)) {
        return Err(ApiError::invalid_param(
            "best_of",
            "best_of: picking the best of more answers than are returned is not supported (ask for n answers)",
        ));
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
        raw: None,
        prefill: None,
        thinking: Default::default(),
        penalties,
        logprobs,
    };
    let options = Options { echo, include_usage, n };
    Ok((raws.into_iter().map(|raw| GenRequest { raw: Some(raw), ..req.clone() }).collect(), options))
}

/// The completions-only options of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Put the prompt in front of the answer.
    pub echo: bool,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// Answers to make of each prompt (`n`).
    pub n: u32,
}

/// `POST /v1/completions` as a [`Dialect`].
#[derive(Clone, Debug)]
pub struct Completions {
    options: Options,
    head: Head,
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
    /// A request for one prompt, with its writer.
    fn writer(req: GenRequest, options: Options) -> (GenRequest, Self) {
        let prompt = match &req.raw {
            Some(RawPrompt::Text(t)) => t.clone(),
            _ => String::new(),
        };
        let writer = Completions {
            options,
            head: Head::default(),
            prompt,
            card: None,
            columns: Columns::default(),
            echo_pending: false,
        };
        (req, writer)
    }

    fn chunk(&self, text: &str, logprobs: Value, finish: Option<&'static str>) -> String {
        let data = json!({
            "id": self.head.id,
            "object": "text_completion",
            "created": self.head.created,
            "model": self.head.model,
            "system_fingerprint": self.head.fingerprint,
            "choices": [{"text": text, "index": self.head.index, "logprobs": logprobs, "finish_reason": finish}],
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
        let (mut reqs, options) = parse(body)?;
        match (reqs.len(), options.n) {
            (1, 1) => Ok(Completions::writer(reqs.remove(0), options)),
            _ => Err(ApiError::invalid_param("n", "n: this path serves one choice")),
        }
    }

    fn parse_choices(body: &Value) -> Result<Vec<(GenRequest, Vec<Self>)>, ApiError> {
        let (reqs, options) = parse(body)?;
        Ok(reqs
            .into_iter()
            .map(|req| {
                let (req, writer) = Completions::writer(req, options);
                (req, vec![writer; options.n as usize])
            })
            .collect())
    }

    fn as_choice(&mut self, index: u32, first: Option<&Self>) {
        self.head.as_choice(index, first.map(|f| &f.head));
    }

    fn trailer(&self, total: &FinishInfo) -> String {
        self.head.end("text_completion", self.options.include_usage, total)
    }

    fn merge(bodies: Vec<Value>, total: &FinishInfo) -> Value {
        crate::openai::merge_choices(bodies, total)
    }

    fn prepared(&mut self, prepared: &Prepared) {
        let weights = &prepared.card.weights;
        self.head.fingerprint = format!("zl-{}", &weights[..weights.len().min(12)]);
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
        self.head.id = random_id("cmpl-", 24);
        self.head.created = unix_now();
        self.head.model.clone_from(&meta.model);
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
                if self.head.trailer_later {
                    return out;
                }
                out + &self.trailer(f)
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
            "id": self.head.id,
            "object": "text_completion",
            "created": self.head.created,
            "model": self.head.model,
            "system_fingerprint": self.head.fingerprint,
            "choices": [{
                "text": text,
                "index": self.head.index,
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

    fn many(extra: Value) -> Result<(Vec<GenRequest>, Options), ApiError> {
        let mut body = json!({"model": "m", "prompt": "Once upon a time"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        parse(&body)
    }

    fn with(extra: Value) -> Result<(GenRequest, Options), ApiError> {
        many(extra).map(|(mut reqs, o)| (reqs.remove(0), o))
    }

    #[test]
    fn prompts_in_every_accepted_shape() {
        let (r, o) = with(json!({})).unwrap();
        assert_eq!(r.raw, Some(RawPrompt::Text("Once upon a time".into())));
        assert_eq!((r.max_tokens, r.logprobs, o), (Some(16), None, Options { n: 1, ..Options::default() }));
        assert_eq!(with(json!({"prompt": ["x"]})).unwrap().0.raw, Some(RawPrompt::Text("x".into())));
        assert_eq!(with(json!({"prompt": [1, 2]})).unwrap().0.raw, Some(RawPrompt::Tokens(vec![1, 2])));
        assert_eq!(with(json!({"prompt": [[3]]})).unwrap().0.raw, Some(RawPrompt::Tokens(vec![3])));
        let (r, o) =
            with(json!({"logprobs": 5, "echo": true, "stream": true, "stream_options": {"include_usage": true}}))
                .unwrap();
        assert_eq!(r.logprobs, Some(LogprobRequest { top: 5, prompt: true }));
        assert_eq!(o, Options { echo: true, include_usage: true, n: 1 });
        assert_eq!(with(json!({"logprobs": 0})).unwrap().0.logprobs, Some(LogprobRequest { top: 0, prompt: false }));
        // Several prompts are several requests alike but for their prompt, in order; n answers each.
        let (reqs, o) = many(json!({"prompt": ["a", [7, 8]], "n": 3, "best_of": 3, "seed": 4})).unwrap();
        let raws: Vec<_> = reqs.iter().map(|r| r.raw.clone().unwrap()).collect();
        assert_eq!(raws, [RawPrompt::Text("a".into()), RawPrompt::Tokens(vec![7, 8])]);
        assert!(reqs.iter().all(|r| r.seed == Some(4) && r.max_tokens == Some(16)));
        assert_eq!(o.n, 3);
        let prompts = Completions::parse_choices(&json!({"model": "m", "prompt": ["a", "b"], "n": 2})).unwrap();
        assert_eq!(prompts.iter().map(|(_, w)| w.len()).collect::<Vec<_>>(), [2, 2]);
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
        assert_eq!(param(json!({"n": 129})), "n");
        assert_eq!(param(json!({"n": 65, "prompt": ["a", "b"]})), "n");
        assert_eq!(param(json!({"best_of": 3})), "best_of");
        assert_eq!(param(json!({"best_of": 3, "n": 2})), "best_of");
        assert_eq!(param(json!({"frequency_penalty": 2.5})), "frequency_penalty");
        assert_eq!(param(json!({"repetition_penalty": 1.1})), "repetition_penalty");
        assert_eq!(param(json!({"logit_bias": {"x": -100}})), "logit_bias");
        assert_eq!(param(json!({"logit_bias": {"5": -101}})), "logit_bias");
        assert_eq!(param(json!({"min_p": 1.5})), "min_p");
        assert_eq!(param(json!({"logprobs": 21})), "logprobs");
        assert_eq!(param(json!({"prompt": ["a", ""]})), "prompt");
        assert_eq!(param(json!({"prompt": ["a", 5]})), "prompt");
        assert_eq!(param(json!({"prompt": vec!["a"; 129]})), "prompt");
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
