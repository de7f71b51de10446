//! The OpenAI Chat Completions API: request parsing, the `chat.completion` object, streaming
//! `chat.completion.chunk`s ending with `data: [DONE]`, and `stream_options.include_usage`.

use serde_json::{Value, json};
use zl_text::ChatMessage;
use zl_wire::message::StopReason;

use crate::cache::FinishInfo;
use crate::dialect::Dialect;
use crate::error::{ApiError, ErrorFormat};
use std::sync::Arc;

use zl_client::card::Card;

use crate::events::Logprobs;
use crate::gateway::{GenEvent, GenRequest, LogprobRequest, Meta, Prepared, Thinking};
use crate::ids::{random_id, unix_now};
use crate::request::{Fields, PartProblem, round4, text_parts};
use crate::tools::calls::{Splitter, blocks};
use crate::tools::openai::CallDeltas;

/// A parsed request and the OpenAI-only options.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// The common request.
    pub req: GenRequest,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// Answers to make (`n`), each its own choice.
    pub n: u32,
}

fn text_of(value: &Value, field: &str) -> Result<String, ApiError> {
    text_parts(value).map_err(|problem| {
        let message = match problem {
            PartProblem::NoText(i) => format!("{field}[{i}].text: a string is required"),
            PartProblem::Type(i, other) => {
                format!("{field}[{i}]: content parts of type {other:?} are not supported by this server yet")
            }
            PartProblem::NoType(i) => format!("{field}[{i}].type is required"),
            PartProblem::NotTextOrList => format!("{field}: expected a string or an array of content parts"),
        };
        ApiError::invalid_param(field, message)
    })
}

/// Parse a `POST /v1/chat/completions` body.
pub fn parse(body: &Value) -> Result<ChatRequest, ApiError> {
    let f = Fields::of(body)?;
    let model = f.required_string("model")?;
    if model.is_empty() {
        return Err(ApiError::invalid_param("model", "model: must not be empty"));
    }
    let tools = crate::tools::openai::parse(&f)?;
    let n = f.integer("n", 1, u64::from(MAX_CHOICES))?.unwrap_or(1) as u32;
    refuse_unserved(&f)?;
    let logprobs = logprob_request(&f)?;
    let thinking = thinking(&f)?;
    let penalties = crate::request::penalties(&f)?;
    // vLLM's extra sampling field, which this server applies as the Messages API's `top_k`.
    let top_k = f.integer("top_k", 0, u64::from(u32::MAX))?.unwrap_or(0) as u32;
    let messages = match f.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid_param("messages", "messages: at least one message is required"));
        }
        Some(_) => return Err(ApiError::invalid_param("messages", "messages: expected an array")),
        None => return Err(ApiError::invalid_param("messages", "messages: Field required")),
    };
    let mut system: Option<String> = None;
    let mut chat: Vec<ChatMessage> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let field = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid_param(
                "messages",
                format!("{field}.role: required, one of system, developer, user, assistant"),
            )
        })?;
        let calls = match m.get("tool_calls").filter(|c| !c.is_null()) {
            Some(calls) if role == "assistant" => Some(crate::tools::openai::assistant_calls(calls, &field)?),
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("{field}.tool_calls: only assistant messages carry tool calls"),
                ));
            }
            None => None,
        };
        let content = match m.get("content") {
            // Only an assistant turn with tool calls may omit its content.
            None | Some(Value::Null) if calls.is_some() => String::new(),
            None | Some(Value::Null) => {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("{field}.content: a string or an array of content parts is required"),
                ));
            }
            Some(c) => text_of(c, &format!("{field}.content"))?,
        };
        let content = match calls {
            Some(calls) if content.is_empty() => calls,
            Some(calls) => format!("{content}\n{calls}"),
            None => content,
        };
        // A tool's result is read in a user turn.
        let (role, content) = match role {
            "tool" => {
                if m.get("tool_call_id").and_then(Value::as_str).is_none() {
                    return Err(ApiError::invalid_param(
                        "messages",
                        format!("{field}.tool_call_id: required for tool messages"),
                    ));
                }
                ("user", crate::tools::result_text(&content, false))
            }
            other => (other, content),
        };
        match role {
            "system" | "developer" => match &mut system {
                Some(s) => {
                    s.push('\n');
                    s.push_str(&content);
                }
                None => system = Some(content),
            },
            "user" | "assistant" => match chat.last_mut() {
                // Consecutive turns of one role are joined, as chat templates expect alternation.
                Some(last) if last.role == role => {
                    last.content.push('\n');
                    last.content.push_str(&content);
                }
                _ => chat.push(ChatMessage { role: role.to_owned(), content }),
            },
            "function" => {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("{field}.role: \"function\" messages are deprecated; use \"tool\" messages"),
                ));
            }
            other => {
                return Err(ApiError::invalid_param(
                    "messages",
                    format!("{field}.role: {other:?} is not one of system, developer, user, assistant"),
                ));
            }
        }
    }
    if chat.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages: at least one user message is required"));
    }
    // vLLM's extension: continue the final assistant message instead of answering after it.
    let prefill = match f.boolean("continue_final_message")? {
        Some(true) => match chat.last() {
            Some(last) if last.role == "assistant" => chat.pop().map(|m| m.content),
            _ => {
                return Err(ApiError::invalid_param(
                    "continue_final_message",
                    "continue_final_message: the last message must be an assistant message",
                ));
            }
        },
        _ => None,
    };
    let max_tokens = match (
        f.integer("max_completion_tokens", 1, u64::from(u32::MAX))?,
        f.integer("max_tokens", 1, u64::from(u32::MAX))?,
    ) {
        (Some(m), _) | (None, Some(m)) => Some(m as u32),
        (None, None) => None,
    };
    let temperature = f.number("temperature", 0.0, 2.0)?.unwrap_or(1.0) as f32;
    let top_p = match f.number("top_p", 0.0, 1.0)? {
        Some(0.0) => return Err(ApiError::invalid_param("top_p", "top_p: must be greater than 0")),
        Some(p) => p as f32,
        None => 1.0,
    };
    let stop = f.stop_list("stop", true)?;
    let seed = f.integer("seed", 0, u64::MAX)?;
    let stream = f.boolean("stream")?.unwrap_or(false);
    let include_usage = include_usage(&f, stream)?;
    let user = f.string("user")?.filter(|u| !u.is_empty()).map(str::to_owned);
    Ok(ChatRequest {
        req: GenRequest {
            model: model.to_owned(),
            system,
            messages: chat,
            max_tokens,
            temperature,
            top_p,
            top_k,
            stop,
            seed,
            stream,
            user,
            grammar: tools.grammar(if tools.active() { "tools" } else { "response_format" })?,
            tools,
            raw: None,
            prefill,
            thinking,
            penalties,
            logprobs,
        },
        include_usage,
        n,
    })
}

/// Chat Completions fields that would change the answer and are not served: refused by name rather than ignored
/// (`e2e/sdk/conformance.py` walks the SDK's request type to keep this list whole).
fn refuse_unserved(f: &Fields<'_>) -> Result<(), ApiError> {
    let refuse = |name: &str, why: &str| Err(ApiError::invalid_param(name, format!("{name}: {why}")));
    for name in ["audio", "web_search_options", "moderation"] {
        if f.get(name).is_some() {
            return refuse(name, "not supported by this server");
        }
    }
    match f.get("modalities") {
        None => {}
        Some(Value::Array(m)) if m.iter().all(|v| v.as_str() == Some("text")) => {}
        Some(_) => return refuse("modalities", "only [\"text\"] is supported by this server"),
    }
    match f.string("verbosity")? {
        None | Some("medium") => Ok(()),
        Some(_) => refuse("verbosity", "only \"medium\" (the default) is supported by this server"),
    }
}

/// `stream_options.include_usage` (only with `stream`).
pub(crate) fn include_usage(f: &Fields<'_>, stream: bool) -> Result<bool, ApiError> {
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "stream_options",
                    "stream_options.include_usage: expected a boolean",
                ));
            }
        },
        Some(_) => return Err(ApiError::invalid_param("stream_options", "stream_options: expected an object")),
    };
    if include_usage && !stream {
        return Err(ApiError::invalid_param("stream_options", "stream_options: only allowed when stream is true"));
    }
    Ok(include_usage)
}

/// Thinking budgets of `reasoning_effort` levels, in output tokens.
const EFFORT_BUDGETS: [(&str, u32); 3] = [("low", 512), ("medium", 2048), ("high", 8192)];

/// A reasoning model's thinking section: `reasoning_effort` (`none`/`minimal` switch it off; `low`, `medium` and
/// `high` bound it to [`EFFORT_BUDGETS`]) or vLLM's `chat_template_kwargs.enable_thinking`; without either, as
/// the model's template has it.
fn thinking(f: &Fields<'_>) -> Result<Thinking, ApiError> {
    let from_kwargs = match f.get("chat_template_kwargs") {
        None => None,
        Some(Value::Object(kw)) => {
            if let Some((k, _)) = kw.iter().find(|(k, v)| k.as_str() != "enable_thinking" && !v.is_null()) {
                return Err(ApiError::invalid_param(
                    "chat_template_kwargs",
                    format!("chat_template_kwargs.{k}: not supported by this server (only enable_thinking is)"),
                ));
            }
            match kw.get("enable_thinking") {
                None | Some(Value::Null) => None,
                Some(Value::Bool(true)) => Some(Thinking::Enabled(None)),
                Some(Value::Bool(false)) => Some(Thinking::Disabled),
                Some(_) => {
                    return Err(ApiError::invalid_param(
                        "chat_template_kwargs",
                        "chat_template_kwargs.enable_thinking: Input should be a valid boolean",
                    ));
                }
            }
        }
        Some(_) => {
            return Err(ApiError::invalid_param("chat_template_kwargs", "chat_template_kwargs: expected an object"));
        }
    };
    let from_effort = match f.string("reasoning_effort")? {
        None => None,
        Some("none" | "minimal") => Some(Thinking::Disabled),
        Some(level) => match EFFORT_BUDGETS.iter().find(|(name, _)| *name == level) {
            Some((_, budget)) => Some(Thinking::Enabled(Some(*budget))),
            None => {
                return Err(ApiError::invalid_param(
                    "reasoning_effort",
                    format!(
                        "reasoning_effort: Input should be 'none', 'minimal', 'low', 'medium' or 'high', got {level:?}"
                    ),
                ));
            }
        },
    };
    Ok(from_effort.or(from_kwargs).unwrap_or_default())
}

/// Chat Completions' `logprobs` (a boolean) and `top_logprobs` (0 to 20, with `logprobs` only).
fn logprob_request(f: &Fields<'_>) -> Result<Option<LogprobRequest>, ApiError> {
    let top = f.integer("top_logprobs", 0, u64::from(zl_wire::message::MAX_TOP_LOGPROBS))?;
    match f.boolean("logprobs")? {
        Some(true) => Ok(Some(LogprobRequest { top: top.unwrap_or(0) as u8, prompt: false })),
        _ if top.is_some_and(|t| t > 0) => {
            Err(ApiError::invalid_param("top_logprobs", "top_logprobs: only allowed when logprobs is true"))
        }
        _ => Ok(None),
    }
}

/// OpenAI's `finish_reason`; an answer that ended on its own after calling tools finished for `tool_calls`.
pub fn finish_reason(r: StopReason, called: bool) -> &'static str {
    match r {
        StopReason::EndTurn if called => "tool_calls",
        StopReason::EndTurn | StopReason::StopSequence => "stop",
        StopReason::MaxTokens => "length",
    }
}

pub(crate) fn usage(f: &FinishInfo) -> Value {
    json!({
        "prompt_tokens": f.input_tokens,
        "completion_tokens": f.output_tokens,
        "total_tokens": f.input_tokens + f.output_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_input_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": f.accepted_draft_tokens,
            "rejected_prediction_tokens": f.draft_tokens - f.accepted_draft_tokens.min(f.draft_tokens),
        },
        "billing_unit": round4(f.billing_unit),
        "predicted_draft_tokens": f.draft_tokens,
        "predicted_accepted_tokens": f.accepted_draft_tokens,
    })
}

/// The most choices one request may ask for (`n` times the prompts of a completions request), as OpenAI's `n`.
pub const MAX_CHOICES: u32 = 128;

/// What every object of one response repeats, and which of its choices a writer writes.
#[derive(Clone, Debug, Default)]
pub struct Head {
    /// The response's id.
    pub id: String,
    /// When it was made (Unix seconds).
    pub created: u64,
    /// The concrete model.
    pub model: String,
    /// `system_fingerprint`: the weights' build.
    pub fingerprint: String,
    /// Which choice this writer writes.
    pub index: u32,
    /// One of several choices: the stream's end (usage, `[DONE]`) is the fan-out's.
    pub trailer_later: bool,
}

impl Head {
    /// Choice `index` of a response with several, under `first`'s id and time (`None`: this is the first).
    pub fn as_choice(&mut self, index: u32, first: Option<&Head>) {
        self.index = index;
        if let Some(first) = first {
            self.id.clone_from(&first.id);
            self.created = first.created;
        }
        self.trailer_later = true;
    }

    /// The end of a stream of `object`s: the usage chunk when asked for, then `[DONE]`.
    pub fn end(&self, object: &str, include_usage: bool, usage_of: &FinishInfo) -> String {
        let chunk = include_usage.then(|| {
            let data = json!({
                "id": self.id, "object": object, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": [], "usage": usage(usage_of),
            });
            format!("data: {data}\n\n")
        });
        chunk.unwrap_or_default() + DONE
    }
}

/// The non-streaming `chat.completion` of a response with `head`'s id, time, model and fingerprint.
pub fn completion(head: &Head, message: Value, logprobs: Value, called: bool, f: &FinishInfo) -> Value {
    json!({
        "id": head.id,
        "object": "chat.completion",
        "created": head.created,
        "model": head.model,
        "system_fingerprint": head.fingerprint,
        "choices": [{
            "index": head.index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason(f.stop_reason, called),
        }],
        "usage": usage(f),
    })
}

/// One body of several choices' complete bodies (each holding its one choice, in index order): the first's fields,
/// every choice, and the usage totalled.
pub(crate) fn merge_choices(bodies: Vec<Value>, total: &FinishInfo) -> Value {
    let mut bodies = bodies.into_iter();
    let Some(mut merged) = bodies.next() else { return Value::Null };
    let rest: Vec<Value> = bodies
        .flat_map(|mut b| match b.get_mut("choices").map(Value::take) {
            Some(Value::Array(choices)) => choices,
            _ => vec![],
        })
        .collect();
    if let Some(Value::Array(choices)) = merged.get_mut("choices") {
        choices.extend(rest);
    }
    merged["usage"] = usage(total);
    merged
}

/// The end of a stream.
pub const DONE: &str = "data: [DONE]\n\n";

/// An error after the stream began (what OpenAI sends then).
pub fn stream_error(e: &ApiError) -> String {
    format!("data: {}\n\n", e.body(ErrorFormat::OpenAi, ""))
}

/// `POST /v1/chat/completions` as a [`Dialect`]: one `chat.completion`, or its chunks ending with `[DONE]`.
#[derive(Clone, Debug)]
pub struct ChatCompletions {
    include_usage: bool,
    /// Answers asked for (`n`).
    n: u32,
    /// Which choice this writer writes.
    head: Head,
    /// The answer split into text and tool calls (when tools are offered).
    splitter: Splitter,
    deltas: CallDeltas,
    /// The model's card, for naming tokens, when log-probabilities are asked for.
    card: Option<Arc<Card>>,
    /// Output tokens' `logprobs.content` entries not sent yet (a stream) or all of them (a complete answer).
    entries: Vec<Value>,
    /// A reasoning model's thinking section, split off as `reasoning_content`.
    think: Option<crate::thinking::Splitter>,
}

impl ChatCompletions {
    /// A chunk; the log-probabilities waiting go with it (with the first chunk that has any content).
    fn chunk(&mut self, delta: Value, finish: Option<&'static str>) -> String {
        let logprobs = match &self.card {
            Some(_) => crate::logprobs::chat_object(std::mem::take(&mut self.entries)),
            None => Value::Null,
        };
        self.event(delta, logprobs, finish)
    }

    /// One `chat.completion.chunk` of this writer's choice as a server-sent event.
    fn event(&self, delta: Value, logprobs: Value, finish: Option<&'static str>) -> String {
        let data = json!({
            "id": self.head.id,
            "object": "chat.completion.chunk",
            "created": self.head.created,
            "model": self.head.model,
            "system_fingerprint": self.head.fingerprint,
            "choices": [{"index": self.head.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        });
        format!("data: {data}\n\n")
    }
}

impl Dialect for ChatCompletions {
    const API: &'static str = "chat_completions";
    const ERRORS: ErrorFormat = ErrorFormat::OpenAi;

    fn parse(body: &Value) -> Result<(GenRequest, Self), ApiError> {
        let ChatRequest { req, include_usage, n } = parse(body)?;
        let names = req.tools.tools.iter().map(|t| t.name.clone()).collect();
        let writer = ChatCompletions {
            include_usage,
            n,
            head: Head::default(),
            splitter: Splitter::new(req.tools.call_parse(), names),
            deltas: CallDeltas::default(),
            card: None,
            entries: Vec::new(),
            think: None,
        };
        Ok((req, writer))
    }

    fn prepared(&mut self, prepared: &Prepared) {
        // The weights' hash names the exact model build, which is what `system_fingerprint` promises.
        let weights = &prepared.card.weights;
        self.head.fingerprint = format!("zl-{}", &weights[..weights.len().min(12)]);
        if prepared.logprobs.is_some() {
            self.card = Some(prepared.card.clone());
        }
        self.think = prepared.thinking.map(crate::thinking::Splitter::new);
    }

    fn routed(&mut self, meta: &Meta) {
        self.head.id = random_id("chatcmpl-", 24);
        self.head.created = unix_now();
        self.head.model.clone_from(&meta.model);
    }

    fn stream_head(&self) -> String {
        let logprobs = if self.card.is_some() { crate::logprobs::chat_object(vec![]) } else { Value::Null };
        let delta = json!({"role": "assistant", "content": ""});
        self.event(delta, logprobs, None)
    }

    fn render_event(&mut self, event: &GenEvent) -> String {
        match event {
            GenEvent::Logprobs(l) => {
                self.logprobs(l);
                String::new()
            }
            GenEvent::Delta(d) => {
                let pieces = crate::thinking::pieces(self.think.as_mut(), &mut self.splitter, d);
                self.deltas.deltas(pieces).into_iter().map(|delta| self.chunk(delta, None)).collect()
            }
            GenEvent::Finish(f) => {
                let pieces = crate::thinking::finish(self.think.as_mut(), &mut self.splitter);
                let mut out: String =
                    self.deltas.deltas(pieces).into_iter().map(|delta| self.chunk(delta, None)).collect();
                out += &self.chunk(json!({}), Some(finish_reason(f.stop_reason, self.splitter.calls > 0)));
                crate::tools::count_calls(Self::API, self.splitter.calls);
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
        if let Some(card) = &self.card {
            self.entries.extend(crate::logprobs::chat_content(card, logprobs));
        }
    }

    fn final_body(&mut self, text: &str, finish: &FinishInfo) -> Value {
        let mut pieces = crate::thinking::pieces(self.think.as_mut(), &mut self.splitter, text);
        pieces.extend(crate::thinking::finish(self.think.as_mut(), &mut self.splitter));
        let message = crate::tools::openai::message(&blocks(pieces));
        let called = self.splitter.calls > 0;
        crate::tools::count_calls(Self::API, self.splitter.calls);
        let logprobs = match &self.card {
            Some(_) => crate::logprobs::chat_object(std::mem::take(&mut self.entries)),
            None => Value::Null,
        };
        completion(&self.head, message, logprobs, called, finish)
    }

    fn parse_choices(body: &Value) -> Result<Vec<(GenRequest, Vec<Self>)>, ApiError> {
        let (req, writer) = Self::parse(body)?;
        let n = writer.n as usize;
        Ok(vec![(req, vec![writer; n])])
    }

    fn as_choice(&mut self, index: u32, first: Option<&Self>) {
        self.head.as_choice(index, first.map(|f| &f.head));
    }

    fn trailer(&self, total: &FinishInfo) -> String {
        self.head.end("chat.completion.chunk", self.include_usage, total)
    }

    fn merge(bodies: Vec<Value>, total: &FinishInfo) -> Value {
        merge_choices(bodies, total)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_roles_parts_and_options() {
        let r = parse(&json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "developer", "content": [{"type": "text", "text": "dev"}]},
                {"role": "user", "content": "hi"}
            ],
            "max_completion_tokens": 9, "seed": 42, "stop": "END", "stream": true,
            "stream_options": {"include_usage": true}, "n": 1
        }))
        .unwrap();
        assert_eq!(r.req.system.as_deref(), Some("sys\ndev"));
        assert_eq!(r.req.messages.len(), 1);
        assert_eq!((r.req.max_tokens, r.req.seed, r.include_usage), (Some(9), Some(42), true));
        assert_eq!(r.req.stop, vec!["END".to_owned()]);
    }

    #[test]
    fn refuses_precisely() {
        let m = |extra: Value| {
            let mut base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                base[k] = v.clone();
            }
            parse(&base).unwrap_err()
        };
        assert_eq!(m(json!({"n": 129})).param.as_deref(), Some("n"));
        assert_eq!(m(json!({"n": 0})).param.as_deref(), Some("n"));
        assert_eq!(m(json!({"temperature": 3})).message, "temperature: Input should be between 0 and 2, got 3");
        assert_eq!(m(json!({"messages": []})).message, "messages: at least one message is required");
        assert!(m(json!({"stream_options": {"include_usage": true}})).message.contains("only allowed when stream"));
        assert!(m(json!({"messages": [{"role": "wizard", "content": "x"}]})).message.contains("not one of"));
    }

    #[test]
    fn seeds_and_content_are_checked_like_the_messages_api() {
        let with = |extra: &str| {
            parse(
                &serde_json::from_str(&format!(
                    r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]{extra}}}"#
                ))
                .unwrap(),
            )
        };
        assert!(with(r#", "seed": -1"#).unwrap_err().message.contains("greater than or equal to 0, got -1"));
        assert_eq!(
            with(r#", "seed": 18446744073709551616"#).unwrap_err().message,
            "seed: Input should be between 0 and 18446744073709551615, got 18446744073709551616"
        );
        assert_eq!(with(r#", "seed": 3"#).unwrap().req.seed, Some(3));
        let null = parse(&json!({"model": "m", "messages": [{"role": "user", "content": null}]})).unwrap_err();
        assert_eq!(null.message, "messages[0].content: a string or an array of content parts is required");
        assert_eq!(null.param.as_deref(), Some("messages"));
    }

    #[test]
    fn chunks_are_byte_exact() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let (_, mut w) = ChatCompletions::parse(&body).unwrap();
        (w.head.id, w.head.created, w.head.model, w.head.fingerprint) = ("c1".into(), 5, "m".into(), "fp".into());
        assert_eq!(
            w.event(json!({"content": "Hi"}), Value::Null, None),
            "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":5,\"model\":\"m\",\"system_fingerprint\":\"fp\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        );
        // Choice 2 of several: its index, and its end left to the fan-out's trailer (usage totalled, [DONE]).
        let first = w.clone();
        let mut third = w.clone();
        third.as_choice(2, Some(&first));
        assert!(third.event(json!({}), Value::Null, None).contains("\"index\":2"));
        let f = FinishInfo {
            stop_reason: StopReason::MaxTokens,
            stop_sequence: None,
            input_tokens: 3,
            output_tokens: 2,
            cached_input_tokens: 0,
            billing_unit: 0.5,
            draft_tokens: 0,
            accepted_draft_tokens: 0,
            migrated_to: vec![],
        };
        let end = third.render_event(&GenEvent::Finish(f.clone()));
        assert!(end.contains("\"finish_reason\":\"length\"") && !end.contains("[DONE]"), "{end}");
        assert_eq!(third.trailer(&f), DONE);
    }
}
