//! A scripted upstream (orchestrator and worker answers) behind the frontend's router, shared by the handler and
//! server tests.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs, dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::http::{Request, Response};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use zl_common::keys::secret_sha256;
use zl_frontend::cluster::Cluster;
use zl_frontend::gateway::{Gateway, GatewayConfig};
use zl_frontend::http::{App, EdgeLimits, router};
use zl_frontend::upstream::{BoxFuture, TokenSource, Upstream};
use zl_proto::CallError;
use zl_text::TextTokenizer;
use zl_wire::message::{
    ApiKeyEntry, ComputePool, ErrorCode, Finish, GenerateRequest, Message, ModelCard, ModelInfo, NodeId, ProjectQuota,
    Prompt, RouteDecision, RouteRequest, StateSync, StopReason, TokenChunk, Usage, WireError,
};

pub const KEY: &str = "sk-zl-test-key";
pub const MODEL: &str = "tiny";

/// How the scripted worker behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerMode {
    /// Streams "Hello world" in three chunks.
    Normal,
    /// Worker w1 fails before its first token; others are normal.
    FirstWorkerDies,
    /// Worker w1 admits the request (the empty chunk) and then fails before its first token; others are normal.
    FirstWorkerDiesAfterAdmitting,
    /// Fails after the first chunk.
    DiesMidStream,
    /// Streams forever (until the caller goes away).
    Endless,
    /// Streams "Hello world" slowly: 100 ms before each frame.
    Slow,
    /// Says it admitted the request (an empty chunk, as a real worker does), then waits for `Fake::gate` before
    /// "Hello world": a long prompt still being computed.
    Admitted,
    /// Worker w1 sends "Hello" and dies; others are normal (and resume as a real worker does).
    FirstWorkerDiesMidStream,
    /// Worker w1 sends "Hello", then nothing more while its connection stays up (a wedged device).
    FirstWorkerStalls,
    /// w1 is the only worker: it sends "Hello" and dies, and routes find no worker while it is excluded (its
    /// replacement, under the same id, resumes as a real worker does).
    LoneWorkerRestarts,
    /// Worker w1 admits the request, sends the log-probabilities of the prompt's first two positions after the
    /// first token, and dies; others are normal (and send the prompt's from the start, as a real worker does).
    FirstWorkerDiesDuringPromptLogprobs,
}

#[derive(Default)]
pub struct Recorded {
    pub routes: Vec<RouteRequest>,
    pub generates: Vec<(String, GenerateRequest)>,
}

pub struct Fake {
    pub mode: Mutex<WorkerMode>,
    /// The weights version routes serve ([0xab; 32], the card's, unless a test plays a canary).
    pub served_weights: Mutex<[u8; 32]>,
    /// The node id that answers at `w1`'s endpoint instead of w1 (another node with its tier's certificate).
    pub impostor_at_w1: Mutex<Option<String>>,
    /// Usage the worker claims in its finish (input, output) instead of the true one: a faulty or hostile worker.
    pub claimed_usage: Mutex<Option<(u32, u32)>>,
    pub overloaded: Mutex<bool>,
    pub recorded: Mutex<Recorded>,
    pub dropped_streams: Arc<AtomicUsize>,
    /// Opened by a test to let `WorkerMode::Admitted` go on.
    pub gate: Arc<tokio::sync::Semaphore>,
}

struct Script {
    /// Who answers (as the certificate says).
    answering: NodeId,
    frames: VecDeque<Result<Message, CallError>>,
    /// After the last frame, wait forever (the connection stays up).
    hang: bool,
    endless: bool,
    slow: bool,
    dropped: Arc<AtomicUsize>,
    /// Waited on once, after the first frame.
    gate: Option<Arc<tokio::sync::Semaphore>>,
    sent: usize,
}

impl Drop for Script {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl TokenSource for Script {
    fn worker_id(&self) -> Option<NodeId> {
        Some(self.answering.clone())
    }

    fn next(&mut self) -> BoxFuture<'_, Option<Result<Message, CallError>>> {
        Box::pin(async move {
            if self.slow {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            if self.sent == 1
                && let Some(gate) = self.gate.take()
            {
                gate.acquire().await.unwrap().forget();
            }
            self.sent += 1;
            if self.endless {
                tokio::task::yield_now().await;
                return Some(Ok(Message::TokenChunk(TokenChunk {
                    token_ids: vec![1],
                    text_delta: "x".into(),
                    ..Default::default()
                })));
            }
            match self.frames.pop_front() {
                None if self.hang => std::future::pending().await,
                next => next,
            }
        })
    }
}

pub fn chunk(text: &str) -> Result<Message, CallError> {
    Ok(Message::TokenChunk(TokenChunk { token_ids: vec![7], text_delta: text.into(), ..Default::default() }))
}

pub fn tokenizer() -> TextTokenizer {
    TextTokenizer::from_gguf(&zl_text::testing::tiny_vocab()).unwrap()
}

impl Upstream for Fake {
    fn route(&self, request: RouteRequest) -> BoxFuture<'_, Result<RouteDecision, CallError>> {
        Box::pin(async move {
            if request.model != MODEL {
                return Err(CallError::Remote(WireError::new(ErrorCode::NotFound, "unknown model")));
            }
            if *self.overloaded.lock().unwrap() {
                let mut e = WireError::new(ErrorCode::Overloaded, "every pool is saturated");
                e.retry_after_ms = 2500;
                return Err(CallError::Remote(e));
            }
            let w1_excluded = request.excluded_workers.iter().any(|w| w.as_str() == "w1");
            if w1_excluded && *self.mode.lock().unwrap() == WorkerMode::LoneWorkerRestarts {
                let mut e = WireError::new(ErrorCode::Overloaded, "no healthy worker serves tiny right now");
                e.retry_after_ms = 1000;
                return Err(CallError::Remote(e));
            }
            let worker = if w1_excluded { "w2" } else { "w1" };
            // The card probe (a route with no prompt) is not a request's route.
            if request.prompt_tokens > 0 {
                self.recorded.lock().unwrap().routes.push(request.clone());
            }
            Ok(RouteDecision {
                request_id: request.request_id,
                worker_id: NodeId::new(worker).unwrap(),
                endpoint: format!("{worker}.local:7100"),
                model: MODEL.into(),
                weights_sha256: *self.served_weights.lock().unwrap(),
                compute_pool: ComputePool::Cpu,
                predicted_billing_unit: 0.06,
                reason: "test".into(),
                decision_nanos: 1000,
                orchestrator_id: String::new(),
                adapter: None,
            })
        })
    }

    fn sync(&self, _known_index: u64) -> BoxFuture<'_, Result<StateSync, CallError>> {
        Box::pin(async move { Ok(sync_state(0)) })
    }

    fn model_card(&self, _endpoint: String, model: String) -> BoxFuture<'_, Result<ModelCard, CallError>> {
        Box::pin(async move {
            let parts = tokenizer().to_parts().unwrap();
            Ok(ModelCard {
                model,
                weights_sha256: [0xab; 32],
                context_length: 64,
                tokenizer_json: parts.tokenizer_json,
                chat_template: parts.chat_template,
                bos_token: parts.bos,
                eos_token: parts.eos,
                stop_token_ids: parts.stop_ids,
                kv_block_size: 4,
                embedding_dims: 0,
                pooling: String::new(),
            })
        })
    }

    fn generate(
        &self,
        endpoint: String,
        request: GenerateRequest,
    ) -> BoxFuture<'_, Result<Box<dyn TokenSource>, CallError>> {
        Box::pin(async move {
            let mode = *self.mode.lock().unwrap();
            let Prompt::Tokens(prompt) = &request.prompt else { panic!("the frontend sends tokens") };
            let input = prompt.len() as u32;
            self.recorded.lock().unwrap().generates.push((endpoint.clone(), request.clone()));
            let (input, output) = self.claimed_usage.lock().unwrap().unwrap_or((input, 3));
            let finish = Ok(Message::Finish(Finish {
                stop_reason: StopReason::EndTurn,
                stop_sequence: None,
                usage: Usage { input_tokens: input, output_tokens: output, ..Usage::default() },
            }));
            let frames: VecDeque<_> = match mode {
                WorkerMode::FirstWorkerDies if endpoint.starts_with("w1") => {
                    vec![Err(CallError::ConnectionLost("worker killed".into()))].into()
                }
                // Every worker dies after its first chunk (a resumed one at once).
                WorkerMode::DiesMidStream if request.resume_tokens.is_empty() => {
                    vec![chunk("Hello"), Err(CallError::ConnectionLost("worker killed".into()))].into()
                }
                WorkerMode::DiesMidStream => vec![Err(CallError::ConnectionLost("worker killed".into()))].into(),
                WorkerMode::FirstWorkerDiesAfterAdmitting if endpoint.starts_with("w1") => {
                    let admitted = Ok(Message::TokenChunk(TokenChunk::admission()));
                    vec![admitted, Err(CallError::ConnectionLost("worker killed".into()))].into()
                }
                WorkerMode::Admitted => {
                    let admitted = Ok(Message::TokenChunk(TokenChunk::admission()));
                    vec![admitted, chunk("Hello"), chunk(" wor"), chunk("ld"), finish].into()
                }
                WorkerMode::FirstWorkerDiesMidStream if endpoint.starts_with("w1") => {
                    vec![chunk("Hello"), Err(CallError::ConnectionLost("worker killed".into()))].into()
                }
                WorkerMode::FirstWorkerStalls if endpoint.starts_with("w1") => vec![chunk("Hello")].into(),
                WorkerMode::LoneWorkerRestarts if request.resume_tokens.is_empty() => {
                    vec![chunk("Hello"), Err(CallError::ConnectionLost("worker killed".into()))].into()
                }
                // A resumed request goes on after the chunks (one token each) it was already given.
                _ => {
                    let chunks = [chunk("Hello"), chunk(" wor"), chunk("ld")];
                    let skip = request.resume_tokens.len().min(chunks.len());
                    chunks.into_iter().skip(skip).chain([finish]).collect()
                }
            };
            // Log-probabilities when asked: -0.25 a token, its alternatives (ids 0, 1, ...) at -1; the prompt's
            // positions first, in chunks of two, as a worker computes them.
            let mut frames = frames;
            if request.logprobs {
                let k = usize::from(request.top_logprobs);
                let with = |mut c: TokenChunk| {
                    c.logprobs = Some(vec![-0.25; c.token_ids.len()]);
                    c.top = c.token_ids.iter().flat_map(|_| (0..k as u32).map(|id| (id, -1.0))).collect();
                    c
                };
                frames = frames
                    .into_iter()
                    .map(|f| match f {
                        Ok(Message::TokenChunk(c)) if !c.is_admission() => Ok(Message::TokenChunk(with(c))),
                        other => other,
                    })
                    .collect();
                if request.prompt_logprobs {
                    let positions: Vec<usize> = (1..prompt.len()).collect();
                    let mut prompt_frames: Vec<_> = positions
                        .chunks(2)
                        .map(|c| {
                            Ok(Message::TokenChunk(with(TokenChunk {
                                token_ids: c.iter().map(|&p| prompt[p]).collect(),
                                prompt_start: Some(c[0] as u32),
                                ..Default::default()
                            })))
                        })
                        .collect();
                    if mode == WorkerMode::FirstWorkerDiesDuringPromptLogprobs && endpoint.starts_with("w1") {
                        prompt_frames.truncate(1);
                        prompt_frames.insert(0, Ok(Message::TokenChunk(TokenChunk::admission())));
                        prompt_frames.push(Err(CallError::ConnectionLost("worker killed".into())));
                        frames.clear();
                    }
                    frames = prompt_frames.into_iter().chain(frames).collect();
                }
            }
            let answering = match (endpoint.starts_with("w1"), self.impostor_at_w1.lock().unwrap().clone()) {
                (true, Some(impostor)) => impostor,
                _ => endpoint.split('.').next().unwrap_or_default().to_owned(),
            };
            Ok(Box::new(Script {
                answering: NodeId::new(answering).unwrap(),
                frames,
                hang: mode == WorkerMode::FirstWorkerStalls && endpoint.starts_with("w1"),
                endless: mode == WorkerMode::Endless,
                slow: mode == WorkerMode::Slow,
                dropped: self.dropped_streams.clone(),
                gate: (mode == WorkerMode::Admitted).then(|| self.gate.clone()),
                sent: 0,
            }) as Box<dyn TokenSource>)
        })
    }
}

pub fn sync_state(index: u64) -> StateSync {
    StateSync {
        applied_index: 5 + index,
        unchanged: false,
        keys: vec![ApiKeyEntry {
            key_id: "key-1".into(),
            secret_sha256: secret_sha256(KEY),
            project: "acme".into(),
            regions: vec![],
        }],
        projects: vec![ProjectQuota { project: "acme".into(), ..ProjectQuota::default() }],
        models: vec![ModelInfo {
            id: MODEL.into(),
            weights_sha256: [0xab; 32],
            context_length: 64,
            family: "llama".into(),
            weights_bytes: 0,
            embedding_dims: 0,
        }],
        serving_workers: 1,
        billing_weights: None,
        adapters: vec![],
    }
}

pub struct Harness {
    pub app: axum::Router,
    pub fake: Arc<Fake>,
    /// The frontend's cached routing state (tests apply their own syncs).
    pub cluster: Arc<Cluster>,
    pub gateway: Arc<Gateway>,
}

pub fn harness_with(config: GatewayConfig, body_limit: usize) -> Harness {
    harness_with_edge(config, body_limit, EdgeLimits::default())
}

/// [`harness_with`] with the edge's deadlines and cap.
pub fn harness_with_edge(config: GatewayConfig, body_limit: usize, edge: EdgeLimits) -> Harness {
    harness_full(config, body_limit, edge, None)
}

/// The default harness writing an audit log into `dir`.
pub fn harness_audited(dir: &std::path::Path) -> Harness {
    let config = zl_frontend::audit::AuditConfig {
        dir: dir.to_owned(),
        segment_bytes: 1 << 20,
        keep_segments: 0,
        fsync: zl_frontend::audit::Fsync::Always,
        on_failure: zl_frontend::audit::OnFailure::FailClosed,
    };
    let log = zl_frontend::audit::AuditLog::open(config, "fe-test", "default").unwrap();
    harness_full(GatewayConfig::default(), 1024 * 1024, EdgeLimits::default(), Some(Arc::new(log)))
}

fn harness_full(
    config: GatewayConfig,
    body_limit: usize,
    edge: EdgeLimits,
    audit: Option<Arc<zl_frontend::audit::AuditLog>>,
) -> Harness {
    let fake = Arc::new(Fake {
        mode: Mutex::new(WorkerMode::Normal),
        served_weights: Mutex::new([0xab; 32]),
        claimed_usage: Mutex::new(None),
        impostor_at_w1: Mutex::new(None),
        overloaded: Mutex::new(false),
        recorded: Mutex::default(),
        dropped_streams: Arc::default(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
    });
    let cluster = Arc::new(Cluster::default());
    cluster.apply(sync_state(0), Instant::now());
    let gateway = Arc::new(Gateway::new(fake.clone(), cluster.clone(), config));
    let app = router(App { gateway: gateway.clone(), body_limit, edge, spill: Default::default(), audit });
    Harness { app, fake, cluster, gateway }
}

pub fn harness() -> Harness {
    harness_with(GatewayConfig::default(), 1024 * 1024)
}

pub fn post(path: &str, body: impl Into<Body>) -> axum::http::request::Builder {
    let _ = body;
    Request::post(path).header("content-type", "application/json")
}

impl Harness {
    pub async fn send(&self, req: Request<Body>) -> Response<Body> {
        self.app.clone().oneshot(req).await.unwrap()
    }

    pub async fn anthropic(&self, body: Value) -> Response<Body> {
        let req = post("/v1/messages", ())
            .header("x-api-key", KEY)
            .header("anthropic-version", "2023-06-01")
            .body(Body::from(body.to_string()))
            .unwrap();
        self.send(req).await
    }

    pub async fn post_json(&self, path: &str, body: Value) -> Response<Body> {
        let req =
            post(path, ()).header("authorization", format!("Bearer {KEY}")).body(Body::from(body.to_string())).unwrap();
        self.send(req).await
    }

    pub async fn openai(&self, body: Value) -> Response<Body> {
        let req = post("/v1/chat/completions", ())
            .header("authorization", format!("Bearer {KEY}"))
            .body(Body::from(body.to_string()))
            .unwrap();
        self.send(req).await
    }
}

pub async fn text(resp: Response<Body>) -> String {
    String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

pub async fn json_of(resp: Response<Body>) -> Value {
    serde_json::from_str(&text(resp).await).unwrap()
}

pub fn header<'a>(resp: &'a Response<Body>, name: &str) -> &'a str {
    resp.headers().get(name).map(|v| v.to_str().unwrap()).unwrap_or_else(|| panic!("no {name} header"))
}

pub fn hello(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}
