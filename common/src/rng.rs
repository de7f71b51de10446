//! SplitMix64: the one seeded pseudo-random source of the project. The worker's sampling draws its per-token uniform
//! numbers from [`splitmix64`] (so a seed gives the same tokens in any batch), and `zl bench` draws its workloads
//! and arrival times from a [`SplitMix`] stream (so a seed gives the same benchmark on any machine). Not for secrets.

/// One SplitMix64 step: the increment, then the finaliser (full avalanche: nearby inputs give unrelated outputs).
#[inline]
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded stream of pseudo-random numbers.
#[derive(Clone, Debug)]
pub struct SplitMix {
    state: u64,
}

impl SplitMix {
    /// A stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix { state: seed }
    }

    /// A stream for item `index` of a stream family seeded with `seed`: independent of the other items, so item 17
    /// is the same whether or not items 0 to 16 were drawn.
    pub fn for_item(seed: u64, index: u64) -> Self {
        SplitMix { state: splitmix64(seed ^ splitmix64(index.wrapping_add(0x6a09_e667))) }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let out = splitmix64(self.state);
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        out
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n` > 0; the modulo bias is below 2^-40 for any `n` under 2^24).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Exponentially distributed with this mean (the gaps between Poisson arrivals).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.uniform()).ln()
    }

    /// Normally distributed (Box-Muller).
    pub fn normal(&mut self, mean: f64, std_dev: f64) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        mean + std_dev * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_independent_items() {
        // The reference SplitMix64 sequence for seed 0.
        let mut r = SplitMix::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(SplitMix::for_item(7, 3).next_u64(), SplitMix::for_item(7, 3).next_u64());
        assert_ne!(SplitMix::for_item(7, 3).next_u64(), SplitMix::for_item(7, 4).next_u64());
    }

    #[test]
    fn distributions_have_their_moments() {
        let mut r = SplitMix::new(42);
        let n = 200_000;
        let (mut e, mut g, mut g2, mut u) = (0.0, 0.0, 0.0, 0.0);
        for _ in 0..n {
            e += r.exponential(2.0);
            let x = r.normal(10.0, 3.0);
            g += x;
            g2 += x * x;
            let v = r.uniform();
            assert!((0.0..1.0).contains(&v));
            u += v;
        }
        let n = f64::from(n);
        assert!((e / n - 2.0).abs() < 0.03, "{}", e / n);
        assert!((g / n - 10.0).abs() < 0.03, "{}", g / n);
        assert!(((g2 / n - (g / n).powi(2)).sqrt() - 3.0).abs() < 0.03);
        assert!((u / n - 0.5).abs() < 0.01);
        assert!((0..1000).all(|_| r.below(7) < 7));
    }
}
