//! The AMX level: Q8_0 and Q4_1 block products on the tile unit (Intel AMX-INT8, Sapphire Rapids and later), for
//! batches of [`MIN_ROWS`] rows or more; the rest of the level is AVX-512's.
//!
//! AMX multiplies 8-bit integers only, and the activations are 16-bit (docs/worker.md, "Quality"). Each quant is
//! split exactly into its bytes, `q = 256 * hi + lo` (`hi` signed, `lo` unsigned: `QuantizedRows::byte_planes`), so
//! a block's product is `256 * (hi · w) + (lo · w)`: `tdpbssd` for the high bytes, `tdpbusd` for the low ones, each
//! an exact i32 sum over the block's 32 elements for 16 rows and 16 features at once, combined exactly. The weights'
//! tiled layout (four elements of each of eight features per 32 bytes) is the tile unit's "VNNI" layout of its B
//! operand; two tiles go side by side into one B tile per call (Q8_0 copied, Q4_1's nibbles split into bytes), for
//! every group of 16 rows; four tiles (32 features) a step, so two products are in flight per activation load.
//! The scales are then applied as AVX-512's `q8_0_tile`/`q4_1_tile` apply them, the same operations in the same
//! order per output, two tiles to a vector: the same bits (`tests::simd_and_portable_kernels_agree_bit_for_bit`
//! runs this level where the CPU has it, at 16 to 40 rows).
//!
//! Measured (`zl-worker bench`, SmolLM2 Q4_1, 2 threads, this level against AVX-512's): decode of 16 sequences
//! 1.14-1.18x, prefill of a 512-token prompt 1.31x. A call unpacks the weights it reads, which costs as much as
//! 16 rows' products at 16 rows; below [`MIN_ROWS`] the AVX-512 kernels stay ahead.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;

use super::super::QK;
use super::super::quant::{PLANE_ROWS as GROUP, QuantizedRows};
use super::super::weight::{TILE, Weight};
use super::simd::{load8f, store_features, tile};

/// Batch rows from which the tile unit serves a matmul (below, AVX-512's kernels: the unit computes 16 rows whatever
/// the batch, and the weights' bytes cost the same per call however few rows use them; at 8 rows the tile unit was
/// 0.8x AVX-512, at 12 even).
pub(super) const MIN_ROWS: usize = 16;

/// Whether the tile unit serves `weight`'s format.
pub(super) fn serves(weight: &Weight) -> bool {
    matches!(weight, Weight::Q8_0 { .. } | Weight::Q4_1 { .. })
}

/// The tile configuration (palette 1): `tmm0`/`tmm1` the activations' low and high bytes (16 rows of 32), `tmm2` and
/// `tmm3` the block of two pairs of weight tiles (8 rows of four elements of 16 features each), `tmm4`..`tmm7` the
/// products (16 rows of 16 i32: the first pair's with the low and the high bytes, then the second pair's).
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = {
    let mut c = Config { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    let mut i = 0;
    while i < 8 {
        c.colsb[i] = if i < 2 { 32 } else { 64 };
        c.rows[i] = if i == 2 || i == 3 { 8 } else { GROUP as u8 };
        i += 1;
    }
    c
};

thread_local! {
    /// Whether this thread's tile unit holds [`CONFIG`] (the configuration is per thread and survives switches).
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
}

/// A buffer the tile unit stores to or loads from.
#[repr(C, align(64))]
struct Buf<const N: usize>([u8; N]);

/// Output features `c0..c0 + out[r].len()` of every batch row `r` (Q8_0 or Q4_1; [`serves`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
pub(super) fn columns(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    if !CONFIGURED.with(Cell::get) {
        // SAFETY: `CONFIG` is a valid palette-1 configuration of 64 aligned bytes; the caller checked the CPU has
        // AMX and the process has the permission (`Isa::detected`).
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
        CONFIGURED.with(|c| c.set(true));
    }
    let (bpr, n) = (xq.blocks_per_row, out.len());
    let groups = n.div_ceil(GROUP);
    let planes = xq.byte_planes();
    // Each row's block scales and (Q4_1) block sums, `[group][block][row]`, zero for the padding rows.
    let (mut xd, mut xs) = (vec![0f32; groups * bpr * GROUP], vec![0f32; groups * bpr * GROUP]);
    for r in 0..n {
        for b in 0..bpr {
            let at = (r / GROUP * bpr + b) * GROUP + r % GROUP;
            xd[at] = xq.blocks[xq.index(r, b)].d;
            xs[at] = xq.sums[r * bpr + b];
        }
    }
    let (first, end) = (c0 / TILE, (c0 + out[0].len()).div_ceil(TILE));
    // Four tiles' blocks as two B tiles: per block 2 x 8 rows of 64 bytes (tiles `t`, `t + 1`; then `t + 2`,
    // `t + 3`), zero where the range has fewer tiles.
    let mut w = vec![0u8; bpr * QUAD_BYTES];
    // Products of two blocks in flight: block `b`'s go to half `b % 2` while block `b - 1`'s are scaled from the
    // other, so the out-of-order core overlaps the scaling with the tile unit's latency.
    let mut c = Box::new(Buf::<{ 2 * PRODUCTS }>([0; 2 * PRODUCTS]));
    let mut t = first;
    while t < end {
        let tiles = (end - t).min(4);
        if tiles < 4 {
            w.fill(0);
        }
        let (d, m) = match weight {
            Weight::Q8_0 { d, qs, .. } => {
                for u in 0..tiles {
                    for (b, q) in tile(qs, t + u, bpr * 256).chunks_exact(256).enumerate() {
                        side_by_side(q.as_ptr().cast(), &mut w[b * QUAD_BYTES + u / 2 * 512 + u % 2 * 32..]);
                    }
                }
                (d, None)
            }
            Weight::Q4_1 { d, m, qs, .. } => {
                for u in 0..tiles {
                    for (b, q) in tile(qs, t + u, bpr * 128).chunks_exact(128).enumerate() {
                        nibble_bytes(q, &mut w[b * QUAD_BYTES + u / 2 * 512 + u % 2 * 32..]);
                    }
                }
                (d, Some(m))
            }
            _ => unreachable!("the tile unit serves Q8_0 and Q4_1"),
        };
        // Two tiles' scales (and minimums) of block `b` in one vector (features 0..8, then 8..16), from tile `u`.
        let both = |v: &[f32], b: usize, u: usize| {
            let one = |u: usize| {
                if u < tiles { load8f(&tile(v, t + u, bpr * TILE)[b * TILE..]) } else { _mm256_setzero_ps() }
            };
            _mm512_insertf32x8::<1>(_mm512_castps256_ps512(one(u)), one(u + 1))
        };
        for g in 0..groups {
            let mut acc = [[_mm512_setzero_ps(); 2]; GROUP];
            for b in 0..=bpr {
                if b < bpr {
                    let a = planes[(g * bpr + b) * 2 * GROUP * QK..].as_ptr();
                    let (w, c) = (w[b * QUAD_BYTES..].as_ptr(), c.0[b % 2 * PRODUCTS..].as_mut_ptr());
                    // SAFETY: the tile loads read 16 rows of 32 bytes (the planes' group and block: low, then high
                    // bytes) and 2 x 8 rows of 64 (the block's B tiles); the stores write 4 x 16 rows of 64 bytes
                    // into this block's half of `c`; this thread loaded the configuration.
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
                let Some(b) = b.checked_sub(1) else { continue };
                let c = &c.0[b % 2 * PRODUCTS..];
                let at = (g * bpr + b) * GROUP;
                let (xd, xs) = (&xd[at..at + GROUP], &xs[at..at + GROUP]);
                for (h, u) in [0, 2].into_iter().enumerate() {
                    if u >= tiles {
                        break;
                    }
                    let dw = both(d, b, u);
                    let mw = m.map(|m| both(m, b, u));
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
                        let a = &mut acc[i][h];
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(xd[i])), *a);
                        if let Some(mw) = mw {
                            *a = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[i]), *a);
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
/// Bytes of one block's four products (16 rows of 64 bytes each).
const PRODUCTS: usize = 4 * GROUP * 64;

/// One Q8_0 tile block's 8 rows of 32 bytes (`q`, 256 readable bytes) as its half of a B tile (rows at a 64-byte
/// stride from `to`).
#[target_feature(enable = "avx2")]
#[inline]
fn side_by_side(q: *const u8, to: &mut [u8]) {
    assert!(to.len() >= 7 * 64 + 32, "the B rows");
    for k in 0..8 {
        // SAFETY: the caller passes a block of 256 bytes; `to` holds eight rows of 32 at a 64-byte stride.
        unsafe {
            let v = _mm256_loadu_si256(q.add(k * 32).cast());
            _mm256_storeu_si256(to[k * 64..].as_mut_ptr().cast(), v);
        }
    }
}

/// One Q4_1 tile block's 128 bytes of nibbles as its half of a B tile (8 rows at a 64-byte stride from `to`): chunk
/// `k`'s low nibbles are elements `4k..4k + 4` of each feature (row `k`), its high nibbles elements `16 + 4k..`
/// (row `4 + k`).
#[target_feature(enable = "avx2")]
#[inline]
fn nibble_bytes(q: &[u8], to: &mut [u8]) {
    assert!(q.len() >= 128 && to.len() >= 7 * 64 + 32, "a block and its B rows");
    let low4 = _mm256_set1_epi8(0x0f);
    for k in 0..4 {
        // SAFETY: `q` holds four chunks of 32 bytes; `to` eight rows of 32 at a 64-byte stride (asserted).
        unsafe {
            let v = _mm256_loadu_si256(q[k * 32..].as_ptr().cast());
            _mm256_storeu_si256(to[k * 64..].as_mut_ptr().cast(), _mm256_and_si256(v, low4));
            let high = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
            _mm256_storeu_si256(to[(4 + k) * 64..].as_mut_ptr().cast(), high);
        }
    }
}
