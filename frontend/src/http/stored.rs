//! `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`: a stored
//! response of the caller's project (another project's ids are unknown), read from the orchestrators.

use std::time::Instant;

use axum::extract::{Path, Query, Request, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{App, error_response, request_id, zl_headers};
use crate::error::{ApiError, ErrorFormat, ErrorKind, Failure};
use crate::responses::stored;

/// `input_items` paging (OpenAI's).
#[derive(Debug, serde::Deserialize)]
pub(super) struct ItemParams {
    limit: Option<String>,
    order: Option<String>,
    after: Option<String>,
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("Response with id '{id}' not found."))
}

/// Authenticate, then run `f` with the caller's project; the answer as JSON, or the error in OpenAI's shape.
async fn answer<F, Fut>(app: &App, req: Request, op: &'static str, f: F) -> Response
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<Value, ApiError>>,
{
    let rid = request_id(&req);
    let started = Instant::now();
    let key = match app.gateway.authenticate(req.headers()) {
        Ok(key) => key,
        Err(e) => return error_response(app, ErrorFormat::OpenAi, &rid, &e.into()),
    };
    let rate = app.gateway.rate_figures(&key);
    let result = f(key.project.clone()).await;
    let status = match &result {
        Ok(_) => "200".to_owned(),
        Err(e) => e.kind.status().as_u16().to_string(),
    };
    metrics::counter!("zl_frontend_stored_response_calls_total", "op" => op, "status" => status).increment(1);
    metrics::histogram!("zl_frontend_stored_response_seconds", "op" => op).record(started.elapsed().as_secs_f64());
    match result {
        Ok(body) => {
            let mut resp = axum::Json(body).into_response();
            zl_headers(resp.headers_mut(), None, Some(&rate), app.gateway.cluster().health(Instant::now()));
            resp
        }
        Err(e) => error_response(app, ErrorFormat::OpenAi, &rid, &Failure::known(e, rate)),
    }
}

/// `GET /v1/responses/{id}`: the response object as it was returned.
pub(super) async fn get_response(State(app): State<App>, Path(id): Path<String>, req: Request) -> Response {
    let gateway = app.gateway.clone();
    answer(&app, req, "get", |project| async move {
        let record = stored::lookup(&gateway, &project, &id).await?.ok_or_else(|| not_found(&id))?;
        Ok(record["response"].clone())
    })
    .await
}

/// `DELETE /v1/responses/{id}`.
pub(super) async fn delete_response(State(app): State<App>, Path(id): Path<String>, req: Request) -> Response {
    let gateway = app.gateway.clone();
    answer(&app, req, "delete", |project| async move {
        match stored::delete(&gateway, &project, &id).await? {
            true => Ok(json!({"id": id, "object": "response", "deleted": true})),
            false => Err(not_found(&id)),
        }
    })
    .await
}

/// `GET /v1/responses/{id}/input_items`: the request's input items, `limit` (1 to 100, default 20) at a time in
/// `order` (`desc`, the default, or `asc`), after the item `after`.
pub(super) async fn input_items(
    State(app): State<App>,
    Path(id): Path<String>,
    query: Result<Query<ItemParams>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    let gateway = app.gateway.clone();
    answer(&app, req, "input_items", |project| async move {
        let Ok(Query(params)) = query else { return Err(ApiError::invalid("the query string is malformed")) };
        let limit = match params.limit.as_deref().map(str::parse::<usize>) {
            None => 20,
            Some(Ok(l)) if (1..=100).contains(&l) => l,
            Some(_) => return Err(ApiError::invalid_param("limit", "limit: an integer from 1 to 100")),
        };
        let record = stored::lookup(&gateway, &project, &id).await?.ok_or_else(|| not_found(&id))?;
        let mut items = record["input_items"].as_array().cloned().unwrap_or_default();
        match params.order.as_deref() {
            None | Some("desc") => items.reverse(),
            Some("asc") => {}
            Some(other) => {
                return Err(ApiError::invalid_param("order", format!("order: {other:?} is not \"asc\" or \"desc\"")));
            }
        }
        let (page, has_more) = page(&items, limit, params.after.as_deref());
        Ok(json!({
            "object": "list",
            "data": page,
            "first_id": page.first().map(|i| i["id"].clone()),
            "last_id": page.last().map(|i| i["id"].clone()),
            "has_more": has_more,
        }))
    })
    .await
}

/// Up to `limit` of `items` after the one whose id is `after` (from the start without it), and whether more follow.
fn page(items: &[Value], limit: usize, after: Option<&str>) -> (Vec<Value>, bool) {
    let start = match after {
        Some(a) => items.iter().position(|i| i["id"] == a).map_or(items.len(), |p| p + 1),
        None => 0,
    };
    let rest = &items[start..];
    (rest.iter().take(limit).cloned().collect(), rest.len() > limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_the_after_cursor() {
        let items: Vec<Value> = ["a", "b", "c"].iter().map(|id| json!({"id": id})).collect();
        assert_eq!(page(&items, 2, None), (items[..2].to_vec(), true));
        assert_eq!(page(&items, 2, Some("b")), (items[2..].to_vec(), false));
        assert_eq!(page(&items, 2, Some("zzz")), (vec![], false));
    }
}
