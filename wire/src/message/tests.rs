//! Round trips for every message, and refusal of every kind of bad payload.

use super::*;
use crate::frame::{FrameDecoder, HARD_MAX_PAYLOAD};

fn node(id: &str) -> NodeId {
    NodeId::new(id).unwrap()
}

pub(crate) fn samples() -> Vec<Message> {
    vec![
        Message::Handshake(Handshake {
            protocol_major: 1,
            protocol_minor: 0,
            role: Role::Worker,
            node_id: node("worker-0"),
            software_version: "zerolayer 0.1.0".into(),
        }),
        Message::RegisterWorker(RegisterWorker {
            worker_id: node("worker-0"),
            endpoint: "127.0.0.1:7100".into(),
            device_class: ComputePool::Cpu,
            models: vec![ModelInfo {
                id: "smollm2-135m-instruct".into(),
                weights_sha256: [7; 32],
                context_length: 8192,
                family: "llama".into(),
                weights_bytes: 103_546_432,
                embedding_dims: 0,
            }],
            kv_block_size: 16,
            kv_blocks_total: 4096,
            max_running_sequences: 32,
            kv_dtype: "q8".into(),
            kv_bytes_per_token: 12_240,
        }),
        Message::DeregisterWorker(DeregisterWorker { worker_id: node("worker-0"), reason: "shutdown".into() }),
        Message::Ack(Ack { applied_index: 42, hand_over: true }),
        Message::LoadReport(LoadReport {
            worker_id: node("worker-0"),
            sequence: 9,
            queue_depth: 3,
            running_sequences: 16,
            kv_blocks_used: 100,
            kv_blocks_free: 3996,
            fragmentation_ratio: 0.125,
            tokens_per_second: 431.5,
            vram_total_bytes: 150_754_820_096,
            vram_free_bytes: 98_000_000_000,
            queued_prefill_blocks: 0,
            adapters: vec![],
        }),
        Message::KvCacheEvents(KvCacheEvents {
            worker_id: node("worker-0"),
            sequence: 10,
            model: "smollm2-135m-instruct".into(),
            stored: vec![1, u64::MAX, 3],
            evicted: vec![4],
            cleared: false,
            host: vec![5, 6],
            disk: vec![7],
        }),
        Message::RouteRequest(RouteRequest {
            request_id: "req_01".into(),
            model: "smollm2".into(),
            prompt_tokens: 120,
            max_tokens: 256,
            block_hashes: vec![11, 12, 13],
            session_id: Some("user-7".into()),
            hint: RouteHint::LowLatency,
            input_semantic_weight: 0.6,
            excluded_workers: vec![node("worker-3")],
            trace_id: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            prefer_fallback: false,
            project: String::new(),
        }),
        Message::RouteDecision(RouteDecision {
            request_id: "req_01".into(),
            worker_id: node("worker-0"),
            endpoint: "[::1]:7100".into(),
            model: "smollm2-135m-instruct".into(),
            weights_sha256: [9; 32],
            compute_pool: ComputePool::Hybrid,
            predicted_billing_unit: 0.42,
            reason: "least-loaded: queue 0".into(),
            decision_nanos: 1800,
            orchestrator_id: String::new(),
            adapter: None,
        }),
        Message::GenerateRequest(GenerateRequest {
            request_id: "req_01".into(),
            trace_id: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            model: "smollm2-135m-instruct".into(),
            prompt: Prompt::Tokens(vec![1, 2, 3, 49151]),
            sampling: SamplingParams { temperature: 0.0, top_p: 0.9, top_k: 40, seed: Some(0) },
            max_tokens: 64,
            stop_sequences: vec!["\n\nHuman:".into()],
            stream: true,
            logprobs: true,
            streaming_predicted: Some(false),
            grammar: "start: \"a\"".into(),
            cache_salt: 7,
            resume_tokens: vec![5, 6],
            adapter: None,
            top_logprobs: 2,
            prompt_logprobs: true,
            think: Some(ThinkBudget { budget: 512, end: "</think>".into(), close: vec![198, 151668, 271] }),
            penalties: Some(Penalties {
                frequency: 0.5,
                presence: -1.0,
                min_p: 0.05,
                logit_bias: vec![(3, -100.0), (9, 2.5)],
            }),
        }),
        Message::GenerateRequest(GenerateRequest {
            request_id: "req_02".into(),
            trace_id: String::new(),
            model: "m".into(),
            prompt: Prompt::Text("<|im_start|>user\nHi<|im_end|>\n".into()),
            sampling: SamplingParams::default(),
            max_tokens: 1,
            stop_sequences: vec![],
            stream: false,
            logprobs: false,
            streaming_predicted: None,
            grammar: String::new(),
            cache_salt: 0,
            resume_tokens: vec![],
            adapter: None,
            top_logprobs: 0,
            prompt_logprobs: false,
            think: None,
            penalties: None,
        }),
        Message::TokenChunk(TokenChunk {
            token_ids: vec![504, 3],
            text_delta: "Paris é".into(),
            logprobs: Some(vec![-0.01, -2.5]),
            top: vec![(504, -0.01), (7, -4.5), (3, -2.5), (504, -0.2)],
            prompt_start: None,
        }),
        Message::TokenChunk(TokenChunk {
            token_ids: vec![2, 3],
            text_delta: String::new(),
            logprobs: Some(vec![-1.0, f32::NEG_INFINITY]),
            top: vec![],
            prompt_start: Some(1),
        }),
        Message::TokenChunk(TokenChunk {
            token_ids: vec![5],
            text_delta: String::new(),
            logprobs: None,
            ..Default::default()
        }),
        Message::Finish(Finish {
            stop_reason: StopReason::StopSequence,
            stop_sequence: Some("\n\nHuman:".into()),
            usage: Usage { input_tokens: 120, output_tokens: 7, cached_input_tokens: 112, ..Usage::default() },
        }),
        Message::Finish(Finish {
            stop_reason: StopReason::MaxTokens,
            stop_sequence: None,
            usage: Usage {
                input_tokens: 1,
                output_tokens: 64,
                cached_input_tokens: 0,
                draft_tokens: 70,
                accepted_draft_tokens: 40,
            },
        }),
        Message::Error(WireError {
            code: ErrorCode::Overloaded,
            message: "all pools busy".into(),
            retry_after_ms: 500,
        }),
        Message::Cancel(Cancel { reason: "client disconnected".into() }),
        Message::ModelCardRequest(ModelCardRequest { model: "smollm2-135m-instruct".into() }),
        Message::ModelCard(ModelCard {
            model: "smollm2-135m-instruct".into(),
            weights_sha256: [3; 32],
            context_length: 8192,
            tokenizer_json: "{\"model\":{}}".into(),
            chat_template: "{{ messages }}".into(),
            bos_token: "<|im_start|>".into(),
            eos_token: "<|im_end|>".into(),
            stop_token_ids: vec![0, 2],
            kv_block_size: 16,
            embedding_dims: 0,
            pooling: String::new(),
        }),
        Message::EmbedRequest(EmbedRequest {
            request_id: "req_2".into(),
            trace_id: String::new(),
            model: "nomic-embed".into(),
            inputs: vec![vec![101, 7, 102], vec![101, 102]],
        }),
        Message::Embeddings(Embeddings { start: 0, dims: 2, values: vec![0.6, 0.8] }),
        Message::StoredResponse(StoredResponse {
            project: "acme".into(),
            id: "resp_1".into(),
            created_at: 1_800_000_000,
            ttl_s: 86_400,
            body: "{\"response\":{}}".into(),
        }),
        Message::ResponseLookup(ResponseLookup { project: "acme".into(), id: "resp_1".into(), delete: false }),
        Message::ResponseFound(ResponseFound { found: true, body: "{}".into(), created_at: 1_800_000_000 }),
        Message::StateSyncRequest(StateSyncRequest { known_index: 41 }),
        Message::StateSync(StateSync {
            applied_index: 42,
            unchanged: false,
            keys: vec![ApiKeyEntry {
                key_id: "key-1".into(),
                secret_sha256: "ab".repeat(32),
                project: "default".into(),
                regions: vec!["eu-west".into(), "us-east".into()],
            }],
            projects: vec![ProjectQuota {
                project: "default".into(),
                requests_per_minute: 60,
                tokens_per_minute: 0,
                max_concurrent: 4,
                input_tokens_per_minute: 10_000,
                output_tokens_per_minute: 2_000,
                priority: 2,
                budget: Some(Budget { metric: BudgetMetric::Tokens, period: BudgetPeriod::Month, limit: 1_000_000 }),
                content_key: Some(("dk_1".into(), vec![9; 32])),
                cache_group: "team-a".into(),
            }],
            models: vec![ModelInfo {
                id: "smollm2-135m-instruct".into(),
                weights_sha256: [3; 32],
                context_length: 8192,
                family: "bert".into(),
                weights_bytes: 0,
                embedding_dims: 768,
            }],
            serving_workers: 1,
            billing_weights: Some([0.3, 0.5, 0.2]),
            adapters: vec![],
        }),
        Message::FrontendReport(FrontendReport {
            report_seq: 7,
            usage: vec![
                UsageDelta {
                    hour: 3600 * 500_000,
                    key_id: "key-1".into(),
                    project: "default".into(),
                    requests: 3,
                    input_tokens: 40,
                    output_tokens: 12,
                    milli_units: 450,
                    ..UsageDelta::default()
                },
                UsageDelta {
                    hour: 3600 * 500_000,
                    key_id: "key-1".into(),
                    project: "default".into(),
                    requests: 1,
                    input_tokens: 9,
                    output_tokens: 4,
                    milli_units: 120,
                    adapter: "support-bot".into(),
                    adapter_sha256: Some([7; 32]),
                },
            ],
            asks: vec![BudgetAsk { project: "default".into(), period_start: 86_400, used: 10, target: 1010 }],
            audit_seq: 9,
            audit_hash: Some([4; 32]),
            sent_ms: 1_700_000_000_000,
            lease_ms: 15_000,
            rate_asks: vec![RateAsk { bucket: "key/key-1/requests".into(), per_minute: 60, used: 4, target: 7 }],
        }),
        Message::FrontendGrant(FrontendGrant {
            applied_index: 43,
            grants: vec![BudgetGrant {
                project: "default".into(),
                period_start: 86_400,
                resets_at: 172_800,
                limit: 5000,
                spent: 700,
                allotment: 1010,
            }],
            capacity: 8,
            running: 6,
            waiting: 2,
            leader: true,
            rate_grants: vec![RateGrant { bucket: "key/key-1/requests".into(), allotment: 7, available: 50 }],
            audit_head: Some((12, [7; 32])),
        }),
        Message::CertificateRequest(CertificateRequest {
            role: Role::Frontend,
            node_id: node("zl-frontend-5c7d-8kq2p"),
            csr_der: vec![0x30, 0x82, 1, 2, 3],
        }),
        Message::CertificateIssued(CertificateIssued {
            cert_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
            not_after_ms: 1_800_000_000_000,
        }),
        Message::Handshake(Handshake {
            protocol_major: 1,
            protocol_minor: 5,
            role: Role::Bootstrap,
            node_id: node("worker"),
            software_version: "zerolayer 0.1.0".into(),
        }),
    ]
}

#[test]
fn enrollment_requests_are_bounded_and_only_for_enrolling_roles() {
    let ok = CertificateRequest { role: Role::Worker, node_id: node("w-1"), csr_der: vec![1; MAX_CSR_LEN] };
    assert!(Message::CertificateRequest(ok.clone()).check().is_ok());
    let big = CertificateRequest { csr_der: vec![1; MAX_CSR_LEN + 1], ..ok.clone() };
    assert!(Message::CertificateRequest(big).check().is_err());
    let empty = CertificateRequest { csr_der: vec![], ..ok.clone() };
    assert!(Message::CertificateRequest(empty).check().is_err());
    let orchestrator = CertificateRequest { role: Role::Orchestrator, ..ok };
    assert!(Message::CertificateRequest(orchestrator).check().is_err());
}

pub(crate) fn decode_one(bytes: &[u8]) -> Result<Message, String> {
    let mut dec = FrameDecoder::new(HARD_MAX_PAYLOAD);
    let mut input = bytes;
    let frame = dec.decode(&mut input).map_err(|e| e.to_string())?.ok_or("incomplete")?;
    assert!(input.is_empty());
    Message::decode(&frame).map_err(|e| e.to_string())
}

#[test]
fn every_sample_round_trips() {
    let mut enc = Encoder::new(HARD_MAX_PAYLOAD);
    for msg in samples() {
        let bytes = enc.encode(&msg).unwrap();
        assert_eq!(decode_one(&bytes).unwrap(), msg);
    }
}

#[test]
fn every_frame_kind_has_a_sample() {
    let kinds: std::collections::HashSet<_> = samples().iter().map(Message::kind).collect();
    assert_eq!(kinds.len(), FrameKind::ALL.len());
}

#[test]
fn payload_under_another_kinds_header_is_refused() {
    let mut enc = Encoder::new(HARD_MAX_PAYLOAD);
    let ack = enc.encode(&Message::Ack(Ack { applied_index: 1, hand_over: false })).unwrap();
    for kind in FrameKind::ALL {
        if matches!(
            kind,
            FrameKind::Ack
                | FrameKind::Cancel
                | FrameKind::TokenChunk
                | FrameKind::StateSyncRequest
                | FrameKind::StateSync
                | FrameKind::FrontendReport
                | FrameKind::FrontendGrant
                | FrameKind::ResponseFound
        ) {
            continue; // Tables without required fields can legitimately read an Ack's bytes as empty.
        }
        let frame = RawFrame { kind, payload: ack.slice(crate::frame::HEADER_LEN..) };
        assert!(Message::decode(&frame).is_err(), "{kind} accepted an Ack payload");
    }
}

#[test]
fn truncated_and_corrupted_payloads_never_panic() {
    let mut enc = Encoder::new(HARD_MAX_PAYLOAD);
    for msg in samples() {
        let bytes = enc.encode(&msg).unwrap();
        let payload = bytes.slice(crate::frame::HEADER_LEN..);
        for cut in 0..payload.len() {
            let frame = RawFrame { kind: msg.kind(), payload: payload.slice(..cut) };
            let _ = Message::decode(&frame);
        }
        // Flip every byte through a few values: the verifier or the checks refuse, or the result is well-formed.
        for i in 0..payload.len() {
            for v in [0x00, 0x7f, 0x80, 0xff] {
                let mut corrupted = payload.to_vec();
                corrupted[i] = v;
                let frame = RawFrame { kind: msg.kind(), payload: corrupted.into() };
                if let Ok(decoded) = Message::decode(&frame) {
                    decoded.check().unwrap();
                }
            }
        }
    }
}

fn raw(kind: FrameKind, build: impl FnOnce(&mut FlatBufferBuilder<'static>)) -> RawFrame {
    let mut fbb = FlatBufferBuilder::new();
    build(&mut fbb);
    RawFrame { kind, payload: Bytes::copy_from_slice(fbb.finished_data()) }
}

fn invalid_field(frame: &RawFrame) -> &'static str {
    match Message::decode(frame) {
        Err(MessageError::Invalid { field, .. }) => field,
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn out_of_range_fields_are_refused_with_the_field_named() {
    let f = raw(FrameKind::Handshake, |fbb| {
        let node_id = fbb.create_string("w0");
        let t = fb::Handshake::create(
            fbb,
            &fb::HandshakeArgs { role: fb::Role(99), node_id: Some(node_id), ..Default::default() },
        );
        fbb.finish_minimal(t);
    });
    assert_eq!(invalid_field(&f), "Handshake.role");

    let f = raw(FrameKind::Handshake, |fbb| {
        let node_id = fbb.create_string("Bad_Id");
        let t = fb::Handshake::create(
            fbb,
            &fb::HandshakeArgs { role: fb::Role::Worker, node_id: Some(node_id), ..Default::default() },
        );
        fbb.finish_minimal(t);
    });
    assert_eq!(invalid_field(&f), "Handshake.node_id");

    let generate =
        |fbb: &mut FlatBufferBuilder<'static>, temperature: f32, text: bool, tokens: bool, max_tokens: u32| {
            let request_id = fbb.create_string("r");
            let model = fbb.create_string("m");
            let prompt_text = text.then(|| fbb.create_string("hi"));
            let prompt_tokens = tokens.then(|| fbb.create_vector(&[1u32, 2]));
            let sampling = fb::SamplingParams::create(
                fbb,
                &fb::SamplingParamsArgs { temperature, top_p: 1.0, ..Default::default() },
            );
            let t = fb::GenerateRequest::create(
                fbb,
                &fb::GenerateRequestArgs {
                    request_id: Some(request_id),
                    model: Some(model),
                    prompt_text,
                    prompt_tokens,
                    sampling: Some(sampling),
                    max_tokens,
                    ..Default::default()
                },
            );
            fbb.finish_minimal(t);
        };
    assert_eq!(
        invalid_field(&raw(FrameKind::GenerateRequest, |b| generate(b, f32::NAN, true, false, 5))),
        "SamplingParams.temperature"
    );
    assert_eq!(
        invalid_field(&raw(FrameKind::GenerateRequest, |b| generate(b, 5.0, true, false, 5))),
        "SamplingParams.temperature"
    );
    assert_eq!(
        invalid_field(&raw(FrameKind::GenerateRequest, |b| generate(b, 0.5, true, true, 5))),
        "GenerateRequest.prompt"
    );
    assert_eq!(
        invalid_field(&raw(FrameKind::GenerateRequest, |b| generate(b, 0.5, false, false, 5))),
        "GenerateRequest.prompt"
    );
    assert_eq!(
        invalid_field(&raw(FrameKind::GenerateRequest, |b| generate(b, 0.5, false, true, 0))),
        "GenerateRequest.max_tokens"
    );
    assert!(Message::decode(&raw(FrameKind::GenerateRequest, |b| generate(b, 0.5, false, true, 5))).is_ok());

    let f = raw(FrameKind::RouteDecision, |fbb| {
        let s = fbb.create_string("x");
        let w = fbb.create_string("w0");
        let e = fbb.create_string("h:1");
        let sha = fbb.create_vector(&[0u8; 31]);
        let t = fb::RouteDecision::create(
            fbb,
            &fb::RouteDecisionArgs {
                request_id: Some(s),
                worker_id: Some(w),
                endpoint: Some(e),
                model: Some(s),
                weights_sha256: Some(sha),
                compute_pool: fb::ComputePool::Gpu,
                ..Default::default()
            },
        );
        fbb.finish_minimal(t);
    });
    assert_eq!(invalid_field(&f), "RouteDecision.weights_sha256");

    let f = raw(FrameKind::TokenChunk, |fbb| {
        let ids = fbb.create_vector(&[1u32, 2]);
        let lp = fbb.create_vector(&[-1.0f32]);
        let t = fb::TokenChunk::create(
            fbb,
            &fb::TokenChunkArgs { token_ids: Some(ids), logprobs: Some(lp), ..Default::default() },
        );
        fbb.finish_minimal(t);
    });
    assert_eq!(invalid_field(&f), "TokenChunk.logprobs");

    // Alternatives that do not divide among the tokens, or come without their logprobs.
    let f = raw(FrameKind::TokenChunk, |fbb| {
        let ids = fbb.create_vector(&[1u32, 2]);
        let lp = fbb.create_vector(&[-1.0f32, -0.5]);
        let top_ids = fbb.create_vector(&[1u32, 2, 3]);
        let top_lp = fbb.create_vector(&[-1.0f32, -2.0, -3.0]);
        let t = fb::TokenChunk::create(
            fbb,
            &fb::TokenChunkArgs {
                token_ids: Some(ids),
                logprobs: Some(lp),
                top_ids: Some(top_ids),
                top_logprobs: Some(top_lp),
                ..Default::default()
            },
        );
        fbb.finish_minimal(t);
    });
    assert_eq!(invalid_field(&f), "TokenChunk.top_logprobs");
    // A prompt chunk with text.
    let f = raw(FrameKind::TokenChunk, |fbb| {
        let ids = fbb.create_vector(&[1u32]);
        let lp = fbb.create_vector(&[-1.0f32]);
        let text = fbb.create_string("x");
        let t = fb::TokenChunk::create(
            fbb,
            &fb::TokenChunkArgs {
                token_ids: Some(ids),
                logprobs: Some(lp),
                text_delta: Some(text),
                prompt_start: Some(1),
                ..Default::default()
            },
        );
        fbb.finish_minimal(t);
    });
    assert_eq!(invalid_field(&f), "TokenChunk.prompt_start");
}

#[test]
fn missing_required_fields_fail_verification() {
    // A Cancel table has no field 1; an Error table requires its message there.
    let f = raw(FrameKind::Error, |fbb| {
        let reason = fbb.create_string("x");
        let t = fb::Cancel::create(fbb, &fb::CancelArgs { reason: Some(reason) });
        fbb.finish_minimal(t);
    });
    assert!(matches!(Message::decode(&f), Err(MessageError::Verify(_))), "{:?}", Message::decode(&f));
}

#[test]
fn encoder_refuses_invalid_and_oversized_messages() {
    let mut enc = Encoder::new(64);
    let bad = Message::Error(WireError { code: ErrorCode::Internal, message: "x\u{0}".into(), retry_after_ms: 0 });
    assert!(matches!(enc.encode(&bad), Err(EncodeError::Message(_))));
    let big = Message::TokenChunk(TokenChunk { token_ids: vec![1; 100], ..Default::default() });
    assert!(matches!(enc.encode(&big), Err(EncodeError::Frame(FrameError::TooLarge { .. }))));
    // The encoder is still usable afterwards.
    assert!(enc.encode(&Message::Ack(Ack::default())).is_ok());
}

#[test]
fn a_grammar_over_its_limit_is_refused_both_ways() {
    let mut req = samples()
        .into_iter()
        .find_map(|m| match m {
            Message::GenerateRequest(r) => Some(r),
            _ => None,
        })
        .unwrap();
    req.grammar = "a".repeat(MAX_GRAMMAR_LEN + 1);
    let mut enc = Encoder::new(HARD_MAX_PAYLOAD);
    assert!(matches!(enc.encode(&Message::GenerateRequest(req.clone())), Err(EncodeError::Message(_))));
    // A peer that sends one anyway is refused on decode, the field named.
    let frame = raw(FrameKind::GenerateRequest, |fbb| {
        let args = fb::GenerateRequestArgs {
            request_id: Some(fbb.create_string("r1")),
            model: Some(fbb.create_string("m")),
            prompt_tokens: Some(fbb.create_vector(&[1u32])),
            max_tokens: 1,
            grammar: Some(fbb.create_string(&req.grammar)),
            ..Default::default()
        };
        let t = fb::GenerateRequest::create(fbb, &args);
        fbb.finish(t, None);
    });
    assert_eq!(invalid_field(&frame), "GenerateRequest.grammar");
}
