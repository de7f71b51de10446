//! The HTTP router as a `tower::Service`, without sockets, against a scripted upstream (orchestrator and worker
//! answers): both APIs' shapes and streams byte for byte, every error case, auth, rate limits, the cache, the
//! retry before the first token and cancellation on client disconnect.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use common::*;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use zl_frontend::cluster::Cluster;
use zl_frontend::gateway::{Gateway, GatewayConfig};
use zl_frontend::http::{App, router};
use zl_frontend::limits::KeyLimits;
use zl_wire::message::{NodeId, Prompt};

#[tokio::test]
async fn a_message_comes_back_with_every_header() {
    let h = harness();
    let resp = h.anthropic(hello(json!({"temperature": 0.5}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(header(&resp, "request-id").starts_with("req_"));
    assert_eq!(header(&resp, "x-zl-worker"), "w1");
    assert_eq!(header(&resp, "x-zl-compute-path"), "cpu");
    assert_eq!(header(&resp, "x-zl-cache"), "bypass", "sampled without a seed is not cacheable");
    assert_eq!(header(&resp, "x-zl-health"), "healthy");
    assert!(header(&resp, "x-zl-route-ms").parse::<f64>().is_ok());
    assert_eq!(header(&resp, "x-zl-route-reason"), "test", "the orchestrator's reason, as it gave it");
    assert!(header(&resp, "x-zl-billing-unit").parse::<f64>().is_ok());
    assert_eq!(header(&resp, "anthropic-ratelimit-requests-limit"), "4000");
    assert_eq!(header(&resp, "anthropic-ratelimit-requests-remaining"), "3999");
    assert!(header(&resp, "anthropic-ratelimit-output-tokens-reset").ends_with('Z'));
    let body = json_of(resp).await;
    assert!(body["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["content"], json!([{"type": "text", "text": "Hello world"}]));
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["stop_sequence"], Value::Null);
    assert_eq!(body["usage"]["output_tokens"], 3);
    assert!(body["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(body["usage"]["billing_unit"].as_f64().is_some());
    // The worker got tokens, the sampling parameters, and the route got block hashes of the prompt.
    let rec = h.fake.recorded.lock().unwrap();
    let (_, g) = &rec.generates[0];
    assert_eq!(g.sampling.temperature, 0.5);
    assert_eq!(g.max_tokens, 8);
    let route = &rec.routes[0];
    assert!(route.prompt_tokens >= 4);
    assert_eq!(route.prompt_tokens as usize / 4, route.block_hashes.len());
}

#[tokio::test]
async fn the_stream_is_anthropics_event_sequence_byte_for_byte() {
    let h = harness();
    let resp = h.anthropic(hello(json!({"stream": true, "temperature": 0.7}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "content-type"), "text/event-stream; charset=utf-8");
    let body = text(resp).await;
    let id = body.split("\"id\":\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    let input = body.split("\"input_tokens\":").nth(1).unwrap().split(',').next().unwrap().to_owned();
    let unit = body.split("\"billing_unit\":").nth(1).unwrap().split(',').next().unwrap().to_owned();
    let expected = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"{id}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"tiny\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{input},\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":0}}}}}}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: ping\ndata: {{\"type\":\"ping\"}}\n\n\
         event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"Hello\"}}}}\n\n\
         event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\" wor\"}}}}\n\n\
         event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"ld\"}}}}\n\n\
         event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
         event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\",\"stop_sequence\":null}},\"usage\":{{\"input_tokens\":{input},\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":{zero},\"output_tokens\":3,\"billing_unit\":{unit},\"predicted_draft_tokens\":0,\"predicted_accepted_tokens\":0}}}}\n\n\
         event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n",
        zero = 0
    );
    assert_eq!(body, expected);
}

#[tokio::test]
async fn a_stream_no_worker_can_continue_ends_with_an_error_event() {
    let h = harness();
    *h.fake.mode.lock().unwrap() = WorkerMode::DiesMidStream;
    let resp = h.anthropic(hello(json!({"stream": true}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body = text(resp).await;
    // Moved twice (the migration limit), each time resumed after the token sent, then given up.
    let generates: Vec<Vec<u32>> =
        h.fake.recorded.lock().unwrap().generates.iter().map(|(_, g)| g.resume_tokens.clone()).collect();
    assert_eq!(generates, vec![vec![], vec![7], vec![7]]);
    assert!(body.contains("event: content_block_delta"));
    assert!(
        body.ends_with("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"the worker failed during the generation: connection lost: worker killed\"}}\n\n"),
        "{body}"
    );
    assert!(!body.contains("message_stop"));
}

#[tokio::test]
async fn a_worker_failing_before_the_first_token_is_retried_elsewhere() {
    let h = harness();
    *h.fake.mode.lock().unwrap() = WorkerMode::FirstWorkerDies;
    let resp = h.anthropic(hello(json!({}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-zl-worker"), "w2");
    let rec = h.fake.recorded.lock().unwrap();
    assert_eq!(rec.routes.len(), 2);
    assert_eq!(rec.routes[1].excluded_workers, vec![NodeId::new("w1").unwrap()]);
}

#[tokio::test]
async fn a_complete_answer_is_retried_when_the_worker_fails_after_admitting_it() {
    let h = harness();
    *h.fake.mode.lock().unwrap() = WorkerMode::FirstWorkerDiesAfterAdmitting;
    let resp = h.anthropic(hello(json!({}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(&resp, "x-zl-worker"), "w2");
    assert_eq!(json_of(resp).await["content"][0]["text"], "Hello world");
    // A stream has answered its client on the admission: the failure moves it to w2 (migration), nothing sent yet
    // to resume after, and the client sees one whole answer. (A fresh frontend: this one now avoids w1.)
    let h = harness();
    *h.fake.mode.lock().unwrap() = WorkerMode::FirstWorkerDiesAfterAdmitting;
    let resp = h.anthropic(hello(json!({"stream": true}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(body.starts_with("event: message_start") && body.contains("message_stop"), "{body}");
    assert!(!body.contains("event: error"), "{body}");
    assert!(h.fake.recorded.lock().unwrap().generates[1].1.resume_tokens.is_empty());
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_worker_stream() {
    let h = harness();
    *h.fake.mode.lock().unwrap() = WorkerMode::Endless;
    let resp = h.anthropic(hello(json!({"stream": true}))).await;
    let mut body = resp.into_body();
    for _ in 0..5 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(h.fake.dropped_streams.load(Ordering::SeqCst), 0);
    drop(body);
    assert_eq!(h.fake.dropped_streams.load(Ordering::SeqCst), 1, "dropping the body drops the worker call");
}

#[tokio::test]
async fn deterministic_requests_are_answered_from_the_cache() {
    let h = harness();
    for stream in [false, true] {
        let body = hello(
            json!({"temperature": 0, "stream": stream, "messages": [{"role": "user", "content": format!("hi {stream}")}]}),
        );
        let first = h.anthropic(body.clone()).await;
        assert_eq!(header(&first, "x-zl-cache"), "miss");
        let first_text = text(first).await;
        let second = h.anthropic(body.clone()).await;
        assert_eq!(header(&second, "x-zl-cache"), "hit");
        assert_eq!(header(&second, "x-zl-worker"), "cache");
        // No orchestrator was asked, as docs/api.md says.
        assert_eq!(header(&second, "x-zl-route-ms"), "-");
        assert_eq!(header(&second, "x-zl-route-reason"), "-");
        let second_text = text(second).await;
        // Identical apart from the message id.
        let strip = |s: &str| s.split("msg_").map(|p| p.get(24..).unwrap_or(p)).collect::<String>();
        assert_eq!(strip(&first_text), strip(&second_text));
        let bypass = Request::post("/v1/messages")
            .header("x-api-key", KEY)
            .header("x-zl-cache", "bypass")
            .body(Body::from(body.to_string()))
            .unwrap();
        assert_eq!(header(&h.send(bypass).await, "x-zl-cache"), "bypass");
    }
    // Seeded sampling is cacheable too.
    let seeded = hello(json!({"temperature": 0.9, "seed": 7}));
    h.anthropic(seeded.clone()).await;
    assert_eq!(header(&h.anthropic(seeded).await, "x-zl-cache"), "hit");
    assert_eq!(h.fake.recorded.lock().unwrap().generates.len(), 5, "2 misses + 2 bypasses + 1 seeded miss");
}

async fn error_of(resp: Response<Body>) -> (u16, Value) {
    let status = resp.status().as_u16();
    assert!(header(&resp, "request-id").starts_with("req_"));
    (status, json_of(resp).await)
}

#[tokio::test]
async fn every_error_is_anthropics_body_and_status() {
    let h = harness();
    let check = |(status, body): (u16, Value), want_status: u16, want_type: &str, want_msg: &str| {
        assert_eq!(status, want_status, "{body}");
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], want_type, "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(want_msg), "{body}");
        assert!(body["request_id"].as_str().unwrap().starts_with("req_"));
    };
    let no_key = Request::post("/v1/messages").body(Body::from(hello(json!({})).to_string())).unwrap();
    check(error_of(h.send(no_key).await).await, 401, "authentication_error", "an API key is required");
    let bad_key = Request::post("/v1/messages")
        .header("x-api-key", "nope")
        .body(Body::from(hello(json!({})).to_string()))
        .unwrap();
    check(error_of(h.send(bad_key).await).await, 401, "authentication_error", "invalid x-api-key: no such API key");
    // A Bearer token is named as one (the OpenAI SDK sends it so; it never sent an x-api-key).
    let bad_bearer = Request::post("/v1/chat/completions")
        .header("authorization", "Bearer nope")
        .body(Body::from(json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).to_string()))
        .unwrap();
    let (status, body) = error_of(h.send(bad_bearer).await).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["message"], "invalid bearer token: no such API key", "{body}");
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let bad_json = Request::post("/v1/messages").header("x-api-key", KEY).body(Body::from("{\"model\": ")).unwrap();
    check(error_of(h.send(bad_json).await).await, 400, "invalid_request_error", "not valid JSON");
    let bad_utf8 =
        Request::post("/v1/messages").header("x-api-key", KEY).body(Body::from(vec![b'{', 0xff, b'}'])).unwrap();
    check(error_of(h.send(bad_utf8).await).await, 400, "invalid_request_error", "not valid UTF-8");
    check(
        error_of(h.anthropic(hello(json!({"temperature": 5}))).await).await,
        400,
        "invalid_request_error",
        "temperature",
    );
    check(
        error_of(h.anthropic(hello(json!({"max_tokens": 0}))).await).await,
        400,
        "invalid_request_error",
        "max_tokens",
    );
    check(error_of(h.anthropic(hello(json!({"top_p": 2}))).await).await, 400, "invalid_request_error", "top_p");
    check(
        error_of(h.anthropic(hello(json!({"messages": []}))).await).await,
        400,
        "invalid_request_error",
        "at least one",
    );
    check(
        error_of(h.anthropic(hello(json!({"model": "nope"}))).await).await,
        404,
        "not_found_error",
        &format!("model: nope is not served here; served models: {MODEL}"),
    );
    check(
        error_of(h.anthropic(hello(json!({"max_tokens": 60}))).await).await,
        400,
        "invalid_request_error",
        "prompt is too long",
    );
    *h.fake.overloaded.lock().unwrap() = true;
    let resp = h.anthropic(hello(json!({}))).await;
    assert_eq!(header(&resp, "retry-after"), "3");
    check(error_of(resp).await, 529, "overloaded_error", "saturated");
    let unknown = Request::get("/v1/nothing").header("x-api-key", KEY).body(Body::empty()).unwrap();
    check(error_of(h.send(unknown).await).await, 404, "not_found_error", "Not found");
}

#[tokio::test]
async fn large_bodies_get_413_request_too_large() {
    let h = harness_with(GatewayConfig::default(), 1024);
    let big = hello(json!({"messages": [{"role": "user", "content": "x".repeat(2000)}]}));
    let (status, body) = error_of(h.anthropic(big).await).await;
    assert_eq!(status, 413);
    assert_eq!(body["error"]["type"], "request_too_large");
}

#[tokio::test]
async fn rate_limits_answer_429_with_retry_after_and_headers() {
    let config = GatewayConfig {
        default_limits: KeyLimits { requests: 2, input_tokens: 0, output_tokens: 0 },
        ..GatewayConfig::default()
    };
    let h = harness_with(config, 1024 * 1024);
    for left in ["1", "0"] {
        let resp = h.anthropic(hello(json!({}))).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header(&resp, "anthropic-ratelimit-requests-remaining"), left);
    }
    let resp = h.anthropic(hello(json!({}))).await;
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(header(&resp, "retry-after"), "30");
    assert_eq!(header(&resp, "anthropic-ratelimit-requests-limit"), "2");
    let (_, body) = error_of(resp).await;
    assert_eq!(body["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn openai_completions_streams_and_errors() {
    let h = harness();
    let resp = h.openai(json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "seed": 3})).await;
    assert_eq!(resp.status(), 200);
    let body = json_of(resp).await;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["content"], "Hello world");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["completion_tokens"], 3);
    assert_eq!(body["system_fingerprint"], "zl-abababababab");
    // Without max_tokens the rest of the context window is the limit.
    let g = h.fake.recorded.lock().unwrap().generates[0].1.clone();
    let Prompt::Tokens(prompt) = &g.prompt else { unreachable!() };
    assert_eq!(g.max_tokens as usize, 64 - prompt.len());
    assert_eq!(g.sampling.seed, Some(3));
    // A prompt that fills the whole window without max_tokens says what was assumed, not "max_tokens 0".
    let long = "word ".repeat(100);
    let resp = h.openai(json!({"model": MODEL, "messages": [{"role": "user", "content": long}]})).await;
    assert_eq!(resp.status(), 400);
    let message = json_of(resp).await["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("max_tokens was not set, so the rest of the context was assumed"), "{message}");
    assert!(!message.contains("max_tokens 0"), "{message}");

    let resp = h
        .openai(json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": true,
                       "stream_options": {"include_usage": true}, "max_tokens": 5}))
        .await;
    let body = text(resp).await;
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 7, "{body}");
    assert!(events[0].contains("\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"));
    assert!(events[1].contains("\"delta\":{\"content\":\"Hello\"}"));
    assert!(events[4].contains("\"finish_reason\":\"stop\""));
    assert!(events[5].contains("\"choices\":[]") && events[5].contains("\"total_tokens\""));
    assert_eq!(events[6], "data: [DONE]");

    let resp = h.openai(json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!(resp.status(), 404);
    let body = json_of(resp).await;
    assert_eq!(body["error"]["code"], "model_not_found");
    assert!(body["error"]["message"].as_str().unwrap().contains("nope"));
    // Several choices: one body with each, in index order, usage totalled.
    let resp = h.openai(json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 3})).await;
    assert_eq!(resp.status(), 200);
    let body = json_of(resp).await;
    let indexes: Vec<_> = body["choices"].as_array().unwrap().iter().map(|c| c["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, [0, 1, 2], "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 9, "{body}");
    let resp = h.openai(json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 129})).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(json_of(resp).await["error"]["param"], "n");
}

#[tokio::test]
async fn count_tokens_and_models_in_both_shapes() {
    let h = harness();
    let req = post("/v1/messages/count_tokens", ())
        .header("x-api-key", KEY)
        .body(Body::from(json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}).to_string()))
        .unwrap();
    let resp = h.send(req).await;
    assert_eq!(resp.status(), 200);
    let n = json_of(resp).await["input_tokens"].as_u64().unwrap();
    let tok = tokenizer();
    let rendered = tok.render_chat(&[zl_text::ChatMessage { role: "user".into(), content: "hello".into() }]).unwrap();
    assert_eq!(n as usize, tok.encode(&rendered).unwrap().len());

    let anthropic = Request::get("/v1/models?limit=1")
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .body(Body::empty())
        .unwrap();
    let body = json_of(h.send(anthropic).await).await;
    assert_eq!(
        body,
        json!({"data": [{"type": "model", "id": "tiny", "display_name": "tiny", "created_at": "1970-01-01T00:00:00Z"}],
               "has_more": false, "first_id": "tiny", "last_id": "tiny"})
    );
    // A listing carries the caller's rate-limit figures too: the count_tokens call above took one request of
    // the 4,000 a minute (listings take none).
    let listed = h.send(Request::get("/v1/models").header("x-api-key", KEY).body(Body::empty()).unwrap()).await;
    assert_eq!(header(&listed, "anthropic-ratelimit-requests-remaining"), "3999");
    let openai =
        Request::get("/v1/models").header("authorization", format!("Bearer {KEY}")).body(Body::empty()).unwrap();
    let body = json_of(h.send(openai).await).await;
    assert_eq!(
        body,
        json!({"object": "list", "data": [{"id": "tiny", "object": "model", "created": 0, "owned_by": "zerolayer"}]})
    );
    let one = Request::get("/v1/models/tiny")
        .header("x-api-key", KEY)
        .header("anthropic-version", "x")
        .body(Body::empty())
        .unwrap();
    assert_eq!(json_of(h.send(one).await).await["id"], "tiny");
    let missing = Request::get("/v1/models/nope")
        .header("x-api-key", KEY)
        .header("anthropic-version", "x")
        .body(Body::empty())
        .unwrap();
    assert_eq!(h.send(missing).await.status(), 404);
    let bad_limit = Request::get("/v1/models?limit=0")
        .header("x-api-key", KEY)
        .header("anthropic-version", "x")
        .body(Body::empty())
        .unwrap();
    assert_eq!(h.send(bad_limit).await.status(), 400);
}

#[tokio::test]
async fn health_and_readiness() {
    let h = harness();
    let resp = h.send(Request::get("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(resp.status(), 200);
    assert!(header(&resp, "request-id").starts_with("req_"));
    assert_eq!(h.send(Request::get("/readyz").body(Body::empty()).unwrap()).await.status(), 200);
    // A frontend that never synced is not ready.
    let gateway = Arc::new(Gateway::new(h.fake.clone(), Arc::new(Cluster::default()), GatewayConfig::default()));
    let cold =
        router(App { gateway, body_limit: 1024, edge: Default::default(), spill: Default::default(), audit: None });
    let resp = cold.oneshot(Request::get("/readyz").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 503);
}

#[tokio::test]
async fn a_frontend_whose_workers_are_all_gone_stays_ready_and_says_so() {
    // Its region lost every worker: it stays in its Service (to spill to a peer region, or answer 529 with the
    // reason), and says how well it can serve.
    let h = harness();
    let cluster = Arc::new(Cluster::default());
    let sync = zl_wire::message::StateSync { applied_index: 1, serving_workers: 0, ..Default::default() };
    cluster.apply(sync, std::time::Instant::now());
    let gateway = Arc::new(Gateway::new(h.fake.clone(), cluster, GatewayConfig::default()));
    let app =
        router(App { gateway, body_limit: 1024, edge: Default::default(), spill: Default::default(), audit: None });
    let resp = app.oneshot(Request::get("/readyz").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-zl-health"), "unavailable");
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["serving_workers"], 0, "{body}");
    assert!(body["health"]["reason"].as_str().unwrap().contains("no healthy worker"), "{body}");
}

#[tokio::test]
async fn the_streaming_predicted_header_reaches_the_worker_and_its_figures_come_back() {
    let h = harness();
    let with = |value: Option<&str>| {
        let mut req = Request::post("/v1/messages").header("x-api-key", KEY);
        if let Some(v) = value {
            req = req.header("x-zl-streaming-predicted", v);
        }
        req.body(Body::from(hello(json!({})).to_string())).unwrap()
    };
    for (value, asked) in [(None, None), (Some("true"), Some(true)), (Some("FALSE"), Some(false))] {
        let resp = h.send(with(value)).await;
        assert_eq!(resp.status(), StatusCode::OK, "{value:?}");
        assert_eq!(header(&resp, "x-zl-predicted-draft-tokens"), "0");
        assert_eq!(header(&resp, "x-zl-predicted-accepted-tokens"), "0");
        let body = json_of(resp).await;
        assert_eq!(
            (body["usage"]["predicted_draft_tokens"].as_u64(), body["usage"]["predicted_accepted_tokens"].as_u64()),
            (Some(0), Some(0))
        );
        let rec = h.fake.recorded.lock().unwrap();
        assert_eq!(rec.generates.last().unwrap().1.streaming_predicted, asked, "{value:?}");
    }
    let (status, body) = error_of(h.send(with(Some("sometimes"))).await).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("x-zl-streaming-predicted"), "{body}");
}

#[tokio::test]
async fn a_stream_starts_when_the_worker_admits_the_request_not_at_its_first_token() {
    let h = harness();
    *h.fake.mode.lock().unwrap() = WorkerMode::Admitted;
    let wait = std::time::Duration::from_secs(10);
    // The worker has admitted the request and computes nothing yet: the headers and message_start come anyway.
    let resp = tokio::time::timeout(wait, h.anthropic(hello(json!({"stream": true})))).await.expect("headers");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut seen = String::new();
    while !seen.contains("event: content_block_start") {
        let frame = tokio::time::timeout(wait, body.frame()).await.expect("the first events").unwrap().unwrap();
        seen.push_str(std::str::from_utf8(frame.data_ref().unwrap()).unwrap());
    }
    assert!(seen.starts_with("event: message_start"), "{seen}");
    assert!(!seen.contains("content_block_delta"), "no token was computed yet: {seen}");
    // The first token.
    h.fake.gate.add_permits(1);
    let rest = tokio::time::timeout(wait, body.collect()).await.unwrap().unwrap().to_bytes();
    let rest = String::from_utf8(rest.to_vec()).unwrap();
    assert!(rest.contains("\"text\":\"Hello\""), "{rest}");
    assert_eq!(rest.matches("event: content_block_delta").count(), 3, "the admission frame is no event: {rest}");
    assert!(rest.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"), "{rest}");
}

#[tokio::test]
async fn a_cluster_with_no_model_registered_yet_answers_a_retryable_529_not_404() {
    // Starting: the key is known, no worker has registered a model yet. Nothing tells a typo from a model still to
    // come, and what is missing is capacity: SDKs retry a 529, never a 404.
    let h = harness();
    let mut starting = sync_state(1);
    starting.models.clear();
    h.cluster.apply(starting, std::time::Instant::now());
    let resp = h.anthropic(hello(json!({}))).await;
    assert_eq!(resp.status().as_u16(), 529, "{}", text(resp).await);
    let resp = h.openai(hello(json!({}))).await;
    assert_eq!(resp.status().as_u16(), 529);
    assert!(resp.headers().contains_key("retry-after"));
    // Models registered: a name none of them is stays a 404 naming those served.
    h.cluster.apply(sync_state(2), std::time::Instant::now());
    let resp = h.anthropic(hello(json!({"model": "typo"}))).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(text(resp).await.contains(MODEL));
}
