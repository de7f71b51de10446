//! Rotary position embeddings' tables: each position's cosines and sines for one base frequency and one
//! long-context scaling (none, linear, Llama 3.1's, or per-frequency factors from a GGUF file). A leaf of the
//! model: the forward pass reads the tables, nothing here runs per step.

/// RoPE frequency scaling for long contexts.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    #[default]
    None,
    /// Positions divided by `factor` (`rope_scaling.type = linear`).
    Linear {
        /// The stretch.
        factor: f32,
    },
    /// Llama 3.1's scaling (`rope_type = llama3`): low frequencies divided by `factor`, high ones kept, a smooth
    /// blend between.
    Llama3 {
        /// The stretch of the low frequencies.
        factor: f32,
        /// Wavelengths above `original_context / low_freq_factor` are stretched fully.
        low_freq_factor: f32,
        /// Wavelengths below `original_context / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// The pretraining context.
        original_context: usize,
    },
    /// Each frequency divided by its own factor (GGUF's `rope_freqs.weight`, where llama.cpp's converter writes
    /// Llama 3.1's scaling out).
    Factors(Vec<f32>),
    /// Phi-3's LongRoPE: each frequency divided by its own factor (the short factors for a context within the
    /// pretraining one, the long factors past it, chosen at load as llama.cpp does), and every cosine and sine
    /// multiplied by `mscale` (`rope.scaling.attn_factor`; Hugging Face's `sqrt(1 + ln(s) / ln(original))`).
    LongRope {
        /// One factor per frequency.
        factors: Vec<f32>,
        /// The cosines' and sines' scale.
        mscale: f32,
    },
    /// YaRN (Qwen's long-context setting, `rope_scaling.type = yarn`): each frequency a blend of itself
    /// (extrapolation, for those that turn many times within the pretraining context: more than `beta_fast`) and
    /// of itself divided by `factor` (interpolation, for those turning fewer than `beta_slow` times), linear in the
    /// frequency's index between; cosines and sines times `mscale` (`0.1 ln(factor) + 1` unless the file says).
    /// llama.cpp's `rope_yarn` and Hugging Face's `_compute_yarn_parameters` compute the same.
    Yarn {
        /// The stretch.
        factor: f32,
        /// The pretraining context.
        original_context: usize,
        /// Turns within the pretraining context above which a frequency is kept (default 32).
        beta_fast: f32,
        /// Turns below which a frequency is fully interpolated (default 1).
        beta_slow: f32,
        /// The cosines' and sines' scale.
        mscale: f32,
    },
}

impl RopeScaling {
    /// Frequency `i` of `head_dim / 2` (base `theta`) after scaling.
    fn apply(&self, i: usize, freq: f64, theta: f64, head_dim: usize) -> f64 {
        match self {
            RopeScaling::None => freq,
            RopeScaling::Linear { factor } => freq / f64::from(*factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
                let (factor, low, high) =
                    (f64::from(*factor), f64::from(*low_freq_factor), f64::from(*high_freq_factor));
                let original = *original_context as f64;
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < original / high {
                    freq
                } else if wavelen > original / low {
                    freq / factor
                } else {
                    let smooth = (original / wavelen - low) / (high - low);
                    (1.0 - smooth) * freq / factor + smooth * freq
                }
            }
            RopeScaling::Factors(f) | RopeScaling::LongRope { factors: f, .. } => {
                freq / f64::from(f.get(i).copied().unwrap_or(1.0))
            }
            RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, .. } => {
                // The frequency index that turns `turns` times within the pretraining context.
                let dims = head_dim as f64;
                let index = |turns: f32| {
                    dims * (*original_context as f64 / (f64::from(turns) * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * theta.ln())
                };
                let low = index(*beta_fast).floor().max(0.0);
                let high = index(*beta_slow).ceil().min(dims - 1.0);
                let ramp = ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                freq / f64::from(*factor) * (1.0 - keep) + freq * keep
            }
        }
    }

    /// The per-frequency factors, where the scaling has them.
    pub(crate) fn factors(&self) -> Option<&[f32]> {
        match self {
            RopeScaling::Factors(f) | RopeScaling::LongRope { factors: f, .. } => Some(f),
            _ => None,
        }
    }

    /// What every cosine and sine is multiplied by.
    fn mscale(&self) -> f64 {
        match self {
            RopeScaling::LongRope { mscale, .. } | RopeScaling::Yarn { mscale, .. } => f64::from(*mscale),
            _ => 1.0,
        }
    }
}

/// Positions per step of [`RopeTable`]'s coarse table.
const FINE: usize = 256;

/// The cosines and sines of every position's RoPE angles up to the context length, from two small f64 tables
/// (`angle(pos) = angle(256 * (pos / 256)) + angle(pos % 256)`, combined by the angle-sum identities): about 400 KB
/// for a 32k context of 128-wide heads, where the full f32 tables take 32 MiB per RoPE base. A pure function of
/// the position, so batch-invariant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RopeTable {
    half: usize,
    positions: usize,
    /// `(cos, sin)` of `256 * p * freq[i]`, `[p][i]`.
    coarse: Vec<(f64, f64)>,
    /// `(cos, sin)` of `p * freq[i]` for `p < 256`, `[p][i]`.
    fine: Vec<(f64, f64)>,
    /// Every cosine and sine multiplied by this (1 but for LongRoPE).
    mscale: f64,
}

impl RopeTable {
    /// The table for heads of `head_dim`, base `theta`, `positions` positions and `scaling`.
    pub(crate) fn new(theta: f32, head_dim: usize, positions: usize, scaling: &RopeScaling) -> RopeTable {
        let half = head_dim / 2;
        let base = f64::from(theta);
        let freqs: Vec<f64> = (0..half)
            .map(|i| scaling.apply(i, base.powf(-(2.0 * i as f64) / head_dim as f64), base, head_dim))
            .collect();
        let angles = |step: usize, count: usize| -> Vec<(f64, f64)> {
            (0..count)
                .flat_map(|p| freqs.iter().map(move |f| ((p * step) as f64 * f).sin_cos()))
                .map(|(s, c)| (c, s))
                .collect()
        };
        RopeTable {
            half,
            positions,
            coarse: angles(FINE, positions.div_ceil(FINE)),
            fine: angles(1, FINE),
            mscale: scaling.mscale(),
        }
    }

    /// Position `pos`'s cosines and sines into `cos` and `sin` (`head_dim / 2` each).
    #[inline]
    pub(crate) fn at(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let (h, half) = (pos / FINE, self.half);
        let coarse = &self.coarse[h * half..(h + 1) * half];
        let fine = &self.fine[(pos % FINE) * half..(pos % FINE + 1) * half];
        let m = self.mscale;
        for (i, (&(cc, cs), &(fc, fs))) in coarse.iter().zip(fine).enumerate() {
            cos[i] = ((cc * fc - cs * fs) * m) as f32;
            sin[i] = ((cs * fc + cc * fs) * m) as f32;
        }
    }

    /// The full tables, `cos[pos * head_dim / 2 + i]` (for a device that reads them whole).
    pub fn full(&self) -> (Vec<f32>, Vec<f32>) {
        let (mut cos, mut sin) = (vec![0f32; self.positions * self.half], vec![0f32; self.positions * self.half]);
        for pos in 0..self.positions {
            let at = pos * self.half..(pos + 1) * self.half;
            self.at(pos, &mut cos[at.clone()], &mut sin[at]);
        }
        (cos, sin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_frequencies_and_stretches_low_ones() {
        let s =
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192 };
        // Wavelength 2 pi: far below 8192 / 4, kept.
        assert_eq!(s.apply(0, 1.0, 1e4, 128), 1.0);
        // Wavelength 2 pi * 10^4: above 8192, divided by the factor.
        assert!((s.apply(0, 1e-4, 1e4, 128) - 1e-4 / 8.0).abs() < 1e-12);
        // Between: a blend, monotonic in the frequency, continuous at both ends.
        let edge = |wavelen: f64| s.apply(0, 2.0 * std::f64::consts::PI / wavelen, 1e4, 128) * wavelen;
        assert!((edge(2048.0 - 1e-6) - edge(2048.0 + 1e-6)).abs() < 1e-3);
        assert!((edge(8192.0 - 1e-6) - edge(8192.0 + 1e-6)).abs() < 1e-3);
        let (a, b) = (s.apply(0, 2e-3, 1e4, 128), s.apply(0, 1e-3, 1e4, 128));
        assert!(a > b && a < 2e-3 && b > 1e-3 / 8.0);
    }

    #[test]
    fn linear_scaling_divides_positions() {
        let (c1, s1) = RopeTable::new(10_000.0, 8, 9, &RopeScaling::Linear { factor: 4.0 }).full();
        let (c2, s2) = RopeTable::new(10_000.0, 8, 3, &RopeScaling::None).full();
        // Position 8 stretched by 4 is position 2 unscaled.
        assert!((c1[8 * 4 + 1] - c2[2 * 4 + 1]).abs() < 1e-6 && (s1[8 * 4 + 3] - s2[2 * 4 + 3]).abs() < 1e-6);
    }

    #[test]
    fn longrope_divides_each_frequency_by_its_factor_and_scales_cos_and_sin() {
        let factors = vec![1.0, 2.0, 4.0, 8.0];
        let (c1, s1) = RopeTable::new(10_000.0, 8, 17, &RopeScaling::LongRope { factors, mscale: 1.2 }).full();
        let (c2, s2) = RopeTable::new(10_000.0, 8, 17, &RopeScaling::None).full();
        // Frequency 3 divided by 8: position 16 there is position 2 plain; every value times 1.2.
        assert!(
            (c1[16 * 4 + 3] - 1.2 * c2[2 * 4 + 3]).abs() < 1e-6 && (s1[16 * 4 + 3] - 1.2 * s2[2 * 4 + 3]).abs() < 1e-6
        );
        assert!((c1[5 * 4] - 1.2 * c2[5 * 4]).abs() < 1e-6, "factor 1 keeps frequency 0");
    }

    #[test]
    fn yarn_keeps_fast_frequencies_interpolates_slow_ones_and_blends_between() {
        // Qwen3's published setting: factor 4 over a 32,768-token pretraining context, base 10^6, heads of 128.
        let s = RopeScaling::Yarn {
            factor: 4.0,
            original_context: 32_768,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0 + 0.1 * 4f32.ln(),
        };
        let (theta, dims) = (1e6f64, 128);
        let freq = |i: usize| theta.powf(-(2.0 * i as f64) / dims as f64);
        // The ramp's ends, as llama.cpp's ggml_rope_yarn_corr_dims puts them for these values: 23 and 40 (of 63).
        let corr =
            |turns: f64| dims as f64 * (32_768.0 / (turns * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
        assert_eq!((corr(32.0).floor(), corr(1.0).ceil()), (23.0, 40.0));
        for i in 0..=23 {
            assert_eq!(s.apply(i, freq(i), theta, dims), freq(i), "index {i} is kept");
        }
        for i in 40..64 {
            assert!((s.apply(i, freq(i), theta, dims) - freq(i) / 4.0).abs() < 1e-15, "index {i} is interpolated");
        }
        // Index 31 is 8/17 of the way: kept 9/17, interpolated 8/17.
        let mid = s.apply(31, freq(31), theta, dims) / freq(31);
        assert!((mid - (9.0 / 17.0 + 8.0 / 17.0 / 4.0)).abs() < 1e-12, "8/17 of the way: {mid}");
        // Cosines and sines scaled by 1 + 0.1 ln 4.
        let (c, _) = RopeTable::new(1e6, 128, 2, &s).full();
        assert!((f64::from(c[0]) - (1.0 + 0.1 * 4f64.ln())).abs() < 1e-6, "{}", c[0]);
    }

    #[test]
    fn the_two_level_table_matches_the_direct_angles() {
        let table = RopeTable::new(1_000_000.0, 128, 40_000, &RopeScaling::None);
        let (mut cos, mut sin) = ([0f32; 64], [0f32; 64]);
        for pos in [0, 1, 255, 256, 257, 4095, 32_767, 39_999] {
            table.at(pos, &mut cos, &mut sin);
            for i in 0..64 {
                let angle = pos as f64 * 1_000_000f64.powf(-(2.0 * i as f64) / 128.0);
                assert!((f64::from(cos[i]) - angle.cos()).abs() < 1e-6, "cos, position {pos}, {i}");
                assert!((f64::from(sin[i]) - angle.sin()).abs() < 1e-6, "sin, position {pos}, {i}");
            }
        }
    }
}
