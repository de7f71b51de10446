//! Embedding messages (protocol 1.12): the inputs a frontend sends a worker serving an embedding model, and the
//! vectors that come back in input order (then a `Finish` whose usage counts the inputs' tokens).

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::check::{self, invalid};
use super::{MessageError, fb};

/// Most inputs one request embeds (OpenAI's limit).
pub const MAX_EMBED_INPUTS: usize = 2048;

/// Most tokens one request embeds, all inputs together.
pub const MAX_EMBED_TOKENS: usize = 1 << 20;

/// The widest vector a frame may carry.
pub const MAX_EMBED_DIMS: u32 = 65_536;

/// Embed token sequences with an embedding model.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedRequest {
    /// Request id, for logs and traces.
    pub request_id: String,
    /// W3C traceparent of the caller's span (empty: none).
    pub trace_id: String,
    /// Concrete model id.
    pub model: String,
    /// The inputs' token ids, each tokenized as the model's card says.
    pub inputs: Vec<Vec<u32>>,
}

impl EmbedRequest {
    /// Tokens over all inputs.
    pub fn tokens(&self) -> usize {
        self.inputs.iter().map(Vec::len).sum()
    }

    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::id("EmbedRequest.request_id", &self.request_id)?;
        check::text("EmbedRequest.trace_id", &self.trace_id, 0, check::MAX_ID_LEN)?;
        check::id("EmbedRequest.model", &self.model)?;
        if self.inputs.is_empty() {
            return Err(invalid("EmbedRequest.inputs", "must hold at least one input"));
        }
        check::count("EmbedRequest.inputs", self.inputs.len(), MAX_EMBED_INPUTS)?;
        if let Some(i) = self.inputs.iter().position(Vec::is_empty) {
            return Err(invalid("EmbedRequest.inputs", format!("input {i} has no tokens")));
        }
        check::count("EmbedRequest.inputs (tokens)", self.tokens(), MAX_EMBED_TOKENS)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::EmbedRequest<'b>> {
        let request_id = fbb.create_string(&self.request_id);
        let trace_id = fbb.create_string(&self.trace_id);
        let model = fbb.create_string(&self.model);
        let lists: Vec<_> = self
            .inputs
            .iter()
            .map(|ids| {
                let ids = fbb.create_vector(ids);
                fb::TokenList::create(fbb, &fb::TokenListArgs { ids: Some(ids) })
            })
            .collect();
        let inputs = fbb.create_vector(&lists);
        fb::EmbedRequest::create(
            fbb,
            &fb::EmbedRequestArgs {
                request_id: Some(request_id),
                trace_id: Some(trace_id),
                model: Some(model),
                inputs: Some(inputs),
            },
        )
    }

    pub(crate) fn read(t: fb::EmbedRequest<'_>) -> Result<Self, MessageError> {
        let lists = t.inputs();
        // Bounded before anything is copied: the count, then the running total of tokens.
        check::count("EmbedRequest.inputs", lists.len(), MAX_EMBED_INPUTS)?;
        let mut total = 0usize;
        let mut inputs = Vec::with_capacity(lists.len());
        for list in lists.iter() {
            let ids = list.ids();
            total += ids.len();
            check::count("EmbedRequest.inputs (tokens)", total, MAX_EMBED_TOKENS)?;
            inputs.push(ids.iter().collect());
        }
        let msg = EmbedRequest {
            request_id: t.request_id().to_owned(),
            trace_id: t.trace_id().unwrap_or_default().to_owned(),
            model: t.model().to_owned(),
            inputs,
        };
        msg.check()?;
        Ok(msg)
    }
}

/// The vectors of consecutive inputs, each L2-normalised.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    /// Index of the first input these are for.
    pub start: u32,
    /// Width of each vector.
    pub dims: u32,
    /// The vectors one after another.
    pub values: Vec<f32>,
}

impl Embeddings {
    /// How many vectors the frame holds.
    pub fn count(&self) -> usize {
        self.values.len() / self.dims.max(1) as usize
    }

    pub(crate) fn check(&self) -> Result<(), MessageError> {
        if self.dims == 0 || self.dims > MAX_EMBED_DIMS {
            return Err(invalid("Embeddings.dims", format!("{} is outside 1 to {MAX_EMBED_DIMS}", self.dims)));
        }
        if self.values.is_empty() || !self.values.len().is_multiple_of(self.dims as usize) {
            return Err(invalid(
                "Embeddings.values",
                format!("{} values are not a whole number of {}-wide vectors", self.values.len(), self.dims),
            ));
        }
        if self.start as usize + self.count() > MAX_EMBED_INPUTS {
            return Err(invalid("Embeddings.start", format!("vectors past input {MAX_EMBED_INPUTS}")));
        }
        if let Some(v) = self.values.iter().find(|v| !v.is_finite()) {
            return Err(invalid("Embeddings.values", format!("{v} is not a finite number")));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::Embeddings<'b>> {
        let values = fbb.create_vector(&self.values);
        fb::Embeddings::create(fbb, &fb::EmbeddingsArgs { start: self.start, dims: self.dims, values: Some(values) })
    }

    pub(crate) fn read(t: fb::Embeddings<'_>) -> Result<Self, MessageError> {
        let msg = Embeddings { start: t.start(), dims: t.dims(), values: t.values().iter().collect() };
        msg.check()?;
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Encoder;
    use crate::message::Message;
    use crate::message::tests::decode_one;

    fn round_trip(m: Message) -> Result<Message, String> {
        decode_one(&Encoder::new(u32::MAX).encode(&m).map_err(|e| e.to_string())?)
    }

    fn request(inputs: Vec<Vec<u32>>) -> EmbedRequest {
        EmbedRequest { request_id: "req_1".into(), trace_id: String::new(), model: "m".into(), inputs }
    }

    #[test]
    fn requests_and_vectors_round_trip() {
        let r = Message::EmbedRequest(request(vec![vec![1, 2, 3], vec![7]]));
        assert_eq!(round_trip(r.clone()).unwrap(), r);
        let e = Message::Embeddings(Embeddings { start: 2, dims: 2, values: vec![0.6, 0.8, 1.0, 0.0] });
        assert_eq!(round_trip(e.clone()).unwrap(), e);
    }

    #[test]
    fn empty_oversized_and_malformed_ones_are_refused() {
        assert!(request(vec![]).check().is_err());
        assert!(request(vec![vec![1], vec![]]).check().unwrap_err().to_string().contains("input 1 has no tokens"));
        assert!(request(vec![vec![1]; MAX_EMBED_INPUTS + 1]).check().is_err());
        assert!(request(vec![vec![1; MAX_EMBED_TOKENS / 2 + 1]; 2]).check().is_err());
        let ok = Embeddings { start: 0, dims: 3, values: vec![0.0; 6] };
        assert!(ok.check().is_ok());
        assert!(Embeddings { values: vec![0.0; 5], ..ok.clone() }.check().is_err());
        assert!(Embeddings { dims: 0, ..ok.clone() }.check().is_err());
        assert!(Embeddings { values: vec![f32::NAN, 0.0, 0.0], ..ok.clone() }.check().is_err());
        assert!(Embeddings { values: vec![], ..ok.clone() }.check().is_err());
        assert!(Embeddings { start: MAX_EMBED_INPUTS as u32, ..ok }.check().is_err());
    }
}
