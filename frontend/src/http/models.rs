//! `GET /v1/models` and `GET /v1/models/{id}`, in Anthropic's shape (with its cursors) when the request carries
//! `anthropic-version`, in OpenAI's otherwise.

use std::time::Instant;

use axum::extract::{Path, Query, Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{App, error_response, request_id, zl_headers};
use crate::error::{ApiError, ErrorFormat, Failure};

/// Which listing shape: Anthropic's when the request carries `anthropic-version` (the Anthropic SDK always
/// sends it), OpenAI's otherwise.
fn models_format(headers: &HeaderMap) -> ErrorFormat {
    if headers.contains_key("anthropic-version") { ErrorFormat::Anthropic } else { ErrorFormat::OpenAi }
}

fn model_object(format: ErrorFormat, id: &str) -> Value {
    match format {
        ErrorFormat::Anthropic => {
            json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"})
        }
        ErrorFormat::OpenAi => json!({"id": id, "object": "model", "created": 0, "owned_by": "zerolayer"}),
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

pub(super) async fn list_models(
    State(app): State<App>,
    query: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    let rid = request_id(&req);
    let format = models_format(req.headers());
    let (rate, project) = match app.gateway.authenticate(req.headers()) {
        Ok(key) => (app.gateway.rate_figures(&key), key.project),
        Err(e) => return error_response(&app, format, &rid, &e.into()),
    };
    let Ok(Query(params)) = query else {
        let e = ApiError::invalid("the query string is malformed");
        return error_response(&app, format, &rid, &Failure::known(e, rate));
    };
    // The served models, then the adapters the key's project may use.
    let cluster = app.gateway.cluster();
    let mut ids: Vec<String> = cluster.models().into_iter().map(|m| m.id).collect();
    ids.extend(cluster.adapters_for(&project));
    let body = match format {
        ErrorFormat::OpenAi => {
            json!({"object": "list", "data": ids.iter().map(|id| model_object(format, id)).collect::<Vec<_>>()})
        }
        ErrorFormat::Anthropic => {
            let limit = match params.limit.as_deref().map(str::parse::<usize>) {
                None => 20,
                Some(Ok(l)) if (1..=1000).contains(&l) => l,
                Some(_) => {
                    let e = ApiError::invalid_param("limit", "limit: Input should be an integer between 1 and 1000");
                    return error_response(&app, format, &rid, &Failure::known(e, rate));
                }
            };
            let (items, has_more) = page(&ids, limit, params.after_id.as_deref(), params.before_id.as_deref());
            json!({
                "data": items.iter().map(|id| model_object(format, id)).collect::<Vec<_>>(),
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

pub(super) async fn get_model(State(app): State<App>, Path(id): Path<String>, req: Request) -> Response {
    let rid = request_id(&req);
    let format = models_format(req.headers());
    let (rate, project) = match app.gateway.authenticate(req.headers()) {
        Ok(key) => (app.gateway.rate_figures(&key), key.project),
        Err(e) => return error_response(&app, format, &rid, &e.into()),
    };
    let cluster = app.gateway.cluster();
    if !cluster.models().iter().any(|m| m.id == id) && !cluster.adapters_for(&project).contains(&id) {
        return error_response(&app, format, &rid, &Failure::known(app.gateway.cluster().not_found(&id), rate));
    }
    let mut resp = axum::Json(model_object(format, &id)).into_response();
    zl_headers(resp.headers_mut(), None, Some(&rate), app.gateway.cluster().health(Instant::now()));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

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
