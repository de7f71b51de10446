//! A running generation: the events of one answer, from the response cache or streamed from a worker, with
//! the bookkeeping that follows them (time to first token, inter-token latency, the billing unit at the finish,
//! the cache entry, the rate-limit settlement however the answer ends, noting a worker that failed, and moving
//! the request to another worker when its worker fails mid-answer: `migration.rs`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use zl_common::billing::{self, Signals};
use zl_common::sync::lock;
use zl_wire::message::{Message, NodeId};

use super::admission::Holds;
use super::migration::{Fault, Migration};
use super::{Gateway, GenEvent};
use crate::cache::FinishInfo;
use crate::error::ApiError;
use crate::events::{Delivered, Logprobs, Tally};
use crate::ledger::Spent;
use crate::limits::Reservation;
use crate::upstream::TokenSource;

/// Gives back a request's unused rate-limit reservation and budget hold, and counts its usage, when it ends,
/// however it ends.
pub(super) struct Settle {
    pub(super) gateway: Arc<Gateway>,
    pub(super) reservation: Option<Reservation>,
    pub(super) output_tokens: u32,
    pub(super) holds: Holds,
    /// The usage to count (output tokens and units filled in as they come).
    pub(super) spent: Spent,
    /// A worker (or the cache) took the request: its usage counts. Before that only holds are given back.
    pub(super) started: bool,
}

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            let mut limiter = lock(&self.gateway.limiter);
            match self.started {
                true => limiter.settle(&r, self.output_tokens, Instant::now()),
                false => limiter.release(&r, Instant::now()),
            }
        }
        self.spent.output_tokens = u64::from(self.output_tokens);
        let now = crate::ids::unix_now();
        let mut ledger = lock(&self.gateway.reporter.ledger);
        match self.started {
            true => ledger.settle(&self.spent, self.holds.budget.as_ref(), now),
            false => ledger.release(self.holds.budget.as_ref()),
        }
        ledger.settle_rates(&self.holds.rates, self.started.then_some(&self.spent));
    }
}

pub(super) enum Source {
    Replay(VecDeque<GenEvent>),
    Worker(Box<dyn TokenSource>),
}

pub(super) struct Live {
    /// The worker streaming the answer.
    pub(super) worker: NodeId,
    pub(super) model: String,
    pub(super) first: Option<Message>,
    /// The text so far, and (for a cacheable answer) where each delta ended in it.
    pub(super) output: String,
    pub(super) delta_ends: Option<Vec<usize>>,
    pub(super) billing_input: String,
    pub(super) cache_key: Option<[u8; 32]>,
    pub(super) started: Instant,
    pub(super) last_token: Option<Instant>,
    pub(super) output_tokens: u32,
    /// What the request allowed: a worker's usage is never taken above it (a faulty or hostile worker cannot
    /// charge a key or budget more than the request could cost).
    pub(super) max_tokens: u32,
    pub(super) prompt_tokens: u32,
    /// How to go on elsewhere if the worker fails.
    pub(super) migration: Migration,
    /// The workers the request moved to, in order.
    pub(super) migrated_to: Vec<String>,
    /// The next prompt position whose log-probability the client has not had (a worker retried or resumed on
    /// sends them again from the start).
    pub(super) prompt_next: u32,
}

impl Live {
    /// The deltas as the worker sent them (for the cache).
    pub(super) fn deltas(&self) -> Vec<String> {
        let ends = self.delta_ends.as_deref().unwrap_or_default();
        let starts = std::iter::once(0).chain(ends.iter().copied());
        starts.zip(ends).map(|(a, &b)| self.output[a..b].to_owned()).collect()
    }
}

/// A running generation. Dropping it (the client went away) cancels the worker's sequence.
pub struct Generation {
    pub(super) source: Source,
    pub(super) settle: Settle,
    pub(super) live: Option<Live>,
    /// What it delivered, if it ends without a finish.
    pub(super) tally: Tally,
    /// An event to give before reading on (a chunk's text after its log-probabilities).
    pub(super) queued: Option<GenEvent>,
}

impl Drop for Generation {
    fn drop(&mut self) {
        // Before `settle` (a field, dropped after this) counts the usage.
        self.end_early(DISCONNECTED);
    }
}

/// Why an answer ended early: its client (or the server, shutting down) dropped it.
const DISCONNECTED: &str = "client_disconnected";

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation").finish_non_exhaustive()
    }
}

impl Generation {
    /// Where this generation leaves what it delivered if it ends without a finish (for the audit record).
    pub fn tally(&self) -> Tally {
        self.tally.clone()
    }

    /// The answer ends without its finish (`reason`): bill and count what was delivered, from the text and tokens
    /// the worker sent, exactly as a finish would have.
    fn end_early(&mut self, reason: &'static str) {
        let Some(mut live) = self.live.take() else { return };
        let output_tokens = self.settle.output_tokens;
        let unit = charge(&mut self.settle, &live, output_tokens);
        metrics::counter!("zl_frontend_ended_early_total", "reason" => reason).increment(1);
        let migrated_to = std::mem::take(&mut live.migrated_to);
        self.tally.set(Delivered { output_tokens, billing_unit: unit, stop_reason: reason, migrated_to });
    }

    /// The next event; `None` after the finish. An error ends the generation. Frames without text (the worker's
    /// admission frame, tokens whose text is still pending) are not events.
    pub async fn next(&mut self) -> Option<Result<GenEvent, ApiError>> {
        loop {
            if let Some(ev) = self.queued.take().filter(|ev| !matches!(ev, GenEvent::Delta(t) if t.is_empty())) {
                return Some(Ok(ev));
            }
            match self.next_frame().await {
                Some(Ok(GenEvent::Delta(text))) if text.is_empty() => {}
                other => return other,
            }
        }
    }

    async fn next_frame(&mut self) -> Option<Result<GenEvent, ApiError>> {
        let gateway = self.settle.gateway.clone();
        let msg = loop {
            let source = match &mut self.source {
                Source::Replay(events) => {
                    let ev = events.pop_front()?;
                    if let GenEvent::Finish(f) = &ev {
                        self.settle.output_tokens = f.output_tokens;
                        self.settle.spent.milli_units = milli(f.billing_unit);
                    }
                    return Some(Ok(ev));
                }
                Source::Worker(source) => source,
            };
            let live = self.live.as_mut()?;
            let got = match live.first.take() {
                Some(first) => Ok(first),
                None => read(source.as_mut(), live.last_token.is_some(), gateway.config.stall_timeout).await,
            };
            let fault = match got {
                Ok(msg) => break Ok(msg),
                Err(fault) => fault,
            };
            // The worker failed mid-answer: go on on another, after the tokens already received.
            if let Fault::Call(e) = &fault {
                gateway.note_failure(&live.worker, e);
            }
            match live.migration.reopen(&gateway, &live.worker, &fault).await {
                Some((worker, source, first)) => {
                    live.migrated_to.push(worker.to_string());
                    live.worker = worker;
                    live.first = Some(first);
                    self.source = Source::Worker(source);
                }
                None => break Err(fault.into_call_error()),
            }
        };
        let live = self.live.as_mut()?;
        match msg {
            // The worker's admission frame: the request is queued there; its first token is still to come.
            Ok(Message::TokenChunk(chunk)) if chunk.is_admission() => Some(Ok(GenEvent::Delta(String::new()))),
            Ok(Message::TokenChunk(chunk)) if chunk.prompt_start.is_some() => Some(Ok(
                prompt_logprobs(live, chunk).map_or_else(|| GenEvent::Delta(String::new()), GenEvent::Logprobs)
            )),
            Ok(Message::TokenChunk(mut chunk)) => {
                let now = Instant::now();
                let n = chunk.token_ids.len() as u32;
                match live.last_token {
                    None => metrics::histogram!("zl_frontend_ttft_seconds", "model" => live.model.clone())
                        .record(now.duration_since(live.started).as_secs_f64()),
                    Some(prev) if n > 0 => {
                        metrics::histogram!("zl_frontend_itl_seconds", "model" => live.model.clone())
                            .record(now.duration_since(prev).as_secs_f64() / f64::from(n))
                    }
                    Some(_) => {}
                }
                live.last_token = Some(now);
                live.migration.received(&chunk.token_ids, self.settle.gateway.config.migration_max_tokens);
                live.output_tokens = live.output_tokens.saturating_add(n);
                self.settle.output_tokens = live.output_tokens.min(live.max_tokens);
                live.output.push_str(&chunk.text_delta);
                if let Some(ends) = live.delta_ends.as_mut() {
                    ends.push(live.output.len());
                }
                // The prompt's log-probabilities all come before the first output token.
                live.prompt_next = u32::MAX;
                match chunk.logprobs.take() {
                    Some(logprobs) => {
                        self.queued = Some(GenEvent::Delta(chunk.text_delta));
                        let top = std::mem::take(&mut chunk.top);
                        let tokens = chunk.token_ids;
                        Some(Ok(GenEvent::Logprobs(Logprobs { prompt_start: None, tokens, logprobs, top })))
                    }
                    None => Some(Ok(GenEvent::Delta(chunk.text_delta))),
                }
            }
            Ok(Message::Finish(mut f)) => {
                let (input, output) = (f.usage.input_tokens, f.usage.output_tokens.max(live.output_tokens));
                if input > live.prompt_tokens || output > live.max_tokens {
                    metrics::counter!("zl_frontend_usage_capped_total").increment(1);
                    tracing::warn!(
                        worker = %live.worker,
                        input, output, prompt = live.prompt_tokens, max_tokens = live.max_tokens,
                        "a worker reported more usage than the request allowed; capped"
                    );
                }
                f.usage.input_tokens = input.min(live.prompt_tokens);
                f.usage.output_tokens = f.usage.output_tokens.min(live.max_tokens);
                f.usage.cached_input_tokens = f.usage.cached_input_tokens.min(f.usage.input_tokens);
                let unit = charge(&mut self.settle, live, f.usage.output_tokens);
                let finish = FinishInfo {
                    stop_reason: f.stop_reason,
                    stop_sequence: f.stop_sequence,
                    input_tokens: f.usage.input_tokens,
                    output_tokens: f.usage.output_tokens,
                    cached_input_tokens: f.usage.cached_input_tokens,
                    billing_unit: unit,
                    draft_tokens: f.usage.draft_tokens,
                    accepted_draft_tokens: f.usage.accepted_draft_tokens,
                    migrated_to: std::mem::take(&mut live.migrated_to),
                };
                self.settle.gateway.finish_live(live, &finish);
                self.live = None;
                Some(Ok(GenEvent::Finish(finish)))
            }
            Ok(other) => {
                self.end_early(ERROR);
                Some(Err(ApiError::internal(format!("the worker sent an unexpected {} frame", other.kind()))))
            }
            Err(e) => {
                self.end_early(ERROR);
                Some(Err(ApiError::from_call(&e, "the worker failed during the generation")))
            }
        }
    }

    /// Every event until the end: the text, the log-probabilities reported, and the finish (or the error that
    /// ended it).
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let mut text = String::new();
        let mut logprobs = Vec::new();
        while let Some(ev) = self.next().await {
            match ev? {
                GenEvent::Delta(d) => text.push_str(&d),
                GenEvent::Logprobs(l) => logprobs.push(l),
                GenEvent::Finish(finish) => return Ok(Collected { text, logprobs, finish }),
            }
        }
        Err(ApiError::internal("the generation ended without a finish"))
    }
}

/// A whole answer.
#[derive(Debug)]
pub struct Collected {
    /// Its text.
    pub text: String,
    /// The log-probabilities reported (the prompt's first, then the output's), when asked for.
    pub logprobs: Vec<Logprobs>,
    /// How it ended.
    pub finish: FinishInfo,
}

/// A chunk of the prompt's log-probabilities, less the positions the client already has (a worker retried or
/// resumed on sends them again); `None` when nothing is new.
fn prompt_logprobs(live: &mut Live, chunk: zl_wire::message::TokenChunk) -> Option<Logprobs> {
    let start = chunk.prompt_start?;
    let k = chunk.top_per_token();
    let skip = live.prompt_next.saturating_sub(start) as usize;
    if skip >= chunk.token_ids.len() {
        return None;
    }
    live.prompt_next = start + chunk.token_ids.len() as u32;
    Some(Logprobs {
        prompt_start: Some(start + skip as u32),
        tokens: chunk.token_ids[skip..].to_vec(),
        logprobs: chunk.logprobs.unwrap_or_default().get(skip..).unwrap_or_default().to_vec(),
        top: chunk.top.get(skip * k..).unwrap_or_default().to_vec(),
    })
}

/// Why an answer ended early: the worker failed and no other could continue it.
const ERROR: &str = "error";

/// The worker's next frame. Once tokens have started (`started`), silence past `stall` is a failure: the
/// connection of a stopped process fails on its own within seconds, a wedged device's does not.
async fn read(source: &mut dyn TokenSource, started: bool, stall: std::time::Duration) -> Result<Message, Fault> {
    let next = if started {
        match tokio::time::timeout(stall, source.next()).await {
            Ok(next) => next,
            Err(_) => return Err(Fault::Stalled(stall)),
        }
    } else {
        source.next().await
    };
    match next {
        Some(Ok(msg)) => Ok(msg),
        Some(Err(e)) => Err(Fault::Call(e)),
        None => Err(Fault::Ended),
    }
}

/// Charge an answer that ended (with its finish or without) for `output_tokens` and the billing unit of the text
/// `live` delivered; returns the unit.
fn charge(settle: &mut Settle, live: &Live, output_tokens: u32) -> f32 {
    let signals = Signals::measure(&live.billing_input, &live.output);
    let unit = billing::billing_unit(&settle.gateway.cluster.billing_weights(), &signals);
    settle.output_tokens = output_tokens;
    settle.spent.milli_units = milli(unit);
    metrics::counter!("zl_frontend_output_tokens_total", "model" => live.model.clone())
        .increment(u64::from(output_tokens));
    metrics::histogram!("zl_frontend_billing_unit").record(f64::from(unit));
    unit
}

/// A billing unit in thousandths.
pub(super) fn milli(unit: f32) -> u64 {
    (f64::from(unit.clamp(0.0, 1.0)) * 1000.0).round() as u64
}
