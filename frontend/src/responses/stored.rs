//! Stored responses (`store`, default true, and `previous_response_id`): once an answer is complete its record is
//! written to the orchestrators (replicated with the routing state, so every frontend reads it), under the caller's
//! project, for `--response-ttl-s`. A record holds the response object as returned, this request's input items
//! (each with an id) and the whole conversation so far (the conversation it continued, its input and its output
//! items), which a later request's `previous_response_id` continues: its input is read after that conversation.

use serde_json::{Value, json};
use zl_wire::message::{MAX_STORED_RESPONSE, ResponseLookup, StoredResponse};

use super::request::{Echoed, HISTORY};
use crate::error::{ApiError, ErrorKind};
use crate::gateway::Gateway;

/// The record stored for `response`: it, the request's input items, and the conversation so far.
pub fn record(response: &Value, echoed: &Echoed) -> Value {
    let output = response["output"].as_array().cloned().unwrap_or_default();
    let conversation: Vec<Value> = echoed.history.iter().chain(&echoed.input_items).chain(&output).cloned().collect();
    json!({"response": response, "input_items": echoed.input_items, "conversation": conversation})
}

/// The stored record of `project`'s response `id`, if it has a live one.
pub async fn lookup(gateway: &Gateway, project: &str, id: &str) -> Result<Option<Value>, ApiError> {
    let lookup = ResponseLookup { project: project.to_owned(), id: id.to_owned(), delete: false };
    let found =
        gateway.upstream().lookup_response(lookup).await.map_err(|e| ApiError::from_call(&e, "the response store"))?;
    if !found.found {
        return Ok(None);
    }
    serde_json::from_str(&found.body)
        .map(Some)
        .map_err(|e| ApiError::internal(format!("the stored response {id} is unreadable: {e}")))
}

/// Forget `project`'s response `id`; whether it had a live one.
pub async fn delete(gateway: &Gateway, project: &str, id: &str) -> Result<bool, ApiError> {
    let lookup = ResponseLookup { project: project.to_owned(), id: id.to_owned(), delete: true };
    let found =
        gateway.upstream().lookup_response(lookup).await.map_err(|e| ApiError::from_call(&e, "the response store"))?;
    Ok(found.found)
}

/// A Responses request body with the conversation its `previous_response_id` continues put under [`HISTORY`].
pub async fn expand(gateway: &Gateway, project: &str, mut body: Value) -> Result<Value, ApiError> {
    if let Some(obj) = body.as_object_mut() {
        obj.remove(HISTORY);
    }
    let Some(id) = body.get("previous_response_id").and_then(Value::as_str).map(str::to_owned) else {
        return Ok(body);
    };
    let not_found = || ApiError {
        param: Some("previous_response_id".into()),
        ..ApiError::new(ErrorKind::NotFound, format!("Previous response with id '{id}' not found."))
    };
    if id.is_empty() || id.len() > zl_wire::message::MAX_ID_LEN {
        return Err(not_found());
    }
    let record = lookup(gateway, project, &id).await?.ok_or_else(not_found)?;
    body[HISTORY] = record["conversation"].clone();
    Ok(body)
}

/// Store `record` as `project`'s response `id`, made at `created_at` (Unix seconds), for the configured time.
pub async fn store(
    gateway: &Gateway,
    project: &str,
    id: &str,
    created_at: u64,
    record: &Value,
) -> Result<(), ApiError> {
    let body = record.to_string();
    if body.len() > MAX_STORED_RESPONSE {
        return Err(ApiError::invalid_param(
            "store",
            format!(
                "store: the conversation is too long to store ({} bytes of record > {MAX_STORED_RESPONSE}); send \
                 store: false and the whole conversation as input",
                body.len()
            ),
        ));
    }
    let stored = StoredResponse {
        project: project.to_owned(),
        id: id.to_owned(),
        created_at,
        ttl_s: gateway.response_ttl_s(),
        body,
    };
    gateway.upstream().store_response(stored).await.map_err(|e| ApiError::from_call(&e, "the response store"))?;
    metrics::counter!("zl_frontend_stored_responses_total").increment(1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_holds_the_whole_conversation_in_order() {
        let echoed = Echoed {
            history: vec![json!({"id": "old"})],
            input_items: vec![json!({"id": "new"})],
            ..Echoed::default()
        };
        let r = record(&json!({"id": "resp_1", "output": [{"id": "out"}]}), &echoed);
        let ids: Vec<&str> = r["conversation"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["old", "new", "out"]);
        assert_eq!(r["input_items"], json!([{"id": "new"}]));
    }
}
