//! The x86-64 SIMD kernels: AVX2, AVX-512 and AMX (integer matmul, activation quantization, attention over the f16 or
//! 8-bit KV cache: `attention.rs` runs both levels, `attention512.rs` holds AVX-512's inner loops,
//! `attention_parts.rs` what they share).
//! Nearly nothing else in the worker needs `unsafe` (`team.rs` lends a step's closure and each task's slot to the
//! pool's threads for one region, `isa.rs` asks Linux for the AMX tile state): the unaligned loads and stores here,
//! the prefetch hints, the tile unit's instructions (`amx.rs`), and entering `#[target_feature]` functions once
//! [`available`] (or an assertion on the level) has checked the CPU, do. This file is the safe boundary; `simd.rs`
//! holds the helpers every level shares, and each level's kernels live in a file of their own (`bytes.rs`: AVX-512
//! VNNI's byte products for one or two rows; `bytes_avx2.rs`: AVX2's for one row of the legacy formats;
//! `int8.rs`: AVX-512 VNNI's for 8-bit activations).

// `simd` and `tiles` first: their `by_rows!` and `tile_kernels!` must be in textual scope for the levels' files.
#[macro_use]
mod simd;
#[macro_use]
mod tiles;
mod amx;
mod attention;
mod attention512;
mod attention_parts;
mod avx2;
mod avx512;
mod bytes;
mod bytes_avx2;
mod int8;
mod low_rank;
mod quantize;
mod softmax;
mod unpack;

use super::isa::Isa;
use super::quant::{QuantizedRows, XBlock};
use super::weight::Weight;

/// Whether the SIMD kernels run (the CPU has AVX2, FMA, and F16C for the f16 KV cache, and `ZL_KERNEL_ISA`
/// does not ask for the portable code).
pub(super) fn available() -> bool {
    Isa::current() >= Isa::Avx2
}

/// Run `f` compiled with AVX2 and FMA enabled.
pub(super) fn run<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: the caller checked `available()`, so the CPU has AVX2, FMA and F16C.
    unsafe { run_avx2(f) }
}

#[target_feature(enable = "avx2,fma")]
fn run_avx2<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// [`super::prefetch_ahead`] on x86-64 (SSE's `prefetcht0`, which every x86-64 CPU has).
pub(super) fn prefetch_at<T>(v: &[T], ahead: usize) {
    simd::prefetch_at(v, ahead)
}

/// [`super::low_rank_update`] in AVX2.
pub(super) fn low_rank_rows(w: super::LowRank<'_>, x: &[f32], rows: &mut [(usize, &mut [f32])]) {
    // SAFETY: the caller checked `available()`, so the CPU has AVX2 and FMA.
    unsafe { low_rank::low_rank_rows_avx2(w, x, rows) }
}

/// [`super::attention_rows`] in AVX2 (`head_dim` a multiple of 8; the caller checked `available()`).
pub(super) use attention::attention_rows;

/// [`super::weight::widen_half`] with F16C for IEEE halves (a call per eight values in the `half` crate's slice
/// conversion cost F16 weights a third of their speed at one row).
pub(super) fn widen_half(bf16: bool, bits: &[u16], out: &mut [f32]) {
    if bf16 {
        return super::weight::widen_half(bf16, bits, out);
    }
    // SAFETY: the caller checked `available()`, so the CPU has AVX2 and F16C.
    unsafe { simd::widen_f16_f16c(bits, out) }
}

/// [`super::quant::quantize_group`] in AVX2.
pub(super) fn quantize_group(x: &[f32], cols: usize, blocks: &mut [XBlock], sums: &mut [f32], qmax: f32) {
    // SAFETY: the caller checked `available()`, so the CPU has AVX2, FMA and F16C.
    unsafe { quantize::quantize_group_avx2(x, cols, blocks, sums, qmax) }
}

/// Make what [`columns_int`] at level `isa` reads of `xq` besides its blocks, if it takes `weight`'s products in
/// bytes (on the tile unit, or with AVX-512 VNNI's byte products): the activations' byte planes, and their high
/// bytes' sums for a signed format. Its callers call this before their parallel tasks, so that no task makes them
/// while the others wait.
pub(super) fn prepare(isa: Isa, weight: &Weight, xq: &QuantizedRows) {
    if isa >= Isa::Avx512 && int8::serves(weight, xq) {
        return;
    }
    if (isa == Isa::Amx && amx::serves(weight, xq.rows))
        || (isa >= Isa::Avx512 && bytes::serves(weight, xq.rows))
        || (isa == Isa::Avx2 && bytes_avx2::serves(weight, xq.rows))
    {
        xq.byte_planes();
    }
    if isa >= Isa::Avx512 && bytes::serves(weight, xq.rows) && bytes::signed(weight) {
        xq.high_sums();
    }
}

/// The integer kernel at level `isa` (at least AVX2; the caller checked the CPU has it).
pub(super) fn columns_int(isa: Isa, weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    assert!(isa >= Isa::Avx2 && isa <= Isa::detected(), "{isa:?} on this CPU");
    // SAFETY: the assertion checked that the CPU has the level's features.
    unsafe {
        match isa {
            Isa::Avx512 | Isa::Amx if int8::serves(weight, xq) => int8::columns(weight, xq, c0, out),
            Isa::Amx if amx::serves(weight, out.len()) => amx::columns(weight, xq, c0, out),
            Isa::Avx512 | Isa::Amx if bytes::serves(weight, out.len()) => bytes::columns(weight, xq, c0, out),
            Isa::Avx512 | Isa::Amx => avx512::tiled_columns(weight, xq, c0, out),
            _ if bytes_avx2::serves(weight, out.len()) => bytes_avx2::columns(weight, xq, c0, out),
            _ => avx2::tiled_columns(weight, xq, c0, out),
        }
    }
}

/// The block formats' kernel at level `isa` (at least AVX2; the caller checked the CPU has it).
pub(super) fn columns_blocks(isa: Isa, weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
    assert!(isa >= Isa::Avx2 && isa <= Isa::detected(), "{isa:?} on this CPU");
    // SAFETY: the assertion checked that the CPU has the level's features.
    unsafe {
        match isa {
            Isa::Avx512 | Isa::Amx => avx512::columns_blocks(weight, xq, c0, out),
            _ => avx2::columns_blocks(weight, xq, c0, out),
        }
    }
}
