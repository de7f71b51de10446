//! The shapes a generation's answer goes out in (one JSON body, or server-sent events) with the headers every
//! answer carries, and what the handler knows of a request before serving it.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::recorder::Recorder;
use super::{set, zl_headers};
use crate::cache::FinishInfo;
use crate::cluster::KeyInfo;
use crate::dialect::Dialect;
use crate::gateway::{Collected, GenEvent, Meta, RequestOptions};

/// What the handler knows of a request before serving it locally: its caller, options and raw body (kept for a
/// hop to a peer region).
pub(super) struct Received {
    pub(super) key: KeyInfo,
    pub(super) opts: RequestOptions,
    pub(super) body: Bytes,
}

pub(super) fn sse_response(meta: &Meta, health: &str, body: Body) -> Response {
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    zl_headers(headers, Some(meta), None, health);
    resp
}

pub(super) fn json_response(meta: &Meta, health: &str, value: Value, finish: &FinishInfo) -> Response {
    let mut resp = axum::Json(value).into_response();
    let headers = resp.headers_mut();
    zl_headers(headers, Some(meta), None, health);
    // The final unit and predictive streaming's figures are known for a complete answer (a stream carries them in
    // its final usage).
    set(headers, "x-zl-billing-unit", &format!("{:.4}", finish.billing_unit));
    set(headers, "x-zl-predicted-draft-tokens", &finish.draft_tokens.to_string());
    set(headers, "x-zl-predicted-accepted-tokens", &finish.accepted_draft_tokens.to_string());
    resp
}

/// A complete answer as `writer` writes it (its log-probabilities first, then its body), noted by its recorder:
/// the body, and how it ended.
pub(super) fn complete<D: Dialect>(
    writer: &mut D,
    recorder: Option<&mut Recorder>,
    got: Collected,
) -> (Value, FinishInfo) {
    for l in &got.logprobs {
        writer.logprobs(l);
    }
    if let Some(recorder) = recorder {
        recorder.event(&GenEvent::Delta(got.text.clone()));
        recorder.event(&GenEvent::Finish(got.finish.clone()));
    }
    (writer.final_body(&got.text, &got.finish), got.finish)
}
