//! The orchestrator's QUIC face: workers register, heartbeat with load reports, push KV-cache events and
//! deregister; frontends ask for routes and sync keys and models.
//!
//! Every caller is authenticated by mutual TLS before a frame is read; a worker may only speak for itself (its
//! certificate's node id must equal the worker id in the message), and only frontends and operators get routes.
//! Errors become wire errors here, in one place.

use std::time::Instant;

use zl_proto::quic::{CallContext, Handler, Responder};
use zl_wire::message::{Ack, DeregisterWorker, ErrorCode, Message, NodeId, Role, WireError};

use crate::orchestrator::Orchestrator;
use crate::raft::CommitError;
use crate::route::{RETRY_AFTER_MS, RouteError};
use crate::state::CommandError;

/// Whether the caller may speak for `worker`: the worker itself, or an operator.
fn speaks_for(ctx: &CallContext, worker: &NodeId) -> Result<(), WireError> {
    let peer = &ctx.peer;
    if peer.role == Role::Admin || (peer.role == Role::Worker && &peer.node_id == worker) {
        return Ok(());
    }
    Err(WireError::new(
        ErrorCode::PermissionDenied,
        format!("{} {} may not speak for worker {worker}", peer.role.name(), peer.node_id),
    ))
}

fn command_error(e: CommitError) -> WireError {
    let code = match &e {
        CommitError::Command(CommandError::NotFound(_)) => ErrorCode::NotFound,
        CommitError::Command(CommandError::Limit(_)) => ErrorCode::Overloaded,
        CommitError::Command(CommandError::Invalid { .. } | CommandError::Exists(_)) => ErrorCode::InvalidRequest,
        CommitError::Remote(s) if s.code() == tonic::Code::NotFound => ErrorCode::NotFound,
        CommitError::Remote(_) => ErrorCode::InvalidRequest,
        CommitError::Unavailable(_) | CommitError::NotAccepted(_) => ErrorCode::Overloaded,
    };
    let mut err = WireError::new(code, e.to_string());
    if matches!(e, CommitError::Unavailable(_) | CommitError::NotAccepted(_)) {
        err.retry_after_ms = RETRY_AFTER_MS;
    }
    err
}

/// A route error as the wire carries it: unknown models are `NotFound`; a node still warming up is
/// `Unavailable` (the frontend asks another orchestrator); everything else `Overloaded` with a retry hint (the
/// frontend answers 529 `overloaded_error` with `retry-after`).
pub fn route_error(e: &RouteError) -> WireError {
    match e {
        RouteError::UnknownModel(_) => WireError::new(ErrorCode::NotFound, e.to_string()),
        RouteError::WarmingUp(_) => WireError::new(ErrorCode::Unavailable, e.to_string()),
        RouteError::NoWorker(_) | RouteError::Saturated(_) => {
            let mut err = WireError::new(ErrorCode::Overloaded, e.to_string());
            err.retry_after_ms = RETRY_AFTER_MS;
            err
        }
    }
}

impl Handler for Orchestrator {
    async fn call(&self, ctx: CallContext, request: Message, out: &mut Responder) -> Result<(), WireError> {
        let now = Instant::now();
        let reply = match request {
            Message::RouteRequest(r) => {
                if !matches!(ctx.peer.role, Role::Frontend | Role::Admin) {
                    return Err(WireError::new(ErrorCode::PermissionDenied, "only frontends ask for routes"));
                }
                let span = tracing::debug_span!(
                    "route",
                    request_id = %r.request_id,
                    trace_id = %zl_common::trace::trace_id_of(&r.trace_id),
                );
                zl_node::otlp::adopt(&span, &r.trace_id);
                let _entered = span.enter();
                if !self.group().votes() {
                    return Err(WireError::new(
                        ErrorCode::Unavailable,
                        "this orchestrator is not a voter: ask another",
                    ));
                }
                let decision = self.route(&r).map_err(|e| {
                    tracing::debug!(error = %e, "no route");
                    route_error(&e)
                })?;
                tracing::debug!(worker = %decision.worker_id, reason = %decision.reason, "routed");
                Message::RouteDecision(decision)
            }
            Message::StateSyncRequest(r) => {
                if !matches!(ctx.peer.role, Role::Frontend | Role::Admin) {
                    return Err(WireError::new(ErrorCode::PermissionDenied, "only frontends sync routing state"));
                }
                self.check_serving(now)?;
                Message::StateSync(self.state_sync(r.known_index, now))
            }
            Message::FrontendReport(r) => {
                if ctx.peer.role != Role::Frontend {
                    return Err(WireError::new(ErrorCode::PermissionDenied, "only frontends report usage"));
                }
                self.check_serving(now)?;
                let node = ctx.peer.node_id.clone();
                Message::FrontendGrant(self.frontend_report(&node, r, now).await.map_err(command_error)?)
            }
            Message::StoredResponse(r) => {
                if ctx.peer.role != Role::Frontend {
                    return Err(WireError::new(ErrorCode::PermissionDenied, "only frontends store responses"));
                }
                self.check_serving(now)?;
                Message::Ack(Ack {
                    applied_index: self.store_response(r).await.map_err(command_error)?,
                    hand_over: false,
                })
            }
            Message::ResponseLookup(r) => {
                if ctx.peer.role != Role::Frontend {
                    return Err(WireError::new(ErrorCode::PermissionDenied, "only frontends read stored responses"));
                }
                self.check_serving(now)?;
                Message::ResponseFound(self.lookup_response(r).await.map_err(command_error)?)
            }
            Message::CertificateRequest(r) => {
                Message::CertificateIssued(self.enroll(ctx.peer.role, ctx.peer.node_id.as_str(), &r).await?)
            }
            // A bootstrap credential gets no further than a certificate request.
            _ if ctx.peer.role == Role::Bootstrap => {
                return Err(WireError::new(ErrorCode::PermissionDenied, "a bootstrap credential may only enroll"));
            }
            Message::RegisterWorker(r) => {
                speaks_for(&ctx, &r.worker_id)?;
                Message::Ack(Ack { applied_index: self.register(&r).await.map_err(command_error)?, hand_over: false })
            }
            Message::DeregisterWorker(DeregisterWorker { worker_id, reason }) => {
                speaks_for(&ctx, &worker_id)?;
                tracing::info!(worker = %worker_id, %reason, "deregistration requested");
                let applied_index = self.deregister(&worker_id).await.map_err(command_error)?;
                Message::Ack(Ack { applied_index, hand_over: false })
            }
            Message::LoadReport(r) => {
                speaks_for(&ctx, &r.worker_id)?;
                let worker = r.worker_id.clone();
                self.load_report(r, now)?;
                let hand_over = self.with_state(|s| s.workers().get(&worker).is_some_and(|w| w.hand_over));
                Message::Ack(Ack { applied_index: 0, hand_over })
            }
            Message::KvCacheEvents(e) => {
                speaks_for(&ctx, &e.worker_id)?;
                self.kv_events(&e, now)?;
                Message::Ack(Ack { applied_index: 0, hand_over: false })
            }
            other => {
                return Err(WireError::new(
                    ErrorCode::InvalidRequest,
                    format!("an orchestrator does not serve {:?} calls", other.kind()),
                ));
            }
        };
        out.send(reply).await.map_err(|e| WireError::new(ErrorCode::Cancelled, e.to_string()))
    }
}
