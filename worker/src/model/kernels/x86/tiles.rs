//! The tiled integer kernels of every x86 level, written once: `tile_kernels!` expands them into a level's module
//! compiled with that level's target features, and with its 16-bit pair product (`vpmaddwd` and adds in AVX2,
//! `vpdpwssd` with AVX-512 VNNI: exact integer sums either way, so every level computes the same bits). Eight
//! output features per vector, up to eight batch rows per pass; each format's kernel the portable reference's
//! operations in its order.

/// The tile kernels compiled with `$features` (a `target_feature` list that includes AVX2, FMA and F16C), the pair
/// product `$pairs::<R>(s, w0, x0, w1, x1)` = `s + w0 · x0 + w1 · x1` in 16-bit pairs summed to i32 lanes.
macro_rules! tile_kernels {
    ($features:literal, $pairs:ident) => {
        use std::arch::x86_64::*;

        use super::super::QK;
        use super::super::blocks::{BlockFormat, HALVES, TileBuf, tile_s_at};
        use super::super::quant::{QuantizedRows, XBlock};
        use super::super::weight::{TILE, Weight};
        use super::simd::{
            PICK_A, PICK_A_HIGH, PICK_B, PICK_B_HIGH, broadcast2, half_nibbles, legacy_bytes, load8f, load8h, load32,
            load32u, prefetch, prefetch_legacy, q6k_bytes, row_blocks, shuffle, store8f, store32, tile,
            tile_row_groups, widen_bytes, widen8, widen8_signed, with_fifth_bit,
        };
        use super::unpack::unpack_avx2;

        /// Whether [`tiled_columns`] decodes `weight`'s tiles once for all of `rows` batch rows ([`unpack_tile`])
        /// rather than once per group of rows: where the formats' decoding costs more than reading its bytes back
        /// does. Q6_K above 16 rows (kernel bench, 576x1536 on one thread: 1.10x at 24 rows, 1.12x at 32, 1.17x at
        /// 64, 1.19x at 256; at 16, 1.03-1.08x there but 0.97x in 16-sequence decode, so not there); the fifth-bit
        /// formats (Q5_0, Q5_1, Q5_K) above 24 (1.03-1.05x at 32, 1.07-1.12x at 64 and 256, even at 24, 0.95x at
        /// 16); never Q4_0 and Q4_K, whose nibbles widen in as few instructions as bytes do (0.88-0.97x).
        fn unpacked_once(weight: &Weight, rows: usize) -> bool {
            match weight {
                Weight::Q6K { .. } => rows > 16,
                Weight::Legacy { qh, .. } | Weight::Q4K { qh, .. } => !qh.is_empty() && rows > 24,
                _ => false,
            }
        }

        /// The tiled integer kernels: for each tile of eight output features, a few batch rows at a time sweep the
        /// blocks. (F16C for the legacy formats' f16 scales: the AVX2 level has it.)
        #[target_feature(enable = $features)]
        pub(super) fn tiled_columns(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
            let tiles = c0 / TILE..(c0 + out[0].len()).div_ceil(TILE);
            // Formats whose values take several instructions to decode, for several groups of rows: each tile decoded
            // once into bytes, which every group then reads as the unpacked block formats' kernel does
            // (`block_rows`), instead of decoding them again per group.
            if unpacked_once(weight, out.len()) {
                let mut buf = TileBuf::default();
                for t in tiles {
                    let min = unpack_tile(&mut buf, weight, t);
                    tile_row_groups(out, c0, t, |n, r, acc| by_rows!(n, block_rows(&buf, min, xq, r, acc)));
                }
                return;
            }
            // Tile by tile: its weights come from memory once and stay in L1 for every group of rows.
            match weight {
                Weight::Q4_1 { .. } => sweep::<Q4_1>(weight, xq, tiles, c0, out),
                Weight::Q4K { qh, .. } if qh.is_empty() => sweep::<Q4_K>(weight, xq, tiles, c0, out),
                Weight::Q4K { .. } => sweep::<Q5_K>(weight, xq, tiles, c0, out),
                Weight::Q6K { .. } => sweep::<Q6_K>(weight, xq, tiles, c0, out),
                Weight::Legacy { format: BlockFormat::Q4_0, .. } => sweep::<Q4_0>(weight, xq, tiles, c0, out),
                Weight::Legacy { format: BlockFormat::Q5_0, .. } => sweep::<Q5_0>(weight, xq, tiles, c0, out),
                Weight::Legacy { .. } => sweep::<Q5_1>(weight, xq, tiles, c0, out),
                _ => sweep::<Q8_0>(weight, xq, tiles, c0, out),
            }
        }

        // The format kernels `sweep` takes, one per format (the fifth bits and the minimum as constants: each
        // format's loop without their branches).
        use super::simd::kernel::*;

        /// `tiles` for every batch row with format kernel `F`, a few rows at a time: a function of its own per
        /// format, so that every build compiles the hot loops alike. With every format's kernel inlined into
        /// [`tiled_columns`], some builds kept the one-row loop's pointers on the stack, reloading them every block,
        /// and one-sequence decode ran 10-18% slower than in builds that did not (an unrelated change elsewhere
        /// flipped it); called per tile instead, each call redid every format's setup. Here the loop holds its
        /// pointers in registers and nothing is decided per tile but the group's row count.
        #[target_feature(enable = $features)]
        #[inline(never)]
        fn sweep<const F: u8>(
            weight: &Weight,
            xq: &QuantizedRows,
            tiles: std::ops::Range<usize>,
            c0: usize,
            out: &mut [&mut [f32]],
        ) {
            for t in tiles {
                tile_row_groups(out, c0, t, |rows, r, acc| by_rows!(rows, tile_rows::<F>(weight, xq, t, r, acc)));
            }
        }

        /// Tile `t` of Q6_K or a fifth-bit format (Q5_0, Q5_1, Q5_K) as [`TileBuf`] holds the unpacked formats'
        /// tiles: each half's values as signed bytes (what the format's tile kernel widens, chunk by chunk) and its
        /// scale and minimum factors as f32, which [`block_rows`] applies with the operations of the format's kernel
        /// in its order. Returns whether the format has a minimum.
        #[target_feature(enable = $features)]
        fn unpack_tile(buf: &mut TileBuf, weight: &Weight, t: usize) -> bool {
            let bpr = weight.cols() / QK;
            buf.q.resize(bpr * 8 * QK, 0);
            buf.s.resize(bpr * HALVES * TILE, 0.0);
            buf.m.resize(bpr * HALVES * TILE, 0.0);
            let (s, m) = (buf.s.as_mut_slice(), buf.m.as_mut_slice());
            let mut put = |b: usize, h: usize, k: usize, bytes: __m256i| {
                store32(&mut buf.q[b * 8 * QK + (4 * h + k) * 32..], bytes)
            };
            match weight {
                Weight::Q6K { d, sc, ql, qh, .. } => {
                    let (ql, qh) = (tile(ql, t, bpr * 128), tile(qh, t, bpr / 2 * 128));
                    let (sc, d) = (tile(sc, t, bpr * HALVES * TILE), tile(d, t, bpr / 8 * TILE));
                    for b in 0..bpr {
                        let (q, hq) = (&ql[b * 128..], &qh[b / 2 * 128..]);
                        let dv = load8f(&d[b / 8 * TILE..]);
                        for h in 0..HALVES {
                            store8f(
                                &mut s[tile_s_at(b, h, 0)..],
                                _mm256_mul_ps(dv, widen8_signed(&sc[(b * HALVES + h) * TILE..])),
                            );
                            let shift = _mm_cvtsi32_si128((4 * (b % 2) + 2 * h) as i32);
                            for k in 0..4 {
                                put(b, h, k, q6k_bytes(load32u(&q[k * 32..]), load32u(&hq[k * 32..]), h, shift));
                            }
                        }
                    }
                    false
                }
                // Q5_0 and Q5_1 (the fifth-bit plane; `unpacked_once`).
                Weight::Legacy { format, d, m: mins, qs, qh, .. } => {
                    let offset = _mm256_set1_epi8(format.offset());
                    let (qs, qh) = (tile(qs, t, bpr * 128), tile(qh, t, bpr.div_ceil(4) * 128));
                    let d = tile(d, t, bpr * TILE);
                    let mins = if mins.is_empty() { &[][..] } else { tile(mins, t, bpr * TILE) };
                    for (b, q) in qs.chunks_exact(128).enumerate() {
                        for h in 0..HALVES {
                            store8f(&mut s[tile_s_at(b, h, 0)..], load8h(&d[b * TILE..]));
                            if !mins.is_empty() {
                                store8f(&mut m[tile_s_at(b, h, 0)..], load8h(&mins[b * TILE..]));
                            }
                            let shift = _mm_cvtsi32_si128((2 * (b % 4) + h) as i32);
                            for k in 0..4 {
                                let plane = load32u(&qh[b / 4 * 128 + k * 32..]);
                                put(b, h, k, legacy_bytes(load32u(&q[k * 32..]), Some(plane), h, shift, offset));
                            }
                        }
                    }
                    !mins.is_empty()
                }
                // Q5_K.
                Weight::Q4K { d, dmin, sc, mn, qs, qh, .. } => {
                    let sign = _mm256_set1_ps(-0.0);
                    let (qs, qh) = (tile(qs, t, bpr * 128), tile(qh, t, bpr.div_ceil(4) * 128));
                    let (sc, mn) = (tile(sc, t, bpr * TILE), tile(mn, t, bpr * TILE));
                    let (d, dmin) = (tile(d, t, bpr / 8 * TILE), tile(dmin, t, bpr / 8 * TILE));
                    for (b, q) in qs.chunks_exact(128).enumerate() {
                        let sb = b / 8 * TILE;
                        let scale = _mm256_mul_ps(load8f(&d[sb..]), widen8(&sc[b * TILE..]));
                        let min = _mm256_xor_ps(_mm256_mul_ps(load8f(&dmin[sb..]), widen8(&mn[b * TILE..])), sign);
                        for h in 0..HALVES {
                            store8f(&mut s[tile_s_at(b, h, 0)..], scale);
                            store8f(&mut m[tile_s_at(b, h, 0)..], min);
                            let shift = _mm_cvtsi32_si128((2 * (b % 4) + h) as i32);
                            for k in 0..4 {
                                let plane = load32u(&qh[b / 4 * 128 + k * 32..]);
                                put(b, h, k, with_fifth_bit(half_nibbles(load32u(&q[k * 32..]), h), plane, shift));
                            }
                        }
                    }
                    true
                }
                _ => unreachable!("only Q6_K and the fifth-bit formats are unpacked per tile"),
            }
        }

        /// Tile `t` for batch rows `r..r + R` into `acc[..R]`, with format kernel `F` (a constant: one arm).
        #[target_feature(enable = $features)]
        #[inline]
        fn tile_rows<const F: u8, const R: usize>(
            weight: &Weight,
            xq: &QuantizedRows,
            t: usize,
            r: usize,
            acc: &mut [__m256],
        ) {
            let rows = match F {
                Q4_1 => q4_1_tile::<R>(weight, xq, t, r),
                Q4_K => q4k_tile::<R, false>(weight, xq, t, r),
                Q5_K => q4k_tile::<R, true>(weight, xq, t, r),
                Q6_K => q6k_tile::<R>(weight, xq, t, r),
                Q4_0 => legacy_tile::<R, false, false>(weight, xq, t, r),
                Q5_0 => legacy_tile::<R, true, false>(weight, xq, t, r),
                Q5_1 => legacy_tile::<R, true, true>(weight, xq, t, r),
                _ => q8_0_tile::<R>(weight, xq, t, r),
            };
            acc[..R].copy_from_slice(&rows);
        }

        /// Tile `t`'s eight features for batch rows `r..r + R` (row `r + i` in lane vector `i`). Per block, a chunk of four
        /// elements of all eight features at a time, widened once for all rows to 16-bit pairs (each 32-bit lane a
        /// feature's two elements); each row's pair products with its two activation quants broadcast to all lanes
        /// (`vpmaddwd`) summed in i32 (exact: at most 32 * 15 * 32767 per block); then per row the scales and the
        /// minimum term as fused multiply-adds: the operations of `columns_int`'s Q4_1 reference, in its order, whatever
        /// `R` is. (The integer sum is exact in any order.)
        #[target_feature(enable = $features)]
        fn q4_1_tile<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize) -> [__m256; R] {
            let Weight::Q4_1 { cols, d, m, qs, .. } = weight else { unreachable!("Q4_1 only") };
            let bpr = cols / QK;
            let low4 = _mm256_set1_epi16(0x0f);
            let (pick_a, pick_b) = (shuffle(&PICK_A), shuffle(&PICK_B));
            let mut acc = [_mm256_setzero_ps(); R];
            let qs = tile(qs, t, bpr * 128);
            let (d, m) = (tile(d, t, bpr * TILE), tile(m, t, bpr * TILE));
            let (xs, stride) = row_blocks::<R>(xq, r);
            let sums = &xq.sums[r * bpr..(r + R) * bpr];
            for (b, ((q, dv), mv)) in
                qs.chunks_exact(128).zip(d.chunks_exact(TILE)).zip(m.chunks_exact(TILE)).enumerate()
            {
                let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
                prefetch(q, 128);
                prefetch(dv, 2 * TILE);
                prefetch(mv, 2 * TILE);
                let mut s = [_mm256_setzero_si256(); R];
                // Chunk k holds elements 4k..4k + 4 (low nibbles) and 16 + 4k.. (high nibbles) of every feature: as
                // pairs, activation pairs 2k and 2k + 1 (low) and 8 + 2k and 9 + 2k (high).
                for k in 0..4 {
                    let v = load32u(&q[k * 32..]);
                    let (a, b) = (_mm256_shuffle_epi8(v, pick_a), _mm256_shuffle_epi8(v, pick_b));
                    let w = [
                        _mm256_and_si256(a, low4),
                        _mm256_and_si256(b, low4),
                        _mm256_srli_epi16::<4>(a),
                        _mm256_srli_epi16::<4>(b),
                    ];
                    for i in 0..R {
                        let lo = $pairs::<R>(s[i], w[0], broadcast2(&x[i], 2 * k), w[1], broadcast2(&x[i], 2 * k + 1));
                        s[i] = $pairs::<R>(lo, w[2], broadcast2(&x[i], 8 + 2 * k), w[3], broadcast2(&x[i], 9 + 2 * k));
                    }
                }
                let (dw, mw) = (load8h(dv), load8h(mv));
                for i in 0..R {
                    acc[i] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(dw, _mm256_set1_ps(x[i].d)), acc[i]);
                    acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sums[i * bpr + b]), acc[i]);
                }
            }
            acc
        }

        /// [`q4_1_tile`] for Q4_K ([`Weight::Q4K`]): the same nibbles, one 16-value half at a time (low nibbles, then
        /// high), each half's i32 sums times `d * sc` and the activations' half sums times `-(dmin * mn)` (the block's
        /// 6-bit scales widened for all eight features at once), times the activations' scale, as fused multiply-adds:
        /// `columns_int`'s Q4_K reference, in its order. Q5_K (`HIGH`): the nibbles and the fifth bits joined in
        /// bytes, as [`legacy_tile`] does.
        #[target_feature(enable = $features)]
        fn q4k_tile<const R: usize, const HIGH: bool>(
            weight: &Weight,
            xq: &QuantizedRows,
            t: usize,
            r: usize,
        ) -> [__m256; R] {
            let Weight::Q4K { cols, d, dmin, sc, mn, qs, qh, .. } = weight else { unreachable!("Q4_K, Q5_K only") };
            let bpr = cols / QK;
            assert_eq!(HIGH, !qh.is_empty(), "the fifth-bit plane");
            let qh = if HIGH { tile(qh, t, bpr.div_ceil(4) * 128) } else { &[] };
            let picks = (shuffle(&PICK_A_HIGH), shuffle(&PICK_B_HIGH));
            let low4 = _mm256_set1_epi16(0x0f);
            let sign = _mm256_set1_ps(-0.0);
            let (pick_a, pick_b) = (shuffle(&PICK_A), shuffle(&PICK_B));
            let mut acc = [_mm256_setzero_ps(); R];
            let qs = tile(qs, t, bpr * 128);
            let (sc, mn) = (tile(sc, t, bpr * TILE), tile(mn, t, bpr * TILE));
            let (d, dmin) = (tile(d, t, bpr / 8 * TILE), tile(dmin, t, bpr / 8 * TILE));
            let (xs, stride) = row_blocks::<R>(xq, r);
            let isums = &xq.isums[r * bpr * HALVES..(r + R) * bpr * HALVES];
            for (b, q) in qs.chunks_exact(128).enumerate() {
                let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
                prefetch(q, 128);
                prefetch(&sc[b * TILE..], TILE);
                prefetch(&mn[b * TILE..], TILE);
                if HIGH {
                    prefetch(&qh[b * 32..], 32);
                }
                let sb = b / 8 * TILE;
                let s = _mm256_mul_ps(load8f(&d[sb..]), widen8(&sc[b * TILE..]));
                let m = _mm256_xor_ps(_mm256_mul_ps(load8f(&dmin[sb..]), widen8(&mn[b * TILE..])), sign);
                for h in 0..HALVES {
                    let mut s32 = [_mm256_setzero_si256(); R];
                    // Chunk k: elements 4k..4k + 4 (low nibbles: activation pairs 2k, 2k + 1) or 16 + 4k.. (high: 8 + 2k,
                    // 9 + 2k) of every feature.
                    let shift = _mm_cvtsi32_si128((2 * (b % 4) + h) as i32);
                    for k in 0..4 {
                        let v = load32u(&q[k * 32..]);
                        let w = if HIGH {
                            let plane = load32u(&qh[b / 4 * 128 + k * 32..]);
                            widen_bytes(with_fifth_bit(half_nibbles(v, h), plane, shift), picks)
                        } else {
                            let (a, c) = (_mm256_shuffle_epi8(v, pick_a), _mm256_shuffle_epi8(v, pick_b));
                            if h == 0 {
                                [_mm256_and_si256(a, low4), _mm256_and_si256(c, low4)]
                            } else {
                                [_mm256_srli_epi16::<4>(a), _mm256_srli_epi16::<4>(c)]
                            }
                        };
                        chunk_rows(&mut s32, w, x, 4 * h + k);
                    }
                    for i in 0..R {
                        let xd = _mm256_set1_ps(x[i].d);
                        let xsum = _mm256_set1_ps(isums[(i * bpr + b) * HALVES + h] as f32);
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[i]), _mm256_mul_ps(s, xd), acc[i]);
                        acc[i] = _mm256_fmadd_ps(xsum, _mm256_mul_ps(m, xd), acc[i]);
                    }
                }
            }
            acc
        }

        /// [`q4k_tile`] for Q6_K ([`Weight::Q6K`]): per half, the low nibbles as Q4_K's and the high bit pairs from
        /// their plane at the same byte positions, joined and offset by 32 once for all rows; each row's i32 sums times
        /// `d * sc` (the half's signed scales widened for all eight features) times the activations' scale as one fused
        /// multiply-add: `columns_int`'s Q6_K reference, in its order.
        #[target_feature(enable = $features)]
        fn q6k_tile<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize) -> [__m256; R] {
            let Weight::Q6K { cols, d, sc, ql, qh, .. } = weight else { unreachable!("Q6_K only") };
            let bpr = cols / QK;
            let picks = (shuffle(&PICK_A_HIGH), shuffle(&PICK_B_HIGH));
            let mut acc = [_mm256_setzero_ps(); R];
            let (ql, qh) = (tile(ql, t, bpr * 128), tile(qh, t, bpr / 2 * 128));
            let (sc, d) = (tile(sc, t, bpr * HALVES * TILE), tile(d, t, bpr / 8 * TILE));
            let (xs, stride) = row_blocks::<R>(xq, r);
            for b in 0..bpr {
                let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
                let (q, hq) = (&ql[b * 128..], &qh[b / 2 * 128..]);
                prefetch(q, 128);
                prefetch(&qh[b * 64..], 64);
                prefetch(&sc[b * HALVES * TILE..], HALVES * TILE);
                let dv = load8f(&d[b / 8 * TILE..]);
                for h in 0..HALVES {
                    let s = _mm256_mul_ps(dv, widen8_signed(&sc[(b * HALVES + h) * TILE..]));
                    let shift = _mm_cvtsi32_si128((4 * (b % 2) + 2 * h) as i32);
                    let mut s32 = [_mm256_setzero_si256(); R];
                    for k in 0..4 {
                        // In bytes (the chunk's 32 values of this half), then widened to 16-bit pairs.
                        let (v, hv) = (load32u(&q[k * 32..]), load32u(&hq[k * 32..]));
                        let w = widen_bytes(q6k_bytes(v, hv, h, shift), picks);
                        chunk_rows(&mut s32, w, x, 4 * h + k);
                    }
                    for i in 0..R {
                        acc[i] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(s32[i]),
                            _mm256_mul_ps(s, _mm256_set1_ps(x[i].d)),
                            acc[i],
                        );
                    }
                }
            }
            acc
        }

        /// [`q6k_tile`] for Q4_0, Q5_0 and Q5_1 ([`Weight::Legacy`]): per half, the nibbles, the fifth bits from their
        /// plane at the same byte positions, the offset, once for all rows; each row's i32 sums times `d` (f16, widened
        /// exactly) times the activations' scale, and for Q5_1 the activations' half sums times `m` the same way:
        /// `columns_int`'s reference, in its order.
        #[target_feature(enable = $features)]
        fn legacy_tile<const R: usize, const HIGH: bool, const MIN: bool>(
            weight: &Weight,
            xq: &QuantizedRows,
            t: usize,
            r: usize,
        ) -> [__m256; R] {
            let Weight::Legacy { format, cols, d, m, qs, qh, .. } = weight else { unreachable!("legacy formats only") };
            let bpr = cols / QK;
            let (high, min) = (HIGH, MIN);
            assert_eq!((high, min), (!qh.is_empty(), !m.is_empty()), "{format:?}'s planes");
            let offset = _mm256_set1_epi8(format.offset());
            let picks = (shuffle(&PICK_A_HIGH), shuffle(&PICK_B_HIGH));
            let mut acc = [_mm256_setzero_ps(); R];
            let qs = tile(qs, t, bpr * 128);
            let qh = if high { tile(qh, t, bpr.div_ceil(4) * 128) } else { &[] };
            let d = tile(d, t, bpr * TILE);
            let m = if min { tile(m, t, bpr * TILE) } else { &[] };
            let (xs, stride) = row_blocks::<R>(xq, r);
            let isums = &xq.isums[r * bpr * HALVES..(r + R) * bpr * HALVES];
            for (b, q) in qs.chunks_exact(128).enumerate() {
                let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
                prefetch_legacy(b, q, d, qh, m);
                let dv = load8h(&d[b * TILE..]);
                for h in 0..HALVES {
                    let shift = _mm_cvtsi32_si128((2 * (b % 4) + h) as i32);
                    let mut s32 = [_mm256_setzero_si256(); R];
                    for k in 0..4 {
                        // In bytes (the chunk's 32 values of this half), then widened to 16-bit pairs.
                        let v = load32u(&q[k * 32..]);
                        let plane = high.then(|| load32u(&qh[b / 4 * 128 + k * 32..]));
                        let w = widen_bytes(legacy_bytes(v, plane, h, shift, offset), picks);
                        chunk_rows(&mut s32, w, x, 4 * h + k);
                    }
                    for i in 0..R {
                        let xd = _mm256_set1_ps(x[i].d);
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[i]), _mm256_mul_ps(dv, xd), acc[i]);
                        if min {
                            let xsum = _mm256_set1_ps(isums[(i * bpr + b) * HALVES + h] as f32);
                            acc[i] = _mm256_fmadd_ps(xsum, _mm256_mul_ps(load8h(&m[b * TILE..]), xd), acc[i]);
                        }
                    }
                }
            }
            acc
        }

        /// Each row's pair products of one chunk's two vectors of 16-bit weight pairs `w` with its activation pairs
        /// `2p` and `2p + 1`, into its i32 sums `s` (exact).
        #[target_feature(enable = $features)]
        #[inline]
        fn chunk_rows<const R: usize>(s: &mut [__m256i; R], w: [__m256i; 2], x: &[XBlock; R], p: usize) {
            for i in 0..R {
                s[i] = $pairs::<R>(s[i], w[0], broadcast2(&x[i], 2 * p), w[1], broadcast2(&x[i], 2 * p + 1));
            }
        }

        /// The pair products of chunks `ks` of one block of a Q8_0-layout tile (chunk `k` holds elements `4k..4k + 4` of
        /// every feature: activation pairs `2k` and `2k + 1`), each sign-extended once for all rows to 16-bit pairs, into
        /// each row's i32 sums `s` (exact). Shared by Q8_0 (all eight chunks) and the unpacked block formats (four per
        /// 16-value half).
        #[target_feature(enable = $features)]
        #[inline]
        fn chunk_sums<const R: usize>(
            q: &[i8],
            x: &[XBlock; R],
            ks: std::ops::Range<usize>,
            (pick_a, pick_b): (__m256i, __m256i),
            s: &mut [__m256i; R],
        ) {
            for k in ks {
                let v = load32(&q[k * 32..]);
                let a = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(v, pick_a));
                let b = _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(v, pick_b));
                chunk_rows(s, [a, b], x, k);
            }
        }

        /// [`q4_1_tile`] for Q8_0: per block, a chunk of four elements of all eight features at a time, sign-extended once
        /// for all rows to 16-bit pairs, each row's pair products summed in i32 (exact: at most 32 * 128 * 32767), then
        /// the scales as one fused multiply-add: `columns_int`'s Q8_0 reference.
        #[target_feature(enable = $features)]
        fn q8_0_tile<const R: usize>(weight: &Weight, xq: &QuantizedRows, t: usize, r: usize) -> [__m256; R] {
            let Weight::Q8_0 { cols, d, qs, .. } = weight else { unreachable!("Q8_0 only") };
            let bpr = cols / QK;
            let (pick_a, pick_b) = (shuffle(&PICK_A_HIGH), shuffle(&PICK_B_HIGH));
            let mut acc = [_mm256_setzero_ps(); R];
            let qs = tile(qs, t, bpr * 256);
            let d = tile(d, t, bpr * TILE);
            let (xs, stride) = row_blocks::<R>(xq, r);
            for (b, (q, dv)) in qs.chunks_exact(256).zip(d.chunks_exact(TILE)).enumerate() {
                let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
                prefetch(q, 256);
                prefetch(dv, 2 * TILE);
                let mut s = [_mm256_setzero_si256(); R];
                chunk_sums(q, x, 0..8, (pick_a, pick_b), &mut s);
                let dw = load8h(dv);
                for i in 0..R {
                    acc[i] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(dw, _mm256_set1_ps(x[i].d)), acc[i]);
                }
            }
            acc
        }
        /// [`super::super::portable::columns_blocks`] in AVX2.
        #[target_feature(enable = $features)]
        pub(super) fn columns_blocks(weight: &Weight, xq: &QuantizedRows, c0: usize, out: &mut [&mut [f32]]) {
            let Weight::Blocks { format, rows, cols, raw } = weight else { unreachable!("block formats only") };
            let mut buf = TileBuf::default();
            let end = c0 + out[0].len();
            for t in c0 / TILE..end.div_ceil(TILE) {
                // Unpacked once, read by every group of rows while it sits in L1.
                unpack_avx2(&mut buf, *format, raw, *rows, *cols, t);
                let min = format.has_min();
                tile_row_groups(out, c0, t, |n, r, acc| by_rows!(n, block_rows(&buf, min, xq, r, acc)));
            }
        }

        /// The unpacked tile for batch rows `r..r + R` into `acc[..R]`: per block and half, four chunks of four elements
        /// of all eight features, sign-extended once for all rows to 16-bit pairs, each row's pair products summed in
        /// i32 (exact: at most 16 * 128 * 32767), then the scale (and the minimum) as fused multiply-adds.
        #[target_feature(enable = $features)]
        #[inline]
        fn block_rows<const R: usize>(buf: &TileBuf, min: bool, xq: &QuantizedRows, r: usize, acc: &mut [__m256]) {
            let bpr = xq.blocks_per_row;
            let (pick_a, pick_b) = (shuffle(&PICK_A_HIGH), shuffle(&PICK_B_HIGH));
            let mut a = [_mm256_setzero_ps(); R];
            let (xs, stride) = row_blocks::<R>(xq, r);
            let isums = &xq.isums[r * bpr * HALVES..(r + R) * bpr * HALVES];
            for (b, q) in buf.q.chunks_exact(8 * 32).enumerate().take(bpr) {
                let x: &[XBlock; R] = xs[b * stride..b * stride + R].try_into().expect("R blocks");
                for h in 0..HALVES {
                    let mut s = [_mm256_setzero_si256(); R];
                    chunk_sums(q, x, 4 * h..4 * h + 4, (pick_a, pick_b), &mut s);
                    let at = tile_s_at(b, h, 0);
                    let sw = load8f(&buf.s[at..]);
                    for i in 0..R {
                        a[i] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(sw, _mm256_set1_ps(x[i].d)), a[i]);
                    }
                    if min {
                        let mw = load8f(&buf.m[at..]);
                        for i in 0..R {
                            let xs = _mm256_set1_ps(isums[(i * bpr + b) * HALVES + h] as f32);
                            a[i] = _mm256_fmadd_ps(xs, _mm256_mul_ps(mw, _mm256_set1_ps(x[i].d)), a[i]);
                        }
                    }
                }
            }
            debug_assert_eq!(buf.q.len(), bpr * QK * 8);
            acc[..R].copy_from_slice(&a);
        }
    };
}
