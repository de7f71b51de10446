//! The QUIC upstream over real QUIC on 127.0.0.1: a call moves to the next orchestrator when one fails, asks the
//! round again (a bounded number of times) while an orchestrator answers that it is not ready yet, and fails at
//! once on a refusal every replica would repeat.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use zl_client::upstream::{QuicUpstream, Upstream};
use zl_proto::CallError;
use zl_proto::quic::{CallContext, Client, Handler, Responder, RpcSettings, Server};
use zl_tls::{ClusterCa, TlsIdentity};
use zl_wire::Message;
use zl_wire::message::{ComputePool, ErrorCode, NodeId, Role, RouteDecision, RouteRequest, WireError};

/// An orchestrator that answers its first `refusals` routes with `code`, then routes.
struct Orchestrator {
    refusals: u32,
    code: ErrorCode,
    calls: Arc<AtomicU32>,
}

impl Handler for Orchestrator {
    async fn call(&self, _ctx: CallContext, request: Message, out: &mut Responder) -> Result<(), WireError> {
        let Message::RouteRequest(r) = request else {
            return Err(WireError::new(ErrorCode::InvalidRequest, "a route request was expected"));
        };
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.refusals {
            return Err(WireError::new(self.code, "not ready"));
        }
        let decision = RouteDecision {
            request_id: r.request_id,
            worker_id: NodeId::new("w0").unwrap(),
            endpoint: "127.0.0.1:7000".into(),
            model: r.model,
            weights_sha256: [1; 32],
            compute_pool: ComputePool::Cpu,
            predicted_billing_unit: 0.5,
            reason: String::new(),
            decision_nanos: 1,
            orchestrator_id: String::new(),
            adapter: None,
        };
        out.send(Message::RouteDecision(decision)).await.map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))
    }
}

fn route() -> RouteRequest {
    RouteRequest { request_id: "r".into(), model: "m".into(), prompt_tokens: 5, max_tokens: 5, ..Default::default() }
}

/// Two orchestrators that refuse their first `refusals` routes each with `code`; their call counters.
fn fleet(refusals: u32, code: ErrorCode) -> (QuicUpstream, Vec<Server>, Vec<Arc<AtomicU32>>) {
    let ca = ClusterCa::generate("test", 1).unwrap();
    let (mut servers, mut counters, mut addrs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..2 {
        let identity = TlsIdentity::issue(&ca, Role::Orchestrator, NodeId::new(format!("o{i}")).unwrap()).unwrap();
        let calls = Arc::new(AtomicU32::new(0));
        let handler = Arc::new(Orchestrator { refusals, code, calls: calls.clone() });
        let server = Server::spawn("127.0.0.1:0".parse().unwrap(), &identity, RpcSettings::default(), handler).unwrap();
        addrs.push(server.local_addr());
        servers.push(server);
        counters.push(calls);
    }
    let identity = TlsIdentity::issue(&ca, Role::Frontend, NodeId::new("fe").unwrap()).unwrap();
    let client = Client::new(&identity, RpcSettings::default()).unwrap();
    (QuicUpstream::new(client, addrs), servers, counters)
}

fn total(counters: &[Arc<AtomicU32>]) -> u32 {
    counters.iter().map(|c| c.load(Ordering::SeqCst)).sum()
}

#[tokio::test]
async fn a_route_outlives_a_moment_when_no_orchestrator_is_ready() {
    // Each answers "ask another" twice: rounds one and two fail, round three routes.
    let (upstream, _servers, counters) = fleet(2, ErrorCode::Unavailable);
    let decision = upstream.route(route()).await.expect("routed on a later round");
    assert_eq!(decision.worker_id, NodeId::new("w0").unwrap());
    assert_eq!(total(&counters), 5, "two full rounds refused, the third's first call routed");
}

#[tokio::test]
async fn asking_again_is_bounded() {
    let (upstream, _servers, counters) = fleet(u32::MAX, ErrorCode::Unavailable);
    let started = Instant::now();
    let err = upstream.route(route()).await.expect_err("never ready");
    assert!(matches!(&err, CallError::Remote(w) if w.code == ErrorCode::Unavailable), "{err}");
    assert_eq!(total(&counters), 8, "the first round and three more");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1750) && took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test]
async fn a_refusal_every_replica_would_repeat_is_not_asked_again() {
    let (upstream, _servers, counters) = fleet(u32::MAX, ErrorCode::Overloaded);
    let err = upstream.route(route()).await.expect_err("overloaded");
    assert!(matches!(&err, CallError::Remote(w) if w.code == ErrorCode::Overloaded), "{err}");
    assert_eq!(total(&counters), 1, "the first orchestrator's typed answer is final");
}

/// Every orchestrator killed (its port silent): a route fails within about one round of short deadlines, not
/// after four rounds of full ones (11 s for three before), and the next one faster still.
#[tokio::test]
async fn when_every_orchestrator_is_down_a_route_fails_fast() {
    let (upstream, servers, _counters) = fleet(0, ErrorCode::Unavailable);
    upstream.route(route()).await.expect("routed while they are up");
    for server in servers {
        server.shutdown(Duration::ZERO).await;
    }
    // Past the window in which a missed deadline still counts as "alive but slow".
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let started = Instant::now();
    upstream.route(route()).await.expect_err("every orchestrator is down");
    let first = started.elapsed();
    assert!(first < Duration::from_millis(2500), "one round of two 800 ms deadlines at most: {first:?}");
    let started = Instant::now();
    upstream.route(route()).await.expect_err("still down");
    let second = started.elapsed();
    assert!(second < Duration::from_millis(1200), "suspects get short deadlines: {second:?}");
}
