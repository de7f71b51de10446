//! A generation request as both APIs' parsers leave it, before it is rendered and checked: the conversation or a
//! raw prompt, sampling, tools and grammar, and what the answer should carry (log-probabilities, a thinking
//! section).

use zl_text::ChatMessage;

/// A generation request, whichever API it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct GenRequest {
    /// Model id or alias.
    pub model: String,
    /// System prompt.
    pub system: Option<String>,
    /// The conversation, oldest first.
    pub messages: Vec<ChatMessage>,
    /// Output limit; `None` fills the context window (OpenAI without `max_tokens`).
    pub max_tokens: Option<u32>,
    /// In [0, 2]; 0 is greedy.
    pub temperature: f32,
    /// In (0, 1].
    pub top_p: f32,
    /// 0 is off.
    pub top_k: u32,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Sampling seed.
    pub seed: Option<u64>,
    /// Stream the answer.
    pub stream: bool,
    /// End-user id, for session affinity.
    pub user: Option<String>,
    /// Offered tools, the tool choice and the output format.
    pub tools: crate::tools::ToolUse,
    /// The grammar the answer must match (built and checked from `tools` when the request was parsed).
    pub grammar: Option<String>,
    /// A prompt given as is (`/v1/completions`): no chat template; `system` and `messages` are empty then.
    pub raw: Option<RawPrompt>,
    /// The start of the answer (a final assistant turn the client wrote): the model continues it.
    pub prefill: Option<String>,
    /// A reasoning model's thinking section, as asked for.
    pub thinking: Thinking,
    /// Logit adjustments before sampling.
    pub penalties: Option<zl_wire::message::Penalties>,
    /// The log-probabilities asked for.
    pub logprobs: Option<LogprobRequest>,
}

/// What a request asks of a reasoning model's thinking section.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Thinking {
    /// As the model's template has it by default.
    #[default]
    Default,
    /// On, with a budget of output tokens for the section (`None`: unbounded).
    Enabled(Option<u32>),
    /// Off (the template's switch).
    Disabled,
}

impl Thinking {
    /// The template's `enable_thinking` switch.
    pub(super) fn switch(self) -> Option<bool> {
        match self {
            Thinking::Default => None,
            Thinking::Enabled(_) => Some(true),
            Thinking::Disabled => Some(false),
        }
    }
}

/// A prompt given as is, without the chat template.
#[derive(Clone, Debug, PartialEq)]
pub enum RawPrompt {
    /// Text, tokenized as it stands (after the model's beginning-of-sequence token, where its file asks for one).
    Text(String),
    /// Token ids of the model's tokenizer.
    Tokens(Vec<u32>),
}

/// What log-probabilities a request asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogprobRequest {
    /// Alternatives per position, 0 to 20.
    pub top: u8,
    /// The prompt's too (`echo`).
    pub prompt: bool,
}
