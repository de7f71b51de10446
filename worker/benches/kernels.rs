//! Kernel micro-benchmark, side by side in one run: matmuls in every weight format (Q4_1 and Q8_0 at the default
//! model's FFN up shape; the other block formats, F16 and BF16 at its FFN down shape, whose inputs are a multiple of
//! the K-quants' 256) at several batch sizes, and attention of one query row (the default model's heads) over several context lengths.
//! `cargo bench -p zl-worker --bench kernels` (`ZL_KERNEL_BATCHES=1,16` picks the batch sizes, `ZL_KERNEL_ISA=avx2`
//! a lower instruction set than the CPU's, `ZL_KERNEL_FORMATS=Q4_K-tiled,Q8_0` the weight formats by the names
//! printed). Q4_0, Q5_0, Q5_1, Q4_K and Q6_K run twice: as the loader keeps them (`-tiled`: repacked for kernels
//! that read them directly) and unpacked per step from the file's blocks. One weight of these shapes (0.3-1.8 MiB)
//! stays in the caches between calls, where a decode step streams the model's weights from memory:
//! `ZL_KERNEL_STREAM_MB=256` makes each matmul cycle through copies of its weight holding at least that many MiB, so
//! that every call reads its weights from memory as a step does.

use std::borrow::Cow;
use std::time::Instant;
use zl_worker::model::kernels::{AttentionShape, BlockFormat, Isa, KvPlane, Weight, attention_rows, team};

/// Deterministic pseudo-random numbers.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    fn unit(&mut self) -> f32 {
        (self.next() % 1000) as f32 / 500.0 - 1.0
    }
}

/// Best of five rounds of `iters` calls (this is a shared, noisy machine), in seconds per call. The calls run as a
/// forward step runs its kernels: on a team of the pool's threads (`team::scope`). Handed to rayon's pool from
/// outside one instead, a one-row matmul measured the hand-off: three quarters of its samples were the pool's wake-ups.
fn best_of_five(iters: usize, mut f: impl FnMut() + Send) -> f64 {
    team::scope(|| {
        f();
        (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..iters {
                    f();
                }
                t.elapsed().as_secs_f64() / iters as f64
            })
            .fold(f64::INFINITY, f64::min)
    })
}

fn matmul(name: &str, w: &Weight, sizes: &[usize], rng: &mut Lcg) {
    if std::env::var("ZL_KERNEL_FORMATS").is_ok_and(|only| !only.split(',').any(|f| f == name)) {
        return;
    }
    let (rows, cols) = (w.rows(), w.cols());
    let copies = streamed(w);
    if copies.len() > 1 {
        let mib = (copies.len() * w.memory_bytes()) >> 20;
        println!("{name} {rows}x{cols} ({} copies, {mib} MiB, one per call)", copies.len());
    } else {
        println!("{name} {rows}x{cols}");
    }
    let mut base = 0.0;
    for &n in sizes {
        let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
        let mut out = vec![0f32; n * rows];
        let mut next = 0;
        let per = best_of_five(2000 / n.max(1) + 50, || {
            copies[next % copies.len()].matmul(&x, n, &mut out);
            next += 1;
        });
        let rate = n as f64 / per;
        if base == 0.0 {
            base = rate;
        }
        println!(
            "  n={n:>3}: {:>8.1} us/matmul, {:>6.1} GMAC/s, {:>8.0} rows/s ({:.2}x n={})",
            per * 1e6,
            (rows * cols * n) as f64 / per / 1e9,
            rate,
            rate / base,
            sizes[0]
        );
    }
}

/// `w` and copies of it, together at least `ZL_KERNEL_STREAM_MB` MiB (just `w` without it).
fn streamed(w: &Weight) -> Vec<Cow<'_, Weight>> {
    let mib: usize = std::env::var("ZL_KERNEL_STREAM_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let n = (mib << 20).div_ceil(w.memory_bytes().max(1)).max(1);
    std::iter::once(Cow::Borrowed(w)).chain((1..n).map(|_| Cow::Owned(w.clone()))).collect()
}

fn main() {
    let (rows, cols) = (1536usize, 576usize);
    let blocks = rows * cols / 32;
    let mut rng = Lcg(1);
    println!("rayon threads {}, kernels {}", rayon::current_num_threads(), Isa::current().name());
    let sizes: Vec<usize> = std::env::var("ZL_KERNEL_BATCHES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect())
        .unwrap_or(vec![1, 4, 16, 32]);

    let mut q4 = Vec::with_capacity(blocks * 20);
    let mut q8 = Vec::with_capacity(blocks * 34);
    for _ in 0..blocks {
        q4.extend(half::f16::from_f32(0.01).to_le_bytes());
        q4.extend(half::f16::from_f32(-0.07).to_le_bytes());
        q4.extend((0..16).map(|_| rng.next() as u8));
        q8.extend(half::f16::from_f32(0.001).to_le_bytes());
        q8.extend((0..32).map(|_| rng.next() as u8));
    }
    matmul("Q4_1", &Weight::from_q4_1(rows, cols, &q4).expect("Q4_1 weight"), &sizes, &mut rng);
    matmul("Q8_0", &Weight::from_q8_0(rows, cols, &q8).expect("Q8_0 weight"), &sizes, &mut rng);
    let (rows, cols) = (cols, rows);
    for format in BlockFormat::ALL {
        let mut raw: Vec<u8> = (0..rows * cols / format.elems() * format.bytes()).map(|_| rng.next() as u8).collect();
        for block in raw.chunks_exact_mut(format.bytes()) {
            for &at in format.f16_fields() {
                block[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
        }
        // Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K as the loader keeps them (tiled), and as the other block formats run (unpacked per step).
        let tiled = match format {
            BlockFormat::Q4K => Some(Weight::from_q4_k(rows, cols, &raw).expect("Q4_K weight")),
            BlockFormat::Q5K => Some(Weight::from_q5_k(rows, cols, &raw).expect("Q5_K weight")),
            BlockFormat::Q6K => Some(Weight::from_q6_k(rows, cols, &raw).expect("Q6_K weight")),
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
                Some(Weight::from_legacy(format, rows, cols, &raw).expect("legacy weight"))
            }
            _ => None,
        };
        if let Some(w) = tiled {
            matmul(&format!("{}-tiled", format.name()), &w, &sizes, &mut rng);
        }
        let w = Weight::from_blocks(format, rows, cols, raw).expect("block weight");
        matmul(format.name(), &w, &sizes, &mut rng);
    }
    for bf16 in [false, true] {
        let bits =
            (0..rows * cols).map(|_| half::f16::from_f32(rng.unit()).to_bits() & if bf16 { 0x7f7f } else { 0xffff });
        let w = Weight::from_half(bf16, rows, cols, bits.collect()).expect("half weight");
        matmul(w.format_name(), &w, &sizes, &mut rng);
    }

    let shape = AttentionShape::new(9, 3, 64);
    let kvd = shape.kv_heads * shape.head_dim;
    if std::env::var("ZL_KERNEL_FORMATS").is_ok_and(|only| !only.split(',').any(|f| f == "attention")) {
        return;
    }
    println!("attention, {} heads over {} KV heads of {}", shape.heads, shape.kv_heads, shape.head_dim);
    for n in [32usize, 160, 1024, 4096] {
        let f16s =
            |rng: &mut Lcg| -> Vec<u16> { (0..n * kvd).map(|_| half::f16::from_f32(rng.unit()).to_bits()).collect() };
        let (keys, values) = (f16s(&mut rng), f16s(&mut rng));
        // The same values as 8-bit blocks.
        let bytes = |rng: &mut Lcg| -> Vec<i8> { (0..n * kvd).map(|_| (rng.unit() * 127.0) as i8).collect() };
        let (kq, vq) = (bytes(&mut rng), bytes(&mut rng));
        let scales = vec![half::f16::from_f32(1.0 / 127.0).to_bits(); n * kvd / 32];
        let q: Vec<f32> = (0..shape.heads * shape.head_dim).map(|_| rng.unit()).collect();
        let slots: Vec<usize> = (0..n).map(|p| p * kvd).collect();
        let mut out = vec![0f32; q.len()];
        let macs = 2 * shape.heads * shape.head_dim * n;
        let q8 = (KvPlane::Q8 { q: &kq, d: &scales }, KvPlane::Q8 { q: &vq, d: &scales });
        for (name, (k, v), split) in [
            ("f16", (KvPlane::F16(&keys), KvPlane::F16(&values)), false),
            ("q8", q8, false),
            ("f16, split over the threads", (KvPlane::F16(&keys), KvPlane::F16(&values)), true),
        ] {
            let per = best_of_five(100_000 / n, || {
                attention_rows(&q, &slots, &[(0, n)], (k, v), shape, split, &mut out);
            });
            println!("  {n:>5} positions, {name}: {:>8.1} us/row, {:>6.1} GMAC/s", per * 1e6, macs as f64 / per / 1e9);
        }
    }
}
