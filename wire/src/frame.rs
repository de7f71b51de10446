//! Sans-IO framing: an 8-byte header (kind, flags, payload length) in front of one FlatBuffers table.
//!
//! This module owns byte-level framing only. It never reads a payload's fields (that is `message`'s job, after
//! verification) and never touches a socket: the QUIC shell feeds it bytes and takes frames out.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 8;

/// The largest payload any peer will ever send or accept, whatever its configuration: 16 MiB.
///
/// The largest legitimate frame is a `GenerateRequest` carrying a long prompt as token ids (a 1M-token context is
/// 4 MiB of ids) or as text; anything bigger is refused before its payload is buffered.
pub const HARD_MAX_PAYLOAD: u32 = 16 * 1024 * 1024;

/// Frame kinds: which FlatBuffers table the payload holds. Values are part of the protocol and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum FrameKind {
    /// `Handshake`, first frame of a connection in each direction.
    Handshake = 1,
    /// `RegisterWorker`.
    RegisterWorker = 2,
    /// `DeregisterWorker`.
    DeregisterWorker = 3,
    /// `Ack`.
    Ack = 4,
    /// `LoadReport`.
    LoadReport = 5,
    /// `KvCacheEvents`.
    KvCacheEvents = 6,
    /// `RouteRequest`.
    RouteRequest = 7,
    /// `RouteDecision`.
    RouteDecision = 8,
    /// `GenerateRequest`.
    GenerateRequest = 9,
    /// `TokenChunk`.
    TokenChunk = 10,
    /// `Finish`.
    Finish = 11,
    /// `Error`.
    Error = 12,
    /// `Cancel`.
    Cancel = 13,
    /// `ModelCardRequest`.
    ModelCardRequest = 14,
    /// `ModelCard`.
    ModelCard = 15,
    /// `StateSyncRequest`.
    StateSyncRequest = 16,
    /// `StateSync`.
    StateSync = 17,
    /// `FrontendReport`.
    FrontendReport = 18,
    /// `FrontendGrant`.
    FrontendGrant = 19,
    /// `CertificateRequest`.
    CertificateRequest = 20,
    /// `CertificateIssued`.
    CertificateIssued = 21,
    /// `EmbedRequest` (protocol 1.12).
    EmbedRequest = 22,
    /// `Embeddings` (protocol 1.12).
    Embeddings = 23,
    /// `StoredResponse` (protocol 1.12).
    StoredResponse = 24,
    /// `ResponseLookup` (protocol 1.12).
    ResponseLookup = 25,
    /// `ResponseFound` (protocol 1.12).
    ResponseFound = 26,
}

impl FrameKind {
    /// Every kind, in wire-value order.
    pub const ALL: [FrameKind; 26] = [
        FrameKind::Handshake,
        FrameKind::RegisterWorker,
        FrameKind::DeregisterWorker,
        FrameKind::Ack,
        FrameKind::LoadReport,
        FrameKind::KvCacheEvents,
        FrameKind::RouteRequest,
        FrameKind::RouteDecision,
        FrameKind::GenerateRequest,
        FrameKind::TokenChunk,
        FrameKind::Finish,
        FrameKind::Error,
        FrameKind::Cancel,
        FrameKind::ModelCardRequest,
        FrameKind::ModelCard,
        FrameKind::StateSyncRequest,
        FrameKind::StateSync,
        FrameKind::FrontendReport,
        FrameKind::FrontendGrant,
        FrameKind::CertificateRequest,
        FrameKind::CertificateIssued,
        FrameKind::EmbedRequest,
        FrameKind::Embeddings,
        FrameKind::StoredResponse,
        FrameKind::ResponseLookup,
        FrameKind::ResponseFound,
    ];

    /// The kind with this wire value, if any.
    pub fn from_wire(value: u16) -> Option<FrameKind> {
        value.checked_sub(1).and_then(|i| Self::ALL.get(usize::from(i))).copied()
    }

    /// The wire value.
    pub fn to_wire(self) -> u16 {
        self as u16
    }

    /// A short stable name, used in metrics labels and errors.
    pub fn name(self) -> &'static str {
        match self {
            FrameKind::Handshake => "handshake",
            FrameKind::RegisterWorker => "register_worker",
            FrameKind::DeregisterWorker => "deregister_worker",
            FrameKind::Ack => "ack",
            FrameKind::LoadReport => "load_report",
            FrameKind::KvCacheEvents => "kv_cache_events",
            FrameKind::RouteRequest => "route_request",
            FrameKind::RouteDecision => "route_decision",
            FrameKind::GenerateRequest => "generate_request",
            FrameKind::TokenChunk => "token_chunk",
            FrameKind::Finish => "finish",
            FrameKind::Error => "error",
            FrameKind::Cancel => "cancel",
            FrameKind::ModelCardRequest => "model_card_request",
            FrameKind::ModelCard => "model_card",
            FrameKind::StateSyncRequest => "state_sync_request",
            FrameKind::StateSync => "state_sync",
            FrameKind::FrontendReport => "frontend_report",
            FrameKind::FrontendGrant => "frontend_grant",
            FrameKind::CertificateRequest => "certificate_request",
            FrameKind::CertificateIssued => "certificate_issued",
            FrameKind::EmbedRequest => "embed_request",
            FrameKind::Embeddings => "embeddings",
            FrameKind::StoredResponse => "stored_response",
            FrameKind::ResponseLookup => "response_lookup",
            FrameKind::ResponseFound => "response_found",
        }
    }
}

impl std::fmt::Display for FrameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A framing failure. The stream that produced it is unusable afterwards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The header names a kind this build does not know.
    #[error("unknown frame kind {0}")]
    UnknownKind(u16),
    /// Reserved header flags were set; a newer peer is using a feature this build lacks.
    #[error("reserved frame flags {0:#06x} are set")]
    ReservedFlags(u16),
    /// The payload is larger than the receiver's (or the hard) limit.
    #[error("frame payload of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Declared payload length.
        len: u64,
        /// The limit in force.
        limit: u32,
    },
    /// The payload is empty; every frame carries one table.
    #[error("frame has an empty payload")]
    Empty,
    /// The stream ended in the middle of a frame.
    #[error("stream ended inside a frame ({buffered} of {needed} bytes)")]
    Truncated {
        /// Bytes received of the current frame.
        buffered: usize,
        /// Bytes the frame needs.
        needed: usize,
    },
}

/// A frame whose header checked out; its payload is not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// Which table the payload holds.
    pub kind: FrameKind,
    /// The FlatBuffers bytes.
    pub payload: Bytes,
}

/// Clamp a configured payload limit to `1..=HARD_MAX_PAYLOAD`.
pub fn clamp_limit(limit: u32) -> u32 {
    limit.clamp(1, HARD_MAX_PAYLOAD)
}

/// Write one frame (header + payload) into `out`. Refuses a payload over `limit` so a sender never emits what its
/// peer must refuse.
pub fn encode_frame(kind: FrameKind, payload: &[u8], limit: u32, out: &mut BytesMut) -> Result<(), FrameError> {
    let limit = clamp_limit(limit);
    if payload.is_empty() {
        return Err(FrameError::Empty);
    }
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|len| *len <= limit)
        .ok_or(FrameError::TooLarge { len: payload.len() as u64, limit })?;
    out.reserve(HEADER_LEN + payload.len());
    out.put_u16_le(kind.to_wire());
    out.put_u16_le(0);
    out.put_u32_le(len);
    out.put_slice(payload);
    Ok(())
}

/// Parse and check a header. Errors as soon as the header is known bad, before any payload byte is buffered.
fn parse_header(header: [u8; HEADER_LEN], limit: u32) -> Result<(FrameKind, usize), FrameError> {
    let mut h = &header[..];
    let kind = h.get_u16_le();
    let flags = h.get_u16_le();
    let len = h.get_u32_le();
    let kind = FrameKind::from_wire(kind).ok_or(FrameError::UnknownKind(kind))?;
    if flags != 0 {
        return Err(FrameError::ReservedFlags(flags));
    }
    if len > limit {
        return Err(FrameError::TooLarge { len: u64::from(len), limit });
    }
    if len == 0 {
        return Err(FrameError::Empty);
    }
    Ok((kind, len as usize))
}

/// Incremental frame decoder. Feed it bytes in any chunking; it buffers at most one frame (header + payload up to
/// the limit) and never reads past the end of the current frame.
#[derive(Debug)]
pub struct FrameDecoder {
    limit: u32,
    header: [u8; HEADER_LEN],
    header_len: usize,
    current: Option<(FrameKind, usize)>,
    payload: BytesMut,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder that refuses payloads over `limit` bytes (clamped to `HARD_MAX_PAYLOAD`).
    pub fn new(limit: u32) -> Self {
        FrameDecoder {
            limit: clamp_limit(limit),
            header: [0; HEADER_LEN],
            header_len: 0,
            current: None,
            payload: BytesMut::new(),
            failed: None,
        }
    }

    /// The payload limit in force.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Consume bytes from the front of `input` until one frame is complete (returned) or `input` is empty
    /// (`Ok(None)`). Bytes after a complete frame stay in `input` for the next call. After an error the decoder is
    /// poisoned and returns the same error forever: a framing error leaves the stream position unknown.
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<RawFrame>, FrameError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let result = self.decode_inner(input);
        if let Err(err) = &result {
            self.failed = Some(err.clone());
        }
        result
    }

    fn decode_inner(&mut self, input: &mut &[u8]) -> Result<Option<RawFrame>, FrameError> {
        if self.current.is_none() {
            let take = (HEADER_LEN - self.header_len).min(input.len());
            self.header[self.header_len..self.header_len + take].copy_from_slice(&input[..take]);
            self.header_len += take;
            *input = &input[take..];
            if self.header_len < HEADER_LEN {
                return Ok(None);
            }
            let (kind, len) = parse_header(self.header, self.limit)?;
            self.current = Some((kind, len));
            self.payload = BytesMut::with_capacity(len);
        }
        let Some((kind, len)) = self.current else { return Ok(None) };
        let take = (len - self.payload.len()).min(input.len());
        self.payload.extend_from_slice(&input[..take]);
        *input = &input[take..];
        if self.payload.len() < len {
            return Ok(None);
        }
        self.current = None;
        self.header_len = 0;
        let payload = std::mem::take(&mut self.payload).freeze();
        Ok(Some(RawFrame { kind, payload }))
    }

    /// Call at end of stream: an error if a frame was cut off, `Ok` if the stream ended on a frame boundary.
    pub fn finish(&self) -> Result<(), FrameError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        match self.current {
            Some((_, len)) => {
                Err(FrameError::Truncated { buffered: HEADER_LEN + self.payload.len(), needed: HEADER_LEN + len })
            }
            None if self.header_len > 0 => Err(FrameError::Truncated { buffered: self.header_len, needed: HEADER_LEN }),
            None => Ok(()),
        }
    }

    /// True when no partial frame is buffered.
    pub fn is_idle(&self) -> bool {
        self.current.is_none() && self.header_len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: FrameKind, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        encode_frame(kind, payload, HARD_MAX_PAYLOAD, &mut out).unwrap();
        out.to_vec()
    }

    #[test]
    fn kinds_round_trip_and_unknown_values_are_none() {
        for kind in FrameKind::ALL {
            assert_eq!(FrameKind::from_wire(kind.to_wire()), Some(kind));
        }
        assert_eq!(FrameKind::from_wire(0), None);
        assert_eq!(FrameKind::from_wire(27), None);
        assert_eq!(FrameKind::from_wire(u16::MAX), None);
    }

    #[test]
    fn decodes_frames_split_at_every_byte() {
        let mut bytes = frame(FrameKind::TokenChunk, b"abc");
        bytes.extend(frame(FrameKind::Finish, b"defgh"));
        for split in 0..=bytes.len() {
            let mut dec = FrameDecoder::new(1024);
            let mut frames = Vec::new();
            for part in [&bytes[..split], &bytes[split..]] {
                let mut input = part;
                while let Some(f) = dec.decode(&mut input).unwrap() {
                    frames.push(f);
                }
                assert!(input.is_empty());
            }
            dec.finish().unwrap();
            assert_eq!(frames.len(), 2, "split at {split}");
            assert_eq!(frames[0].kind, FrameKind::TokenChunk);
            assert_eq!(&frames[0].payload[..], b"abc");
            assert_eq!(frames[1].kind, FrameKind::Finish);
            assert_eq!(&frames[1].payload[..], b"defgh");
        }
    }

    #[test]
    fn oversized_frame_is_refused_from_its_header_alone() {
        let mut header = Vec::new();
        header.extend(FrameKind::TokenChunk.to_wire().to_le_bytes());
        header.extend(0u16.to_le_bytes());
        header.extend(1025u32.to_le_bytes());
        let mut dec = FrameDecoder::new(1024);
        let mut input = &header[..];
        assert_eq!(dec.decode(&mut input), Err(FrameError::TooLarge { len: 1025, limit: 1024 }));
        // Poisoned: later input gives the same error.
        let mut more: &[u8] = b"x";
        assert!(matches!(dec.decode(&mut more), Err(FrameError::TooLarge { .. })));
    }

    #[test]
    fn sender_refuses_oversized_and_empty_payloads() {
        let mut out = BytesMut::new();
        assert_eq!(
            encode_frame(FrameKind::Ack, &[0; 11], 10, &mut out),
            Err(FrameError::TooLarge { len: 11, limit: 10 })
        );
        assert_eq!(encode_frame(FrameKind::Ack, &[], 10, &mut out), Err(FrameError::Empty));
        assert!(out.is_empty());
    }

    #[test]
    fn unknown_kind_reserved_flags_and_empty_payload_are_errors() {
        let mut bad = vec![0x63, 0x00, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(FrameDecoder::new(64).decode(&mut &bad[..]), Err(FrameError::UnknownKind(0x63)));
        bad[0] = 1;
        bad[2] = 1;
        assert_eq!(FrameDecoder::new(64).decode(&mut &bad[..]), Err(FrameError::ReservedFlags(1)));
        let empty = [1, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(FrameDecoder::new(64).decode(&mut &empty[..]), Err(FrameError::Empty));
    }

    #[test]
    fn truncated_stream_is_reported_at_finish() {
        let bytes = frame(FrameKind::Ack, b"abcdef");
        let mut dec = FrameDecoder::new(64);
        let mut input = &bytes[..10];
        assert_eq!(dec.decode(&mut input), Ok(None));
        assert_eq!(dec.finish(), Err(FrameError::Truncated { buffered: 10, needed: 14 }));
        let mut dec = FrameDecoder::new(64);
        let mut input = &bytes[..3];
        assert_eq!(dec.decode(&mut input), Ok(None));
        assert_eq!(dec.finish(), Err(FrameError::Truncated { buffered: 3, needed: 8 }));
        assert!(FrameDecoder::new(64).finish().is_ok());
    }

    #[test]
    fn limit_is_clamped_to_the_hard_maximum() {
        assert_eq!(FrameDecoder::new(u32::MAX).limit(), HARD_MAX_PAYLOAD);
        assert_eq!(FrameDecoder::new(0).limit(), 1);
    }
}
