//! Migration: when the worker streaming an answer fails mid-request (its connection died, it answered a
//! retryable error, it ended the call without a finish, or it stopped producing frames past the stall bound),
//! the request goes on on another worker, resumed after the tokens already received. Sampling is a pure function
//! of (seed, position) and batch-invariant, and the new worker advances the grammar, detokenizer and stop matcher
//! over those tokens silently, so the continuation is exactly what the failed worker would have produced: the
//! client sees one uninterrupted answer. Every request has a seed for this (the frontend assigns one when the
//! client gave none: [`fresh_seed`]), and each migration is bounded (`--migration-limit` per request,
//! `--migration-max-tokens` held per request). Opening a worker's stream ([`open_on`]) is shared with the first
//! route.

use std::time::{Duration, Instant};

use zl_proto::CallError;
use zl_wire::message::{ErrorCode, GenerateRequest, Message, NodeId, RouteRequest, WireError};

use super::{Gateway, retry_elsewhere};
use crate::upstream::TokenSource;

/// What a request needs to go on elsewhere: how it was routed and asked for, and the tokens received so far.
pub(super) struct Migration {
    /// The route request (its excluded workers grow with each failure).
    route: RouteRequest,
    /// The generation request as first sent.
    request: GenerateRequest,
    /// The output tokens received, while within `--migration-max-tokens` (`None` past it: no migration then).
    tokens: Option<Vec<u32>>,
    /// Migrations so far.
    count: u32,
}

/// Why the worker streaming an answer is given up on.
#[derive(Debug)]
pub(super) enum Fault {
    /// The call failed.
    Call(CallError),
    /// The worker ended the call without a finish.
    Ended,
    /// No frame for longer than the stall bound after tokens had started.
    Stalled(Duration),
}

impl Fault {
    /// The `cause` label of `zl_frontend_migrations_total`.
    pub(super) fn cause(&self) -> &'static str {
        match self {
            Fault::Call(CallError::Connect { .. } | CallError::ConnectionLost(_) | CallError::Cancelled(_)) => {
                "connection_lost"
            }
            Fault::Call(CallError::Remote(w)) if w.code == ErrorCode::Unavailable => "unavailable",
            Fault::Call(_) => "worker_error",
            Fault::Ended => "ended",
            Fault::Stalled(_) => "stalled",
        }
    }

    /// Whether another worker may take the request over.
    fn movable(&self) -> bool {
        match self {
            Fault::Call(e) => retry_elsewhere(e),
            Fault::Ended | Fault::Stalled(_) => true,
        }
    }

    /// The fault as a call error (what the client is told when no migration is possible).
    pub(super) fn into_call_error(self) -> CallError {
        match self {
            Fault::Call(e) => e,
            Fault::Ended => CallError::Protocol("the worker ended the call without a finish".into()),
            Fault::Stalled(d) => CallError::Remote(WireError::new(
                ErrorCode::DeadlineExceeded,
                format!("the worker produced nothing for {:.1} s", d.as_secs_f64()),
            )),
        }
    }
}

impl Migration {
    /// A request routed with `route` and sent as `request`.
    pub(super) fn new(route: RouteRequest, request: GenerateRequest) -> Self {
        Migration { route, request, tokens: Some(Vec::new()), count: 0 }
    }

    /// Output tokens received from a worker; past `max_held` the request can no longer move.
    pub(super) fn received(&mut self, tokens: &[u32], max_held: usize) {
        if let Some(held) = self.tokens.as_mut() {
            if held.len() + tokens.len() > max_held {
                self.tokens = None;
            } else {
                held.extend_from_slice(tokens);
            }
        }
    }

    /// Take the request over from `failed` (which failed with `fault`) on another worker: route without every
    /// worker that failed it, ask the new one to resume after the tokens received, and return its stream with
    /// its first frame past the admission. Retried while the migration limit allows; `None` when it does not, the
    /// fault is final, or no worker takes it.
    pub(super) async fn reopen(
        &mut self,
        gateway: &Gateway,
        failed: &NodeId,
        fault: &Fault,
    ) -> Option<(NodeId, Box<dyn TokenSource>, Message)> {
        let limit = gateway.config.migration_limit;
        let tokens = self.tokens.clone()?;
        if !fault.movable() || self.count >= limit {
            return None;
        }
        let started = Instant::now();
        let mut failed = failed.clone();
        while self.count < limit {
            self.count += 1;
            self.route.excluded_workers.push(failed.clone());
            metrics::counter!("zl_frontend_migrations_total", "cause" => fault.cause()).increment(1);
            tracing::warn!(
                worker = %failed, cause = fault.cause(), tokens = tokens.len(), attempt = self.count,
                "the worker failed mid-request; resuming on another"
            );
            let decision = self.route_within(gateway, started).await?;
            let request = GenerateRequest {
                model: decision.model.clone(),
                resume_tokens: tokens.clone(),
                adapter: decision.adapter.clone(),
                // The prompt's log-probabilities all came before the first output token: asked again only when
                // none had come (the client is given each position once).
                prompt_logprobs: self.request.prompt_logprobs && tokens.is_empty(),
                ..self.request.clone()
            };
            match open(gateway, &decision.endpoint, &decision.worker_id, request).await {
                Ok((source, first)) => {
                    metrics::histogram!("zl_frontend_migration_seconds").record(started.elapsed().as_secs_f64());
                    metrics::counter!("zl_frontend_migrated_tokens_total").increment(tokens.len() as u64);
                    return Some((decision.worker_id, source, first));
                }
                Err(e) => {
                    gateway.note_failure(&decision.worker_id, &e);
                    tracing::warn!(worker = %decision.worker_id, error = %e, "resuming failed there too");
                    if !retry_elsewhere(&e) {
                        return None;
                    }
                    failed = decision.worker_id;
                }
            }
        }
        None
    }
}

impl Migration {
    /// A route to resume on. While none can take the request (`Overloaded`: the only worker died, or every other
    /// is excluded), ask again every [`WAIT_STEP`] until `--migration-wait` from `started`, no worker excluded: a
    /// dead worker's replacement (a new process, usually under the same id) is as good as any.
    async fn route_within(&mut self, gateway: &Gateway, started: Instant) -> Option<zl_wire::message::RouteDecision> {
        let wait = gateway.config.migration_wait;
        loop {
            match gateway.upstream.route(self.route.clone()).await {
                Ok(d) => return Some(d),
                Err(CallError::Remote(w))
                    if w.code == ErrorCode::Overloaded && started.elapsed() + WAIT_STEP < wait =>
                {
                    metrics::counter!("zl_frontend_migration_waits_total").increment(1);
                    tracing::info!(error = %w, "no worker to resume on yet; waiting for one");
                    self.route.excluded_workers.clear();
                    tokio::time::sleep(WAIT_STEP).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no route to resume on");
                    return None;
                }
            }
        }
    }
}

/// Between two routes of a migration that waits for a worker.
const WAIT_STEP: Duration = Duration::from_millis(250);

/// Open the generation on `worker` at `endpoint`: its stream and first frame past the admission (a worker that
/// ends the call without one is taken as lost, so the next is tried).
async fn open(
    gateway: &Gateway,
    endpoint: &str,
    worker: &NodeId,
    request: GenerateRequest,
) -> Result<(Box<dyn TokenSource>, Message), CallError> {
    open_on(gateway, endpoint, worker, request, true)
        .await?
        .ok_or_else(|| CallError::ConnectionLost("the worker ended the call without an answer".into()))
}

/// Open `request` on the worker at `endpoint` and read its first frame (past the admission frame when
/// `past_admission`: a complete answer waits for its first token). The endpoint must be `worker`, as routed:
/// another node answering there (a stale address, an impostor with its tier's certificate) gets no prompt's
/// answer trusted. `Ok(None)`: the worker ended the call without a frame.
pub(super) async fn open_on(
    gateway: &Gateway,
    endpoint: &str,
    worker: &NodeId,
    request: GenerateRequest,
    past_admission: bool,
) -> Result<Option<(Box<dyn TokenSource>, Message)>, CallError> {
    let mut source = gateway.upstream.generate(endpoint.to_owned(), request).await?;
    if let Some(found) = source.worker_id().filter(|id| id != worker) {
        metrics::counter!("zl_frontend_worker_mismatches_total").increment(1);
        return Err(CallError::Remote(WireError::new(
            ErrorCode::Unavailable,
            format!("the worker at {endpoint} is {found}, not {worker} as routed"),
        )));
    }
    loop {
        match source.next().await {
            Some(Ok(Message::TokenChunk(c))) if past_admission && c.is_admission() => {}
            Some(Ok(first)) => return Ok(Some((source, first))),
            Some(Err(e)) => return Err(e),
            None => return Ok(None),
        }
    }
}

/// A seed for a request whose client gave none (from the system's random source; a clock-derived one if that
/// fails, which it does not on any supported system).
pub(super) fn fresh_seed() -> u64 {
    let mut bytes = [0u8; 8];
    match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => crate::ids::unix_now().rotate_left(17) ^ u64::from(std::process::id()),
    }
}
