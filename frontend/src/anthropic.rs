//! The Anthropic Messages API: request parsing with Anthropic's validation rules, the `message` object, and the
//! streaming event sequence (`message_start`, `content_block_start`, `ping`, `content_block_delta`...,
//! `content_block_stop`, `message_delta`, `message_stop`; `error` if the stream fails after the 200).

use serde_json::{Value, json};
use zl_text::ChatMessage;
use zl_wire::message::StopReason;

use crate::cache::FinishInfo;
use crate::dialect::Dialect;
use crate::error::{ApiError, ErrorFormat};
use crate::gateway::{GenEvent, GenRequest, Meta, Prepared, Thinking};
use crate::ids::random_id;
use crate::request::{Fields, PartProblem, round4, text_parts};
use crate::tools::CallParse;
use crate::tools::anthropic::BlockStream;
use crate::tools::calls::{Splitter, blocks};

/// Text of a `content` field: a string, or an array of text blocks (anything else is refused by name).
fn content_text(value: &Value, field: &str) -> Result<String, ApiError> {
    text_parts(value).map_err(|problem| {
        ApiError::invalid(match problem {
            PartProblem::NoText(i) => format!("{field}.{i}.text: Field required"),
            PartProblem::NoType(i) | PartProblem::Type(i, "") => format!("{field}.{i}.type: Field required"),
            PartProblem::Type(i, ty @ ("image" | "document" | "thinking" | "redacted_thinking")) => {
                format!("{field}.{i}: content blocks of type \"{ty}\" are not supported by this server yet; send text")
            }
            PartProblem::Type(i, other) => format!("{field}.{i}.type: unknown content block type {other:?}"),
            PartProblem::NotTextOrList => {
                format!("{field}: Input should be a valid string or list of content blocks")
            }
        })
    })
}

/// Parse a `POST /v1/messages` (or, with `count_only`, a `count_tokens`) body.
pub fn parse(body: &Value, count_only: bool) -> Result<GenRequest, ApiError> {
    let f = Fields::of(body)?;
    let model = f.required_string("model")?;
    if model.is_empty() {
        return Err(ApiError::invalid_param("model", "model: String should have at least 1 character"));
    }
    if f.get("inference_geo").is_some() {
        return Err(ApiError::invalid_param(
            "inference_geo",
            "inference_geo: not supported by this server; a key's regions and the x-zl-region header decide where \
             a request runs (docs/regions.md)",
        ));
    }
    for unsupported in ["mcp_servers", "container"] {
        if f.get(unsupported).is_some_and(|v| !v.as_array().is_some_and(Vec::is_empty)) {
            return Err(ApiError::invalid_param(
                unsupported,
                format!("{unsupported}: MCP servers and containers are not supported by this server"),
            ));
        }
    }
    let tools = crate::tools::anthropic::parse(&f)?;
    let messages = match f.get("messages") {
        None => return Err(ApiError::invalid_param("messages", "messages: Field required")),
        Some(Value::Array(m)) => m,
        Some(_) => return Err(ApiError::invalid_param("messages", "messages: Input should be a valid list")),
    };
    if messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "messages: at least one message is required"));
    }
    let mut chat = Vec::with_capacity(messages.len());
    // The previous assistant turn's tool calls, which the next user turn's results answer.
    let mut called: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = match m.get("role") {
            Some(Value::String(r)) if r == "user" || r == "assistant" => r.clone(),
            Some(Value::String(r)) => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.role: Input should be 'user' or 'assistant', got {r:?} (put system prompts in the top-level system field)"
                )));
            }
            _ => return Err(ApiError::invalid(format!("messages.{i}.role: Field required"))),
        };
        let content =
            m.get("content").ok_or_else(|| ApiError::invalid(format!("messages.{i}.content: Field required")))?;
        // As the hosted API: empty turns are refused, but a final assistant turn may be empty (a prefill of
        // nothing); an empty text block is refused anywhere.
        let (text, calls) =
            crate::tools::anthropic::flatten(content, &format!("messages.{i}.content"), &role, &called)?;
        called = calls;
        if text.is_empty() && !(role == "assistant" && i + 1 == messages.len()) {
            return Err(ApiError::invalid(format!(
                "messages.{i}: all messages must have non-empty content except for the optional final assistant message"
            )));
        }
        if i == 0 && role != "user" {
            return Err(ApiError::invalid("messages: the first message must use the \"user\" role"));
        }
        if let Some(prev) = chat.last().map(|c: &ChatMessage| c.role.clone())
            && prev == role
        {
            return Err(ApiError::invalid(format!(
                "messages: roles must alternate between \"user\" and \"assistant\", but messages.{} and messages.{i} are both \"{role}\"",
                i - 1
            )));
        }
        chat.push(ChatMessage { role, content: text });
    }
    let system = match f.get("system") {
        None => None,
        Some(v) => Some(content_text(v, "system")?),
    };
    let max_tokens = match f.integer("max_tokens", 1, u64::from(u32::MAX))? {
        Some(m) => Some(m as u32),
        None if count_only => None,
        None => {
            if f.get("max_tokens").is_none() {
                return Err(ApiError::invalid_param("max_tokens", "max_tokens: Field required"));
            }
            None
        }
    };
    let temperature = f.number("temperature", 0.0, 1.0)?.unwrap_or(1.0) as f32;
    let top_p = match f.number("top_p", 0.0, 1.0)? {
        Some(0.0) => return Err(ApiError::invalid_param("top_p", "top_p: Input should be greater than 0")),
        Some(p) => p as f32,
        None => 1.0,
    };
    let top_k = f.integer("top_k", 0, u64::from(u32::MAX))?.unwrap_or(0) as u32;
    let stop = f.stop_list("stop_sequences", false)?;
    let stream = f.boolean("stream")?.unwrap_or(false);
    // zerolayer extension: a sampling seed (the official SDK sends it with `extra_body={"seed": N}`).
    let seed = f.integer("seed", 0, u64::MAX)?;
    let user = match f.get("metadata") {
        None => None,
        Some(Value::Object(meta)) => match meta.get("user_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(u)) if u.len() <= 256 => Some(u.clone()).filter(|u| !u.is_empty()),
            Some(Value::String(_)) => {
                return Err(ApiError::invalid_param("metadata", "metadata.user_id: at most 256 characters"));
            }
            Some(_) => {
                return Err(ApiError::invalid_param("metadata", "metadata.user_id: Input should be a valid string"));
            }
        },
        Some(_) => return Err(ApiError::invalid_param("metadata", "metadata: Input should be a valid dictionary")),
    };
    // A final assistant turn is the start of the answer: the model continues it (the answer holds only what
    // follows it).
    let prefill = match chat.last() {
        Some(last) if last.role == "assistant" => chat.pop().map(|m| m.content).filter(|c| !c.is_empty()),
        _ => None,
    };
    let grammar = tools.grammar("tools")?;
    let thinking = thinking(&f, max_tokens)?;
    Ok(GenRequest {
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
        grammar,
        tools,
        raw: None,
        prefill,
        thinking,
        penalties: None,
        logprobs: None,
    })
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` (N below `max_tokens`), `{"type": "adaptive"}` (no
/// budget) or `{"type": "disabled"}`; without it, as `disabled` (the hosted API's default).
fn thinking(f: &Fields<'_>, max_tokens: Option<u32>) -> Result<Thinking, ApiError> {
    let Some(t) = f.get("thinking") else { return Ok(Thinking::Disabled) };
    let bad = |m: String| Err(ApiError::invalid_param("thinking", m));
    match t.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok(Thinking::Disabled),
        Some("adaptive") => Ok(Thinking::Enabled(None)),
        Some("enabled") => match t.get("budget_tokens").and_then(Value::as_u64) {
            Some(b) if b >= 1 && max_tokens.is_none_or(|m| b < u64::from(m)) => Ok(Thinking::Enabled(Some(b as u32))),
            Some(b) => bad(format!("thinking.budget_tokens: must be at least 1 and less than max_tokens, got {b}")),
            None => bad("thinking.budget_tokens: Field required (an integer)".into()),
        },
        Some(other) => {
            bad(format!("thinking.type: Input should be 'enabled', 'adaptive' or 'disabled', got {other:?}"))
        }
        None => bad("thinking.type: Field required".into()),
    }
}

/// Anthropic's `stop_reason`; an answer that ended on its own after calling tools stopped for `tool_use`.
pub fn stop_reason(r: StopReason, called: bool) -> &'static str {
    match r {
        StopReason::EndTurn if called => "tool_use",
        StopReason::EndTurn => "end_turn",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopSequence => "stop_sequence",
    }
}

fn usage(f: &FinishInfo) -> Value {
    json!({
        "input_tokens": f.input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": f.cached_input_tokens,
        "output_tokens": f.output_tokens,
        "billing_unit": round4(f.billing_unit),
        "predicted_draft_tokens": f.draft_tokens,
        "predicted_accepted_tokens": f.accepted_draft_tokens,
    })
}

/// The non-streaming `message` object.
pub fn message(id: &str, model: &str, content: Vec<Value>, called: bool, f: &FinishInfo) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(f.stop_reason, called),
        "stop_sequence": f.stop_sequence,
        "usage": usage(f),
    })
}

/// One server-sent event.
pub fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// The events before the first text: `message_start`, `content_block_start` (unless blocks open as they come:
/// answers with tools), `ping`.
pub fn stream_start(id: &str, model: &str, input_tokens: u32, text_block: bool) -> String {
    let start = json!({
        "type": "message_start",
        "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0},
        },
    });
    let mut out = event("message_start", &start);
    if text_block {
        out += &event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        );
    }
    out += &event("ping", &json!({"type": "ping"}));
    out
}

/// One `content_block_delta`.
pub fn stream_delta(text: &str) -> String {
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
    )
}

/// The closing events: `content_block_stop`, `message_delta` (stop reason, cumulative usage), `message_stop`.
pub fn stream_end(f: &FinishInfo) -> String {
    event("content_block_stop", &json!({"type": "content_block_stop", "index": 0})) + &stream_close(f, false)
}

/// `message_delta` and `message_stop`.
fn stream_close(f: &FinishInfo, called: bool) -> String {
    let mut out = event(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(f.stop_reason, called), "stop_sequence": f.stop_sequence},
            "usage": usage(f),
        }),
    );
    out += &event("message_stop", &json!({"type": "message_stop"}));
    out
}

/// The `error` event for a stream that fails after the 200.
pub fn stream_error(e: &ApiError) -> String {
    event("error", &json!({"type": "error", "error": {"type": e.kind.anthropic_type(), "message": e.message}}))
}

/// `POST /v1/messages` as a [`Dialect`]: one `message` object, or the event sequence.
#[derive(Debug)]
pub struct Messages {
    id: String,
    model: String,
    input_tokens: u32,
    /// The answer split into text and tool calls (when tools are offered).
    splitter: Splitter,
    blocks: BlockStream,
    /// A reasoning model's thinking section, split off as `thinking` blocks.
    think: Option<crate::thinking::Splitter>,
}

impl Messages {
    fn new(req: &GenRequest) -> Messages {
        let names = req.tools.tools.iter().map(|t| t.name.clone()).collect();
        Messages {
            id: String::new(),
            model: String::new(),
            input_tokens: 0,
            splitter: Splitter::new(req.tools.call_parse(), names),
            blocks: BlockStream::default(),
            think: None,
        }
    }

    /// Whether the answer is plain text (its one text block opens with the stream).
    fn plain(&self) -> bool {
        self.splitter.parse() == CallParse::Off && self.think.is_none()
    }
}

impl Dialect for Messages {
    const API: &'static str = "messages";
    const ERRORS: ErrorFormat = ErrorFormat::Anthropic;

    fn parse(body: &Value) -> Result<(GenRequest, Self), ApiError> {
        let req = parse(body, false)?;
        let writer = Messages::new(&req);
        Ok((req, writer))
    }

    fn prepared(&mut self, prepared: &Prepared) {
        self.think = prepared.thinking.map(crate::thinking::Splitter::new);
    }

    fn routed(&mut self, meta: &Meta) {
        self.id = random_id("msg_", 24);
        self.model.clone_from(&meta.model);
        self.input_tokens = meta.input_tokens;
    }

    fn stream_head(&self) -> String {
        stream_start(&self.id, &self.model, self.input_tokens, self.plain())
    }

    fn render_event(&mut self, ev: &GenEvent) -> String {
        match ev {
            GenEvent::Delta(d) if self.plain() => stream_delta(d),
            GenEvent::Finish(f) if self.plain() => stream_end(f),
            // The Messages API has no log-probabilities (none are asked for).
            GenEvent::Logprobs(_) => String::new(),
            GenEvent::Delta(d) => {
                let pieces = crate::thinking::pieces(self.think.as_mut(), &mut self.splitter, d);
                self.blocks.events(pieces, &event)
            }
            GenEvent::Finish(f) => {
                let pieces = crate::thinking::finish(self.think.as_mut(), &mut self.splitter);
                let mut out = self.blocks.events(pieces, &event);
                out += &self.blocks.end(&event);
                crate::tools::count_calls(Self::API, self.splitter.calls);
                out + &stream_close(f, self.splitter.calls > 0)
            }
        }
    }

    fn render_error(error: &ApiError) -> String {
        stream_error(error)
    }

    fn final_body(&mut self, text: &str, finish: &FinishInfo) -> Value {
        if self.plain() {
            return message(&self.id, &self.model, vec![json!({"type": "text", "text": text})], false, finish);
        }
        let mut pieces = crate::thinking::pieces(self.think.as_mut(), &mut self.splitter, text);
        pieces.extend(crate::thinking::finish(self.think.as_mut(), &mut self.splitter));
        let content = crate::tools::anthropic::content(&blocks(pieces));
        crate::tools::count_calls(Self::API, self.splitter.calls);
        message(&self.id, &self.model, content, self.splitter.calls > 0, finish)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ok(body: Value) -> GenRequest {
        parse(&body, false).unwrap()
    }

    fn err(body: Value) -> String {
        parse(&body, false).unwrap_err().message
    }

    #[test]
    fn a_final_assistant_turn_is_the_start_of_the_answer() {
        let r = ok(json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "JSON please"},
            {"role": "assistant", "content": "{\"capital\": \""}
        ]}));
        assert_eq!(r.prefill.as_deref(), Some("{\"capital\": \""));
        assert_eq!(r.messages.len(), 1);
        // An empty final turn is a prefill of nothing.
        let r = ok(json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}
        ]}));
        assert_eq!((r.prefill, r.messages.len()), (None, 1));
    }

    #[test]
    fn output_config_format_is_the_output_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
        let body = |extra: Value| {
            let mut b = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            parse(&b, false)
        };
        let via_config = body(json!({"output_config": {"format": {"type": "json_schema", "schema": schema}}})).unwrap();
        let direct = body(json!({"output_format": {"type": "json_schema", "schema": schema}})).unwrap();
        assert!(via_config.grammar.is_some());
        assert_eq!(via_config.grammar, direct.grammar);
        let e = body(json!({"output_config": {"effort": "high"}})).unwrap_err();
        assert_eq!(e.message, "output_config.effort: not supported by this server (only output_config.format is)");
        let both = json!({"output_format": {"type": "json_schema", "schema": schema}, "output_config": {"format": {"type": "json_schema", "schema": schema}}});
        assert_eq!(body(both).unwrap_err().param.as_deref(), Some("output_config"));
        assert!(
            body(json!({"output_config": {"format": {"type": "json_schema"}}}))
                .unwrap_err()
                .message
                .contains("output_config.format.schema")
        );
    }

    #[test]
    fn out_of_range_integers_are_refused_with_the_value_as_sent() {
        let with = |field: &str, raw: &str| {
            let body = format!(
                r#"{{"model": "m", "max_tokens": 5, "messages": [{{"role": "user", "content": "hi"}}], "{field}": {raw}}}"#
            );
            parse(&serde_json::from_str(&body).unwrap(), false)
        };
        for (raw, shown) in
            [("18446744073709551616", "18446744073709551616"), ("1e30", "1e30"), ("2e19", "20000000000000000000")]
        {
            let e = with("seed", raw).unwrap_err();
            assert_eq!(e.message, format!("seed: Input should be between 0 and 18446744073709551615, got {shown}"));
        }
        assert_eq!(with("seed", "18446744073709551615").unwrap().seed, Some(u64::MAX));
        assert_eq!(with("seed", "7.0").unwrap().seed, Some(7));
        assert!(with("seed", "-1").unwrap_err().message.contains("greater than or equal to 0, got -1"));
        assert!(with("seed", "2.5").unwrap_err().message.contains("a valid integer, got 2.5"));
        let e = parse(
            &serde_json::from_str(r#"{"model": "m", "max_tokens": 18446744073709551616, "messages": [{"role": "user", "content": "hi"}]}"#)
                .unwrap(),
            false,
        )
        .unwrap_err();
        assert_eq!(e.message, "max_tokens: Input should be between 1 and 4294967295, got 18446744073709551616");
    }

    #[test]
    fn empty_and_null_content_are_refused_as_the_hosted_api_does() {
        let msgs = |m: Value| err(json!({"model": "m", "max_tokens": 5, "messages": m}));
        assert_eq!(
            msgs(json!([{"role": "user", "content": ""}])),
            "messages.0: all messages must have non-empty content except for the optional final assistant message"
        );
        assert!(msgs(json!([{"role": "user", "content": []}])).contains("non-empty content"));
        assert!(msgs(json!([{"role": "user", "content": null}])).contains("messages.0.content"));
        assert_eq!(
            msgs(json!([{"role": "user", "content": [{"type": "text", "text": ""}]}])),
            "messages.0.content.0.text: text content blocks must be non-empty"
        );
        assert!(
            msgs(json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "x"}]))
                .contains("messages.1: all messages must have non-empty content")
        );
        // A final assistant turn may be empty (a prefill of nothing).
        let ok = ok(json!({"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}));
        assert_eq!((ok.messages.len(), ok.prefill), (1, None));
    }

    #[test]
    fn parses_strings_and_blocks() {
        let r = ok(json!({
            "model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]},
                {"role": "user", "content": "again"}
            ],
            "temperature": 0, "top_k": 3, "stop_sequences": ["\n\n"], "metadata": {"user_id": "u1"}, "stream": true
        }));
        assert_eq!(r.system.as_deref(), Some("be brief"));
        assert_eq!(r.messages[1].content, "hello");
        assert_eq!((r.max_tokens, r.temperature, r.top_k, r.stream), (Some(5), 0.0, 3, true));
        assert_eq!(r.user.as_deref(), Some("u1"));
        assert_eq!(r.stop, vec!["\n\n".to_owned()]);
    }

    #[test]
    fn refuses_precisely() {
        let m = |extra: Value| {
            let mut base = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                base[k] = v.clone();
            }
            err(base)
        };
        assert_eq!(m(json!({"temperature": 5})), "temperature: Input should be between 0 and 1, got 5");
        assert_eq!(m(json!({"temperature": "hot"})), "temperature: Input should be a valid number");
        assert_eq!(m(json!({"max_tokens": 0})), "max_tokens: Input should be between 1 and 4294967295, got 0");
        assert_eq!(m(json!({"max_tokens": -3})), "max_tokens: Input should be greater than or equal to 1, got -3");
        assert_eq!(m(json!({"top_p": 2})), "top_p: Input should be between 0 and 1, got 2");
        assert_eq!(m(json!({"messages": []})), "messages: at least one message is required");
        assert_eq!(m(json!({"tools": [{"name": "x"}]})), "tools.0.input_schema: Field required");
        assert!(
            m(json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}))
                .contains("\"image\" are not supported")
        );
        assert!(
            m(json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}))
                .contains("must alternate")
        );
        assert!(m(json!({"messages": [{"role": "system", "content": "a"}]})).contains("top-level system"));
        assert_eq!(
            err(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})),
            "max_tokens: Field required"
        );
        assert_eq!(err(json!({"max_tokens": 1, "messages": []})), "model: Field required");
        assert_eq!(err(json!([1])), "the request body must be a JSON object");
        // count_tokens needs no max_tokens.
        assert!(parse(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), true).is_ok());
    }

    #[test]
    fn stream_events_are_byte_exact() {
        let f = FinishInfo {
            stop_reason: StopReason::MaxTokens,
            stop_sequence: None,
            input_tokens: 7,
            output_tokens: 2,
            cached_input_tokens: 0,
            draft_tokens: 0,
            accepted_draft_tokens: 0,
            migrated_to: Vec::new(),
            billing_unit: 0.25,
        };
        assert_eq!(
            stream_start("msg_1", "m", 7, true),
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":7,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":0}}}\n\n\
             event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
             event: ping\ndata: {\"type\":\"ping\"}\n\n"
        );
        assert_eq!(
            stream_delta("Hi"),
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
        );
        assert_eq!(
            stream_end(&f),
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
             event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":7,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":2,\"billing_unit\":0.25,\"predicted_draft_tokens\":0,\"predicted_accepted_tokens\":0}}\n\n\
             event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
    }
}
