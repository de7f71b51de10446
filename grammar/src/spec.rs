//! The grammars requests carry, built from what the APIs send: a JSON Schema (`response_format`), any JSON object
//! (`json_object`), or calls of offered tools, each tool's arguments matching its `input_schema`. The tool-call
//! format is the one the default tool prompt teaches (`docs/api.md`):
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```

use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::GrammarError;
use crate::engine::Engine;

/// The tag that opens a tool call in the output.
pub const CALL_OPEN: &str = "<tool_call>";
/// The tag that closes it.
pub const CALL_CLOSE: &str = "</tool_call>";

/// One offered tool, as far as its grammar goes.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// Its name (letters, digits, `_` and `-`; the APIs' rule).
    pub name: String,
    /// The JSON Schema its arguments match.
    pub schema: Value,
}

/// How JSON is laid out under a grammar: one space after `:` and `,`, no other whitespace. A small model given
/// free whitespace can spend its whole budget on it.
fn layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with the layout options llguidance reads from `x-guidance`.
fn with_layout(schema: &Value) -> Result<Value, GrammarError> {
    match schema {
        Value::Object(map) => {
            let mut map = map.clone();
            map.insert("x-guidance".into(), layout());
            Ok(Value::Object(map))
        }
        Value::Bool(true) => Ok(json!({"x-guidance": layout()})),
        _ => Err(GrammarError::Compile("a JSON Schema must be an object".into())),
    }
}

/// Output that is one JSON value matching `schema`.
pub fn json_schema(schema: &Value) -> Result<String, GrammarError> {
    Ok(format!("start: %json {}\n", with_layout(schema)?))
}

/// Output that is one JSON object (OpenAI's `json_object`).
pub fn json_object() -> String {
    format!("start: %json {}\n", json!({"type": "object", "x-guidance": layout()}))
}

/// Output that is one tool call (or, with `parallel`, up to one per tool, a newline apart: a small model left an
/// open-ended list repeats its call until the token limit) of one of `tools`; with
/// `optional`, the output may instead be text that does not begin with [`CALL_OPEN`] (a model free to answer or to
/// call, whose calls must still be valid).
pub fn tool_calls(tools: &[ToolSpec], parallel: bool, optional: bool) -> Result<String, GrammarError> {
    if tools.is_empty() {
        return Err(GrammarError::Compile("no tool to call".into()));
    }
    let mut out = String::new();
    out.push_str(if optional { "start: TEXT | calls\n" } else { "start: calls\n" });
    let most = if parallel { tools.len() } else { 1 };
    out.push_str("calls: call");
    out.push_str(&"(\"\\n\" call".repeat(most - 1));
    out.push_str(&")?".repeat(most - 1));
    out.push('\n');
    if optional {
        // Text, as long as it does not open a call (derivre's intersection and complement).
        out.push_str(&format!("TEXT: /(?s:.+)/ & ~/(?s:{}.*)/\n", CALL_OPEN));
    }
    let names: Vec<String> = (0..tools.len()).map(|i| format!("tool_{i}")).collect();
    out.push_str(&format!("call: \"{}\\n\" ({}) \"\\n{}\"\n", CALL_OPEN, names.join(" | "), CALL_CLOSE));
    for (i, tool) in tools.iter().enumerate() {
        if tool.name.is_empty() || !tool.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return Err(GrammarError::Compile(format!("tool name {:?} must be letters, digits, _ or -", tool.name)));
        }
        out.push_str(&format!(
            "tool_{i}: \"{{\\\"name\\\": \\\"{}\\\", \\\"arguments\\\": \" args_{i} \"}}\"\n",
            tool.name
        ));
        out.push_str(&format!("args_{i}: %json {}\n", with_layout(&tool.schema)?));
    }
    Ok(out)
}

/// Check that `grammar` compiles (on a vocabulary of single bytes: what fails there fails on every model),
/// naming the problem when it does not.
pub fn check(grammar: &str) -> Result<(), GrammarError> {
    static ENGINE: OnceLock<Result<Engine, GrammarError>> = OnceLock::new();
    let engine = ENGINE.get_or_init(Engine::bytes_only).as_ref().map_err(Clone::clone)?;
    engine.start(grammar).map(drop)
}

#[cfg(test)]
mod tests;
