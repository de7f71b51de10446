//! The AVX-512 level: the tile kernels (`tiles.rs`) with the 16-bit pair products as AVX-512 VNNI's `vpdpwssd`
//! (a pair product and its accumulation in one instruction, on 256-bit vectors: AVX512VL), the same exact i32
//! sums as AVX2's, so the same bits.

tile_kernels!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", pairs);

/// `s + w0 · x0 + w1 · x1`: each 16-bit pair product summed into i32 lanes (exact). With four rows or more in a
/// pass their independent sums hide `vpdpwssd`'s latency and both products accumulate in place; with fewer the
/// first product is a `vpmaddwd` so that only one instruction waits on the running sum.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
fn pairs<const R: usize>(s: __m256i, w0: __m256i, x0: __m256i, w1: __m256i, x1: __m256i) -> __m256i {
    if R >= 4 {
        _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(s, w0, x0), w1, x1)
    } else {
        _mm256_add_epi32(s, _mm256_dpwssd_epi32(_mm256_madd_epi16(w0, x0), w1, x1))
    }
}
