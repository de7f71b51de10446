//! Log-probabilities as a step reports them: which logits rows a batch item needs (its sampled rows, and the
//! prompt rows a sequence asking for the prompt's log-probabilities has not reported yet), and each row's values,
//! read from the raw logits before any sampling transform. Pure: no model, no IO.

use crate::sampling::LogSoftmax;
use crate::scheduler::StepItem;

/// A token's log-probability and, when asked, the most likely tokens at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprob {
    /// Natural log, <= 0.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first (empty unless asked for).
    pub top: Vec<(u32, f32)>,
}

/// What a sequence asks of its logits rows.
#[derive(Clone, Debug, Default)]
pub struct LogprobWants {
    /// Alternatives per position.
    pub top: usize,
    /// The prompt, while its log-probabilities are wanted: positions `next..prompt.len()` are still to report.
    pub prompt: Option<Vec<u32>>,
    /// The next prompt position to report (position 0 has none: nothing precedes it).
    pub next: usize,
}

impl LogprobWants {
    /// Prompt positions still to report.
    fn prompt_pending(&self) -> Option<(usize, &[u32])> {
        self.prompt.as_deref().filter(|p| self.next < p.len()).map(|p| (self.next, p))
    }

    /// The values of one row for `token`, from the raw logits.
    pub fn of(&self, row: &[f32], norm: &LogSoftmax, token: u32) -> Logprob {
        let logprob = row.get(token as usize).map_or(f32::NEG_INFINITY, |&v| norm.at(v));
        Logprob { logprob, top: norm.top(row, self.top) }
    }
}

/// What one logits row of a step is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// It samples the item's token at this offset among its sampled rows (drafts after the first).
    Sample(usize),
    /// It gives the log-probability of the prompt token at this position.
    Prompt(usize),
    /// Computed only because a later row of the item is needed (logits come as an item's last rows).
    Unused,
}

/// The rows an item needs, in the order the model returns them (its last rows): its sampled rows, and before them
/// the prompt rows `wants` has not reported yet.
pub fn rows(item: &StepItem, wants: Option<&LogprobWants>) -> Vec<RowKind> {
    let n = item.tokens.len();
    let sampled = if item.sample { 1 + item.drafts } else { 0 };
    // Row j (position start + j) predicts position start + j + 1.
    let first_prompt_row = wants.and_then(LogprobWants::prompt_pending).and_then(|(next, prompt)| {
        let first = next.max(item.start + 1) - item.start - 1;
        let last_target = (item.start + n).min(prompt.len() - 1);
        (first < n && item.start + first < last_target).then_some(first)
    });
    let from = first_prompt_row.map_or(n - sampled, |j| j.min(n - sampled));
    (from..n)
        .map(|j| {
            let target = item.start + j + 1;
            if j >= n - sampled {
                RowKind::Sample(j - (n - sampled))
            } else if wants
                .and_then(LogprobWants::prompt_pending)
                .is_some_and(|(next, p)| target >= next && target < p.len())
            {
                RowKind::Prompt(target)
            } else {
                RowKind::Unused
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(start: usize, n: usize, sample: bool, drafts: usize) -> StepItem {
        StepItem {
            seq: 1,
            start,
            tokens: (0..n as u32).collect(),
            sample,
            blocks: vec![],
            window_blocks: vec![],
            drafts,
        }
    }

    fn wants(prompt_len: usize, next: usize) -> LogprobWants {
        LogprobWants { top: 2, prompt: Some(vec![7; prompt_len]), next }
    }

    #[test]
    fn plain_items_need_only_their_sampled_rows() {
        assert_eq!(rows(&item(0, 8, false, 0), None), vec![]);
        assert_eq!(rows(&item(0, 8, true, 0), None), vec![RowKind::Sample(0)]);
        assert_eq!(rows(&item(9, 3, true, 2), None), vec![RowKind::Sample(0), RowKind::Sample(1), RowKind::Sample(2)]);
    }

    #[test]
    fn prompt_rows_cover_every_position_after_the_first_once() {
        // A 10-token prompt in chunks of 4: rows predict positions 1..=9; the last row samples.
        let w = wants(10, 1);
        assert_eq!(rows(&item(0, 4, false, 0), Some(&w)), (1..=4).map(RowKind::Prompt).collect::<Vec<_>>());
        let w = wants(10, 5);
        assert_eq!(rows(&item(4, 4, false, 0), Some(&w)), (5..=8).map(RowKind::Prompt).collect::<Vec<_>>());
        let w = wants(10, 9);
        assert_eq!(rows(&item(8, 2, true, 0), Some(&w)), vec![RowKind::Prompt(9), RowKind::Sample(0)]);
        // Recomputed after a preemption: positions already reported are not read again.
        let w = wants(10, 6);
        assert_eq!(rows(&item(4, 4, false, 0), Some(&w)), (6..=8).map(RowKind::Prompt).collect::<Vec<_>>());
        // Resumed output tokens after the prompt in the same chunk (a migration): computed, not reported.
        let w = wants(6, 1);
        assert_eq!(
            rows(&item(0, 8, true, 0), Some(&w)),
            [(1..=5).map(RowKind::Prompt).collect(), vec![RowKind::Unused, RowKind::Unused, RowKind::Sample(0)]]
                .concat()
        );
        // Everything reported: back to plain.
        let w = wants(10, 10);
        assert_eq!(rows(&item(8, 2, true, 0), Some(&w)), vec![RowKind::Sample(0)]);
        // A one-token prompt has nothing to report.
        assert_eq!(rows(&item(0, 1, true, 0), Some(&wants(1, 1))), vec![RowKind::Sample(0)]);
    }
}
