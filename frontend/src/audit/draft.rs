//! What one request's audit record says, gathered as the request goes: who asked (at authentication), what ran
//! where (when it was routed), what came out (each event), and how it ended (when the response is done).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use zl_common::audit::{AuditRecord, BILLING_FORMULA_VERSION, Payload};
use zl_common::billing::BillingWeights;
use zl_common::keys::hex;

use super::AuditLog;
use crate::cluster::KeyInfo;
use crate::error::ApiError;
use crate::events::{CacheStatus, Delivered, GenEvent, Meta};

/// A project's data key for content logging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentKey {
    /// Its id (named in each sealed payload).
    pub key_id: String,
    /// 32 bytes.
    pub key: Vec<u8>,
}

/// One request's record in the making.
pub struct Draft {
    record: AuditRecord,
    started: Instant,
    output: ring::digest::Context,
    /// With content logging: the key, the prompt and the answer so far.
    content: Option<(ContentKey, String, String)>,
}

impl std::fmt::Debug for Draft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Draft").field("request_id", &self.record.request_id).finish_non_exhaustive()
    }
}

impl Draft {
    /// A request from `key` arrived at `started`.
    pub fn new(key: &KeyInfo, request_id: &str, trace_id: &str, started: Instant, content: Option<ContentKey>) -> Self {
        let arrived = SystemTime::now() - started.elapsed();
        let record = AuditRecord {
            time_ms: arrived.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            request_id: request_id.to_owned(),
            trace_id: trace_id.to_owned(),
            key_id: key.key_id.clone(),
            project: key.project.clone(),
            billing_formula: BILLING_FORMULA_VERSION,
            ..AuditRecord::default()
        };
        Draft {
            record,
            started,
            output: ring::digest::Context::new(&ring::digest::SHA256),
            content: content.map(|k| (k, String::new(), String::new())),
        }
    }

    /// The record of another choice of the same request (OpenAI's `n`, several prompts), under `request_id`: who
    /// asked and when, as this one says; nothing of its answer yet.
    pub fn choice(&self, request_id: &str) -> Draft {
        let record = AuditRecord { request_id: request_id.to_owned(), ..self.record.clone() };
        Draft {
            record,
            started: self.started,
            output: ring::digest::Context::new(&ring::digest::SHA256),
            content: self.content.as_ref().map(|(k, _, _)| (k.clone(), String::new(), String::new())),
        }
    }

    /// The model the client asked for (a refusal names it; a routed request names the concrete model).
    pub fn requested(&mut self, model: &str) {
        if self.record.model.is_empty() {
            self.record.model = model.to_owned();
        }
    }

    /// A `count_tokens` call counted `input_tokens` (nothing was routed or generated).
    pub fn counted(&mut self, input_tokens: u32) {
        self.record.input_tokens = input_tokens;
    }

    /// Whether the prompt text is wanted (content logging is on).
    pub fn wants_content(&self) -> bool {
        self.content.is_some()
    }

    /// The request was started: routed to a worker (or answered from the cache). `prompt` is the rendered
    /// prompt, given when [`Draft::wants_content`].
    pub fn started(&mut self, meta: &Meta, prompt: Option<String>) {
        let r = &mut self.record;
        r.model.clone_from(&meta.model);
        r.weights_sha256 = meta.weights_sha256.clone();
        r.input_sha256 = hex(&meta.input_sha256);
        r.worker = meta.worker.clone();
        r.seed = meta.seed;
        if let Some((name, sha)) = &meta.adapter {
            r.adapter.clone_from(name);
            r.adapter_sha256.clone_from(sha);
        }
        r.orchestrator = meta.orchestrator.clone();
        r.input_tokens = meta.input_tokens;
        r.route_ms = meta.route_ms;
        r.cache_hit = meta.cache == CacheStatus::Hit;
        if let (Some((_, p, _)), Some(prompt)) = (self.content.as_mut(), prompt) {
            *p = prompt;
        }
    }

    /// An event of the answer.
    pub fn event(&mut self, ev: &GenEvent) {
        match ev {
            GenEvent::Delta(text) => {
                if self.record.ttft_ms == 0.0 && !text.is_empty() {
                    self.record.ttft_ms = self.started.elapsed().as_secs_f64() * 1e3;
                }
                self.output.update(text.as_bytes());
                if let Some((_, _, out)) = self.content.as_mut() {
                    out.push_str(text);
                }
            }
            GenEvent::Finish(f) => {
                let r = &mut self.record;
                r.input_tokens = f.input_tokens;
                r.output_tokens = f.output_tokens;
                r.billing_unit = f.billing_unit;
                r.stop_reason = f.stop_reason.name().to_owned();
                r.migrated_to.clone_from(&f.migrated_to);
            }
            // The record keeps the answer's digest and counts, not its log-probabilities.
            GenEvent::Logprobs(_) => {}
        }
    }

    /// An embeddings answer was delivered: its vectors (as little-endian f32, in order) are the output the record's
    /// digest covers.
    pub fn embedded(&mut self, vectors: &[Vec<f32>], billing_unit: f32) {
        if self.record.ttft_ms == 0.0 {
            self.record.ttft_ms = self.started.elapsed().as_secs_f64() * 1e3;
        }
        for x in vectors.iter().flatten() {
            self.output.update(&x.to_le_bytes());
        }
        self.record.billing_unit = billing_unit;
        self.record.stop_reason = "embedded".to_owned();
    }

    /// The answer ended without its finish, after delivering `d` (its usage is billed as it is counted).
    pub fn delivered(&mut self, d: &Delivered) {
        let r = &mut self.record;
        r.output_tokens = d.output_tokens;
        r.billing_unit = d.billing_unit;
        r.stop_reason = d.stop_reason.to_owned();
        r.migrated_to.clone_from(&d.migrated_to);
    }

    /// The request failed (before or during the answer).
    pub fn failed(&mut self, e: &ApiError) {
        self.record.error_type = e.kind.anthropic_type().to_owned();
        self.record.status = e.kind.status().as_u16();
    }

    /// The response is done: seal the content (if logged) and append the record.
    pub fn finish(mut self, log: &AuditLog, status: u16, weights: &BillingWeights) {
        let mut r = std::mem::take(&mut self.record);
        if r.status == 0 {
            r.status = status;
        }
        r.latency_ms = self.started.elapsed().as_secs_f64() * 1e3;
        r.billing_weights = [weights.input, weights.output, weights.context];
        r.output_sha256 = hex(self.output.finish().as_ref());
        if let Some((key, input, output)) = self.content.take()
            && !r.model.is_empty()
        {
            let mut nonce = [0u8; 12];
            if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce).is_ok() {
                let payload = Payload { input, output };
                r.payload = zl_common::audit::seal(&payload, &key.key_id, &key.key, nonce, &r.request_id).ok();
            }
        }
        log.append(r);
    }
}
