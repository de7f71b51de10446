//! OpenAI's Responses API, `POST /v1/responses`: the request read as the Chat Completions request it amounts to
//! (`request.rs`), the answer written as a `response` object with its output items (`reasoning`, `message` with
//! `output_text`, `function_call`), or streamed as the official event sequence: `response.created`,
//! `response.in_progress`, per item `response.output_item.added`, its content's events
//! (`response.content_part.added`, `response.output_text.delta`/`.done`, `response.content_part.done`;
//! `response.reasoning_text.delta`/`.done`; `response.function_call_arguments.delta`/`.done`) and
//! `response.output_item.done`, then `response.completed` (or `response.incomplete`), each with its
//! `sequence_number`. A response is stored once complete (`store`, the default; `stored.rs`), before its body or
//! its last event is sent, and `previous_response_id` continues a stored one.

pub mod request;
pub mod stored;

use serde_json::{Value, json};
use zl_wire::message::StopReason;

use crate::cache::FinishInfo;
use crate::dialect::Dialect;
use crate::error::{ApiError, ErrorFormat};
use crate::gateway::{GenEvent, GenRequest, Meta, Prepared};
use crate::ids::{random_id, unix_now};
use crate::tools::calls::{Piece, Splitter};
use request::Echoed;

/// The item being written.
#[derive(Debug)]
enum Open {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
    Call { id: String, call_id: String, name: String, args: String },
}

/// `POST /v1/responses` as a [`Dialect`].
#[derive(Debug)]
pub struct Responses {
    echoed: Echoed,
    id: String,
    created: u64,
    model: String,
    splitter: Splitter,
    think: Option<crate::thinking::Splitter>,
    /// Events written so far (each event's `sequence_number`).
    seq: u64,
    /// Output items completed.
    items: Vec<Value>,
    open: Option<Open>,
    /// The model's card, for naming tokens, when the output text's log-probabilities are asked for.
    card: Option<std::sync::Arc<zl_client::card::Card>>,
    /// Log-probability entries not yet sent with a text delta.
    pending: Vec<Value>,
    /// Every entry of the open message's text.
    entries: Vec<Value>,
    /// The finished response object, while its record waits to be stored.
    finished: Option<Value>,
    /// The stream's last event, held back until the record is stored.
    held: String,
}

/// Chat's parameter names as the Responses API calls them.
fn renamed(mut e: ApiError) -> ApiError {
    let names = [("messages", "input"), ("max_tokens", "max_output_tokens"), ("response_format", "text")];
    if let Some((chat, ours)) = names.iter().find(|(chat, _)| e.param.as_deref() == Some(*chat)) {
        e.param = Some((*ours).to_owned());
        if let Some(rest) = e.message.strip_prefix(chat) {
            e.message = format!("{ours}{rest}");
        }
    }
    e
}

/// One server-sent event of the stream, numbered `seq`.
fn numbered(name: &str, mut data: Value, seq: u64) -> String {
    data["type"] = json!(name);
    data["sequence_number"] = json!(seq);
    crate::anthropic::event(name, &data)
}

/// Events the stream's head takes (`response.created`, `response.in_progress`): the others are numbered after them.
const HEAD_EVENTS: u64 = 2;

impl Responses {
    fn new(echoed: Echoed, splitter: Splitter) -> Self {
        Responses {
            echoed,
            id: String::new(),
            created: 0,
            model: String::new(),
            splitter,
            think: None,
            seq: HEAD_EVENTS,
            items: Vec::new(),
            open: None,
            card: None,
            pending: Vec::new(),
            entries: Vec::new(),
            finished: None,
            held: String::new(),
        }
    }

    fn event(&mut self, name: &str, data: Value) -> String {
        self.seq += 1;
        numbered(name, data, self.seq - 1)
    }

    /// The `response` object in `status`, with the items so far and (once known) the usage.
    fn object(&self, status: &str, finish: Option<&FinishInfo>) -> Value {
        let e = &self.echoed;
        let incomplete = finish
            .filter(|f| f.stop_reason == StopReason::MaxTokens)
            .map(|_| json!({"reason": "max_output_tokens"}))
            .unwrap_or(Value::Null);
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": self.model,
            "output": self.items,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": e.previous_response_id,
            "reasoning": e.reasoning,
            "store": e.store,
            "temperature": e.temperature,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": "disabled",
            "usage": finish.map_or(Value::Null, usage),
            "user": e.user,
            "metadata": e.metadata,
        })
    }

    /// Close the open item: its done events, and the item among the output.
    fn close(&mut self) -> String {
        let Some(open) = self.open.take() else { return String::new() };
        let index = self.items.len();
        let mut out = String::new();
        let item = match open {
            Open::Reasoning { id, text } => {
                let data = json!({"item_id": id, "output_index": index, "content_index": 0, "text": text});
                out += &self.event("response.reasoning_text.done", data);
                json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]})
            }
            Open::Message { id, text } => {
                let logprobs = std::mem::take(&mut self.entries);
                let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs});
                let data = json!({"item_id": id, "output_index": index, "content_index": 0, "text": text,
                    "logprobs": logprobs});
                out += &self.event("response.output_text.done", data);
                let data = json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
                out += &self.event("response.content_part.done", data);
                json!({"type": "message", "id": id, "status": "completed", "role": "assistant", "content": [part]})
            }
            Open::Call { id, call_id, name, args } => {
                let data = json!({"item_id": id, "output_index": index, "name": name, "arguments": args});
                out += &self.event("response.function_call_arguments.done", data);
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": args,
                    "status": "completed"})
            }
        };
        out += &self.event("response.output_item.done", json!({"output_index": index, "item": item}));
        self.items.push(item);
        out
    }

    /// Open an item: its added events.
    fn start(&mut self, open: Open) -> String {
        let index = self.items.len();
        let item = match &open {
            Open::Reasoning { id, .. } => json!({"type": "reasoning", "id": id, "summary": [], "content": []}),
            Open::Message { id, .. } => {
                json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []})
            }
            Open::Call { id, call_id, name, .. } => json!({"type": "function_call", "id": id, "call_id": call_id,
                "name": name, "arguments": "", "status": "in_progress"}),
        };
        let mut out = self.event("response.output_item.added", json!({"output_index": index, "item": item}));
        if let Open::Message { id, .. } = &open {
            let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            let data = json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
            out += &self.event("response.content_part.added", data);
        }
        self.open = Some(open);
        out
    }

    /// The events of the answer's next pieces.
    fn pieces(&mut self, pieces: Vec<Piece>) -> String {
        let mut out = String::new();
        for p in pieces {
            let index = self.items.len();
            match p {
                Piece::Thinking(t) => {
                    if !matches!(self.open, Some(Open::Reasoning { .. })) {
                        out += &self.close();
                        out += &self.start(Open::Reasoning { id: random_id("rs_", 24), text: String::new() });
                    }
                    if let Some(Open::Reasoning { id, text }) = self.open.as_mut() {
                        text.push_str(&t);
                        let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t});
                        out += &self.event("response.reasoning_text.delta", data);
                    }
                }
                Piece::Text(t) => {
                    if !matches!(self.open, Some(Open::Message { .. })) {
                        out += &self.close();
                        out += &self.start(Open::Message { id: random_id("msg_", 24), text: String::new() });
                    }
                    let logprobs = std::mem::take(&mut self.pending);
                    self.entries.extend(logprobs.iter().cloned());
                    if let Some(Open::Message { id, text }) = self.open.as_mut() {
                        text.push_str(&t);
                        let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t,
                            "logprobs": logprobs});
                        out += &self.event("response.output_text.delta", data);
                    }
                }
                Piece::CallStart { name } => {
                    out += &self.close();
                    let (id, call_id) = (random_id("fc_", 24), random_id("call_", 24));
                    out += &self.start(Open::Call { id, call_id, name, args: String::new() });
                }
                Piece::CallArgs(a) => {
                    if let Some(Open::Call { id, args, .. }) = self.open.as_mut() {
                        args.push_str(&a);
                        let data = json!({"item_id": id, "output_index": self.items.len(), "delta": a});
                        out += &self.event("response.function_call_arguments.delta", data);
                    }
                }
                Piece::CallEnd { .. } => out += &self.close(),
            }
        }
        out
    }

    /// The status a finished answer has.
    fn status(finish: &FinishInfo) -> &'static str {
        if finish.stop_reason == StopReason::MaxTokens { "incomplete" } else { "completed" }
    }
}

/// The Responses API's `usage`.
fn usage(f: &FinishInfo) -> Value {
    json!({
        "input_tokens": f.input_tokens,
        "input_tokens_details": {"cached_tokens": f.cached_input_tokens},
        "output_tokens": f.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": f.input_tokens + f.output_tokens,
    })
}

impl Dialect for Responses {
    const API: &'static str = "responses";
    const ERRORS: ErrorFormat = ErrorFormat::OpenAi;

    fn parse(body: &Value) -> Result<(GenRequest, Self), ApiError> {
        let (chat, echoed) = request::to_chat(body)?;
        let req = crate::openai::parse(&chat).map_err(renamed)?.req;
        let names = req.tools.tools.iter().map(|t| t.name.clone()).collect();
        let writer = Responses::new(echoed, Splitter::new(req.tools.call_parse(), names));
        Ok((req, writer))
    }

    fn prepared(&mut self, prepared: &Prepared) {
        self.think = prepared.thinking.map(crate::thinking::Splitter::new);
        if prepared.logprobs.is_some() {
            self.card = Some(prepared.card.clone());
        }
    }

    fn routed(&mut self, meta: &Meta) {
        self.id = random_id("resp_", 24);
        self.created = unix_now();
        self.model.clone_from(&meta.model);
    }

    fn stream_head(&self) -> String {
        // Written before any other event: numbers 0 and 1 (`HEAD_EVENTS`).
        let response = json!({"response": self.object("in_progress", None)});
        numbered("response.created", response.clone(), 0) + &numbered("response.in_progress", response, 1)
    }

    fn render_event(&mut self, event: &GenEvent) -> String {
        match event {
            GenEvent::Logprobs(l) => {
                self.logprobs(l);
                String::new()
            }
            GenEvent::Delta(d) => {
                let pieces = crate::thinking::pieces(self.think.as_mut(), &mut self.splitter, d);
                self.pieces(pieces)
            }
            GenEvent::Finish(f) => {
                let pieces = crate::thinking::finish(self.think.as_mut(), &mut self.splitter);
                let mut out = self.pieces(pieces);
                out += &self.close();
                crate::tools::count_calls(Self::API, self.splitter.calls);
                let status = Self::status(f);
                let name = if status == "completed" { "response.completed" } else { "response.incomplete" };
                let response = self.object(status, Some(f));
                let last = self.event(name, json!({"response": response.clone()}));
                if self.echoed.store {
                    // Sent once the record is stored (`to_store`, `held_back`).
                    self.finished = Some(response);
                    self.held = last;
                    return out;
                }
                out + &last
            }
        }
    }

    fn render_error(error: &ApiError) -> String {
        // OpenAI's body, under the stream's `error` event.
        let mut data = error.body(ErrorFormat::OpenAi, "")["error"].clone();
        data["type"] = json!("error");
        data["sequence_number"] = json!(0);
        crate::anthropic::event("error", &data)
    }

    fn logprobs(&mut self, logprobs: &crate::events::Logprobs) {
        if let Some(card) = &self.card {
            self.pending.extend(crate::logprobs::chat_content(card, logprobs));
        }
    }

    fn final_body(&mut self, text: &str, finish: &FinishInfo) -> Value {
        let mut pieces = crate::thinking::pieces(self.think.as_mut(), &mut self.splitter, text);
        pieces.extend(crate::thinking::finish(self.think.as_mut(), &mut self.splitter));
        let _events = self.pieces(pieces);
        let _ = self.close();
        crate::tools::count_calls(Self::API, self.splitter.calls);
        let response = self.object(Self::status(finish), Some(finish));
        if self.echoed.store {
            self.finished = Some(response.clone());
        }
        response
    }

    const STORES: bool = true;

    fn to_store(&mut self) -> Option<(String, u64, Value)> {
        let response = self.finished.take()?;
        Some((self.id.clone(), self.created, stored::record(&response, &self.echoed)))
    }

    fn held_back(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}
