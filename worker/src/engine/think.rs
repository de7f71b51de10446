//! A thinking budget: a reasoning model's section (`<think>` ... `</think>`) closed by force once the request's
//! budget of output tokens is spent and the model has not closed it itself. Pure: it reads the answer's text as
//! it is produced and says when to write the closing tokens.

use zl_wire::message::ThinkBudget;

/// One sequence's budget, while its section is open.
#[derive(Debug)]
pub struct Think {
    budget: ThinkBudget,
    /// The end of the text so far, as long as the end marker (it may arrive split across tokens).
    tail: String,
    /// The section is closed (by the model, or the closing was queued).
    closed: bool,
}

impl Think {
    /// A budget not spent yet.
    pub fn new(budget: ThinkBudget) -> Self {
        Think { budget, tail: String::new(), closed: false }
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

    /// Whether the section is open past its budget after `generated` output tokens.
    pub fn spent(&self, generated: u32) -> bool {
        !self.closed && generated >= self.budget.budget
    }

    /// The tokens to write now, once: when the budget is spent and the section still open.
    pub fn due(&mut self, generated: u32) -> Option<Vec<u32>> {
        if !self.spent(generated) {
            return None;
        }
        self.closed = true;
        Some(self.budget.close.clone())
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
