//! Sans-IO life cycle of one call (one QUIC bidirectional stream): which frames may follow which.
//!
//! Both ends run the same machine: the client checks the frames it receives, the server checks the frames its
//! handler sends. It knows nothing of sockets, tasks or clocks; the QUIC shell feeds it events.
//!
//! ```text
//!            request            item (streaming only)
//!   (none) ──────────► Open ───────────────────────► Streaming ──┐ item
//!                        │                               │  ◄────┘
//!                        │ reply / terminal / Error      │ terminal / Error
//!                        ▼                               ▼
//!                 Finished or Failed ◄───────────────────┘
//!   Open/Streaming ── cancel, Cancel frame, stream reset ──► Cancelled
//!   Open/Streaming ── stream ended early, wrong frame ─────► Failed
//! ```

use crate::frame::FrameKind;

/// What a request kind's responses look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallShape {
    /// Exactly one reply frame (or an `Error`).
    Unary {
        /// The reply's kind.
        reply: FrameKind,
    },
    /// Any number of item frames, then one terminal frame (or an `Error` at any point).
    ServerStreaming {
        /// Kind of the intermediate frames.
        item: FrameKind,
        /// Kind of the successful last frame.
        terminal: FrameKind,
    },
}

impl CallShape {
    /// The shape of calls opened by `request`, or `None` if that kind cannot open a call.
    pub fn of(request: FrameKind) -> Option<CallShape> {
        use FrameKind as K;
        match request {
            K::Handshake => Some(CallShape::Unary { reply: K::Handshake }),
            K::RegisterWorker | K::DeregisterWorker | K::LoadReport | K::KvCacheEvents => {
                Some(CallShape::Unary { reply: K::Ack })
            }
            K::RouteRequest => Some(CallShape::Unary { reply: K::RouteDecision }),
            K::ModelCardRequest => Some(CallShape::Unary { reply: K::ModelCard }),
            K::StateSyncRequest => Some(CallShape::Unary { reply: K::StateSync }),
            K::FrontendReport => Some(CallShape::Unary { reply: K::FrontendGrant }),
            K::CertificateRequest => Some(CallShape::Unary { reply: K::CertificateIssued }),
            K::StoredResponse => Some(CallShape::Unary { reply: K::Ack }),
            K::ResponseLookup => Some(CallShape::Unary { reply: K::ResponseFound }),
            K::GenerateRequest => Some(CallShape::ServerStreaming { item: K::TokenChunk, terminal: K::Finish }),
            K::EmbedRequest => Some(CallShape::ServerStreaming { item: K::Embeddings, terminal: K::Finish }),
            K::Ack
            | K::RouteDecision
            | K::TokenChunk
            | K::Finish
            | K::Error
            | K::Cancel
            | K::ModelCard
            | K::StateSync
            | K::FrontendGrant
            | K::CertificateIssued
            | K::Embeddings
            | K::ResponseFound => None,
        }
    }
}

/// Where a call is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallPhase {
    /// The request was sent; no response yet.
    Open,
    /// At least one item arrived; more may follow.
    Streaming,
    /// The successful terminal frame arrived.
    Finished,
    /// Either side cancelled, or the stream was reset.
    Cancelled,
    /// An `Error` frame arrived or the protocol was broken.
    Failed,
}

/// A frame the protocol does not allow at this point. The call is `Failed` afterwards.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallViolation {
    /// A frame kind that cannot open a call was sent as a request.
    #[error("a {0} frame cannot open a call")]
    NotARequest(FrameKind),
    /// A response frame of the wrong kind, or after the call ended.
    #[error("unexpected {got} frame while the call is {phase:?}")]
    Unexpected {
        /// The offending frame.
        got: FrameKind,
        /// The phase it arrived in.
        phase: CallPhase,
    },
    /// The response stream ended before a terminal frame.
    #[error("the response stream ended before the call finished ({frames} frames received)")]
    EndedEarly {
        /// Response frames seen.
        frames: u64,
    },
}

/// What a response frame means for the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// An intermediate item; more will follow.
    Item,
    /// The successful last frame.
    Last,
    /// An `Error` frame; the call failed.
    Error,
}

/// The state of one call.
#[derive(Clone, Debug)]
pub struct CallState {
    request: FrameKind,
    shape: CallShape,
    phase: CallPhase,
    frames: u64,
}

impl CallState {
    /// Start a call with a request of this kind.
    pub fn open(request: FrameKind) -> Result<CallState, CallViolation> {
        let shape = CallShape::of(request).ok_or(CallViolation::NotARequest(request))?;
        Ok(CallState { request, shape, phase: CallPhase::Open, frames: 0 })
    }

    /// The request kind that opened the call.
    pub fn request(&self) -> FrameKind {
        self.request
    }

    /// The call's shape.
    pub fn shape(&self) -> CallShape {
        self.shape
    }

    /// The current phase.
    pub fn phase(&self) -> CallPhase {
        self.phase
    }

    /// Response frames seen so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// True once the call can change no more.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, CallPhase::Finished | CallPhase::Cancelled | CallPhase::Failed)
    }

    fn violate(&mut self, err: CallViolation) -> CallViolation {
        self.phase = CallPhase::Failed;
        err
    }

    /// A response frame (server to client).
    pub fn on_response(&mut self, kind: FrameKind) -> Result<Delivery, CallViolation> {
        if self.is_done() {
            let phase = self.phase;
            return Err(self.violate(CallViolation::Unexpected { got: kind, phase }));
        }
        self.frames += 1;
        if kind == FrameKind::Error {
            self.phase = CallPhase::Failed;
            return Ok(Delivery::Error);
        }
        match self.shape {
            CallShape::Unary { reply } if kind == reply => {
                self.phase = CallPhase::Finished;
                Ok(Delivery::Last)
            }
            CallShape::ServerStreaming { item, .. } if kind == item => {
                self.phase = CallPhase::Streaming;
                Ok(Delivery::Item)
            }
            CallShape::ServerStreaming { terminal, .. } if kind == terminal => {
                self.phase = CallPhase::Finished;
                Ok(Delivery::Last)
            }
            _ => {
                let phase = self.phase;
                Err(self.violate(CallViolation::Unexpected { got: kind, phase }))
            }
        }
    }

    /// A frame on the request side after the request (client to server). Only `Cancel` is allowed, and it
    /// cancels the call; once the call is done it is ignored (the server may already have answered).
    pub fn on_request_side(&mut self, kind: FrameKind) -> Result<(), CallViolation> {
        match kind {
            FrameKind::Cancel => {
                self.cancel();
                Ok(())
            }
            other => {
                let phase = self.phase;
                Err(self.violate(CallViolation::Unexpected { got: other, phase }))
            }
        }
    }

    /// The response stream ended (FIN). Fine after a terminal frame; a violation before one.
    pub fn on_end_of_responses(&mut self) -> Result<(), CallViolation> {
        match self.phase {
            CallPhase::Finished | CallPhase::Failed | CallPhase::Cancelled => Ok(()),
            CallPhase::Open | CallPhase::Streaming => {
                let frames = self.frames;
                Err(self.violate(CallViolation::EndedEarly { frames }))
            }
        }
    }

    /// Cancel (locally, by a `Cancel` frame, or by a stream reset). Returns true if the call was still running.
    pub fn cancel(&mut self) -> bool {
        if self.is_done() {
            return false;
        }
        self.phase = CallPhase::Cancelled;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FrameKind as K;

    #[test]
    fn unary_call_finishes_on_its_reply() {
        let mut call = CallState::open(K::RouteRequest).unwrap();
        assert_eq!(call.on_response(K::RouteDecision), Ok(Delivery::Last));
        assert_eq!(call.phase(), CallPhase::Finished);
        assert_eq!(call.on_end_of_responses(), Ok(()));
        assert!(matches!(call.on_response(K::RouteDecision), Err(CallViolation::Unexpected { .. })));
        assert_eq!(call.phase(), CallPhase::Failed);
    }

    #[test]
    fn unary_call_refuses_a_wrong_reply_kind() {
        let mut call = CallState::open(K::RegisterWorker).unwrap();
        assert_eq!(
            call.on_response(K::RouteDecision),
            Err(CallViolation::Unexpected { got: K::RouteDecision, phase: CallPhase::Open })
        );
        assert_eq!(call.phase(), CallPhase::Failed);
    }

    #[test]
    fn streaming_call_takes_items_then_one_terminal() {
        let mut call = CallState::open(K::GenerateRequest).unwrap();
        for _ in 0..3 {
            assert_eq!(call.on_response(K::TokenChunk), Ok(Delivery::Item));
            assert_eq!(call.phase(), CallPhase::Streaming);
        }
        assert_eq!(call.on_response(K::Finish), Ok(Delivery::Last));
        assert_eq!(call.frames(), 4);
        assert!(call.is_done());
        assert!(call.on_response(K::TokenChunk).is_err());
    }

    #[test]
    fn error_frame_fails_the_call_at_any_point() {
        let mut call = CallState::open(K::GenerateRequest).unwrap();
        assert_eq!(call.on_response(K::Error), Ok(Delivery::Error));
        assert_eq!(call.phase(), CallPhase::Failed);
        let mut call = CallState::open(K::GenerateRequest).unwrap();
        call.on_response(K::TokenChunk).unwrap();
        assert_eq!(call.on_response(K::Error), Ok(Delivery::Error));
    }

    #[test]
    fn stream_ending_before_the_terminal_frame_is_a_violation() {
        let mut call = CallState::open(K::GenerateRequest).unwrap();
        call.on_response(K::TokenChunk).unwrap();
        assert_eq!(call.on_end_of_responses(), Err(CallViolation::EndedEarly { frames: 1 }));
        assert_eq!(call.phase(), CallPhase::Failed);
        let mut call = CallState::open(K::LoadReport).unwrap();
        assert_eq!(call.on_end_of_responses(), Err(CallViolation::EndedEarly { frames: 0 }));
    }

    #[test]
    fn cancel_stops_a_running_call_but_not_a_finished_one() {
        let mut call = CallState::open(K::GenerateRequest).unwrap();
        call.on_response(K::TokenChunk).unwrap();
        assert!(call.cancel());
        assert_eq!(call.phase(), CallPhase::Cancelled);
        assert!(!call.cancel());
        assert!(call.on_response(K::TokenChunk).is_err());

        let mut call = CallState::open(K::RouteRequest).unwrap();
        call.on_response(K::RouteDecision).unwrap();
        assert!(!call.cancel());
        assert_eq!(call.phase(), CallPhase::Finished);
    }

    #[test]
    fn request_side_allows_only_cancel() {
        let mut call = CallState::open(K::GenerateRequest).unwrap();
        assert_eq!(call.on_request_side(K::Cancel), Ok(()));
        assert_eq!(call.phase(), CallPhase::Cancelled);
        let mut call = CallState::open(K::GenerateRequest).unwrap();
        assert!(call.on_request_side(K::GenerateRequest).is_err());
        assert_eq!(call.phase(), CallPhase::Failed);
    }

    #[test]
    fn only_request_kinds_open_calls() {
        for kind in K::ALL {
            let opens = CallState::open(kind).is_ok();
            let expected = !matches!(
                kind,
                K::Ack
                    | K::RouteDecision
                    | K::TokenChunk
                    | K::Finish
                    | K::Error
                    | K::Cancel
                    | K::ModelCard
                    | K::StateSync
                    | K::FrontendGrant
                    | K::CertificateIssued
                    | K::Embeddings
                    | K::ResponseFound
            );
            assert_eq!(opens, expected, "{kind}");
        }
    }
}
