//! A thinking budget: a reasoning model's section (`<think>` ... `</think>`) closed by force once the request's
//! budget of output tokens is spent and the model has not closed it itself. Pure: it reads the answer's text as
//! it is produced, says when to write the closing tokens, and when the answer after the section has begun (a
//! request's grammar constrains only that).

use zl_wire::message::ThinkBudget;

/// One sequence's budget, while its section is open.
#[derive(Debug)]
pub struct Think {
    budget: ThinkBudget,
    /// The end of the text so far, as long as the end marker (it may arrive split across tokens).
    tail: String,
    /// The section's end marker was written (by the model, or as the forced closing).
    closed: bool,
    /// The forced closing was queued.
    queued: bool,
    /// Tokens of the forced closing not written yet.
    pending: usize,
}

impl Think {
    /// A budget not spent yet.
    pub fn new(budget: ThinkBudget) -> Self {
        Think { budget, tail: String::new(), closed: false, queued: false, pending: 0 }
    }

    /// More of the answer's text.
    pub fn read(&mut self, text: &str) {
        if self.closed || text.is_empty() {
            return;
        }
        self.tail.push_str(text);
        if self.tail.contains(&self.budget.end) {
            self.closed = true;
            self.tail.clear();
            return;
        }
        let keep = self.budget.end.len();
        if self.tail.len() > keep {
            let mut cut = self.tail.len() - keep;
            while !self.tail.is_char_boundary(cut) {
                cut -= 1;
            }
            self.tail.drain(..cut);
        }
    }

    /// One more output token was written (after its text was read).
    pub fn wrote(&mut self) {
        self.pending = self.pending.saturating_sub(1);
    }

    /// Whether the section is open past its budget after `generated` output tokens.
    pub fn spent(&self, generated: u32) -> bool {
        !self.closed && !self.queued && generated >= self.budget.budget
    }

    /// The tokens to write now, once: when the budget is spent and the section still open.
    pub fn due(&mut self, generated: u32) -> Option<Vec<u32>> {
        if !self.spent(generated) {
            return None;
        }
        self.queued = true;
        self.pending = self.budget.close.len();
        Some(self.budget.close.clone())
    }

    /// Whether the answer after the section has begun: the end marker is written and so is all of a forced
    /// closing (what it writes after the marker is still the section's).
    pub fn answering(&self) -> bool {
        self.closed && self.pending == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn think(budget: u32) -> Think {
        Think::new(ThinkBudget { budget, end: "</think>".into(), close: vec![7, 8] })
    }

    #[test]
    fn closes_once_when_the_budget_is_spent() {
        let mut t = think(3);
        t.read("<think>\nhm");
        assert_eq!(t.due(2), None);
        assert_eq!(t.due(3), Some(vec![7, 8]));
        assert_eq!(t.due(4), None, "once");
        assert!(!t.spent(9));
        // The answer begins once the closing is written and its marker read.
        t.wrote();
        assert!(!t.answering());
        t.read("\n</think>");
        t.wrote();
        assert!(t.answering());
    }

    #[test]
    fn a_model_that_closes_it_itself_is_left_alone() {
        let mut t = think(3);
        // The marker split across tokens, after multi-byte text.
        for piece in ["<think>é", "</th", "ink", ">\n\nAnswer"] {
            t.read(piece);
        }
        assert_eq!(t.due(10), None);
        let mut t = think(3);
        t.read("ééééééééé<");
        t.read("/think>");
        assert!(!t.spent(5));
    }
}
