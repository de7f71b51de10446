//! What a generation tells its caller, whichever API asked: what is known before the first token ([`Meta`], the
//! response headers' content), then its [`GenEvent`]s. Plain values below the gateway: the gateway makes them, the
//! HTTP layer, the dialects and the audit draft read them without reaching into it.

use std::sync::{Arc, Mutex};

use crate::cache::FinishInfo;
use crate::limits::RateFigures;

/// Whether the answer came from the response cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheStatus {
    /// Answered from the cache.
    Hit,
    /// Cacheable, not cached yet.
    Miss,
    /// Not cacheable (sampled without a seed), or the client asked to bypass it.
    Bypass,
}

impl CacheStatus {
    /// Header value.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "hit",
            CacheStatus::Miss => "miss",
            CacheStatus::Bypass => "bypass",
        }
    }
}

/// What is known about a request before its first token: the response headers' content.
#[derive(Clone, Debug)]
pub struct Meta {
    /// Concrete model id.
    pub model: String,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// The worker streaming the answer ("cache" for hits).
    pub worker: String,
    /// Compute pool.
    pub pool: &'static str,
    /// Predicted billing unit (the final one arrives with the finish).
    pub predicted_billing_unit: f32,
    /// Time spent getting route decisions (both of them when the first worker failed), in milliseconds.
    pub route_ms: f64,
    /// Why the orchestrator chose that worker (its policy's cost terms; empty for a cache hit).
    pub route_reason: String,
    /// Cache status.
    pub cache: CacheStatus,
    /// Rate-limit figures after admission.
    pub rate: RateFigures,
    /// SHA-256 of the model's weights (hex).
    pub weights_sha256: String,
    /// SHA-256 of the canonical input: the rendered prompt and every parameter that decides the output.
    pub input_sha256: [u8; 32],
    /// The orchestrator that routed it (empty for a cache hit).
    pub orchestrator: String,
    /// The seed the worker samples with: the client's, or one the frontend drew (every request runs seeded, so
    /// another worker can continue it exactly). `None` for a cache hit.
    pub seed: Option<u64>,
    /// The LoRA adapter it ran with: (name, SHA-256 hex of its weights file).
    pub adapter: Option<(String, String)>,
}

/// One event of a generation.
#[derive(Clone, Debug, PartialEq)]
pub enum GenEvent {
    /// More text.
    Delta(String),
    /// Log-probabilities the worker reported (a request that asked for them): of the output tokens whose text
    /// the next `Delta` carries, or of prompt tokens.
    Logprobs(Logprobs),
    /// The end.
    Finish(FinishInfo),
}

/// Log-probabilities of a run of tokens, as the worker reported them: the model's log-softmax before any sampling
/// transform.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Logprobs {
    /// Set for prompt tokens: the position of the first of `tokens` in the prompt (at least 1).
    pub prompt_start: Option<u32>,
    /// The tokens.
    pub tokens: Vec<u32>,
    /// One per token.
    pub logprobs: Vec<f32>,
    /// The most likely tokens at each position, the same number per token, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl Logprobs {
    /// Each token with its log-probability and its alternatives.
    pub fn entries(&self) -> impl Iterator<Item = (u32, f32, &[(u32, f32)])> {
        let k = self.top.len().checked_div(self.tokens.len()).unwrap_or(0);
        self.tokens.iter().zip(&self.logprobs).enumerate().map(move |(i, (&t, &lp))| {
            let top = if k == 0 { &[][..] } else { &self.top[i * k..(i + 1) * k] };
            (t, lp, top)
        })
    }
}

/// What an answer that ended without its finish had delivered (the client left, the worker failed past what
/// migration could mend, the server shut down): counted, billed and audited all the same.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delivered {
    /// Output tokens the worker had sent (capped at the request's `max_tokens`).
    pub output_tokens: u32,
    /// The billing unit of the text delivered so far.
    pub billing_unit: f32,
    /// Why it ended: `client_disconnected` or `error`.
    pub stop_reason: &'static str,
    /// Workers the request moved to before it ended.
    pub migrated_to: Vec<String>,
}

/// Where a generation leaves its [`Delivered`] when it ends without a finish; the audit draft reads it when the
/// response is done (the generation is always dropped before the draft is finished).
#[derive(Clone, Debug, Default)]
pub struct Tally(Arc<Mutex<Option<Delivered>>>);

impl Tally {
    /// Record how the answer ended.
    pub fn set(&self, delivered: Delivered) {
        *zl_common::sync::lock(&self.0) = Some(delivered);
    }

    /// What was delivered, if the answer ended without its finish.
    pub fn take(&self) -> Option<Delivered> {
        zl_common::sync::lock(&self.0).take()
    }
}
