//! Generation messages: the request a frontend sends a worker, the token chunks and the finish that come back.
//!
//! Owned, checked values and their FlatBuffers conversion; no sampling or model logic lives here.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::adapters::AdapterRef;
use super::check::{self, invalid};
use super::penalties::Penalties;
use super::{MessageError, fb};

/// Sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Temperature in [0, `MAX_TEMPERATURE`]; 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// Top-k cut-off; 0 is off.
    pub top_k: u32,
    /// Seed of the request's random stream; `None` lets the worker choose.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, seed: None }
    }
}

impl SamplingParams {
    fn check(&self) -> Result<(), MessageError> {
        check::range("SamplingParams.temperature", self.temperature, 0.0, check::MAX_TEMPERATURE)?;
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid("SamplingParams.top_p", format!("{} is outside (0, 1]", self.top_p)));
        }
        Ok(())
    }

    fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::SamplingParams<'b>> {
        fb::SamplingParams::create(
            fbb,
            &fb::SamplingParamsArgs {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                seed: self.seed,
            },
        )
    }

    fn read(t: Option<fb::SamplingParams<'_>>) -> Self {
        t.map(|t| SamplingParams { temperature: t.temperature(), top_p: t.top_p(), top_k: t.top_k(), seed: t.seed() })
            .unwrap_or_default()
    }
}

/// The prompt: rendered text, or token ids of the model's tokenizer.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text already rendered with the model's chat template.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// Run a model.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateRequest {
    /// Client-visible request id.
    pub request_id: String,
    /// W3C traceparent of the caller's span, empty for none.
    pub trace_id: String,
    /// Concrete model id.
    pub model: String,
    /// The prompt (never empty).
    pub prompt: Prompt,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Output token limit, at least 1.
    pub max_tokens: u32,
    /// Strings that end generation.
    pub stop_sequences: Vec<String>,
    /// One chunk per decode step (true) or one at the end (false).
    pub stream: bool,
    /// Return per-token log-probabilities.
    pub logprobs: bool,
    /// Predictive streaming asked for (`Some(true)`), refused (`Some(false)`) or left to the worker's default.
    pub streaming_predicted: Option<bool>,
    /// A grammar the output must match (llguidance Lark); empty for none.
    pub grammar: String,
    /// The prompt's cache scope salt (`zl_common::block_hash::cache_salt`); 0 for unsalted.
    pub cache_salt: u64,
    /// Output tokens another worker already produced for this request (a migration): the worker continues after
    /// them exactly as that worker would have. At most `max_tokens` (all of them: only the finish was lost); empty
    /// for a fresh request.
    pub resume_tokens: Vec<u32>,
    /// A LoRA adapter over `model` (protocol 1.8): the worker loads it on first use and applies it to this request.
    pub adapter: Option<AdapterRef>,
    /// With `logprobs` (protocol 1.11): the most likely tokens at each position, 0 to [`MAX_TOP_LOGPROBS`].
    pub top_logprobs: u8,
    /// The prompt's log-probabilities too (protocol 1.11), in chunks with `prompt_start` before the first output.
    pub prompt_logprobs: bool,
    /// A thinking budget (protocol 1.11): `None` for none.
    pub think: Option<ThinkBudget>,
    /// Logit adjustments before sampling (protocol 1.11): `None` for none.
    pub penalties: Option<Penalties>,
}

/// A thinking section closed by force once its budget is spent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThinkBudget {
    /// Output tokens the section may take (at least 1).
    pub budget: u32,
    /// The text that ends it (`</think>`); once it appears the budget no longer applies.
    pub end: String,
    /// The tokens written to close it when the budget is spent.
    pub close: Vec<u32>,
}

/// Longest `ThinkBudget::end`, in bytes.
pub const MAX_THINK_END: usize = 64;
/// Most `ThinkBudget::close` tokens.
pub const MAX_THINK_CLOSE: usize = 32;

/// Most alternatives per token a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u8 = 20;

impl GenerateRequest {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::id("GenerateRequest.request_id", &self.request_id)?;
        check::text("GenerateRequest.trace_id", &self.trace_id, 0, check::MAX_ID_LEN)?;
        check::id("GenerateRequest.model", &self.model)?;
        let empty = match &self.prompt {
            Prompt::Text(text) => text.is_empty(),
            Prompt::Tokens(tokens) => tokens.is_empty(),
        };
        if empty {
            return Err(invalid("GenerateRequest.prompt", "must not be empty"));
        }
        self.sampling.check()?;
        if self.max_tokens == 0 {
            return Err(invalid("GenerateRequest.max_tokens", "must be at least 1"));
        }
        check::count("GenerateRequest.stop_sequences", self.stop_sequences.len(), check::MAX_STOP_SEQUENCES)?;
        for stop in &self.stop_sequences {
            if stop.is_empty() || stop.len() > check::MAX_STOP_SEQUENCE_LEN {
                return Err(invalid(
                    "GenerateRequest.stop_sequences",
                    format!("each must be 1 to {} bytes", check::MAX_STOP_SEQUENCE_LEN),
                ));
            }
        }
        if self.resume_tokens.len() > self.max_tokens as usize {
            return Err(invalid(
                "GenerateRequest.resume_tokens",
                format!(
                    "{} tokens already produced, more than max_tokens {}",
                    self.resume_tokens.len(),
                    self.max_tokens
                ),
            ));
        }
        if self.grammar.len() > check::MAX_GRAMMAR_LEN {
            return Err(invalid(
                "GenerateRequest.grammar",
                format!("{} bytes; at most {} are allowed", self.grammar.len(), check::MAX_GRAMMAR_LEN),
            ));
        }
        if let Some(a) = &self.adapter {
            a.check("GenerateRequest.adapter")?;
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(invalid("GenerateRequest.top_logprobs", format!("at most {MAX_TOP_LOGPROBS}")));
        }
        if let Some(t) = &self.think
            && (t.budget == 0
                || t.end.is_empty()
                || t.end.len() > MAX_THINK_END
                || t.close.is_empty()
                || t.close.len() > MAX_THINK_CLOSE)
        {
            return Err(invalid(
                "GenerateRequest.think_budget",
                format!(
                    "a budget of at least 1, an end of 1 to {MAX_THINK_END} bytes and 1 to {MAX_THINK_CLOSE} closing tokens"
                ),
            ));
        }
        if let Some(p) = &self.penalties {
            p.check()?;
        }
        if (self.top_logprobs > 0 || self.prompt_logprobs) && !self.logprobs {
            return Err(invalid("GenerateRequest.logprobs", "top_logprobs and prompt_logprobs need logprobs"));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::GenerateRequest<'b>> {
        let request_id = fbb.create_string(&self.request_id);
        let trace_id = fbb.create_string(&self.trace_id);
        let model = fbb.create_string(&self.model);
        let (prompt_text, prompt_tokens) = match &self.prompt {
            Prompt::Text(text) => (Some(fbb.create_string(text)), None),
            Prompt::Tokens(tokens) => (None, Some(fbb.create_vector(tokens))),
        };
        let sampling = self.sampling.write(fbb);
        let stops: Vec<_> = self.stop_sequences.iter().map(|s| fbb.create_string(s)).collect();
        let stops = fbb.create_vector(&stops);
        let grammar = (!self.grammar.is_empty()).then(|| fbb.create_string(&self.grammar));
        let resume_tokens = (!self.resume_tokens.is_empty()).then(|| fbb.create_vector(&self.resume_tokens));
        let adapter = self.adapter.as_ref().map(|a| a.write(fbb));
        let penalties = self.penalties.as_ref().map(|p| p.write(fbb));
        let think_end = self.think.as_ref().map(|t| fbb.create_string(&t.end));
        let think_close = self.think.as_ref().map(|t| fbb.create_vector(&t.close));
        fb::GenerateRequest::create(
            fbb,
            &fb::GenerateRequestArgs {
                request_id: Some(request_id),
                trace_id: Some(trace_id),
                model: Some(model),
                prompt_text,
                prompt_tokens,
                sampling: Some(sampling),
                max_tokens: self.max_tokens,
                stop_sequences: Some(stops),
                stream: self.stream,
                logprobs: self.logprobs,
                streaming_predicted: self.streaming_predicted,
                grammar,
                cache_salt: self.cache_salt,
                resume_tokens,
                adapter,
                top_logprobs: self.top_logprobs,
                prompt_logprobs: self.prompt_logprobs,
                think_budget: self.think.as_ref().map_or(0, |t| t.budget),
                think_end,
                think_close,
                penalties,
            },
        )
    }

    pub(crate) fn read(t: fb::GenerateRequest<'_>) -> Result<Self, MessageError> {
        let text = t.prompt_text().filter(|s| !s.is_empty());
        let tokens = t.prompt_tokens().filter(|v| !v.is_empty());
        let prompt = match (text, tokens) {
            (Some(text), None) => Prompt::Text(text.to_owned()),
            (None, Some(tokens)) => Prompt::Tokens(tokens.iter().collect()),
            (Some(_), Some(_)) => {
                return Err(invalid("GenerateRequest.prompt", "both prompt_text and prompt_tokens are set"));
            }
            (None, None) => return Err(invalid("GenerateRequest.prompt", "must not be empty")),
        };
        let stops = t.stop_sequences().unwrap_or_default();
        check::count("GenerateRequest.stop_sequences", stops.len(), check::MAX_STOP_SEQUENCES)?;
        let msg = GenerateRequest {
            request_id: t.request_id().to_owned(),
            trace_id: t.trace_id().unwrap_or_default().to_owned(),
            model: t.model().to_owned(),
            prompt,
            sampling: SamplingParams::read(t.sampling()),
            max_tokens: t.max_tokens(),
            stop_sequences: stops.iter().map(str::to_owned).collect(),
            stream: t.stream(),
            logprobs: t.logprobs(),
            streaming_predicted: t.streaming_predicted(),
            grammar: t.grammar().unwrap_or_default().to_owned(),
            cache_salt: t.cache_salt(),
            resume_tokens: t.resume_tokens().map(|v| v.iter().collect()).unwrap_or_default(),
            adapter: AdapterRef::read("GenerateRequest.adapter", t.adapter())?,
            top_logprobs: t.top_logprobs(),
            prompt_logprobs: t.prompt_logprobs(),
            think: match t.think_budget() {
                0 => None,
                budget => {
                    let close = t.think_close().unwrap_or_default();
                    check::count("GenerateRequest.think_close", close.len(), MAX_THINK_CLOSE)?;
                    Some(ThinkBudget {
                        budget,
                        end: t.think_end().unwrap_or_default().to_owned(),
                        close: close.iter().collect(),
                    })
                }
            },
            penalties: Penalties::read(t.penalties())?,
        };
        msg.check()?;
        Ok(msg)
    }
}

/// Tokens produced since the last chunk.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TokenChunk {
    /// Token ids, in order.
    pub token_ids: Vec<u32>,
    /// Text these tokens decode to (may lag behind the ids while a character or stop sequence is pending).
    pub text_delta: String,
    /// One log-probability per token id, when requested.
    pub logprobs: Option<Vec<f32>>,
    /// The most likely tokens at each position (protocol 1.11): the same number per token id, most likely first.
    pub top: Vec<(u32, f32)>,
    /// Set on a chunk of prompt log-probabilities: `token_ids` are the prompt's from this position on.
    pub prompt_start: Option<u32>,
}

impl TokenChunk {
    /// The frame a worker sends as soon as it has admitted a streamed request: no tokens, no text.
    pub fn admission() -> TokenChunk {
        TokenChunk::default()
    }

    /// Whether this is an admission frame (no tokens and no text: nothing to show).
    pub fn is_admission(&self) -> bool {
        self.token_ids.is_empty() && self.text_delta.is_empty()
    }

    /// Alternatives per token id.
    pub fn top_per_token(&self) -> usize {
        self.top.len().checked_div(self.token_ids.len()).unwrap_or(0)
    }

    pub(crate) fn check(&self) -> Result<(), MessageError> {
        let bad = |p: f32| p.is_nan() || p > 0.0;
        if let Some(lp) = &self.logprobs {
            if lp.len() != self.token_ids.len() {
                return Err(invalid(
                    "TokenChunk.logprobs",
                    format!("{} values for {} tokens", lp.len(), self.token_ids.len()),
                ));
            }
            if lp.iter().any(|p| bad(*p)) {
                return Err(invalid("TokenChunk.logprobs", "log-probabilities must be <= 0"));
            }
        }
        if !self.top.is_empty() {
            let k = self.top_per_token();
            if self.logprobs.is_none()
                || k == 0
                || k > usize::from(MAX_TOP_LOGPROBS)
                || k * self.token_ids.len() != self.top.len()
            {
                return Err(invalid(
                    "TokenChunk.top_logprobs",
                    format!("{} alternatives for {} tokens with logprobs", self.top.len(), self.token_ids.len()),
                ));
            }
            if self.top.iter().any(|(_, p)| bad(*p)) {
                return Err(invalid("TokenChunk.top_logprobs", "log-probabilities must be <= 0"));
            }
        }
        if self.prompt_start.is_some()
            && (self.token_ids.is_empty() || !self.text_delta.is_empty() || self.logprobs.is_none())
        {
            return Err(invalid("TokenChunk.prompt_start", "a prompt chunk has tokens with logprobs and no text"));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::TokenChunk<'b>> {
        let token_ids = fbb.create_vector(&self.token_ids);
        let text_delta = fbb.create_string(&self.text_delta);
        let logprobs = self.logprobs.as_deref().map(|lp| fbb.create_vector(lp));
        let (top_ids, top_logprobs) = if self.top.is_empty() {
            (None, None)
        } else {
            let ids: Vec<u32> = self.top.iter().map(|t| t.0).collect();
            let lps: Vec<f32> = self.top.iter().map(|t| t.1).collect();
            (Some(fbb.create_vector(&ids)), Some(fbb.create_vector(&lps)))
        };
        fb::TokenChunk::create(
            fbb,
            &fb::TokenChunkArgs {
                token_ids: Some(token_ids),
                text_delta: Some(text_delta),
                logprobs,
                top_ids,
                top_logprobs,
                prompt_start: self.prompt_start,
            },
        )
    }

    pub(crate) fn read(t: fb::TokenChunk<'_>) -> Result<Self, MessageError> {
        let ids = t.top_ids().map(|v| v.iter().collect::<Vec<_>>()).unwrap_or_default();
        let lps = t.top_logprobs().map(|v| v.iter().collect::<Vec<_>>()).unwrap_or_default();
        if ids.len() != lps.len() {
            return Err(invalid(
                "TokenChunk.top_logprobs",
                format!("{} ids, {} log-probabilities", ids.len(), lps.len()),
            ));
        }
        let msg = TokenChunk {
            token_ids: t.token_ids().map(|v| v.iter().collect()).unwrap_or_default(),
            text_delta: t.text_delta().unwrap_or_default().to_owned(),
            logprobs: t.logprobs().map(|v| v.iter().collect()),
            top: ids.into_iter().zip(lps).collect(),
            prompt_start: t.prompt_start(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// End-of-turn token.
    EndTurn,
    /// `max_tokens` reached.
    MaxTokens,
    /// A stop sequence matched.
    StopSequence,
}

impl StopReason {
    /// The Anthropic API's name for it.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopSequence => "stop_sequence",
        }
    }
}

/// Token counts of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// Prompt tokens served from cached KV blocks.
    pub cached_input_tokens: u32,
    /// Draft tokens verified by predictive streaming.
    pub draft_tokens: u32,
    /// Draft tokens accepted: output tokens that needed no model step of their own.
    pub accepted_draft_tokens: u32,
}

/// Successful end of a generation.
#[derive(Clone, Debug, PartialEq)]
pub struct Finish {
    /// Why it ended.
    pub stop_reason: StopReason,
    /// The matched stop sequence, when `stop_reason` is `StopSequence`.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: Usage,
}

impl Finish {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        match (&self.stop_reason, &self.stop_sequence) {
            (StopReason::StopSequence, Some(s)) if !s.is_empty() && s.len() <= check::MAX_STOP_SEQUENCE_LEN => Ok(()),
            (StopReason::StopSequence, _) => {
                Err(invalid("Finish.stop_sequence", "must name the matched stop sequence"))
            }
            (_, Some(_)) => Err(invalid("Finish.stop_sequence", "set although stop_reason is not stop_sequence")),
            (_, None) => Ok(()),
        }?;
        if self.usage.cached_input_tokens > self.usage.input_tokens {
            return Err(invalid("Finish.usage.cached_input_tokens", "exceeds input_tokens"));
        }
        let u = &self.usage;
        if u.accepted_draft_tokens > u.draft_tokens
            || (u.accepted_draft_tokens > 0 && u.accepted_draft_tokens >= u.output_tokens)
        {
            return Err(invalid(
                "Finish.usage.accepted_draft_tokens",
                "exceeds draft_tokens, or is not below output_tokens",
            ));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::Finish<'b>> {
        let stop_sequence = self.stop_sequence.as_deref().map(|s| fbb.create_string(s));
        let usage = fb::Usage::create(
            fbb,
            &fb::UsageArgs {
                input_tokens: self.usage.input_tokens,
                output_tokens: self.usage.output_tokens,
                cached_input_tokens: self.usage.cached_input_tokens,
                draft_tokens: self.usage.draft_tokens,
                accepted_draft_tokens: self.usage.accepted_draft_tokens,
            },
        );
        let stop_reason = match self.stop_reason {
            StopReason::EndTurn => fb::StopReason::EndTurn,
            StopReason::MaxTokens => fb::StopReason::MaxTokens,
            StopReason::StopSequence => fb::StopReason::StopSequence,
        };
        fb::Finish::create(fbb, &fb::FinishArgs { stop_reason, stop_sequence, usage: Some(usage) })
    }

    pub(crate) fn read(t: fb::Finish<'_>) -> Result<Self, MessageError> {
        let stop_reason = match t.stop_reason() {
            fb::StopReason::EndTurn => StopReason::EndTurn,
            fb::StopReason::MaxTokens => StopReason::MaxTokens,
            fb::StopReason::StopSequence => StopReason::StopSequence,
            other => return Err(invalid("Finish.stop_reason", format!("unknown stop reason {}", other.0))),
        };
        let usage = t.usage();
        let msg = Finish {
            stop_reason,
            stop_sequence: t.stop_sequence().filter(|s| !s.is_empty()).map(str::to_owned),
            usage: Usage {
                input_tokens: usage.input_tokens(),
                output_tokens: usage.output_tokens(),
                cached_input_tokens: usage.cached_input_tokens(),
                draft_tokens: usage.draft_tokens(),
                accepted_draft_tokens: usage.accepted_draft_tokens(),
            },
        };
        msg.check()?;
        Ok(msg)
    }
}
