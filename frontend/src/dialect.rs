//! What differs between the two generation APIs, as one small trait. The HTTP handler is written once over it
//! (`http/generate.rs`: authentication, admission, routing, streaming, metrics and headers); each API's module
//! implements it with its own request rules and response shapes (`anthropic.rs`, `openai.rs`).

use serde_json::Value;

use crate::cache::FinishInfo;
use crate::error::{ApiError, ErrorFormat};
use crate::events::Logprobs;
use crate::gateway::{GenEvent, GenRequest, Meta, Prepared};

/// One generation API. A value is one response being written: it holds the API-only options its request
/// carried and, once the request is routed, the ids and names its answer repeats.
pub trait Dialect: Sized + Send + 'static {
    /// The `api` label of the request metrics.
    const API: &'static str;
    /// How this API writes error bodies.
    const ERRORS: ErrorFormat;

    /// Parse a request body: the API-independent request, and this response's writer.
    fn parse(body: &Value) -> Result<(GenRequest, Self), ApiError>;

    /// The request was rendered and checked against its model: note what the answer needs of it.
    fn prepared(&mut self, _prepared: &Prepared) {}

    /// The request is routed (or answered from the cache): note the concrete model and token counts.
    fn routed(&mut self, meta: &Meta);

    /// The bytes a stream begins with, before the first text.
    fn stream_head(&self) -> String;

    /// One event of a stream as server-sent events.
    fn render_event(&mut self, event: &GenEvent) -> String;

    /// An error after a stream began, as this API sends it then.
    fn render_error(error: &ApiError) -> String;

    /// Log-probabilities of a request that did not stream, in order, before its [`Dialect::final_body`].
    fn logprobs(&mut self, _logprobs: &Logprobs) {}

    /// The whole answer of a request that did not stream.
    fn final_body(&mut self, text: &str, finish: &FinishInfo) -> Value;

    /// Whether this API stores answers (the Responses API): its bodies go through
    /// `responses::stored::expand` before [`Dialect::parse`], and [`Dialect::to_store`] is asked once the answer is
    /// complete.
    const STORES: bool = false;

    /// The record to store now that the answer is complete, before its last event (or its body) is sent: the
    /// response's id, when it was made and the record. `None`: nothing to store.
    fn to_store(&mut self) -> Option<(String, u64, Value)> {
        None
    }

    /// The stream's last event, held back by [`Dialect::render_event`] until the record is stored.
    fn held_back(&mut self) -> String {
        String::new()
    }

    /// Parse a request body that may ask for several choices (OpenAI's `n`, several prompts in one completions
    /// request): each prompt's request, in order, with a writer for each answer it gets (as many for every
    /// prompt). An API without either has one prompt and one answer.
    fn parse_choices(body: &Value) -> Result<Vec<(GenRequest, Vec<Self>)>, ApiError> {
        Self::parse(body).map(|(req, writer)| vec![(req, vec![writer])])
    }

    /// This writer writes choice `index` of a response with several, under the id and time of `first` (choice 0's
    /// writer, routed; `None` for choice 0 itself): its stream's end (usage, `[DONE]`) is left to
    /// [`Dialect::trailer`].
    fn as_choice(&mut self, _index: u32, _first: Option<&Self>) {}

    /// The end of a stream with several choices, their usage totalled.
    fn trailer(&self, _total: &FinishInfo) -> String {
        String::new()
    }

    /// The body of a complete answer with several choices, from each choice's [`Dialect::final_body`] in index
    /// order, their usage totalled.
    fn merge(bodies: Vec<Value>, _total: &FinishInfo) -> Value {
        bodies.into_iter().next().unwrap_or(Value::Null)
    }
}
