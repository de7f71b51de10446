//! The AVX2 level: the tile kernels (`tiles.rs`) with the 16-bit pair products as `vpmaddwd` and adds.

tile_kernels!("avx2,fma,f16c", pairs);

/// `s + w0 · x0 + w1 · x1`: each 16-bit pair product summed into i32 lanes (exact).
#[target_feature(enable = "avx2")]
#[inline]
fn pairs<const R: usize>(s: __m256i, w0: __m256i, x0: __m256i, w1: __m256i, x1: __m256i) -> __m256i {
    _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1)))
}
