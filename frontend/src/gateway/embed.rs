//! An embeddings request's path: the same gateway as a generation's (the degradation level, the card, the key's
//! rate limits, the shared limits and the project's budget, a route, a retry on another worker when the first
//! fails before answering), with input tokens only: nothing is generated, so no output is reserved or billed.
//! Every input is tokenized here as the worker's card says (a document's special tokens included) and checked
//! against the model's context before anything is routed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use zl_common::billing::{self, Signals};
use zl_common::keys::hex;
use zl_common::sync::lock;
use zl_wire::message::{EmbedRequest, RouteRequest};

use super::generation::{Settle, milli};
use super::{Gateway, RequestOptions, refused, retry_elsewhere};
use crate::cluster::KeyInfo;
use crate::embeddings::{EmbedInput, EmbedJob};
use crate::error::{ApiError, ErrorKind, Failure};
use crate::events::{CacheStatus, Meta};
use crate::ledger::Spent;

/// An embeddings answer and what the response headers, the audit record and the usage need of it.
#[derive(Debug)]
pub struct Embedded {
    /// Routing figures.
    pub meta: Meta,
    /// One unit vector per input, in order, as the model made them (before `dimensions`).
    pub vectors: Vec<Vec<f32>>,
    /// The billing unit of the inputs' text.
    pub billing_unit: f32,
}

impl Gateway {
    /// Embed `job`'s inputs for `key`. Refusals come back with the caller's rate figures.
    pub async fn embed(
        self: &Arc<Self>,
        key: &KeyInfo,
        job: &EmbedJob,
        opts: &RequestOptions,
        request_id: &str,
    ) -> Result<Embedded, Failure> {
        let known = |e: ApiError| Failure::known(e, self.rate_figures(key));
        self.shed(key).map_err(known)?;
        let text = job.text();
        if self.config.max_prompt_bytes > 0 && text.len() > self.config.max_prompt_bytes {
            return Err(known(ApiError::invalid_param(
                "input",
                format!(
                    "input is too long: {} bytes of text > {} byte limit",
                    text.len(),
                    self.config.max_prompt_bytes
                ),
            )));
        }
        let card = self.cluster.card(self.upstream.as_ref(), &job.model, request_id).await.map_err(known)?;
        let dims = card.embedding_dims as usize;
        if dims == 0 {
            return Err(known(ApiError::invalid_param(
                "model",
                format!(
                    "model: {} generates text and has no embeddings; /v1/embeddings needs an embedding model (a \
                     BERT-family file, or one whose GGUF names a pooling type)",
                    card.model
                ),
            )));
        }
        if let Some(d) = job.dimensions.filter(|&d| d > dims) {
            return Err(known(ApiError::invalid_param(
                "dimensions",
                format!("dimensions: {d} is more than the {dims} of {}'s vectors", card.model),
            )));
        }
        let (inputs, sanitize) = (job.inputs.clone(), self.config.sanitize);
        let work = card.clone();
        let tokens: Vec<Vec<u32>> = self
            .off_thread(move || {
                inputs
                    .into_iter()
                    .map(|i| match i {
                        EmbedInput::Tokens(t) => Ok(t),
                        EmbedInput::Text(t) => {
                            let t = if sanitize { crate::sanitize::sanitize(&t).0 } else { t };
                            work.tokenizer
                                .encode_document(&t)
                                .map_err(|e| ApiError::internal(format!("tokenizing the input failed: {e}")))
                        }
                    })
                    .collect()
            })
            .await
            .map_err(known)?;
        let (context, vocab) = (card.context_length as usize, card.tokenizer.vocab_size() as u32);
        for (i, t) in tokens.iter().enumerate() {
            if t.len() > context {
                return Err(known(ApiError::invalid_param(
                    "input",
                    format!(
                        "input {i} has {} tokens, more than the {context}-token context of {}",
                        t.len(),
                        card.model
                    ),
                )));
            }
            if let Some(bad) = t.iter().find(|&&id| id >= vocab) {
                return Err(known(ApiError::invalid_param(
                    "input",
                    format!("input {i}: token id {bad} is outside the vocabulary of {vocab}"),
                )));
            }
        }
        let total: usize = tokens.iter().map(Vec::len).sum();
        if total > zl_wire::message::MAX_EMBED_TOKENS {
            return Err(known(ApiError::invalid_param(
                "input",
                format!("{total} tokens in one request; at most {}", zl_wire::message::MAX_EMBED_TOKENS),
            )));
        }
        let input_tokens = total as u32;
        // Admission: the key's limits and the project's budget, for the inputs only.
        let (limits, quota) = self.limits_for(key);
        let admitted = self.limiter().admit(&key.key_id, &key.project, limits, quota, input_tokens, 0, Instant::now());
        let (reservation, rate) = admitted.map_err(refused)?;
        let mut settle = Settle {
            gateway: self.clone(),
            reservation: Some(reservation),
            output_tokens: 0,
            holds: Default::default(),
            spent: Spent {
                key_id: key.key_id.clone(),
                project: key.project.clone(),
                input_tokens: u64::from(input_tokens),
                ..Spent::default()
            },
            started: false,
        };
        settle.holds =
            self.reserve_leases(key, u64::from(input_tokens), 0).await.map_err(|e| Failure::known(e, rate))?;
        let rate = self.shared_figures(key, rate);
        let mut route = RouteRequest {
            request_id: request_id.to_owned(),
            model: job.model.clone(),
            prompt_tokens: input_tokens,
            max_tokens: 0,
            block_hashes: vec![],
            session_id: job.user.clone(),
            hint: opts.hint,
            input_semantic_weight: billing::input_semantic_weight(&text),
            excluded_workers: lock(&self.suspects).excluded(Instant::now()),
            trace_id: opts.traceparent.clone(),
            prefer_fallback: false,
            project: key.project.clone(),
        };
        let mut route_time = Duration::ZERO;
        let mut attempt = 0;
        let (decision, answer) = loop {
            attempt += 1;
            let t0 = Instant::now();
            let decision = self.upstream.route(route.clone()).await.map_err(|e| {
                let err = ApiError::from_call(&e, "routing");
                let err = if err.kind == ErrorKind::NotFound { self.cluster.not_found(&job.model) } else { err };
                Failure::known(err, rate)
            })?;
            route_time += t0.elapsed();
            metrics::histogram!("zl_frontend_route_seconds").record(t0.elapsed().as_secs_f64());
            let request = EmbedRequest {
                request_id: request_id.to_owned(),
                trace_id: opts.traceparent.clone(),
                model: decision.model.clone(),
                inputs: tokens.clone(),
            };
            match self.upstream.embed(decision.endpoint.clone(), request).await {
                Ok(answer) => break (decision, answer),
                // Once, as a generation that fails before its first token is retried.
                Err(e) if attempt == 1 && retry_elsewhere(&e) => {
                    self.note_failure(&decision.worker_id, &e);
                    metrics::counter!("zl_frontend_retries_total").increment(1);
                    tracing::warn!(worker = %decision.worker_id, error = %e, "embedding failed before answering; retrying on another worker");
                    route.excluded_workers.push(decision.worker_id);
                }
                Err(e) => {
                    self.note_failure(&decision.worker_id, &e);
                    return Err(Failure::known(ApiError::from_call(&e, "the worker"), rate));
                }
            }
        };
        if answer.vectors.iter().any(|v| v.len() != dims) {
            let e = ApiError::internal(format!("the worker's vectors are not {dims} wide, as the model's card says"));
            return Err(Failure::known(e, rate));
        }
        settle.started = true;
        let billing_unit = billing::billing_unit(&self.cluster.billing_weights(), &Signals::measure(&text, ""));
        settle.spent.milli_units = milli(billing_unit);
        metrics::counter!("zl_frontend_embedded_inputs_total", "model" => decision.model.clone())
            .increment(answer.vectors.len() as u64);
        metrics::counter!("zl_frontend_embedded_tokens_total", "model" => decision.model.clone())
            .increment(u64::from(input_tokens));
        let meta = Meta {
            model: decision.model.clone(),
            input_tokens,
            worker: decision.worker_id.to_string(),
            pool: decision.compute_pool.name(),
            predicted_billing_unit: decision.predicted_billing_unit,
            route_ms: route_time.as_secs_f64() * 1e3,
            route_reason: decision.reason.clone(),
            cache: CacheStatus::Bypass,
            rate,
            weights_sha256: hex(&decision.weights_sha256),
            input_sha256: input_digest(&decision.model, &decision.weights_sha256, &tokens),
            orchestrator: decision.orchestrator_id.clone(),
            seed: None,
            adapter: None,
        };
        Ok(Embedded { meta, vectors: answer.vectors, billing_unit })
    }
}

/// The SHA-256 of what decides an embeddings answer: the model, its version and every input's tokens.
fn input_digest(model: &str, weights: &[u8; 32], inputs: &[Vec<u32>]) -> [u8; 32] {
    let mut d = ring::digest::Context::new(&ring::digest::SHA256);
    d.update(b"embeddings\0");
    d.update(model.as_bytes());
    d.update(b"\0");
    d.update(weights);
    for input in inputs {
        d.update(&(input.len() as u64).to_le_bytes());
        input.iter().for_each(|t| d.update(&t.to_le_bytes()));
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(d.finish().as_ref());
    out
}
