//! The options of a request that come from its headers rather than its body.

use axum::http::HeaderMap;
use zl_wire::message::RouteHint;

use crate::error::ApiError;

/// Options that come from request headers rather than the body.
#[derive(Clone, Debug, Default)]
pub struct RequestOptions {
    /// `x-zl-cache: bypass`.
    pub bypass_cache: bool,
    /// `x-zl-route-hint`.
    pub hint: RouteHint,
    /// `x-zl-streaming-predicted: true|false`: predictive streaming asked for or refused; absent, the worker's
    /// default.
    pub streaming_predicted: Option<bool>,
    /// W3C `traceparent` of this frontend's span (the HTTP layer sets it), carried to the orchestrator and the
    /// worker; empty for none.
    pub traceparent: String,
}

impl RequestOptions {
    /// Read them from headers.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ApiError> {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        let bypass_cache = match text("x-zl-cache") {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("bypass") => true,
            Some(v) => {
                return Err(ApiError::invalid(format!("x-zl-cache: {v:?} is not a request value; use \"bypass\"")));
            }
        };
        let hint = match text("x-zl-route-hint") {
            None => RouteHint::None,
            Some("low-latency") => RouteHint::LowLatency,
            Some("low-cost") => RouteHint::LowCost,
            Some(v) => {
                return Err(ApiError::invalid(format!(
                    "x-zl-route-hint: {v:?} must be \"low-latency\" or \"low-cost\""
                )));
            }
        };
        let streaming_predicted = match text("x-zl-streaming-predicted") {
            None => None,
            Some(v) if v.eq_ignore_ascii_case("true") => Some(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Some(false),
            Some(v) => {
                return Err(ApiError::invalid(format!(
                    "x-zl-streaming-predicted: {v:?} must be \"true\" or \"false\""
                )));
            }
        };
        let traceparent = text("traceparent").filter(|t| zl_common::trace::TraceContext::parse(t).is_some());
        Ok(RequestOptions {
            bypass_cache,
            hint,
            streaming_predicted,
            traceparent: traceparent.unwrap_or_default().to_owned(),
        })
    }
}
