//! Attention over the KV cache (f16, or 8-bit blocks) in AVX2, FMA and F16C: [`super::super::attention`]'s
//! arithmetic, the same bits.

use std::arch::x86_64::*;

use super::super::team;

use super::super::attention::{AttentionShape, KvPlane};
use super::super::isa::Isa;
use super::attention_parts::{AHEAD, Half, Key, Q4, Q8, Source, Values, pair_scores8};
use super::attention512::{scores_avx512, values_avx512};
use super::simd::{load8f, store8f};
use super::softmax::softmax_avx2;

/// [`super::super::attention_rows`] at level `isa` (AVX2 or AVX-512; the caller checked the CPU has it) for
/// either storage (keys and values of one type). The AVX-512 level needs head widths that are a multiple of 16
/// (every released model's); others run the AVX2 level's code, which computes the same bits.
#[allow(clippy::too_many_arguments)]
pub(in super::super) fn attention_rows(
    isa: Isa,
    q: &[f32],
    slots: &[usize],
    ranges: &[(usize, usize)],
    kv: (KvPlane<'_>, KvPlane<'_>),
    shape: AttentionShape,
    split: bool,
    out: &mut [f32],
) {
    assert!(isa >= Isa::Avx2 && isa <= Isa::detected(), "{isa:?} on this CPU");
    let wide = isa >= Isa::Avx512 && shape.head_dim.is_multiple_of(16);
    match kv {
        (KvPlane::F16(k), KvPlane::F16(v)) => on(wide, q, slots, ranges, (Half(k), Half(v)), shape, split, out),
        (KvPlane::Q8 { q: kq, d: kd }, KvPlane::Q8 { q: vq, d: vd }) => {
            on(wide, q, slots, ranges, (Q8(kq, kd), Q8(vq, vd)), shape, split, out)
        }
        (KvPlane::Q4 { q: kq, d: kd }, KvPlane::Q4 { q: vq, d: vd }) => {
            on(wide, q, slots, ranges, (Q4(kq, kd), Q4(vq, vd)), shape, split, out)
        }
        _ => unreachable!("keys and values are stored alike"),
    }
}

/// [`attention_rows`] for one storage type, at the AVX-512 level (`wide`) or the AVX2 one. The caller checked the
/// CPU has the level's instructions.
#[allow(clippy::too_many_arguments)]
fn on<S: Source + Sync>(
    wide: bool,
    q: &[f32],
    slots: &[usize],
    ranges: &[(usize, usize)],
    kv: (S, S),
    shape: AttentionShape,
    split: bool,
    out: &mut [f32],
) {
    // SAFETY (both): the caller (`attention_rows`' assertion) checked the CPU has the level's instructions.
    if wide {
        unsafe { attention_rows_avx512(q, slots, ranges, kv, shape, split, out) }
    } else {
        unsafe { attention_rows_avx2(q, slots, ranges, kv, shape, split, out) }
    }
}

/// A level's [`super::super::attention_rows`] (`head_dim` a multiple of 8; the AVX-512 level's a multiple of 16):
/// `$name` compiled with `$features` around that level's inner loops, `$scores` (a batch of heads' scores over a tile,
/// for one row or two) and `$values` (their weighted sums of values, `$step` chunks of eight per pass over a row's
/// positions, `$split_step` per job where the work splits), so that every closure in it compiles with the level's
/// instructions. Each position's score and each output's chain of fused multiply-adds are computed as for a row
/// alone, so the order of the work changes nothing. With `split`, long ranges
/// split over the threads (flash-decoding, without its rescaling): the scores by tile (the flash-attention tiling, two
/// tiles per thread), the softmax by row and head, the weighted sums of values by KV head and output chunk, each of
/// them whole in one task; without, each row's range goes in one pass (faster on one thread, see docs/worker.md).
macro_rules! rows_level {
    ($name:ident, $features:literal, $scores:ident, $values:ident, $step:expr, $split_step:expr) => {
        #[target_feature(enable = $features)]
        fn $name<S: Source + Sync>(
            q: &[f32],
            slots: &[usize],
            ranges: &[(usize, usize)],
            (keys, values): (S, S),
            shape: AttentionShape,
            split: bool,
            out: &mut [f32],
        ) {
            let AttentionShape { heads, kv_heads, head_dim: hd, scale } = shape;
            let (group, chunks, qd) = (heads / kv_heads, hd / 8, heads * hd);
            // Row i's weights start at `starts[i]`: `[h * n + p]` for head h and its position p (n = its positions);
            // scores first, then softmax weights in place.
            let mut starts = Vec::with_capacity(ranges.len() + 1);
            starts.push(0);
            for &(lo, hi) in ranges {
                starts.push(starts.last().copied().unwrap_or(0) + heads * (hi - lo));
            }
            let mut weights = vec![0f32; starts[ranges.len()]];
            let first = ranges.iter().map(|r| r.0).min().unwrap_or(0);
            let end = ranges.iter().map(|r| r.1).max().unwrap_or(0);
            let parallel = split && (end - first).div_ceil(TILE) >= PARALLEL_TILES && rayon::current_num_threads() > 1;
            // Tiles only where the work splits: on one thread a row's whole range in one pass measured 2-4% faster at
            // 4k-8k positions (docs/worker.md), the L2 cache holding what a head reads.
            // Split: two tiles per thread (fewer, larger tasks: a 64-position tile is a microsecond or two of work).
            let threads = rayon::current_num_threads();
            let tile_len = if parallel {
                (end - first).div_ceil(2 * threads).next_multiple_of(8).max(TILE)
            } else {
                (end - first).max(1)
            };
            let tiles: Vec<usize> = (first..end).step_by(tile_len).collect();
            // The part of the tile from `t0` that row i attends over: (its positions' slots, the first one's index in
            // the row, the row's positions).
            let part = |i: usize, t0: usize| {
                let (lo, hi) = ranges[i];
                let (a, b) = (t0.max(lo), (t0 + tile_len).min(hi));
                (a < b).then(|| (&slots[a..b], a - lo, hi - lo))
            };
            // Row i's scores over `tile` into `w`: head h's at `w[h * stride..]`.
            let tile_scores = |i: usize, tile: &[usize], w: &mut [f32], stride: usize| {
                for g in 0..kv_heads {
                    let key = Key { keys, at: g * hd, hd };
                    for h0 in (g * group..(g + 1) * group).step_by(4) {
                        let (q, w) = (&q[i * qd + h0 * hd..], &mut w[h0 * stride..]);
                        match ((g + 1) * group - h0).min(4) {
                            4 => $scores::<S, 4, 1>([q], hd, tile, key, scale, [stride], [w]),
                            3 => $scores::<S, 3, 1>([q], hd, tile, key, scale, [stride], [w]),
                            2 => $scores::<S, 2, 1>([q], hd, tile, key, scale, [stride], [w]),
                            _ => $scores::<S, 1, 1>([q], hd, tile, key, scale, [stride], [w]),
                        }
                    }
                }
            };
            // The positions of the tile from `t0` that rows i and i + 1 both attend to (the same slots), where their
            // heads' scores go two rows at a time: at most three heads per KV head, so that twelve chains fit the
            // registers.
            let shared = |i: usize, t0: usize| {
                let ((lo0, hi0), (lo1, hi1)) = (ranges[i], *ranges.get(i + 1)?);
                let (a, b) = (t0.max(lo0).max(lo1), (t0 + tile_len).min(hi0).min(hi1));
                (group <= 3 && a < b).then_some((a, b))
            };
            // Rows i and i + 1's scores over `tile`, the slots from index `a` of both rows' ranges.
            let pair_scores = |i: usize, tile: &[usize], a: usize, weights: &mut [f32]| {
                let ((lo0, hi0), (lo1, hi1)) = (ranges[i], ranges[i + 1]);
                let n = [hi0 - lo0, hi1 - lo1];
                let (w0, w1) = weights.split_at_mut(starts[i + 1]);
                let (w0, w1) = (&mut w0[starts[i] + a - lo0..], &mut w1[a - lo1..]);
                for g in 0..kv_heads {
                    let key = Key { keys, at: g * hd, hd };
                    let h0 = g * group;
                    let q = [&q[i * qd + h0 * hd..], &q[(i + 1) * qd + h0 * hd..]];
                    let w = [&mut w0[h0 * n[0]..], &mut w1[h0 * n[1]..]];
                    match group {
                        3 => $scores::<S, 3, 2>(q, hd, tile, key, scale, n, w),
                        2 => $scores::<S, 2, 2>(q, hd, tile, key, scale, n, w),
                        _ => $scores::<S, 1, 2>(q, hd, tile, key, scale, n, w),
                    }
                }
            };
            if parallel {
                // Each tile into a buffer of its own (row after row, head after head), then into place.
                let bufs = tasks(true, tiles.clone(), |t0| {
                    let mut buf = Vec::new();
                    for i in 0..ranges.len() {
                        if let Some((tile, _, _)) = part(i, t0) {
                            let at = buf.len();
                            buf.resize(at + heads * tile.len(), 0.0);
                            tile_scores(i, tile, &mut buf[at..], tile.len());
                        }
                    }
                    buf
                });
                for (&t0, buf) in tiles.iter().zip(bufs) {
                    let mut runs = buf.as_slice();
                    for i in 0..ranges.len() {
                        let Some((tile, p0, n)) = part(i, t0) else { continue };
                        for h in 0..heads {
                            let (run, rest) = runs.split_at(tile.len());
                            weights[starts[i] + h * n + p0..][..tile.len()].copy_from_slice(run);
                            runs = rest;
                        }
                    }
                }
            } else {
                for &t0 in &tiles {
                    let mut i = 0;
                    while i < ranges.len() {
                        // Rows i and i + 1 over the positions both attend to (one sequence's prefill rows) together,
                        // then each row's other positions alone.
                        let Some((a, b)) = shared(i, t0) else {
                            if let Some((tile, p0, n)) = part(i, t0) {
                                tile_scores(i, tile, &mut weights[starts[i] + p0..], n);
                            }
                            i += 1;
                            continue;
                        };
                        pair_scores(i, &slots[a..b], a, &mut weights);
                        for r in [i, i + 1] {
                            let (lo, hi) = ranges[r];
                            let (ra, rb) = (t0.max(lo), (t0 + tile_len).min(hi));
                            for (x, y) in [(ra, a), (b, rb)] {
                                if x < y {
                                    tile_scores(r, &slots[x..y], &mut weights[starts[r] + x - lo..], hi - lo);
                                }
                            }
                        }
                        i += 2;
                    }
                }
            }
            let mut runs = Vec::with_capacity(ranges.len() * heads);
            let mut rest = &mut weights[..];
            for &(lo, hi) in ranges {
                let (row, tail) = rest.split_at_mut(heads * (hi - lo));
                runs.extend(row.chunks_exact_mut((hi - lo).max(1)));
                rest = tail;
            }
            // A closure: it takes this function's instruction set, which includes AVX2.
            #[allow(clippy::redundant_closure)]
            tasks(parallel, runs, |w| softmax_avx2(w));
            // Split with few KV heads: narrower jobs, so that every thread gets some (even widths still).
            let step = match parallel {
                false => $step,
                true if kv_heads * chunks.div_ceil($split_step) < 2 * threads => $split_step / 2,
                true => $split_step,
            };
            // Values, per KV head and `step` output chunks: up to three heads of the group at a time, so each widened value
            // chunk serves every head of the batch and the sums stay in registers; they start from (and go
            // back to) the output between tiles, which keeps each output's chain of additions whole. Into `o`, where row
            // i's head `g * group + j` is at `i * stride + j * hd` (less `skip` heads' worth).
            let sums = |g: usize, c0: usize, o: &mut [f32], stride: usize, skip: usize| {
                for &t0 in &tiles {
                    for i in 0..ranges.len() {
                        let Some((tile, p0, n)) = part(i, t0) else { continue };
                        for h0 in (g * group..(g + 1) * group).step_by(3) {
                            let batch = ((g + 1) * group - h0).min(3);
                            let w = &weights[starts[i] + h0 * n + p0..];
                            let o = &mut o[i * stride + (h0 - skip) * hd + 8 * c0..];
                            let v = Values { w, n, slots: tile, values, at: g * hd + 8 * c0, hd };
                            let width = (chunks - c0).min(step);
                            match batch {
                                3 => $values::<S, 3>(&v, o, width),
                                2 => $values::<S, 2>(&v, o, width),
                                _ => $values::<S, 1>(&v, o, width),
                            }
                        }
                    }
                }
            };
            out.fill(0.0);
            let jobs: Vec<(usize, usize)> =
                (0..kv_heads).flat_map(|g| (0..chunks).step_by(step).map(move |c0| (g, c0))).collect();
            if !parallel {
                for &(g, c0) in &jobs {
                    sums(g, c0, out, qd, 0);
                }
                return;
            }
            // Split: each KV head's four chunks into a buffer of their own (row i, head j of the group at
            // `(i * group + j) * hd`), then into place.
            let parts = tasks(true, jobs.clone(), |(g, c0)| {
                let mut local = vec![0f32; ranges.len() * group * hd];
                sums(g, c0, &mut local, group * hd, g * group);
                local
            });
            for ((g, c0), local) in jobs.into_iter().zip(parts) {
                let width = 8 * (chunks - c0).min(step);
                for i in 0..ranges.len() {
                    for j in 0..group {
                        let from = (i * group + j) * hd + 8 * c0;
                        let to = i * qd + (g * group + j) * hd + 8 * c0;
                        out[to..to + width].copy_from_slice(&local[from..from + width]);
                    }
                }
            }
        }
    };
}

// The AVX2 level's passes over a row's positions take three chunks: nine sums and three heads' weights in registers.
// Split jobs take four (eight chunks evenly over the threads), their weights loaded at each use where the storage
// asks for it ([`Source::WEIGHTS_FROM_MEMORY`]; see docs/worker.md).
rows_level!(attention_rows_avx2, "avx2,fma,f16c", scores, values_avx2, 3, 4);
rows_level!(attention_rows_avx512, "avx2,fma,f16c,avx512f,avx512bw,avx512vl", scores_avx512_rows, values_avx512, 8, 8);

/// [`Values::sum`] of `width` chunks of eight (at most four).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn values_avx2<S: Source, const B: usize>(v: &Values<'_, S>, o: &mut [f32], width: usize) {
    match width {
        4 => v.sum::<B, 4>(o),
        3 => v.sum::<B, 3>(o),
        2 => v.sum::<B, 2>(o),
        _ => v.sum::<B, 1>(o),
    }
}

/// `f` over `items`, on the threads when `parallel`, the results in order.
fn tasks<T: Send, R: Send>(parallel: bool, items: Vec<T>, f: impl Fn(T) -> R + Sync + Send) -> Vec<R> {
    if parallel { team::map(items, f) } else { items.into_iter().map(f).collect() }
}

/// Tiles from which a call splits its work over the threads.
const PARALLEL_TILES: usize = 4;

/// Positions per tile at least when a range splits over the threads (two tiles per thread); a range of fewer than
/// [`PARALLEL_TILES`] of them does not split.
const TILE: usize = 64;

/// Scaled scores of `B` consecutive heads of `R` rows (row r's queries in `q[r]`, `hd` each, sharing the KV head
/// `key`) for every position in `slots`, into `out[r][i * n[r] + p]` for head `i`: eight positions at a time, each
/// head's eight lanes per position kept on the stack and summed together. Two rows (one sequence's prefill rows over
/// the positions they share) widen each key chunk once for both, and their twelve chains of fused multiply-adds
/// overlap where one row's six waited on the multiply-add latency; each chain is a row's alone, so the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn scores<S: Source, const B: usize, const R: usize>(
    q: [&[f32]; R],
    hd: usize,
    slots: &[usize],
    key: Key<S>,
    scale: f32,
    n: [usize; R],
    mut out: [&mut [f32]; R],
) {
    // The rows' heads' queries chunk-major (`qt[c * R * B + r * B + i]` is row r's head i's chunk c), so the inner
    // loop runs on fixed-size chunks without bounds checks.
    let mut qt = vec![[0f32; 8]; hd / 8 * R * B];
    for (c, qc) in qt.chunks_exact_mut(R * B).enumerate() {
        for (j, v) in qc.iter_mut().enumerate() {
            let (r, i) = (j / B, j % B);
            v.copy_from_slice(&q[r][i * hd + 8 * c..i * hd + 8 * c + 8]);
        }
    }
    let mut lanes = [[[0f32; 64]; B]; R];
    for (block, block_slots) in slots.chunks(8).enumerate() {
        // Two positions side by side: their chains of fused multiply-adds are independent, so they overlap.
        let mut pairs = block_slots.chunks_exact(2);
        for (pair, two) in pairs.by_ref().enumerate() {
            let ahead = block * 8 + 2 * pair + AHEAD;
            for far in slots.iter().skip(ahead).take(2) {
                key.keys.prefetch(far + key.at, key.hd);
            }
            let (k0, k1) = (two[0] + key.at, two[1] + key.at);
            key.keys.check(k0, hd);
            key.keys.check(k1, hd);
            let (mut a0, mut a1) = ([[_mm256_setzero_ps(); B]; R], [[_mm256_setzero_ps(); B]; R]);
            for (c, qc) in qt.chunks_exact(R * B).enumerate() {
                // SAFETY: chunk c < hd / 8 (qt's chunks), inside the runs of hd values checked above.
                let (c0, c1) = unsafe { (key.keys.load8_unchecked(k0 + 8 * c), key.keys.load8_unchecked(k1 + 8 * c)) };
                for r in 0..R {
                    for i in 0..B {
                        let qv = load8f(&qc[r * B + i]);
                        a0[r][i] = _mm256_fmadd_ps(qv, c0, a0[r][i]);
                        a1[r][i] = _mm256_fmadd_ps(qv, c1, a1[r][i]);
                    }
                }
            }
            // The pair's lanes added in pairs at once (the first level of each position's tree of sums, as
            // `pair_scores8` finishes it): half the stores and loads of keeping every position's eight lanes.
            for r in 0..R {
                for (l, (x0, x1)) in lanes[r].iter_mut().zip(a0[r].iter().zip(&a1[r])) {
                    store8f(&mut l[8 * pair..], _mm256_hadd_ps(*x0, *x1));
                }
            }
        }
        if let [slot] = *pairs.remainder() {
            let j = block_slots.len() - 1;
            let mut acc = [[_mm256_setzero_ps(); B]; R];
            key.keys.check(slot + key.at, hd);
            for (c, qc) in qt.chunks_exact(R * B).enumerate() {
                // SAFETY: chunk c < hd / 8, inside the run checked above.
                let kc = unsafe { key.keys.load8_unchecked(slot + key.at + 8 * c) };
                for (r, a) in acc.iter_mut().enumerate() {
                    for (a, qv) in a.iter_mut().zip(&qc[r * B..(r + 1) * B]) {
                        *a = _mm256_fmadd_ps(load8f(qv), kc, *a);
                    }
                }
            }
            // Its own eight lanes, after the pairs' (`pair_scores8`).
            for (l, a) in lanes.iter_mut().zip(&acc) {
                for (l, a) in l.iter_mut().zip(a) {
                    store8f(&mut l[8 * (j / 2)..], *a);
                }
            }
        }
        let p0 = block * 8;
        for (r, out) in out.iter_mut().enumerate() {
            for (i, l) in lanes[r].iter().enumerate() {
                let o = &mut out[i * n[r] + p0..i * n[r] + p0 + block_slots.len()];
                pair_scores8(&l[..8 * block_slots.len().div_ceil(2)], scale, o);
            }
        }
    }
}

/// The AVX-512 level's scores of `R` rows ([`scores`]' arguments): one row after the other (its thirty-two
/// registers already hold enough chains for one).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[inline]
fn scores_avx512_rows<S: Source, const B: usize, const R: usize>(
    q: [&[f32]; R],
    hd: usize,
    slots: &[usize],
    key: Key<S>,
    scale: f32,
    n: [usize; R],
    out: [&mut [f32]; R],
) {
    for ((q, n), out) in q.into_iter().zip(n).zip(out) {
        scores_avx512::<S, B>(q, hd, slots, key, scale, n, out);
    }
}

impl<S: Source> Values<'_, S> {
    /// `W` chunks of eight output values for `B` heads: `w[p] * value_p` added to them in position order, each
    /// widened chunk used by all `B` heads, the sums and the position's weights held in registers across the
    /// positions (four chunks over f16 values: each weight broadcast from memory at each use,
    /// [`Source::WEIGHTS_FROM_MEMORY`], so that the twelve sums fit).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn sum<const B: usize, const W: usize>(&self, out: &mut [f32]) {
        let Values { w, n, slots, values, at, hd } = *self;
        let mut acc = [[_mm256_setzero_ps(); W]; B];
        for (i, a) in acc.iter_mut().enumerate() {
            for (c, v) in a.iter_mut().enumerate() {
                *v = load8f(&out[i * hd + 8 * c..]);
            }
        }
        // Every head's weights for every position, checked once for the loop's reads below.
        assert!(slots.len() <= n && w.len() >= (B - 1) * n + slots.len(), "weights for {B} heads");
        for (p, &slot) in slots.iter().enumerate() {
            if let Some(&far) = slots.get(p + AHEAD) {
                values.prefetch(far + at, 8 * W);
            }
            values.check(slot + at, 8 * W);
            for c in 0..W {
                // SAFETY: c < W, inside the run of 8 * W values checked above.
                let vc = unsafe { values.load8_unchecked(slot + at + 8 * c) };
                for (i, a) in acc.iter_mut().enumerate() {
                    // SAFETY: i < B and p < slots.len(), so i * n + p is inside the weights checked above.
                    let weight = unsafe { w.as_ptr().add(i * n + p) };
                    // Held in a register across the chunks (LLVM merges the plain loads), or loaded at each use.
                    let from_memory = W > 3 && S::WEIGHTS_FROM_MEMORY;
                    // SAFETY: `weight` is readable (above).
                    let wi = unsafe { if from_memory { broadcast_f32(weight) } else { _mm256_set1_ps(*weight) } };
                    a[c] = _mm256_fmadd_ps(wi, vc, a[c]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (c, v) in a.iter().enumerate() {
                store8f(&mut out[i * hd + 8 * c..], *v);
            }
        }
    }
}

/// `*p` in every lane, broadcast from memory at each use (`vbroadcastss ymm, m32`: a load, no shuffle). Held in
/// registers, a batch's three weights and its twelve sums need sixteen, one more than the loop has besides its value
/// chunk, and LLVM spilled two sums to the stack on every position's chain of additions.
///
/// # Safety
/// `p` points to a readable f32.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn broadcast_f32(p: *const f32) -> __m256 {
    let v: __m256;
    // SAFETY: the caller's `p` is readable; the instruction writes only `v`, and the function has AVX2. Not `pure`:
    // LLVM must not merge the loads into one register again.
    unsafe {
        std::arch::asm!(
            "vbroadcastss {v}, dword ptr [{p}]",
            v = out(ymm_reg) v,
            p = in(reg) p,
            options(readonly, nostack, preserves_flags),
        );
    }
    v
}
