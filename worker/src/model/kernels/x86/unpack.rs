//! The block formats' tile unpacking in AVX2: each 32-value block of the eight features decoded into one vector of
//! bytes (a few shifts and masks per format, no per-value work), the eight vectors transposed as an 8x8 matrix of
//! 4-byte chunks into the tile layout ([`super::super::blocks::tile_q_at`]). The same bytes as
//! [`TileBuf::unpack`], which decodes value by value; the scales are the shared scalar code's.

use std::arch::x86_64::*;

use super::super::QK;
use super::super::blocks::{BlockFormat, TileBuf, feature_blocks};
use super::super::weight::TILE;
use super::simd::{load16u, load32u, store32};

/// [`TileBuf::unpack`] in AVX2.
#[target_feature(enable = "avx2,fma")]
pub(super) fn unpack_avx2(buf: &mut TileBuf, format: BlockFormat, raw: &[u8], rows: usize, cols: usize, t: usize) {
    let features = buf.unpack_scales(format, raw, rows, cols, t);
    let blocks_per_block = format.elems() / QK;
    let mut rows_of: [Option<std::slice::ChunksExact<'_, u8>>; TILE] = Default::default();
    for (j, it) in rows_of.iter_mut().enumerate().take(features) {
        *it = Some(feature_blocks(format, raw, cols, t * TILE + j));
    }
    for sb in 0..cols / format.elems() {
        let mut blocks: [&[u8]; TILE] = [&[]; TILE];
        for (block, it) in blocks.iter_mut().zip(&mut rows_of) {
            if let Some(it) = it {
                *block = it.next().expect("a block per super-block");
            }
        }
        for k in 0..blocks_per_block {
            let mut v = [_mm256_setzero_si256(); TILE];
            for (vj, block) in v.iter_mut().zip(blocks).take(features) {
                *vj = block32(format, block, k);
            }
            let v = transpose(v);
            let b = sb * blocks_per_block + k;
            for (c, vc) in v.into_iter().enumerate() {
                store32(&mut buf.q[b * 256 + c * 32..], vc);
            }
        }
    }
}

/// The 8x8 transpose of 4-byte chunks: chunk `c` of input `j` becomes chunk `j` of output `c` (feature `j`'s
/// values `4c..4c + 4` in the tile layout's chunk `c`).
#[target_feature(enable = "avx2")]
#[inline]
fn transpose(v: [__m256i; 8]) -> [__m256i; 8] {
    let t = [
        _mm256_unpacklo_epi32(v[0], v[1]),
        _mm256_unpackhi_epi32(v[0], v[1]),
        _mm256_unpacklo_epi32(v[2], v[3]),
        _mm256_unpackhi_epi32(v[2], v[3]),
        _mm256_unpacklo_epi32(v[4], v[5]),
        _mm256_unpackhi_epi32(v[4], v[5]),
        _mm256_unpacklo_epi32(v[6], v[7]),
        _mm256_unpackhi_epi32(v[6], v[7]),
    ];
    // u[i] holds chunks i and 4 + i of inputs 0..4 (u[4 + i]: of inputs 4..8), one per 128-bit half.
    let u = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    [
        _mm256_permute2x128_si256::<0x20>(u[0], u[4]),
        _mm256_permute2x128_si256::<0x20>(u[1], u[5]),
        _mm256_permute2x128_si256::<0x20>(u[2], u[6]),
        _mm256_permute2x128_si256::<0x20>(u[3], u[7]),
        _mm256_permute2x128_si256::<0x31>(u[0], u[4]),
        _mm256_permute2x128_si256::<0x31>(u[1], u[5]),
        _mm256_permute2x128_si256::<0x31>(u[2], u[6]),
        _mm256_permute2x128_si256::<0x31>(u[3], u[7]),
    ]
}

/// Values `32k..32k + 32` of block `b` as 32 signed bytes: [`BlockFormat::decode`]'s integers.
#[target_feature(enable = "avx2")]
#[inline]
fn block32(format: BlockFormat, b: &[u8], k: usize) -> __m256i {
    let low4 = _mm256_set1_epi8(0x0f);
    // Bits `shift..shift + 8` of each byte of `v` (the 16-bit shift's spill from the next byte masked off by
    // the caller).
    let shr = |v: __m256i, shift: usize| _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift as i32));
    match format {
        BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
            // Values 0..16 from the low nibbles, 16..32 from the high ones; the fifth bit of value e is bit e of qh.
            let (qh, qs, offset) = match format {
                BlockFormat::Q4_0 => (None, &b[2..18], 8),
                BlockFormat::Q5_0 => (Some(&b[2..6]), &b[6..22], 16),
                _ => (Some(&b[4..8]), &b[8..24], 0),
            };
            let v = load16u(qs);
            let lo = _mm_and_si128(v, _mm256_castsi256_si128(low4));
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), _mm256_castsi256_si128(low4));
            let mut q = _mm256_set_m128i(hi, lo);
            if let Some(qh) = qh {
                let bits = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
                q = _mm256_or_si256(q, _mm256_and_si256(expand_bits(bits), _mm256_set1_epi8(0x10)));
            }
            _mm256_sub_epi8(q, _mm256_set1_epi8(offset))
        }
        BlockFormat::Q2K => {
            let (n, j) = (k / 4, k % 4);
            _mm256_and_si256(shr(load32u(&b[16 + n * 32..]), 2 * j), _mm256_set1_epi8(3))
        }
        BlockFormat::Q3K => {
            let (n, j) = (k / 4, k % 4);
            let low = _mm256_and_si256(shr(load32u(&b[32 + n * 32..]), 2 * j), _mm256_set1_epi8(3));
            let bit = _mm256_set1_epi8((1u8 << (n * 4 + j)) as i8);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(load32u(&b[..32]), bit), bit);
            _mm256_sub_epi8(low, _mm256_andnot_si256(set, _mm256_set1_epi8(4)))
        }
        BlockFormat::Q4K | BlockFormat::Q5K => {
            // Group j = k / 2 of 64 values: the low nibbles of its 32 bytes, then the high ones; bit k of qh is
            // the fifth bit.
            let at = if format == BlockFormat::Q5K { 48 } else { 16 };
            let v = load32u(&b[at + (k / 2) * 32..]);
            let q = _mm256_and_si256(shr(v, 4 * (k % 2)), low4);
            if format == BlockFormat::Q4K {
                return q;
            }
            let bit = _mm256_set1_epi8((1u8 << k) as i8);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(load32u(&b[16..48]), bit), bit);
            _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
        }
        BlockFormat::Q6K => {
            // Half n = k / 4 of 128 values, quarter s = k % 4: nibbles of ql's bytes 64n + 32(s % 2).. (low for
            // s < 2), two high bits from qh's bytes 32n.. at 2s.
            let (n, s) = (k / 4, k % 4);
            let nib = _mm256_and_si256(shr(load32u(&b[n * 64 + (s % 2) * 32..]), 4 * (s / 2)), low4);
            let high = _mm256_and_si256(shr(load32u(&b[128 + n * 32..]), 2 * s), _mm256_set1_epi8(3));
            let q = _mm256_or_si256(nib, _mm256_slli_epi16::<4>(high));
            _mm256_sub_epi8(q, _mm256_set1_epi8(32))
        }
    }
}

/// Bit `e` of `bits` as byte `e` (all ones or zero).
#[target_feature(enable = "avx2")]
#[inline]
fn expand_bits(bits: u32) -> __m256i {
    // Byte e takes the byte of `bits` holding bit e, then tests its bit e % 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
    );
    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask)
}

#[cfg(test)]
mod tests {
    use super::super::super::Isa;
    use super::super::super::blocks::{BlockFormat, TileBuf};

    #[test]
    fn unpacking_gives_the_reference_bytes_for_every_format_and_a_partial_tile() {
        if Isa::detected() < Isa::Avx2 {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        };
        let (rows, cols) = (13, 512);
        for format in BlockFormat::ALL {
            // Any bytes are a block (the scales may be NaN: they are compared as bits, and both sides share them).
            let raw: Vec<u8> = (0..rows * cols / format.elems() * format.bytes()).map(|_| next()).collect();
            for t in 0..rows.div_ceil(8) {
                let (mut reference, mut simd) = (TileBuf::default(), TileBuf::default());
                reference.unpack(format, &raw, rows, cols, t);
                // Left over from another tile first: a partial tile must not keep the last one's bytes.
                simd.unpack(format, &raw, rows, cols, 0);
                // SAFETY: the CPU has AVX2 (checked above).
                unsafe { super::unpack_avx2(&mut simd, format, &raw, rows, cols, t) };
                assert_eq!(reference.q, simd.q, "{} tile {t}", format.name());
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&reference.s), bits(&simd.s), "{} tile {t}", format.name());
                assert_eq!(bits(&reference.m), bits(&simd.m), "{} tile {t}", format.name());
            }
        }
    }
}
