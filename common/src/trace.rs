//! W3C Trace Context (`traceparent: 00-<trace id>-<parent span id>-<flags>`), parsed and written the same way by
//! every tier: the frontend adopts a client's trace or starts one, and the trace travels in the route and generate
//! calls, so one id follows a request through every tier's logs. Pure: ids come from the caller.

/// A trace context: the trace, the span that is the parent of the next hop, and the sampled flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    /// 32 lowercase hex characters, not all zero.
    pub trace_id: String,
    /// 16 lowercase hex characters, not all zero.
    pub span_id: String,
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

fn hex_id(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && s.bytes().any(|b| b != b'0')
}

impl TraceContext {
    /// Parse a `traceparent` header value (version 00, or a later version's first four fields as the spec asks).
    pub fn parse(header: &str) -> Option<TraceContext> {
        let mut parts = header.trim().split('-');
        let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let version_ok = version.len() == 2 && hex_id(version, 2) || version == "00";
        if !version_ok || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        if !hex_id(trace_id, 32) || !hex_id(span_id, 16) || flags.len() != 2 {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Some(TraceContext { trace_id: trace_id.to_owned(), span_id: span_id.to_owned(), flags })
    }

    /// The same trace, with `span_id` (16 hex characters) as the parent of the next hop.
    pub fn child(&self, span_id: String) -> TraceContext {
        TraceContext { span_id, ..self.clone() }
    }

    /// The `traceparent` header value.
    pub fn header(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, self.span_id, self.flags)
    }
}

/// The trace id of a `traceparent` value, or `-` for none (what log lines show).
pub fn trace_id_of(traceparent: &str) -> &str {
    match traceparent.split('-').nth(1) {
        Some(id) if hex_id(id, 32) => id,
        _ => "-",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_specs_examples() {
        let t = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!((t.span_id.as_str(), t.flags), ("00f067aa0ba902b7", 1));
        assert_eq!(t.header(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let c = t.child("1111111111111111".into());
        assert_eq!(c.header(), "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01");
        assert_eq!(trace_id_of(&c.header()), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace_id_of(""), "-");
        // A later version with more fields is read by its first four.
        assert!(TraceContext::parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what").is_some());
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad}");
        }
    }
}
