//! The tiers behind a client of the cluster: ask an orchestrator for a route or for the state frontends cache,
//! ask a worker for a model card or a generation. [`QuicUpstream`] speaks the RPC (zl-proto) to the real tiers; tests
//! put a fake behind the same trait to run the HTTP router without sockets.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::embed::{Collector, Embedded};
use zl_common::sync::{lock, read, write};
use zl_proto::CallError;
use zl_proto::quic::{Client, ResponseStream};
use zl_wire::message::{
    EmbedRequest, ErrorCode, FrontendGrant, FrontendReport, GenerateRequest, Message, ModelCard, ModelCardRequest,
    NodeId, ResponseFound, ResponseLookup, Role, RouteDecision, RouteRequest, StateSync, StateSyncRequest,
    StoredResponse, WireError,
};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The responses of one generation: `TokenChunk`s then a `Finish`, or an error. Dropping it cancels the
/// generation on the worker (its KV blocks are freed at once).
pub trait TokenSource: Send {
    /// The next frame, `None` after the call ended.
    fn next(&mut self) -> BoxFuture<'_, Option<Result<Message, CallError>>>;

    /// The node id of the worker answering, as its certificate vouches for it (`None` when unknown).
    fn worker_id(&self) -> Option<NodeId> {
        None
    }
}

/// The tiers behind the frontend.
pub trait Upstream: Send + Sync + 'static {
    /// A route decision from some orchestrator (another one is tried if one is unreachable).
    fn route(&self, request: RouteRequest) -> BoxFuture<'_, Result<RouteDecision, CallError>>;
    /// The routing state frontends cache, from some orchestrator.
    fn sync(&self, known_index: u64) -> BoxFuture<'_, Result<StateSync, CallError>>;
    /// A model's card from the worker at `endpoint`.
    fn model_card(&self, endpoint: String, model: String) -> BoxFuture<'_, Result<ModelCard, CallError>>;
    /// Start a streaming generation on the worker at `endpoint`.
    fn generate(
        &self,
        endpoint: String,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Box<dyn TokenSource>, CallError>>;
    /// Embed a request's inputs on the worker at `endpoint` (an embedding model). Without an implementation no
    /// worker embeds.
    fn embed(&self, endpoint: String, request: EmbedRequest) -> BoxFuture<'_, Result<Embedded, CallError>> {
        let _ = (endpoint, request);
        Box::pin(async {
            Err(CallError::Remote(WireError::new(ErrorCode::Unavailable, "no worker embeds behind this upstream")))
        })
    }
    /// Store a Responses API response with some orchestrator (a Raft write); its applied index. Without an
    /// implementation nothing is stored.
    fn store_response(&self, response: StoredResponse) -> BoxFuture<'_, Result<u64, CallError>> {
        let _ = response;
        Box::pin(async {
            Err(CallError::Remote(WireError::new(ErrorCode::Unavailable, "no orchestrator stores responses")))
        })
    }
    /// Read or delete a stored response through some orchestrator.
    fn lookup_response(&self, lookup: ResponseLookup) -> BoxFuture<'_, Result<ResponseFound, CallError>> {
        let _ = lookup;
        Box::pin(async {
            Err(CallError::Remote(WireError::new(ErrorCode::Unavailable, "no orchestrator stores responses")))
        })
    }
    /// Send this frontend's report (usage, budget positions, audit head) to some orchestrator. Without an
    /// implementation there are no orchestrators to report to.
    fn report(&self, report: FrontendReport) -> BoxFuture<'_, Result<FrontendGrant, CallError>> {
        let _ = report;
        Box::pin(async {
            Err(CallError::Remote(WireError::new(ErrorCode::Unavailable, "no orchestrator takes reports")))
        })
    }
}

impl TokenSource for ResponseStream {
    fn next(&mut self) -> BoxFuture<'_, Option<Result<Message, CallError>>> {
        Box::pin(ResponseStream::next(self))
    }

    fn worker_id(&self) -> Option<NodeId> {
        Some(self.peer().node_id.clone())
    }
}

/// The protocol minor version from which workers apply `GenerateRequest.grammar`.
const GRAMMAR_MINOR: u16 = 3;
/// The protocol minor version from which workers resume after `GenerateRequest.resume_tokens`.
const RESUME_MINOR: u16 = 6;
/// The protocol minor version from which workers apply `GenerateRequest.adapter`.
const ADAPTER_MINOR: u16 = 8;
/// The first protocol minor with top log-probabilities and the prompt's, thinking budgets and penalties.
const SAMPLING_MINOR: u16 = 11;
/// The first protocol minor whose workers embed (`EmbedRequest`).
const EMBED_MINOR: u16 = 12;

/// The longest an embeddings call may take: a full request (2,048 inputs) of a large model on a CPU worker. A
/// killed or frozen worker fails its call far sooner (the connection's idle timeout, `rpc_settings`).
const EMBED_TIMEOUT: Duration = Duration::from_secs(600);

/// Per-call deadline for control calls to workers (model cards): a worker loading another model may take a few
/// seconds to answer, and a card is fetched once per model and cached.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Per-call deadline for orchestrator calls (routes, state syncs; answered in well under a millisecond): a dead or
/// hung orchestrator costs at most this before the next one is tried, so a request fails over within a second.
const ORCHESTRATOR_TIMEOUT: Duration = Duration::from_millis(800);

/// Per-call deadline for reports (a Raft commit).
const REPORT_TIMEOUT: Duration = Duration::from_secs(3);

/// When every orchestrator failed to route and at least one of them is alive, the group is changing under a rolling
/// restart or a scale-out: the round is tried again after these pauses, so a client's request outlives a moment when
/// no replica answers in time. Alive means it answered in this round ("ask another": it has just started and not
/// heard from the workers, or is joining its group), or it answered some call within [`ALIVE_WINDOW`] and now missed
/// the deadline or dropped the call (restarting, or starved on a loaded machine). Rounds where none is alive (all
/// down: killed, stopped, unreachable) fail at once with a retryable error. Only routes wait so: syncs and reports
/// run in loops that try again on their own schedule. (In CI, a route failed once in a few runs of the e2e test that
/// rolls the chart's orchestrators: every orchestrator of one round missed its deadline while one was down.)
const ROUND_PAUSES: [Duration; 3] =
    [Duration::from_millis(250), Duration::from_millis(500), Duration::from_millis(1000)];

/// How recent an orchestrator's last answer must be for a missed deadline to count as "alive but slow" rather than
/// down. Under load routes flow many times a second, and an idle frontend syncs once a second.
const ALIVE_WINDOW: Duration = Duration::from_secs(2);

/// The per-call deadline for an orchestrator whose last call failed and that has not answered since (a killed or
/// stopped one): still tried, so it is used again as soon as it is back, but briefly (a live one on loopback or in
/// a region answers a handshake and a route in tens of milliseconds).
const SUSPECT_TIMEOUT: Duration = Duration::from_millis(400);

/// What a frontend has seen of one orchestrator.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    /// When it last answered anything (a reply or a typed refusal).
    answered: Option<Instant>,
    /// Its last call failed (no connection, a lost one, a missed deadline).
    failed: bool,
}

/// The real tiers over QUIC.
pub struct QuicUpstream {
    client: Client,
    /// Fixed (`--orchestrator`), or the passing ones discovery lists.
    orchestrators: RwLock<Arc<[SocketAddr]>>,
    next: AtomicUsize,
    seen: Mutex<HashMap<SocketAddr, Seen>>,
}

impl std::fmt::Debug for QuicUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicUpstream").field("orchestrators", &self.orchestrators()).finish_non_exhaustive()
    }
}

async fn endpoint_addr(endpoint: &str) -> Result<SocketAddr, CallError> {
    if let Ok(addr) = endpoint.parse() {
        return Ok(addr);
    }
    let fail = |reason: String| CallError::Connect { peer: SocketAddr::from(([0, 0, 0, 0], 0)), reason };
    tokio::net::lookup_host(endpoint)
        .await
        .map_err(|e| fail(format!("cannot resolve {endpoint}: {e}")))?
        .next()
        .ok_or_else(|| fail(format!("{endpoint} resolves to no address")))
}

/// Whether another orchestrator may answer where this one failed: it was unreachable or too slow, never a typed
/// refusal (unknown model, overloaded), which every replica would repeat.
fn try_next_orchestrator(e: &CallError) -> bool {
    match e {
        CallError::Connect { .. } | CallError::ConnectionLost(_) | CallError::Cancelled(_) => true,
        CallError::Remote(w) => matches!(w.code, ErrorCode::DeadlineExceeded | ErrorCode::Unavailable),
        CallError::Protocol(_) | CallError::Encode(_) => false,
    }
}

impl QuicUpstream {
    /// Call these orchestrators (spreading calls over them) with this client.
    pub fn new(client: Client, orchestrators: Vec<SocketAddr>) -> Self {
        QuicUpstream {
            client,
            orchestrators: RwLock::new(orchestrators.into()),
            next: AtomicUsize::new(0),
            seen: Mutex::default(),
        }
    }

    /// Call these orchestrators from now on (discovery found a new set).
    pub fn set_orchestrators(&self, orchestrators: Vec<SocketAddr>) {
        // What was seen of addresses no longer listed goes with them (pods come back at new addresses).
        lock(&self.seen).retain(|addr, _| orchestrators.contains(addr));
        *write(&self.orchestrators) = orchestrators.into();
    }

    /// The orchestrators called.
    pub fn orchestrators(&self) -> Arc<[SocketAddr]> {
        read(&self.orchestrators).clone()
    }

    /// A unary call to the orchestrators: each is tried once, starting with the next in turn.
    async fn orchestrator_call(&self, request: Message) -> Result<Message, CallError> {
        self.orchestrator_round(ORCHESTRATOR_TIMEOUT, &request).await.0
    }

    /// [`Self::orchestrator_call`], and the round again, a few times, while one of them is alive but did not route
    /// ([`ROUND_PAUSES`]).
    async fn patient_orchestrator_call(&self, request: Message) -> Result<Message, CallError> {
        let timeout = ORCHESTRATOR_TIMEOUT;
        let mut pauses = ROUND_PAUSES.iter();
        loop {
            let (result, one_alive) = self.orchestrator_round(timeout, &request).await;
            match (result, pauses.next()) {
                (Err(_), Some(&pause)) if one_alive => {
                    tracing::debug!(
                        ?pause,
                        "no orchestrator routed (one is alive but not ready or slow); asking again"
                    );
                    metrics::counter!("zl_frontend_orchestrator_rounds_retried_total").increment(1);
                    tokio::time::sleep(pause).await;
                }
                (result, _) => return result,
            }
        }
    }

    /// Each orchestrator tried once, starting with the next in turn; also whether one of them is alive: it answered
    /// `Unavailable` (not ready yet), or was reached and then missed the deadline or lost the call.
    async fn orchestrator_round(&self, timeout: Duration, request: &Message) -> (Result<Message, CallError>, bool) {
        let orchestrators = self.orchestrators();
        let n = orchestrators.len();
        if n == 0 {
            let none = WireError::new(
                ErrorCode::Unavailable,
                "no orchestrator is known (none configured, or discovery has found none passing)",
            );
            return (Err(CallError::Remote(none)), false);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let (mut last, mut one_alive) = (None, false);
        for i in 0..n {
            let to = orchestrators[(start + i) % n];
            let before = lock(&self.seen).get(&to).copied().unwrap_or_default();
            let deadline = if before.failed { timeout.min(SUSPECT_TIMEOUT) } else { timeout };
            let result = self.client.call_within(deadline, to, Role::Orchestrator, request.clone()).await;
            // A missed deadline is spelt as a remote `DeadlineExceeded` too: it is no answer.
            let answered = match &result {
                Ok(_) => true,
                Err(CallError::Remote(w)) => w.code != ErrorCode::DeadlineExceeded,
                Err(_) => false,
            };
            {
                let mut seen = lock(&self.seen);
                let entry = seen.entry(to).or_default();
                entry.failed = !answered;
                if answered {
                    entry.answered = Some(Instant::now());
                }
            }
            match result {
                Ok(reply) => return (Ok(reply), false),
                Err(e) if try_next_orchestrator(&e) => {
                    tracing::debug!(orchestrator = %to, error = %e, "orchestrator unavailable; trying the next");
                    // An orchestrator that answers it is not ready yet (joining its group, or just started and not
                    // yet heard from every worker) is alive and did its job: counted apart from the failures
                    // (no connection, a lost one, a missed deadline), which is what an SRE alerts on.
                    let not_ready = matches!(&e, CallError::Remote(w) if w.code == ErrorCode::Unavailable);
                    if not_ready {
                        metrics::counter!("zl_frontend_orchestrator_not_ready_total").increment(1);
                    } else {
                        metrics::counter!("zl_frontend_orchestrator_failovers_total").increment(1);
                    }
                    // Alive: it answered now, or answered lately and only missed this deadline.
                    let lately = before.answered.is_some_and(|t| t.elapsed() < ALIVE_WINDOW);
                    one_alive |= answered || (lately && !matches!(e, CallError::Connect { .. }));
                    last = Some(e);
                }
                Err(e) => return (Err(e), false),
            }
        }
        (Err(last.unwrap_or_else(|| CallError::deadline_exceeded("orchestrators"))), one_alive)
    }
}

fn unexpected(what: &str, got: &Message) -> CallError {
    CallError::Protocol(format!("expected {what}, got {}", got.kind()))
}

impl Upstream for QuicUpstream {
    fn route(&self, request: RouteRequest) -> BoxFuture<'_, Result<RouteDecision, CallError>> {
        Box::pin(async move {
            match self.patient_orchestrator_call(Message::RouteRequest(request)).await? {
                Message::RouteDecision(d) => Ok(d),
                other => Err(unexpected("a route decision", &other)),
            }
        })
    }

    fn sync(&self, known_index: u64) -> BoxFuture<'_, Result<StateSync, CallError>> {
        Box::pin(async move {
            match self.orchestrator_call(Message::StateSyncRequest(StateSyncRequest { known_index })).await? {
                Message::StateSync(s) => Ok(s),
                other => Err(unexpected("a state sync", &other)),
            }
        })
    }

    fn store_response(&self, response: StoredResponse) -> BoxFuture<'_, Result<u64, CallError>> {
        Box::pin(async move {
            // A Raft write, like a report.
            match self.orchestrator_round(REPORT_TIMEOUT, &Message::StoredResponse(response)).await.0? {
                Message::Ack(a) => Ok(a.applied_index),
                other => Err(unexpected("an ack", &other)),
            }
        })
    }

    fn lookup_response(&self, lookup: ResponseLookup) -> BoxFuture<'_, Result<ResponseFound, CallError>> {
        Box::pin(async move {
            // A delete is a Raft write; a read may wait up to a second for its orchestrator to catch up.
            match self.orchestrator_round(REPORT_TIMEOUT, &Message::ResponseLookup(lookup)).await.0? {
                Message::ResponseFound(f) => Ok(f),
                other => Err(unexpected("a stored response", &other)),
            }
        })
    }

    fn report(&self, report: FrontendReport) -> BoxFuture<'_, Result<FrontendGrant, CallError>> {
        Box::pin(async move {
            // A report is a Raft write: more time than a route, still well under the report interval's worth.
            match self.orchestrator_round(REPORT_TIMEOUT, &Message::FrontendReport(report)).await.0? {
                Message::FrontendGrant(g) => Ok(g),
                other => Err(unexpected("a frontend grant", &other)),
            }
        })
    }

    fn embed(&self, endpoint: String, request: EmbedRequest) -> BoxFuture<'_, Result<Embedded, CallError>> {
        Box::pin(async move {
            let to = endpoint_addr(&endpoint).await?;
            let mut collector = Collector::new(request.inputs.len(), request.tokens());
            let call = async {
                let mut stream = self.client.stream(to, Role::Worker, Message::EmbedRequest(request)).await?;
                let peer = stream.peer();
                if peer.protocol_minor < EMBED_MINOR {
                    return Err(CallError::Remote(WireError::new(
                        ErrorCode::Unavailable,
                        format!(
                            "worker {} speaks protocol 1.{} and cannot embed (1.{EMBED_MINOR} can)",
                            peer.node_id, peer.protocol_minor
                        ),
                    )));
                }
                loop {
                    match stream.next().await {
                        Some(Ok(Message::Embeddings(e))) => collector.push(e).map_err(CallError::Protocol)?,
                        Some(Ok(Message::Finish(f))) => return collector.finish(&f).map_err(CallError::Protocol),
                        Some(Ok(other)) => return Err(unexpected("embeddings", &other)),
                        Some(Err(e)) => return Err(e),
                        None => return Err(CallError::Protocol("the worker ended the call without a finish".into())),
                    }
                }
            };
            tokio::time::timeout(EMBED_TIMEOUT, call).await.unwrap_or_else(|_| {
                Err(CallError::Remote(WireError::new(
                    ErrorCode::DeadlineExceeded,
                    format!("the worker did not answer within {} s", EMBED_TIMEOUT.as_secs()),
                )))
            })
        })
    }

    fn model_card(&self, endpoint: String, model: String) -> BoxFuture<'_, Result<ModelCard, CallError>> {
        Box::pin(async move {
            let to = endpoint_addr(&endpoint).await?;
            let request = Message::ModelCardRequest(ModelCardRequest { model });
            match self.client.call_within(CONTROL_TIMEOUT, to, Role::Worker, request).await? {
                Message::ModelCard(card) => Ok(card),
                other => Err(unexpected("a model card", &other)),
            }
        })
    }

    fn generate(
        &self,
        endpoint: String,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Box<dyn TokenSource>, CallError>> {
        Box::pin(async move {
            let to = endpoint_addr(&endpoint).await?;
            // What the request needs of the worker's protocol: a worker older than 1.3 ignores the grammar and
            // would answer unconstrained; one older than 1.6 ignores the tokens to resume after and would start the
            // answer over (the client would get its beginning twice); one older than 1.8 ignores the LoRA adapter and
            // would answer from the base; one older than 1.11 ignores top and prompt log-probabilities, thinking
            // budgets and penalties.
            let needs = [
                (!request.grammar.is_empty(), GRAMMAR_MINOR, "constrain decoding"),
                (!request.resume_tokens.is_empty(), RESUME_MINOR, "resume a migrated request"),
                (request.adapter.is_some(), ADAPTER_MINOR, "apply a LoRA adapter"),
                (request.top_logprobs > 0 || request.prompt_logprobs, SAMPLING_MINOR, "send top or prompt logprobs"),
                (request.think.is_some(), SAMPLING_MINOR, "enforce a thinking budget"),
                (request.penalties.is_some(), SAMPLING_MINOR, "apply penalties and logit_bias"),
            ];
            let stream = self.client.stream(to, Role::Worker, Message::GenerateRequest(request)).await?;
            // Such a call is dropped (which cancels it) and the request goes to another worker (during a rolling
            // upgrade).
            let peer = stream.peer();
            if let Some((_, minor, what)) =
                needs.iter().find(|(needed, minor, _)| *needed && peer.protocol_minor < *minor)
            {
                return Err(CallError::Remote(WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "worker {} speaks protocol 1.{} and cannot {what} (1.{minor} can)",
                        peer.node_id, peer.protocol_minor
                    ),
                )));
            }
            Ok(Box::new(stream) as Box<dyn TokenSource>)
        })
    }
}
