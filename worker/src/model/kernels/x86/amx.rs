//! The AMX level: the repacked formats' block products on the tile unit (Intel AMX-INT8, Sapphire Rapids and
//! later), for batches of [`MIN_ROWS`] rows or more ([`MIN_ROWS_HALVES`] for the formats scaled per half); the rest
//! of the level is AVX-512's.
//!
//! AMX multiplies 8-bit integers only, and the activations are 16-bit (docs/worker.md, "Quality"). Each quant is
//! split exactly into its bytes, `q = 256 * hi + lo` (`hi` signed, `lo` unsigned: `QuantizedRows::byte_planes`), so
//! a product is `256 * (hi · w) + (lo · w)`: `tdpbssd` for the high bytes, `tdpbusd` for the low ones, each an
//! exact i32 sum for 16 rows and 16 features at once, combined exactly; over a whole block of 32 (Q8_0, Q4_1) or
//! each 16-value half (Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, whose scales or minimums are per half), with a tile
//! configuration for each. The weights' tiled layout (four elements of each of eight features per 32 bytes) is the
//! tile unit's "VNNI" layout of its B operand: each call turns the blocks it reads into their signed or unsigned
//! byte values (the ones the AVX-512 kernels widen to 16 bits), two tiles side by side per B tile, once for every
//! group of 16 rows; four tiles (32 features) a step, so two products are in flight per activation load. The scales
//! are then applied as each AVX-512 kernel applies them, the same operations in the same order per output, two
//! tiles to a vector: the same bits (the bit-for-bit tests run this level where the CPU has it, at 16 to 70 rows).
//!
//! Measured (`zl-worker bench`, SmolLM2 Q4_1, 2 threads, this level against AVX-512's): decode of 16 sequences
//! 1.14-1.18x, prefill of a 512-token prompt 1.31x. A call converts the weights it reads, which costs as much as
//! 16 rows' products at 16 rows; below [`MIN_ROWS`] the AVX-512 kernels stay ahead.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;

use super::super::QK;
use super::super::blocks::HALVES;
use super::super::quant::{PLANE_ROWS as GROUP, QuantizedRows};
use super::super::weight::{TILE, Weight};
use super::simd::{
    half_nibbles, legacy_bytes, load8f, load8h, load32u, prefetch, q6k_bytes, store_features, tile, widen8,
    widen8_signed, with_fifth_bit,
};

/// Batch rows from which the tile unit serves Q8_0 and Q4_1 (below, AVX-512's kernels: the unit computes 16 rows
/// whatever the batch, and the weights' bytes cost the same per call however few rows use them; at 8 rows the tile
/// unit was 0.8x AVX-512, at 12 even).
pub(super) const MIN_ROWS: usize = 16;

/// Batch rows from which it serves the formats scaled per half: twice the steps of the tile unit's latency chain
/// per block (each step reuses all eight tile registers), so it lost at 16 rows (0.8-0.95x AVX-512) and gained
/// from 64 (1.0-1.3x; 1.0-1.25x at 256).
pub(super) const MIN_ROWS_HALVES: usize = 64;

/// Whether the tile unit serves `weight` for `rows` batch rows: the repacked formats (Q8_0, Q4_1; Q4_0, Q5_0, Q5_1,
/// Q4_K, Q5_K and Q6_K by 16-value halves) from their [`MIN_ROWS`] or [`MIN_ROWS_HALVES`]. Q2_K and Q3_K, unpacked
/// per step from the file's blocks, stay on AVX-512.
pub(super) fn serves(weight: &Weight, rows: usize) -> bool {
    match weight {
        Weight::Q8_0 { .. } | Weight::Q4_1 { .. } => rows >= MIN_ROWS,
        Weight::Legacy { .. } | Weight::Q4K { .. } | Weight::Q6K { .. } => rows >= MIN_ROWS_HALVES,
        _ => false,
    }
}

/// Products per block: Q8_0 and Q4_1 scale a whole block's sum, the other formats each 16-value half's.
fn parts(weight: &Weight) -> usize {
    if matches!(weight, Weight::Q8_0 { .. } | Weight::Q4_1 { .. }) { 1 } else { HALVES }
}

/// A tile configuration (palette 1): `tmm0`/`tmm1` the activations' low and high bytes (16 rows of a block's 32
/// bytes, or a half's 16), `tmm2` and `tmm3` two pairs of weight tiles side by side (8 rows of four elements of 16
/// features, or 4 rows for a half), `tmm4`..`tmm7` the products (16 rows of 16 i32: the first pair's with the low
/// and the high bytes, then the second pair's).
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// The configuration for products over `k` bytes of each row (32: whole blocks; 16: halves).
const fn config(k: usize) -> Config {
    let mut c = Config { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    let mut i = 0;
    while i < 8 {
        c.colsb[i] = if i < 2 { k as u16 } else { 64 };
        c.rows[i] = if i == 2 || i == 3 { (k / 4) as u8 } else { GROUP as u8 };
        i += 1;
    }
    c
}

const CONFIGS: [Config; 2] = [config(QK), config(QK / HALVES)];

thread_local! {
    /// Which of [`CONFIGS`] this thread's tile unit holds, plus one (0: none yet); the configuration is per thread
    /// and survives switches.
    static LOADED: Cell<usize> = const { Cell::new(0) };
}

/// A buffer the tile unit stores to or loads from.
#[repr(C, align(64))]
struct Buf<const N: usize>([u8; N]);

/// How a part's i32 sums become floats beside the scale: Q4_1's block minimum times the activations' f32 block
/// sum; Q5_1's and the K-quants' half minimum times the activations' scale, times their exact half sum.
#[derive(Clone, Copy)]
enum Min {
    None,
    Sum(__m512),
    Scaled(__m512),
}

/// Output features `c0..c0 + out[r].len()` of every batch row `r` ([`serves`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
pub(super) fn columns(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    let parts = parts(weight);
    let which = if parts == 1 { 0 } else { 1 };
    if LOADED.with(Cell::get) != which + 1 {
        // SAFETY: each of `CONFIGS` is a valid palette-1 configuration of 64 aligned bytes; the caller checked the
        // CPU has AMX and the process has the permission (`Isa::detected`).
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIGS[which], options(nostack, readonly)) };
        LOADED.with(|l| l.set(which + 1));
    }
    let (bpr, n) = (xq.blocks_per_row, out.len());
    let (groups, steps) = (n.div_ceil(GROUP), bpr * parts);
    let planes = xq.byte_planes();
    // Each row's block scales and the sums its minimum term takes (Q4_1: the block's f32 sum; the others: each
    // half's exact integer sum), `[group][block][part][row]`, zero for the padding rows.
    let (mut xd, mut xs) = (vec![0f32; groups * bpr * GROUP], vec![0f32; groups * steps * GROUP]);
    for r in 0..n {
        for b in 0..bpr {
            xd[(r / GROUP * bpr + b) * GROUP + r % GROUP] = xq.blocks[xq.index(r, b)].d;
            for p in 0..parts {
                xs[((r / GROUP * bpr + b) * parts + p) * GROUP + r % GROUP] =
                    if parts == 1 { xq.sums[r * bpr + b] } else { xq.isums[(r * bpr + b) * HALVES + p] as f32 };
            }
        }
    }
    let (first, end) = (c0 / TILE, (c0 + out[0].len()).div_ceil(TILE));
    // Four tiles' blocks as two B tiles: per block 2 x 8 rows of 64 bytes (tiles `t`, `t + 1`; then `t + 2`,
    // `t + 3`; a half's rows are 4 of them), zero where the range has fewer tiles.
    let mut w = vec![0u8; bpr * QUAD_BYTES];
    // Products of two steps in flight: step `j`'s go to half `j % 2` while step `j - 1`'s are scaled from the other,
    // so the out-of-order core overlaps the scaling with the tile unit's latency.
    let mut c = Box::new(Buf::<{ 2 * PRODUCTS }>([0; 2 * PRODUCTS]));
    let mut t = first;
    while t < end {
        let tiles = (end - t).min(4);
        if tiles < 4 {
            w.fill(0);
        }
        for u in 0..tiles {
            for b in 0..bpr {
                weight_bytes(weight, bpr, t + u, b, &mut w[b * QUAD_BYTES + u / 2 * 512 + u % 2 * 32..]);
            }
        }
        for g in 0..groups {
            let mut acc = [[_mm512_setzero_ps(); 2]; GROUP];
            for j in 0..=steps {
                if j < steps {
                    let (b, p) = (j / parts, j % parts);
                    let a = planes[(g * bpr + b) * 2 * GROUP * QK + p * (QK / HALVES)..].as_ptr();
                    let w = w[b * QUAD_BYTES + p * 4 * 64..].as_ptr();
                    let c = c.0[j % 2 * PRODUCTS..].as_mut_ptr();
                    // SAFETY: the tile loads read 16 rows of 32 or 16 bytes at a 32-byte stride (the planes' group
                    // and block: low, then high bytes) and 2 x 8 or 4 rows of 64 (the step's B tiles); the stores
                    // write 4 x 16 rows of 64 bytes into this step's half of `c`; this thread loaded the
                    // configuration for this format.
                    unsafe {
                        asm!(
                            "tileloadd tmm0, [{a} + {s32}*1]",
                            "tileloadd tmm1, [{ah} + {s32}*1]",
                            "tileloadd tmm2, [{w} + {s64}*1]",
                            "tileloadd tmm3, [{w1} + {s64}*1]",
                            "tilezero tmm4",
                            "tilezero tmm5",
                            "tilezero tmm6",
                            "tilezero tmm7",
                            "tdpbusd tmm4, tmm0, tmm2",
                            "tdpbusd tmm6, tmm0, tmm3",
                            "tdpbssd tmm5, tmm1, tmm2",
                            "tdpbssd tmm7, tmm1, tmm3",
                            "tilestored [{c} + {s64}*1], tmm4",
                            "tilestored [{c1} + {s64}*1], tmm5",
                            "tilestored [{c2} + {s64}*1], tmm6",
                            "tilestored [{c3} + {s64}*1], tmm7",
                            a = in(reg) a,
                            ah = in(reg) a.add(GROUP * QK),
                            w = in(reg) w,
                            w1 = in(reg) w.add(512),
                            c = in(reg) c,
                            c1 = in(reg) c.add(GROUP * 64),
                            c2 = in(reg) c.add(2 * GROUP * 64),
                            c3 = in(reg) c.add(3 * GROUP * 64),
                            s32 = in(reg) 32usize,
                            s64 = in(reg) 64usize,
                            options(nostack),
                        );
                    }
                }
                let Some(j) = j.checked_sub(1) else { continue };
                let (b, p) = (j / parts, j % parts);
                let c = &c.0[j % 2 * PRODUCTS..];
                let xd = &xd[(g * bpr + b) * GROUP..][..GROUP];
                let xs = &xs[(g * steps + j) * GROUP..][..GROUP];
                for (h, u) in [0, 2].into_iter().enumerate() {
                    if u >= tiles {
                        break;
                    }
                    let (scale, min) = scales(weight, bpr, t, tiles, u, b, p);
                    let c = &c[2 * h * GROUP * 64..];
                    for i in 0..GROUP {
                        // SAFETY: row i of each product is 64 readable bytes inside `c`.
                        let (lo, hi) = unsafe {
                            (
                                _mm512_loadu_si512(c.as_ptr().add(i * 64).cast()),
                                _mm512_loadu_si512(c.as_ptr().add(GROUP * 64 + i * 64).cast()),
                            )
                        };
                        let s = _mm512_add_epi32(_mm512_slli_epi32::<8>(hi), lo);
                        let xd = _mm512_set1_ps(xd[i]);
                        let a = &mut acc[i][h];
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scale, xd), *a);
                        match min {
                            Min::None => {}
                            Min::Sum(m) => *a = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[i]), *a),
                            Min::Scaled(m) => *a = _mm512_fmadd_ps(_mm512_set1_ps(xs[i]), _mm512_mul_ps(m, xd), *a),
                        }
                    }
                }
            }
            for (i, acc) in acc.iter().enumerate().take((n - g * GROUP).min(GROUP)) {
                let mut vals = [0f32; 4 * TILE];
                // SAFETY: `vals` holds 32 floats.
                unsafe {
                    _mm512_storeu_ps(vals.as_mut_ptr(), acc[0]);
                    _mm512_storeu_ps(vals.as_mut_ptr().add(16), acc[1]);
                }
                store_features(out[g * GROUP + i], c0, t * TILE, &vals[..tiles * TILE]);
            }
        }
        t += tiles;
    }
}

/// Bytes of one block's two B tiles.
const QUAD_BYTES: usize = 2 * 512;
/// Bytes of one step's four products (16 rows of 64 bytes each).
const PRODUCTS: usize = 4 * GROUP * 64;

/// Tile `t`'s block `b` as bytes into its half of a B tile: 8 rows of 32 bytes at a 64-byte stride from `to`, row
/// `k` elements `4k..4k + 4` of each of the eight features (so rows `4h..4h + 4` are half `h`): the values each
/// AVX-512 kernel widens to 16 bits, in the same bytes.
#[target_feature(enable = "avx2")]
#[inline]
fn weight_bytes(weight: &Weight, bpr: usize, t: usize, b: usize, to: &mut [u8]) {
    assert!(to.len() >= 7 * 64 + 32, "the B rows");
    let mut row = |k: usize, v: __m256i| {
        // SAFETY: row `k` (at most 7) is 32 writable bytes of `to` (asserted).
        unsafe { _mm256_storeu_si256(to[k * 64..].as_mut_ptr().cast(), v) }
    };
    let shift = |s: usize| _mm_cvtsi32_si128(s as i32);
    match weight {
        Weight::Q8_0 { qs, .. } => {
            let q = &tile(qs, t, bpr * 256)[b * 256..][..256];
            prefetch(q, 256);
            for k in 0..8 {
                // SAFETY: chunk k is 32 readable bytes of `q`.
                row(k, unsafe { _mm256_loadu_si256(q[k * 32..].as_ptr().cast()) });
            }
        }
        Weight::Q4_1 { qs, .. } | Weight::Q4K { qs, .. } if !has_fifth(weight) => {
            let q = &tile(qs, t, bpr * 128)[b * 128..];
            prefetch(q, 128);
            for h in 0..HALVES {
                for k in 0..4 {
                    row(4 * h + k, half_nibbles(load32u(&q[k * 32..]), h));
                }
            }
        }
        Weight::Q4K { qs, qh, .. } => {
            let (q, qh) = (&tile(qs, t, bpr * 128)[b * 128..], tile(qh, t, bpr.div_ceil(4) * 128));
            prefetch(q, 128);
            prefetch(&qh[b * 32..], 32);
            for h in 0..HALVES {
                for k in 0..4 {
                    let plane = load32u(&qh[b / 4 * 128 + k * 32..]);
                    row(
                        4 * h + k,
                        with_fifth_bit(half_nibbles(load32u(&q[k * 32..]), h), plane, shift(2 * (b % 4) + h)),
                    );
                }
            }
        }
        Weight::Legacy { format, qs, qh, .. } => {
            let offset = _mm256_set1_epi8(format.offset());
            let q = &tile(qs, t, bpr * 128)[b * 128..];
            let qh = if qh.is_empty() { &[][..] } else { tile(qh, t, bpr.div_ceil(4) * 128) };
            prefetch(q, 128);
            if !qh.is_empty() {
                prefetch(&qh[b * 32..], 32);
            }
            for h in 0..HALVES {
                for k in 0..4 {
                    let plane = (!qh.is_empty()).then(|| load32u(&qh[b / 4 * 128 + k * 32..]));
                    row(4 * h + k, legacy_bytes(load32u(&q[k * 32..]), plane, h, shift(2 * (b % 4) + h), offset));
                }
            }
        }
        Weight::Q6K { ql, qh, .. } => {
            let (q, hq) = (&tile(ql, t, bpr * 128)[b * 128..], &tile(qh, t, bpr / 2 * 128)[b / 2 * 128..]);
            prefetch(q, 128);
            prefetch(&tile(qh, t, bpr / 2 * 128)[b * 64..], 64);
            for h in 0..HALVES {
                for k in 0..4 {
                    let (v, hv) = (load32u(&q[k * 32..]), load32u(&hq[k * 32..]));
                    row(4 * h + k, q6k_bytes(v, hv, h, shift(4 * (b % 2) + 2 * h)));
                }
            }
        }
        _ => unreachable!("the tile unit serves the repacked formats"),
    }
}

/// Whether a Q4_K-layout weight is Q5_K (its fifth-bit plane).
fn has_fifth(weight: &Weight) -> bool {
    matches!(weight, Weight::Q4K { qh, .. } if !qh.is_empty())
}

/// The scale (and minimum) vectors of part `p` of block `b` for tiles `t + u` and `t + u + 1` (zero past `tiles`):
/// per tile, the AVX-512 kernel's vectors for the same block and half, computed by the same operations.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
#[inline]
fn scales(weight: &Weight, bpr: usize, t: usize, tiles: usize, u: usize, b: usize, p: usize) -> (__m512, Min) {
    let sign = _mm256_set1_ps(-0.0);
    let per_tile = |u: usize| -> (__m256, Option<__m256>) {
        let f = |v: &[f32], per: usize, at: usize| load8f(&tile(v, t + u, per * TILE)[at * TILE..]);
        let h = |v: &[u16]| load8h(&tile(v, t + u, bpr * TILE)[b * TILE..]);
        match weight {
            Weight::Q8_0 { d, .. } => (h(d), None),
            Weight::Q4_1 { d, m, .. } => (h(d), Some(h(m))),
            Weight::Legacy { d, m, .. } => (h(d), (!m.is_empty()).then(|| h(m))),
            Weight::Q4K { d, dmin, sc, mn, .. } => {
                let byte = |v: &[u8]| widen8(&tile(v, t + u, bpr * TILE)[b * TILE..]);
                let s = _mm256_mul_ps(f(d, bpr / 8, b / 8), byte(sc));
                (s, Some(_mm256_xor_ps(_mm256_mul_ps(f(dmin, bpr / 8, b / 8), byte(mn)), sign)))
            }
            Weight::Q6K { d, sc, .. } => {
                let sc = widen8_signed(&tile(sc, t + u, bpr * HALVES * TILE)[(b * HALVES + p) * TILE..]);
                (_mm256_mul_ps(f(d, bpr / 8, b / 8), sc), None)
            }
            _ => unreachable!("the tile unit serves the repacked formats"),
        }
    };
    let zero = _mm256_setzero_ps();
    let (s0, m0) = if u < tiles { per_tile(u) } else { (zero, None) };
    let (s1, m1) = if u + 1 < tiles { per_tile(u + 1) } else { (zero, m0.map(|_| zero)) };
    let join = |a: __m256, b: __m256| _mm512_insertf32x8::<1>(_mm512_castps256_ps512(a), b);
    let min = match (m0, m1) {
        (Some(a), Some(b)) if matches!(weight, Weight::Q4_1 { .. }) => Min::Sum(join(a, b)),
        (Some(a), Some(b)) => Min::Scaled(join(a, b)),
        _ => Min::None,
    };
    (join(s0, s1), min)
}
