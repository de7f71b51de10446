//! Token sampling: greedy, temperature, top-k and top-p, driven by a per-request seed.
//!
//! Deterministic by construction: the random number for a sequence's n-th token is a pure function of (seed, n),
//! never of a shared generator, so a request draws the same numbers whether it runs alone or in a batch. Every tie
//! is broken by the lower token id. Pure: no IO, no clock, no global state.

use zl_common::rng::splitmix64;

/// Sampling settings of one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 is off.
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 is off.
    pub top_k: u32,
    /// The request's seed.
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Sampling { temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0 }
    }
}

/// The uniform number in [0, 1) that picks token number `step` of a request seeded with `seed`.
pub fn uniform(seed: u64, step: u64) -> f64 {
    let bits = splitmix64(splitmix64(seed) ^ splitmix64(step.wrapping_add(0x5a17)));
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

fn argmax(logits: &[f32]) -> usize {
    // The maximum over eight lanes (`f32::max` skips NaN), then its first position: both loops vectorise, where the
    // one-pass compare-and-branch below does not. Same answer: the lowest id of the largest non-NaN value.
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = logits.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            lanes[l] = lanes[l].max(c[l]);
        }
    }
    let max = tail.iter().fold(lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)), |a, &b| a.max(b));
    if max > f32::NEG_INFINITY
        && let Some(i) = logits.iter().position(|&v| v == max)
    {
        return i;
    }
    // Every value is NaN or -inf: the original rule decides.
    argmax_slow(logits)
}

fn argmax_slow(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        // `>` keeps the first (lowest id) of equal maxima; NaN never wins.
        if v > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best
}

/// The log-probability of token `index` under the model (log-softmax of the raw logits): natural log, <= 0.
pub fn log_softmax_at(logits: &[f32], index: usize) -> f32 {
    LogSoftmax::of(logits).at(logits[index])
}

/// One position's log-softmax, as the APIs report log-probabilities: of the raw logits, before any sampling
/// transform (temperature, top-k/top-p, grammar masks). Summed in f64, so a token's value is within 1e-6 of the
/// float reference's for the same logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogSoftmax {
    max: f32,
    log_sum: f64,
}

impl LogSoftmax {
    /// The normaliser of `logits` (NaN entries count as impossible).
    pub fn of(logits: &[f32]) -> Self {
        let max = logits.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().filter(|v| !v.is_nan()).map(|&v| f64::from(v - max).exp()).sum();
        LogSoftmax { max, log_sum: sum.ln() }
    }

    /// The log-probability of a token whose logit is `logit`: <= 0, `-inf` for an impossible one.
    pub fn at(&self, logit: f32) -> f32 {
        let lp = (f64::from(logit - self.max) - self.log_sum) as f32;
        if lp.is_nan() { f32::NEG_INFINITY } else { lp.min(0.0) }
    }

    /// The `k` most likely tokens and their log-probabilities, most likely first, ties by the lower id.
    pub fn top(&self, logits: &[f32], k: usize) -> Vec<(u32, f32)> {
        let k = k.min(logits.len());
        if k == 0 {
            return Vec::new();
        }
        let by_logit = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let mut cands: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &v)| (if v.is_nan() { f32::NEG_INFINITY } else { v }, i as u32))
            .collect();
        if k < cands.len() {
            cands.select_nth_unstable_by(k - 1, by_logit);
            cands.truncate(k);
        }
        cands.sort_unstable_by(by_logit);
        cands.into_iter().map(|(v, i)| (i, self.at(v))).collect()
    }
}

/// Pick the token for step `step` (0 for the first output token) of a request.
pub fn sample(logits: &[f32], params: &Sampling, step: u64) -> u32 {
    assert!(!logits.is_empty(), "empty vocabulary");
    let token = if params.temperature <= 0.0 { argmax(logits) } else { sample_random(logits, params, step) };
    token as u32
}

fn sample_random(logits: &[f32], params: &Sampling, step: u64) -> usize {
    let inv_t = 1.0 / f64::from(params.temperature);
    let max = logits.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    // Candidates as (probability weight, id), most likely first, ties by lower id.
    let mut cands: Vec<(f64, u32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (((f64::from(v) - f64::from(max)) * inv_t).exp(), i as u32))
        .collect();
    let by_weight = |a: &(f64, u32), b: &(f64, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    let k = params.top_k as usize;
    if k > 0 && k < cands.len() {
        cands.select_nth_unstable_by(k - 1, by_weight);
        cands.truncate(k);
    }
    let needs_order = params.top_p < 1.0;
    if needs_order || k > 0 {
        cands.sort_unstable_by(by_weight);
    }
    let total: f64 = cands.iter().map(|c| c.0).sum();
    if needs_order {
        let target = f64::from(params.top_p) * total;
        let mut acc = 0.0;
        let mut keep = cands.len();
        for (i, c) in cands.iter().enumerate() {
            acc += c.0;
            if acc >= target {
                keep = i + 1;
                break;
            }
        }
        cands.truncate(keep.max(1));
    }
    let total: f64 = cands.iter().map(|c| c.0).sum();
    let target = uniform(params.seed, step) * total;
    let mut acc = 0.0;
    for c in &cands {
        acc += c.0;
        if target < acc {
            return c.1 as usize;
        }
    }
    cands.last().map_or(0, |c| c.1 as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_argmax_agrees_with_the_plain_rule() {
        let mut cases: Vec<Vec<f32>> = vec![
            vec![1.0, 3.0, 3.0, 2.0],
            vec![f32::NAN, 0.5, 0.5],
            vec![f32::NAN; 9],
            vec![f32::NEG_INFINITY; 3],
            vec![-0.0, 0.0, -0.0],
            vec![f32::INFINITY, 1.0, f32::INFINITY],
        ];
        for seed in 0..50u64 {
            let n = 1 + (seed as usize * 37) % 200;
            cases.push((0..n).map(|i| ((uniform(seed, i as u64) * 8.0).floor() as f32) - 4.0).collect());
        }
        for c in &cases {
            assert_eq!(argmax(c), argmax_slow(c), "{c:?}");
        }
    }

    fn params(temperature: f32, top_p: f32, top_k: u32, seed: u64) -> Sampling {
        Sampling { temperature, top_p, top_k, seed }
    }

    #[test]
    fn top_logprobs_are_sorted_tie_broken_and_normalised() {
        let logits = [1.0, 3.0, f32::NAN, 3.0, -2.0, 0.5];
        let ls = LogSoftmax::of(&logits);
        let top = ls.top(&logits, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 0]);
        assert_eq!(top[0].1, log_softmax_at(&logits, 1));
        let total: f64 = [0, 1, 3, 4, 5].iter().map(|&i| f64::from(log_softmax_at(&logits, i)).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert_eq!(ls.at(f32::NAN), f32::NEG_INFINITY);
        assert_eq!(ls.top(&logits, 50).len(), logits.len());
        assert!(ls.top(&logits, 0).is_empty());
    }

    #[test]
    fn greedy_picks_the_first_maximum_and_its_logprob_ignores_nan() {
        let logits = [0.0, 2.0, 2.0, f32::NAN];
        let token = sample(&logits, &Sampling::greedy(), 0);
        assert_eq!(token, 1);
        // p(1) = e^2 / (e^0 + e^2 + e^2), the NaN left out.
        let expected = 2.0 - (1.0f64 + 2.0 * 2.0f64.exp()).ln();
        assert!((f64::from(log_softmax_at(&logits, 1)) - expected).abs() < 1e-6);
    }

    #[test]
    fn same_seed_and_step_give_the_same_token_different_steps_vary() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32) / 10.0).collect();
        let p = params(1.0, 1.0, 0, 42);
        let a: Vec<u32> = (0..50).map(|step| sample(&logits, &p, step)).collect();
        let b: Vec<u32> = (0..50).map(|step| sample(&logits, &p, step)).collect();
        assert_eq!(a, b);
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 5, "sampling should vary across steps: {a:?}");
        let other: Vec<u32> = (0..50).map(|step| sample(&logits, &params(1.0, 1.0, 0, 43), step)).collect();
        assert_ne!(a, other);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [1.0, 5.0, 3.0, 5.0];
        for step in 0..20 {
            assert_eq!(sample(&logits, &params(1.5, 1.0, 1, step), step), 1);
            assert_eq!(sample(&logits, &params(1.5, 0.01, 0, step), step), 1);
        }
    }

    #[test]
    fn top_k_restricts_the_candidates() {
        let logits = [3.0, 2.9, 2.8, -50.0, 2.7];
        for step in 0..200 {
            let t = sample(&logits, &params(5.0, 1.0, 2, 7), step);
            assert!(t == 0 || t == 1, "{t}");
        }
    }

    #[test]
    fn empirical_frequencies_follow_the_distribution() {
        // Probabilities 0.5, 0.25, 0.25.
        let logits = [2f32.ln() * 2.0, 2f32.ln(), 2f32.ln()];
        let mut counts = [0u32; 3];
        for step in 0..20_000 {
            counts[sample(&logits, &params(1.0, 1.0, 0, 1), step) as usize] += 1;
        }
        let f0 = f64::from(counts[0]) / 20_000.0;
        assert!((f0 - 0.5).abs() < 0.02, "{counts:?}");
    }

    #[test]
    fn uniform_is_in_range() {
        for step in 0..10_000 {
            let u = uniform(99, step);
            assert!((0.0..1.0).contains(&u));
        }
    }
}
