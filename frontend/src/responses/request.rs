//! A Responses API request read as the Chat Completions request it amounts to: `input` items become messages
//! (`function_call` items an assistant turn's tool calls, `function_call_output` items tool results),
//! `instructions` the system prompt, flat function `tools` chat's nested ones, `text.format` the response format,
//! `reasoning.effort` the thinking setting. The chat parser then applies every rule of that API once.

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::ids::random_id;
use crate::request::Fields;

/// Built-in tools of the hosted service, refused by name.
const HOSTED_TOOLS: [&str; 8] = [
    "web_search",
    "web_search_preview",
    "file_search",
    "computer_use_preview",
    "code_interpreter",
    "image_generation",
    "mcp",
    "local_shell",
];

/// What the answer repeats of its request (the response object echoes them).
#[derive(Clone, Debug, Default)]
pub struct Echoed {
    /// `instructions`.
    pub instructions: Value,
    /// `tools`, as sent.
    pub tools: Value,
    /// `tool_choice`, as sent.
    pub tool_choice: Value,
    /// `text`, as sent (or the default).
    pub text: Value,
    /// `metadata`.
    pub metadata: Value,
    /// `max_output_tokens`.
    pub max_output_tokens: Value,
    /// `temperature`, `top_p`.
    pub temperature: Value,
    /// `top_p`.
    pub top_p: Value,
    /// `parallel_tool_calls`.
    pub parallel_tool_calls: bool,
    /// `reasoning`.
    pub reasoning: Value,
    /// `user`.
    pub user: Value,
    /// `store` (default true): the response is stored once complete.
    pub store: bool,
    /// `previous_response_id`.
    pub previous_response_id: Value,
    /// This request's `input` as items, each with an id (what `GET .../input_items` lists).
    pub input_items: Vec<Value>,
    /// The stored conversation `previous_response_id` continues (`super::stored::expand`).
    pub history: Vec<Value>,
}

fn bad(param: &str, message: String) -> ApiError {
    ApiError::invalid_param(param, format!("{param}{message}"))
}

/// The text of a message item's `content`: a string, or `input_text`/`output_text` parts.
fn content_text(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (i, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => text.push_str(
                        p.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| bad("input", format!("{at}.content[{i}].text: a string is required")))?,
                    ),
                    Some(other) => {
                        return Err(bad(
                            "input",
                            format!("{at}.content[{i}]: parts of type {other:?} are not supported by this server yet"),
                        ));
                    }
                    None => return Err(bad("input", format!("{at}.content[{i}].type: required"))),
                }
            }
            Ok(text)
        }
        _ => Err(bad("input", format!("{at}.content: expected a string or a list of parts"))),
    }
}

/// The chat messages of `input`.
fn messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) if !items.is_empty() => items,
        Value::Array(_) => return Err(bad("input", ": at least one item is required".into())),
        _ => return Err(bad("input", ": expected a string or a list of items".into())),
    };
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("[{i}]");
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or_default();
                if !matches!(role, "user" | "system" | "developer" | "assistant") {
                    return Err(bad(
                        "input",
                        format!("{at}.role: {role:?} is not one of user, system, developer, assistant"),
                    ));
                }
                let content = item.get("content").ok_or_else(|| bad("input", format!("{at}.content: required")))?;
                out.push(json!({"role": role, "content": content_text(content, &at)?}));
            }
            "function_call" => {
                let field = |name: &str| {
                    item.get(name)
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad("input", format!("{at}.{name}: a string is required")))
                };
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?}});
                // Calls of one turn go together.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" && last.get("tool_calls").is_some() => {
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("input", format!("{at}.call_id: a string is required")))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(v, &at)?,
                    _ => return Err(bad("input", format!("{at}.output: a string is required"))),
                };
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            // An earlier answer's reasoning: left out, as reasoning models' templates do.
            "reasoning" => {}
            other => {
                return Err(bad(
                    "input",
                    format!("{at}.type: items of type {other:?} are not supported by this server"),
                ));
            }
        }
    }
    Ok(out)
}

/// Flat function tools as chat's nested ones; hosted tools refused by name.
fn tools(list: &Value) -> Result<Value, ApiError> {
    let Value::Array(list) = list else { return Err(bad("tools", ": expected an array".into())) };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut f = Map::new();
                for key in ["name", "description", "parameters", "strict"] {
                    if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                        f.insert(key.into(), v.clone());
                    }
                }
                out.push(json!({"type": "function", "function": f}));
            }
            Some(hosted) if HOSTED_TOOLS.contains(&hosted) || hosted.starts_with("web_search") => {
                return Err(bad(
                    "tools",
                    format!(
                        "[{i}].type: the hosted tool {hosted:?} is not supported by this server; define a function tool"
                    ),
                ));
            }
            other => return Err(bad("tools", format!("[{i}].type: {other:?} is not a tool type this server knows"))),
        }
    }
    Ok(Value::Array(out))
}

/// `tool_choice`: strings as chat's; `{"type": "function", "name"}` as chat's nested form.
fn tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").ok_or_else(|| bad("tool_choice", ".name: required".into()))?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(bad(
            "tool_choice",
            ": expected \"auto\", \"required\", \"none\" or {\"type\": \"function\", \"name\"}".into(),
        )),
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    schema.insert(key.into(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(bad("text", ".format.type: expected \"text\", \"json_object\" or \"json_schema\"".into())),
    }
}

/// The body key `stored::expand` puts the continued conversation under (one a client sends is dropped first).
pub const HISTORY: &str = "_zl_history";

/// `input` as items, each with an id: a string is one user message; a message's string content becomes one
/// `input_text` (`output_text` for the assistant's) part.
pub fn input_items(input: &Value) -> Vec<Value> {
    let items = match input {
        Value::String(s) => vec![json!({"type": "message", "role": "user", "content": s})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    };
    items
        .into_iter()
        .map(|mut item| {
            if item.get("type").is_none() {
                item["type"] = json!("message");
            }
            let kind = item["type"].as_str().unwrap_or_default().to_owned();
            if kind == "message"
                && let Some(text) = item.get("content").and_then(Value::as_str).map(str::to_owned)
            {
                let part = if item["role"] == "assistant" { "output_text" } else { "input_text" };
                item["content"] = json!([{"type": part, "text": text}]);
            }
            if item.get("id").is_none_or(Value::is_null) {
                let prefix = match kind.as_str() {
                    "function_call" => "fc_",
                    "function_call_output" => "fco_",
                    _ => "msg_",
                };
                item["id"] = json!(random_id(prefix, 24));
            }
            item
        })
        .collect()
}

/// The Chat Completions body a Responses body amounts to, and what the answer echoes.
pub fn to_chat(body: &Value) -> Result<(Value, Echoed), ApiError> {
    let f = Fields::of(body)?;
    for (name, why) in [
        ("conversation", "conversations are not served by this server; continue one with previous_response_id"),
        ("prompt", "stored prompts are not supported by this server"),
        ("background", "background responses are not supported by this server"),
        ("background_options", "background responses are not supported by this server"),
        ("context_management", "server-side context management (compaction) is not supported by this server"),
        ("moderation", "moderation is not supported by this server"),
        ("image", "image generation is not supported by this server"),
        ("access_programs", "access programs are not supported by this server"),
    ] {
        if f.get(name).is_some_and(|v| !v.is_null() && v != &Value::Bool(false)) {
            return Err(ApiError::invalid_param(name, format!("{name}: {why}")));
        }
    }
    // At most one call a response is what turning parallel calls off gives; a larger cap is only honoured then.
    let parallel = f.boolean("parallel_tool_calls")?.unwrap_or(true);
    let max_calls = f.integer("max_tool_calls", 1, u64::from(u32::MAX))?;
    if parallel && max_calls.is_some_and(|m| m > 1) {
        return Err(ApiError::invalid_param(
            "max_tool_calls",
            "max_tool_calls: a cap above 1 is not enforced by this server; send 1, or parallel_tool_calls: false",
        ));
    }
    let parallel = parallel && max_calls.is_none();
    let store = f.boolean("store")?.unwrap_or(true);
    let previous = f.string("previous_response_id")?;
    // `include`: the output text's log-probabilities, and the reasoning items this server always returns.
    let mut logprobs = false;
    match f.get("include") {
        None => {}
        Some(Value::Array(list)) => {
            for v in list {
                match v.as_str() {
                    Some("message.output_text.logprobs") => logprobs = true,
                    Some("reasoning.encrypted_content") => {}
                    other => {
                        return Err(ApiError::invalid_param(
                            "include",
                            format!(
                                "include: {other:?} is not served by this server (message.output_text.logprobs is)"
                            ),
                        ));
                    }
                }
            }
        }
        Some(_) => return Err(ApiError::invalid_param("include", "include: expected a list")),
    }
    if f.string("truncation")?.is_some_and(|t| t != "disabled") {
        return Err(ApiError::invalid_param("truncation", "truncation: only \"disabled\" is supported"));
    }
    let model = f.required_string("model")?;
    let input = f.get("input").ok_or_else(|| bad("input", ": Field required".into()))?;
    // Checked as sent (a string, or a non-empty list), then read after the conversation it continues.
    messages(input)?;
    let input_items = input_items(input);
    let history: Vec<Value> = match body.get(HISTORY) {
        Some(Value::Array(h)) => h.clone(),
        _ => Vec::new(),
    };
    let mut messages = messages(&Value::Array(history.iter().chain(&input_items).cloned().collect()))?;
    let instructions = f.string("instructions")?;
    if let Some(i) = instructions {
        messages.insert(0, json!({"role": "system", "content": i}));
    }
    let mut chat = json!({"model": model, "messages": messages});
    let echoed = Echoed {
        instructions: instructions.map_or(Value::Null, |i| Value::String(i.to_owned())),
        tools: f.get("tools").cloned().unwrap_or_else(|| json!([])),
        tool_choice: f.get("tool_choice").cloned().unwrap_or_else(|| json!("auto")),
        text: f.get("text").cloned().unwrap_or_else(|| json!({"format": {"type": "text"}})),
        metadata: f.get("metadata").cloned().unwrap_or_else(|| json!({})),
        max_output_tokens: f.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        temperature: f.get("temperature").cloned().unwrap_or(json!(1.0)),
        top_p: f.get("top_p").cloned().unwrap_or(json!(1.0)),
        parallel_tool_calls: parallel,
        reasoning: f.get("reasoning").cloned().unwrap_or_else(|| json!({"effort": null, "summary": null})),
        user: f.get("user").cloned().unwrap_or(Value::Null),
        store,
        previous_response_id: previous.map_or(Value::Null, |p| Value::String(p.to_owned())),
        input_items,
        history,
    };
    if let Some(t) = f.get("tools") {
        chat["tools"] = tools(t)?;
    }
    if let Some(c) = f.get("tool_choice") {
        chat["tool_choice"] = tool_choice(c)?;
    }
    if let Some(text) = f.get("text")
        && let Some(format) = response_format(text)?
    {
        chat["response_format"] = format;
    }
    // Log-probabilities of the output text: with `include`, and `top_logprobs` alternatives (0 to 20).
    let top = f.integer("top_logprobs", 0, u64::from(zl_wire::message::MAX_TOP_LOGPROBS))?;
    if logprobs {
        chat["logprobs"] = json!(true);
        chat["top_logprobs"] = json!(top.unwrap_or(0));
    } else if top.is_some_and(|t| t > 0) {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs: only with include: [\"message.output_text.logprobs\"]",
        ));
    }
    if let Some(effort) = f.get("reasoning").and_then(|r| r.get("effort")).filter(|e| !e.is_null()) {
        chat["reasoning_effort"] = effort.clone();
    }
    for (from, to) in [
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("user", "user"),
        ("seed", "seed"),
    ] {
        if let Some(v) = f.get(from) {
            chat[to] = v.clone();
        }
    }
    if f.get("parallel_tool_calls").is_some() || max_calls.is_some() {
        chat["parallel_tool_calls"] = json!(parallel);
    }
    Ok((chat, echoed))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn input_becomes_items_with_ids_and_parts() {
        let items = input_items(&json!("hi"));
        assert_eq!(items[0]["type"], "message");
        assert_eq!(items[0]["content"], json!([{"type": "input_text", "text": "hi"}]));
        assert!(items[0]["id"].as_str().unwrap().starts_with("msg_"));
        let items = input_items(&json!([
            {"role": "assistant", "content": "ok"},
            {"type": "function_call_output", "call_id": "c", "output": "1", "id": "mine"},
        ]));
        assert_eq!(items[0]["content"][0]["type"], "output_text");
        assert_eq!(items[1]["id"], "mine");
    }

    #[test]
    fn input_items_become_the_chat_messages_they_are() {
        let (chat, echoed) = to_chat(&json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 9, "text": {"format": {"type": "json_object"}},
            "reasoning": {"effort": "low"},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "f"},
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}
            ]
        }))
        .unwrap();
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1], json!({"role": "user", "content": "hi"}));
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2, "calls of one turn together");
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "c1", "content": "one"}));
        assert_eq!(m[4], json!({"role": "assistant", "content": "ok"}));
        assert_eq!(chat["max_tokens"], 9);
        assert_eq!(chat["response_format"], json!({"type": "json_object"}));
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(chat["tools"][0]["function"]["name"], "f");
        assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "f"}}));
        assert_eq!(echoed.instructions, "Be brief.");
    }

    #[test]
    fn what_is_not_served_is_refused_by_name() {
        let param = |extra: Value| {
            let mut body = json!({"model": "m", "input": "hi"});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            to_chat(&body).unwrap_err().param.unwrap()
        };
        assert_eq!(param(json!({"store": "yes"})), "store");
        assert_eq!(param(json!({"conversation": "conv_1"})), "conversation");
        assert_eq!(param(json!({"background": true})), "background");
        assert_eq!(param(json!({"context_management": [{"type": "compaction"}]})), "context_management");
        assert_eq!(param(json!({"max_tool_calls": 3})), "max_tool_calls");
        // One call at most: what parallel calls off gives.
        let (chat, echoed) = to_chat(&json!({"model": "m", "input": "hi", "max_tool_calls": 1})).unwrap();
        assert_eq!((chat["parallel_tool_calls"].clone(), echoed.parallel_tool_calls), (json!(false), false));
        let (chat, _) =
            to_chat(&json!({"model": "m", "input": "hi", "max_tool_calls": 5, "parallel_tool_calls": false})).unwrap();
        assert_eq!(chat["parallel_tool_calls"], json!(false));
        assert_eq!(param(json!({"tools": [{"type": "file_search"}]})), "tools");
        assert_eq!(param(json!({"include": ["file_search_call.results"]})), "include");
        assert_eq!(param(json!({"top_logprobs": 3})), "top_logprobs");
        assert_eq!(param(json!({"truncation": "auto"})), "truncation");
        assert_eq!(param(json!({"input": [{"type": "input_image"}]})), "input");
        assert_eq!(param(json!({"input": []})), "input");
        assert!(to_chat(&json!({"model": "m", "input": "hi", "store": false, "include": []})).is_ok());
        let (chat, _) = to_chat(&json!({"model": "m", "input": "hi", "include": ["message.output_text.logprobs"],
            "top_logprobs": 2}))
        .unwrap();
        assert_eq!((chat["logprobs"].clone(), chat["top_logprobs"].clone()), (json!(true), json!(2)));
    }
}
