//! The generation endpoints, `POST /v1/messages` and `POST /v1/chat/completions`, as one handler over a
//! [`Dialect`]: authenticate, read and parse the body, prepare (render, tokenize, check the context), start (cache
//! or route, admission), then answer as one JSON body or as server-sent events (a request for several choices is
//! served by `choices.rs`). `count_tokens` shares the first steps.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::recorder::Recorder;
use super::respond::{Received, complete, json_response, sse_response};
use super::{App, error_response, request_id, spill, zl_headers};

use crate::anthropic;
use crate::audit::{ContentKey, Draft};
use crate::cluster::KeyInfo;
use crate::dialect::Dialect;
use crate::error::{ApiError, ErrorFormat, ErrorKind, Failure};
use crate::gateway::{GenEvent, Generation, Prepared, RequestOptions};

async fn read_json(app: &App, req: Request) -> Result<Value, ApiError> {
    let bytes = read_body(app, req).await?;
    parse_json(app, bytes).await
}

/// The request body, within the size limit.
async fn read_body(app: &App, req: Request) -> Result<Bytes, ApiError> {
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
    // A body trickled in slower than the deadline holds a connection and a task: it is cut off with a 408.
    let read = tokio::time::timeout(app.edge.body_timeout, axum::body::to_bytes(req.into_body(), app.body_limit));
    let bytes: Bytes = read
        .await
        .map_err(|_| {
            metrics::counter!("zl_frontend_edge_timeouts_total", "phase" => "body").increment(1);
            ApiError::new(
                ErrorKind::RequestTimeout,
                format!("the request body did not arrive within {} s", app.edge.body_timeout.as_secs()),
            )
        })?
        .map_err(|e| {
            let limit = std::error::Error::source(&e)
                .is_some_and(|s| s.downcast_ref::<http_body_util::LengthLimitError>().is_some())
                || e.to_string().contains("length limit");
            if limit { too_large() } else { ApiError::invalid(format!("could not read the request body: {e}")) }
        })?;
    if bytes.is_empty() {
        return Err(ApiError::invalid("the request body is empty; send a JSON object"));
    }
    Ok(bytes)
}

/// A request body as JSON.
pub(super) async fn parse_json(app: &App, bytes: Bytes) -> Result<Value, ApiError> {
    let large = bytes.len() > LARGE_BODY;
    let parse = move || {
        serde_json::from_slice(&bytes).map_err(|e| {
            if std::str::from_utf8(&bytes).is_err() {
                ApiError::invalid("the request body is not valid UTF-8")
            } else {
                ApiError::invalid(format!("the request body is not valid JSON: {e}"))
            }
        })
    };
    // A large body takes tens of milliseconds to parse: off the async threads, like tokenizing.
    if large { app.gateway.off_thread(parse).await } else { parse() }
}

/// Bodies larger than this are parsed on a blocking thread.
const LARGE_BODY: usize = 256 * 1024;

/// Check data residency and the audit log, read the options and the body of an authenticated request.
pub(super) async fn receive(app: &App, key: KeyInfo, req: Request) -> Result<Received, Failure> {
    // The caller is known: failures carry its rate-limit figures too.
    let known = |e: ApiError| Failure::known(e, app.gateway.rate_figures(&key));
    if let Some(log) = &app.audit {
        log.admit().map_err(known)?;
    }
    app.spill.regions.admit(&key.key_id, &key.regions).map_err(known)?;
    let opts = RequestOptions::from_headers(req.headers()).map_err(known)?;
    // A key already over its limits is refused before its body is read (a large body costs time and memory).
    app.gateway.precheck(&key)?;
    let body = read_body(app, req).await.map_err(known)?;
    Ok(Received { key, opts, body })
}

/// Parse a received body as `D` and prepare its requests, one per prompt, each with a writer for each of its
/// answers (admission, with its limits, comes later in the gateway).
async fn parsed_and_prepared<D: Dialect>(
    app: &App,
    r: &Received,
    rid: &str,
) -> Result<Vec<(Prepared, Vec<D>)>, Failure> {
    let known = |e: ApiError| Failure::known(e, app.gateway.rate_figures(&r.key));
    let body = parse_json(app, r.body.clone()).await.map_err(known)?;
    // A stored conversation this one continues (the Responses API's `previous_response_id`).
    let body = match D::STORES {
        true => crate::responses::stored::expand(&app.gateway, &r.key.project, body).await.map_err(known)?,
        false => body,
    };
    let requests = parse_request(app, body, D::parse_choices).await.map_err(known)?;
    let mut prompts = Vec::with_capacity(requests.len());
    for (gen_req, mut writers) in requests {
        let prepared = app.gateway.prepare(gen_req, rid).await.map_err(known)?;
        for w in &mut writers {
            w.prepared(&prepared);
        }
        prompts.push((prepared, writers));
    }
    Ok(prompts)
}

/// A body that pulls events from a generation and renders each in `D`; ends after the finish or an error. With
/// `store` (the gateway and the caller's project), a `D` that stores answers has its record stored before the
/// last event goes out (an `error` event instead when storing fails).
fn event_body<D: Dialect>(
    generation: Generation,
    dialect: D,
    recorder: Recorder,
    store: Option<(Arc<crate::gateway::Gateway>, String)>,
) -> Body {
    struct S<D> {
        generation: Generation,
        head: Option<String>,
        done: bool,
        recorder: Recorder,
        dialect: D,
        store: Option<(Arc<crate::gateway::Gateway>, String)>,
    }
    let head = Some(dialect.stream_head());
    let state = S { generation, head, done: false, recorder, dialect, store };
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
                    s.recorder.event(&ev);
                    let mut text = s.dialect.render_event(&ev);
                    if let (true, Some((gateway, project))) = (s.done, &s.store)
                        && let Some((id, created, record)) = s.dialect.to_store()
                    {
                        match crate::responses::stored::store(gateway, project, &id, created, &record).await {
                            Ok(()) => text += &s.dialect.held_back(),
                            Err(e) => {
                                s.recorder.failed(&e);
                                text += &D::render_error(&e);
                            }
                        }
                    }
                    text
                }
                Some(Err(e)) => {
                    s.done = true;
                    s.recorder.failed(&e);
                    D::render_error(&e)
                }
                None => {
                    s.done = true;
                    let e = ApiError::internal("the generation ended without a finish");
                    s.recorder.failed(&e);
                    D::render_error(&e)
                }
            };
            return Some((Ok(Bytes::from(text)), s));
        }
    });
    Body::from_stream(stream)
}

/// `POST /v1/messages` or `POST /v1/chat/completions`, as `D` words them: served here, or by a peer region when
/// the client prefers one (`x-zl-region`) or this region cannot serve it (docs/regions.md).
pub(super) async fn generate<D: Dialect>(State(app): State<App>, req: Request) -> Response {
    let rid = request_id(&req);
    let started = Instant::now();
    let headers = req.headers().clone();
    let path = req.uri().path().to_owned();
    // A signed hop from a peer region names the key its frontend authenticated; the client's key never crosses.
    let from_peer = req.extensions().get::<super::hop::Hop>().cloned();
    let hop = from_peer.is_some();
    let preferred = headers.get(spill::REGION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let authenticated = match &from_peer {
        Some(h) => app.gateway.key_by_id(&h.key_id),
        None => app.gateway.authenticate(req.headers()),
    };
    let key = match authenticated {
        Ok(key) => key,
        Err(e) => return failed::<D>(&app, &rid, Some(Recorder::new(&app, D::API, started, None)), &e.into()),
    };
    // From here on every outcome is audited.
    let mut recorder = Some(Recorder::new(&app, D::API, started, draft(&app, &key, &headers, &rid, started)));
    let received = match receive(&app, key, req).await {
        Ok(r) => r,
        Err(f) => return failed::<D>(&app, &rid, recorder, &f),
    };
    let regions = &app.spill.regions;
    let mut tried: Vec<String> = Vec::new();
    if !hop && let Some(region) = preferred.as_deref().filter(|r| *r != regions.local()) {
        // The client prefers a peer region: ask it first, and serve here if it does not.
        let order: Vec<_> = regions
            .spill_order(&received.key.regions, Some(region), Instant::now())
            .into_iter()
            .filter(|p| p.region == region)
            .collect();
        if let Some(resp) =
            spill::forward(&app.spill, &order, &path, &headers, received.body.clone(), &rid, &received.key.key_id).await
        {
            if let Some(r) = recorder.as_mut() {
                r.status = resp.status().as_u16();
            }
            return resp;
        }
        tried = order.into_iter().map(|p| p.region).collect();
    }
    match serve::<D>(&app, &received, &rid, &mut recorder).await {
        Ok(resp) => resp,
        Err(f) if !hop && matches!(f.error.kind, ErrorKind::Overloaded | ErrorKind::NotFound) => {
            // This region cannot serve it now: the nearest healthy peer that the key may use, if any.
            let order: Vec<_> = regions
                .spill_order(&received.key.regions, None, Instant::now())
                .into_iter()
                .filter(|p| !tried.contains(&p.region))
                .collect();
            match spill::forward(&app.spill, &order, &path, &headers, received.body.clone(), &rid, &received.key.key_id)
                .await
            {
                Some(resp) => {
                    if let Some(r) = recorder.as_mut() {
                        r.status = resp.status().as_u16();
                    }
                    resp
                }
                None => failed::<D>(&app, &rid, recorder, &f),
            }
        }
        Err(f) => failed::<D>(&app, &rid, recorder, &f),
    }
}

/// The audit draft of an authenticated request, when there is an audit log.
pub(super) fn draft(
    app: &App,
    key: &KeyInfo,
    headers: &axum::http::HeaderMap,
    rid: &str,
    started: Instant,
) -> Option<Draft> {
    app.audit.as_ref()?;
    let trace = headers.get("traceparent").and_then(|v| v.to_str().ok()).map(zl_common::trace::trace_id_of);
    let content =
        app.gateway.cluster().project(&key.project).content_key.map(|(key_id, key)| ContentKey { key_id, key });
    Some(Draft::new(key, rid, trace.unwrap_or_default(), started, content))
}

fn failed<D: Dialect>(app: &App, rid: &str, recorder: Option<Recorder>, f: &Failure) -> Response {
    if let Some(mut r) = recorder {
        r.failed(&f.error);
    }
    error_response(app, D::ERRORS, rid, f)
}

/// Serve a received request in this region.
/// A streamed answer takes the recorder into its body (it records when the body ends).
async fn serve<D: Dialect>(
    app: &App,
    r: &Received,
    rid: &str,
    slot: &mut Option<Recorder>,
) -> Result<Response, Failure> {
    let mut prompts = parsed_and_prepared::<D>(app, r, rid).await?;
    if prompts.len() != 1 || prompts[0].1.len() != 1 {
        return super::choices::serve(app, r, rid, slot, prompts).await;
    }
    let (prepared, mut writers) = prompts.remove(0);
    let Some(mut dialect) = writers.pop() else { return Err(ApiError::internal("a request without a writer").into()) };
    let Some(recorder) = slot.as_mut() else { return Err(ApiError::internal("request recorded twice").into()) };
    let stream = prepared.stream;
    recorder.model = prepared.model.clone();
    if let Some(a) = recorder.audit.as_mut() {
        a.draft.requested(&prepared.model);
    }
    let prompt = recorder.audit.as_ref().is_some_and(|a| a.draft.wants_content()).then(|| prepared.prompt.clone());
    let (meta, generation) = app.gateway.start(&r.key, prepared, &r.opts, rid).await?;
    if let Some(a) = recorder.audit.as_mut() {
        a.draft.started(&meta, prompt);
    }
    recorder.tally = Some(generation.tally());
    let health = app.gateway.cluster().health(Instant::now());
    dialect.routed(&meta);
    if stream && let Some(recorder) = slot.take() {
        let store = D::STORES.then(|| (app.gateway.clone(), r.key.project.clone()));
        return Ok(sse_response(&meta, health, event_body(generation, dialect, recorder, store)));
    }
    let collected = generation.collect().await.map_err(|e| Failure::known(e, meta.rate))?;
    let (body, finish) = complete(&mut dialect, slot.as_mut(), collected);
    if let Some((id, created, record)) = dialect.to_store() {
        crate::responses::stored::store(&app.gateway, &r.key.project, &id, created, &record)
            .await
            .map_err(|e| Failure::known(e, meta.rate))?;
    }
    Ok(json_response(&meta, health, body, &finish))
}

/// `POST /v1/messages/count_tokens`: the same admission as a generation (the audit log's state, data residency,
/// the key's per-minute request limit) and an audit record, then the prompt counted with the model's tokenizer.
pub(super) async fn count_tokens(State(app): State<App>, req: Request) -> Response {
    let started = Instant::now();
    let rid = request_id(&req);
    let key = match app.gateway.authenticate(req.headers()) {
        Ok(key) => key,
        Err(e) => return error_response(&app, ErrorFormat::Anthropic, &rid, &e.into()),
    };
    let audit = draft(&app, &key, req.headers(), &rid, started);
    let mut recorder = Recorder::new(&app, "count_tokens", started, audit);
    let result = async {
        if let Some(log) = &app.audit {
            log.admit()?;
        }
        app.spill.regions.admit(&key.key_id, &key.regions)?;
        let rate = app.gateway.admit_count(&key)?;
        let body = read_json(&app, req).await?;
        let gen_req = parse_request(&app, body, |body| anthropic::parse(body, true)).await?;
        recorder.model.clone_from(&gen_req.model);
        if let Some(a) = recorder.audit.as_mut() {
            a.draft.requested(&gen_req.model);
        }
        Ok((app.gateway.count_tokens(gen_req, &rid).await?, rate))
    }
    .await;
    match result {
        Ok((n, rate)) => {
            if let Some(a) = recorder.audit.as_mut() {
                a.draft.counted(n.min(u32::MAX as usize) as u32);
            }
            let mut resp = axum::Json(json!({"input_tokens": n})).into_response();
            zl_headers(resp.headers_mut(), None, Some(&rate), app.gateway.cluster().health(Instant::now()));
            resp
        }
        Err(e) => {
            recorder.failed(&e);
            error_response(&app, ErrorFormat::Anthropic, &rid, &Failure::known(e, app.gateway.rate_figures(&key)))
        }
    }
}

/// Parse a request body with `parse`: off the async threads when it offers tools or a schema, whose grammar takes
/// milliseconds to compile and check.
async fn parse_request<T: Send + 'static>(
    app: &App,
    body: Value,
    parse: impl FnOnce(&Value) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let grammar = ["tools", "output_format", "output_config", "response_format", "text"]
        .iter()
        .any(|k| body.get(k).is_some_and(|v| !v.is_null()));
    if grammar { app.gateway.off_thread(move || parse(&body)).await } else { parse(&body) }
}
