//! Mixture-of-experts MLPs (Mixtral, Qwen3-MoE, OLMoE): a router scores every expert for each row, the row runs
//! the `used` best, and their outputs are summed by the router's weights.
//!
//! Routing is llama.cpp's `build_moe_ffn` with softmax gating: softmax over all experts, the `used` largest
//! (ties to the lower index), optionally divided by their sum (clamped below at 2^-14, as llama.cpp clamps), then
//! scaled. The batch's rows are grouped by expert, so each chosen expert's weights are read once a step for all
//! the rows that chose it (at 16 sequences and 2 of 8 experts, each expert runs about 4 rows). Every row's result
//! is the same whatever else is in the batch: the router's scores and each expert's output for a row read only
//! that row (the matmul kernels give every row the same bits at any batch size), and a row's experts are summed
//! in its own selection order.

use super::config::{Activation, MoeConfig};
use super::kernels::{Input, Weight, exp_f32, matmul_groups, per_row};

/// One layer's experts.
#[derive(Debug)]
pub struct Experts {
    /// The router: one row of `hidden` per expert.
    pub router: Weight,
    /// Each expert's gate projection (`intermediate` x `hidden`).
    pub gate: Vec<Weight>,
    /// Each expert's up projection.
    pub up: Vec<Weight>,
    /// Each expert's down projection (`hidden` x `intermediate`).
    pub down: Vec<Weight>,
    /// A shared expert every row runs besides its chosen ones, added unweighted (llama.cpp's `ffn_*_shexp`).
    pub shared: Option<[Weight; 3]>,
}

/// The smallest sum of chosen weights divided by (f16's smallest normal number, llama.cpp's clamp).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// The experts a row of router scores picks, best first, with their weights.
pub fn route(scores: &[f32], cfg: &MoeConfig) -> Vec<(usize, f32)> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = scores.iter().map(|&s| exp_f32(s - max)).collect();
    let total: f32 = exps.iter().sum();
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Scores, not probabilities, decide the order (the same order; no ties made by rounding).
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(cfg.used);
    let mut chosen: Vec<(usize, f32)> = order.into_iter().map(|e| (e, exps[e] / total)).collect();
    if cfg.normalize {
        let sum: f32 = chosen.iter().map(|c| c.1).sum::<f32>().max(MIN_WEIGHT_SUM);
        chosen.iter_mut().for_each(|c| c.1 /= sum);
    }
    if cfg.scale != 0.0 && cfg.scale != 1.0 {
        chosen.iter_mut().for_each(|c| c.1 *= cfg.scale);
    }
    chosen
}

impl Experts {
    /// Check every matrix's shape against the layer's: `hidden` wide, `intermediate` per expert.
    pub fn check(&self, cfg: &MoeConfig, hidden: usize, intermediate: usize) -> Result<(), String> {
        let shape = |what: &str, w: &Weight, rows: usize, cols: usize| {
            if (w.rows(), w.cols()) == (rows, cols) {
                Ok(())
            } else {
                Err(format!("{what} is {}x{}, expected {rows}x{cols}", w.rows(), w.cols()))
            }
        };
        shape("router", &self.router, cfg.experts, hidden)?;
        for (what, list) in [("gate", &self.gate), ("up", &self.up), ("down", &self.down)] {
            if list.len() != cfg.experts {
                return Err(format!("{} {what} experts, expected {}", list.len(), cfg.experts));
            }
        }
        for e in 0..cfg.experts {
            shape(&format!("expert {e} gate"), &self.gate[e], intermediate, hidden)?;
            shape(&format!("expert {e} up"), &self.up[e], intermediate, hidden)?;
            shape(&format!("expert {e} down"), &self.down[e], hidden, self.gate[e].rows())?;
        }
        if let Some([g, u, d]) = &self.shared {
            shape("shared gate", g, g.rows(), hidden)?;
            shape("shared up", u, g.rows(), hidden)?;
            shape("shared down", d, hidden, g.rows())?;
        }
        Ok(())
    }

    /// Every matrix, for the memory summary.
    pub fn matrices(&self) -> impl Iterator<Item = &Weight> {
        let shared = self.shared.iter().flat_map(|s| s.iter());
        std::iter::once(&self.router).chain(self.gate.iter()).chain(&self.up).chain(&self.down).chain(shared)
    }

    /// Every matrix, mutably.
    pub fn matrices_mut(&mut self) -> impl Iterator<Item = &mut Weight> {
        let shared = self.shared.iter_mut().flat_map(|s| s.iter_mut());
        std::iter::once(&mut self.router)
            .chain(self.gate.iter_mut())
            .chain(&mut self.up)
            .chain(&mut self.down)
            .chain(shared)
    }

    /// The MLP of `n` rows of `x` (normed, `hidden` wide) into `out` (`n` x `hidden`).
    pub fn forward(&self, cfg: &MoeConfig, activation: Activation, x: &[f32], n: usize, out: &mut [f32]) {
        let hidden = self.router.cols();
        let mut scores = vec![0f32; n * cfg.experts];
        self.router.matmul(x, n, &mut scores);
        let chosen: Vec<Vec<(usize, f32)>> = scores.chunks_exact(cfg.experts).map(|s| route(s, cfg)).collect();
        // Each (row, pick) gets its expert's output row; the picks of one expert run as one batch.
        let mut picked = vec![0f32; n * cfg.used * hidden];
        let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); cfg.experts];
        for (r, picks) in chosen.iter().enumerate() {
            for (j, &(e, _)) in picks.iter().enumerate() {
                by_expert[e].push((r, j));
            }
        }
        // Every chosen expert's rows, gathered; then all their gate and up products in one parallel region, and
        // all their down products in another (not two regions per expert: at 16 sequences nearly every expert of a
        // 64-expert layer runs a row or two, and a hand-off each would cost more than its product).
        let active: Vec<(usize, &Vec<(usize, usize)>)> =
            by_expert.iter().enumerate().filter(|(_, rows)| !rows.is_empty()).collect();
        let inputs: Vec<Vec<f32>> = active
            .iter()
            .map(|(_, rows)| rows.iter().flat_map(|&(r, _)| &x[r * hidden..(r + 1) * hidden]).copied().collect())
            .collect();
        let widths: Vec<usize> = active.iter().map(|&(e, _)| self.gate[e].rows()).collect();
        let mut gates: Vec<Vec<f32>> =
            active.iter().zip(&widths).map(|((_, rows), w)| vec![0f32; rows.len() * w]).collect();
        let mut ups = gates.clone();
        let staged: Vec<Input<'_>> =
            inputs.iter().zip(&active).map(|(x, (_, rows))| Input::new(x, rows.len())).collect();
        matmul_groups(
            staged
                .iter()
                .zip(&active)
                .zip(gates.iter_mut().zip(ups.iter_mut()))
                .map(|((input, &(e, _)), (g, u))| (input, vec![(&self.gate[e], &mut g[..]), (&self.up[e], &mut u[..])]))
                .collect(),
        );
        for ((g, u), w) in gates.iter_mut().zip(&ups).zip(&widths) {
            gated(activation, g, u, *w);
        }
        let mut ys: Vec<Vec<f32>> = active.iter().map(|(_, rows)| vec![0f32; rows.len() * hidden]).collect();
        let staged: Vec<Input<'_>> =
            gates.iter().zip(&active).map(|(g, (_, rows))| Input::new(g, rows.len())).collect();
        matmul_groups(
            staged
                .iter()
                .zip(&active)
                .zip(ys.iter_mut())
                .map(|((input, &(e, _)), y)| (input, vec![(&self.down[e], &mut y[..])]))
                .collect(),
        );
        for ((_, rows), y) in active.iter().zip(&ys) {
            for (i, &(r, j)) in rows.iter().enumerate() {
                let at = (r * cfg.used + j) * hidden;
                picked[at..at + hidden].copy_from_slice(&y[i * hidden..(i + 1) * hidden]);
            }
        }
        let shared = self.shared.as_ref().map(|[g, u, d]| mlp(g, u, d, activation, x, n));
        per_row(out, hidden, |r, o| {
            o.fill(0.0);
            for (j, &(_, w)) in chosen[r].iter().enumerate() {
                let at = (r * cfg.used + j) * hidden;
                o.iter_mut().zip(&picked[at..at + hidden]).for_each(|(o, y)| *o += w * y);
            }
            if let Some(s) = &shared {
                o.iter_mut().zip(&s[r * hidden..(r + 1) * hidden]).for_each(|(o, y)| *o += y);
            }
        });
    }
}

/// A gated MLP over `n` rows: `down(act(gate x) * up x)`.
pub(crate) fn mlp(gate: &Weight, up: &Weight, down: &Weight, activation: Activation, x: &[f32], n: usize) -> Vec<f32> {
    let im = gate.rows();
    let (mut g, mut u) = (vec![0f32; n * im], vec![0f32; n * im]);
    Input::new(x, n).matmul(vec![(gate, &mut g), (up, &mut u)]);
    gated(activation, &mut g, &u, im);
    let mut out = vec![0f32; n * down.rows()];
    down.matmul(&g, n, &mut out);
    out
}

/// `gate = act(gate) * up`, row by row (rows of `width`).
pub(crate) fn gated(activation: Activation, gate: &mut [f32], up: &[f32], width: usize) {
    per_row(gate, width, |r, g| {
        g.iter_mut().zip(&up[r * width..(r + 1) * width]).for_each(|(g, u)| *g = activate(activation, *g) * u)
    });
}

/// A gate value through `activation`, from IEEE operations only (the same bits on every machine).
#[inline(always)]
pub(crate) fn activate(activation: Activation, g: f32) -> f32 {
    match activation {
        Activation::Silu => g / (1.0 + exp_f32(-g)),
        Activation::GeluTanh => {
            // tanh(y) = 1 - 2 / (e^(2y) + 1).
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            let y = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
            0.5 * g * (2.0 - 2.0 / (exp_f32(2.0 * y) + 1.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(normalize: bool) -> MoeConfig {
        MoeConfig { experts: 4, used: 2, normalize, scale: 1.0 }
    }

    #[test]
    fn routing_picks_the_best_scores_with_softmax_weights_as_llama_cpp_does() {
        let scores = [0.5, 2.0, -1.0, 1.0];
        let z: f32 = scores.iter().map(|s: &f32| (s - 2.0).exp()).sum();
        let chosen = route(&scores, &cfg(false));
        assert_eq!(chosen.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 3]);
        assert!((chosen[0].1 - 1.0 / z).abs() < 1e-6 && (chosen[1].1 - (-1f32).exp() / z).abs() < 1e-6);
        // Normalized: the two weights sum to one, in the same ratio.
        let normed = route(&scores, &cfg(true));
        assert!((normed[0].1 + normed[1].1 - 1.0).abs() < 1e-6);
        assert!((normed[0].1 / normed[1].1 - 1f32.exp()).abs() < 1e-4);
        // Ties go to the lower index; the scale multiplies.
        let tied = route(&[1.0, 1.0, 1.0, 1.0], &MoeConfig { scale: 2.0, ..cfg(true) });
        assert_eq!(tied, [(0, 1.0), (1, 1.0)]);
    }

    fn experts(seed: &mut u64) -> Experts {
        let mut w = |rows: usize, cols: usize| {
            let values = (0..rows * cols)
                .map(|_| {
                    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5
                })
                .collect();
            Weight::from_f32(rows, cols, values).unwrap()
        };
        let (h, im) = (8, 12);
        Experts {
            router: w(4, h),
            gate: (0..4).map(|_| w(im, h)).collect(),
            up: (0..4).map(|_| w(im, h)).collect(),
            down: (0..4).map(|_| w(h, im)).collect(),
            shared: None,
        }
    }

    #[test]
    fn a_row_gets_its_chosen_experts_weighted_sum_whatever_else_is_in_the_batch() {
        let ex = experts(&mut 7);
        let c = cfg(true);
        ex.check(&c, 8, 12).unwrap();
        let x: Vec<f32> = (0..5 * 8).map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0).collect();
        let mut all = vec![0f32; 5 * 8];
        ex.forward(&c, Activation::Silu, &x, 5, &mut all);
        for r in 0..5 {
            let row = &x[r * 8..(r + 1) * 8];
            // Alone, the same bits.
            let mut alone = vec![0f32; 8];
            ex.forward(&c, Activation::Silu, row, 1, &mut alone);
            assert_eq!(alone, all[r * 8..(r + 1) * 8], "row {r}");
            // And what the definition says: the chosen experts' MLPs, weighted.
            let mut scores = vec![0f32; 4];
            ex.router.matmul(row, 1, &mut scores);
            let mut want = vec![0f32; 8];
            for (e, w) in route(&scores, &c) {
                let y = mlp(&ex.gate[e], &ex.up[e], &ex.down[e], Activation::Silu, row, 1);
                want.iter_mut().zip(&y).for_each(|(o, y)| *o += w * y);
            }
            assert_eq!(want, alone);
        }
    }

    #[test]
    fn a_misshapen_expert_is_named() {
        let mut ex = experts(&mut 3);
        ex.down.pop();
        assert!(ex.check(&cfg(true), 8, 12).unwrap_err().contains("3 down experts, expected 4"));
    }
}
