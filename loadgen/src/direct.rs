//! Straight to a worker, past the frontend: the other half of the gateway-overhead benchmark. Requests go over the
//! cluster's own RPC (QUIC with mutual TLS, a frontend's certificate) to one worker, carrying the very tokens the
//! frontend would send: the prompt is rendered with the model's chat template and tokenised by the frontend's own
//! code ([`zl_client::prompt::tokenize`]) before the request's clock starts, because a client that talks to
//! workers directly has its tokens ready. The difference between the two paths is then what the gateway adds:
//! HTTP, authentication, rate limits, rendering and tokenising, the route decision and the relay.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use zl_client::card::{Card, fetch_card};
use zl_client::prompt::tokenize;
use zl_client::upstream::{QuicUpstream, Upstream};
use zl_text::ChatMessage;
use zl_wire::message::{GenerateRequest, Message, Prompt, Role, SamplingParams};

use crate::client::Ask;
use crate::record::Record;

/// A worker to send requests to.
pub struct DirectWorker {
    upstream: QuicUpstream,
    endpoint: String,
    card: Card,
    counter: AtomicU64,
}

impl std::fmt::Debug for DirectWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectWorker").field("endpoint", &self.endpoint).field("model", &self.card.model).finish()
    }
}

impl DirectWorker {
    /// Connect to the worker at `endpoint` (`host:port`) with the frontend identity `node_id` from `tls_dir`, and
    /// fetch `model`'s card.
    pub async fn connect(endpoint: &str, tls_dir: &std::path::Path, node_id: &str, model: &str) -> Result<Arc<Self>> {
        let identity = zl_node::load_identity(tls_dir, Role::Frontend, node_id)?;
        let client = zl_proto::quic::Client::new(&identity, zl_client::rpc_settings())?;
        let upstream = QuicUpstream::new(client, vec![]);
        let card = fetch_card(&upstream, endpoint.to_owned(), model.to_owned())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("asking the worker at {endpoint} for {model}'s card"))?;
        Ok(Arc::new(DirectWorker { upstream, endpoint: endpoint.to_owned(), card, counter: AtomicU64::new(0) }))
    }

    /// Send `ask` and stream its answer, like [`crate::client::send`].
    pub async fn send(
        &self,
        ask: &Ask<'_>,
        t0: Instant,
        due: Option<f64>,
        timeout: std::time::Duration,
    ) -> (Record, String) {
        let messages: Vec<ChatMessage> =
            ask.messages.iter().map(|t| ChatMessage { role: t.role.clone(), content: t.content.clone() }).collect();
        let prepared = tokenize(&self.card.tokenizer, ask.system, &messages, None);
        let start = due.unwrap_or_else(|| t0.elapsed().as_secs_f64());
        let mut rec = Record { start_s: start, ..Record::default() };
        let mut answer = String::new();
        let outcome = match prepared {
            Err(e) => Err(("request".to_owned(), e.to_string())),
            Ok((_, tokens)) => {
                rec.input_tokens = Some(tokens.len() as u32);
                let n = self.counter.fetch_add(1, Ordering::Relaxed);
                let request = GenerateRequest {
                    request_id: format!("bench-{}-{n}", std::process::id()),
                    trace_id: String::new(),
                    model: self.card.model.clone(),
                    prompt: Prompt::Tokens(tokens),
                    sampling: SamplingParams { temperature: ask.temperature, top_p: 1.0, top_k: 0, seed: None },
                    max_tokens: ask.max_tokens,
                    stop_sequences: vec![],
                    stream: true,
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
                };
                rec.request_id = Some(request.request_id.clone());
                rec.worker = Some(self.endpoint.clone());
                match tokio::time::timeout(timeout, self.stream(request, t0, &mut rec, &mut answer)).await {
                    Ok(r) => r,
                    Err(_) => Err(("timeout".to_owned(), format!("no complete answer within {timeout:?}"))),
                }
            }
        };
        if let Err((kind, message)) = outcome {
            rec.error = Some(kind);
            rec.error_message = Some(message);
        }
        rec.end_s = t0.elapsed().as_secs_f64();
        (rec, answer)
    }

    async fn stream(
        &self,
        request: GenerateRequest,
        t0: Instant,
        rec: &mut Record,
        answer: &mut String,
    ) -> Result<(), (String, String)> {
        let mut source = self
            .upstream
            .generate(self.endpoint.clone(), request)
            .await
            .map_err(|e| ("connect".to_owned(), e.to_string()))?;
        loop {
            match source.next().await {
                None => return Err(("incomplete".to_owned(), "the worker ended the call without finishing".into())),
                Some(Err(e)) => return Err(("stream_error".to_owned(), e.to_string())),
                Some(Ok(Message::TokenChunk(c))) if c.is_admission() => {}
                Some(Ok(Message::TokenChunk(c))) => {
                    rec.chunks_s.push(t0.elapsed().as_secs_f64());
                    answer.push_str(&c.text_delta);
                }
                Some(Ok(Message::Finish(f))) => {
                    rec.status = 200;
                    rec.output_tokens = f.usage.output_tokens;
                    rec.input_tokens = Some(f.usage.input_tokens);
                    return Ok(());
                }
                Some(Ok(other)) => {
                    return Err(("protocol".to_owned(), format!("unexpected {:?} in a generation", other.kind())));
                }
            }
        }
    }
}
