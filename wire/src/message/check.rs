//! Field checks shared by every message: lengths, ranges, identifiers. Used on decode (untrusted input) and on
//! encode (so a peer never sends what the other side must refuse). Never reads raw buffers itself.

use super::MessageError;

/// Longest model id, request id or alias, in bytes.
pub const MAX_ID_LEN: usize = 256;
/// Longest file path (an adapter's), in bytes.
pub const MAX_PATH_LEN: usize = 4096;
/// Most adapters a load report may list.
pub const MAX_ADAPTERS: usize = 1024;
/// Longest node id (a DNS label).
pub const MAX_NODE_ID_LEN: usize = 63;
/// Longest free-text reason or explanation, in bytes.
pub const MAX_REASON_LEN: usize = 4096;
/// Longest error message, in bytes.
pub const MAX_ERROR_MESSAGE_LEN: usize = 16 * 1024;
/// Most models one worker may register.
pub const MAX_MODELS: usize = 256;
/// Most stop sequences in one request.
pub const MAX_STOP_SEQUENCES: usize = 64;
/// Longest stop sequence, in bytes.
pub const MAX_STOP_SEQUENCE_LEN: usize = 1024;
/// Longest constrained-decoding grammar, in bytes.
pub const MAX_GRAMMAR_LEN: usize = 256 * 1024;
/// Most workers a route request may exclude.
pub const MAX_EXCLUDED_WORKERS: usize = 1024;
/// Highest sampling temperature accepted on the wire (OpenAI's range; Anthropic's is narrower and checked at the
/// frontend).
pub const MAX_TEMPERATURE: f32 = 2.0;

pub(crate) fn invalid(field: &'static str, problem: impl Into<String>) -> MessageError {
    MessageError::Invalid { field, problem: problem.into() }
}

/// A string of `min..=max` bytes without control characters.
pub(crate) fn text(field: &'static str, value: &str, min: usize, max: usize) -> Result<(), MessageError> {
    if value.len() < min {
        return Err(invalid(
            field,
            if min == 1 { "must not be empty".to_string() } else { format!("shorter than {min} bytes") },
        ));
    }
    if value.len() > max {
        return Err(invalid(field, format!("{} bytes, limit is {max}", value.len())));
    }
    if value.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Err(invalid(field, "contains control characters"));
    }
    Ok(())
}

/// An identifier: 1 to `MAX_ID_LEN` bytes, no whitespace or control characters.
pub(crate) fn id(field: &'static str, value: &str) -> Result<(), MessageError> {
    text(field, value, 1, MAX_ID_LEN)?;
    if value.chars().any(char::is_whitespace) {
        return Err(invalid(field, "contains whitespace"));
    }
    Ok(())
}

/// At most `max` items.
pub(crate) fn count(field: &'static str, len: usize, max: usize) -> Result<(), MessageError> {
    if len > max {
        return Err(invalid(field, format!("{len} items, limit is {max}")));
    }
    Ok(())
}

/// A finite number in `[lo, hi]`.
pub(crate) fn range(field: &'static str, value: f32, lo: f32, hi: f32) -> Result<(), MessageError> {
    if !value.is_finite() || value < lo || value > hi {
        return Err(invalid(field, format!("{value} is outside [{lo}, {hi}]")));
    }
    Ok(())
}

/// `host:port` with a non-empty host (IPv6 in brackets) and a non-zero port.
pub(crate) fn endpoint(field: &'static str, value: &str) -> Result<(), MessageError> {
    text(field, value, 3, MAX_ID_LEN)?;
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(invalid(field, format!("{value:?} is not host:port")));
    };
    let host_ok = !host.is_empty()
        && !host.chars().any(char::is_whitespace)
        && (!host.contains(':') || (host.starts_with('[') && host.ends_with(']')));
    match port.parse::<u16>() {
        Ok(p) if p != 0 && host_ok => Ok(()),
        _ => Err(invalid(field, format!("{value:?} is not host:port"))),
    }
}

/// A SHA-256 digest: exactly 32 bytes.
pub(crate) fn sha256(field: &'static str, bytes: &[u8]) -> Result<[u8; 32], MessageError> {
    bytes.try_into().map_err(|_| invalid(field, format!("{} bytes, a SHA-256 digest is 32", bytes.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        for ok in ["127.0.0.1:7000", "worker-0.zl.svc:443", "[::1]:9", "localhost:1"] {
            assert!(endpoint("e", ok).is_ok(), "{ok}");
        }
        for bad in ["", "host", "host:", ":80", "host:0", "host:70000", "::1:80", "a b:80", "h:8x"] {
            assert!(endpoint("e", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_and_text() {
        assert!(id("f", "smollm2-135m-instruct").is_ok());
        assert!(id("f", "").is_err());
        assert!(id("f", "a b").is_err());
        assert!(id("f", &"x".repeat(MAX_ID_LEN + 1)).is_err());
        assert!(text("f", "line\nnext\ttab", 0, 100).is_ok());
        assert!(text("f", "bell\u{7}", 0, 100).is_err());
    }

    #[test]
    fn ranges_reject_nan_and_infinity() {
        assert!(range("t", 0.5, 0.0, 1.0).is_ok());
        assert!(range("t", f32::NAN, 0.0, 1.0).is_err());
        assert!(range("t", f32::INFINITY, 0.0, 1.0).is_err());
        assert!(range("t", -0.1, 0.0, 1.0).is_err());
    }
}
