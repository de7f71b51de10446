//! Stop sequences across token boundaries: text is held back while its tail could still become a stop sequence,
//! so a client never sees part of a stop string, and the match is found however the tokens split it.
//!
//! Pure: text in, text out.

/// What to do after a piece of text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to send now.
    pub emit: String,
    /// The stop sequence that matched; generation must end.
    pub stopped: Option<String>,
}

/// Watches generated text for stop sequences.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    done: bool,
}

impl StopMatcher {
    /// A matcher for these stop sequences (empty ones are ignored).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            done: false,
        }
    }

    /// Feed newly decoded text.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.done {
            return StopStep { emit: String::new(), stopped: None };
        }
        self.held.push_str(text);
        // The earliest match wins; at equal positions the longer stop sequence.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|pos| (pos, std::cmp::Reverse(s.len()), s)))
            .min();
        if let Some((pos, _, stop)) = hit {
            let stop = stop.clone();
            let emit = self.held[..pos].to_owned();
            self.held.clear();
            self.done = true;
            return StopStep { emit, stopped: Some(stop) };
        }
        let keep = self.longest_pending_prefix();
        let split = self.held.len() - keep;
        let emit = self.held[..split].to_owned();
        self.held.drain(..split);
        StopStep { emit, stopped: None }
    }

    /// Length in bytes of the longest tail of the held text that is a proper prefix of some stop sequence (always
    /// at a character boundary).
    fn longest_pending_prefix(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(self.held.len());
            for len in (best + 1..=max).rev() {
                let start = self.held.len() - len;
                if self.held.is_char_boundary(start) && stop.starts_with(&self.held[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }

    /// Generation ended for another reason: the held text is final.
    pub fn flush(&mut self) -> String {
        self.done = true;
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let step = m.push(p);
            out.push_str(&step.emit);
            if step.stopped.is_some() {
                return (out, step.stopped);
            }
        }
        out.push_str(&m.flush());
        (out, None)
    }

    #[test]
    fn a_stop_split_across_tokens_is_found_and_never_shown() {
        assert_eq!(
            run(&["\n\nHuman:"], &["Hi", "\n", "\nHum", "an:", " more"]),
            ("Hi".into(), Some("\n\nHuman:".into()))
        );
    }

    #[test]
    fn held_text_is_released_when_it_stops_looking_like_a_stop() {
        let stops = vec!["STOP".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("ab ST").emit, "ab ");
        assert_eq!(m.push("AR").emit, "STAR");
    }

    #[test]
    fn without_a_match_everything_is_emitted() {
        assert_eq!(run(&["xyz"], &["hello ", "world", " x"]), ("hello world x".into(), None));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None));
    }

    #[test]
    fn earliest_match_wins_and_multibyte_text_is_safe() {
        assert_eq!(run(&["world", "lo"], &["hello world"]), ("hel".into(), Some("lo".into())));
        assert_eq!(run(&["é!"], &["café", "é", "!"]), ("café".into(), Some("é!".into())));
        assert_eq!(run(&["ü"], &["naïve ", "text"]), ("naïve text".into(), None));
    }
}
