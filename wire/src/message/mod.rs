//! Typed messages: every frame's payload as an owned, checked Rust value.
//!
//! Decoding runs the FlatBuffers verifier over the payload before reading a single field, then converts the table
//! into an owned value and checks every field (ranges, lengths, required values). Encoding runs the same checks so
//! a peer never sends what the other side must refuse. Nothing downstream re-checks wire input.

mod adapters;
pub(crate) mod check;
mod control;
mod embed;
mod enroll;
mod error;
mod generate;
mod ledger;
mod penalties;
mod responses;
mod route;
mod sync;

use bytes::{Bytes, BytesMut};
use flatbuffers::{FlatBufferBuilder, VerifierOptions};

use crate::frame::{self, FrameError, FrameKind, RawFrame};
use crate::generated::zl::wire as fb;

pub use adapters::{AdapterInfo, AdapterRef};
pub use check::{
    MAX_ADAPTERS, MAX_ERROR_MESSAGE_LEN, MAX_EXCLUDED_WORKERS, MAX_GRAMMAR_LEN, MAX_ID_LEN, MAX_MODELS,
    MAX_NODE_ID_LEN, MAX_PATH_LEN, MAX_REASON_LEN, MAX_STOP_SEQUENCE_LEN, MAX_STOP_SEQUENCES, MAX_TEMPERATURE,
};
pub use control::{
    Ack, ComputePool, DeregisterWorker, Handshake, KvCacheEvents, LoadReport, ModelInfo, NodeId, RegisterWorker, Role,
};
pub use embed::{EmbedRequest, Embeddings, MAX_EMBED_DIMS, MAX_EMBED_INPUTS, MAX_EMBED_TOKENS};
pub use enroll::{CertificateIssued, CertificateRequest, MAX_CERT_PEM_LEN, MAX_CSR_LEN};
pub use error::{Cancel, ErrorCode, WireError};
pub use generate::{
    Finish, GenerateRequest, MAX_THINK_CLOSE, MAX_THINK_END, MAX_TOP_LOGPROBS, Prompt, SamplingParams, StopReason,
    ThinkBudget, TokenChunk, Usage,
};
pub use ledger::{
    BudgetAsk, BudgetGrant, FrontendGrant, FrontendReport, MAX_REPORT_ITEMS, RateAsk, RateGrant, UsageDelta,
};
pub use penalties::{MAX_LOGIT_BIAS, Penalties};
pub use responses::{MAX_STORED_RESPONSE, ResponseFound, ResponseLookup, StoredResponse};
pub use route::{RouteDecision, RouteHint, RouteRequest};
pub use sync::{
    ApiKeyEntry, Budget, BudgetMetric, BudgetPeriod, MAX_STOP_TOKEN_IDS, MAX_SYNC_ITEMS, ModelCard, ModelCardRequest,
    ProjectQuota, StateSync, StateSyncRequest,
};

/// A payload that is not a valid message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MessageError {
    /// The bytes are not a well-formed FlatBuffers table of the kind the header names.
    #[error("payload failed FlatBuffers verification: {0}")]
    Verify(#[from] flatbuffers::InvalidFlatbuffer),
    /// A field is missing, out of range or malformed.
    #[error("invalid {field}: {problem}")]
    Invalid {
        /// `Table.field`.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

/// Any wire message.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // Each variant is the message of the same name.
pub enum Message {
    Handshake(Handshake),
    RegisterWorker(RegisterWorker),
    DeregisterWorker(DeregisterWorker),
    Ack(Ack),
    LoadReport(LoadReport),
    KvCacheEvents(KvCacheEvents),
    RouteRequest(RouteRequest),
    RouteDecision(RouteDecision),
    GenerateRequest(GenerateRequest),
    TokenChunk(TokenChunk),
    Finish(Finish),
    Error(WireError),
    Cancel(Cancel),
    ModelCardRequest(ModelCardRequest),
    ModelCard(ModelCard),
    StateSyncRequest(StateSyncRequest),
    StateSync(StateSync),
    FrontendReport(FrontendReport),
    FrontendGrant(FrontendGrant),
    CertificateRequest(CertificateRequest),
    CertificateIssued(CertificateIssued),
    EmbedRequest(EmbedRequest),
    Embeddings(Embeddings),
    StoredResponse(StoredResponse),
    ResponseLookup(ResponseLookup),
    ResponseFound(ResponseFound),
}

impl Message {
    /// The frame kind that carries this message.
    pub fn kind(&self) -> FrameKind {
        match self {
            Message::Handshake(_) => FrameKind::Handshake,
            Message::RegisterWorker(_) => FrameKind::RegisterWorker,
            Message::DeregisterWorker(_) => FrameKind::DeregisterWorker,
            Message::Ack(_) => FrameKind::Ack,
            Message::LoadReport(_) => FrameKind::LoadReport,
            Message::KvCacheEvents(_) => FrameKind::KvCacheEvents,
            Message::RouteRequest(_) => FrameKind::RouteRequest,
            Message::RouteDecision(_) => FrameKind::RouteDecision,
            Message::GenerateRequest(_) => FrameKind::GenerateRequest,
            Message::TokenChunk(_) => FrameKind::TokenChunk,
            Message::Finish(_) => FrameKind::Finish,
            Message::Error(_) => FrameKind::Error,
            Message::Cancel(_) => FrameKind::Cancel,
            Message::ModelCardRequest(_) => FrameKind::ModelCardRequest,
            Message::ModelCard(_) => FrameKind::ModelCard,
            Message::StateSyncRequest(_) => FrameKind::StateSyncRequest,
            Message::StateSync(_) => FrameKind::StateSync,
            Message::FrontendReport(_) => FrameKind::FrontendReport,
            Message::FrontendGrant(_) => FrameKind::FrontendGrant,
            Message::CertificateRequest(_) => FrameKind::CertificateRequest,
            Message::CertificateIssued(_) => FrameKind::CertificateIssued,
            Message::EmbedRequest(_) => FrameKind::EmbedRequest,
            Message::Embeddings(_) => FrameKind::Embeddings,
            Message::StoredResponse(_) => FrameKind::StoredResponse,
            Message::ResponseLookup(_) => FrameKind::ResponseLookup,
            Message::ResponseFound(_) => FrameKind::ResponseFound,
        }
    }

    /// Run the same field checks a receiver runs.
    pub fn check(&self) -> Result<(), MessageError> {
        match self {
            Message::Handshake(m) => m.check(),
            Message::RegisterWorker(m) => m.check(),
            Message::DeregisterWorker(m) => m.check(),
            Message::Ack(_) => Ok(()),
            Message::LoadReport(m) => m.check(),
            Message::KvCacheEvents(m) => m.check(),
            Message::RouteRequest(m) => m.check(),
            Message::RouteDecision(m) => m.check(),
            Message::GenerateRequest(m) => m.check(),
            Message::TokenChunk(m) => m.check(),
            Message::Finish(m) => m.check(),
            Message::Error(m) => m.check(),
            Message::Cancel(m) => m.check(),
            Message::ModelCardRequest(m) => m.check(),
            Message::ModelCard(m) => m.check(),
            Message::StateSyncRequest(_) => Ok(()),
            Message::StateSync(m) => m.check(),
            Message::FrontendReport(m) => m.check(),
            Message::FrontendGrant(m) => m.check(),
            Message::CertificateRequest(m) => m.check(),
            Message::CertificateIssued(m) => m.check(),
            Message::EmbedRequest(m) => m.check(),
            Message::Embeddings(m) => m.check(),
            Message::StoredResponse(m) => m.check(),
            Message::ResponseLookup(m) => m.check(),
            Message::ResponseFound(m) => m.check(),
        }
    }

    /// Verify and decode a frame's payload. Never panics, whatever the bytes.
    pub fn decode(frame: &RawFrame) -> Result<Message, MessageError> {
        let opts = verifier_options(frame.payload.len());
        let buf = &frame.payload[..];
        Ok(match frame.kind {
            FrameKind::Handshake => Message::Handshake(Handshake::read(root::<fb::Handshake<'_>>(&opts, buf)?)?),
            FrameKind::RegisterWorker => {
                Message::RegisterWorker(RegisterWorker::read(root::<fb::RegisterWorker<'_>>(&opts, buf)?)?)
            }
            FrameKind::DeregisterWorker => {
                Message::DeregisterWorker(DeregisterWorker::read(root::<fb::DeregisterWorker<'_>>(&opts, buf)?)?)
            }
            FrameKind::Ack => Message::Ack(Ack::read(root::<fb::Ack<'_>>(&opts, buf)?)?),
            FrameKind::LoadReport => Message::LoadReport(LoadReport::read(root::<fb::LoadReport<'_>>(&opts, buf)?)?),
            FrameKind::KvCacheEvents => {
                Message::KvCacheEvents(KvCacheEvents::read(root::<fb::KvCacheEvents<'_>>(&opts, buf)?)?)
            }
            FrameKind::RouteRequest => {
                Message::RouteRequest(RouteRequest::read(root::<fb::RouteRequest<'_>>(&opts, buf)?)?)
            }
            FrameKind::RouteDecision => {
                Message::RouteDecision(RouteDecision::read(root::<fb::RouteDecision<'_>>(&opts, buf)?)?)
            }
            FrameKind::GenerateRequest => {
                Message::GenerateRequest(GenerateRequest::read(root::<fb::GenerateRequest<'_>>(&opts, buf)?)?)
            }
            FrameKind::TokenChunk => Message::TokenChunk(TokenChunk::read(root::<fb::TokenChunk<'_>>(&opts, buf)?)?),
            FrameKind::Finish => Message::Finish(Finish::read(root::<fb::Finish<'_>>(&opts, buf)?)?),
            FrameKind::Error => Message::Error(WireError::read(root::<fb::Error<'_>>(&opts, buf)?)?),
            FrameKind::Cancel => Message::Cancel(Cancel::read(root::<fb::Cancel<'_>>(&opts, buf)?)?),
            FrameKind::ModelCardRequest => {
                Message::ModelCardRequest(ModelCardRequest::read(root::<fb::ModelCardRequest<'_>>(&opts, buf)?)?)
            }
            FrameKind::ModelCard => Message::ModelCard(ModelCard::read(root::<fb::ModelCard<'_>>(&opts, buf)?)?),
            FrameKind::StateSyncRequest => {
                Message::StateSyncRequest(StateSyncRequest::read(root::<fb::StateSyncRequest<'_>>(&opts, buf)?)?)
            }
            FrameKind::StateSync => Message::StateSync(StateSync::read(root::<fb::StateSync<'_>>(&opts, buf)?)?),
            FrameKind::FrontendReport => {
                Message::FrontendReport(FrontendReport::read(root::<fb::FrontendReport<'_>>(&opts, buf)?)?)
            }
            FrameKind::FrontendGrant => {
                Message::FrontendGrant(FrontendGrant::read(root::<fb::FrontendGrant<'_>>(&opts, buf)?)?)
            }
            FrameKind::CertificateRequest => {
                Message::CertificateRequest(CertificateRequest::read(root::<fb::CertificateRequest<'_>>(&opts, buf)?)?)
            }
            FrameKind::CertificateIssued => {
                Message::CertificateIssued(CertificateIssued::read(root::<fb::CertificateIssued<'_>>(&opts, buf)?)?)
            }
            FrameKind::EmbedRequest => {
                Message::EmbedRequest(EmbedRequest::read(root::<fb::EmbedRequest<'_>>(&opts, buf)?)?)
            }
            FrameKind::Embeddings => Message::Embeddings(Embeddings::read(root::<fb::Embeddings<'_>>(&opts, buf)?)?),
            FrameKind::StoredResponse => {
                Message::StoredResponse(StoredResponse::read(root::<fb::StoredResponse<'_>>(&opts, buf)?)?)
            }
            FrameKind::ResponseLookup => {
                Message::ResponseLookup(ResponseLookup::read(root::<fb::ResponseLookup<'_>>(&opts, buf)?)?)
            }
            FrameKind::ResponseFound => {
                Message::ResponseFound(ResponseFound::read(root::<fb::ResponseFound<'_>>(&opts, buf)?)?)
            }
        })
    }

    fn write(&self, fbb: &mut FlatBufferBuilder<'_>) {
        let root = match self {
            Message::Handshake(m) => m.write(fbb).as_union_value(),
            Message::RegisterWorker(m) => m.write(fbb).as_union_value(),
            Message::DeregisterWorker(m) => m.write(fbb).as_union_value(),
            Message::Ack(m) => m.write(fbb).as_union_value(),
            Message::LoadReport(m) => m.write(fbb).as_union_value(),
            Message::KvCacheEvents(m) => m.write(fbb).as_union_value(),
            Message::RouteRequest(m) => m.write(fbb).as_union_value(),
            Message::RouteDecision(m) => m.write(fbb).as_union_value(),
            Message::GenerateRequest(m) => m.write(fbb).as_union_value(),
            Message::TokenChunk(m) => m.write(fbb).as_union_value(),
            Message::Finish(m) => m.write(fbb).as_union_value(),
            Message::Error(m) => m.write(fbb).as_union_value(),
            Message::Cancel(m) => m.write(fbb).as_union_value(),
            Message::ModelCardRequest(m) => m.write(fbb).as_union_value(),
            Message::ModelCard(m) => m.write(fbb).as_union_value(),
            Message::StateSyncRequest(m) => m.write(fbb).as_union_value(),
            Message::StateSync(m) => m.write(fbb).as_union_value(),
            Message::FrontendReport(m) => m.write(fbb).as_union_value(),
            Message::FrontendGrant(m) => m.write(fbb).as_union_value(),
            Message::CertificateRequest(m) => m.write(fbb).as_union_value(),
            Message::CertificateIssued(m) => m.write(fbb).as_union_value(),
            Message::EmbedRequest(m) => m.write(fbb).as_union_value(),
            Message::Embeddings(m) => m.write(fbb).as_union_value(),
            Message::StoredResponse(m) => m.write(fbb).as_union_value(),
            Message::ResponseLookup(m) => m.write(fbb).as_union_value(),
            Message::ResponseFound(m) => m.write(fbb).as_union_value(),
        };
        fbb.finish_minimal(root);
    }
}

fn root<'buf, T>(opts: &VerifierOptions, buf: &'buf [u8]) -> Result<T::Inner, MessageError>
where
    T: 'buf + flatbuffers::Follow<'buf> + flatbuffers::Verifiable,
{
    Ok(flatbuffers::root_with_opts::<T>(opts, buf)?)
}

/// Verifier bounds scaled to the payload: no table nesting deeper than the schema's (3 levels), and no more
/// tables or apparent size than a payload of this length can honestly hold.
fn verifier_options(payload_len: usize) -> VerifierOptions {
    VerifierOptions {
        max_depth: 8,
        max_tables: payload_len / 4 + 8,
        max_apparent_size: payload_len.saturating_mul(2).max(1024),
        ignore_missing_null_terminator: false,
    }
}

/// Failure to turn a message into a frame.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EncodeError {
    /// The message fails the receiver's checks.
    #[error(transparent)]
    Message(#[from] MessageError),
    /// The encoded message is over the frame limit.
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Encodes messages into frames, reusing one FlatBuffers builder.
pub struct Encoder {
    fbb: FlatBufferBuilder<'static>,
    limit: u32,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").field("limit", &self.limit).finish_non_exhaustive()
    }
}

impl Encoder {
    /// An encoder that refuses payloads over `limit` bytes (clamped to the hard maximum).
    pub fn new(limit: u32) -> Self {
        Encoder { fbb: FlatBufferBuilder::with_capacity(1024), limit: frame::clamp_limit(limit) }
    }

    /// Check `msg` and append its frame (header + payload) to `out`.
    pub fn encode_into(&mut self, msg: &Message, out: &mut BytesMut) -> Result<(), EncodeError> {
        msg.check()?;
        self.fbb.reset();
        msg.write(&mut self.fbb);
        let result = frame::encode_frame(msg.kind(), self.fbb.finished_data(), self.limit, out);
        // Do not keep a huge buffer alive after one big message.
        if self.fbb.unfinished_data().len() > 1 << 20 {
            self.fbb = FlatBufferBuilder::with_capacity(1024);
        }
        Ok(result?)
    }

    /// Check `msg` and return its frame.
    pub fn encode(&mut self, msg: &Message) -> Result<Bytes, EncodeError> {
        let mut out = BytesMut::new();
        self.encode_into(msg, &mut out)?;
        Ok(out.freeze())
    }
}

#[cfg(test)]
pub(crate) mod tests;
