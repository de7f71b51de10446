//! Kernel micro-benchmark: one Q4_1 matmul of the default model's FFN shape at batch 1 and 16, side by side.
//! `cargo bench -p zl-worker --bench kernels`

use std::time::Instant;
use zl_worker::model::kernels::Weight;

fn main() {
    let (rows, cols) = (1536usize, 576usize);
    let blocks = rows * cols / 32;
    let mut seed = 1u64;
    let mut next = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    let mut raw = Vec::with_capacity(blocks * 20);
    for _ in 0..blocks {
        raw.extend(half::f16::from_f32(0.01).to_le_bytes());
        raw.extend(half::f16::from_f32(-0.07).to_le_bytes());
        raw.extend((0..16).map(|_| next() as u8));
    }
    let w = Weight::from_q4_1(rows, cols, &raw).expect("weight");
    let threads = rayon::current_num_threads();
    println!("Q4_1 {rows}x{cols}, rayon threads {threads}");
    let mut base = 0.0;
    let sizes: Vec<usize> = std::env::var("ZL_KERNEL_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect())
        .unwrap_or(vec![1, 4, 16, 32]);
    for n in sizes {
        let x: Vec<f32> = (0..n * cols).map(|_| (next() % 1000) as f32 / 500.0 - 1.0).collect();
        let mut out = vec![0f32; n * rows];
        let iters = 2000 / n.max(1) + 50;
        w.matmul(&x, n, &mut out);
        // Best of five rounds: this is a shared, noisy machine.
        let per = (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..iters {
                    w.matmul(&x, n, &mut out);
                }
                t.elapsed().as_secs_f64() / iters as f64
            })
            .fold(f64::INFINITY, f64::min);
        let pairs = (blocks * n) as f64;
        let rate = n as f64 / per;
        if n == 1 {
            base = rate;
        }
        println!(
            "n={n:>3}: {:>8.1} us/matmul, {:>6.2} ns per block-row, {:>8.0} rows/s ({:.2}x n=1)",
            per * 1e6,
            per * 1e9 / pairs,
            rate,
            rate / base
        );
    }
}
