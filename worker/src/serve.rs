//! The worker's RPC face: turns `GenerateRequest` frames into engine requests and streams `TokenChunk` frames and
//! a `Finish` back. Dropping the call (the frontend reset the stream) drops the `Generation`, which cancels the
//! sequence and frees its KV blocks.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use zl_common::sync::lock;
use zl_proto::quic::{CallContext, Handler, Responder};
use zl_wire::message::{
    EmbedRequest, Embeddings, ErrorCode, Finish, GenerateRequest, Message, ModelCard, Prompt, StopReason, TokenChunk,
    Usage, WireError,
};

use crate::adapters::{AdapterCache, ForModel};
use crate::engine::{EngineHandle, Event, Request, RequestError};
use crate::model::llama::LlamaConfig;
use crate::sampling::Sampling;
use zl_text::TextTokenizer;

/// How long a request waits at most for its prompt's blocks to be read from the disk tier.
const PREFETCH_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One model this worker serves.
#[derive(Clone, Debug)]
pub struct ServedModel {
    /// The id clients use.
    pub id: String,
    /// SHA-256 of the weights.
    pub weights_sha256: [u8; 32],
    /// Context window.
    pub context_length: u32,
    /// Architecture family.
    pub family: String,
    /// Bytes of weights in memory (matrices, in their own formats).
    pub weights_bytes: u64,
    /// Tokenizer, for text prompts.
    pub tokenizer: Arc<TextTokenizer>,
    /// Its vocabulary as the grammar engine sees it, for constrained requests (none for an embedding model).
    pub grammar: Option<zl_grammar::Engine>,
    /// An embedding model: the width of its vectors and how it pools (none: a generative model).
    pub embedding: Option<(u32, &'static str)>,
    /// The engine running it.
    pub engine: EngineHandle,
    /// Tokens per KV block.
    pub kv_block_size: u32,
    /// Predictive streaming settings.
    pub speculation: Speculation,
    /// Its shape, which adapters are checked against.
    pub config: LlamaConfig,
    /// Its KV cache's lower tiers, when on: a prompt's blocks on disk are read back while the request waits.
    pub tiers: Option<Arc<crate::kv::tier::store::Tiers>>,
}

/// A worker's predictive-streaming settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speculation {
    /// Whether requests that do not say speculate.
    pub by_default: bool,
    /// Draft tokens per step at most (0: never speculate).
    pub max_draft: usize,
}

impl Speculation {
    /// Draft tokens per step for a request that asked for `wanted` (`None`: it did not say).
    pub fn drafts_for(&self, wanted: Option<bool>) -> usize {
        if wanted.unwrap_or(self.by_default) { self.max_draft } else { 0 }
    }
}

impl ServedModel {
    /// The card a frontend tokenises and checks this model's prompts with.
    pub fn card(&self) -> Result<ModelCard, WireError> {
        let parts = self
            .tokenizer
            .to_parts()
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("cannot export the tokenizer: {e}")))?;
        Ok(ModelCard {
            model: self.id.clone(),
            weights_sha256: self.weights_sha256,
            context_length: self.context_length,
            tokenizer_json: parts.tokenizer_json,
            chat_template: parts.chat_template,
            bos_token: parts.bos,
            eos_token: parts.eos,
            stop_token_ids: parts.stop_ids,
            kv_block_size: self.kv_block_size,
            embedding_dims: self.embedding.map_or(0, |e| e.0),
            pooling: self.embedding.map_or("", |e| e.1).to_owned(),
        })
    }
}

/// The worker's RPC handler.
#[derive(Debug)]
pub struct WorkerService {
    models: HashMap<String, ServedModel>,
    /// Model cards, built once on first request.
    cards: std::sync::Mutex<HashMap<String, Arc<ModelCard>>>,
    draining: AtomicBool,
    /// Shutting down (SIGTERM): nothing an operator says turns the drain off.
    stopping: AtomicBool,
    /// Handing over because an operator asked (`zl admin drain --migrate`), not because it stops.
    asked: AtomicBool,
    /// Set when a drain's grace period is over: the requests still running are ended with a retryable error,
    /// which frontends answer by resuming each on another worker (migration).
    handover: tokio::sync::watch::Sender<bool>,
    seeds: AtomicU64,
    /// The LoRA adapters requests name.
    adapters: Arc<AdapterCache>,
    /// Generate calls in progress: a sequence the engine has finished may still have its last chunks and finish
    /// to send, and a drain waits for those too.
    calls: Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts one generate call in progress while it lives.
struct CallInProgress(Arc<std::sync::atomic::AtomicUsize>);

impl CallInProgress {
    fn new(calls: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        calls.fetch_add(1, Ordering::SeqCst);
        CallInProgress(calls.clone())
    }
}

impl Drop for CallInProgress {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WorkerService {
    /// Serve these models, with these adapters.
    pub fn new(models: Vec<ServedModel>, adapters: Arc<AdapterCache>) -> Self {
        let seed0 =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        WorkerService {
            models: models.into_iter().map(|m| (m.id.clone(), m)).collect(),
            cards: Default::default(),
            draining: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            asked: AtomicBool::new(false),
            handover: tokio::sync::watch::Sender::new(false),
            seeds: AtomicU64::new(seed0),
            adapters,
            calls: Default::default(),
        }
    }

    /// Refuse new requests from now on (running ones finish): the process is stopping.
    pub fn drain(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.draining.store(true, Ordering::SeqCst);
    }

    /// What the orchestrators say an operator wants (`zl admin drain --migrate`, or undrain): hand the running
    /// requests over and refuse new ones, or take requests again (unless the process is stopping).
    pub fn operator_hand_over(&self, on: bool) {
        if on {
            self.asked.store(true, Ordering::SeqCst);
            self.draining.store(true, Ordering::SeqCst);
            self.handover.send_replace(true);
            tracing::warn!("an operator drained this worker with --migrate: handing the running requests over");
        } else if self.asked.swap(false, Ordering::SeqCst) && !self.stopping.load(Ordering::SeqCst) {
            self.handover.send_replace(false);
            self.draining.store(false, Ordering::SeqCst);
            tracing::info!("undrained: taking requests again");
        }
    }

    /// Hand the requests still running over to other workers: each ends now with `UNAVAILABLE` (retryable), and
    /// its frontend resumes it elsewhere after the tokens it has, so nothing of it is lost or repeated.
    pub fn hand_over(&self) {
        self.drain();
        self.handover.send_replace(true);
    }

    /// Whether it refuses new requests (draining).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Whether any model has requests waiting or running, or a generate call is still sending its answer.
    pub fn busy(&self) -> bool {
        self.calls.load(Ordering::SeqCst) > 0
            || self.models.values().any(|m| {
                let stats = m.engine.published(false).stats;
                stats.waiting + stats.running > 0
            })
    }

    /// The served models.
    pub fn models(&self) -> impl Iterator<Item = &ServedModel> {
        self.models.values()
    }

    fn card(&self, model: &str) -> Result<Arc<ModelCard>, WireError> {
        let served = self
            .models
            .get(model)
            .ok_or_else(|| WireError::new(ErrorCode::NotFound, format!("model {model:?} is not served here")))?;
        let mut cards = lock(&self.cards);
        if let Some(card) = cards.get(model) {
            return Ok(card.clone());
        }
        let card = Arc::new(served.card()?);
        cards.insert(model.to_owned(), card.clone());
        Ok(card)
    }

    /// The served model a new request names, while this worker takes requests.
    fn taking(&self, model: &str) -> Result<&ServedModel, WireError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(WireError::new(ErrorCode::Unavailable, "the worker is draining"));
        }
        self.models
            .get(model)
            .ok_or_else(|| WireError::new(ErrorCode::NotFound, format!("model {model:?} is not served here")))
    }

    async fn generate(&self, g: GenerateRequest, out: &mut Responder) -> Result<(), WireError> {
        let _in_progress = CallInProgress::new(&self.calls);
        let model = self.taking(&g.model)?;
        if model.embedding.is_some() {
            return Err(WireError::new(ErrorCode::InvalidRequest, RequestError::NotGenerative.to_string()));
        }
        let vocab = model.tokenizer.vocab_size() as u32;
        if let Some(bad) = g.resume_tokens.iter().find(|t| **t >= vocab) {
            return Err(WireError::new(
                ErrorCode::InvalidRequest,
                format!("resume token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        let prompt = match g.prompt {
            Prompt::Text(text) => model
                .tokenizer
                .encode(&text)
                .map_err(|e| WireError::new(ErrorCode::InvalidRequest, format!("cannot tokenize the prompt: {e}")))?,
            Prompt::Tokens(tokens) => {
                if let Some(bad) = tokens.iter().find(|t| **t >= vocab) {
                    return Err(WireError::new(
                        ErrorCode::InvalidRequest,
                        format!("token id {bad} is outside the vocabulary of {vocab}"),
                    ));
                }
                tokens
            }
        };
        // A grammar that does not compile is refused before any token is spent.
        let constraint = match g.grammar.as_str() {
            "" => None,
            grammar => {
                // Compiling a large schema takes milliseconds of CPU: off the async threads.
                let engine = model.grammar.clone().ok_or_else(|| {
                    WireError::new(ErrorCode::InvalidRequest, "the model does not take constrained requests")
                })?;
                let grammar = grammar.to_owned();
                let compiled = tokio::task::spawn_blocking(move || engine.start(&grammar))
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Internal, format!("grammar compilation failed: {e}")))?;
                Some(compiled.map_err(|e| WireError::new(ErrorCode::InvalidRequest, format!("grammar: {e}")))?)
            }
        };
        // The adapter, loaded on its first use here (its file checked against the registry's SHA-256).
        let adapter = match &g.adapter {
            Some(r) => {
                let base = ForModel { id: &model.id, config: &model.config, family: &model.family };
                Some(self.adapters.get(base, r).await?)
            }
            None => None,
        };
        if let Some(t) = &g.think {
            let vocab = model.config.vocab as u32;
            if let Some(bad) = t.close.iter().find(|&&id| id >= vocab) {
                return Err(WireError::new(
                    ErrorCode::InvalidRequest,
                    format!("think_close: token {bad} is not in the model's vocabulary of {vocab}"),
                ));
            }
        }
        if let Some(p) = &g.penalties {
            let vocab = model.config.vocab as u32;
            if let Some((bad, _)) = p.logit_bias.iter().find(|(id, _)| *id >= vocab) {
                return Err(WireError::new(
                    ErrorCode::InvalidRequest,
                    format!("logit_bias: token {bad} is not in the model's vocabulary of {vocab}"),
                ));
            }
        }
        let seed = g.sampling.seed.unwrap_or_else(|| self.seeds.fetch_add(0x9e37_79b9, Ordering::Relaxed));
        let req = Request {
            prompt,
            sampling: Sampling {
                temperature: g.sampling.temperature,
                top_p: g.sampling.top_p,
                top_k: g.sampling.top_k,
                seed,
            },
            max_tokens: g.max_tokens,
            stop_sequences: g.stop_sequences,
            logprobs: g.logprobs,
            top_logprobs: g.top_logprobs,
            prompt_logprobs: g.prompt_logprobs,
            think: g.think,
            penalties: g.penalties,
            speculate: model.speculation.drafts_for(g.streaming_predicted),
            constraint,
            cache_salt: (g.cache_salt != 0).then_some(g.cache_salt),
            resume: g.resume_tokens,
            adapter,
        };
        if let Some(t) = model.tiers.as_ref().filter(|t| t.has_disk() && !req.prompt_logprobs) {
            // The prompt's blocks that continue on disk, into host memory before the engine looks (bounded: a slow
            // disk costs a recomputation, never a stall).
            let (t, salt) = (t.clone(), req.chain_salt());
            let tokens: Vec<u32> = req.prompt.iter().chain(&req.resume).copied().collect();
            let read = tokio::task::spawn_blocking(move || t.prefetch(&tokens, salt));
            let span = tracing::debug_span!("kv_prefetch");
            let _ = tracing::Instrument::instrument(tokio::time::timeout(PREFETCH_LIMIT, read), span).await;
        }
        let mut generation = model
            .engine
            .generate(req)
            .await
            .map_err(|_| WireError::new(ErrorCode::Unavailable, "the engine has stopped"))?
            .map_err(|e| match e {
                RequestError::ContextLength { .. } => WireError::new(ErrorCode::ContextLengthExceeded, e.to_string()),
                // Not the request's fault: another (CPU) worker can serve it, and the frontend tries one.
                RequestError::AdapterDevice => WireError::new(ErrorCode::Unavailable, e.to_string()),
                other => WireError::new(ErrorCode::InvalidRequest, other.to_string()),
            })?;
        let send_err = |e: zl_proto::CallError| WireError::new(ErrorCode::Cancelled, e.to_string());
        tracing::debug!("admitted");
        if g.stream {
            // Admitted: an empty chunk says so at once, so the caller can answer its client (headers, the first
            // event) while a long prompt is still being computed.
            out.send(Message::TokenChunk(TokenChunk::admission())).await.map_err(send_err)?;
        }
        let mut pending = TokenChunk { logprobs: g.logprobs.then(Vec::new), ..Default::default() };
        // Child spans of `generate` (exported over OTLP): waiting in the batch and computing the prompt, then
        // producing the answer. Each lasts from its creation to its drop.
        let mut prefill = Some(tracing::debug_span!("prefill"));
        let mut decode = None;
        let mut handover = self.handover.subscribe();
        loop {
            let ev = tokio::select! {
                ev = generation.next() => ev,
                _ = handover.wait_for(|h| *h) => {
                    metrics::counter!("zl_worker_handed_over_total").increment(1);
                    return Err(WireError::new(
                        ErrorCode::Unavailable,
                        "the worker is shutting down: the request goes on on another worker",
                    ));
                }
            };
            let Some(ev) = ev else { break };
            if prefill.take().is_some() {
                decode = Some(tracing::debug_span!("decode"));
            }
            match ev {
                Event::Prompt { start, tokens, logprobs, .. } => {
                    // Before any output: its own chunk, whether the answer streams or not.
                    let mut chunk = TokenChunk { token_ids: tokens, prompt_start: Some(start), ..Default::default() };
                    chunk.logprobs = Some(logprobs.iter().map(|l| l.logprob).collect());
                    chunk.top = logprobs.into_iter().flat_map(|l| l.top).collect();
                    out.send(Message::TokenChunk(chunk)).await.map_err(send_err)?;
                }
                Event::Token { token, logprob, text, .. } => {
                    pending.token_ids.push(token);
                    pending.text_delta.push_str(&text);
                    if let (Some(lp), Some(logprob)) = (pending.logprobs.as_mut(), logprob) {
                        lp.push(logprob.logprob);
                        pending.top.extend(logprob.top);
                    }
                    if g.stream {
                        let chunk = std::mem::replace(
                            &mut pending,
                            TokenChunk { logprobs: g.logprobs.then(Vec::new), ..Default::default() },
                        );
                        out.send(Message::TokenChunk(chunk)).await.map_err(send_err)?;
                    }
                }
                Event::Finished {
                    reason,
                    stop_sequence,
                    text,
                    input_tokens,
                    output_tokens,
                    cached_input_tokens,
                    draft_tokens,
                    accepted_draft_tokens,
                    ..
                } => {
                    pending.text_delta.push_str(&text);
                    if !pending.text_delta.is_empty() || !pending.token_ids.is_empty() {
                        out.send(Message::TokenChunk(pending)).await.map_err(send_err)?;
                    }
                    let finish = Finish {
                        stop_reason: reason,
                        stop_sequence: if reason == StopReason::StopSequence { stop_sequence } else { None },
                        usage: Usage {
                            input_tokens,
                            output_tokens,
                            cached_input_tokens,
                            draft_tokens,
                            accepted_draft_tokens,
                        },
                    };
                    drop(decode.take());
                    out.send(Message::Finish(finish)).await.map_err(send_err)?;
                    tracing::debug!(input_tokens, output_tokens, cached_input_tokens, reason = ?reason, "finished");
                    return Ok(());
                }
            }
        }
        Err(WireError::new(ErrorCode::Unavailable, "the engine stopped during the request"))
    }
}

impl WorkerService {
    /// Embed a request's inputs: one `Embeddings` frame per run of vectors (each under [`EMBED_FRAME_VALUES`]
    /// values), in input order, then a `Finish` whose usage counts the inputs' tokens.
    async fn embed(&self, r: EmbedRequest, out: &mut Responder) -> Result<(), WireError> {
        let _in_progress = CallInProgress::new(&self.calls);
        let model = self.taking(&r.model)?;
        let Some((dims, _)) = model.embedding else {
            return Err(WireError::new(ErrorCode::InvalidRequest, RequestError::NotEmbedding.to_string()));
        };
        let vocab = model.tokenizer.vocab_size() as u32;
        for (i, input) in r.inputs.iter().enumerate() {
            if let Some(bad) = input.iter().find(|t| **t >= vocab) {
                return Err(WireError::new(
                    ErrorCode::InvalidRequest,
                    format!("input {i}: token id {bad} is outside the vocabulary of {vocab}"),
                ));
            }
        }
        let input_tokens = r.tokens().min(u32::MAX as usize) as u32;
        let mut handover = self.handover.subscribe();
        let vectors = tokio::select! {
            v = model.engine.embed(r.inputs) => v,
            _ = handover.wait_for(|h| *h) => {
                return Err(WireError::new(ErrorCode::Unavailable, "the worker is shutting down"));
            }
        };
        let vectors = vectors
            .map_err(|_| WireError::new(ErrorCode::Unavailable, "the engine has stopped"))?
            .map_err(|e| WireError::new(ErrorCode::InvalidRequest, e.to_string()))?;
        let send_err = |e: zl_proto::CallError| WireError::new(ErrorCode::Cancelled, e.to_string());
        let per_frame = (EMBED_FRAME_VALUES / dims.max(1) as usize).max(1);
        for (n, run) in vectors.chunks(per_frame).enumerate() {
            let values: Vec<f32> = run.iter().flatten().copied().collect();
            let frame = Embeddings { start: (n * per_frame) as u32, dims, values };
            out.send(Message::Embeddings(frame)).await.map_err(send_err)?;
        }
        let usage = Usage { input_tokens, ..Usage::default() };
        let finish = Finish { stop_reason: StopReason::EndTurn, stop_sequence: None, usage };
        out.send(Message::Finish(finish)).await.map_err(send_err)?;
        tracing::debug!(inputs = vectors.len(), input_tokens, "embedded");
        Ok(())
    }
}

/// Values one `Embeddings` frame carries at most (1 MiB of them), so an answer streams in frames well under any
/// payload limit.
const EMBED_FRAME_VALUES: usize = 1 << 18;

impl Handler for WorkerService {
    async fn call(&self, _ctx: CallContext, request: Message, out: &mut Responder) -> Result<(), WireError> {
        match request {
            Message::GenerateRequest(g) => {
                // One span per generation: its request and trace ids are on every log line it writes.
                let span = tracing::debug_span!(
                    "generate",
                    request_id = %g.request_id,
                    trace_id = %zl_common::trace::trace_id_of(&g.trace_id),
                    model = %g.model,
                );
                zl_node::otlp::adopt(&span, &g.trace_id);
                tracing::Instrument::instrument(self.generate(g, out), span).await
            }
            Message::EmbedRequest(r) => {
                let span = tracing::debug_span!(
                    "embed",
                    request_id = %r.request_id,
                    trace_id = %zl_common::trace::trace_id_of(&r.trace_id),
                    model = %r.model,
                );
                zl_node::otlp::adopt(&span, &r.trace_id);
                tracing::Instrument::instrument(self.embed(r, out), span).await
            }
            Message::ModelCardRequest(r) => {
                let card = self.card(&r.model)?;
                out.send(Message::ModelCard((*card).clone()))
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Cancelled, e.to_string()))
            }
            other => {
                Err(WireError::new(ErrorCode::InvalidRequest, format!("a worker does not serve {}", other.kind())))
            }
        }
    }
}
