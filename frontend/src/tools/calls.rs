//! The answer split back into text and tool calls, as it streams (sans-IO: text in, pieces out). A call is
//! `<tool_call>` + `{"name": ..., "arguments": ...}` + `</tool_call>`. Its arguments stream as they arrive once
//! the name is known (held back only where the wrapper's closing brace or the closing tag may be starting);
//! a call written another way (arguments first) is read whole when it closes. A call of a tool that was not
//! offered, or one never closed before the answer ended without a name, stays text. Whitespace around calls is
//! dropped.

use serde_json::Value;

use super::{CALL_CLOSE, CALL_OPEN, CallParse};

/// A piece of the answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Text of a reasoning model's thinking section (before the answer).
    Thinking(String),
    /// Text.
    Text(String),
    /// A call of `name` begins.
    CallStart {
        /// The tool.
        name: String,
    },
    /// More of its arguments' JSON text.
    CallArgs(String),
    /// The call ended.
    CallEnd {
        /// Its arguments parse as a JSON object.
        valid: bool,
    },
}

#[derive(Clone, Debug)]
enum State {
    /// Text; calls may begin.
    Text,
    /// Inside a call whose name is not read yet.
    Head,
    /// Inside a call, arguments streaming from `args` (byte offset into the buffer); `sent` bytes of them out.
    Args { args: usize, sent: usize },
    /// Everything else is text (no more calls are looked for).
    Plain,
}

/// Splits one answer.
#[derive(Clone, Debug)]
pub struct Splitter {
    parse: CallParse,
    names: Vec<String>,
    state: State,
    buf: String,
    /// Whitespace held until it turns out to be between text (kept) or around a call (dropped).
    pending_ws: String,
    /// Any text or call came out yet.
    started: bool,
    /// The last piece out was text.
    in_text: bool,
    /// Calls completed.
    pub calls: usize,
}

impl Splitter {
    /// A splitter for an answer whose calls are looked for as `parse` says, of tools named `names`.
    pub fn new(parse: CallParse, names: Vec<String>) -> Splitter {
        let state = if parse == CallParse::Off { State::Plain } else { State::Text };
        Splitter {
            parse,
            names,
            state,
            buf: String::new(),
            pending_ws: String::new(),
            started: false,
            in_text: false,
            calls: 0,
        }
    }

    /// Where calls are looked for.
    pub fn parse(&self) -> CallParse {
        self.parse
    }

    /// More of the answer.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        self.buf.push_str(delta);
        self.drain(&mut out, false);
        out
    }

    /// The answer ended: whatever is held comes out.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.drain(&mut out, true);
        out
    }

    /// Text out: whitespace at the start of a text block or before a call is dropped, between text kept.
    fn text(&mut self, out: &mut Vec<Piece>, text: &str) {
        let body = text.trim_end();
        if body.is_empty() {
            if self.in_text {
                self.pending_ws.push_str(text);
            }
            return;
        }
        let mut s = if self.in_text { std::mem::take(&mut self.pending_ws) } else { String::new() };
        s.push_str(if self.in_text { body } else { body.trim_start() });
        self.pending_ws = text[body.len()..].to_owned();
        self.in_text = true;
        self.started = true;
        match out.last_mut() {
            Some(Piece::Text(t)) => t.push_str(&s),
            _ => out.push(Piece::Text(s)),
        }
    }

    fn drain(&mut self, out: &mut Vec<Piece>, end: bool) {
        loop {
            match self.state {
                State::Plain => {
                    let text = std::mem::take(&mut self.buf);
                    if self.parse == CallParse::Off {
                        // No tools: the text exactly as generated.
                        if !text.is_empty() {
                            out.push(Piece::Text(text));
                        }
                    } else {
                        self.text(out, &text);
                    }
                    return;
                }
                State::Text => {
                    if self.parse == CallParse::AtStart && self.calls == 0 {
                        // Calls only where the answer opens with one.
                        let head = self.buf.trim_start();
                        if self.in_text || !(CALL_OPEN.starts_with(head) || head.starts_with(CALL_OPEN)) {
                            self.state = State::Plain;
                            continue;
                        }
                    }
                    if let Some(at) = self.buf.find(CALL_OPEN) {
                        let before = self.buf[..at].to_owned();
                        self.text(out, &before);
                        self.buf.drain(..at + CALL_OPEN.len());
                        self.state = State::Head;
                        continue;
                    }
                    let keep = if end { 0 } else { partial_suffix(&self.buf, CALL_OPEN) };
                    let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.text(out, &text);
                    return;
                }
                State::Head => match read_head(&self.buf) {
                    Head::Name(name, args) if self.names.contains(&name) => {
                        self.call_start(out, name);
                        self.state = State::Args { args, sent: args };
                    }
                    Head::Name(..) | Head::Other => {
                        if let Some(close) = self.buf.find(CALL_CLOSE) {
                            self.whole_call(out, close);
                            continue;
                        }
                        if end {
                            self.as_text(out);
                        }
                        return;
                    }
                    Head::Incomplete => {
                        if end {
                            self.as_text(out);
                        }
                        return;
                    }
                },
                State::Args { args, sent } => {
                    if let Some(close) = self.buf[sent..].find(CALL_CLOSE).map(|c| c + sent) {
                        let body = self.buf[args..close].trim_end();
                        let body = body.strip_suffix('}').unwrap_or(body).trim_end();
                        if body.len() > sent - args {
                            out.push(Piece::CallArgs(body[sent - args..].to_owned()));
                        }
                        let valid = serde_json::from_str::<Value>(body).is_ok_and(|v| v.is_object());
                        out.push(Piece::CallEnd { valid });
                        self.calls += 1;
                        self.buf.drain(..close + CALL_CLOSE.len());
                        self.state = State::Text;
                        continue;
                    }
                    let ready = if end { self.buf.len() } else { args_ready(&self.buf, sent) };
                    if ready > sent {
                        out.push(Piece::CallArgs(self.buf[sent..ready].to_owned()));
                        self.state = State::Args { args, sent: ready };
                    }
                    if end {
                        out.push(Piece::CallEnd { valid: false });
                        self.calls += 1;
                        self.buf.clear();
                    }
                    return;
                }
            }
        }
    }

    fn call_start(&mut self, out: &mut Vec<Piece>, name: String) {
        out.push(Piece::CallStart { name });
        self.pending_ws.clear();
        self.in_text = false;
        self.started = true;
    }

    /// A call that closed at `close` without a readable head: read it whole.
    fn whole_call(&mut self, out: &mut Vec<Piece>, close: usize) {
        let body = self.buf[..close].trim();
        let parsed = serde_json::from_str::<Value>(body).ok();
        let call = parsed.as_ref().and_then(|v| {
            let name = v.get("name")?.as_str()?;
            let args = v.get("arguments").or_else(|| v.get("parameters"))?;
            (self.names.iter().any(|n| n == name) && args.is_object()).then(|| (name.to_owned(), args.to_string()))
        });
        match call {
            Some((name, args)) => {
                self.call_start(out, name);
                out.push(Piece::CallArgs(args));
                out.push(Piece::CallEnd { valid: true });
                self.calls += 1;
                self.buf.drain(..close + CALL_CLOSE.len());
            }
            None => {
                let raw: String = self.buf.drain(..close + CALL_CLOSE.len()).collect();
                self.text(out, &format!("{CALL_OPEN}{raw}"));
            }
        }
        self.state = State::Text;
    }

    /// An unfinished call without a readable head at the end: it was text.
    fn as_text(&mut self, out: &mut Vec<Piece>) {
        let text = format!("{CALL_OPEN}{}", std::mem::take(&mut self.buf));
        self.text(out, &text);
        self.state = State::Plain;
    }
}

/// One block of an answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Block {
    /// A thinking section's text.
    Thinking(String),
    /// Text.
    Text(String),
    /// A tool call.
    Call {
        /// The tool.
        name: String,
        /// Its arguments' JSON text.
        args: String,
        /// The arguments parse as a JSON object.
        valid: bool,
    },
}

/// Gather pieces into blocks.
pub fn blocks(pieces: impl IntoIterator<Item = Piece>) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    for p in pieces {
        match p {
            Piece::Thinking(t) => match out.last_mut() {
                Some(Block::Thinking(s)) => s.push_str(&t),
                _ => out.push(Block::Thinking(t)),
            },
            Piece::Text(t) => match out.last_mut() {
                Some(Block::Text(s)) => s.push_str(&t),
                _ => out.push(Block::Text(t)),
            },
            Piece::CallStart { name } => out.push(Block::Call { name, args: String::new(), valid: false }),
            Piece::CallArgs(a) => {
                if let Some(Block::Call { args, .. }) = out.last_mut() {
                    args.push_str(&a);
                }
            }
            Piece::CallEnd { valid: v } => {
                if let Some(Block::Call { valid, .. }) = out.last_mut() {
                    *valid = v;
                }
            }
        }
    }
    out
}

/// A call whose arguments never parsed (the answer was cut off), as the text it was.
pub fn unfinished_call(name: &str, args: &str) -> String {
    format!("{CALL_OPEN}\n{{\"name\": \"{name}\", \"arguments\": {args}")
}

/// How much of the end of `text` could be the start of `tag`.
pub(crate) fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// How far arguments may be sent: all but a tail that may be the wrapper's closing brace with whitespace and the
/// start of the closing tag.
fn args_ready(buf: &str, sent: usize) -> usize {
    let tail_tag = partial_suffix(buf, CALL_CLOSE);
    let mut ready = buf.len() - tail_tag;
    let rest = &buf[sent..ready];
    if let Some(brace) = rest.rfind('}')
        && rest[brace + 1..].trim().is_empty()
    {
        ready = sent + brace;
    } else {
        ready = sent + rest.trim_end().len();
    }
    ready.max(sent)
}

enum Head {
    /// `{"name": "x", "arguments":` read; arguments start at the offset.
    Name(String, usize),
    /// Not that shape.
    Other,
    /// Not enough yet.
    Incomplete,
}

/// Read `{"name": "<name>", "arguments": ` (any whitespace) from the start of a call.
fn read_head(buf: &str) -> Head {
    let mut at = 0;
    let bytes = buf.as_bytes();
    let skip_ws = |at: &mut usize| {
        while *at < bytes.len() && bytes[*at].is_ascii_whitespace() {
            *at += 1;
        }
    };
    // Each expected literal: complete, a prefix of what is there (incomplete), or something else.
    let expect = |at: &mut usize, lit: &str| -> Option<bool> {
        skip_ws(at);
        let rest = &buf[*at..];
        if rest.starts_with(lit) {
            *at += lit.len();
            Some(true)
        } else if lit.starts_with(rest) {
            None
        } else {
            Some(false)
        }
    };
    for lit in ["{", "\"name\"", ":", "\""] {
        match expect(&mut at, lit) {
            Some(true) => {}
            Some(false) => return Head::Other,
            None => return Head::Incomplete,
        }
    }
    let Some(end) = buf[at..].find('"') else { return Head::Incomplete };
    let name = buf[at..at + end].to_owned();
    at += end + 1;
    for lit in [",", "\"arguments\"", ":"] {
        match expect(&mut at, lit) {
            Some(true) => {}
            Some(false) => return Head::Other,
            None => return Head::Incomplete,
        }
    }
    skip_ws(&mut at);
    if at == buf.len() {
        return Head::Incomplete;
    }
    Head::Name(name, at)
}

#[cfg(test)]
mod tests;
