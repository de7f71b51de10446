//! Tool use and structured outputs, whichever API asked: the offered tools, the choice the client made, the
//! output format; the grammar that guarantees them (`zl-grammar`), the default tool prompt for chat templates
//! that know no tools, and the conversation's tool calls and results as the model reads them. The output is split
//! back into text and calls by [`calls::Splitter`]; each API words both ends its own way (`anthropic.rs`,
//! `openai.rs` in this module).

pub mod anthropic;
pub mod calls;
pub mod openai;

use serde_json::{Value, json};
pub use zl_grammar::spec::{CALL_CLOSE, CALL_OPEN};

use crate::error::ApiError;

/// Most tools one request may offer.
pub const MAX_TOOLS: usize = 128;
/// Longest tool name (the hosted APIs' limit).
pub const MAX_TOOL_NAME: usize = 64;

/// One offered tool.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments.
    pub schema: Value,
    /// Arguments must match the schema even when the model chooses freely (`auto`).
    pub strict: bool,
}

/// Which tool use the client allows or demands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Choice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call a tool (Anthropic `any`, OpenAI `required`).
    Any,
    /// The model must call this tool.
    Named(String),
    /// No tool calls.
    None,
}

/// The shape of a text answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Format {
    /// Free text.
    #[default]
    Text,
    /// One JSON object.
    JsonObject,
    /// One JSON value matching this schema.
    JsonSchema(Value),
}

/// Everything a request says about tools and output shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolUse {
    /// Offered tools.
    pub tools: Vec<Tool>,
    /// The choice.
    pub choice: Choice,
    /// Several calls in one answer are allowed.
    pub parallel: bool,
    /// The answer's format.
    pub format: Format,
}

impl Default for ToolUse {
    fn default() -> Self {
        ToolUse { tools: Vec::new(), choice: Choice::Auto, parallel: true, format: Format::Text }
    }
}

/// Where the answer's tool calls are looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallParse {
    /// Nowhere: the answer is text.
    Off,
    /// Anywhere in the answer.
    Anywhere,
    /// Only at its start (the grammar let the model choose between text and calls; text is never split).
    AtStart,
}

impl ToolUse {
    /// Whether the model is told about tools and its calls are looked for.
    pub fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != Choice::None
    }

    /// The tools the model may call under the choice.
    fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            Choice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
            Choice::None => Vec::new(),
            Choice::Auto | Choice::Any => self.tools.iter().collect(),
        }
    }

    /// Where to look for calls in the answer.
    pub fn call_parse(&self) -> CallParse {
        if !self.active() {
            CallParse::Off
        } else if self.choice == Choice::Auto && self.tools.iter().any(|t| t.strict) {
            CallParse::AtStart
        } else {
            CallParse::Anywhere
        }
    }

    /// The grammar the answer must match, if any: a forced call (`any`, a named tool), a free choice with strict
    /// tools (text, or valid calls), or a JSON format. A grammar that does not compile is the client's error,
    /// worded with the engine's reason, before anything is routed.
    pub fn grammar(&self, param: &str) -> Result<Option<String>, ApiError> {
        let specs = |tools: Vec<&Tool>| -> Vec<zl_grammar::ToolSpec> {
            tools.into_iter().map(|t| zl_grammar::ToolSpec { name: t.name.clone(), schema: t.schema.clone() }).collect()
        };
        let forced = matches!(self.choice, Choice::Any | Choice::Named(_));
        let grammar = if self.active() && (forced || self.call_parse() == CallParse::AtStart) {
            zl_grammar::tool_calls(&specs(self.callable()), self.parallel, !forced)
        } else {
            match &self.format {
                Format::Text => return Ok(None),
                Format::JsonObject => Ok(zl_grammar::json_object()),
                Format::JsonSchema(schema) => zl_grammar::json_schema(schema),
            }
        };
        let enforce = |e: zl_grammar::GrammarError| {
            ApiError::invalid_param(param, format!("{param}: the schema cannot be enforced: {e}"))
        };
        let grammar = grammar.map_err(enforce)?;
        // The size first: a grammar too large for the wire is refused before anything compiles it.
        if grammar.len() > zl_wire::message::MAX_GRAMMAR_LEN {
            return Err(ApiError::invalid_param(
                param,
                format!(
                    "{param}: the tools and schemas are too large to enforce ({} bytes; at most {})",
                    grammar.len(),
                    zl_wire::message::MAX_GRAMMAR_LEN
                ),
            ));
        }
        zl_grammar::check(&grammar).map_err(enforce)?;
        Ok(Some(grammar))
    }

    /// Bytes of text the tools add to the prompt (their descriptions and schemas), for the prompt-size checks.
    pub fn prompt_bytes(&self) -> usize {
        if !self.active() {
            return 0;
        }
        self.tools.iter().map(|t| t.name.len() + t.description.len() + t.schema.to_string().len()).sum()
    }

    /// The tools in OpenAI's function format: what chat templates that know tools are given as `tools`.
    pub fn template_tools(&self) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.schema}})
            })
            .collect()
    }

    /// The default tool prompt, appended to the system prompt for chat templates that know no tools
    /// (`docs/api.md` shows it).
    pub fn default_prompt(&self) -> String {
        let mut out = String::from(
            "# Tools\n\nYou can call functions to help answer. Their signatures, as JSON Schema, are inside <tools></tools>:\n<tools>\n",
        );
        for tool in self.template_tools() {
            out.push_str(&tool.to_string());
            out.push('\n');
        }
        out.push_str(
            "</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>\nFunction results come back inside <tool_response></tool_response> tags.",
        );
        if let Choice::Named(name) = &self.choice {
            out.push_str(&format!("\nCall the function {name} now."));
        } else if self.choice == Choice::Any {
            out.push_str("\nCall one of the functions now.");
        }
        out
    }
}

/// Count an answer's tool calls (`zl_frontend_tool_calls_total{api}`).
pub fn count_calls(api: &'static str, calls: usize) {
    if calls > 0 {
        metrics::counter!("zl_frontend_tool_calls_total", "api" => api).increment(calls as u64);
    }
}

/// A call in the conversation as the model writes it (the layout its grammar gives: `", "` and `": "`).
pub fn call_text(name: &str, arguments: &Value) -> String {
    format!("{CALL_OPEN}\n{}\n{CALL_CLOSE}", spaced(&json!({"name": name, "arguments": arguments})))
}

/// JSON with one space after each `:` and `,`, and none elsewhere.
fn spaced(v: &Value) -> String {
    match v {
        Value::Object(map) => {
            let items: Vec<String> =
                map.iter().map(|(k, v)| format!("{}: {}", Value::String(k.clone()), spaced(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(items) => format!("[{}]", items.iter().map(spaced).collect::<Vec<_>>().join(", ")),
        scalar => scalar.to_string(),
    }
}

/// A tool's result in the conversation as the model reads it.
pub fn result_text(content: &str, is_error: bool) -> String {
    let content = if is_error { format!("Error: {content}") } else { content.to_owned() };
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// Check a tool name: letters, digits, `_` and `-`, 1 to 64 of them.
pub fn check_name(name: &str, field: &str) -> Result<(), ApiError> {
    if name.is_empty()
        || name.len() > MAX_TOOL_NAME
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(ApiError::invalid(format!(
            "{field}: String should match pattern '^[a-zA-Z0-9_-]{{1,{MAX_TOOL_NAME}}}$'"
        )));
    }
    Ok(())
}

/// Check a tool list as a whole: its size, and that names are unique.
pub fn check_tools(tools: &[Tool], field: &str) -> Result<(), ApiError> {
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::invalid_param(field, format!("{field}: at most {MAX_TOOLS} tools")));
    }
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|u| u.name == t.name) {
            return Err(ApiError::invalid_param(field, format!("{field}: tool names must be unique ({:?})", t.name)));
        }
    }
    Ok(())
}

/// Check the named choice against the tools.
pub fn check_choice(use_: &ToolUse, field: &str) -> Result<(), ApiError> {
    match &use_.choice {
        Choice::Named(name) if !use_.tools.iter().any(|t| &t.name == name) => {
            Err(ApiError::invalid_param(field, format!("{field}: tool {name:?} is not among the offered tools")))
        }
        Choice::Any | Choice::Named(_) if use_.tools.is_empty() => {
            Err(ApiError::invalid_param(field, format!("{field}: a tool must be called, but no tools were offered")))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
