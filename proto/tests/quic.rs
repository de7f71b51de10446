//! The RPC over real QUIC on 127.0.0.1: unary and streaming calls, cancellation both ways, peer restart, refused
//! certificates and roles, oversized frames.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use zl_proto::quic::{CallContext, CallError, Client, Handler, Responder, RpcSettings, Server};
use zl_tls::{ClusterCa, TlsIdentity};
use zl_wire::Message;
use zl_wire::message::{
    Ack, ErrorCode, Finish, GenerateRequest, LoadReport, NodeId, Prompt, RouteDecision, RouteRequest, SamplingParams,
    StopReason, TokenChunk, Usage, WireError,
};
use zl_wire::message::{ComputePool, Role};

const LOOPBACK: &str = "127.0.0.1:0";

/// Events the test handler reports, so tests can see what the server saw.
#[derive(Debug, PartialEq)]
enum Seen {
    Dropped { request_id: String, cancelled: bool },
}

struct TestHandler {
    events: mpsc::UnboundedSender<Seen>,
    /// Token chunks the handler has handed to the stream, across calls.
    sent: Arc<AtomicU64>,
}

/// Reports when the handler's future is dropped (the server stopped it) and whether cancellation was raised.
struct DropProbe {
    request_id: String,
    ctx: CallContext,
    events: mpsc::UnboundedSender<Seen>,
}

impl Drop for DropProbe {
    fn drop(&mut self) {
        let _ = self.events.send(Seen::Dropped {
            request_id: self.request_id.clone(),
            cancelled: self.ctx.cancellation().is_cancelled(),
        });
    }
}

impl Handler for TestHandler {
    async fn call(&self, ctx: CallContext, request: Message, out: &mut Responder) -> Result<(), WireError> {
        match request {
            Message::RouteRequest(r) => out
                .send(Message::RouteDecision(RouteDecision {
                    request_id: r.request_id,
                    worker_id: NodeId::new("w0").unwrap(),
                    endpoint: "127.0.0.1:7000".into(),
                    model: r.model,
                    weights_sha256: [1; 32],
                    compute_pool: ComputePool::Cpu,
                    predicted_billing_unit: 0.5,
                    reason: format!("caller {}", ctx.peer.node_id),
                    decision_nanos: 1,
                    orchestrator_id: String::new(),
                    adapter: None,
                }))
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string())),
            Message::LoadReport(_) => Ok(()), // forgets to reply: the server must answer for it
            Message::RegisterWorker(_) => Err(WireError::new(ErrorCode::NotFound, "no such model")),
            Message::GenerateRequest(g) => {
                let _probe =
                    DropProbe { request_id: g.request_id.clone(), ctx: ctx.clone(), events: self.events.clone() };
                let hang = g.request_id.starts_with("hang");
                for i in 0..g.max_tokens {
                    let chunk = TokenChunk { token_ids: vec![i], text_delta: format!("t{i} "), ..Default::default() };
                    if out.send(Message::TokenChunk(chunk)).await.is_err() {
                        return Ok(());
                    }
                    self.sent.fetch_add(1, Ordering::SeqCst);
                    if hang {
                        ctx.cancellation().cancelled().await;
                        std::future::pending::<()>().await;
                    }
                }
                // "invalid-*" requests end with a Finish that fails its own checks (more cached than input tokens).
                let cached = if g.request_id.starts_with("invalid") { 4 } else { 0 };
                let finish = Finish {
                    stop_reason: StopReason::MaxTokens,
                    stop_sequence: None,
                    usage: Usage {
                        input_tokens: 3,
                        output_tokens: g.max_tokens,
                        cached_input_tokens: cached,
                        ..Usage::default()
                    },
                };
                out.send(Message::Finish(finish)).await.map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))
            }
            other => Err(WireError::new(ErrorCode::InvalidRequest, format!("unexpected {}", other.kind()))),
        }
    }
}

fn id(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

struct Cluster {
    ca: ClusterCa,
    server: Server,
    events: mpsc::UnboundedReceiver<Seen>,
    sent: Arc<AtomicU64>,
}

fn start(settings: RpcSettings) -> Cluster {
    let ca = ClusterCa::generate("test", 1).unwrap();
    let server_identity = TlsIdentity::issue(&ca, Role::Worker, id("w0")).unwrap();
    let (tx, events) = mpsc::unbounded_channel();
    let sent = Arc::new(AtomicU64::new(0));
    let handler = TestHandler { events: tx, sent: sent.clone() };
    let server = Server::spawn(LOOPBACK.parse().unwrap(), &server_identity, settings, Arc::new(handler)).unwrap();
    Cluster { ca, server, events, sent }
}

fn client(ca: &ClusterCa, role: Role, node: &str, settings: RpcSettings) -> Client {
    Client::new(&TlsIdentity::issue(ca, role, id(node)).unwrap(), settings).unwrap()
}

fn route(request_id: &str) -> Message {
    Message::RouteRequest(RouteRequest {
        request_id: request_id.into(),
        model: "m".into(),
        prompt_tokens: 5,
        max_tokens: 5,
        block_hashes: vec![],
        session_id: None,
        hint: Default::default(),
        input_semantic_weight: 0.5,
        excluded_workers: vec![],
        trace_id: String::new(),
        prefer_fallback: false,
        project: String::new(),
    })
}

fn generate(request_id: &str, max_tokens: u32, prompt: Vec<u32>) -> Message {
    Message::GenerateRequest(GenerateRequest {
        request_id: request_id.into(),
        trace_id: String::new(),
        model: "m".into(),
        prompt: Prompt::Tokens(prompt),
        sampling: SamplingParams::default(),
        max_tokens,
        stop_sequences: vec![],
        stream: true,
        logprobs: false,
        streaming_predicted: None,
        grammar: String::new(),
        cache_salt: 0,
        resume_tokens: vec![],
        adapter: None,
        top_logprobs: 0,
        prompt_logprobs: false,
        think: None,
        penalties: None,
    })
}

async fn next_event(events: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(Duration::from_secs(5), events.recv()).await.expect("server saw nothing").unwrap()
}

#[tokio::test]
async fn unary_call_round_trips_with_the_callers_identity() {
    let c = start(RpcSettings::default());
    let client = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    let reply = client.call(c.server.local_addr(), Role::Worker, route("r1")).await.unwrap();
    match reply {
        Message::RouteDecision(d) => {
            assert_eq!(d.request_id, "r1");
            assert_eq!(d.reason, "caller f0");
        }
        other => panic!("{other:?}"),
    }
    // A second call reuses the pooled connection.
    client.call(c.server.local_addr(), Role::Worker, route("r2")).await.unwrap();
}

#[tokio::test]
async fn remote_errors_and_missing_replies_are_typed() {
    let c = start(RpcSettings::default());
    let client = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    let addr = c.server.local_addr();
    let register = Message::RegisterWorker(zl_wire::message::RegisterWorker {
        worker_id: id("w1"),
        endpoint: "127.0.0.1:1".into(),
        device_class: ComputePool::Cpu,
        models: vec![zl_wire::message::ModelInfo {
            id: "m".into(),
            weights_sha256: [0; 32],
            context_length: 10,
            family: String::new(),
            weights_bytes: 0,
            embedding_dims: 0,
        }],
        kv_block_size: 16,
        kv_blocks_total: 1,
        max_running_sequences: 1,
        kv_dtype: String::new(),
        kv_bytes_per_token: 0,
    });
    match client.call(addr, Role::Worker, register).await {
        Err(CallError::Remote(e)) => assert_eq!((e.code, e.message.as_str()), (ErrorCode::NotFound, "no such model")),
        other => panic!("{other:?}"),
    }
    let report = Message::LoadReport(LoadReport {
        worker_id: id("w1"),
        sequence: 1,
        queue_depth: 0,
        running_sequences: 0,
        kv_blocks_used: 0,
        kv_blocks_free: 0,
        fragmentation_ratio: 0.0,
        tokens_per_second: 0.0,
        vram_total_bytes: 0,
        vram_free_bytes: 0,
        queued_prefill_blocks: 0,
        adapters: vec![],
    });
    match client.call(addr, Role::Worker, report).await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::Internal),
        other => panic!("{other:?}"),
    }
    // A response kind cannot open a call; the client refuses to send it.
    assert!(matches!(client.call(addr, Role::Worker, Message::Ack(Ack::default())).await, Err(CallError::Encode(_))));
}

#[tokio::test]
async fn streams_ten_thousand_frames_in_order() {
    let c = start(RpcSettings::default());
    let client = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    let mut stream =
        client.stream(c.server.local_addr(), Role::Worker, generate("big", 10_000, vec![1])).await.unwrap();
    let mut expected = 0u32;
    let mut finished = false;
    while let Some(msg) = stream.next().await {
        match msg.unwrap() {
            Message::TokenChunk(chunk) => {
                assert_eq!(chunk.token_ids, vec![expected]);
                expected += 1;
            }
            Message::Finish(f) => {
                assert_eq!(f.usage.output_tokens, 10_000);
                finished = true;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(expected, 10_000);
    assert!(finished);
}

#[tokio::test]
async fn a_terminal_frame_that_fails_its_checks_ends_the_call_with_an_error_frame() {
    let c = start(RpcSettings::default());
    let client = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    let mut stream =
        client.stream(c.server.local_addr(), Role::Worker, generate("invalid-1", 2, vec![1])).await.unwrap();
    let mut items = 0;
    let end = loop {
        match stream.next().await.expect("the call ends with a frame, not a bare end of stream") {
            Ok(Message::TokenChunk(_)) => items += 1,
            other => break other,
        }
    };
    assert_eq!(items, 2);
    match end {
        Err(CallError::Remote(e)) => assert_eq!(e.code, ErrorCode::Internal, "{e:?}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn many_concurrent_calls_share_one_connection() {
    let c = start(RpcSettings::default());
    let client = Arc::new(client(&c.ca, Role::Frontend, "f0", RpcSettings::default()));
    let addr = c.server.local_addr();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let client = client.clone();
        tasks.spawn(async move {
            let mut stream = client.stream(addr, Role::Worker, generate(&format!("c{i}"), 20, vec![1])).await.unwrap();
            let mut n = 0;
            while let Some(msg) = stream.next().await {
                msg.unwrap();
                n += 1;
            }
            n
        });
    }
    while let Some(n) = tasks.join_next().await {
        assert_eq!(n.unwrap(), 21);
    }
}

#[tokio::test]
async fn dropping_the_response_stream_stops_the_handler_at_once() {
    let mut c = start(RpcSettings::default());
    let client = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    let mut stream =
        client.stream(c.server.local_addr(), Role::Worker, generate("hang-1", 100, vec![1])).await.unwrap();
    assert!(matches!(stream.next().await, Some(Ok(Message::TokenChunk(_)))));
    drop(stream);
    assert_eq!(next_event(&mut c.events).await, Seen::Dropped { request_id: "hang-1".into(), cancelled: true });
}

#[tokio::test]
async fn a_cancel_frame_stops_the_handler() {
    let mut c = start(RpcSettings::default());
    let client = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    let mut stream =
        client.stream(c.server.local_addr(), Role::Worker, generate("hang-2", 100, vec![1])).await.unwrap();
    assert!(matches!(stream.next().await, Some(Ok(Message::TokenChunk(_)))));
    stream.cancel("user pressed stop").await;
    assert_eq!(next_event(&mut c.events).await, Seen::Dropped { request_id: "hang-2".into(), cancelled: true });
}

#[tokio::test]
async fn server_shutdown_cancels_the_clients_stream() {
    let c = start(RpcSettings::default());
    let client = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    let mut stream =
        client.stream(c.server.local_addr(), Role::Worker, generate("hang-3", 100, vec![1])).await.unwrap();
    assert!(matches!(stream.next().await, Some(Ok(Message::TokenChunk(_)))));
    c.server.shutdown(Duration::from_millis(100)).await;
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap();
    assert!(matches!(end, Some(Err(CallError::ConnectionLost(_) | CallError::Cancelled(_)))), "{end:?}");
    assert!(stream.next().await.is_none());
}

/// Serve on a runtime of its own, so the test can kill it the way a crash would: no CONNECTION_CLOSE is sent.
/// Environment of a [`peer_process`] child: the address to serve on, then the CA certificate and the worker's
/// certificate and key (PEM).
const CHILD_ENV: [&str; 4] = ["ZL_QUIC_CHILD_ADDR", "ZL_QUIC_CHILD_CA", "ZL_QUIC_CHILD_CERT", "ZL_QUIC_CHILD_KEY"];

/// Not a test of its own: the server process that [`client_reconnects_after_the_peer_crashes_and_restarts`] starts
/// (this test binary again) and SIGKILLs, so the crash is a real one: no close frame, no goodbye. Without the
/// environment it returns at once.
#[test]
#[ignore = "run as a child process by client_reconnects_after_the_peer_crashes_and_restarts"]
fn peer_process() {
    let Ok(addr) = std::env::var(CHILD_ENV[0]) else { return };
    let var = |i: usize| std::env::var(CHILD_ENV[i]).unwrap();
    let pair = zl_tls::PemPair { cert_pem: var(2), key_pem: var(3) };
    let identity = TlsIdentity::from_pem(&var(1), &pair, Role::Worker, id("w0")).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _guard = rt.enter();
    let (tx, _events) = mpsc::unbounded_channel();
    let settings = RpcSettings { idle_timeout: Duration::from_secs(60), ..Default::default() };
    let handler = Arc::new(TestHandler { events: tx, sent: Default::default() });
    let server = Server::spawn(addr.parse().unwrap(), &identity, settings, handler).unwrap();
    println!("listening {}", server.local_addr());
    // The parent kills this process; a bounded wait in case it never does.
    std::thread::sleep(Duration::from_secs(120));
}

/// A child process, SIGKILLed when dropped (also when the test fails half way).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start [`peer_process`] on `addr`; returns the child and the address it serves on.
fn spawn_peer_process(addr: SocketAddr, ca: &ClusterCa, pair: &zl_tls::PemPair) -> (Killed, SocketAddr) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer_process", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV[0], addr.to_string())
        .env(CHILD_ENV[1], ca.cert_pem())
        .env(CHILD_ENV[2], &pair.cert_pem)
        .env(CHILD_ENV[3], &pair.key_pem)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = lines
        .find_map(|l| Some(l.ok()?.split_once("listening ")?.1.to_owned()))
        .expect("the peer process did not start");
    (Killed(child), listening.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reconnects_after_the_peer_crashes_and_restarts() {
    // A long idle timeout proves the reconnect comes from the restarted peer's stateless reset, not a timeout.
    let settings = RpcSettings { idle_timeout: Duration::from_secs(60), ..Default::default() };
    let ca = ClusterCa::generate("test", 1).unwrap();
    let pair = ca.issue(Role::Worker, &id("w0"), &[], 1).unwrap();
    let (peer, addr) = spawn_peer_process(LOOPBACK.parse().unwrap(), &ca, &pair);
    let client = client(&ca, Role::Frontend, "f0", settings.clone());
    client.call(addr, Role::Worker, route("before")).await.unwrap();

    // SIGKILL, then restart on the same port with the same identity.
    drop(peer);
    let (_restarted, _) = spawn_peer_process(addr, &ca, &pair);
    let started = Instant::now();
    let reply = client.call(addr, Role::Worker, route("after")).await;
    assert!(reply.is_ok(), "{reply:?}");
    assert!(started.elapsed() < Duration::from_secs(30), "reconnect waited for the idle timeout");
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let c = start(RpcSettings::default());
    let rogue_ca = ClusterCa::generate("rogue", 1).unwrap();
    let rogue = client(&rogue_ca, Role::Frontend, "f0", RpcSettings::default());
    match rogue.call(c.server.local_addr(), Role::Worker, route("x")).await {
        Err(CallError::Connect { reason, .. }) => assert!(!reason.is_empty()),
        other => panic!("rogue client got through: {other:?}"),
    }
    // And a client of the real CA does not trust a rogue server.
    let rogue_server_identity = TlsIdentity::issue(&rogue_ca, Role::Worker, id("w0")).unwrap();
    let (tx, _events) = mpsc::unbounded_channel();
    let rogue_server = Server::spawn(
        LOOPBACK.parse().unwrap(),
        &rogue_server_identity,
        RpcSettings::default(),
        Arc::new(TestHandler { events: tx, sent: Default::default() }),
    )
    .unwrap();
    let honest = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    assert!(matches!(
        honest.call(rogue_server.local_addr(), Role::Worker, route("x")).await,
        Err(CallError::Connect { .. })
    ));
}

#[tokio::test]
async fn a_server_that_is_not_the_expected_role_is_refused() {
    let c = start(RpcSettings::default());
    let client = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    // The server is a worker; calling it as an orchestrator fails TLS name verification.
    assert!(matches!(
        client.call(c.server.local_addr(), Role::Orchestrator, route("x")).await,
        Err(CallError::Connect { .. })
    ));
}

#[tokio::test]
async fn a_role_the_server_does_not_serve_is_refused_at_the_handshake() {
    let settings = RpcSettings { allowed_roles: vec![Role::Frontend], ..Default::default() };
    let c = start(settings);
    let admin = client(&c.ca, Role::Admin, "ops", RpcSettings::default());
    match admin.call(c.server.local_addr(), Role::Worker, route("x")).await {
        Err(CallError::Connect { reason, .. }) => assert!(reason.contains("may not call"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn oversized_frames_are_refused_by_the_receiver_and_the_sender() {
    let c = start(RpcSettings { max_payload: 4096, ..Default::default() });
    let addr = c.server.local_addr();
    let big = client(&c.ca, Role::Frontend, "f0", RpcSettings::default());
    match big.call(addr, Role::Worker, generate("huge", 1, vec![7; 4096])).await {
        Err(CallError::Remote(e)) => {
            assert_eq!(e.code, ErrorCode::ProtocolViolation);
            assert!(e.message.contains("exceeds the limit"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    // The connection survives a refused call.
    big.call(addr, Role::Worker, route("still-fine")).await.unwrap();

    let small = client(&c.ca, Role::Frontend, "f1", RpcSettings { max_payload: 1024, ..Default::default() });
    assert!(matches!(small.call(addr, Role::Worker, generate("x", 1, vec![7; 1024])).await, Err(CallError::Encode(_))));
}

#[tokio::test]
async fn a_response_over_the_clients_limit_fails_the_call() {
    let c = start(RpcSettings::default());
    let request = route("r");
    // The client accepts frames exactly as large as its request; the decision (with a 32-byte digest) is larger.
    let limit = zl_wire::Encoder::new(zl_wire::HARD_MAX_PAYLOAD).encode(&request).unwrap().len() - 8;
    let small = client(&c.ca, Role::Frontend, "f0", RpcSettings { max_payload: limit as u32, ..Default::default() });
    let mut stream = small.stream(c.server.local_addr(), Role::Worker, request).await.unwrap();
    match stream.next().await {
        Some(Err(CallError::Protocol(reason))) => assert!(reason.contains("exceeds the limit"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(stream.next().await.is_none());
}

#[tokio::test]
async fn a_slow_reader_holds_the_writer_back() {
    let c = start(RpcSettings::default());
    // The client grants 16 KiB of stream credit: the server can be at most that far ahead of what it reads.
    let client = client(&c.ca, Role::Frontend, "f0", RpcSettings { stream_window: 16 * 1024, ..Default::default() });
    let mut stream =
        client.stream(c.server.local_addr(), Role::Worker, generate("slow", 100_000, vec![1])).await.unwrap();
    assert!(matches!(stream.next().await, Some(Ok(Message::TokenChunk(_)))));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ahead = c.sent.load(Ordering::SeqCst);
    // Each chunk frame is over 40 bytes, so 16 KiB holds well under 1,000 of them.
    assert!(ahead < 1_000, "the server ran {ahead} frames ahead of a reader that read one");
    for _ in 0..5_000 {
        assert!(matches!(stream.next().await, Some(Ok(Message::TokenChunk(_)))));
    }
    assert!(c.sent.load(Ordering::SeqCst) > ahead, "reading did not let the writer continue");
}
