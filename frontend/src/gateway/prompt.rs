//! A request's prompt as the model sees it: rendered with the chat template (or given as is), with the thinking
//! section and a prefill applied, tokenized; and the size checks and billing text that go with it.

use zl_client::prompt::OfferedTools;
use zl_text::ChatMessage;

use super::request::{GenRequest, RawPrompt, Thinking};
use crate::cluster::Card;
use crate::error::ApiError;

/// Refuse, before any tokenizing, a prompt whose text has more bytes than the model's whole context window can
/// hold (a token stands for at most [`TextTokenizer::max_token_bytes`] bytes), so a huge body costs a
/// comparison, not seconds of CPU and gigabytes of token offsets.
///
/// [`TextTokenizer::max_token_bytes`]: zl_text::TextTokenizer::max_token_bytes
pub(super) fn fits_in_bytes(card: &Card, text_bytes: usize) -> Result<(), ApiError> {
    let per_token = card.tokenizer.max_token_bytes();
    let most = (card.context_length as usize).saturating_mul(per_token);
    if text_bytes > most {
        return Err(ApiError::invalid(format!(
            "prompt is too long: {text_bytes} bytes of text cannot fit the {}-token context of {} (a token stands \
             for at most {per_token} bytes, so at most {most} bytes can fit)",
            card.context_length, card.model
        )));
    }
    Ok(())
}

/// A request's prompt as the model sees it and its tokens: what a worker is sent (CPU-heavy: run it off the async
/// threads). A raw prompt is taken as is; a conversation is rendered by zl-client's prompt code, then the thinking
/// section is opened where it was asked for and a prefill appended.
pub fn tokenize(card: &Card, req: &GenRequest) -> Result<(String, Vec<u32>), ApiError> {
    match &req.raw {
        Some(RawPrompt::Text(text)) => {
            // As llama.cpp and vLLM tokenize a completion prompt: after the beginning-of-sequence token where the
            // model's file asks for one (unless the text starts with it).
            let bos = card.tokenizer.bos_text();
            let text = if bos.is_empty() || text.starts_with(bos) { text.clone() } else { format!("{bos}{text}") };
            let tokens = card.tokenizer.encode(&text).map_err(|e| ApiError::invalid(e.to_string()))?;
            return Ok((text, tokens));
        }
        Some(RawPrompt::Tokens(tokens)) => {
            let vocab = card.tokenizer.vocab_size();
            if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!("prompt: token id {bad} is not in the model's vocabulary of {vocab}"),
                ));
            }
            let text = card.tokenizer.decode(tokens).map_err(|e| ApiError::invalid(e.to_string()))?;
            return Ok((text, tokens.clone()));
        }
        None => {}
    }
    let tools = req
        .tools
        .active()
        .then(|| OfferedTools { template: req.tools.template_tools(), default_prompt: req.tools.default_prompt() });
    let invalid = |e: zl_client::prompt::PromptError| ApiError::invalid(e.to_string());
    let mut prompt = zl_client::prompt::render_thinking(
        &card.tokenizer,
        req.system.as_deref(),
        &req.messages,
        tools,
        req.thinking.switch(),
    )
    .map_err(invalid)?;
    // Thinking asked for: the answer opens the section (templates that do not open it leave it to the model).
    if matches!(req.thinking, Thinking::Enabled(_))
        && card.tokenizer.has_thinking()
        && !prompt.trim_end().ends_with(crate::thinking::OPEN)
    {
        prompt.push_str(crate::thinking::OPEN);
        prompt.push('\n');
    }
    // A prefilled answer: the assistant's turn is opened by the template, then begins with the client's text.
    if let Some(prefill) = &req.prefill {
        prompt.push_str(prefill);
    }
    let tokens = card
        .tokenizer
        .encode(&prompt)
        .map_err(|e| ApiError::invalid(format!("the prompt cannot be tokenised: {e}")))?;
    Ok((prompt, tokens))
}

/// Bytes of text the prompt is made of: system prompt, messages and offered tools.
pub(super) fn prompt_bytes(req: &GenRequest) -> usize {
    match &req.raw {
        Some(RawPrompt::Text(t)) => return t.len(),
        // Token ids: their count (each stands for at least a byte); the context is checked in tokens later.
        Some(RawPrompt::Tokens(t)) => return t.len(),
        None => {}
    }
    req.system.as_ref().map_or(0, String::len)
        + req.prefill.as_ref().map_or(0, String::len)
        + req.messages.iter().map(|m| m.content.len()).sum::<usize>()
        + req.tools.prompt_bytes()
}

/// The text the billing signals read: the system prompt and every message, in order.
pub(super) fn billing_text(system: Option<&str>, messages: &[ChatMessage]) -> String {
    let mut text = system.unwrap_or_default().to_owned();
    for m in messages {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&m.content);
    }
    text
}
