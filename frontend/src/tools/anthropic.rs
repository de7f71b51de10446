//! Tools in the Messages API: `tools`, `tool_choice` and `output_format` read from a request, `tool_use` and
//! `tool_result` blocks flattened into the conversation, and the answer's calls written as `tool_use` blocks
//! (whole, or streamed as `input_json_delta` events).

use serde_json::{Value, json};

use super::calls::{Block, Piece};
use super::{Choice, Format, Tool, ToolUse, call_text, check_choice, check_name, check_tools, result_text};
use crate::error::ApiError;
use crate::ids::random_id;
use crate::request::Fields;

/// `tools`, `tool_choice` and `output_format` of a request.
pub(crate) fn parse(f: &Fields<'_>) -> Result<ToolUse, ApiError> {
    let mut use_ = ToolUse::default();
    match f.get("tools") {
        None => {}
        Some(Value::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                use_.tools.push(tool(t, &format!("tools.{i}"))?);
            }
        }
        Some(_) => return Err(ApiError::invalid_param("tools", "tools: Input should be a valid list")),
    }
    check_tools(&use_.tools, "tools")?;
    if let Some(choice) = f.get("tool_choice") {
        let kind = choice.get("type").and_then(Value::as_str);
        use_.choice = match kind {
            Some("auto") => Choice::Auto,
            Some("any") => Choice::Any,
            Some("none") => Choice::None,
            Some("tool") => match choice.get("name").and_then(Value::as_str) {
                Some(name) => Choice::Named(name.to_owned()),
                None => return Err(ApiError::invalid_param("tool_choice", "tool_choice.name: Field required")),
            },
            _ => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'",
                ));
            }
        };
        match choice.get("disable_parallel_tool_use") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => use_.parallel = !b,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    "tool_choice.disable_parallel_tool_use: Input should be a valid boolean",
                ));
            }
        }
    }
    check_choice(&use_, "tool_choice")?;
    // Structured outputs: `output_format: {"type": "json_schema", "schema": {...}}`, or as the current SDK sends it
    // (`messages.parse(output_format=...)`), `output_config: {"format": {...}}`.
    let config_format = match f.get("output_config") {
        None => None,
        Some(Value::Object(config)) => {
            if let Some((key, _)) = config.iter().find(|(k, v)| k.as_str() != "format" && !v.is_null()) {
                return Err(ApiError::invalid_param(
                    "output_config",
                    format!("output_config.{key}: not supported by this server (only output_config.format is)"),
                ));
            }
            config.get("format").filter(|v| !v.is_null()).map(|v| (v, "output_config.format"))
        }
        Some(_) => {
            return Err(ApiError::invalid_param("output_config", "output_config: Input should be a valid dictionary"));
        }
    };
    let format = match (f.get("output_format").map(|v| (v, "output_format")), config_format) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_param(
                "output_config",
                "output_format and output_config.format: give the format once",
            ));
        }
        (one, other) => one.or(other),
    };
    if let Some((format, field)) = format {
        let param = field.split('.').next().unwrap_or(field);
        use_.format = match (format.get("type").and_then(Value::as_str), format.get("schema")) {
            (Some("json_schema"), Some(schema)) if schema.is_object() => Format::JsonSchema(schema.clone()),
            (Some("json_schema"), _) => {
                return Err(ApiError::invalid_param(param, format!("{field}.schema: Field required")));
            }
            _ => return Err(ApiError::invalid_param(param, format!("{field}.type: Input should be 'json_schema'"))),
        };
    }
    Ok(use_)
}

fn tool(t: &Value, field: &str) -> Result<Tool, ApiError> {
    let Some(obj) = t.as_object() else {
        return Err(ApiError::invalid_param("tools", format!("{field}: Input should be a valid dictionary")));
    };
    match obj.get("type").and_then(Value::as_str) {
        None | Some("custom") => {}
        Some(other) => {
            return Err(ApiError::invalid_param(
                "tools",
                format!(
                    "{field}.type: server tools ({other:?}) are not supported by this server; define a custom tool"
                ),
            ));
        }
    }
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid_param("tools", format!("{field}.name: Field required")))?;
    check_name(name, &format!("{field}.name"))?;
    let schema = match obj.get("input_schema") {
        Some(s @ Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("object") => s.clone(),
        Some(Value::Object(_)) => {
            return Err(ApiError::invalid_param(
                "tools",
                format!("{field}.input_schema.type: Input should be 'object'"),
            ));
        }
        _ => return Err(ApiError::invalid_param("tools", format!("{field}.input_schema: Field required"))),
    };
    let description = match obj.get("description") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(d)) => d.clone(),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "tools",
                format!("{field}.description: Input should be a valid string"),
            ));
        }
    };
    let strict = obj.get("strict").and_then(Value::as_bool).unwrap_or(false);
    Ok(Tool { name: name.to_owned(), description, schema, strict })
}

/// A message's `content` as the model reads it: text blocks, `tool_use` blocks (assistant turns) and `tool_result`
/// blocks (user turns, answering the previous turn's calls `called`). Returns the text and the ids of this turn's
/// calls.
pub fn flatten(content: &Value, field: &str, role: &str, called: &[String]) -> Result<(String, Vec<String>), ApiError> {
    let blocks = match content {
        Value::String(s) => return Ok((s.clone(), Vec::new())),
        Value::Array(blocks) => blocks,
        _ => {
            return Err(ApiError::invalid(format!(
                "{field}: Input should be a valid string or list of content blocks"
            )));
        }
    };
    let mut text = String::new();
    let mut ids = Vec::new();
    let mut push = |s: &str| {
        if !text.is_empty() && !text.ends_with('\n') && (s.starts_with('<')) {
            text.push('\n');
        }
        text.push_str(s);
    };
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{field}.{j}");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => match block.get("text").and_then(Value::as_str) {
                Some("") => return Err(ApiError::invalid(format!("{at}.text: text content blocks must be non-empty"))),
                Some(t) => push(t),
                None => return Err(ApiError::invalid(format!("{at}.text: Field required"))),
            },
            Some("tool_use") if role == "assistant" => {
                let id = block.get("id").and_then(Value::as_str);
                let name = block.get("name").and_then(Value::as_str);
                let (Some(id), Some(name)) = (id, name) else {
                    return Err(ApiError::invalid(format!("{at}: tool_use blocks need an id and a name")));
                };
                let input = block
                    .get("input")
                    .filter(|i| i.is_object())
                    .ok_or_else(|| ApiError::invalid(format!("{at}.input: Input should be a valid dictionary")))?;
                ids.push(id.to_owned());
                push(&call_text(name, input));
            }
            Some("tool_result") if role == "user" => {
                let id = block.get("tool_use_id").and_then(Value::as_str).unwrap_or_default();
                if !called.iter().any(|c| c == id) {
                    return Err(ApiError::invalid(format!(
                        "{at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    )));
                }
                let body = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => match c {
                        Value::String(s) => s.clone(),
                        Value::Array(parts) => {
                            let mut s = String::new();
                            for (k, p) in parts.iter().enumerate() {
                                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                                    (Some("text"), Some(t)) => s.push_str(t),
                                    (Some(other), _) if other != "text" => {
                                        return Err(ApiError::invalid(format!(
                                            "{at}.content.{k}: content of type {other:?} in tool results is not supported by this server yet; send text"
                                        )));
                                    }
                                    _ => {
                                        return Err(ApiError::invalid(format!(
                                            "{at}.content.{k}.text: Field required"
                                        )));
                                    }
                                }
                            }
                            s
                        }
                        _ => {
                            return Err(ApiError::invalid(format!(
                                "{at}.content: Input should be a valid string or list of content blocks"
                            )));
                        }
                    },
                };
                let is_error = block.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                push(&result_text(&body, is_error));
            }
            Some(ty @ ("tool_use" | "tool_result")) => {
                let turn = if ty == "tool_use" { "assistant" } else { "user" };
                return Err(ApiError::invalid(format!("{at}: {ty} blocks may only appear in {turn} messages")));
            }
            // An earlier answer's thinking: chat templates drop past reasoning, and so does this server.
            Some("thinking" | "redacted_thinking") if role == "assistant" => {}
            Some(
                ty @ ("image" | "document" | "thinking" | "redacted_thinking" | "server_tool_use" | "search_result"),
            ) => {
                return Err(ApiError::invalid(format!(
                    "{at}: content blocks of type \"{ty}\" are not supported by this server yet; send text"
                )));
            }
            Some("") | None => return Err(ApiError::invalid(format!("{at}.type: Field required"))),
            Some(other) => return Err(ApiError::invalid(format!("{at}.type: unknown content block type {other:?}"))),
        }
    }
    Ok((text, ids))
}

/// An opaque signature of a thinking block's text: FNV-1a, hex (clients send it back with the block; this server
/// keeps no state to check it against and leaves thinking blocks it is sent out of the prompt).
pub fn signature(text: &str) -> String {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("zl1{hash:016x}")
}

/// The `content` of a `message`: text blocks and `tool_use` blocks.
pub fn content(blocks: &[Block]) -> Vec<Value> {
    let mut out: Vec<Value> = blocks
        .iter()
        .map(|b| match b {
            Block::Thinking(t) => {
                json!({"type": "thinking", "thinking": t, "signature": signature(t.trim())})
            }
            Block::Text(t) => json!({"type": "text", "text": t}),
            Block::Call { name, args, valid: true } => json!({
                "type": "tool_use",
                "id": random_id("toolu_", 24),
                "name": name,
                "input": serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!({})),
            }),
            Block::Call { name, args, valid: false } => {
                json!({"type": "text", "text": super::calls::unfinished_call(name, args)})
            }
        })
        .collect();
    if out.is_empty() {
        out.push(json!({"type": "text", "text": ""}));
    }
    out
}

/// The streaming events of an answer with tools: blocks open as their first piece arrives (text, or a `tool_use`
/// block with its id and name), arguments stream as `input_json_delta` events.
#[derive(Debug, Default)]
pub struct BlockStream {
    /// Blocks opened so far.
    pub opened: usize,
    open: bool,
    /// The open block is a thinking block: its text so far (for the signature sent when it closes).
    thinking: Option<String>,
}

impl BlockStream {
    /// The events of these pieces, through `event` (name, data).
    pub fn events(&mut self, pieces: Vec<Piece>, event: &dyn Fn(&str, &Value) -> String) -> String {
        let mut out = String::new();
        for p in pieces {
            match p {
                Piece::Thinking(t) => {
                    if self.thinking.is_none() {
                        out += &self.close(event);
                        out += &self.start(json!({"type": "thinking", "thinking": "", "signature": ""}), event);
                        self.thinking = Some(String::new());
                    }
                    if let Some(all) = self.thinking.as_mut() {
                        all.push_str(&t);
                    }
                    out += &event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": self.opened - 1, "delta": {"type": "thinking_delta", "thinking": t}}),
                    );
                }
                Piece::Text(t) => {
                    if self.thinking.is_some() {
                        out += &self.close(event);
                    }
                    if !self.open {
                        out += &self.start(json!({"type": "text", "text": ""}), event);
                    }
                    out += &event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": self.opened - 1, "delta": {"type": "text_delta", "text": t}}),
                    );
                }
                Piece::CallStart { name } => {
                    out += &self.close(event);
                    let block = json!({"type": "tool_use", "id": random_id("toolu_", 24), "name": name, "input": {}});
                    out += &self.start(block, event);
                }
                Piece::CallArgs(a) => {
                    out += &event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": self.opened - 1, "delta": {"type": "input_json_delta", "partial_json": a}}),
                    );
                }
                Piece::CallEnd { .. } => out += &self.close(event),
            }
        }
        out
    }

    fn start(&mut self, block: Value, event: &dyn Fn(&str, &Value) -> String) -> String {
        let e = event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.opened, "content_block": block}),
        );
        self.opened += 1;
        self.open = true;
        e
    }

    /// Close the open block, if any.
    pub fn close(&mut self, event: &dyn Fn(&str, &Value) -> String) -> String {
        if !self.open {
            return String::new();
        }
        self.open = false;
        let mut out = String::new();
        if let Some(thought) = self.thinking.take() {
            let signature = signature(thought.trim());
            out += &event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": self.opened - 1, "delta": {"type": "signature_delta", "signature": signature}}),
            );
        }
        out + &event("content_block_stop", &json!({"type": "content_block_stop", "index": self.opened - 1}))
    }

    /// The end: the open block closed; an answer with no block at all gets an empty text block.
    pub fn end(&mut self, event: &dyn Fn(&str, &Value) -> String) -> String {
        let mut out = String::new();
        if self.opened == 0 {
            out += &self.start(json!({"type": "text", "text": ""}), event);
        }
        out + &self.close(event)
    }
}
