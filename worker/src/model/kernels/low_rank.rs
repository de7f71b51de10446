//! The low-rank update a LoRA adapter adds to a matrix's output rows: `out += B' (A x)` for several rows at once
//! (`B'` being `B` times the adapter's scale, stored by columns). Each row of `A` and column of `B'` is read once
//! for all the rows (punica's SGMV shape: an adapter's weights read once per step, not once per row), and every
//! row's own operations, in their order, are the same however many rows come together: the same bits alone and in
//! any batch. The factors are IEEE halves (as llama.cpp's GGUF adapters and vLLM's model-dtype adapters hold them:
//! half the bytes to read per step), widened exactly; all arithmetic is f32.

use super::blocks::f16_to_f32;
use super::math::{dot_f32, dot4_f32};

/// A low-rank update's factors, as IEEE half bits: `a` is `rank` rows of `inputs`, `bt` `rank` rows of `outputs`
/// (the scaled columns of `B`).
#[derive(Clone, Copy, Debug)]
pub struct LowRank<'a> {
    /// `A`, row-major.
    pub a: &'a [u16],
    /// `B`'s columns times the scale, one after another.
    pub bt: &'a [u16],
    /// Its rank.
    pub rank: usize,
    /// Input features.
    pub inputs: usize,
    /// Output features.
    pub outputs: usize,
}

/// Add `w`'s update to each of `rows` (row index into `x`'s rows of `inputs`, that row's output): `rank` dot
/// products per row (four at a time, each as [`dot_f32`] computes it alone), then the scaled columns of `B` added
/// in order.
pub(super) fn low_rank_rows(w: LowRank<'_>, x: &[f32], rows: &mut [(usize, &mut [f32])]) {
    let (rank, inputs) = (w.rank, w.inputs);
    let widen = |bits: &[u16]| bits.iter().map(|&h| f16_to_f32(h)).collect::<Vec<f32>>();
    let (a, bt) = (widen(w.a), widen(w.bt));
    let mut t = vec![0f32; rows.len() * rank];
    let input = |r: usize| &x[r * inputs..(r + 1) * inputs];
    // Every (row of A, batch row) pair, A's rows outermost (each read once while in cache).
    let pairs: Vec<(usize, usize)> = (0..rank).flat_map(|k| (0..rows.len()).map(move |i| (k, i))).collect();
    let a_row = |k: usize| &a[k * inputs..(k + 1) * inputs];
    let mut fours = pairs.chunks_exact(4);
    for four in &mut fours {
        let dots = dot4_f32(
            [a_row(four[0].0), a_row(four[1].0), a_row(four[2].0), a_row(four[3].0)],
            [input(rows[four[0].1].0), input(rows[four[1].1].0), input(rows[four[2].1].0), input(rows[four[3].1].0)],
        );
        for (&(k, i), v) in four.iter().zip(dots) {
            t[i * rank + k] = v;
        }
    }
    for &(k, i) in fours.remainder() {
        t[i * rank + k] = dot_f32(a_row(k), input(rows[i].0));
    }
    for (k, column) in bt.chunks_exact(w.outputs).enumerate() {
        for (i, (_, out)) in rows.iter_mut().enumerate() {
            let c = t[i * rank + k];
            out.iter_mut().zip(column).for_each(|(o, &b)| *o += c * b);
        }
    }
}

/// `values` rounded to IEEE half bits (nearest, ties to even): how [`LowRank`] factors are made.
pub fn to_half_bits(values: &[f32]) -> Vec<u16> {
    values.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect()
}

/// Fixed-seed values in [-0.5, 0.5), for tests.
#[cfg(test)]
pub(crate) fn test_values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use test_values as values;

    #[test]
    fn four_dot_products_at_once_give_each_ones_bits_alone() {
        for len in [0, 1, 7, 8, 9, 31, 64, 70] {
            let a = values(len as u64, len);
            let xs: Vec<Vec<f32>> = (0..4).map(|r| values(100 + r, len)).collect();
            let four = dot4_f32([&a, &a, &a, &a], [&xs[0], &xs[1], &xs[2], &xs[3]]);
            for (x, got) in xs.iter().zip(four) {
                assert_eq!(got.to_bits(), dot_f32(&a, x).to_bits(), "length {len}");
            }
        }
    }

    #[test]
    fn the_simd_level_adds_the_portable_codes_bits() {
        // Whole vectors and tails on both sides, one to eight rows (the four-row groups and their remainders).
        for (rank, inputs, outputs) in [(5, 72, 40), (16, 64, 104), (3, 75, 45), (1, 8, 7)] {
            for n in 1..=8 {
                let (a, bt) = (to_half_bits(&values(1, rank * inputs)), to_half_bits(&values(2, rank * outputs)));
                let x = values(3, 9 * inputs);
                let w = LowRank { a: &a, bt: &bt, rank, inputs, outputs };
                // Rows out of order and not from the start, as a task's group is.
                let picked = |i: usize| (i * 5 + 1) % 9;
                let mut portable = vec![0.25f32; n * outputs];
                let mut rows: Vec<(usize, &mut [f32])> =
                    portable.chunks_exact_mut(outputs).enumerate().map(|(i, o)| (picked(i), o)).collect();
                low_rank_rows(w, &x, &mut rows);
                let mut level = vec![0.25f32; n * outputs];
                let mut rows: Vec<(usize, &mut [f32])> =
                    level.chunks_exact_mut(outputs).enumerate().map(|(i, o)| (picked(i), o)).collect();
                super::super::low_rank_update(w, &x, &mut rows);
                let isa = super::super::Isa::current().name();
                assert_eq!(portable, level, "rank {rank}, {inputs} -> {outputs}, {n} rows at {isa}");
            }
        }
    }
}
