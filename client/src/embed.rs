//! An embeddings answer as it arrives from a worker (protocol 1.12): `Embeddings` frames in input order, then a
//! `Finish`. Sans-IO: every frame is checked against the request (in order, one width, no more vectors than
//! inputs, every input answered, the tokens the request sent) before its vectors are kept.

use zl_wire::message::{Embeddings, Finish};

/// The vectors of a finished answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedded {
    /// One unit vector per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// The inputs' tokens, as the worker counted them.
    pub input_tokens: u32,
}

/// Checks and gathers one answer's frames.
#[derive(Debug)]
pub struct Collector {
    inputs: usize,
    tokens: usize,
    dims: Option<u32>,
    vectors: Vec<Vec<f32>>,
}

impl Collector {
    /// For a request of `inputs` inputs, `tokens` tokens in all.
    pub fn new(inputs: usize, tokens: usize) -> Self {
        Collector { inputs, tokens, dims: None, vectors: Vec::with_capacity(inputs) }
    }

    /// Take one frame.
    pub fn push(&mut self, frame: Embeddings) -> Result<(), String> {
        if frame.start as usize != self.vectors.len() {
            return Err(format!("vectors from input {} arrived after {}", frame.start, self.vectors.len()));
        }
        if *self.dims.get_or_insert(frame.dims) != frame.dims {
            return Err(format!("vectors {} wide after {} wide ones", frame.dims, self.dims.unwrap_or_default()));
        }
        if self.vectors.len() + frame.count() > self.inputs {
            return Err(format!("more vectors than the {} inputs", self.inputs));
        }
        self.vectors.extend(frame.values.chunks_exact(frame.dims as usize).map(<[f32]>::to_vec));
        Ok(())
    }

    /// The answer, at its `Finish`.
    pub fn finish(self, finish: &Finish) -> Result<Embedded, String> {
        if self.vectors.len() != self.inputs {
            return Err(format!("{} vectors for {} inputs", self.vectors.len(), self.inputs));
        }
        if finish.usage.input_tokens as usize != self.tokens || finish.usage.output_tokens != 0 {
            return Err(format!(
                "usage of {} input and {} output tokens for {} tokens sent",
                finish.usage.input_tokens, finish.usage.output_tokens, self.tokens
            ));
        }
        Ok(Embedded { vectors: self.vectors, input_tokens: finish.usage.input_tokens })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zl_wire::message::{StopReason, Usage};

    fn frame(start: u32, dims: u32, count: usize) -> Embeddings {
        Embeddings { start, dims, values: vec![0.5; dims as usize * count] }
    }

    fn finish(input_tokens: u32) -> Finish {
        Finish {
            stop_reason: StopReason::EndTurn,
            stop_sequence: None,
            usage: Usage { input_tokens, ..Usage::default() },
        }
    }

    #[test]
    fn frames_in_order_make_the_answer() {
        let mut c = Collector::new(3, 12);
        c.push(frame(0, 2, 2)).unwrap();
        c.push(frame(2, 2, 1)).unwrap();
        let done = c.finish(&finish(12)).unwrap();
        assert_eq!(done.vectors, vec![vec![0.5, 0.5]; 3]);
        assert_eq!(done.input_tokens, 12);
    }

    #[test]
    fn out_of_order_mixed_width_surplus_missing_or_miscounted_answers_are_refused() {
        let mut c = Collector::new(3, 12);
        assert!(c.push(frame(1, 2, 1)).is_err());
        let mut c = Collector::new(3, 12);
        c.push(frame(0, 2, 1)).unwrap();
        assert!(c.push(frame(1, 3, 1)).is_err());
        let mut c = Collector::new(1, 12);
        assert!(c.push(frame(0, 2, 2)).is_err());
        let mut c = Collector::new(2, 12);
        c.push(frame(0, 2, 1)).unwrap();
        assert!(c.finish(&finish(12)).is_err());
        let mut c = Collector::new(1, 12);
        c.push(frame(0, 2, 1)).unwrap();
        assert!(c.finish(&finish(11)).is_err());
    }
}
