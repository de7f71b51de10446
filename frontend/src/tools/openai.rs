//! Tools in Chat Completions: `tools`, `tool_choice`, `parallel_tool_calls` and `response_format` read from a
//! request, assistant `tool_calls` and `tool` messages flattened into the conversation, and the answer's calls
//! written as `tool_calls` (whole, or streamed as indexed deltas).

use serde_json::{Value, json};

use super::calls::{Block, Piece};
use super::{Choice, Format, Tool, ToolUse, call_text, check_choice, check_name, check_tools};
use crate::error::ApiError;
use crate::ids::random_id;
use crate::request::Fields;

/// `tools`, `tool_choice`, `parallel_tool_calls` and `response_format` of a request.
pub(crate) fn parse(f: &Fields<'_>) -> Result<ToolUse, ApiError> {
    for name in ["functions", "function_call"] {
        if f.get(name).is_some() {
            return Err(ApiError::invalid_param(
                name,
                format!("{name}: the deprecated functions API is not supported; use tools and tool_choice"),
            ));
        }
    }
    let mut use_ = ToolUse::default();
    match f.get("tools") {
        None => {}
        Some(Value::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                use_.tools.push(tool(t, &format!("tools[{i}]"))?);
            }
        }
        Some(_) => return Err(ApiError::invalid_param("tools", "tools: expected an array")),
    }
    check_tools(&use_.tools, "tools")?;
    use_.choice = match f.get("tool_choice") {
        None => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Choice::Auto,
            "required" => Choice::Any,
            "none" => Choice::None,
            other => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!("tool_choice: {other:?} is not one of none, auto, required"),
                ));
            }
        },
        Some(Value::Object(o)) => match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(name) if o.get("type").and_then(Value::as_str) == Some("function") => Choice::Named(name.to_owned()),
            _ => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
        Some(_) => return Err(ApiError::invalid_param("tool_choice", "tool_choice: expected a string or an object")),
    };
    if let Some(parallel) = f.boolean("parallel_tool_calls")? {
        use_.parallel = parallel;
    }
    check_choice(&use_, "tool_choice")?;
    use_.format = match f.get("response_format") {
        None => Format::Text,
        Some(rf) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => Format::Text,
            Some("json_object") => Format::JsonObject,
            Some("json_schema") => match rf.get("json_schema").and_then(|j| j.get("schema")) {
                Some(schema) if schema.is_object() => Format::JsonSchema(schema.clone()),
                _ => {
                    return Err(ApiError::invalid_param(
                        "response_format",
                        "response_format.json_schema.schema: an object is required",
                    ));
                }
            },
            _ => {
                return Err(ApiError::invalid_param(
                    "response_format",
                    "response_format.type: must be one of text, json_object, json_schema",
                ));
            }
        },
    };
    Ok(use_)
}

fn tool(t: &Value, field: &str) -> Result<Tool, ApiError> {
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ApiError::invalid_param("tools", format!("{field}.type: only \"function\" tools are supported")));
    }
    let Some(function) = t.get("function").filter(|f| f.is_object()) else {
        return Err(ApiError::invalid_param("tools", format!("{field}.function: an object is required")));
    };
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid_param("tools", format!("{field}.function.name: a string is required")))?;
    check_name(name, &format!("{field}.function.name")).map_err(|e| ApiError::invalid_param("tools", e.message))?;
    let schema = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "tools",
                format!("{field}.function.parameters: an object is required"),
            ));
        }
    };
    Ok(Tool {
        name: name.to_owned(),
        description: function.get("description").and_then(Value::as_str).unwrap_or_default().to_owned(),
        schema,
        strict: function.get("strict").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// An assistant message's `tool_calls` as the model wrote them.
pub fn assistant_calls(calls: &Value, field: &str) -> Result<String, ApiError> {
    let Value::Array(list) = calls else {
        return Err(ApiError::invalid_param("messages", format!("{field}.tool_calls: expected an array")));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, c) in list.iter().enumerate() {
        let function = c.get("function");
        let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
        let args = function.and_then(|f| f.get("arguments")).and_then(Value::as_str);
        let (Some(name), Some(args)) = (name, args) else {
            return Err(ApiError::invalid_param(
                "messages",
                format!("{field}.tool_calls[{i}].function: a name and arguments string are required"),
            ));
        };
        // Arguments are a JSON string; the model reads them as the object they hold (or as written, when they
        // are not JSON).
        let value = serde_json::from_str::<Value>(args).unwrap_or_else(|_| Value::String(args.to_owned()));
        out.push(call_text(name, &value));
    }
    Ok(out.join("\n"))
}

/// The `message` of a `chat.completion`: text content (null when the answer is only calls) and `tool_calls`.
pub fn message(blocks: &[Block]) -> Value {
    let mut text = String::new();
    let mut reasoning: Option<String> = None;
    let mut calls = Vec::new();
    for b in blocks {
        match b {
            Block::Thinking(t) => reasoning.get_or_insert_with(String::new).push_str(t),
            Block::Text(t) => text.push_str(t),
            Block::Call { name, args, valid: true } => calls.push(json!({
                "id": random_id("call_", 24),
                "type": "function",
                "function": {"name": name, "arguments": args},
            })),
            Block::Call { name, args, valid: false } => text.push_str(&super::calls::unfinished_call(name, args)),
        }
    }
    let mut m = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) }, "refusal": null});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    // A reasoning model's thinking section, as vLLM and DeepSeek return it.
    if let Some(r) = reasoning {
        m["reasoning_content"] = Value::String(r);
    }
    m
}

/// Streamed deltas of pieces: `content`, or `tool_calls` entries with their index (the id, type and name with a
/// call's first delta, then its arguments).
#[derive(Clone, Debug, Default)]
pub struct CallDeltas {
    calls: usize,
}

impl CallDeltas {
    /// One delta per piece that shows.
    pub fn deltas(&mut self, pieces: Vec<Piece>) -> Vec<Value> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Thinking(t) => out.push(json!({"reasoning_content": t})),
                Piece::Text(t) => out.push(json!({"content": t})),
                Piece::CallStart { name } => {
                    out.push(json!({"tool_calls": [{
                        "index": self.calls,
                        "id": random_id("call_", 24),
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }]}));
                    self.calls += 1;
                }
                Piece::CallArgs(a) => {
                    out.push(
                        json!({"tool_calls": [{"index": self.calls.saturating_sub(1), "function": {"arguments": a}}]}),
                    );
                }
                Piece::CallEnd { .. } => {}
            }
        }
        out
    }
}
