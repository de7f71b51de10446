//! `POST /v1/embeddings`: authenticate, read and parse the body, embed through the gateway (limits, budget,
//! route, one retry elsewhere), answer one JSON body in OpenAI's shape; audited and measured like a generation.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};

use super::generate::{draft, parse_json, receive};
use super::recorder::Recorder;
use super::{App, error_response, request_id, set, zl_headers};
use crate::embeddings;
use crate::error::{ErrorFormat, Failure};

/// `POST /v1/embeddings` (or a peer region's signed hop of one).
pub(super) async fn embeddings(State(app): State<App>, req: Request) -> Response {
    let rid = request_id(&req);
    let started = Instant::now();
    let headers = req.headers().clone();
    let authenticated = match req.extensions().get::<super::hop::Hop>() {
        Some(h) => app.gateway.key_by_id(&h.key_id),
        None => app.gateway.authenticate(req.headers()),
    };
    let key = match authenticated {
        Ok(key) => key,
        Err(e) => {
            let mut recorder = Recorder::new(&app, "embeddings", started, None);
            recorder.failed(&e);
            return error_response(&app, ErrorFormat::OpenAi, &rid, &e.into());
        }
    };
    let mut recorder = Recorder::new(&app, "embeddings", started, draft(&app, &key, &headers, &rid, started));
    let rate = app.gateway.rate_figures(&key);
    let result = async {
        let received = receive(&app, key, req).await?;
        let body = parse_json(&app, received.body.clone()).await.map_err(|e| Failure::known(e, rate))?;
        let job = embeddings::parse(&body).map_err(|e| Failure::known(e, rate))?;
        recorder.model.clone_from(&job.model);
        if let Some(a) = recorder.audit.as_mut() {
            a.draft.requested(&job.model);
        }
        let done = app.gateway.embed(&received.key, &job, &received.opts, &rid).await?;
        Ok::<_, Failure>((job, done))
    }
    .await;
    let (job, done) = match result {
        Ok(ok) => ok,
        Err(f) => {
            recorder.failed(&f.error);
            return error_response(&app, ErrorFormat::OpenAi, &rid, &f);
        }
    };
    recorder.model.clone_from(&done.meta.model);
    if let Some(a) = recorder.audit.as_mut() {
        let content = a.draft.wants_content().then(|| job.text());
        a.draft.started(&done.meta, content);
        a.draft.embedded(&done.vectors, done.billing_unit);
    }
    let body = embeddings::render(&job, &done.meta.model, &done.vectors, done.meta.input_tokens);
    let mut resp = axum::Json(body).into_response();
    let h = resp.headers_mut();
    zl_headers(h, Some(&done.meta), None, app.gateway.cluster().health(Instant::now()));
    set(h, "x-zl-billing-unit", &format!("{:.4}", done.billing_unit));
    resp
}
