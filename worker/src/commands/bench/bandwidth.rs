//! The memory-bandwidth ceiling of decoding: one sequence's decode step reads every weight once, so nothing decodes
//! one sequence faster than (read bandwidth) / (weights bytes) tokens per second. Measured with the engine's own
//! threads (rayon's pool, as the kernels use it) reading a buffer the size of the weights, each task a contiguous
//! share folded in 64-bit lanes (vectorized loads; the result is kept, so the reads cannot be optimized away), once
//! as plain loads and once hinting each line into L1 4 KiB ahead as the kernels hint their weights: the faster of
//! the two (on this project's VMs the hinted read was 1.2-2x the plain one, and the kernels would otherwise read
//! "faster than the ceiling").

use std::time::Instant;

use rayon::prelude::*;

use zl_worker::model::kernels::prefetch_ahead;

/// What one sequence's decoding could reach at most.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ceiling {
    /// Read bandwidth, GB/s (10^9 bytes).
    pub(crate) gb_per_s: f64,
    /// `bandwidth / weights`: decode steps per second with every weight read once per step.
    pub(crate) tokens_per_s: f64,
}

/// Buffers larger than this are not needed to measure main-memory bandwidth (far past every cache), and a
/// weights-sized copy of a large model could exhaust the memory the model itself needs.
const MAX_BUFFER: usize = 1 << 30;

/// How far ahead of its loads the hinted read fetches (the kernels' distance for Q4_1: 32 blocks of 128 bytes).
const AHEAD: usize = 4096;

/// The best of a few reads of a `bytes`-sized buffer (at most [`MAX_BUFFER`]; after one read that faults its
/// pages in), plain and hinted in turn, and the ceiling for `bytes` of weights.
pub(crate) fn measure(bytes: usize) -> Ceiling {
    let words = (bytes.min(MAX_BUFFER) / 8).max(1 << 16);
    let buf: Vec<u64> = (0..words as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    let chunk = words.div_ceil(rayon::current_num_threads() * 4).max(1024);
    let mut best = f64::INFINITY;
    for round in 0..8 {
        let hinted = round % 2 == 1;
        let started = Instant::now();
        let folded = buf
            .par_chunks(chunk)
            .map(|c| {
                // Eight independent lanes (a cache line): the loop is bound by loads, not by one xor chain.
                let mut lanes = [0u64; 8];
                for line in c.chunks_exact(8) {
                    if hinted {
                        prefetch_ahead(line, AHEAD);
                    }
                    for (l, x) in lanes.iter_mut().zip(line) {
                        *l ^= *x;
                    }
                }
                lanes.iter().fold(0, |a, l| a ^ l) ^ c.chunks_exact(8).remainder().iter().fold(0, |a, x| a ^ x)
            })
            .reduce(|| 0, |a, b| a ^ b);
        std::hint::black_box(folded);
        if round > 0 {
            best = best.min(started.elapsed().as_secs_f64());
        }
    }
    let read = (words * 8) as f64;
    Ceiling { gb_per_s: read / best / 1e9, tokens_per_s: read / best / bytes.max(1) as f64 }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_ceiling_is_bandwidth_over_bytes() {
        let c = super::measure(8 << 20);
        assert!(c.gb_per_s > 0.0 && c.gb_per_s.is_finite());
        // 8 MiB read at gb_per_s: tokens_per_s steps of 8 MiB each.
        let expect = c.gb_per_s * 1e9 / f64::from(8u32 << 20);
        assert!((c.tokens_per_s / expect - 1.0).abs() < 1e-9, "{c:?}");
    }
}
