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
    /// An embedding model: the width of its vectors (0: a generative model).
    pub embedding_dims: u32,
    /// Every token's bytes, built on first use (log-probabilities name their tokens).
    pieces: std::sync::OnceLock<Vec<Vec<u8>>>,
}

impl Card {
    /// A card for `model` with this tokenizer.
    pub fn new(
        model: String,
        weights: String,
        context_length: u32,
        kv_block_size: u32,
        tokenizer: TextTokenizer,
    ) -> Self {
        Card { model, weights, context_length, kv_block_size, tokenizer, embedding_dims: 0, pieces: Default::default() }
    }

    /// The bytes token `id` stands for (a special token: its name; an unknown id: none). The first call builds
    /// the table (tens of milliseconds for a large vocabulary).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let table = self.pieces.get_or_init(|| self.tokenizer.token_bytes());
        match table.get(id as usize).map(Vec::as_slice) {
            Some([zl_text::SPECIAL_MARKER, name @ ..]) => name,
            Some(bytes) => bytes,
            None => &[],
        }
    }
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
    let mut built =
        Card::new(card.model, hex(&card.weights_sha256), card.context_length, card.kv_block_size, tokenizer);
    built.embedding_dims = card.embedding_dims;
    Ok(built)
}
