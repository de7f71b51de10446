//! AVX-512 VNNI's kernels for 8-bit activations (`--activations 8`): Q4_K and Q6_K at every batch size, two tiles
//! (16 features) per 512-bit vector.
//!
//! With activations within ±127 a `vpdpbusd` sums four of a lane's products where the 16-bit kernels'
//! `vpdpwssd` sums two, and the weights go in as bytes: Q4_K's nibbles masked in place (no shuffle into 16-bit
//! pairs), Q6_K's six bits joined unsigned (0..63), their offset of 32 taken off the half's sum as `32 * sum(x)`
//! (`QuantizedRows::isums`). The weights are the unsigned operand, the activations' bytes
//! (`QuantizedRows::bytes`) the signed one, broadcast four at a time. Each half's integer sum is the exact integer
//! the 16-bit kernels sum over the same quants, and the scales are then applied by the same operations in the same
//! order as `tiles.rs`'s kernels apply them, lane by lane: the same bits as the portable reference given the same
//! 8-bit quants (the bit-for-bit tests run this kernel at 1 to 70 rows), so a sequence's logits do not depend on
//! which kernel its batch size picks.
//!
//! Two tiles a vector halve the per-row work of the scales (a conversion and two fused multiply-adds per half and
//! row), which at eight bits costs as much as the products themselves. Each block's eight weight chunks are
//! prepared once into registers and every row's two chains of four products read them (with the chunks prepared
//! per row inside the rows' loop instead, the 1B-shaped Q4_K_M file decoded 16 sequences at 99 tok/s, here 158).
//!
//! This kernel serves the AMX level too: the tile unit over 8-bit activations (one `tdpbssd` per 16-value half,
//! as `amx.rs` takes the high bytes) measured 0.58x this kernel at 16 sequences and 0.8x at a 512-token prompt
//! (`zl-worker bench`, the 1B-shaped Q4_K_M file, 2 threads, Intel Xeon with AMX): a half's product is a quarter
//! of the unit's depth, and each one's sums go through memory to be scaled.

use std::arch::x86_64::*;

use super::super::QK;
use super::super::blocks::{BlockFormat, HALVES};
use super::super::quant::{Activations, QuantizedRows};
use super::super::weight::{TILE, Weight};
use super::simd::{TILE_ROWS, load8f, load8h, load32, load32u, prefetch, store_tile, tile, widen8, widen8_signed};

/// Whether [`columns`] serves `weight` over `xq`: a format that takes 8-bit activations
/// (`Weight::set_activations`).
pub(super) fn serves(weight: &Weight, xq: &QuantizedRows) -> bool {
    xq.width == Activations::Eight && weight.activations() == Activations::Eight
}

// The format kernels.
use super::simd::kernel::*;

/// The 8-bit kernel: tiles two at a time, every batch row [`TILE_ROWS`] at a time.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn columns(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    match weight {
        Weight::Q4K { qh, .. } => {
            assert!(qh.is_empty(), "Q4_K only");
            sweep::<Q4_K>(weight, xq, c0, out)
        }
        Weight::Q6K { .. } => sweep::<Q6_K>(weight, xq, c0, out),
        Weight::Q8_0 { .. } => sweep::<Q8_0>(weight, xq, c0, out),
        Weight::Q4_1 { .. } => sweep::<Q4_1>(weight, xq, c0, out),
        Weight::Legacy { format: BlockFormat::Q4_0, .. } => sweep::<Q4_0>(weight, xq, c0, out),
        Weight::Legacy { format: BlockFormat::Q5_0, .. } => sweep::<Q5_0>(weight, xq, c0, out),
        Weight::Legacy { .. } => sweep::<Q5_1>(weight, xq, c0, out),
        _ => unreachable!("the repacked formats only"),
    }
}

/// Tiles `t` and `t + 1` (or `t` alone at the end of the range, computed twice) for every batch row.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline(never)]
fn sweep<const F: u8>(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    let tiles = c0 / TILE..(c0 + out[0].len()).div_ceil(TILE);
    for t in tiles.clone().step_by(2) {
        let u = if t + 1 < tiles.end { t + 1 } else { t };
        let mut r = 0;
        while r < out.len() {
            let rows = (out.len() - r).min(TILE_ROWS);
            let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
            by_rows!(rows, pair_rows::<F>(weight, xq, (t, u), r, &mut acc));
            for (row, a) in out[r..r + rows].iter_mut().zip(acc) {
                store_tile(row, c0, t, _mm512_castps512_ps256(a));
                if u != t {
                    store_tile(row, c0, u, _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))));
                }
            }
            r += rows;
        }
    }
}

/// Tiles `t` and `u` for batch rows `r..r + R` into `acc[..R]` (lanes 0..8 tile `t`'s features, 8..16 `u`'s).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn pair_rows<const F: u8, const R: usize>(
    weight: &Weight,
    xq: &QuantizedRows,
    tu: (usize, usize),
    r: usize,
    acc: &mut [__m512; TILE_ROWS],
) {
    let rows = match F {
        Q4_K => q4k_pair::<R>(weight, xq, tu, r),
        Q6_K => q6k_pair::<R>(weight, xq, tu, r),
        Q8_0 => q8_0_pair::<R>(weight, xq, tu, r),
        Q4_1 => q4_1_pair::<R>(weight, xq, tu, r),
        Q4_0 => legacy_pair::<R, false, false>(weight, xq, tu, r),
        Q5_0 => legacy_pair::<R, true, false>(weight, xq, tu, r),
        _ => legacy_pair::<R, true, true>(weight, xq, tu, r),
    };
    acc[..R].copy_from_slice(&rows);
}

/// Two 256-bit halves as one vector.
#[target_feature(enable = "avx512f")]
#[inline]
fn join(a: __m256, b: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(a)), _mm256_castps_pd(b)))
}

/// Two 32-byte chunks as one vector.
#[target_feature(enable = "avx512f")]
#[inline]
fn join_bytes(a: &[u8], b: &[u8]) -> __m512i {
    join_int(load32u(a), load32u(b))
}

/// Two 256-bit integer halves as one vector.
#[target_feature(enable = "avx512f")]
#[inline]
fn join_int(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// Tiles `t`'s and `u`'s parts of a tiled array (`len` elements a tile).
#[inline(always)]
fn pair<T>(v: &[T], (t, u): (usize, usize), len: usize) -> (&[T], &[T]) {
    (tile(v, t, len), tile(v, u, len))
}

/// Where batch rows `r..` keep their blocks: row `r + i`'s block `b` is block `first + b * stride + i`.
#[inline(always)]
fn row_index(xq: &QuantizedRows, r: usize) -> (usize, usize) {
    let first = xq.index(r, 0);
    let stride = if xq.blocks_per_row > 1 { xq.index(r, 1) - first } else { 1 };
    (first, stride)
}

/// Activation quants `e..e + 4` of a row's block (its 32 bytes), in every 32-bit lane.
#[target_feature(enable = "avx512f")]
#[inline]
fn broadcast4(block: &[i8; QK], e: usize) -> __m512i {
    let four = &block[e..e + 4];
    // SAFETY: `four` is four readable bytes and the read is unaligned.
    _mm512_set1_epi32(unsafe { std::ptr::read_unaligned(four.as_ptr().cast::<i32>()) })
}

/// `start` plus row `i`'s sums of half `h`'s byte products with the block's eight prepared weight chunks `w`
/// (half 0 in `w[..4]`, 1 in `w[4..]`): four `vpdpbusd` in a chain.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn half_sum(start: __m512i, w: &[__m512i; 8], x: &[i8; QK], h: usize) -> __m512i {
    let mut s = start;
    for k in 0..4 {
        s = _mm512_dpbusd_epi32(s, w[4 * h + k], broadcast4(x, 16 * h + 4 * k));
    }
    s
}

/// Row `i`'s bytes of block `at + i` (rows `r..`'s block from `at`, [`row_index`]).
#[inline(always)]
fn row_bytes(xq: &QuantizedRows, at: usize, i: usize) -> &[i8; QK] {
    xq.bytes[(at + i) * QK..(at + i + 1) * QK].try_into().expect("32 bytes")
}

/// Q4_K tiles `t` and `u`: per block, the eight chunks' nibbles masked once for all rows, each row's byte products
/// summed in i32 per half; then `tiles.rs`'s `q4k_tile` arithmetic lane by lane (`d * sc` and `-(dmin * mn)` per
/// block, times the activations' scale, as two fused multiply-adds per half).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q4k_pair<const R: usize>(weight: &Weight, xq: &QuantizedRows, (t, u): (usize, usize), r: usize) -> [__m512; R] {
    let Weight::Q4K { cols, d, dmin, sc, mn, qs, .. } = weight else { unreachable!("Q4_K only") };
    let bpr = cols / QK;
    let sign = _mm512_set1_epi32(i32::MIN);
    let mut acc = [_mm512_setzero_ps(); R];
    let (qa, qb) = pair(qs, (t, u), bpr * 128);
    let (sca, scb) = pair(sc, (t, u), bpr * TILE);
    let (mna, mnb) = pair(mn, (t, u), bpr * TILE);
    let (da, db) = pair(d, (t, u), bpr / 8 * TILE);
    let (dma, dmb) = pair(dmin, (t, u), bpr / 8 * TILE);
    let (first, stride) = row_index(xq, r);
    let fsums = &xq.fsums[r * bpr * HALVES..(r + R) * bpr * HALVES];
    for b in 0..bpr {
        let (qa, qb) = (&qa[b * 128..], &qb[b * 128..]);
        prefetch(qa, 128);
        prefetch(qb, 128);
        let (sa, sb) = (&sca[b * TILE..], &scb[b * TILE..]);
        let (ma, mb) = (&mna[b * TILE..], &mnb[b * TILE..]);
        let sup = b / 8 * TILE;
        let s = _mm512_mul_ps(join(load8f(&da[sup..]), load8f(&db[sup..])), join(widen8(sa), widen8(sb)));
        let m = _mm512_mul_ps(join(load8f(&dma[sup..]), load8f(&dmb[sup..])), join(widen8(ma), widen8(mb)));
        let m = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), sign));
        let w = nibble_chunks(qa, qb, None, b);
        let at = first + b * stride;
        let xb = &xq.blocks[at..at + R];
        for i in 0..R {
            let xd = _mm512_set1_ps(xb[i].d);
            let (sd, md) = (_mm512_mul_ps(s, xd), _mm512_mul_ps(m, xd));
            let sums = &fsums[(i * bpr + b) * HALVES..][..HALVES];
            for (h, &sum) in sums.iter().enumerate() {
                let s32 = half_sum(_mm512_setzero_si512(), &w, row_bytes(xq, at, i), h);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s32), sd, acc[i]);
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(sum), md, acc[i]);
            }
        }
    }
    acc
}

/// Q6_K tiles `t` and `u`: per half, the low nibbles and the high bit pairs joined unsigned once for all rows, each
/// row's byte products summed in i32 from `-32 * sum(x)`; then `tiles.rs`'s `q6k_tile` arithmetic lane by lane.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q6k_pair<const R: usize>(weight: &Weight, xq: &QuantizedRows, (t, u): (usize, usize), r: usize) -> [__m512; R] {
    let Weight::Q6K { cols, d, sc, ql, qh, .. } = weight else { unreachable!("Q6_K only") };
    let bpr = cols / QK;
    let (low4, three) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(3));
    let mut acc = [_mm512_setzero_ps(); R];
    let (qla, qlb) = pair(ql, (t, u), bpr * 128);
    let (qha, qhb) = pair(qh, (t, u), bpr / 2 * 128);
    let (sca, scb) = pair(sc, (t, u), bpr * HALVES * TILE);
    let (da, db) = pair(d, (t, u), bpr / 8 * TILE);
    let (first, stride) = row_index(xq, r);
    let isums = &xq.isums[r * bpr * HALVES..(r + R) * bpr * HALVES];
    for b in 0..bpr {
        let (qa, qb) = (&qla[b * 128..], &qlb[b * 128..]);
        let (ha, hb) = (&qha[b / 2 * 128..], &qhb[b / 2 * 128..]);
        prefetch(qa, 128);
        prefetch(qb, 128);
        prefetch(&qha[b * 64..], 64);
        prefetch(&qhb[b * 64..], 64);
        let sup = b / 8 * TILE;
        let dv = join(load8f(&da[sup..]), load8f(&db[sup..]));
        let mut s = [_mm512_setzero_ps(); HALVES];
        let mut w = [_mm512_setzero_si512(); 8];
        for h in 0..HALVES {
            let at_s = (b * HALVES + h) * TILE;
            s[h] = _mm512_mul_ps(dv, join(widen8_signed(&sca[at_s..]), widen8_signed(&scb[at_s..])));
            let shift = _mm_cvtsi32_si128((4 * (b % 2) + 2 * h) as i32);
            for k in 0..4 {
                let v = join_bytes(&qa[k * 32..], &qb[k * 32..]);
                let hv = join_bytes(&ha[k * 32..], &hb[k * 32..]);
                let low = _mm512_and_si512(if h == 0 { v } else { _mm512_srli_epi16::<4>(v) }, low4);
                let high = _mm512_and_si512(_mm512_srl_epi16(hv, shift), three);
                w[4 * h + k] = _mm512_or_si512(low, _mm512_slli_epi16::<4>(high));
            }
        }
        let at = first + b * stride;
        let xb = &xq.blocks[at..at + R];
        for i in 0..R {
            let xd = _mm512_set1_ps(xb[i].d);
            let sums = &isums[(i * bpr + b) * HALVES..][..HALVES];
            for h in 0..HALVES {
                // Started at -32 * sum(x): the offset of the unsigned values taken off.
                let start = _mm512_set1_epi32(-32 * sums[h]);
                let sum = _mm512_cvtepi32_ps(half_sum(start, &w, row_bytes(xq, at, i), h));
                acc[i] = _mm512_fmadd_ps(sum, _mm512_mul_ps(s[h], xd), acc[i]);
            }
        }
    }
    acc
}

/// Both tiles' eight f16 scales (or minimums) of block `b`, as f32.
#[target_feature(enable = "avx2,f16c,avx512f")]
#[inline]
fn scales_f16(a: &[u16], b_: &[u16], b: usize) -> __m512 {
    join(load8h(&a[b * TILE..]), load8h(&b_[b * TILE..]))
}

/// A nibble layout's (Q4_1's, the legacy formats') eight chunks of one block of two tiles as unsigned bytes: half
/// 0 the low nibbles, half 1 the high ones, each with its fifth bit from `planes` (the two tiles' fifth-bit plane
/// rows of the block's group of four) where the format has one.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn nibble_chunks(qa: &[u8], qb: &[u8], planes: Option<(&[u8], &[u8])>, b: usize) -> [__m512i; 8] {
    let (low4, one) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(1));
    let mut w = [_mm512_setzero_si512(); 8];
    for k in 0..4 {
        let v = join_bytes(&qa[k * 32..], &qb[k * 32..]);
        w[k] = _mm512_and_si512(v, low4);
        w[4 + k] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low4);
        if let Some((pa, pb)) = planes {
            let plane = join_bytes(&pa[k * 32..], &pb[k * 32..]);
            for h in 0..HALVES {
                let shift = _mm_cvtsi32_si128((2 * (b % 4) + h) as i32);
                let bit = _mm512_and_si512(_mm512_srl_epi16(plane, shift), one);
                w[4 * h + k] = _mm512_or_si512(w[4 * h + k], _mm512_slli_epi16::<4>(bit));
            }
        }
    }
    w
}

/// Q8_0 tiles `t` and `u`: the signed quants made unsigned (`w + 128`, a flip of the top bit) once for all rows,
/// each row's block sum started at `-128 * sum(x)`; then `tiles.rs`'s `q8_0_tile` arithmetic lane by lane.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q8_0_pair<const R: usize>(weight: &Weight, xq: &QuantizedRows, (t, u): (usize, usize), r: usize) -> [__m512; R] {
    let Weight::Q8_0 { cols, d, qs, .. } = weight else { unreachable!("Q8_0 only") };
    let bpr = cols / QK;
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); R];
    let (qa, qb) = pair(qs, (t, u), bpr * 256);
    let (da, db) = pair(d, (t, u), bpr * TILE);
    let (first, stride) = row_index(xq, r);
    let isums = &xq.isums[r * bpr * HALVES..(r + R) * bpr * HALVES];
    for b in 0..bpr {
        let (qa, qb) = (&qa[b * 256..], &qb[b * 256..]);
        prefetch(qa, 256);
        prefetch(qb, 256);
        prefetch(&da[b * TILE..], 2 * TILE);
        prefetch(&db[b * TILE..], 2 * TILE);
        let dw = scales_f16(da, db, b);
        let mut w = [_mm512_setzero_si512(); 8];
        for (k, w) in w.iter_mut().enumerate() {
            let v = join_int(load32(&qa[k * 32..]), load32(&qb[k * 32..]));
            *w = _mm512_xor_si512(v, flip);
        }
        let at = first + b * stride;
        let xb = &xq.blocks[at..at + R];
        for i in 0..R {
            let sums = &isums[(i * bpr + b) * HALVES..][..HALVES];
            let start = _mm512_set1_epi32(-128 * (sums[0] + sums[1]));
            let x = row_bytes(xq, at, i);
            let sum = half_sum(half_sum(start, &w, x, 0), &w, x, 1);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(xb[i].d)), acc[i]);
        }
    }
    acc
}

/// Q4_1 tiles `t` and `u`: the nibbles as they are, each row's whole-block sum; then `tiles.rs`'s `q4_1_tile`
/// arithmetic lane by lane (the minimum times the activations' f32 block sum).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn q4_1_pair<const R: usize>(weight: &Weight, xq: &QuantizedRows, (t, u): (usize, usize), r: usize) -> [__m512; R] {
    let Weight::Q4_1 { cols, d, m, qs, .. } = weight else { unreachable!("Q4_1 only") };
    let bpr = cols / QK;
    let mut acc = [_mm512_setzero_ps(); R];
    let (qa, qb) = pair(qs, (t, u), bpr * 128);
    let (da, db) = pair(d, (t, u), bpr * TILE);
    let (ma, mb) = pair(m, (t, u), bpr * TILE);
    let (first, stride) = row_index(xq, r);
    let sums = &xq.sums[r * bpr..(r + R) * bpr];
    for b in 0..bpr {
        let (qa, qb) = (&qa[b * 128..], &qb[b * 128..]);
        prefetch(qa, 128);
        prefetch(qb, 128);
        for v in [da, db, ma, mb] {
            prefetch(&v[b * TILE..], 2 * TILE);
        }
        let (dw, mw) = (scales_f16(da, db, b), scales_f16(ma, mb, b));
        let w = nibble_chunks(qa, qb, None, b);
        let at = first + b * stride;
        let xb = &xq.blocks[at..at + R];
        for i in 0..R {
            let x = row_bytes(xq, at, i);
            let sum = half_sum(half_sum(_mm512_setzero_si512(), &w, x, 0), &w, x, 1);
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, _mm512_set1_ps(xb[i].d)), acc[i]);
            acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sums[i * bpr + b]), acc[i]);
        }
    }
    acc
}

/// Q4_0, Q5_0 (`HIGH`: the fifth bits) and Q5_1 (`HIGH` and `MIN`) tiles `t` and `u`: the values unsigned (the
/// nibbles and fifth bits as they are), each row's half sums started at `-offset * sum(x)`; then `tiles.rs`'s
/// `legacy_tile` arithmetic lane by lane.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn legacy_pair<const R: usize, const HIGH: bool, const MIN: bool>(
    weight: &Weight,
    xq: &QuantizedRows,
    (t, u): (usize, usize),
    r: usize,
) -> [__m512; R] {
    let Weight::Legacy { format, cols, d, m, qs, qh, .. } = weight else { unreachable!("legacy formats only") };
    let bpr = cols / QK;
    assert_eq!((HIGH, MIN), (!qh.is_empty(), !m.is_empty()), "{format:?}'s planes");
    let offset = i32::from(format.offset());
    let mut acc = [_mm512_setzero_ps(); R];
    let (qa, qb) = pair(qs, (t, u), bpr * 128);
    let plane = bpr.div_ceil(4) * 128;
    let (ha, hb) = if HIGH { pair(qh, (t, u), plane) } else { (&[][..], &[][..]) };
    let (da, db) = pair(d, (t, u), bpr * TILE);
    let (ma, mb) = if MIN { pair(m, (t, u), bpr * TILE) } else { (&[][..], &[][..]) };
    let (first, stride) = row_index(xq, r);
    let (isums, fsums) = (&xq.isums[r * bpr * HALVES..], &xq.fsums[r * bpr * HALVES..]);
    for b in 0..bpr {
        let (qa, qb) = (&qa[b * 128..], &qb[b * 128..]);
        prefetch(qa, 128);
        prefetch(qb, 128);
        prefetch(&da[b * TILE..], 2 * TILE);
        prefetch(&db[b * TILE..], 2 * TILE);
        if HIGH {
            prefetch(&ha[b * 32..], 32);
            prefetch(&hb[b * 32..], 32);
        }
        let dv = scales_f16(da, db, b);
        let mv = if MIN { scales_f16(ma, mb, b) } else { _mm512_setzero_ps() };
        let planes = HIGH.then(|| (&ha[b / 4 * 128..], &hb[b / 4 * 128..]));
        let w = nibble_chunks(qa, qb, planes, b);
        let at = first + b * stride;
        let xb = &xq.blocks[at..at + R];
        for i in 0..R {
            let xd = _mm512_set1_ps(xb[i].d);
            let (sd, md) = (_mm512_mul_ps(dv, xd), _mm512_mul_ps(mv, xd));
            let at_sum = (i * bpr + b) * HALVES;
            for h in 0..HALVES {
                let start = _mm512_set1_epi32(-offset * isums[at_sum + h]);
                let sum = _mm512_cvtepi32_ps(half_sum(start, &w, row_bytes(xq, at, i), h));
                acc[i] = _mm512_fmadd_ps(sum, sd, acc[i]);
                if MIN {
                    acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(fsums[at_sum + h]), md, acc[i]);
                }
            }
        }
    }
    acc
}
