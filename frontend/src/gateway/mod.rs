//! One request's path through the frontend, independent of which API it came in on: authenticate, prepare
//! (sanitise, render the chat template, tokenise, check the context), answer from the response cache, admit
//! against rate limits, route, stream from the worker (retrying once on another worker if the first fails
//! before its first token, and resuming it on another worker if one fails mid-answer: `migration.rs`), and
//! settle limits, cache and metrics when the generation ends (`generation.rs`).

mod admission;
mod config;
mod embed;
mod generation;
mod migration;
mod options;
mod prompt;
mod request;

pub use options::RequestOptions;
pub use prompt::tokenize;
use prompt::{billing_text, fits_in_bytes, prompt_bytes};
pub use request::{GenRequest, LogprobRequest, RawPrompt, Thinking};

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use zl_common::billing;
use zl_common::block_hash::adapter_key;
use zl_common::keys::hex;
use zl_common::sync::lock;
use zl_proto::CallError;
use zl_wire::message::{
    AdapterInfo, ErrorCode, GenerateRequest, Message, NodeId, Prompt, RouteDecision, RouteRequest, SamplingParams,
    ThinkBudget,
};

use crate::cache::{CacheKeyParts, CachedAnswer, FinishInfo, ResponseCache};
use crate::cluster::{Card, Cluster, KeyInfo};
use crate::error::{ApiError, ErrorKind, Failure};
use crate::ledger::Spent;
use crate::limits::{KeyLimits, ProjectLimits, RateFigures, RateLimiter, Refusal};
use crate::report::Reporter;
use crate::suspects::Suspects;
use crate::upstream::{TokenSource, Upstream};

pub use crate::events::{CacheStatus, Delivered, GenEvent, Meta, Tally};
pub use admission::DegradeConfig;
use admission::Holds;
pub use config::GatewayConfig;
pub use embed::Embedded;
pub use generation::{Collected, Generation};
use generation::{Live, Settle, Source};
use migration::Migration;

/// The frontend's shared state.
pub struct Gateway {
    upstream: Arc<dyn Upstream>,
    cluster: Arc<Cluster>,
    limiter: Mutex<RateLimiter>,
    cache: Mutex<ResponseCache>,
    suspects: Mutex<Suspects>,
    /// Rendering and tokenizing prompts runs on blocking threads, this many at once (one per core): CPU-heavy
    /// request work never holds up the async threads, and a burst of huge prompts queues instead of piling up.
    cpu: tokio::sync::Semaphore,
    reporter: Arc<Reporter>,
    config: GatewayConfig,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("config", &self.config).finish_non_exhaustive()
    }
}

/// A prepared request: rendered, tokenised, checked. Only resolved values travel on from here (the raw
/// [`GenRequest`] is consumed by [`Gateway::prepare`]), each under the name the wire gives it, so `max_tokens`
/// means the same number from here to the worker's scheduler.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The model as the client named it (an id or an alias; the route resolves it).
    pub model: String,
    /// The model's card.
    pub card: Arc<Card>,
    /// The prompt as the model sees it.
    pub prompt: String,
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// The output limit: the client's, or what the context leaves when it gave none.
    pub max_tokens: u32,
    /// Temperature, top_p, top_k and seed, as the worker receives them.
    pub sampling: SamplingParams,
    /// Stop sequences.
    pub stop_sequences: Vec<String>,
    /// The grammar the answer must match (empty for none).
    pub grammar: String,
    /// The client streams the answer.
    pub stream: bool,
    /// End-user id, for session affinity.
    pub session_id: Option<String>,
    /// The text the billing signals read: the system prompt and every message, in order.
    pub billing_text: String,
    /// Ask the orchestrators for the model's fallback chain first (degraded).
    pub prefer_fallback: bool,
    /// The caller's project (set when the request starts), for the adapters it may use.
    pub project: String,
    /// The adapter its model id names, as last synced.
    pub adapter: Option<AdapterInfo>,
    /// The log-probabilities asked for.
    pub logprobs: Option<LogprobRequest>,
    /// The answer has a thinking section to split off (a reasoning model, thinking not switched off): `Some(true)`
    /// when the prompt already opened it.
    pub thinking: Option<bool>,
    /// Its budget, closed by force when spent.
    pub think: Option<ThinkBudget>,
    /// Logit adjustments before sampling.
    pub penalties: Option<zl_wire::message::Penalties>,
}

impl Gateway {
    /// A gateway over these tiers.
    pub fn new(upstream: Arc<dyn Upstream>, cluster: Arc<Cluster>, config: GatewayConfig) -> Self {
        Gateway {
            upstream,
            cluster,
            limiter: Mutex::new(RateLimiter::new(config.limit_share)),
            cache: Mutex::new(ResponseCache::new(config.cache_bytes)),
            suspects: Mutex::new(Suspects::default()),
            cpu: tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get())),
            reporter: Arc::new(Reporter::new(config.lease_fraction, config.lease)),
            config,
        }
    }

    /// Run CPU-heavy request work (parsing a large body, rendering, tokenizing) on a blocking thread, at most one
    /// per core at a time.
    pub async fn off_thread<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let _permit = self.cpu.acquire().await.map_err(|_| ApiError::internal("the frontend is shutting down"))?;
        tokio::task::spawn_blocking(work).await.map_err(|e| ApiError::internal(format!("request work failed: {e}")))?
    }

    /// The cached cluster state.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// How long stored responses are kept, seconds.
    pub fn response_ttl_s(&self) -> u32 {
        self.config.response_ttl_s
    }

    /// The tiers behind this frontend.
    pub fn upstream(&self) -> &Arc<dyn Upstream> {
        &self.upstream
    }

    /// This frontend's usage and budget ledger and its report trigger.
    pub fn reporter(&self) -> &Arc<Reporter> {
        &self.reporter
    }

    /// Forget idle rate-limit state (run now and then).
    pub fn sweep(&self) {
        lock(&self.limiter).sweep(Instant::now(), Duration::from_secs(600));
    }

    /// The key a peer region's frontend authenticated a hop with (empty: anonymous, where keys are not required),
    /// looked up in this region's copy of the keys.
    pub fn key_by_id(&self, key_id: &str) -> Result<KeyInfo, ApiError> {
        if (key_id.is_empty() || key_id == KeyInfo::anonymous().key_id) && !self.config.require_auth {
            return Ok(KeyInfo::anonymous());
        }
        self.cluster.key_by_id(key_id).ok_or_else(|| {
            ApiError::new(
                ErrorKind::Authentication,
                format!("the forwarding region authenticated key {key_id:?}, which this region does not know"),
            )
        })
    }

    /// The caller's key: `x-api-key`, or `Authorization: Bearer` (what the current Anthropic and OpenAI SDKs send).
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<KeyInfo, ApiError> {
        let header = |name: &str| headers.get(name).map(|v| v.to_str().map(str::trim));
        // Name the header the caller used (OpenAI's SDK sends a Bearer token, Anthropic's an x-api-key).
        let mut used = "x-api-key";
        let secret = match (header("x-api-key"), header("authorization")) {
            (Some(Ok(k)), _) if !k.is_empty() => Some(k.to_owned()),
            (_, Some(Ok(auth))) => {
                used = "bearer token";
                let (scheme, token) = auth.split_once(' ').unwrap_or((auth, ""));
                if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
                    return Err(ApiError::new(
                        ErrorKind::Authentication,
                        "authorization header must be \"Bearer <api key>\"",
                    ));
                }
                Some(token.trim().to_owned())
            }
            (Some(Err(_)), _) | (_, Some(Err(_))) => {
                return Err(ApiError::new(ErrorKind::Authentication, "the API key header is not valid text"));
            }
            _ => None,
        };
        let Some(secret) = secret else {
            if !self.config.require_auth {
                return Ok(KeyInfo::anonymous());
            }
            return Err(ApiError::new(
                ErrorKind::Authentication,
                "an API key is required: send it as the x-api-key header or as \"Authorization: Bearer <api key>\"",
            ));
        };
        match self.cluster.verify(&secret) {
            Some(key) => Ok(key),
            None if !self.config.require_auth => Ok(KeyInfo::anonymous()),
            None => Err(ApiError::new(ErrorKind::Authentication, format!("invalid {used}: no such API key"))),
        }
    }

    /// The caller's current rate-limit figures (for responses that admit nothing: errors, listings, counts).
    pub fn rate_figures(&self, key: &KeyInfo) -> RateFigures {
        let (limits, _) = self.limits_for(key);
        let local = lock(&self.limiter).figures_or_full(&key.key_id, limits);
        self.shared_figures(key, local)
    }

    /// Render, tokenise and check a request.
    pub async fn prepare(&self, mut req: GenRequest, request_id: &str) -> Result<Prepared, ApiError> {
        if self.config.sanitize {
            let mut removed = 0;
            let mut clean = |s: &mut String| {
                let (c, n) = crate::sanitize::sanitize(s);
                removed += n;
                *s = c;
            };
            if let Some(system) = req.system.as_mut() {
                clean(system);
            }
            for m in &mut req.messages {
                clean(&mut m.content);
            }
            if removed > 0 {
                metrics::counter!("zl_frontend_sanitized_chars_total").increment(removed as u64);
            }
        }
        if req.prefill.is_some() && req.grammar.is_some() {
            return Err(ApiError::invalid(
                "messages: a prefilled final assistant turn cannot be combined with constrained output (a strict \
                 tool, a forced tool choice or a response format) on this server yet",
            ));
        }
        let bytes = prompt_bytes(&req);
        if self.config.max_prompt_bytes > 0 && bytes > self.config.max_prompt_bytes {
            return Err(ApiError::invalid(format!(
                "prompt is too long: {bytes} bytes of text > {} byte limit",
                self.config.max_prompt_bytes
            )));
        }
        // An adapter's prompts are its base model's.
        let adapter = self.cluster.adapter(&req.model);
        let card_model = adapter.as_ref().map_or(&req.model, |a| &a.base);
        let card = self.cluster.card(self.upstream.as_ref(), card_model, request_id).await?;
        if card.embedding_dims > 0 {
            return Err(ApiError::invalid_param(
                "model",
                format!("model: {} is an embedding model: it answers /v1/embeddings, not generation", card.model),
            ));
        }
        fits_in_bytes(&card, bytes)?;
        let reasoning = card.tokenizer.has_thinking() && req.raw.is_none();
        match req.thinking {
            Thinking::Enabled(_) if !reasoning => {
                return Err(ApiError::invalid_param(
                    "thinking",
                    format!(
                        "thinking: {} has no thinking section (its chat template has no {})",
                        card.model,
                        crate::thinking::OPEN
                    ),
                ));
            }
            _ => {}
        }
        let card_for_work = card.clone();
        let (req, prompt, tokens, billing_text) = self
            .off_thread(move || {
                let (prompt, tokens) = tokenize(&card_for_work, &req)?;
                let billing = match req.raw {
                    Some(_) => prompt.clone(),
                    None => billing_text(req.system.as_deref(), &req.messages),
                };
                Ok((req, prompt, tokens, billing))
            })
            .await?;
        let context = card.context_length as usize;
        let max_tokens = match req.max_tokens {
            Some(m) => m,
            None => context.saturating_sub(tokens.len()).min(u32::MAX as usize) as u32,
        };
        if req.max_tokens.is_none() && max_tokens == 0 {
            return Err(ApiError::invalid(format!(
                "prompt is too long: {} tokens leave no room for an answer in the {context}-token context of {} \
                 (max_tokens was not set, so the rest of the context was assumed)",
                tokens.len(),
                card.model
            )));
        }
        if tokens.len() + max_tokens as usize > context {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "prompt is too long: {} tokens + max_tokens {} > {} maximum context of {}",
                    tokens.len(),
                    max_tokens,
                    context,
                    card.model
                ),
            ));
        }
        // The section is split off the answer unless it is switched off; the prompt may have opened it already.
        let thinking = (reasoning && req.thinking != Thinking::Disabled)
            .then(|| prompt.trim_end().ends_with(crate::thinking::OPEN) && req.prefill.is_none());
        // With constrained output the grammar applies to the answer after the section, so a section that is asked
        // for (or that the prompt opened) needs an end: without a budget of the client's, half the output limit.
        let budget = match req.thinking {
            Thinking::Enabled(Some(budget)) => Some(budget),
            ask if req.grammar.is_some() && (ask == Thinking::Enabled(None) || thinking == Some(true)) => {
                Some((max_tokens / 2).max(1))
            }
            _ => None,
        };
        let think = match budget {
            Some(budget) => {
                let close = card
                    .tokenizer
                    .encode(crate::thinking::FORCED_CLOSE)
                    .map_err(|e| ApiError::internal(format!("the thinking section's closing: {e}")))?;
                Some(ThinkBudget { budget, end: crate::thinking::CLOSE.into(), close })
            }
            _ => None,
        };
        let GenRequest {
            model, temperature, top_p, top_k, seed, stop, grammar, stream, user, logprobs, penalties, ..
        } = req;
        Ok(Prepared {
            billing_text,
            model,
            card,
            prompt,
            tokens,
            max_tokens,
            sampling: SamplingParams { temperature, top_p, top_k, seed },
            stop_sequences: stop,
            grammar: grammar.unwrap_or_default(),
            stream,
            session_id: user,
            prefer_fallback: false,
            project: String::new(),
            adapter,
            logprobs,
            thinking,
            think,
            penalties,
        })
    }

    /// Count a request's prompt tokens with the model's own tokenizer and template.
    pub async fn count_tokens(&self, req: GenRequest, request_id: &str) -> Result<usize, ApiError> {
        let bytes = prompt_bytes(&req);
        let card_model = self.cluster.adapter(&req.model).map_or_else(|| req.model.clone(), |a| a.base);
        let card = self.cluster.card(self.upstream.as_ref(), &card_model, request_id).await?;
        fits_in_bytes(&card, bytes)?;
        self.off_thread(move || tokenize(&card, &req).map(|(_, tokens)| tokens.len())).await
    }

    /// Refuse a request before its body is read when its key or project is already over its limits
    /// ([`RateLimiter::precheck`]); nothing is taken.
    #[allow(clippy::result_large_err)]
    pub fn precheck(&self, key: &KeyInfo) -> Result<(), Failure> {
        let (limits, quota) = self.limits_for(key);
        self.limiter().precheck(&key.key_id, &key.project, limits, quota, Instant::now()).map_err(refused)
    }

    /// Admit a `count_tokens` call against the key's per-minute request limit (it produces no tokens: the token
    /// limits are not charged, and it holds no concurrency slot once answered).
    pub fn admit_count(&self, key: &KeyInfo) -> Result<RateFigures, ApiError> {
        let (limits, quota) = self.limits_for(key);
        let quota = ProjectLimits { max_concurrent: 0, ..quota };
        let mut limiter = self.limiter();
        let (reservation, figures) = limiter
            .admit(&key.key_id, &key.project, limits, quota, 0, 0, Instant::now())
            .map_err(|r| refused(r).error)?;
        limiter.settle(&reservation, 0, Instant::now());
        Ok(figures)
    }

    /// The rate limiter, enforcing this frontend's share of each limit (all of it while limits are shared
    /// through the orchestrators).
    fn limiter(&self) -> std::sync::MutexGuard<'_, RateLimiter> {
        let share = if self.limits_shared() { 1.0 } else { self.config.limit_share };
        let mut limiter = lock(&self.limiter);
        limiter.set_share(share);
        limiter
    }

    fn limits_for(&self, key: &KeyInfo) -> (KeyLimits, ProjectLimits) {
        let q = self.cluster.project(&key.project);
        let d = self.config.default_limits;
        let pick = |v: u32, default: u32| if v > 0 { v } else { default };
        let limits = KeyLimits {
            requests: pick(q.requests_per_minute, d.requests),
            input_tokens: pick(q.input_tokens_per_minute, d.input_tokens),
            output_tokens: pick(q.output_tokens_per_minute, d.output_tokens),
        };
        (limits, ProjectLimits { tokens: q.tokens_per_minute, max_concurrent: q.max_concurrent })
    }

    /// Start a prepared request: from the cache, or routed to a worker and streaming. Errors before the first
    /// token are returned here (the HTTP status is still free); errors after it come from the [`Generation`].
    pub async fn start(
        self: &Arc<Self>,
        key: &KeyInfo,
        mut p: Prepared,
        opts: &RequestOptions,
        request_id: &str,
    ) -> Result<(Meta, Generation), Failure> {
        self.degrade(key, &mut p).map_err(|e| Failure::known(e, self.rate_figures(key)))?;
        // The text the billing signals read: its weight goes into the route, and the final unit reads it too.
        let billing_input = std::mem::take(&mut p.billing_text);
        p.project.clone_from(&key.project);
        let scope = self.cluster.cache_scope(&key.project);
        // The key of what this request would be answered with: by the version the card names (a hit was stored by
        // it), and, once routed, by the version the route actually serves (what a miss is stored under).
        let key_for = |model: &str, weights: &str| {
            CacheKeyParts {
                scope: &scope,
                model,
                weights,
                prompt: &p.prompt,
                max_tokens: p.max_tokens,
                temperature: p.sampling.temperature,
                top_p: p.sampling.top_p,
                top_k: p.sampling.top_k,
                seed: p.sampling.seed,
                stop: &p.stop_sequences,
                grammar: &p.grammar,
            }
            .key()
        };
        // An adapter's answers are its own: keyed by its name and version beside the base's.
        let versioned = |model: &str, weights: &str, adapter: Option<(&str, &[u8; 32])>| match adapter {
            Some((name, sha)) => key_for(&format!("{model}+{name}"), &format!("{weights}+{}", hex(sha))),
            None => key_for(model, weights),
        };
        let synced_adapter = p.adapter.as_ref().map(|a| (a.name.as_str(), &a.sha256));
        let input_sha256 = versioned(&p.card.model, &p.card.weights, synced_adapter);
        // Answers with log-probabilities are not stored: the cache keeps text.
        let cacheable = (p.sampling.temperature == 0.0 || p.sampling.seed.is_some())
            && p.logprobs.is_none()
            && p.penalties.is_none()
            && lock(&self.cache).enabled();
        let cache_key = (cacheable && !opts.bypass_cache).then_some(input_sha256);
        let (limits, quota) = self.limits_for(key);
        let input_tokens = p.tokens.len() as u32;
        let admitted =
            self.limiter().admit(&key.key_id, &key.project, limits, quota, input_tokens, p.max_tokens, Instant::now());
        let (reservation, rate) = admitted.map_err(refused)?;
        let mut settle = Settle {
            gateway: self.clone(),
            reservation: Some(reservation),
            output_tokens: 0,
            holds: Holds::default(),
            spent: Spent {
                key_id: key.key_id.clone(),
                project: key.project.clone(),
                input_tokens: u64::from(input_tokens),
                // Billed to the adapter as synced (a cached answer is that version's); a route names what served.
                adapter: p.adapter.as_ref().map(|a| (a.name.clone(), a.sha256)),
                ..Spent::default()
            },
            started: false,
        };
        // After the rate limits, so a request they refuse holds no budget; dropping `settle` gives both back.
        settle.holds = self
            .reserve_leases(key, p.tokens.len() as u64, u64::from(p.max_tokens))
            .await
            .map_err(|e| Failure::known(e, rate))?;
        let rate = self.shared_figures(key, rate);
        if let Some(k) = &cache_key
            && let Some(hit) = lock(&self.cache).get(k)
        {
            settle.started = true;
            metrics::counter!("zl_frontend_cache_total", "result" => "hit").increment(1);
            let meta = Meta {
                model: hit.model.clone(),
                input_tokens,
                worker: "cache".into(),
                pool: "cache",
                predicted_billing_unit: hit.finish.billing_unit,
                route_ms: 0.0,
                route_reason: String::new(),
                cache: CacheStatus::Hit,
                rate,
                weights_sha256: p.card.weights.clone(),
                input_sha256,
                orchestrator: String::new(),
                seed: None,
                adapter: p.adapter.as_ref().map(|a| (a.name.clone(), hex(&a.sha256))),
            };
            let mut events: VecDeque<GenEvent> = hit.deltas.iter().cloned().map(GenEvent::Delta).collect();
            events.push_back(GenEvent::Finish(hit.finish.clone()));
            return Ok((
                meta,
                Generation {
                    source: Source::Replay(events),
                    settle,
                    live: None,
                    tally: Tally::default(),
                    queued: None,
                },
            ));
        }
        let cache_status = match cache_key {
            Some(_) => CacheStatus::Miss,
            None => CacheStatus::Bypass,
        };
        metrics::counter!("zl_frontend_cache_total", "result" => cache_status.as_str()).increment(1);
        let salt = zl_common::block_hash::cache_salt(&scope);
        // Every request runs seeded, so a worker that fails mid-answer can be replaced by one that continues it
        // exactly (migration.rs): the client's seed, or one drawn here (and audited).
        let seed = p.sampling.seed.unwrap_or_else(migration::fresh_seed);
        let routed = Instant::now();
        let (decision, source, first, route_time, migration) =
            match self.route_and_open(&p, &billing_input, salt, seed, opts, request_id).await {
                Ok(ok) => ok,
                Err(e) => return Err(Failure::known(e, rate)),
            };
        settle.started = true;
        settle.spent.adapter = decision.adapter.as_ref().map(|a| (a.name.clone(), a.sha256));
        // A canary or a pin change may serve another version than the card's: its answer is stored, and audited,
        // as that version's.
        let served_weights = hex(&decision.weights_sha256);
        let served_adapter = decision.adapter.as_ref().map(|a| (a.name.as_str(), &a.sha256));
        let input_sha256 =
            if decision.model == p.card.model && served_weights == p.card.weights && served_adapter == synced_adapter {
                input_sha256
            } else {
                versioned(&decision.model, &served_weights, served_adapter)
            };
        let cache_key = cache_key.map(|_| input_sha256);
        let route_ms = route_time.as_secs_f64() * 1e3;
        let meta = Meta {
            // The model as the client named it when it runs through an adapter (the base is in the route reason).
            model: if decision.adapter.is_some() { p.model.clone() } else { decision.model.clone() },
            input_tokens,
            worker: decision.worker_id.to_string(),
            pool: decision.compute_pool.name(),
            predicted_billing_unit: decision.predicted_billing_unit,
            route_ms,
            route_reason: decision.reason.clone(),
            cache: cache_status,
            rate,
            weights_sha256: served_weights,
            input_sha256,
            orchestrator: decision.orchestrator_id.clone(),
            seed: Some(seed),
            adapter: decision.adapter.as_ref().map(|a| (a.name.clone(), hex(&a.sha256))),
        };
        let live = Live {
            worker: decision.worker_id,
            model: decision.model,
            first: Some(first),
            output: String::new(),
            delta_ends: cache_key.map(|_| Vec::new()),
            billing_input,
            cache_key,
            started: routed,
            last_token: None,
            output_tokens: 0,
            max_tokens: p.max_tokens,
            prompt_tokens: input_tokens,
            migration,
            migrated_to: Vec::new(),
            prompt_next: 1,
        };
        let generation = Generation {
            source: Source::Worker(source),
            settle,
            live: Some(live),
            tally: Tally::default(),
            queued: None,
        };
        Ok((meta, generation))
    }

    /// Route and open the worker stream, reading its first frame; if the worker fails before that, route once
    /// more without it. A streamed request opens on the worker's admission frame (so the client gets its headers
    /// and first event while the prompt is computed); a complete answer waits for the first token, so a worker
    /// that fails during the prefill is still replaced without the client seeing it.
    async fn route_and_open(
        &self,
        p: &Prepared,
        billing_input: &str,
        salt: zl_common::block_hash::BlockHash,
        seed: u64,
        opts: &RequestOptions,
        request_id: &str,
    ) -> Result<(RouteDecision, Box<dyn TokenSource>, Message, Duration, Migration), ApiError> {
        let input_semantic_weight = billing::input_semantic_weight(billing_input);
        // Salted with the request's cache scope, as the worker salts its prefix blocks: prefix-aware routing finds
        // this scope's cached prefixes, and no other scope's.
        // An adapter's prefixes chain from its own salt within the scope, as the worker stores them.
        let chain_salt = match &p.adapter {
            Some(a) => zl_common::block_hash::adapter_salt(Some(salt), adapter_key(&a.sha256)),
            None => salt,
        };
        let block_hashes = zl_common::block_hash::salted_block_hashes(
            &p.tokens,
            p.card.kv_block_size.max(1) as usize,
            Some(chain_salt),
        );
        // Workers this frontend just saw die stay out of its routes until the orchestrators notice too.
        let mut excluded: Vec<NodeId> = lock(&self.suspects).excluded(Instant::now());
        let mut attempt = 0;
        let mut route_time = Duration::ZERO;
        let mut route = RouteRequest {
            request_id: request_id.to_owned(),
            model: p.model.clone(),
            prompt_tokens: p.tokens.len() as u32,
            max_tokens: p.max_tokens,
            block_hashes,
            session_id: p.session_id.clone(),
            hint: opts.hint,
            input_semantic_weight,
            excluded_workers: Vec::new(),
            trace_id: opts.traceparent.clone(),
            prefer_fallback: p.prefer_fallback,
            project: p.project.clone(),
        };
        let template = GenerateRequest {
            request_id: request_id.to_owned(),
            trace_id: opts.traceparent.clone(),
            model: p.model.clone(),
            prompt: Prompt::Tokens(p.tokens.clone()),
            sampling: SamplingParams { seed: Some(seed), ..p.sampling.clone() },
            max_tokens: p.max_tokens,
            stop_sequences: p.stop_sequences.clone(),
            stream: true,
            logprobs: p.logprobs.is_some(),
            streaming_predicted: opts.streaming_predicted,
            grammar: p.grammar.clone(),
            cache_salt: salt,
            resume_tokens: vec![],
            adapter: None,
            top_logprobs: p.logprobs.map_or(0, |l| l.top),
            prompt_logprobs: p.logprobs.is_some_and(|l| l.prompt),
            think: p.think.clone(),
            penalties: p.penalties.clone(),
        };
        loop {
            attempt += 1;
            route.excluded_workers.clone_from(&excluded);
            let t0 = Instant::now();
            let decision = self.upstream.route(route.clone()).await.map_err(|e| {
                let err = ApiError::from_call(&e, "routing");
                if err.kind == ErrorKind::NotFound { self.cluster.not_found(&p.model) } else { err }
            })?;
            route_time += t0.elapsed();
            metrics::histogram!("zl_frontend_route_seconds").record(t0.elapsed().as_secs_f64());
            tracing::debug!(
                worker = %decision.worker_id,
                route_ms = t0.elapsed().as_secs_f64() * 1e3,
                reason = %decision.reason,
                "routed"
            );
            let request = GenerateRequest {
                model: decision.model.clone(),
                adapter: decision.adapter.clone(),
                ..template.clone()
            };
            let opened = migration::open_on(self, &decision.endpoint, &decision.worker_id, request, !p.stream)
                .await
                .and_then(|opened| {
                    opened.ok_or_else(|| CallError::Protocol("the worker ended the call without an answer".into()))
                });
            match opened {
                Ok((source, first)) => {
                    return Ok((decision, source, first, route_time, Migration::new(route, template)));
                }
                Err(e) if attempt == 1 && retry_elsewhere(&e) => {
                    self.note_failure(&decision.worker_id, &e);
                    metrics::counter!("zl_frontend_retries_total").increment(1);
                    tracing::warn!(worker = %decision.worker_id, error = %e, "worker failed before the first token; retrying on another");
                    excluded.push(decision.worker_id);
                }
                Err(e) => {
                    self.note_failure(&decision.worker_id, &e);
                    return Err(ApiError::from_call(&e, "the worker"));
                }
            }
        }
    }

    /// A call to `worker` failed with `e`: if the worker itself is gone (unreachable, or its connection died),
    /// route nothing more there from this frontend for a while.
    fn note_failure(&self, worker: &NodeId, e: &CallError) {
        if matches!(e, CallError::Connect { .. } | CallError::ConnectionLost(_)) {
            tracing::warn!(%worker, error = %e, "worker unreachable; excluded from this frontend's routes for a while");
            metrics::counter!("zl_frontend_worker_failures_total").increment(1);
            lock(&self.suspects).suspect(worker, Instant::now());
        }
    }

    fn finish_live(&self, live: &Live, finish: &FinishInfo) {
        let Some(key) = live.cache_key else { return };
        // A replay is served by the cache, not by the workers this answer moved between.
        let finish = FinishInfo { migrated_to: Vec::new(), ..finish.clone() };
        lock(&self.cache).insert(key, CachedAnswer { deltas: live.deltas(), finish, model: live.model.clone() });
        metrics::gauge!("zl_frontend_cache_bytes").set(lock(&self.cache).used() as f64);
    }
}

/// Whether a failure before the first token may be retried on another worker: the worker was unreachable, died,
/// is draining or overloaded, or failed internally. Request errors (bad input, context too long) are final.
fn retry_elsewhere(e: &CallError) -> bool {
    match e {
        CallError::Connect { .. } | CallError::ConnectionLost(_) | CallError::Cancelled(_) => true,
        CallError::Remote(w) => {
            matches!(
                w.code,
                ErrorCode::Unavailable | ErrorCode::Overloaded | ErrorCode::Internal | ErrorCode::DeadlineExceeded
            )
        }
        CallError::Protocol(_) | CallError::Encode(_) => false,
    }
}

/// A rate-limit refusal as the 429 the client gets (with its figures), counted.
#[allow(clippy::boxed_local)] // the limiter returns refusals boxed; taken as they come
fn refused(refusal: Box<Refusal>) -> Failure {
    metrics::counter!("zl_frontend_rate_limited_total", "dimension" => refusal.dimension).increment(1);
    let err = ApiError::new(ErrorKind::RateLimit, refusal.message)
        .retry_after(refusal.retry_after.as_secs_f64().ceil() as u64);
    Failure::known(err, refusal.figures)
}
