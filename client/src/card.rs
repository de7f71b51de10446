//! A model's card as a client needs it: fetched from a worker, its tokenizer and chat template built off the async
//! threads (a tokenizer takes about a second of CPU to build).

use zl_common::keys::hex;
use zl_proto::CallError;
use zl_text::{TextTokenizer, TokenizerParts};

use crate::upstream::Upstream;

/// Everything a client needs to render, tokenise and check a model's prompts.
#[derive(Debug)]
pub struct Card {
    /// Concrete model id.
    pub model: String,
    /// Weights SHA-256, hex.
    pub weights: String,
    /// Context window in tokens.
    pub context_length: u32,
    /// Tokens per KV block on the workers.
    pub kv_block_size: u32,
    /// The model's tokenizer and chat template.
    pub tokenizer: TextTokenizer,
}

/// Why a card could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    /// The call to the worker failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The card came but its tokenizer cannot be built.
    #[error("{0}")]
    Unusable(String),
}

/// Ask the worker at `endpoint` for `model`'s card and build its tokenizer.
pub async fn fetch_card(upstream: &dyn Upstream, endpoint: String, model: String) -> Result<Card, CardError> {
    let card = upstream.model_card(endpoint, model.clone()).await?;
    let parts = TokenizerParts {
        tokenizer_json: card.tokenizer_json,
        chat_template: card.chat_template,
        bos: card.bos_token,
        eos: card.eos_token,
        stop_ids: card.stop_token_ids,
    };
    let tokenizer = tokio::task::spawn_blocking(move || TextTokenizer::from_parts(&parts))
        .await
        .map_err(|e| CardError::Unusable(format!("building the tokenizer failed: {e}")))?
        .map_err(|e| CardError::Unusable(format!("the worker's model card for {model} is unusable: {e}")))?;
    Ok(Card {
        model: card.model,
        weights: hex(&card.weights_sha256),
        context_length: card.context_length,
        kv_block_size: card.kv_block_size,
        tokenizer,
    })
}
