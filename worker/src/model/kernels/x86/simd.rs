//! The helpers every x86 level shares: bounds-checked unaligned loads and stores, the row tiling of the integer
//! kernels (`by_rows!`) and the activation and output layouts they read and write. A leaf of `x86/`.

use std::arch::x86_64::*;

use super::super::QK;
use super::super::TILE;
use super::super::quant::{PLANE_ROWS, QuantizedRows, ROW_GROUP, XBlock, plane_at};

/// Eight f32s stored. The slice index bounds-checks the write.
#[inline(always)]
pub(super) fn store8f(out: &mut [f32], v: __m256) {
    let out = &mut out[..8];
    // SAFETY: `out` holds 8 writable f32s and the store is unaligned.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) }
}

/// 32 bytes as a vector. The slice index bounds-checks the read.
#[inline(always)]
pub(super) fn load32(bytes: &[i8]) -> __m256i {
    let bytes = &bytes[..32];
    // SAFETY: `bytes` holds 32 readable bytes and the load is unaligned.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

/// 16 bytes as a vector. The slice index bounds-checks the read.
#[inline(always)]
pub(super) fn load16u(bytes: &[u8]) -> __m128i {
    let bytes = &bytes[..16];
    // SAFETY: `bytes` holds 16 readable bytes and the load is unaligned.
    unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
}

/// A vector stored as 32 bytes. The slice index bounds-checks the write.
#[inline(always)]
pub(super) fn store32(bytes: &mut [i8], v: __m256i) {
    let bytes = &mut bytes[..32];
    // SAFETY: `bytes` holds 32 writable bytes and the store is unaligned.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), v) }
}

/// Eight f32s as a vector. The slice index bounds-checks the read.
#[inline(always)]
pub(super) fn load8f(values: &[f32]) -> __m256 {
    let values = &values[..8];
    // SAFETY: `values` holds 8 readable f32s and the load is unaligned.
    unsafe { _mm256_loadu_ps(values.as_ptr()) }
}

/// Blocks ahead of the one a tile kernel reads that it hints its weights into L1 ([`prefetch`]). A tile's blocks
/// are one sequential stream per array, and tiles follow each other, but this machine's hardware prefetchers left
/// one-sequence decode waiting on the weights: hinted 32 blocks ahead (4 KiB of Q4_1 nibbles) it decoded about 1.5x
/// as fast (`zl-worker bench`, SmolLM2 Q4_1: 4, 8, 16, 32, 64 blocks ahead 1.18x, 1.28x, 1.45x, 1.47x, 1.49x).
pub(super) const AHEAD_BLOCKS: usize = 32;

/// A hint to fetch into L1 the block [`AHEAD_BLOCKS`] blocks past the start of `stream` (`block` bytes each): every
/// cache line it covers. A hint past the end of the array does nothing.
#[inline(always)]
pub(super) fn prefetch<T>(stream: &[T], block: usize) {
    for line in 0..block.div_ceil(64) {
        prefetch_at(stream, AHEAD_BLOCKS * block + 64 * line);
    }
}

/// [`prefetch`] of block `b` of a legacy-format tile (Q4_0, Q5_0, Q5_1): its nibbles `q` (the block's own 128
/// bytes), its f16 scales `d`, and the fifth-bit plane `qh` and the minimums `m` where the format has them (empty
/// where not).
#[inline(always)]
pub(super) fn prefetch_legacy(b: usize, q: &[u8], d: &[u16], qh: &[u8], m: &[u16]) {
    prefetch(q, 128);
    prefetch(&d[b * TILE..], 2 * TILE);
    if !qh.is_empty() {
        prefetch(&qh[b * 32..], 32);
    }
    if !m.is_empty() {
        prefetch(&m[b * TILE..], 2 * TILE);
    }
}

/// A hint to fetch into L1 the cache line `ahead` bytes past the start of `v` (nothing past the end of memory).
#[inline(always)]
pub(super) fn prefetch_at<T>(v: &[T], ahead: usize) {
    // SAFETY: a prefetch hint accesses no memory (an address outside the array is not an error).
    unsafe { _mm_prefetch::<_MM_HINT_T0>(v.as_ptr().cast::<i8>().wrapping_add(ahead)) };
}

/// 32 bytes as a vector. The slice index bounds-checks the read.
#[inline(always)]
pub(super) fn load32u(bytes: &[u8]) -> __m256i {
    let bytes = &bytes[..32];
    // SAFETY: `bytes` holds 32 readable bytes and the load is unaligned.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

/// Batch rows a tile kernel runs together (one row group): their per-block integer sums, one chunk of
/// unpacked weights and a broadcast activation take twelve of the sixteen vector registers, the f32
/// accumulators stay in L1. Eight rows per pass unpack each weight chunk once for all of them; four were
/// about 15% slower at 16 rows.
pub(super) const TILE_ROWS: usize = 8;
const _: () = assert!(ROW_GROUP.is_multiple_of(TILE_ROWS), "a pass's rows share a row group");

/// `$f::<R>(args)` (or `$f::<G, R>(args)`, `G` the function's other generic parameter) for a row count known at
/// run time (1 to [`TILE_ROWS`]): the kernels take it as a constant, so their per-row registers are fixed arrays.
macro_rules! by_rows {
    ($rows:expr, $f:ident($($arg:expr),*)) => {
        by_rows!(@ $rows, $f, [], $($arg),*)
    };
    ($rows:expr, $f:ident::<$g:ident>($($arg:expr),*)) => {
        by_rows!(@ $rows, $f, [$g,], $($arg),*)
    };
    (@ $rows:expr, $f:ident, [$($g:ident,)?], $($arg:expr),*) => {
        match $rows {
            8 => $f::<$($g,)? 8>($($arg),*),
            7 => $f::<$($g,)? 7>($($arg),*),
            6 => $f::<$($g,)? 6>($($arg),*),
            5 => $f::<$($g,)? 5>($($arg),*),
            4 => $f::<$($g,)? 4>($($arg),*),
            3 => $f::<$($g,)? 3>($($arg),*),
            2 => $f::<$($g,)? 2>($($arg),*),
            _ => $f::<$($g,)? 1>($($arg),*),
        }
    };
}
const _: () = assert!(TILE_ROWS == 8, "by_rows! covers 1 to TILE_ROWS");

/// Every batch row of tile `t`, [`TILE_ROWS`] rows at a time: `f(rows, r, acc)` fills `acc[..rows]` for batch rows
/// `r..r + rows` (lane `j` of `acc[i]` is feature `8t + j` of row `r + i`), which are then stored in place.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn tile_row_groups(
    out: &mut [&mut [f32]],
    c0: usize,
    t: usize,
    mut f: impl FnMut(usize, usize, &mut [__m256; TILE_ROWS]),
) {
    let n = out.len();
    let mut r = 0;
    while r < n {
        let rows = (n - r).min(TILE_ROWS);
        let mut acc = [_mm256_setzero_ps(); TILE_ROWS];
        f(rows, r, &mut acc);
        for (row, a) in out[r..r + rows].iter_mut().zip(acc) {
            store_tile(row, c0, t, a);
        }
        r += rows;
    }
}

/// Tile `t`'s eight features `a` into one output row whose slice `row` holds features `c0..` (those that fall in
/// it).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn store_tile(row: &mut [f32], c0: usize, t: usize, a: __m256) {
    let f0 = t * TILE;
    if f0 >= c0 && f0 + TILE <= c0 + row.len() {
        // The whole tile in the slice (all but a task's or the matrix's edge): one store, where the copy of a run
        // of run-time length was a `memmove` call per tile and row.
        store8f(&mut row[f0 - c0..], a);
    } else {
        let mut vals = [0f32; TILE];
        store8f(&mut vals, a);
        store_features(row, c0, f0, &vals);
    }
}

/// Features `f0..f0 + vals.len()` of one output row whose slice `row` holds features `c0..`: the ones that
/// fall in the slice (a task's range, or the matrix's end before a tile's padding features).
#[inline(always)]
pub(super) fn store_features(row: &mut [f32], c0: usize, f0: usize, vals: &[f32]) {
    let (lo, hi) = (f0.max(c0), (f0 + vals.len()).min(c0 + row.len()));
    row[lo - c0..hi - c0].copy_from_slice(&vals[lo - f0..hi - f0]);
}

/// The activation blocks of batch rows `r..r + R`, block after block: block `b` of row `r + i` is at
/// `blocks[b * stride + i]`. The rows must share a row group.
#[inline(always)]
pub(super) fn row_blocks<const R: usize>(xq: &QuantizedRows, r: usize) -> (&[XBlock], usize) {
    let first = xq.index(r, 0);
    let stride = if xq.blocks_per_row > 1 { xq.index(r, 1) - first } else { 1 };
    assert_eq!(xq.index(r + R - 1, 0), first + R - 1, "the rows share a row group");
    let last = first + (xq.blocks_per_row - 1) * stride + R;
    (&xq.blocks[first..last], stride)
}

/// Activation quants `2p` and `2p + 1` of a block, in every 32-bit lane.
#[inline(always)]
pub(super) fn broadcast2(x: &XBlock, p: usize) -> __m256i {
    let pair = &x.q[2 * p..2 * p + 2];
    // SAFETY: `pair` is two readable i16s (4 bytes) and the read is unaligned; only called from the AVX2 kernels,
    // which run where `available()` said the CPU has it. One broadcast load, where assembling the word from two
    // 16-bit loads costs the kernel's inner loop three more instructions per pair.
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(pair.as_ptr().cast::<i32>())) }
}

/// Row `r`'s block `b`: its 32 low bytes and its 32 high bytes.
#[inline(always)]
pub(super) fn row_bytes(planes: &[u8], bpr: usize, r: usize, b: usize) -> (&[u8; QK], &[u8; QK]) {
    let at = plane_at(bpr, r, b);
    let lo = planes[at..at + QK].try_into().expect("32 bytes");
    let hi = planes[at + PLANE_ROWS * QK..at + (PLANE_ROWS + 1) * QK].try_into().expect("32 bytes");
    (lo, hi)
}

/// [`row_bytes`] of rows `r..r + R`.
#[inline(always)]
pub(super) fn rows_bytes<const R: usize>(planes: &[u8], bpr: usize, r: usize, b: usize) -> [(&[u8; QK], &[u8; QK]); R] {
    let mut x = [row_bytes(planes, bpr, r, b); R];
    for (i, x) in x.iter_mut().enumerate().skip(1) {
        *x = row_bytes(planes, bpr, r + i, b);
    }
    x
}

/// Bytes `at..at + 4` in every 32-bit lane.
#[inline(always)]
pub(super) fn broadcast4(bytes: &[u8; QK], at: usize) -> __m256i {
    let four = &bytes[at..at + 4];
    // SAFETY: `four` is 4 readable bytes and the read is unaligned; only called from the byte-product kernels
    // (`bytes.rs`, `bytes_avx2.rs`), which run where the CPU has AVX2 at least.
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(four.as_ptr().cast::<i32>())) }
}

/// Tile `t`'s part of a tiled array holding `len` entries per tile.
#[inline(always)]
pub(super) fn tile<T>(v: &[T], t: usize, len: usize) -> &[T] {
    &v[t * len..(t + 1) * len]
}

/// Byte shuffles that pick, in each 128-bit half (four features of four bytes), every feature's bytes `0, 1`
/// (`PICK_A`) or `2, 3` (`PICK_B`) into the low byte of a 16-bit lane (the high byte zero); `_HIGH` into the high
/// byte (the low byte zero), for sign extension by an arithmetic shift.
pub(super) const PICK_A: [i8; 16] = [0, -1, 1, -1, 4, -1, 5, -1, 8, -1, 9, -1, 12, -1, 13, -1];
pub(super) const PICK_B: [i8; 16] = [2, -1, 3, -1, 6, -1, 7, -1, 10, -1, 11, -1, 14, -1, 15, -1];
pub(super) const PICK_A_HIGH: [i8; 16] = [-1, 0, -1, 1, -1, 4, -1, 5, -1, 8, -1, 9, -1, 12, -1, 13];
pub(super) const PICK_B_HIGH: [i8; 16] = [-1, 2, -1, 3, -1, 6, -1, 7, -1, 10, -1, 11, -1, 14, -1, 15];

/// A byte shuffle applied to both 128-bit halves.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn shuffle(pick: &[i8; 16]) -> __m256i {
    // SAFETY: `pick` is 16 readable bytes and the load is unaligned.
    let half = unsafe { _mm_loadu_si128(pick.as_ptr().cast()) };
    _mm256_broadcastsi128_si256(half)
}

/// A chunk's 32 signed bytes (elements `4k..4k + 4` of each of eight features) as the two vectors of 16-bit
/// pairs the pair products take (activation pairs `2k` and `2k + 1`), sign-extended: `chunk_sums`' widening.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn widen_bytes(w8: __m256i, (pick_a, pick_b): (__m256i, __m256i)) -> [__m256i; 2] {
    [_mm256_srai_epi16::<8>(_mm256_shuffle_epi8(w8, pick_a)), _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(w8, pick_b))]
}

/// Eight f16s' bits as eight f32s (exact).
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn load8h(bits: &[u16]) -> __m256 {
    let bits = &bits[..8];
    // SAFETY: `bits` holds 16 readable bytes and the load is unaligned.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(bits.as_ptr().cast()) })
}

/// Eight signed bytes as eight f32s (exact).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn widen8_signed(bytes: &[i8]) -> __m256 {
    let bytes = &bytes[..8];
    // SAFETY: `bytes` holds 8 readable bytes and the load is unaligned.
    let v = unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) };
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
}

/// Eight bytes as eight f32s (exact).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn widen8(bytes: &[u8]) -> __m256 {
    let bytes = &bytes[..8];
    // SAFETY: `bytes` holds 8 readable bytes and the load is unaligned.
    let v = unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) };
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
}

/// IEEE half bits widened to f32 with F16C, eight at a time (exact; the tail by the inline scalar conversion).
#[target_feature(enable = "avx2,f16c")]
pub(super) fn widen_f16_f16c(bits: &[u16], out: &mut [f32]) {
    let out = &mut out[..bits.len()];
    let mut chunks = bits.chunks_exact(8);
    for (c, o) in (&mut chunks).zip(out.chunks_exact_mut(8)) {
        // SAFETY: `c` holds 16 readable bytes and the load is unaligned.
        let v = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(c.as_ptr().cast()) });
        store8f(o, v);
    }
    let done = bits.len() - chunks.remainder().len();
    for (o, &h) in out[done..].iter_mut().zip(chunks.remainder()) {
        *o = super::super::blocks::f16_to_f32(h);
    }
}

/// Bytes `w8` (values below 16) with bit 4 taken from bit `shift` of the plane's bytes at the same positions (a
/// fifth-bit plane: the legacy formats' and Q5_K's).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn with_fifth_bit(w8: __m256i, plane: __m256i, shift: __m128i) -> __m256i {
    let bit = _mm256_and_si256(_mm256_srl_epi16(plane, shift), _mm256_set1_epi8(1));
    _mm256_or_si256(w8, _mm256_slli_epi16::<4>(bit))
}

/// Half `h`'s nibbles of a 32-byte chunk of a nibble layout (Q4_1's, the legacy formats', Q4_K's, Q6_K's low
/// bits) as bytes: the low nibbles for half 0, the high ones for half 1.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn half_nibbles(v: __m256i, h: usize) -> __m256i {
    _mm256_and_si256(if h == 0 { v } else { _mm256_srli_epi16::<4>(v) }, _mm256_set1_epi8(0x0f))
}

/// Half `h` of a legacy-format chunk (Q4_0, Q5_0, Q5_1) as the signed byte values its kernels multiply: the
/// nibbles, the fifth bits from `plane` at `shift` where the format has them, less the format's `offset`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn legacy_bytes(v: __m256i, plane: Option<__m256i>, h: usize, shift: __m128i, offset: __m256i) -> __m256i {
    let w8 = half_nibbles(v, h);
    _mm256_sub_epi8(plane.map_or(w8, |plane| with_fifth_bit(w8, plane, shift)), offset)
}

/// Half `h` of a Q6_K chunk as signed bytes: the nibbles of `v` joined with their high bit pairs from `hv` at
/// `shift`, less 32.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn q6k_bytes(v: __m256i, hv: __m256i, h: usize, shift: __m128i) -> __m256i {
    let high = _mm256_and_si256(_mm256_srl_epi16(hv, shift), _mm256_set1_epi8(3));
    _mm256_sub_epi8(_mm256_or_si256(half_nibbles(v, h), _mm256_slli_epi16::<4>(high)), _mm256_set1_epi8(32))
}

/// The repacked formats' kernels, as the constant a kernel family's `sweep::<F>` takes (one function per format,
/// with the format's planes and minimum as constants).
pub(super) mod kernel {
    pub(in super::super) const Q4_1: u8 = 0;
    pub(in super::super) const Q4_K: u8 = 1;
    pub(in super::super) const Q5_K: u8 = 2;
    pub(in super::super) const Q6_K: u8 = 3;
    pub(in super::super) const Q4_0: u8 = 4;
    pub(in super::super) const Q5_0: u8 = 5;
    pub(in super::super) const Q5_1: u8 = 6;
    pub(in super::super) const Q8_0: u8 = 7;
}
