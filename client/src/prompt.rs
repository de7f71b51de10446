//! A conversation as the model sees it: the system prompt and messages rendered with the model's chat template
//! (and the offered tools, given to a template that knows tools or described by the default tool prompt after the
//! system prompt), then tokenised. The gateway sends exactly these tokens; `zl bench` uses the same code so that
//! going around the gateway sends the same bytes.

use serde_json::Value;
use zl_text::{ChatMessage, TextTokenizer};

/// Tools offered with a conversation.
#[derive(Clone, Debug)]
pub struct OfferedTools {
    /// As a chat template that knows tools takes them (OpenAI's function format).
    pub template: Vec<Value>,
    /// The default tool prompt, for a template that does not.
    pub default_prompt: String,
}

/// Why a prompt cannot be made. Each is the client's fault (an invalid request).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    /// The chat template refused the conversation.
    #[error("the model's chat template refused the messages: {0}")]
    Template(String),
    /// The rendered text cannot be tokenised.
    #[error("the prompt cannot be tokenised: {0}")]
    Tokenize(String),
}

/// Render the conversation with `tokenizer`'s chat template.
pub fn render(
    tokenizer: &TextTokenizer,
    system: Option<&str>,
    messages: &[ChatMessage],
    tools: Option<OfferedTools>,
) -> Result<String, PromptError> {
    render_thinking(tokenizer, system, messages, tools, None)
}

/// [`render`] with the template's thinking switch set (`None`: the template's default).
pub fn render_thinking(
    tokenizer: &TextTokenizer,
    system: Option<&str>,
    messages: &[ChatMessage],
    tools: Option<OfferedTools>,
    thinking: Option<bool>,
) -> Result<String, PromptError> {
    let mut all = Vec::with_capacity(messages.len() + 1);
    let native = tools.is_some() && tokenizer.knows_tools();
    let system = match (system, &tools) {
        (system, Some(tools)) if !native => Some(match system {
            Some(s) if !s.is_empty() => format!("{s}\n\n{}", tools.default_prompt),
            _ => tools.default_prompt.clone(),
        }),
        (system, _) => system.map(str::to_owned),
    };
    if let Some(system) = system {
        all.push(ChatMessage { role: "system".into(), content: system });
    }
    all.extend(messages.iter().cloned());
    let template_tools = tools.filter(|_| native).map(|t| t.template);
    tokenizer
        .render_chat_thinking(&all, template_tools.as_deref(), thinking)
        .map_err(|e| PromptError::Template(e.to_string()))
}

/// [`render`], then tokenise: the prompt text and its tokens.
pub fn tokenize(
    tokenizer: &TextTokenizer,
    system: Option<&str>,
    messages: &[ChatMessage],
    tools: Option<OfferedTools>,
) -> Result<(String, Vec<u32>), PromptError> {
    let prompt = render(tokenizer, system, messages, tools)?;
    let tokens = tokenizer.encode(&prompt).map_err(|e| PromptError::Tokenize(e.to_string()))?;
    Ok((prompt, tokens))
}
