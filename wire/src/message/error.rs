//! The typed error frame and the cancel frame, which may end a call in either direction.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::check::{self, invalid};
use super::{MessageError, fb};

/// Error codes; each maps to one HTTP status at the frontend (see schemas/zerolayer.fbs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Malformed request or out-of-range parameter.
    InvalidRequest,
    /// Unknown model, worker or other named thing.
    NotFound,
    /// At capacity; retry later.
    Overloaded,
    /// Starting, draining or shutting down; retry elsewhere.
    Unavailable,
    /// Unexpected failure.
    Internal,
    /// Cancelled by either side.
    Cancelled,
    /// The caller may not make this call.
    PermissionDenied,
    /// Prompt plus `max_tokens` exceed the context window.
    ContextLengthExceeded,
    /// The peer broke the protocol.
    ProtocolViolation,
    /// Protocol major versions differ.
    VersionMismatch,
    /// A deadline passed.
    DeadlineExceeded,
    /// The Raft group has no quorum for writes.
    NoQuorum,
}

impl ErrorCode {
    const TABLE: [(ErrorCode, fb::ErrorCode, &'static str); 12] = [
        (ErrorCode::InvalidRequest, fb::ErrorCode::InvalidRequest, "invalid_request"),
        (ErrorCode::NotFound, fb::ErrorCode::NotFound, "not_found"),
        (ErrorCode::Overloaded, fb::ErrorCode::Overloaded, "overloaded"),
        (ErrorCode::Unavailable, fb::ErrorCode::Unavailable, "unavailable"),
        (ErrorCode::Internal, fb::ErrorCode::Internal, "internal"),
        (ErrorCode::Cancelled, fb::ErrorCode::Cancelled, "cancelled"),
        (ErrorCode::PermissionDenied, fb::ErrorCode::PermissionDenied, "permission_denied"),
        (ErrorCode::ContextLengthExceeded, fb::ErrorCode::ContextLengthExceeded, "context_length_exceeded"),
        (ErrorCode::ProtocolViolation, fb::ErrorCode::ProtocolViolation, "protocol_violation"),
        (ErrorCode::VersionMismatch, fb::ErrorCode::VersionMismatch, "version_mismatch"),
        (ErrorCode::DeadlineExceeded, fb::ErrorCode::DeadlineExceeded, "deadline_exceeded"),
        (ErrorCode::NoQuorum, fb::ErrorCode::NoQuorum, "no_quorum"),
    ];

    /// Stable snake_case name, for logs and metrics labels.
    pub fn name(self) -> &'static str {
        Self::TABLE.iter().find(|(c, _, _)| *c == self).map_or("unknown", |(_, _, n)| n)
    }

    /// True for codes where trying again (later or elsewhere) can succeed.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Overloaded | ErrorCode::Unavailable | ErrorCode::DeadlineExceeded | ErrorCode::NoQuorum
        )
    }

    fn to_wire(self) -> fb::ErrorCode {
        Self::TABLE.iter().find(|(c, _, _)| *c == self).map_or(fb::ErrorCode::Internal, |(_, w, _)| *w)
    }

    fn from_wire(code: fb::ErrorCode) -> Result<ErrorCode, MessageError> {
        Self::TABLE
            .iter()
            .find(|(_, w, _)| *w == code)
            .map(|(c, _, _)| *c)
            .ok_or_else(|| invalid("Error.code", format!("unknown error code {}", code.0)))
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A typed failure sent by a peer; the terminal frame of a failed call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WireError {
    /// What went wrong.
    pub code: ErrorCode,
    /// Human-readable, safe to show to end users.
    pub message: String,
    /// Suggested wait before retrying, in milliseconds; 0 for none.
    pub retry_after_ms: u32,
}

impl WireError {
    /// An error with no retry hint. Over-long messages are cut (at a character boundary) to the wire limit.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let mut message: String = message.into();
        if message.len() > check::MAX_ERROR_MESSAGE_LEN {
            let mut end = check::MAX_ERROR_MESSAGE_LEN;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        message.retain(|c| !c.is_control() || c == '\n' || c == '\t');
        WireError { code, message, retry_after_ms: 0 }
    }

    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::text("Error.message", &self.message, 0, check::MAX_ERROR_MESSAGE_LEN)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::Error<'b>> {
        let message = fbb.create_string(&self.message);
        fb::Error::create(
            fbb,
            &fb::ErrorArgs { code: self.code.to_wire(), message: Some(message), retry_after_ms: self.retry_after_ms },
        )
    }

    pub(crate) fn read(t: fb::Error<'_>) -> Result<Self, MessageError> {
        let msg = WireError {
            code: ErrorCode::from_wire(t.code())?,
            message: t.message().to_owned(),
            retry_after_ms: t.retry_after_ms(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// The caller abandons a call.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Cancel {
    /// Free text for logs.
    pub reason: String,
}

impl Cancel {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::text("Cancel.reason", &self.reason, 0, check::MAX_REASON_LEN)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::Cancel<'b>> {
        let reason = fbb.create_string(&self.reason);
        fb::Cancel::create(fbb, &fb::CancelArgs { reason: Some(reason) })
    }

    pub(crate) fn read(t: fb::Cancel<'_>) -> Result<Self, MessageError> {
        let msg = Cancel { reason: t.reason().unwrap_or_default().to_owned() };
        msg.check()?;
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_distinct_wire_value_and_name() {
        for (code, wire, name) in ErrorCode::TABLE {
            assert_eq!(ErrorCode::from_wire(wire).unwrap(), code);
            assert_eq!(code.name(), name);
        }
        let mut names: Vec<_> = ErrorCode::TABLE.iter().map(|t| t.2).collect();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::TABLE.len());
        assert!(ErrorCode::from_wire(fb::ErrorCode::Unspecified).is_err());
    }

    #[test]
    fn long_messages_are_cut_at_a_char_boundary() {
        let err = WireError::new(ErrorCode::Internal, "é".repeat(check::MAX_ERROR_MESSAGE_LEN));
        assert!(err.message.len() <= check::MAX_ERROR_MESSAGE_LEN);
        assert!(err.check().is_ok());
    }
}
