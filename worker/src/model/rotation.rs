//! The Walsh-Hadamard rotation of a 4-bit KV cache (llama.cpp rotates its quantized caches the same way): keys,
//! queries and values are turned by an orthonormal Hadamard matrix `H` per head before the cache rounds them, which
//! spreads a head's few large channels over all of its values, so a block's one scale fits them all far better.
//! Scores are unchanged, `(Hq) . (Hk) = q . k`; the values' weighted sum comes out turned, `sum w (Hv) = H (sum w v)`,
//! and `H` undoes itself (`H H = I`, symmetric), so the attention output is turned back by `H` again. Each row is
//! turned by itself, in a fixed order: batch invariance holds.

/// Width of the keys' and queries' rotation for heads `head_dim` wide: the largest power of two dividing it (the
/// whole head for every released model's 64, 128 and 256). Values turn in runs of at most 64, as llama.cpp's do
/// (smaller rotations measured better for values there).
pub fn width(head_dim: usize) -> usize {
    1 << head_dim.trailing_zeros()
}

/// Turn each run of `n` values of `x` (`n` a power of two dividing its length) by the orthonormal Hadamard matrix.
pub fn turn(x: &mut [f32], n: usize) {
    let scale = 1.0 / (n as f32).sqrt();
    for run in x.chunks_exact_mut(n) {
        let mut len = 1;
        while len < n {
            for i in (0..n).step_by(2 * len) {
                for j in i..i + len {
                    let (a, b) = (run[j], run[j + len]);
                    run[j] = a + b;
                    run[j + len] = a - b;
                }
            }
            len *= 2;
        }
        run.iter_mut().for_each(|v| *v *= scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rotation_keeps_dot_products_and_undoes_itself() {
        let q: Vec<f32> = (0..128).map(|i| ((i * 37 % 17) as f32 - 8.0) / 3.0).collect();
        let k: Vec<f32> = (0..128).map(|i| if i == 5 { 40.0 } else { ((i * 11 % 7) as f32 - 3.0) / 5.0 }).collect();
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let (mut qr, mut kr) = (q.clone(), k.clone());
        turn(&mut qr, 128);
        turn(&mut kr, 128);
        assert!((dot(&qr, &kr) - dot(&q, &k)).abs() < 1e-3 * dot(&q, &k).abs().max(1.0));
        // The outlier is spread: no turned value is near 40.
        assert!(kr.iter().all(|v| v.abs() < 5.0), "{kr:?}");
        turn(&mut kr, 128);
        assert!(kr.iter().zip(&k).all(|(a, b)| (a - b).abs() < 1e-4));
        assert_eq!((width(64), width(128), width(96), width(80)), (64, 128, 32, 16));
    }
}
