//! The HTTP edge: the axum router (a `tower::Service`, so tests drive it without sockets), request ids, the
//! headers every response carries, error responses, and the small endpoints. The generation endpoints are in
//! `generate.rs`, the model listing in `models.rs`, the server loop in `server.rs`.

mod choices;
mod embeddings;
mod generate;
pub mod hop;
mod keep_alive;
mod models;
pub mod peer_pool;
mod per_client;
mod recorder;
mod respond;
mod server;
pub mod spill;
mod stored;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

pub use models::{ListParams, page};
pub use server::{EdgeLimits, serve, tls_config};

use crate::anthropic::Messages;
use crate::completions::Completions;
use crate::error::{ApiError, ErrorFormat, ErrorKind, Failure};
use crate::gateway::{CacheStatus, Gateway, Meta};
use crate::ids::{random_hex, random_id};
use crate::limits::{Figures, RateFigures};
use crate::openai::ChatCompletions;
use crate::responses::Responses;
use zl_common::trace::TraceContext;

/// Anthropic's request size limit.
pub const DEFAULT_BODY_LIMIT: usize = 32 * 1024 * 1024;

/// Shared state of the HTTP handlers.
#[derive(Clone)]
pub struct App {
    /// The request path's logic.
    pub gateway: Arc<Gateway>,
    /// Largest accepted request body.
    pub body_limit: usize,
    /// The edge's deadlines (the body-read one is enforced here; the others by the server loop).
    pub edge: EdgeLimits,
    /// This frontend's region and its peer regions (spillover and data residency).
    pub spill: Arc<spill::Spill>,
    /// The audit log (none: requests are not audited).
    pub audit: Option<Arc<crate::audit::AuditLog>>,
}

/// The router: every endpoint of both APIs, health and readiness. `/metrics` is not here: it is served on the
/// internal `--metrics-addr` listener, never on the public API port.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/v1/messages", post(generate::generate::<Messages>))
        .route("/v1/messages/count_tokens", post(generate::count_tokens))
        .route("/v1/chat/completions", post(generate::generate::<ChatCompletions>))
        .route("/v1/completions", post(generate::generate::<Completions>))
        .route("/v1/responses", post(generate::generate::<Responses>))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses/{id}", get(stored::get_response).delete(stored::delete_response))
        .route("/v1/responses/{id}/input_items", get(stored::input_items))
        .route("/v1/models", get(models::list_models))
        .route("/v1/models/{id}", get(models::get_model))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(keep_alive::keep_alive))
        .layer(axum::middleware::from_fn_with_state(app.clone(), with_request_id))
        .with_state(app)
}

/// The id of the request being served, in request extensions.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// Give the request its id (a new one, or the one a peer region's frontend forwarded it with), and answer with it
/// and with the region that served it.
async fn with_request_id(State(app): State<App>, mut req: Request, next: axum::middleware::Next) -> Response {
    // A signed hop from a peer region is verified once, here; the handlers read it from the request's extensions.
    let hop = app.spill.hop(req.headers(), req.uri().path());
    let id = hop.as_ref().map_or_else(|| random_id("req_", 24), |h| h.request_id.clone());
    if let Some(hop) = hop {
        req.extensions_mut().insert(hop);
    }
    req.extensions_mut().insert(RequestId(id.clone()));
    // The client's trace (W3C traceparent), or a new one; this frontend's span becomes the parent of the calls to the
    // orchestrator and the worker (the handlers read the rewritten header).
    let caller = req.headers().get("traceparent").and_then(|v| v.to_str().ok()).and_then(TraceContext::parse);
    let mut trace = match &caller {
        Some(t) => t.child(random_hex(16)),
        None => TraceContext { trace_id: random_hex(32), span_id: random_hex(16), flags: 1 },
    };
    let span = tracing::info_span!("request", request_id = %id, trace_id = %trace.trace_id, method = %req.method(), path = %req.uri().path());
    // Exported over OTLP, this span is the request's: its id is the parent the next tiers are given.
    let parent = caller.as_ref().map_or_else(|| trace.header(), TraceContext::header);
    if let Some(own) = zl_node::otlp::adopt(&span, &parent) {
        trace = own;
    }
    if let Ok(v) = HeaderValue::from_str(&trace.header()) {
        req.headers_mut().insert("traceparent", v);
    }
    let mut resp = tracing::Instrument::instrument(next.run(req), span).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("request-id", v);
    }
    if let Ok(v) = HeaderValue::from_str(&trace.trace_id) {
        resp.headers_mut().insert("x-zl-trace-id", v);
    }
    if !resp.headers().contains_key(spill::REGION_HEADER)
        && let Ok(v) = HeaderValue::from_str(app.spill.regions.local())
    {
        resp.headers_mut().insert(spill::REGION_HEADER, v);
    }
    resp
}

fn request_id(req: &Request) -> String {
    req.extensions().get::<RequestId>().map_or_else(|| random_id("req_", 24), |r| r.0.clone())
}

fn set(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// RFC 3339 UTC time, second precision.
pub fn rfc3339(t: SystemTime) -> String {
    zl_common::calendar::rfc3339(t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

fn rate_headers(headers: &mut HeaderMap, rate: &RateFigures) {
    let now = SystemTime::now();
    let mut put = |dim: &str, f: Option<Figures>| {
        let Some(f) = f else { return };
        for (suffix, value) in [
            ("limit", f.limit.to_string()),
            ("remaining", f.remaining.to_string()),
            ("reset", rfc3339(now + f.reset_in)),
        ] {
            if let (Ok(name), Ok(v)) = (
                HeaderName::from_bytes(format!("anthropic-ratelimit-{dim}-{suffix}").as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                headers.insert(name, v);
            }
        }
    };
    put("requests", rate.requests);
    put("tokens", rate.tokens);
    put("input-tokens", rate.input_tokens);
    put("output-tokens", rate.output_tokens);
}

/// What a client may read of a route's explanation: the policy that chose, never its cost terms. Those name the
/// queue, running and in-flight counts of workers other tenants share (and how much of a prompt their caches
/// hold); they stay in the frontend's trace and the orchestrator's debug log.
fn public_reason(reason: &str) -> &str {
    reason.split_once(':').map_or(reason, |(policy, _)| policy).trim()
}

/// Headers every API response carries: zerolayer's routing facts (a `-` where a fact does not apply) and the
/// rate-limit figures. `x-zl-route-reason` names the policy that chose the worker ([`public_reason`]).
fn zl_headers(headers: &mut HeaderMap, meta: Option<&Meta>, rate: Option<&RateFigures>, health: &str) {
    let (worker, pool, unit, cache, route_ms, reason) = match meta {
        Some(m) => (
            m.worker.clone(),
            m.pool,
            format!("{:.4}", m.predicted_billing_unit),
            m.cache.as_str(),
            // An answer from the cache asked no orchestrator: no route time to report.
            if m.cache == CacheStatus::Hit { "-".into() } else { format!("{:.3}", m.route_ms) },
            if m.route_reason.is_empty() { "-" } else { public_reason(&m.route_reason) },
        ),
        None => ("-".into(), "-", "-".into(), "bypass", "-".into(), "-"),
    };
    set(headers, "x-zl-worker", &worker);
    set(headers, "x-zl-compute-path", pool);
    set(headers, "x-zl-billing-unit", &unit);
    set(headers, "x-zl-cache", cache);
    set(headers, "x-zl-route-ms", &route_ms);
    set(headers, "x-zl-route-reason", reason);
    set(headers, "x-zl-health", health);
    if let Some(rate) = rate.or(meta.map(|m| &m.rate)) {
        rate_headers(headers, rate);
    }
}

/// A failure as `format` writes it, with the headers every response carries.
fn error_response(app: &App, format: ErrorFormat, rid: &str, failure: &Failure) -> Response {
    let (e, rate) = (&failure.error, failure.rate.as_ref());
    let mut resp = (e.kind.status(), axum::Json(e.body(format, rid))).into_response();
    let headers = resp.headers_mut();
    if let Some(s) = e.retry_after_s {
        set(headers, "retry-after", &s.to_string());
    }
    zl_headers(headers, None, rate, app.gateway.cluster().health(Instant::now()));
    if e.kind == ErrorKind::Api {
        tracing::error!(request_id = rid, error = %e.message, "request failed");
    }
    resp
}

async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// Ready when an orchestrator answered recently, whether or not a worker is healthy (`serving_workers` and the
/// health level say that; a region without workers still spills). An unreachable discovery backend shows
/// in the answer (and `x-zl-health: degraded`) without failing it: every frontend keeps serving with the
/// orchestrators it last knew, and failing them all at once would turn a Consul outage into an API outage.
async fn readyz(State(app): State<App>) -> Response {
    let now = Instant::now();
    let cluster = app.gateway.cluster();
    let ready = cluster.ready(now);
    let status = if ready.is_ok() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let mut body = match ready {
        Ok(()) => json!({"status": "ready"}),
        Err(reason) => json!({"status": "not ready", "reason": reason}),
    };
    body["serving_workers"] = json!(cluster.serving_workers());
    if let Some(d) = cluster.discovery() {
        body["discovery"] = json!({
            "backend": "consul",
            "reachable": d.reachable,
            "for_s": now.saturating_duration_since(d.since).as_secs(),
            "last_error": d.last_error,
        });
    }
    let regions = &app.spill.regions;
    let peer_list = regions.peers();
    let peers: Vec<&str> = peer_list.iter().map(|p| p.region.as_str()).collect();
    body["region"] = json!({"local": regions.local(), "peers": peers, "backing_off": regions.down(now)});
    let (level, why) = cluster.level(now);
    body["health"] = json!({"level": level.as_str(), "reason": why});
    let mut resp = (status, axum::Json(body)).into_response();
    set(resp.headers_mut(), "x-zl-health", level.as_str());
    resp
}

/// How errors on `path` are written: OpenAI's shape on OpenAI's paths (known or not), Anthropic's elsewhere.
pub fn error_format_for(path: &str) -> ErrorFormat {
    const OPENAI: [&str; 6] =
        ["/v1/chat", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/files", "/v1/batches"];
    let openai =
        OPENAI.iter().any(|p| path.strip_prefix(p).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')));
    if openai { ErrorFormat::OpenAi } else { ErrorFormat::Anthropic }
}

async fn fallback(State(app): State<App>, req: Request) -> Response {
    let rid = request_id(&req);
    let format = error_format_for(req.uri().path());
    let e = ApiError::new(ErrorKind::NotFound, format!("Not found: {} {}", req.method(), req.uri().path()));
    error_response(&app, format, &rid, &e.into())
}

async fn method_not_allowed(req: Request) -> Response {
    let e = ApiError::invalid(format!("method {} is not allowed on {}", req.method(), req.uri().path()));
    let format = error_format_for(req.uri().path());
    let mut resp = (StatusCode::METHOD_NOT_ALLOWED, axum::Json(e.body(format, &request_id(&req)))).into_response();
    set(resp.headers_mut(), "x-zl-health", "healthy");
    resp
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn clients_see_the_policy_not_the_fleets_load() {
        let full = "prefix-aware: 8 of 10 prompt blocks cached, 0 prefill blocks waiting, queue 3 + running 7 + in \
                    flight 1, cost 2.0; pool cpu (cost 0.12)";
        assert_eq!(public_reason(full), "prefix-aware");
        assert_eq!(public_reason("least-loaded: queue 0 + running 2"), "least-loaded");
        assert_eq!(public_reason("test"), "test");
    }

    #[test]
    fn openai_paths_get_openai_errors() {
        for p in [
            "/v1/chat/completions",
            "/v1/chat/x",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses/r_1",
            "/v1/batches",
        ] {
            assert_eq!(error_format_for(p), ErrorFormat::OpenAi, "{p}");
        }
        for p in ["/v1/messages", "/v1/messages/batches", "/v1/models", "/v2/anything", "/v1/completionsx"] {
            assert_eq!(error_format_for(p), ErrorFormat::Anthropic, "{p}");
        }
    }

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_000_000)), "2026-11-18T11:06:40Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
    }
}
