//! Errors as the two APIs spell them: Anthropic's `{"type":"error","error":{...},"request_id":...}` on the
//! Anthropic routes and OpenAI's `{"error":{"message","type","param","code"}}` on `/v1/chat/completions`, with the
//! same status codes.

use axum::http::StatusCode;
use serde_json::json;
use zl_proto::CallError;
use zl_wire::message::ErrorCode;

use crate::limits::RateFigures;

/// Which API's error format to speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorFormat {
    /// Anthropic Messages API.
    Anthropic,
    /// OpenAI Chat Completions API.
    OpenAi,
}

/// Error kinds, named as Anthropic names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400.
    InvalidRequest,
    /// 401.
    Authentication,
    /// 403.
    Permission,
    /// 404.
    NotFound,
    /// 408: the client did not send its request body within the body-read deadline.
    RequestTimeout,
    /// 413.
    RequestTooLarge,
    /// 429.
    RateLimit,
    /// 500.
    Api,
    /// 529: every pool is saturated or no worker can take the request.
    Overloaded,
}

impl ErrorKind {
    /// HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::Permission => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RateLimit => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Api => StatusCode::INTERNAL_SERVER_ERROR,
            // 529 is Anthropic's own code; it is a valid status number.
            ErrorKind::Overloaded => StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
        }
    }

    /// Anthropic's `error.type`.
    pub fn anthropic_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::Permission => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::RequestTimeout => "invalid_request_error",
            ErrorKind::RequestTooLarge => "request_too_large",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Api => "api_error",
            ErrorKind::Overloaded => "overloaded_error",
        }
    }

    /// OpenAI's `error.type` (and `error.code` where OpenAI sets one).
    fn openai_type_and_code(self) -> (&'static str, Option<&'static str>) {
        match self {
            ErrorKind::InvalidRequest => ("invalid_request_error", None),
            ErrorKind::Authentication => ("invalid_request_error", Some("invalid_api_key")),
            ErrorKind::Permission => ("invalid_request_error", Some("permission_denied")),
            ErrorKind::NotFound => ("invalid_request_error", Some("model_not_found")),
            ErrorKind::RequestTimeout => ("invalid_request_error", Some("request_timeout")),
            ErrorKind::RequestTooLarge => ("invalid_request_error", Some("request_too_large")),
            ErrorKind::RateLimit => ("requests", Some("rate_limit_exceeded")),
            ErrorKind::Api => ("server_error", None),
            ErrorKind::Overloaded => ("server_error", Some("overloaded")),
        }
    }

    /// Label for metrics.
    pub fn label(self) -> &'static str {
        self.anthropic_type()
    }
}

/// A failed request, ready to be rendered in either dialect.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ApiError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// Human-readable, safe to show.
    pub message: String,
    /// Seconds the client should wait (`retry-after`), for 429 and 529.
    pub retry_after_s: Option<u64>,
    /// The offending parameter, when one is to blame (OpenAI's `error.param`).
    pub param: Option<String>,
}

impl ApiError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError { kind, message: message.into(), retry_after_s: None, param: None }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// 400 blaming one parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_owned()), ..Self::new(ErrorKind::InvalidRequest, message) }
    }

    /// 500 `api_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Api, message)
    }

    /// With a `retry-after` hint.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds.max(1));
        self
    }

    /// The error body in `format`.
    pub fn body(&self, format: ErrorFormat, request_id: &str) -> serde_json::Value {
        match format {
            ErrorFormat::Anthropic => json!({
                "type": "error",
                "error": {"type": self.kind.anthropic_type(), "message": self.message},
                "request_id": request_id,
            }),
            ErrorFormat::OpenAi => {
                let (ty, code) = self.kind.openai_type_and_code();
                json!({"error": {"message": self.message, "type": ty, "param": self.param, "code": code}})
            }
        }
    }

    /// A worker's or orchestrator's failure as the client sees it.
    pub fn from_call(e: &CallError, what: &str) -> Self {
        let retry = match e {
            CallError::Remote(w) if w.retry_after_ms > 0 => Some(w.retry_after_ms.div_ceil(1000).into()),
            _ => None,
        };
        let message = match e {
            CallError::Remote(w) => w.message.clone(),
            other => format!("{what}: {other}"),
        };
        let kind = match e.code() {
            ErrorCode::NotFound => ErrorKind::NotFound,
            ErrorCode::InvalidRequest | ErrorCode::ContextLengthExceeded => ErrorKind::InvalidRequest,
            ErrorCode::PermissionDenied => ErrorKind::Permission,
            // No answer in time is a tier that is down or swamped: retry later, as docs/api.md promises (529).
            ErrorCode::Overloaded | ErrorCode::Unavailable | ErrorCode::NoQuorum | ErrorCode::DeadlineExceeded => {
                ErrorKind::Overloaded
            }
            _ => ErrorKind::Api,
        };
        let mut err = ApiError::new(kind, message);
        if kind == ErrorKind::Overloaded {
            err = err.retry_after(retry.unwrap_or(1));
        }
        err
    }
}

/// A request that failed: the error and, once the caller is known, its rate-limit figures (which the error
/// response carries as headers, like every other response to that caller).
#[derive(Clone, Debug)]
pub struct Failure {
    /// What went wrong.
    pub error: ApiError,
    /// The caller's figures; none before it was authenticated.
    pub rate: Option<RateFigures>,
}

impl Failure {
    /// A failure of a known caller.
    pub fn known(error: ApiError, rate: RateFigures) -> Self {
        Failure { error, rate: Some(rate) }
    }
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Self {
        Failure { error, rate: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_dialects_render_exactly() {
        let e = ApiError::invalid_param("max_tokens", "max_tokens: must be at least 1");
        assert_eq!(
            e.body(ErrorFormat::Anthropic, "req_1").to_string(),
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: must be at least 1"},"request_id":"req_1"}"#
        );
        assert_eq!(
            e.body(ErrorFormat::OpenAi, "req_1").to_string(),
            r#"{"error":{"message":"max_tokens: must be at least 1","type":"invalid_request_error","param":"max_tokens","code":null}}"#
        );
        assert_eq!(ErrorKind::Overloaded.status().as_u16(), 529);
    }

    #[test]
    fn unreachable_tiers_are_a_529_with_retry_after() {
        for e in [
            CallError::deadline_exceeded("orchestrators"),
            CallError::Connect { peer: ([127, 0, 0, 1], 1).into(), reason: "refused".into() },
        ] {
            let api = ApiError::from_call(&e, "routing");
            assert_eq!((api.kind, api.retry_after_s), (ErrorKind::Overloaded, Some(1)), "{e}");
        }
    }
}
