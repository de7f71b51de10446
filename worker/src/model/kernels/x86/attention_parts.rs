//! What both SIMD levels' attention kernels share: where the cache's values come from ([`Source`]: f16 or 8-bit
//! blocks), a KV head's keys, a batch of heads' weighted sum of values, the scores' lane sums and prefetching.

use std::arch::x86_64::*;

use super::super::math::hsum;
use super::simd::{load8f, prefetch_at, store8f};

/// Where eight consecutive cache values (from an offset that is a multiple of 8) come from, as f32: exactly
/// [`KvPlane::get`]'s values.
pub(super) trait Source: Copy + Send {
    /// Whether the AVX2 values loop's four-chunk passes (split jobs) broadcast their weights from memory at each use
    /// rather than holding them in registers: f16 values (one instruction a chunk) leave too few registers for both,
    /// 8-bit blocks (four, and a scale) measured better holding them. Three-chunk passes hold them either way.
    const WEIGHTS_FROM_MEMORY: bool;
    fn load8(self, at: usize) -> __m256;
    /// Sixteen values (from a multiple of 16) as f32 (only inside AVX-512 code).
    fn load16(self, at: usize) -> __m512;
    /// Panics unless the `len` values from `at` (and for 8-bit blocks their scales) lie in the plane: one check for
    /// a run of chunks that [`Source::load8_unchecked`] then reads.
    fn check(self, at: usize, len: usize);
    /// [`Source::load8`] without its bounds check (the inner loops' checks and their address arithmetic were half
    /// their instructions).
    ///
    /// # Safety
    /// The eight values from `at` lie in a run that [`Source::check`] passed.
    unsafe fn load8_unchecked(self, at: usize) -> __m256;
    /// Ask for the cache lines of `len` values from `at` (a hint: no check, no fault, whatever the address).
    fn prefetch(self, at: usize, len: usize);
}

/// f16 bits, widened by F16C.
#[derive(Clone, Copy)]
pub(super) struct Half<'a>(pub(super) &'a [u16]);

impl Source for Half<'_> {
    const WEIGHTS_FROM_MEMORY: bool = true;

    #[inline(always)]
    fn load8(self, at: usize) -> __m256 {
        let b = &self.0[at..at + 8];
        // SAFETY: `b` holds 8 readable u16s (16 bytes); the load is unaligned; the caller runs with F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().cast())) }
    }

    #[inline(always)]
    fn check(self, at: usize, len: usize) {
        let _ = &self.0[at..at + len];
    }

    #[inline(always)]
    unsafe fn load8_unchecked(self, at: usize) -> __m256 {
        // SAFETY: the caller's run holds the 16 bytes from `at`; the load is unaligned; the caller runs with F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.as_ptr().add(at).cast())) }
    }

    #[inline(always)]
    fn load16(self, at: usize) -> __m512 {
        let b = &self.0[at..at + 16];
        // SAFETY: `b` holds 16 readable u16s (32 bytes); the load is unaligned; the caller runs with AVX-512.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(b.as_ptr().cast())) }
    }

    #[inline(always)]
    fn prefetch(self, at: usize, len: usize) {
        // A count of lines fixed by `len` (a constant at every call), not a range's: the range's step count and
        // overflow checks were a tenth of the values loop's instructions per position.
        for line in 0..len.div_ceil(32) {
            prefetch_at(self.0, 2 * (at + 32 * line));
        }
    }
}

/// 8-bit values and an f16 scale per 32: each value times its scale (exact in f32).
#[derive(Clone, Copy)]
pub(super) struct Q8<'a>(pub(super) &'a [i8], pub(super) &'a [u16]);

impl Source for Q8<'_> {
    const WEIGHTS_FROM_MEMORY: bool = false;

    #[inline(always)]
    fn load8(self, at: usize) -> __m256 {
        let (b, d) = (&self.0[at..at + 8], self.1[at / 32]);
        // SAFETY: `b` holds 8 readable bytes; the loads are unaligned; the caller runs with AVX2 and F16C.
        unsafe {
            let ints = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.as_ptr().cast()));
            let scale = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))));
            _mm256_mul_ps(_mm256_cvtepi32_ps(ints), scale)
        }
    }

    #[inline(always)]
    fn check(self, at: usize, len: usize) {
        let _ = (&self.0[at..at + len], &self.1[at / 32..(at + len).div_ceil(32)]);
    }

    #[inline(always)]
    unsafe fn load8_unchecked(self, at: usize) -> __m256 {
        // SAFETY: the caller's run holds the 8 bytes from `at` and their scale; the loads are unaligned; the caller
        // runs with AVX2 and F16C.
        unsafe {
            let d = *self.1.get_unchecked(at / 32);
            let ints = _mm256_cvtepi8_epi32(_mm_loadl_epi64(self.0.as_ptr().add(at).cast()));
            let scale = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))));
            _mm256_mul_ps(_mm256_cvtepi32_ps(ints), scale)
        }
    }

    #[inline(always)]
    fn load16(self, at: usize) -> __m512 {
        let (b, d) = (&self.0[at..at + 16], self.1[at / 32]);
        // SAFETY: `b` holds 16 readable bytes; the loads are unaligned; the caller runs with AVX-512 and F16C.
        unsafe {
            let ints = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.as_ptr().cast()));
            let scale = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))));
            _mm512_mul_ps(_mm512_cvtepi32_ps(ints), scale)
        }
    }

    #[inline(always)]
    fn prefetch(self, at: usize, len: usize) {
        for line in 0..len.div_ceil(64) {
            prefetch_at(self.0, at + 64 * line);
        }
        prefetch_at(self.1, 2 * (at / 32));
    }
}

/// 4-bit values two a byte (value `2i` in byte `i`'s low nibble) and an f16 scale per 32: each `(nibble - 8)`
/// times its scale (exact in f32).
#[derive(Clone, Copy)]
pub(super) struct Q4<'a>(pub(super) &'a [u8], pub(super) &'a [u16]);

/// The nibbles of the low eight bytes, in value order (byte `i`'s low nibble, then its high one), as sixteen bytes.
#[inline(always)]
unsafe fn nibbles8(bytes: __m128i) -> __m128i {
    // SAFETY: plain SSE2 arithmetic on registers; the caller runs with AVX2.
    unsafe {
        let mask = _mm_set1_epi8(0x0f);
        _mm_unpacklo_epi8(_mm_and_si128(bytes, mask), _mm_and_si128(_mm_srli_epi16::<4>(bytes), mask))
    }
}

impl Q4<'_> {
    /// Eight values from the four bytes at `q`, with scale bits `d`.
    ///
    /// # Safety
    /// `q` points at four readable bytes; the caller runs with AVX2 and F16C.
    #[inline(always)]
    unsafe fn eight(q: *const u8, d: u16) -> __m256 {
        // SAFETY: as the caller promised; the load is unaligned.
        unsafe {
            let bytes = _mm_cvtsi32_si128(q.cast::<i32>().read_unaligned());
            let ints = _mm256_sub_epi32(_mm256_cvtepu8_epi32(nibbles8(bytes)), _mm256_set1_epi32(8));
            let scale = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))));
            _mm256_mul_ps(_mm256_cvtepi32_ps(ints), scale)
        }
    }
}

impl Source for Q4<'_> {
    const WEIGHTS_FROM_MEMORY: bool = false;

    #[inline(always)]
    fn load8(self, at: usize) -> __m256 {
        let (b, d) = (&self.0[at / 2..at / 2 + 4], self.1[at / 32]);
        // SAFETY: `b` holds 4 readable bytes; the caller runs with AVX2 and F16C.
        unsafe { Self::eight(b.as_ptr(), d) }
    }

    #[inline(always)]
    fn check(self, at: usize, len: usize) {
        let _ = (&self.0[at / 2..(at + len).div_ceil(2)], &self.1[at / 32..(at + len).div_ceil(32)]);
    }

    #[inline(always)]
    unsafe fn load8_unchecked(self, at: usize) -> __m256 {
        // SAFETY: the caller's run holds the 4 bytes from `at / 2` and their scale; the caller runs with AVX2 and
        // F16C.
        unsafe { Self::eight(self.0.as_ptr().add(at / 2), *self.1.get_unchecked(at / 32)) }
    }

    #[inline(always)]
    fn load16(self, at: usize) -> __m512 {
        let (b, d) = (&self.0[at / 2..at / 2 + 8], self.1[at / 32]);
        // SAFETY: `b` holds 8 readable bytes; the loads are unaligned; the caller runs with AVX-512 and F16C.
        unsafe {
            let bytes = nibbles8(_mm_loadl_epi64(b.as_ptr().cast()));
            let ints = _mm512_sub_epi32(_mm512_cvtepu8_epi32(bytes), _mm512_set1_epi32(8));
            let scale = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))));
            _mm512_mul_ps(_mm512_cvtepi32_ps(ints), scale)
        }
    }

    #[inline(always)]
    fn prefetch(self, at: usize, len: usize) {
        for line in 0..len.div_ceil(128) {
            prefetch_at(self.0, at / 2 + 64 * line);
        }
        prefetch_at(self.1, 2 * (at / 32));
    }
}

/// One KV head's keys: `hd` values from `at` in every slot.
#[derive(Clone, Copy)]
pub(super) struct Key<S> {
    pub(super) keys: S,
    pub(super) at: usize,
    pub(super) hd: usize,
}

/// The weighted sum of values for a batch of heads of one group over the positions in `slots`: head `i`'s weights
/// are `w[i * n..]`, its value chunks start at `at` in every slot, and its output at `i * hd` of the output slice.
pub(super) struct Values<'a, S> {
    pub(super) w: &'a [f32],
    pub(super) n: usize,
    pub(super) slots: &'a [usize],
    pub(super) values: S,
    pub(super) at: usize,
    pub(super) hd: usize,
}

/// Each position's eight lanes summed as [`hsum`], times `scale`: eight positions per pass of
/// horizontal adds (whose pairings are `hsum`'s tree).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn scores8(lanes: &[f32], scale: f32, out: &mut [f32]) {
    let full = out.len() / 8 * 8;
    let sc = _mm256_set1_ps(scale);
    for p in (0..full).step_by(8) {
        let v = |i: usize| load8f(&lanes[(p + i) * 8..]);
        let t1 = _mm256_hadd_ps(_mm256_hadd_ps(v(0), v(1)), _mm256_hadd_ps(v(2), v(3)));
        let t2 = _mm256_hadd_ps(_mm256_hadd_ps(v(4), v(5)), _mm256_hadd_ps(v(6), v(7)));
        let sum = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(t1, t2), _mm256_permute2f128_ps::<0x31>(t1, t2));
        store8f(&mut out[p..], _mm256_mul_ps(sum, sc));
    }
    for (p, o) in out.iter_mut().enumerate().skip(full) {
        *o = hsum(lanes[p * 8..p * 8 + 8].try_into().expect("eight lanes")) * scale;
    }
}

/// [`scores8`] of positions whose lanes were added in pairs (`_mm256_hadd_ps` of two positions' lanes, eight values
/// per pair, `lanes[8 * k..]` for positions `2k` and `2k + 1`; an odd last position's own eight lanes after them):
/// each position's sum in [`hsum`]'s tree, times `scale`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn pair_scores8(lanes: &[f32], scale: f32, out: &mut [f32]) {
    if let Ok(out) = <&mut [f32; 8]>::try_from(&mut *out) {
        let v = |k: usize| load8f(&lanes[8 * k..]);
        let (t1, t2) = (_mm256_hadd_ps(v(0), v(1)), _mm256_hadd_ps(v(2), v(3)));
        let sum = _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(t1, t2), _mm256_permute2f128_ps::<0x31>(t1, t2));
        store8f(out, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
        return;
    }
    let n = out.len();
    for (p, o) in out.iter_mut().enumerate() {
        let l = &lanes[8 * (p / 2)..8 * (p / 2) + 8];
        *o = if p % 2 == 1 {
            ((l[2] + l[3]) + (l[6] + l[7])) * scale
        } else if p + 1 < n {
            ((l[0] + l[1]) + (l[4] + l[5])) * scale
        } else {
            hsum(l.try_into().expect("eight lanes")) * scale
        };
    }
}

/// Positions ahead of the one being read whose KV lines are requested early: the KV blocks of a step come
/// from memory (the weights pushed them out of the caches since the last step).
pub(super) const AHEAD: usize = 8;
