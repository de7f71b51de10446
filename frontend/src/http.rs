//! The HTTP edge: the axum router (a `tower::Service`, so tests drive it without sockets), response headers, SSE
//! bodies, and the server loop (HTTP/1.1 and h2c on plain TCP, HTTP/2 and HTTP/1.1 over TLS with ALPN, graceful
//! draining of open streams on shutdown).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::anthropic;
use crate::cluster::KeyInfo;
use crate::error::{ApiError, Dialect, ErrorKind};
use crate::gateway::{Gateway, GenEvent, Generation, Meta, RequestOptions};
use crate::limits::{Figures, RateFigures};
use crate::openai;

/// Anthropic's request size limit.
pub const DEFAULT_BODY_LIMIT: usize = 32 * 1024 * 1024;

/// Renders the Prometheus text for `/metrics`.
pub type MetricsRender = Arc<dyn Fn() -> String + Send + Sync>;

/// Shared state of the HTTP handlers.
#[derive(Clone)]
pub struct App {
    /// The request path's logic.
    pub gateway: Arc<Gateway>,
    /// `/metrics` renderer (none: 404).
    pub metrics: Option<MetricsRender>,
    /// Largest accepted request body.
    pub body_limit: usize,
}

/// The router: every endpoint of both APIs, health, readiness and metrics.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(with_request_id))
        .with_state(app)
}

/// The id of the request being served, in request extensions.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

fn random_id(prefix: &str, len: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut bytes = vec![0u8; len];
    let rng = ring::rand::SystemRandom::new();
    if ring::rand::SecureRandom::fill(&rng, &mut bytes).is_err() {
        // Never on a working OS; fall back to the clock so ids stay unique enough for logs.
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes.iter_mut().enumerate().for_each(|(i, b)| *b = (nanos >> (i % 16 * 8)) as u8 ^ i as u8);
    }
    let mut id = String::with_capacity(prefix.len() + len);
    id.push_str(prefix);
    id.extend(bytes.iter().map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char));
    id
}

async fn with_request_id(mut req: Request, next: axum::middleware::Next) -> Response {
    let id = random_id("req_", 24);
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!("request", request_id = %id, method = %req.method(), path = %req.uri().path());
    let mut resp = tracing::Instrument::instrument(next.run(req), span).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("request-id", v);
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
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
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

/// Headers every API response carries: zerolayer's routing facts (a `-` where a fact does not apply) and the
/// rate-limit figures.
fn zl_headers(headers: &mut HeaderMap, meta: Option<&Meta>, rate: Option<&RateFigures>, health: &str) {
    let (worker, pool, unit, cache, route_ms) = match meta {
        Some(m) => (
            m.worker.clone(),
            m.pool,
            format!("{:.4}", m.predicted_billing_unit),
            m.cache.as_str(),
            format!("{:.3}", m.route_ms),
        ),
        None => ("-".into(), "-", "-".into(), "bypass", "-".into()),
    };
    set(headers, "x-zl-worker", &worker);
    set(headers, "x-zl-compute-path", pool);
    set(headers, "x-zl-billing-unit", &unit);
    set(headers, "x-zl-cache", cache);
    set(headers, "x-zl-route-ms", &route_ms);
    set(headers, "x-zl-health", health);
    if let Some(rate) = rate.or(meta.map(|m| &m.rate)) {
        rate_headers(headers, rate);
    }
}

fn error_response(app: &App, dialect: Dialect, rid: &str, e: &ApiError, rate: Option<&RateFigures>) -> Response {
    let mut resp = (e.kind.status(), axum::Json(e.body(dialect, rid))).into_response();
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

fn record(api: &'static str, model: &str, status: u16, started: Instant) {
    let status = status.to_string();
    metrics::counter!("zl_frontend_requests_total", "api" => api, "model" => model.to_owned(), "status" => status.clone())
        .increment(1);
    metrics::histogram!("zl_frontend_request_duration_seconds", "api" => api, "model" => model.to_owned(), "status" => status)
        .record(started.elapsed().as_secs_f64());
}

/// Records a request's status and duration when dropped (for streams: when the body ends or the client leaves).
struct Recorder {
    api: &'static str,
    model: String,
    status: u16,
    started: Instant,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        record(self.api, &self.model, self.status, self.started);
    }
}

async fn read_json(app: &App, req: Request) -> Result<Value, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorKind::RequestTooLarge,
            format!("request body is larger than the {} MB limit", app.body_limit / (1024 * 1024)),
        )
    };
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        && len > app.body_limit
    {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(req.into_body(), app.body_limit).await.map_err(|e| {
        let limit = std::error::Error::source(&e)
            .is_some_and(|s| s.downcast_ref::<http_body_util::LengthLimitError>().is_some())
            || e.to_string().contains("length limit");
        if limit { too_large() } else { ApiError::invalid(format!("could not read the request body: {e}")) }
    })?;
    if bytes.is_empty() {
        return Err(ApiError::invalid("the request body is empty; send a JSON object"));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        if std::str::from_utf8(&bytes).is_err() {
            ApiError::invalid("the request body is not valid UTF-8")
        } else {
            ApiError::invalid(format!("the request body is not valid JSON: {e}"))
        }
    })
}

/// A handler's failure: the error and, once admitted, the rate-limit figures.
type Failure = (ApiError, Option<RateFigures>);

fn fail(e: ApiError) -> Failure {
    (e, None)
}

async fn admitted(
    app: &App,
    req: Request,
    rid: &str,
    parse: impl FnOnce(&Value) -> Result<crate::gateway::GenRequest, ApiError>,
) -> Result<(KeyInfo, crate::gateway::Prepared, RequestOptions), Failure> {
    let key = app.gateway.authenticate(req.headers()).map_err(fail)?;
    // From here on the caller is known: failures carry its rate-limit figures too.
    let known = |e: ApiError| (e, Some(app.gateway.rate_figures(&key)));
    let opts = RequestOptions::from_headers(req.headers()).map_err(known)?;
    let body = read_json(app, req).await.map_err(known)?;
    let gen_req = parse(&body).map_err(known)?;
    let prepared = app.gateway.prepare(gen_req, rid).await.map_err(known)?;
    Ok((key, prepared, opts))
}

fn created_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn sse_response(meta: &Meta, health: &str, body: Body) -> Response {
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    zl_headers(headers, Some(meta), None, health);
    resp
}

fn json_response(meta: &Meta, health: &str, value: Value, billing_unit: f32) -> Response {
    let mut resp = axum::Json(value).into_response();
    let headers = resp.headers_mut();
    zl_headers(headers, Some(meta), None, health);
    // The final unit is known for a complete answer.
    set(headers, "x-zl-billing-unit", &format!("{billing_unit:.4}"));
    resp
}

/// A body that pulls events from a generation and renders each as text; ends after the finish or an error.
fn event_body(
    generation: Generation,
    head: String,
    recorder: Recorder,
    render: impl Fn(&GenEvent) -> String + Send + 'static,
    render_error: impl Fn(&ApiError) -> String + Send + 'static,
) -> Body {
    struct S<R, E> {
        generation: Generation,
        head: Option<String>,
        done: bool,
        recorder: Recorder,
        render: R,
        render_error: E,
    }
    let state = S { generation, head: Some(head), done: false, recorder, render, render_error };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        if let Some(head) = s.head.take().filter(|h| !h.is_empty()) {
            return Some((Ok::<_, std::convert::Infallible>(Bytes::from(head)), s));
        }
        if s.done {
            return None;
        }
        loop {
            let text = match s.generation.next().await {
                Some(Ok(GenEvent::Delta(d))) if d.is_empty() => continue,
                Some(Ok(ev)) => {
                    s.done = matches!(ev, GenEvent::Finish(_));
                    (s.render)(&ev)
                }
                Some(Err(e)) => {
                    s.done = true;
                    s.recorder.status = e.kind.status().as_u16();
                    (s.render_error)(&e)
                }
                None => {
                    s.done = true;
                    let e = ApiError::internal("the generation ended without a finish");
                    s.recorder.status = 500;
                    (s.render_error)(&e)
                }
            };
            return Some((Ok(Bytes::from(text)), s));
        }
    });
    Body::from_stream(stream)
}

async fn messages(State(app): State<App>, req: Request) -> Response {
    let rid = request_id(&req);
    let started = Instant::now();
    let result = async {
        let (key, prepared, opts) = admitted(&app, req, &rid, |b| anthropic::parse(b, false)).await?;
        let stream = prepared.req.stream;
        let model_name = prepared.req.model.clone();
        let (meta, generation) =
            app.gateway.start(&key, prepared, &opts, &rid).await.map_err(|(e, rate)| (e, Some(rate)))?;
        let health = app.gateway.cluster().health(Instant::now());
        let msg_id = random_id("msg_", 24);
        if stream {
            let recorder = Recorder { api: "messages", model: model_name, status: 200, started };
            let head = anthropic::stream_start(&msg_id, &meta.model, meta.input_tokens);
            let body = event_body(
                generation,
                head,
                recorder,
                |ev| match ev {
                    GenEvent::Delta(d) => anthropic::stream_delta(d),
                    GenEvent::Finish(f) => anthropic::stream_end(f),
                },
                anthropic::stream_error,
            );
            return Ok(sse_response(&meta, health, body));
        }
        let (text, finish) = generation.collect().await.map_err(|e| (e, Some(meta.rate)))?;
        record("messages", &model_name, 200, started);
        let body = anthropic::message(&msg_id, &meta.model, &text, &finish);
        Ok(json_response(&meta, health, body, finish.billing_unit))
    }
    .await;
    result.unwrap_or_else(|(e, rate): Failure| {
        record("messages", "-", e.kind.status().as_u16(), started);
        error_response(&app, Dialect::Anthropic, &rid, &e, rate.as_ref())
    })
}

async fn chat_completions(State(app): State<App>, req: Request) -> Response {
    let rid = request_id(&req);
    let started = Instant::now();
    let result = async {
        let mut include_usage = false;
        let (key, prepared, opts) = admitted(&app, req, &rid, |b| {
            let parsed = openai::parse(b)?;
            include_usage = parsed.include_usage;
            Ok(parsed.req)
        })
        .await?;
        let stream = prepared.req.stream;
        let model_name = prepared.req.model.clone();
        let fingerprint = format!("zl-{}", &prepared.card.weights[..prepared.card.weights.len().min(12)]);
        let (meta, generation) =
            app.gateway.start(&key, prepared, &opts, &rid).await.map_err(|(e, rate)| (e, Some(rate)))?;
        let health = app.gateway.cluster().health(Instant::now());
        let id = random_id("chatcmpl-", 24);
        let created = created_now();
        let model = meta.model.clone();
        if stream {
            let recorder = Recorder { api: "chat_completions", model: model_name, status: 200, started };
            let head =
                openai::chunk(&id, created, &model, &fingerprint, json!({"role": "assistant", "content": ""}), None);
            let body = event_body(
                generation,
                head,
                recorder,
                move |ev| match ev {
                    GenEvent::Delta(d) => {
                        openai::chunk(&id, created, &model, &fingerprint, json!({"content": d}), None)
                    }
                    GenEvent::Finish(f) => {
                        let mut out = openai::chunk(&id, created, &model, &fingerprint, json!({}), Some(f.stop_reason));
                        if include_usage {
                            out += &openai::usage_chunk(&id, created, &model, &fingerprint, f);
                        }
                        out + openai::DONE
                    }
                },
                openai::stream_error,
            );
            return Ok(sse_response(&meta, health, body));
        }
        let (text, finish) = generation.collect().await.map_err(|e| (e, Some(meta.rate)))?;
        record("chat_completions", &model_name, 200, started);
        let body = openai::completion(&id, created, &model, &fingerprint, &text, &finish);
        Ok(json_response(&meta, health, body, finish.billing_unit))
    }
    .await;
    result.unwrap_or_else(|(e, rate): Failure| {
        record("chat_completions", "-", e.kind.status().as_u16(), started);
        error_response(&app, Dialect::OpenAi, &rid, &e, rate.as_ref())
    })
}

async fn count_tokens(State(app): State<App>, req: Request) -> Response {
    let rid = request_id(&req);
    let key = match app.gateway.authenticate(req.headers()) {
        Ok(key) => key,
        Err(e) => return error_response(&app, Dialect::Anthropic, &rid, &e, None),
    };
    let rate = app.gateway.rate_figures(&key);
    let result = async {
        let body = read_json(&app, req).await?;
        let gen_req = anthropic::parse(&body, true)?;
        app.gateway.count_tokens(gen_req, &rid).await
    }
    .await;
    match result {
        Ok(n) => {
            let mut resp = axum::Json(json!({"input_tokens": n})).into_response();
            zl_headers(resp.headers_mut(), None, Some(&rate), app.gateway.cluster().health(Instant::now()));
            resp
        }
        Err(e) => error_response(&app, Dialect::Anthropic, &rid, &e, Some(&rate)),
    }
}

/// Which listing shape: Anthropic's when the request carries `anthropic-version` (the Anthropic SDK always
/// sends it), OpenAI's otherwise.
fn models_dialect(headers: &HeaderMap) -> Dialect {
    if headers.contains_key("anthropic-version") { Dialect::Anthropic } else { Dialect::OpenAi }
}

fn model_object(dialect: Dialect, id: &str) -> Value {
    match dialect {
        Dialect::Anthropic => {
            json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"})
        }
        Dialect::OpenAi => json!({"id": id, "object": "model", "created": 0, "owned_by": "zerolayer"}),
    }
}

/// `GET /v1/models` pagination parameters (Anthropic's; OpenAI's listing ignores them).
#[derive(Debug, Default, serde::Deserialize)]
pub struct ListParams {
    limit: Option<String>,
    after_id: Option<String>,
    before_id: Option<String>,
}

/// One page of ids in Anthropic's order, and whether more follow.
pub fn page(ids: &[String], limit: usize, after: Option<&str>, before: Option<&str>) -> (Vec<String>, bool) {
    match (after, before) {
        (Some(after), _) => {
            let start = ids.iter().position(|i| i == after).map_or(ids.len(), |p| p + 1);
            let rest = &ids[start..];
            (rest.iter().take(limit).cloned().collect(), rest.len() > limit)
        }
        (None, Some(before)) => {
            let end = ids.iter().position(|i| i == before).unwrap_or(0);
            let head = &ids[..end];
            let from = head.len().saturating_sub(limit);
            (head[from..].to_vec(), from > 0)
        }
        (None, None) => (ids.iter().take(limit).cloned().collect(), ids.len() > limit),
    }
}

async fn list_models(
    State(app): State<App>,
    query: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    let rid = request_id(&req);
    let dialect = models_dialect(req.headers());
    let rate = match app.gateway.authenticate(req.headers()) {
        Ok(key) => app.gateway.rate_figures(&key),
        Err(e) => return error_response(&app, dialect, &rid, &e, None),
    };
    let Ok(Query(params)) = query else {
        return error_response(&app, dialect, &rid, &ApiError::invalid("the query string is malformed"), Some(&rate));
    };
    let ids: Vec<String> = app.gateway.cluster().models().into_iter().map(|m| m.id).collect();
    let body = match dialect {
        Dialect::OpenAi => {
            json!({"object": "list", "data": ids.iter().map(|id| model_object(dialect, id)).collect::<Vec<_>>()})
        }
        Dialect::Anthropic => {
            let limit = match params.limit.as_deref().map(str::parse::<usize>) {
                None => 20,
                Some(Ok(l)) if (1..=1000).contains(&l) => l,
                Some(_) => {
                    let e = ApiError::invalid_param("limit", "limit: Input should be an integer between 1 and 1000");
                    return error_response(&app, dialect, &rid, &e, Some(&rate));
                }
            };
            let (items, has_more) = page(&ids, limit, params.after_id.as_deref(), params.before_id.as_deref());
            json!({
                "data": items.iter().map(|id| model_object(dialect, id)).collect::<Vec<_>>(),
                "has_more": has_more,
                "first_id": items.first(),
                "last_id": items.last(),
            })
        }
    };
    let mut resp = axum::Json(body).into_response();
    zl_headers(resp.headers_mut(), None, Some(&rate), app.gateway.cluster().health(Instant::now()));
    resp
}

async fn get_model(State(app): State<App>, Path(id): Path<String>, req: Request) -> Response {
    let rid = request_id(&req);
    let dialect = models_dialect(req.headers());
    let rate = match app.gateway.authenticate(req.headers()) {
        Ok(key) => app.gateway.rate_figures(&key),
        Err(e) => return error_response(&app, dialect, &rid, &e, None),
    };
    if !app.gateway.cluster().models().iter().any(|m| m.id == id) {
        return error_response(&app, dialect, &rid, &crate::cluster::not_found(&id), Some(&rate));
    }
    let mut resp = axum::Json(model_object(dialect, &id)).into_response();
    zl_headers(resp.headers_mut(), None, Some(&rate), app.gateway.cluster().health(Instant::now()));
    resp
}

async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn readyz(State(app): State<App>) -> Response {
    match app.gateway.cluster().ready(Instant::now()) {
        Ok(()) => axum::Json(json!({"status": "ready"})).into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "not ready", "reason": reason})))
            .into_response(),
    }
}

async fn metrics_text(State(app): State<App>) -> Response {
    match &app.metrics {
        Some(render) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], render()).into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

async fn fallback(State(app): State<App>, req: Request) -> Response {
    let rid = request_id(&req);
    let dialect = if req.uri().path().starts_with("/v1/chat") { Dialect::OpenAi } else { Dialect::Anthropic };
    let e = ApiError::new(ErrorKind::NotFound, format!("Not found: {} {}", req.method(), req.uri().path()));
    error_response(&app, dialect, &rid, &e, None)
}

async fn method_not_allowed(req: Request) -> Response {
    let e = ApiError::invalid(format!("method {} is not allowed on {}", req.method(), req.uri().path()));
    let mut resp =
        (StatusCode::METHOD_NOT_ALLOWED, axum::Json(e.body(Dialect::Anthropic, &request_id(&req)))).into_response();
    set(resp.headers_mut(), "x-zl-health", "ok");
    resp
}

/// TLS for the public listener: a certificate chain and key (PEM files), ALPN h2 then http/1.1.
pub fn tls_config(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading the key {}", key.display()))?;
    let mut config = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serve `router` on `listener` until `shutdown` resolves, then stop accepting, let open requests and streams
/// finish for up to `drain`, and return.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()>,
    drain: Duration,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let builder = Builder::new(TokioExecutor::new());
        match &acceptor {
            None => {
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                    };
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service).into_owned();
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
        }
    }
    drop(listener);
    tracing::info!("draining open connections");
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!(?drain, "connections still open after the drain timeout; closing them");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_000_000)), "2026-11-18T11:06:40Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn pages_follow_anthropic_cursors() {
        let ids: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).to_vec();
        assert_eq!(page(&ids, 2, None, None), (vec!["a".into(), "b".into()], true));
        assert_eq!(page(&ids, 2, Some("b"), None), (vec!["c".into(), "d".into()], true));
        assert_eq!(page(&ids, 2, Some("d"), None), (vec!["e".into()], false));
        assert_eq!(page(&ids, 2, None, Some("d")), (vec!["b".into(), "c".into()], true));
        assert_eq!(page(&ids, 5, None, Some("b")), (vec!["a".into()], false));
        assert_eq!(page(&ids, 5, Some("zzz"), None), (vec![], false));
    }
}
