//! OpenAI's logit adjustments on one row before it is sampled: `logit_bias`, then the frequency and presence
//! penalties over the tokens the sequence has output, then `min_p` (relative to the likeliest token after
//! temperature). A pure function of the row, the settings and the sequence's own counts, so a penalized request
//! samples alike alone and in any batch, and after a migration (the counts are rebuilt from the tokens replayed).

use std::collections::HashMap;

use zl_wire::message::Penalties;

/// A sequence's settings and the times each token was output.
#[derive(Clone, Debug, Default)]
pub struct Penalized {
    /// The settings.
    pub settings: Penalties,
    /// Output tokens and how many times each came.
    pub counts: HashMap<u32, u32>,
}

impl Penalized {
    /// Settings with nothing output yet.
    pub fn new(settings: Penalties) -> Self {
        Penalized { settings, counts: HashMap::new() }
    }

    /// A token was output.
    pub fn saw(&mut self, token: u32) {
        *self.counts.entry(token).or_default() += 1;
    }

    /// Adjust `row` (logits over the vocabulary) for sampling at `temperature`.
    pub fn apply(&self, row: &mut [f32], temperature: f32) {
        let p = &self.settings;
        for &(id, bias) in &p.logit_bias {
            if let Some(v) = row.get_mut(id as usize) {
                *v += bias;
            }
        }
        if p.frequency != 0.0 || p.presence != 0.0 {
            for (&id, &n) in &self.counts {
                if let Some(v) = row.get_mut(id as usize) {
                    *v -= p.frequency * n as f32 + p.presence;
                }
            }
        }
        if p.min_p > 0.0 && temperature > 0.0 {
            // p_i >= min_p * p_max  <=>  (l_i - l_max) / T >= ln(min_p).
            let max = row.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
            let floor = max + temperature * p.min_p.ln();
            for v in row.iter_mut() {
                if *v < floor {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(settings: Penalties) -> Penalized {
        Penalized::new(settings)
    }

    #[test]
    fn bias_penalties_and_min_p_as_openai_and_vllm_define_them() {
        let mut p = with(Penalties {
            frequency: 0.5,
            presence: 1.0,
            logit_bias: vec![(0, -100.0), (3, 2.0)],
            ..Default::default()
        });
        p.saw(1);
        p.saw(1);
        p.saw(2);
        let mut row = [1.0f32, 1.0, 1.0, 1.0];
        p.apply(&mut row, 1.0);
        assert_eq!(row, [-99.0, 1.0 - 2.0, 1.0 - 1.5, 3.0]);
        // min_p 0.5 at temperature 1: tokens under half the likeliest's probability go.
        let p = with(Penalties { min_p: 0.5, ..Default::default() });
        let mut row = [0.0f32, -0.5, -1.0, 0.0];
        p.apply(&mut row, 1.0);
        assert_eq!(row, [0.0, -0.5, f32::NEG_INFINITY, 0.0]);
        // Greedy ignores min_p (the likeliest is kept either way).
        let mut row = [0.0f32, -5.0];
        p.apply(&mut row, 0.0);
        assert_eq!(row, [0.0, -5.0]);
        // Ids past the vocabulary change nothing (the worker refuses them up front).
        let p = with(Penalties { logit_bias: vec![(9, 5.0)], ..Default::default() });
        let mut row = [1.0f32];
        p.apply(&mut row, 1.0);
        assert_eq!(row, [1.0]);
    }
}
