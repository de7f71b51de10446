//! Server-sent events, incrementally: bytes in as they arrive, whole events out. Sans-IO, and bounded (an event
//! that grows past [`MAX_EVENT`] is an error, not unbounded memory).

/// The largest event accepted, in bytes.
pub const MAX_EVENT: usize = 4 << 20;

/// One event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// Its `event:` name, if it had one.
    pub name: Option<String>,
    /// Its `data:` lines, joined by newlines.
    pub data: String,
}

/// The parser's state between reads.
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    event: Event,
    has_data: bool,
}

impl Parser {
    /// Feed bytes; the events they completed, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Event>, String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                if self.line.len() + self.event.data.len() > MAX_EVENT {
                    return Err(format!("an event of over {MAX_EVENT} bytes"));
                }
                continue;
            }
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8(line).map_err(|_| "an event that is not UTF-8".to_owned())?;
            if line.is_empty() {
                if self.has_data || self.event.name.is_some() {
                    out.push(std::mem::take(&mut self.event));
                }
                self.has_data = false;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.event.name = Some(value.to_owned()),
                "data" => {
                    if self.has_data {
                        self.event.data.push('\n');
                    }
                    self.event.data.push_str(value);
                    self.has_data = true;
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_across_reads() {
        let mut p = Parser::default();
        let text = "event: a\ndata: {\"x\"\r\ndata: :1}\n\n: comment\n\ndata: [DONE]\n\n";
        let mut events = Vec::new();
        // One byte at a time: every split point is covered.
        for b in text.as_bytes() {
            events.extend(p.feed(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(
            events,
            vec![
                Event { name: Some("a".into()), data: "{\"x\"\n:1}".into() },
                Event { name: None, data: "[DONE]".into() }
            ]
        );
        assert_eq!(Parser::default().feed(text.as_bytes()).unwrap(), events);
    }

    #[test]
    fn bounded_and_utf8() {
        let mut p = Parser::default();
        let big = vec![b'x'; MAX_EVENT + 1];
        assert!(p.feed(&big).is_err());
        assert!(Parser::default().feed(b"data: \xff\n").is_err());
    }
}
