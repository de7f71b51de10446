use half::f16;

use super::attention::{attention_portable, widen};
use super::quant::{ROW_GROUP, XBlock};
use super::*;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn q4_1_raw(values: &[f32]) -> Vec<u8> {
    let mut raw = Vec::new();
    for block in values.chunks(QK) {
        let min = block.iter().copied().fold(f32::INFINITY, f32::min);
        let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        raw.extend(f16::from_f32(d).to_le_bytes());
        raw.extend(f16::from_f32(min).to_le_bytes());
        for j in 0..16 {
            let lo = ((block[j] - min) * inv).round().clamp(0.0, 15.0) as u8;
            let hi = ((block[j + 16] - min) * inv).round().clamp(0.0, 15.0) as u8;
            raw.push(lo | (hi << 4));
        }
    }
    raw
}

#[test]
fn quantized_matmul_matches_dequantized_f32() {
    let (rows, cols, n) = (70, 64, 5);
    let mut seed = 1;
    let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
    let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut seed)).collect();
    for q in
        [Weight::from_q4_1(rows, cols, &q4_1_raw(&w)).unwrap(), Weight::from_q8_0(rows, cols, &q8_0_raw(&w)).unwrap()]
    {
        let mut deq = vec![0f32; rows * cols];
        for r in 0..rows {
            q.row(r, &mut deq[r * cols..(r + 1) * cols]);
        }
        let f = Weight::from_f32(rows, cols, deq).unwrap();
        let mut a = vec![0f32; n * rows];
        let mut b = vec![0f32; n * rows];
        q.matmul(&x, n, &mut a);
        f.matmul(&x, n, &mut b);
        for (u, v) in a.iter().zip(&b) {
            assert!((u - v).abs() < 1e-3 * (1.0 + v.abs()), "{u} vs {v}");
        }
    }
}

#[test]
fn every_kernel_is_batch_invariant() {
    let (rows, cols) = (130, 96);
    let mut seed = 7;
    let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
    let x: Vec<f32> = (0..17 * cols).map(|_| lcg(&mut seed)).collect();
    let weights = [
        Weight::from_f32(rows, cols, w.clone()).unwrap(),
        Weight::from_q4_1(rows, cols, &q4_1_raw(&w)).unwrap(),
        Weight::from_q8_0(rows, cols, &q8_0_raw(&w)).unwrap(),
    ];
    for weight in &weights {
        let mut batched = vec![0f32; 17 * rows];
        weight.matmul(&x, 17, &mut batched);
        for r in [0, 5, 16] {
            let mut alone = vec![0f32; rows];
            weight.matmul(&x[r * cols..(r + 1) * cols], 1, &mut alone);
            assert_eq!(alone, batched[r * rows..(r + 1) * rows], "row {r} differs alone vs batched");
        }
    }
}

fn q8_0_raw(values: &[f32]) -> Vec<u8> {
    let mut raw = Vec::new();
    for block in values.chunks(QK) {
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        raw.extend(f16::from_f32(amax / 127.0).to_le_bytes());
        raw.extend(block.iter().map(|v| ((v / (amax / 127.0)).round() as i8) as u8));
    }
    raw
}

#[test]
fn simd_and_portable_kernels_agree_bit_for_bit() {
    let (rows, cols) = (37, 288);
    let mut seed = 11;
    let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
    let weights =
        [Weight::from_q4_1(rows, cols, &q4_1_raw(&w)).unwrap(), Weight::from_q8_0(rows, cols, &q8_0_raw(&w)).unwrap()];
    // With 16-bit activations and with 8-bit ones (`x86/int8.rs` on AVX-512).
    for (mut weight, width) in
        weights.into_iter().flat_map(|w| [Activations::Sixteen, Activations::Eight].map(|a| (w.clone(), a)))
    {
        assert!(weight.set_activations(width));
        for n in [1, 2, 3, 4, 9, 16, 17, 40] {
            let mut x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut seed) * 3.0).collect();
            // An all-zero block, a negative zero, and a block whose scale is exactly 1 and whose other values
            // are halves (the rounding's ties).
            x[..QK].fill(0.0);
            x[QK] = -0.0;
            for (i, v) in x[2 * QK..3 * QK].iter_mut().enumerate() {
                *v = if i == 0 { -32767.0 } else { i as f32 - 16.5 };
            }
            let xq = QuantizedRows::quantize(&x, cols, group_quantizer(), width);
            let run = |kernel: &dyn Fn(&mut [&mut [f32]])| {
                let mut vals = vec![0f32; n * rows];
                kernel(&mut vals.chunks_mut(rows).collect::<Vec<_>>());
                vals
            };
            let reference = run(&|out| columns_int(&weight, &xq, 0, out));
            assert_eq!(run(&|out| columns(&weight, &x, Some(&xq), 0, out)), reference);
            #[cfg(target_arch = "x86_64")]
            for isa in Isa::simd_levels_here() {
                // All columns, then in two parts split after one tile (so pairs of tiles start on an odd one),
                // as a task would.
                assert_eq!(run(&|out| x86::columns_int(isa, &weight, &xq, 0, out)), reference, "{isa:?} {width:?}");
                let split = run(&|out| {
                    let mut parts: (Vec<&mut [f32]>, Vec<&mut [f32]>) =
                        out.iter_mut().map(|row| row.split_at_mut(TILE)).unzip();
                    x86::columns_int(isa, &weight, &xq, 0, &mut parts.0);
                    x86::columns_int(isa, &weight, &xq, TILE, &mut parts.1);
                });
                assert_eq!(split, reference, "{isa:?} {width:?} split");
            }
            // The portable quantizer, group by group, gives the same bytes.
            let bpr = cols / QK;
            for (g, xg) in x.chunks(ROW_GROUP * cols).enumerate() {
                let rows_here = xg.len() / cols;
                let mut blocks = vec![XBlock::ZERO; rows_here * bpr];
                let mut sums = vec![0f32; rows_here * bpr];
                quantize_group(xg, cols, &mut blocks, &mut sums, width.qmax());
                let at = g * ROW_GROUP * bpr;
                assert!(blocks.iter().zip(&xq.blocks[at..]).all(|(a, b)| a == b));
                assert_eq!(sums[..], xq.sums[g * ROW_GROUP * bpr..][..sums.len()]);
            }
            // Eight bits: the same rounding within ±127 (each block's largest value at ±127), and the byte copy
            // where each block is.
            for (i, block) in xq.blocks.iter().enumerate().filter(|_| width == Activations::Eight) {
                let q = block.q.map(i32::from);
                assert!(q.iter().all(|v| v.abs() <= 127) && (block.d == 0.0 || q.iter().any(|v| v.abs() == 127)));
                let bytes = &xq.bytes[i * QK..(i + 1) * QK];
                assert!(bytes.iter().zip(q).all(|(&b, v)| i32::from(b) == v), "block {i}'s bytes");
            }
        }
    }
    // Groups of 3 (head_dim 24: a partial block of output chunks), 5 (more than the SIMD path's 4 heads at a
    // time), 1 and 3 (head_dim 64); 5 positions (no full pass of eight scores) and 11 (one, and a tail). A
    // head_dim of 20 runs the portable code on every machine.
    for (heads, kv_heads, head_dim) in [(6, 2, 24), (10, 2, 16), (4, 4, 64), (9, 3, 64), (6, 2, 20)] {
        for positions in [&[3, 0, 7, 9, 1][..], &[3, 0, 7, 9, 1, 2, 4, 5, 6, 8, 10]] {
            let shape = AttentionShape::new(heads, kv_heads, head_dim);
            let kvd = shape.kv_heads * shape.head_dim;
            let keys: Vec<u16> = (0..11 * kvd).map(|_| f16::from_f32(lcg(&mut seed)).to_bits()).collect();
            let values: Vec<u16> = (0..11 * kvd).map(|_| f16::from_f32(lcg(&mut seed)).to_bits()).collect();
            let q: Vec<f32> = (0..shape.heads * shape.head_dim).map(|_| lcg(&mut seed)).collect();
            let slots: Vec<usize> = positions.iter().map(|s| s * kvd).collect();
            let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
            attention(&q, &slots, KvPlane::F16(&keys), KvPlane::F16(&values), shape, &mut a);
            attention_portable(&q, &slots, KvPlane::F16(&keys), KvPlane::F16(&values), shape, &mut b);
            assert_eq!(a, b, "{shape:?}");
            // Attention is a convex combination of the values: each output lies within the values' range.
            assert!(a.iter().all(|v| v.abs() <= 1.0));
        }
    }
}

#[test]
fn several_weights_over_one_input_match_one_at_a_time() {
    let (cols, n) = (96, 6);
    let mut seed = 5;
    let x: Vec<f32> = (0..n * cols).map(|_| lcg(&mut seed)).collect();
    let values = |rows: usize, seed: &mut u64| (0..rows * cols).map(|_| lcg(seed)).collect::<Vec<f32>>();
    let weights = [
        Weight::from_q4_1(40, cols, &q4_1_raw(&values(40, &mut seed))).unwrap(),
        Weight::from_f32(24, cols, values(24, &mut seed)).unwrap(),
        Weight::from_q8_0(72, cols, &q8_0_raw(&values(72, &mut seed))).unwrap(),
    ];
    let mut together: Vec<Vec<f32>> = weights.iter().map(|w| vec![0f32; n * w.rows()]).collect();
    Input::new(&x, n).matmul(weights.iter().zip(together.iter_mut()).map(|(w, o)| (w, &mut o[..])).collect());
    for (w, got) in weights.iter().zip(&together) {
        let mut alone = vec![0f32; n * w.rows()];
        w.matmul(&x, n, &mut alone);
        assert_eq!(got, &alone);
    }
}

#[test]
fn column_tasks_cover_the_columns_in_even_whole_units() {
    for (rows, n) in [1, 8, 16, 37, 192, 576, 1536, 49152, 49153].into_iter().flat_map(|r| [(r, 1), (r, 16)]) {
        let tasks = column_tasks(rows, n, 1);
        assert_eq!(tasks[0].0, 0);
        assert_eq!(tasks.last().unwrap().1, rows);
        assert!(tasks.windows(2).all(|w| w[0].1 == w[1].0), "{rows}: contiguous");
        assert!(tasks.iter().all(|&(a, b)| a < b && a % (2 * TILE) == 0 && b - a <= MAX_COLS_PER_TASK));
        let units: Vec<usize> = tasks.iter().map(|&(a, b)| (b - a).div_ceil(2 * TILE)).collect();
        let (lo, hi) = (units.iter().min().unwrap(), units.iter().max().unwrap());
        assert!(hi - lo <= 1, "{rows}: {tasks:?}");
    }
}

#[test]
fn exp_f32_is_accurate_and_total() {
    let mut x = -87.0f32;
    while x < 88.0 {
        let (got, want) = (f64::from(exp_f32(x)), f64::from(x).exp());
        assert!(((got - want) / want).abs() < 3e-7, "exp({x}) = {got}, want {want}");
        x += 0.0137;
    }
    assert_eq!(exp_f32(0.0), 1.0);
    assert!(exp_f32(-1000.0) < 1e-37 && exp_f32(-1000.0) >= 0.0);
    assert!(exp_f32(1000.0).is_finite());
    assert!(exp_f32(f32::NAN).is_nan());
    assert_eq!(with_simd(|| exp_f32(1.5)), exp_f32(1.5));
    // `exp_f32` reads the exponent n from the rounding constant's bits; everything else is the formula as it was
    // with an integer conversion of n. The two give the same integer (so the same bits) over half a million inputs
    // spread across every binade of the range, both signs.
    let round = 12_582_912f32;
    for bits in (0..0x4300_0000u32).step_by(4001) {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            let t = x.clamp(-87.3, 88.0) * std::f32::consts::LOG2_E + round;
            assert_eq!(t.to_bits().wrapping_sub(round.to_bits()) as i32, (t - round) as i32, "exponent of e^{x}");
        }
    }
}

#[test]
fn wrong_sizes_are_refused() {
    assert!(Weight::from_q4_1(2, 32, &[0; 39]).is_err());
    assert!(Weight::from_q4_1(2, 30, &[0; 40]).is_err());
    assert!(Weight::from_q8_0(1, 32, &[0; 33]).is_err());
    assert!(Weight::from_f32(2, 2, vec![0.0; 3]).is_err());
}

#[test]
fn attention_matches_a_naive_softmax() {
    let shape = AttentionShape::new(9, 3, 64);
    let kvd = 192;
    let n = 13;
    let mut seed = 5u64;
    let mut rnd = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let keys: Vec<u16> = (0..n * kvd).map(|_| f16::from_f32(rnd()).to_bits()).collect();
    let values: Vec<u16> = (0..n * kvd).map(|_| f16::from_f32(rnd()).to_bits()).collect();
    let q: Vec<f32> = (0..576).map(|_| rnd()).collect();
    let slots: Vec<usize> = (0..n).map(|p| p * kvd).collect();
    let mut out = vec![0f32; 576];
    attention(&q, &slots, KvPlane::F16(&keys), KvPlane::F16(&values), shape, &mut out);
    let mut port = vec![0f32; 576];
    attention_portable(&q, &slots, KvPlane::F16(&keys), KvPlane::F16(&values), shape, &mut port);
    for h in 0..9 {
        let g = h / 3;
        let s: Vec<f64> = (0..n)
            .map(|p| {
                (0..64).map(|i| q[h * 64 + i] as f64 * widen(keys[p * kvd + g * 64 + i]) as f64).sum::<f64>() / 8.0
            })
            .collect();
        let m = s.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for i in 0..64 {
            let want: f64 = (0..n).map(|p| e[p] / z * widen(values[p * kvd + g * 64 + i]) as f64).sum();
            assert!((out[h * 64 + i] as f64 - want).abs() < 1e-4, "simd h{h} i{i}: {} vs {want}", out[h * 64 + i]);
            assert!(
                (port[h * 64 + i] as f64 - want).abs() < 1e-4,
                "portable h{h} i{i}: {} vs {want}",
                port[h * 64 + i]
            );
        }
    }
}

#[test]
fn rows_attending_together_get_each_rows_own_result_bit_for_bit() {
    let mut seed = 11u64;
    // 2,100 positions: enough tiles for a split over the threads. The ranges are a causal chunk's (each row one position more),
    // a sliding window's (both ends move), rows ending inside and on a tile's edge, and a single position.
    let chunk: Vec<(usize, usize)> = (0..20).map(|i| (0, 131 + i)).collect();
    let window: Vec<(usize, usize)> = (0..6).map(|i| (40 + i, 110 + i)).collect();
    let edges = [(0, 64), (63, 129), (5, 6), (0, 2100), (64, 65), (10, 2090)];
    // Head widths 64 and 128 (both levels' widest paths), 16 (one vector of sixteen), 24 (AVX-512 runs the AVX2
    // code) and 20 (the portable code everywhere).
    for (heads, kv_heads, head_dim) in [(9, 3, 64), (4, 1, 128), (6, 2, 24), (10, 2, 16), (6, 2, 20)] {
        let shape = AttentionShape::new(heads, kv_heads, head_dim);
        let (kvd, qd) = (kv_heads * head_dim, heads * head_dim);
        let mut halves = || (0..2200 * kvd).map(|_| f16::from_f32(lcg(&mut seed)).to_bits()).collect::<Vec<u16>>();
        let (keys, values) = (halves(), halves());
        // 8-bit planes: values over the whole range and small positive scales (every 32 values).
        let mut bytes = || (0..2200 * kvd).map(|_| (lcg(&mut seed) * 127.0) as i8).collect::<Vec<i8>>();
        let (kq, vq) = (bytes(), bytes());
        let mut scales = || (0..69 * kvd).map(|_| f16::from_f32(lcg(&mut seed).abs() / 64.0).to_bits()).collect();
        let (kd, vd): (Vec<u16>, Vec<u16>) = (scales(), scales());
        // 4-bit planes: any two nibbles a byte, the same scales.
        let mut nibbles = || (0..1100 * kvd).map(|_| ((lcg(&mut seed) + 1.0) * 127.9) as u8).collect::<Vec<u8>>();
        let (k4, v4) = (nibbles(), nibbles());
        let planes = [
            (KvPlane::F16(&keys), KvPlane::F16(&values)),
            (KvPlane::Q8 { q: &kq, d: &kd }, KvPlane::Q8 { q: &vq, d: &vd }),
            (KvPlane::Q4 { q: &k4, d: &kd }, KvPlane::Q4 { q: &v4, d: &vd }),
        ];
        // Slots out of order, as a paged cache's blocks are.
        let slots: Vec<usize> = (0..2100).map(|p| ((p * 37) % 2200) * kvd).collect();
        for ((keys, values), ranges) in planes.iter().flat_map(|kv| [(kv, &chunk[..]), (kv, &window), (kv, &edges)]) {
            let (keys, values) = (*keys, *values);
            let q: Vec<f32> = (0..ranges.len() * qd).map(|_| lcg(&mut seed)).collect();
            let mut together = vec![0f32; q.len()];
            attention_rows(&q, &slots, ranges, (keys, values), shape, false, &mut together);
            for isa in Isa::simd_levels_here() {
                for split in [false, true] {
                    let mut at_level = vec![0f32; q.len()];
                    attention_rows_at(isa, &q, &slots, ranges, (keys, values), shape, split, &mut at_level);
                    assert_eq!(together, at_level, "{shape:?}: {isa:?}, split over the threads: {split}");
                }
            }
            for (i, &(lo, hi)) in ranges.iter().enumerate() {
                let (mut alone, mut reference) = (vec![0f32; qd], vec![0f32; qd]);
                attention(&q[i * qd..(i + 1) * qd], &slots[lo..hi], keys, values, shape, &mut alone);
                attention_portable(&q[i * qd..(i + 1) * qd], &slots[lo..hi], keys, values, shape, &mut reference);
                assert_eq!(together[i * qd..(i + 1) * qd], alone[..], "{shape:?} row {i} of {ranges:?}");
                assert_eq!(alone, reference, "{shape:?} row {i}");
            }
        }
    }
}
