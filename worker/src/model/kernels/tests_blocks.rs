//! The block formats (`blocks.rs`) and the 16-bit float weights: decoding checked value for value against candle's
//! independent GGUF dequantization, every SIMD level against the portable reference bit for bit, batch invariance,
//! and products against the dequantized f32 kernel.

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use candle_core::quantized::ggml_file::qtensor_from_ggml;
use half::{bf16, f16};

use super::*;

fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

fn ggml_dtype(format: BlockFormat) -> GgmlDType {
    match format {
        BlockFormat::Q4_0 => GgmlDType::Q4_0,
        BlockFormat::Q5_0 => GgmlDType::Q5_0,
        BlockFormat::Q5_1 => GgmlDType::Q5_1,
        BlockFormat::Q2K => GgmlDType::Q2K,
        BlockFormat::Q3K => GgmlDType::Q3K,
        BlockFormat::Q4K => GgmlDType::Q4K,
        BlockFormat::Q5K => GgmlDType::Q5K,
        BlockFormat::Q6K => GgmlDType::Q6K,
    }
}

/// Random blocks of `format` for a `rows x cols` matrix: random quants and sub-scales, f16 scales of either sign
/// between about 1e-3 and 1e-1 (so that products stay in range).
fn random_blocks(format: BlockFormat, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let mut raw: Vec<u8> = (0..rows * cols / format.elems() * format.bytes()).map(|_| next(seed) as u8).collect();
    for block in raw.chunks_exact_mut(format.bytes()) {
        for &at in format.f16_fields() {
            let magnitude = 1e-3 * (1.0 + (next(seed) % 100) as f32);
            let sign = if next(seed).is_multiple_of(4) { -1.0 } else { 1.0 };
            block[at..at + 2].copy_from_slice(&f16::from_f32(sign * magnitude).to_le_bytes());
        }
    }
    raw
}

fn dequantized(weight: &Weight) -> Vec<f32> {
    let (rows, cols) = (weight.rows(), weight.cols());
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        weight.row(r, &mut out[r * cols..(r + 1) * cols]);
    }
    out
}

#[test]
fn block_formats_decode_value_for_value_as_candle_does() {
    let (rows, cols) = (5, 512);
    let mut seed = 3;
    for format in BlockFormat::ALL {
        let raw = random_blocks(format, rows, cols, &mut seed);
        let weight = Weight::from_blocks(format, rows, cols, raw.clone()).unwrap();
        let reference = qtensor_from_ggml(ggml_dtype(format), &raw, vec![rows, cols], &Device::Cpu)
            .and_then(|t| t.dequantize(&Device::Cpu))
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .unwrap();
        let ours = dequantized(&weight);
        for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
            // Equal values (a zero's sign may differ: `s * q + 0` against candle's `q * d`).
            assert_eq!(a, b, "{} value {i}: {a} vs candle's {b}", format.name());
        }
        assert_eq!(weight.memory_bytes(), raw.len(), "{} keeps the file's bytes", format.name());
    }
}

#[test]
fn block_format_sizes_are_checked() {
    let err = Weight::from_blocks(BlockFormat::Q4K, 2, 256, vec![0; 143]).unwrap_err();
    assert!(err.to_string().contains("143 bytes, expected 288"), "{err}");
    let err = Weight::from_blocks(BlockFormat::Q6K, 2, 128, vec![0; 105]).unwrap_err();
    assert!(err.to_string().contains("multiple of 256"), "{err}");
}

fn activations(n: usize, cols: usize, seed: &mut u64) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n * cols).map(|_| (next(seed) % 20001) as f32 / 5000.0 - 2.0).collect();
    // An all-zero block and a negative zero.
    x[..QK].fill(0.0);
    x[QK] = -0.0;
    x
}

/// `kernel`'s output for `n` batch rows of `rows` features.
fn run(n: usize, rows: usize, kernel: &dyn Fn(&mut [&mut [f32]])) -> Vec<f32> {
    let mut vals = vec![0f32; n * rows];
    kernel(&mut vals.chunks_mut(rows).collect::<Vec<_>>());
    vals
}

/// A level's kernel from output column `c0`.
#[cfg(target_arch = "x86_64")]
type LevelKernel<'a> = &'a dyn Fn(Isa, usize, &mut [&mut [f32]]);

/// Every SIMD level this CPU runs gives `reference` bit for bit through `kernel(isa, c0, out)`: the whole output,
/// and split at column 3 (inside the first tile, as a task split would start).
#[cfg(target_arch = "x86_64")]
fn every_level_matches(reference: &[f32], n: usize, rows: usize, what: &str, kernel: LevelKernel<'_>) {
    for isa in Isa::simd_levels_here() {
        assert_eq!(run(n, rows, &|out| kernel(isa, 0, out)), reference, "{what} {isa:?}, {n} rows");
        let split = run(n, rows, &|out| {
            let mut parts: (Vec<&mut [f32]>, Vec<&mut [f32]>) = out.iter_mut().map(|row| row.split_at_mut(3)).unzip();
            kernel(isa, 0, &mut parts.0);
            kernel(isa, 3, &mut parts.1);
        });
        assert_eq!(split, reference, "{what} {isa:?} split, {n} rows");
    }
}

#[test]
fn block_format_kernels_agree_bit_for_bit_at_every_level_and_batch_size() {
    // 37 features: a last tile of five; 512 inputs: two super-blocks.
    let (rows, cols) = (37, 512);
    let mut seed = 5;
    for format in BlockFormat::ALL {
        let weight = Weight::from_blocks(format, rows, cols, random_blocks(format, rows, cols, &mut seed)).unwrap();
        let x = activations(16, cols, &mut seed);
        let mut batched = vec![0f32; 16 * rows];
        weight.matmul(&x, 16, &mut batched);
        for n in [1, 3, 9, 16] {
            let xq = QuantizedRows::quantize(&x[..n * cols], cols, group_quantizer(), Activations::Sixteen);
            let reference = run(n, rows, &|out| columns_blocks(&weight, &xq, 0, out));
            assert_eq!(reference, batched[..n * rows], "{}: {n} rows alone vs in a batch of 16", format.name());
            #[cfg(target_arch = "x86_64")]
            every_level_matches(&reference, n, rows, format.name(), &|isa, c0, out| {
                x86::columns_blocks(isa, &weight, &xq, c0, out)
            });
        }
    }
}

#[test]
fn repacked_formats_compute_what_the_file_blocks_compute_bit_for_bit() {
    let mut seed = 11;
    type Repack = fn(usize, usize, &[u8]) -> Result<Weight, WeightError>;
    // Each with its bytes per 256 values and feature.
    let repacks: [(BlockFormat, Repack, usize); 6] = [
        (BlockFormat::Q4K, Weight::from_q4_k, 152),
        (BlockFormat::Q5K, Weight::from_q5_k, 184),
        (BlockFormat::Q6K, Weight::from_q6_k, 212),
        (BlockFormat::Q4_0, |r, c, raw| Weight::from_legacy(BlockFormat::Q4_0, r, c, raw), 144),
        (BlockFormat::Q5_0, |r, c, raw| Weight::from_legacy(BlockFormat::Q5_0, r, c, raw), 176),
        (BlockFormat::Q5_1, |r, c, raw| Weight::from_legacy(BlockFormat::Q5_1, r, c, raw), 192),
    ];
    // 37 features: a last tile of five; 512 inputs: two super-blocks (576: 18 blocks, a last, partial group of
    // four in the fifth-bit plane; legacy formats only).
    for (format, repack, bytes) in repacks {
        for cols in [512, 576].into_iter().filter(|c| c % format.elems() == 0) {
            let rows = 37;
            let name = format.name();
            let raw = random_blocks(format, rows, cols, &mut seed);
            let blocks = Weight::from_blocks(format, rows, cols, raw.clone()).unwrap();
            let tiled = repack(rows, cols, &raw).unwrap();
            assert!(!matches!(tiled, Weight::Blocks { .. }) && tiled.format_name() == name);
            // Five tiles of two super-blocks, padding features included.
            if cols == 512 {
                assert_eq!(tiled.memory_bytes(), 5 * 8 * 2 * bytes, "{name}");
            }
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                blocks.row(r, &mut a);
                tiled.row(r, &mut b);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{name} row {r}");
            }
            // Up to 70 rows: the AMX level's tiles of 16 rows from 64 (`x86::amx::MIN_ROWS_HALVES`), the last one
            // partial.
            // With 16-bit activations, and 8-bit ones where the format takes them (Q4_K, Q6_K: `x86/int8.rs`).
            let x = activations(70, cols, &mut seed);
            let mut tiled = tiled;
            for width in [Activations::Sixteen, Activations::Eight] {
                if !tiled.set_activations(width) {
                    continue;
                }
                let name = format!("{name} {}-bit", width.bits());
                let mut batched = vec![0f32; 70 * rows];
                tiled.matmul(&x, 70, &mut batched);
                for n in [1, 3, 9, 16, 70] {
                    let xq = QuantizedRows::quantize(&x[..n * cols], cols, group_quantizer(), width);
                    let reference = run(n, rows, &|out| columns_blocks(&blocks, &xq, 0, out));
                    let portable = run(n, rows, &|out| columns_int(&tiled, &xq, 0, out));
                    assert_eq!(portable, reference, "{name} portable, {n}");
                    assert_eq!(batched[..n * rows], reference, "{name}: {n} rows alone vs in a batch of 70");
                    #[cfg(target_arch = "x86_64")]
                    every_level_matches(&reference, n, rows, &name, &|isa, c0, out| {
                        x86::columns_int(isa, &tiled, &xq, c0, out)
                    });
                }
            }
            assert!(repack(rows, cols + 16, &raw).is_err(), "{name}: not a multiple of its block");
            assert!(repack(rows, cols, &raw[1..]).is_err(), "{name}: short");
        }
    }
}

#[test]
fn block_format_products_match_the_dequantized_f32_kernel() {
    let (rows, cols, n) = (20, 256, 4);
    let mut seed = 9;
    for format in BlockFormat::ALL {
        let weight = Weight::from_blocks(format, rows, cols, random_blocks(format, rows, cols, &mut seed)).unwrap();
        let float = Weight::from_f32(rows, cols, dequantized(&weight)).unwrap();
        let x = activations(n, cols, &mut seed);
        let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        weight.matmul(&x, n, &mut a);
        float.matmul(&x, n, &mut b);
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (u, v) in a.iter().zip(&b) {
            // 16-bit activations: relative error about 2^-15 per product.
            assert!((u - v).abs() <= 1e-3 * scale, "{}: {u} vs {v} (largest {scale})", format.name());
        }
    }
}

#[test]
fn half_weights_compute_exactly_what_f32_weights_do() {
    // 75 inputs: nine vectors of eight and a tail of three.
    let (rows, cols, n) = (19, 75, 5);
    let mut seed = 13;
    let values: Vec<f32> = (0..rows * cols).map(|_| (next(&mut seed) % 2001) as f32 / 1000.0 - 1.0).collect();
    let x = activations(n, cols, &mut seed);
    for is_bf16 in [false, true] {
        let bits: Vec<u16> = values
            .iter()
            .map(|&v| if is_bf16 { bf16::from_f32(v).to_bits() } else { f16::from_f32(v).to_bits() })
            .collect();
        let half = Weight::from_half(is_bf16, rows, cols, bits).unwrap();
        let float = Weight::from_f32(rows, cols, dequantized(&half)).unwrap();
        assert_eq!(half.memory_bytes(), 2 * rows * cols);
        let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        half.matmul(&x, n, &mut a);
        float.matmul(&x, n, &mut b);
        assert_eq!(a, b, "bf16 {is_bf16}");
        let mut alone = vec![0f32; rows];
        half.matmul(&x[2 * cols..3 * cols], 1, &mut alone);
        assert_eq!(alone, a[2 * rows..3 * rows], "batch invariance, bf16 {is_bf16}");
    }
}
