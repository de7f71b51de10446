//! Predictive streaming's draft tokens: prompt lookup. The newest few tokens of a sequence (its prompt and what it
//! generated so far) are looked up earlier in the same sequence; the tokens that followed the latest earlier match
//! are the guess for what comes next. No second model: text that repeats its input (a summary quoting it, an
//! edit of a given text, an extraction, code completion) drafts well, other text drafts nothing and costs nothing.
//!
//! Pure: the scheduler asks for drafts while planning a step, the engine verifies them against the model's own
//! choices (`engine::state`), keeping the longest prefix the model would have produced anyway.

/// The longest suffix looked up, in tokens; longer matches are tried first.
pub const MAX_NGRAM: usize = 4;

/// The shortest suffix looked up: single tokens match too often by chance to be worth a draft.
pub const MIN_NGRAM: usize = 2;

/// Draft tokens per step at most, by default: each costs one row of a step's compute.
pub const DEFAULT_MAX_DRAFT: usize = 8;

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
    fn a_match_may_run_into_the_suffix_itself() {
        // A repeating pattern: the proposal continues it.
        let t = [1, 2, 1, 2, 1, 2];
        assert_eq!(propose(&t, 4), vec![1, 2]);
    }
}
