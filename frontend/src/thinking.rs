//! Reasoning models' thinking sections (Qwen3's `<think>` ... `</think>`): the answer's text split, as it streams,
//! into the section's text and the answer proper, so neither API's answer shows the raw markers. A marker split
//! across deltas is held back until it is whole. Pure.

/// The section's opening marker.
pub const OPEN: &str = "<think>";
/// Its closing marker.
pub const CLOSE: &str = "</think>";
use crate::tools::calls::Piece;

/// What closes the section when its budget is spent (the worker writes these tokens).
pub const FORCED_CLOSE: &str = "\n</think>\n\n";

/// A part of the answer's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Text of the thinking section.
    Thinking(String),
    /// Text of the answer proper.
    Answer(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// The answer has not begun: it may open with the section (after whitespace).
    Before,
    /// Inside the section.
    Inside,
    /// After it (or there is none): the answer; newlines right after the section are dropped.
    After { started: bool },
}

/// One answer's splitter.
#[derive(Clone, Debug)]
pub struct Splitter {
    state: State,
    held: String,
}

impl Splitter {
    /// A splitter for an answer that may open with a section; `inside`: the prompt already opened it (templates
    /// that end the generation prompt with `<think>`).
    pub fn new(inside: bool) -> Self {
        let state = if inside { State::Inside } else { State::Before };
        Splitter { state, held: String::new() }
    }

    /// The parts of the next delta.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Before => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.state = State::Inside;
                    } else if !trimmed.is_empty() && !OPEN.starts_with(trimmed) {
                        self.state = State::After { started: true };
                    } else {
                        return out;
                    }
                }
                State::Inside => match self.held.find(CLOSE) {
                    Some(at) => {
                        let thinking: String = self.held[..at].to_owned();
                        self.held.drain(..at + CLOSE.len());
                        self.emit_thinking(thinking, &mut out);
                        self.state = State::After { started: false };
                    }
                    None => {
                        let keep = crate::tools::calls::partial_suffix(&self.held, CLOSE);
                        let thinking: String = self.held.drain(..self.held.len() - keep).collect();
                        self.emit_thinking(thinking, &mut out);
                        return out;
                    }
                },
                State::After { started } => {
                    let text = std::mem::take(&mut self.held);
                    let text = if started { text } else { text.trim_start_matches('\n').to_owned() };
                    if !text.is_empty() {
                        self.state = State::After { started: true };
                        out.push(Part::Answer(text));
                    }
                    return out;
                }
            }
        }
    }

    /// The end: what is held back, as what it was part of (an unclosed section is all thinking).
    pub fn finish(&mut self) -> Vec<Part> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Inside => self.emit_thinking(held, &mut out),
            _ if !held.trim_start_matches('\n').is_empty() => out.push(Part::Answer(held)),
            _ => {}
        }
        out
    }

    fn emit_thinking(&mut self, text: String, out: &mut Vec<Part>) {
        if !text.is_empty() {
            out.push(Part::Thinking(text));
        }
    }
}

/// The pieces of an answer's next delta: its thinking section's text (with `think`) and the rest through the
/// tool-call splitter.
pub fn pieces(think: Option<&mut Splitter>, calls: &mut crate::tools::calls::Splitter, text: &str) -> Vec<Piece> {
    match think {
        None => calls.push(text),
        Some(think) => think.push(text).into_iter().flat_map(|p| piece(p, calls)).collect(),
    }
}

/// The end of an answer: what both splitters held back.
pub fn finish(think: Option<&mut Splitter>, calls: &mut crate::tools::calls::Splitter) -> Vec<Piece> {
    let mut out: Vec<Piece> = match think {
        None => Vec::new(),
        Some(think) => think.finish().into_iter().flat_map(|p| piece(p, calls)).collect(),
    };
    out.extend(calls.finish());
    out
}

fn piece(part: Part, calls: &mut crate::tools::calls::Splitter) -> Vec<Piece> {
    match part {
        Part::Thinking(t) => vec![Piece::Thinking(t)],
        Part::Answer(a) => calls.push(&a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(inside: bool, deltas: &[&str]) -> (String, String) {
        let mut s = Splitter::new(inside);
        let mut parts: Vec<Part> = deltas.iter().flat_map(|d| s.push(d)).collect();
        parts.extend(s.finish());
        let (mut thinking, mut answer) = (String::new(), String::new());
        for p in parts {
            match p {
                Part::Thinking(t) => thinking.push_str(&t),
                Part::Answer(a) => answer.push_str(&a),
            }
        }
        (thinking, answer)
    }

    #[test]
    fn the_section_and_the_answer_come_apart_whatever_the_deltas() {
        let text = "<think>\nThe user asks about France.\n</think>\n\nParis.";
        let want = ("\nThe user asks about France.\n".to_owned(), "Paris.".to_owned());
        assert_eq!(split(false, &[text]), want);
        // Every way of cutting it in two, markers split included.
        for cut in 1..text.len() {
            assert_eq!(split(false, &[&text[..cut], &text[cut..]]), want, "cut at {cut}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(split(false, &chars.iter().map(String::as_str).collect::<Vec<_>>()), want);
    }

    #[test]
    fn answers_without_a_section_and_prompts_that_open_it() {
        assert_eq!(split(false, &["Paris", " is the capital."]), (String::new(), "Paris is the capital.".into()));
        assert_eq!(split(false, &["<thi", "s is not it"]), (String::new(), "<this is not it".into()));
        assert_eq!(split(true, &["hmm", "</think>\n\nOK"]), ("hmm".into(), "OK".into()));
        // Cut off inside the section: all of it is thinking.
        assert_eq!(split(false, &["<think>still going </th"]), ("still going </th".into(), String::new()));
        // A held-back prefix of the opening marker that never completes is answer text.
        assert_eq!(split(false, &["<th"]), (String::new(), "<th".into()));
    }
}
