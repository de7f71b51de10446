//! Predictive streaming's draft tokens: prompt lookup. The newest few tokens of a sequence (its prompt and what it
//! generated so far) are looked up earlier in the same sequence; the tokens that followed the latest earlier match
//! are the guess for what comes next. No second model: text that repeats its input (a summary quoting it, an
//! edit of a given text, an extraction, code completion) drafts well, other text drafts nothing and costs nothing.
//!
//! Pure: the scheduler asks for drafts while planning a step, the engine verifies them against the model's own
//! choices (`engine::state`), keeping the longest prefix the model would have produced anyway.
//!
//! Drafts cost rows of compute whether they are accepted or not, so each sequence drafts only while it pays
//! ([`DraftGate`]): its own acceptance rate sets how many it drafts, a busier step asks for a higher rate (a step
//! of few rows waits on reading the weights and computes extra rows almost for free; a step near the speculative
//! row limit is compute-bound, and a rejected draft there slows every sequence in it), and a sequence whose drafts
//! keep failing stops drafting for a while, then probes with two.

/// The longest suffix looked up, in tokens; longer matches are tried first.
pub const MAX_NGRAM: usize = 4;

/// The shortest suffix looked up: single tokens match too often by chance to be worth a draft.
pub const MIN_NGRAM: usize = 2;

/// Draft tokens per step at most, by default: each costs one row of a step's compute.
pub const DEFAULT_MAX_DRAFT: usize = 8;

/// Per sequence: whether, and how many, draft tokens pay, from the sequence's own acceptance so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftGate {
    /// Accepted per drafted token, a moving average (starts at 0.75: a new sequence tries where rows are cheap).
    rate: f32,
    /// Steps left without drafts.
    skip: u16,
    /// The length of the last pause (doubled each time drafting fails again, up to 64 steps).
    pause: u16,
    /// The next drafting step is a probe of two drafts after a pause.
    probe: bool,
}

impl Default for DraftGate {
    fn default() -> Self {
        DraftGate { rate: 0.75, skip: 0, pause: 0, probe: false }
    }
}

/// Draft tokens of a probe after a pause.
const PROBE_DRAFTS: usize = 2;

impl DraftGate {
    /// The acceptance rate a step of `rows` rows (decode tokens and prefill chunks) needs, of `knee` rows that cost
    /// about one row's time: 0.3 in an otherwise empty step, up to 0.8 at the knee.
    pub fn needed(rows: usize, knee: usize) -> f32 {
        0.3 + 0.5 * (rows as f32 / knee.max(1) as f32).min(1.0)
    }

    /// Draft tokens to ask for this step (at most `max`), in a step of `rows` rows of `knee`.
    pub fn allowance(&mut self, max: usize, rows: usize, knee: usize) -> usize {
        if max == 0 {
            return 0;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return 0;
        }
        if self.probe {
            self.probe = false;
            return max.min(PROBE_DRAFTS);
        }
        if self.rate < Self::needed(rows, knee) {
            self.pause = (self.pause * 2).clamp(4, 64);
            self.skip = self.pause;
            self.probe = true;
            return 0;
        }
        ((max as f32 * self.rate).ceil() as usize).clamp(1, max)
    }

    /// A step verified `drafted` drafts and the model agreed with the first `accepted`.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let r = accepted.min(drafted) as f32 / drafted as f32;
        self.rate = 0.5 * self.rate + 0.5 * r;
        if self.rate >= 0.5 {
            self.pause = 0;
        }
    }
}

/// Up to `max` tokens guessed to follow `tokens`: for suffix lengths from [`MAX_NGRAM`] down to [`MIN_NGRAM`], the
/// latest earlier occurrence of the sequence's last `n` tokens, and what followed it. Empty when nothing matches.
pub fn propose(tokens: &[u32], max: usize) -> Vec<u32> {
    if max == 0 {
        return Vec::new();
    }
    for n in (MIN_NGRAM..=MAX_NGRAM.min(tokens.len().saturating_sub(1))).rev() {
        let suffix = &tokens[tokens.len() - n..];
        // Latest first: the most recent context is the likeliest to repeat. A match must end before the suffix
        // starts, so that at least one token follows it.
        if let Some(at) = (0..tokens.len() - n).rev().find(|&i| &tokens[i..i + n] == suffix) {
            let follow = &tokens[at + n..];
            return follow[..follow.len().min(max)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokens_after_the_latest_earlier_match_are_proposed() {
        // "... 1 2 3 4 5 ... 1 2 3 9 ... 1 2 3": the latest match of "1 2 3" is followed by 9.
        let t = [1, 2, 3, 4, 5, 7, 1, 2, 3, 9, 8, 6, 1, 2, 3];
        assert_eq!(propose(&t, 3), vec![9, 8, 6]);
        assert_eq!(propose(&t, 1), vec![9]);
        assert_eq!(propose(&t, 0), Vec::<u32>::new());
    }

    #[test]
    fn longer_suffixes_win_and_single_tokens_never_match() {
        // "4 1 2" matches only at the start (followed by 7); "1 2" alone would match later (followed by 8).
        let t = [4, 1, 2, 7, 1, 2, 8, 4, 1, 2];
        assert_eq!(propose(&t, 2), vec![7, 1]);
        // Only the last token repeats: no draft.
        assert!(propose(&[5, 6, 7, 5], 4).is_empty());
        assert!(propose(&[], 4).is_empty());
        assert!(propose(&[1], 4).is_empty());
    }

    #[test]
    fn drafts_follow_acceptance_and_need_more_of_it_in_a_busy_step() {
        let mut g = DraftGate::default();
        // New: six of eight in an empty step; every one accepted, rate 0.875, enough for a full step (0.8).
        assert_eq!(g.allowance(8, 1, 16), 6);
        g.record(6, 6);
        assert_eq!(g.allowance(8, 16, 16), 7);
        // Half accepted: rate 0.6875, six of eight in an empty step; a full step needs 0.8: a pause.
        g.record(8, 4);
        assert_eq!(g.allowance(8, 1, 16), 6);
        assert_eq!(g.allowance(8, 16, 16), 0, "a busy step needs 0.8");
        // The pause: four steps without drafts, then a probe of two.
        assert_eq!((0..4).map(|_| g.allowance(8, 1, 16)).sum::<usize>(), 0);
        assert_eq!(g.allowance(8, 16, 16), 2);
        // The probe fails: rate 0.34 < 0.8, a pause twice as long.
        g.record(2, 0);
        assert_eq!(g.allowance(8, 16, 16), 0);
        assert_eq!((0..8).map(|_| g.allowance(8, 1, 16)).sum::<usize>(), 0);
        assert_eq!(g.allowance(8, 1, 16), 2);
        // Drafts accepted again: back to drafting, the pause forgotten.
        g.record(2, 2);
        g.record(8, 8);
        assert!(g.allowance(8, 1, 16) >= 7 && g.pause == 0, "{g:?}");
        assert_eq!(DraftGate::default().allowance(0, 1, 16), 0);
        assert_eq!(DraftGate::needed(0, 16), 0.3);
        assert_eq!(DraftGate::needed(32, 16), 0.8);
    }

    #[test]
    fn a_match_may_run_into_the_suffix_itself() {
        // A repeating pattern: the proposal continues it.
        let t = [1, 2, 1, 2, 1, 2];
        assert_eq!(propose(&t, 4), vec![1, 2]);
    }
}
