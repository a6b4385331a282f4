//! The batch kernels of CPUs without AVX-512: the design of the AVX-512 batch kernel
//! (`wide512.rs`) on 256-bit registers, on the combined `256·q₁ + q₂` activations in i16.
//!
//! Layout. A register holds one eighth of a pair (eight values) for two tokens, one token per
//! 128 bits, so a quad of tokens ([`QActs::q16_quad`]) is two registers; the row's same eight
//! weights, widened to i16, are broadcast to both halves. The eight products of a pair
//! accumulate into one register of (token, block) lanes, and a pair's scales are applied once
//! per row and two tokens: one conversion, one multiply and two FMAs.
//!
//! Why. The per-token tiles spend, per pair, row and token, four activation loads, four
//! `vpmaddwd` and three adds (plain AVX2, `wide.rs`), or four `vpdpbusd` and a shift on the two
//! i8 levels (AVX-VNNI), and a quarter of a reduction and scaling. Here each activation load
//! serves every row of the tile and each weight load both tokens of a register: per pair, row
//! and token, four `vpdpwssd` (AVX-VNNI) or four `vpmaddwd` and four adds (plain AVX2).
//!
//! The two kernels differ in their target features and their multiply-add only, so one macro
//! writes both: each tile is inlined into a function compiled with its kernel's features.

use super::*;

/// Row `r`'s pairs widened into `dst`: unsigned i16 in the Q8 pair order (Q4 nibbles split, Q5
/// with their high bits added, Q8 as stored `q + 128`; Q8G16 as `q·s`; symmetric types less
/// their [`QMatrix::offset`], signed), scales and minimums in their lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_row(w: &QMatrix, r: usize, dst: &mut [WidePair]) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let row = w.qs.as_ptr().add(r * np * pb);
    for (p, d) in dst.iter_mut().enumerate() {
        let at = row.add(p * pb);
        let (x0, x1) = match w.format {
            QFormat::Q4_1 => pair_weights::<F_Q4>(at),
            QFormat::Q5 => pair_weights::<F_Q5>(at),
            QFormat::Q8_0 | QFormat::Q8G16 => pair_weights::<F_Q8>(at),
        };
        let q = d.q.as_mut_ptr() as *mut __m256i;
        let g16 = w.format == QFormat::Q8G16;
        let (slo, shi) =
            if g16 { g16_subscales(w, r, p) } else { (_mm_setzero_si128(), _mm_setzero_si128()) };
        for (i, (x, s)) in [(x0, slo), (x1, shi)].into_iter().enumerate() {
            let mut lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(x));
            let mut hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(x, 1));
            if g16 {
                // Signed values times their groups' sub-scales (see `g16_subscales`).
                let (bias, s) = (_mm256_set1_epi16(128), _mm256_broadcastsi128_si256(s));
                lo = _mm256_mullo_epi16(_mm256_sub_epi16(lo, bias), s);
                hi = _mm256_mullo_epi16(_mm256_sub_epi16(hi, bias), s);
            } else if let Some(z) = w.offset {
                // Symmetric types signed: no minimum term.
                let z = _mm256_set1_epi16(z as i16);
                (lo, hi) = (_mm256_sub_epi16(lo, z), _mm256_sub_epi16(hi, z));
            }
            _mm256_storeu_si256(q.add(2 * i), lo);
            _mm256_storeu_si256(q.add(2 * i + 1), hi);
        }
        store_wide_scales(w, r, p, d);
    }
}

/// `acc + w·x` on i16 pairs with AVX-VNNI's `vpdpwssd`, written out: the intrinsic is compiled
/// as `vpmaddwd` and `vpaddd` without a tuned target CPU.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn dp_vnni(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    let mut acc = acc;
    std::arch::asm!(
        "{{vex}} vpdpwssd {0}, {1}, {2}",
        inout(ymm_reg) acc,
        in(ymm_reg) w,
        in(ymm_reg) x,
        options(pure, nomem, nostack),
    );
    acc
}

/// `acc + w·x` on i16 pairs with plain AVX2. Each lane adds two products of at most
/// 255 · 32639; a pair's 64 stay far within i32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dp_plain(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(w, x))
}

/// Writes a kernel module: `rows` and its tile, compiled with `$features`, multiply-adding by
/// `$dp`, `$rt` rows per tile.
macro_rules! kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $dp:ident, $rt:literal) => {
        $(#[$doc])*
        pub(super) mod $name {
            use super::*;

            /// Rows per tile: with a quad of tokens, each row keeps two integer sums and two
            /// float accumulators in registers, beside two activation registers, a broadcast
            /// weight and (plain AVX2) a product: three rows fit the sixteen registers with
            /// `vpdpwssd`, two without (three spilled: Gemma 3 270M Q4_K_M batched decode's
            /// gate|up, 1.60 s with three rows, 1.35 s with two, forced AVX2 on a 2-core
            /// AMD EPYC family 26 model 2 (Zen 5)).
            const RT: usize = $rt;

            /// Rows `rows` of `out = a · wᵀ` for batches; `a` must carry
            /// [`QActs::q16_quad`].
            #[target_feature(enable = $features)]
            pub(in super::super) unsafe fn rows(
                w: &QMatrix,
                a: &QActs,
                rows: std::ops::Range<usize>,
                out: *mut f32,
            ) {
                if w.offset.is_some() {
                    rows_of::<false>(w, a, rows, out)
                } else {
                    rows_of::<true>(w, a, rows, out)
                }
            }

            /// [`rows`]; `MIN`: the widened weights carry a minimum term (else they are
            /// signed and it is skipped).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn rows_of<const MIN: bool>(
                w: &QMatrix,
                a: &QActs,
                rows: std::ops::Range<usize>,
                out: *mut f32,
            ) {
                let np = w.npairs;
                let quads = a.t.div_ceil(4);
                assert_eq!(
                    a.q16_quad.len(),
                    quads * np * 256,
                    "activations quantised without the quad layout"
                );
                // As in `wide512::rows`: the closure loops and calls functions compiled with
                // the kernel's features; it touches no vector type itself.
                SCRATCH.with(|cell| {
                    let mut scratch = cell.borrow_mut();
                    scratch.resize(RT * np, WidePair::ZERO);
                    let block = (L2_ACTS / (np * QUAD_PAIR_BYTES)).max(1);
                    let mut q0 = 0;
                    while q0 < quads {
                        let q1 = (q0 + block).min(quads);
                        let mut r = rows.start;
                        while r < rows.end {
                            let rt = (rows.end - r).min(RT);
                            for i in 0..rt {
                                prefetch_row(w, r + RT + i);
                                widen_row(w, r + i, &mut scratch[i * np..(i + 1) * np]);
                            }
                            let sc = scratch.as_ptr();
                            for q in q0..q1 {
                                match rt {
                                    3 => tile::<3, MIN>(w, sc, r, a, q, out),
                                    2 => tile::<2, MIN>(w, sc, r, a, q, out),
                                    _ => tile::<1, MIN>(w, sc, r, a, q, out),
                                }
                            }
                            r += rt;
                        }
                        q0 = q1;
                    }
                })
            }

            /// R rows (widened in `sc`, row `i` at `sc[i·npairs..]`) × the tokens of quad `q`.
            // Rows and halves index several register arrays at once.
            #[allow(clippy::needless_range_loop)]
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn tile<const R: usize, const MIN: bool>(
                w: &QMatrix,
                sc: *const WidePair,
                r0: usize,
                a: &QActs,
                q: usize,
                out: *mut f32,
            ) {
                let np = w.npairs;
                // acc[i][h]: row i, tokens 4q + 2h (low 128 bits) and 4q + 2h + 1 (high).
                let mut acc = [[_mm256_setzero_ps(); 2]; R];
                for p in 0..np {
                    let x = a.q16_quad.as_ptr().add((q * np + p) * 256);
                    let mut isum = [[_mm256_setzero_si256(); 2]; R];
                    for c in 0..8 {
                        let x0 = _mm256_loadu_si256(x.add(c * 32) as *const __m256i);
                        let x1 = _mm256_loadu_si256(x.add(c * 32 + 16) as *const __m256i);
                        for i in 0..R {
                            let wq = (*sc.add(i * np + p)).q.as_ptr().add(c * 8);
                            let wb =
                                _mm256_broadcastsi128_si256(_mm_loadu_si128(wq as *const __m128i));
                            if c == 0 {
                                isum[i][0] = _mm256_madd_epi16(wb, x0);
                                isum[i][1] = _mm256_madd_epi16(wb, x1);
                            } else {
                                isum[i][0] = $dp(isum[i][0], wb, x0);
                                isum[i][1] = $dp(isum[i][1], wb, x1);
                            }
                        }
                    }
                    let at = (q * np + p) * 16;
                    let da = [
                        _mm256_loadu_ps(a.d_quad.as_ptr().add(at)),
                        _mm256_loadu_ps(a.d_quad.as_ptr().add(at + 8)),
                    ];
                    for i in 0..R {
                        let pair = &*sc.add(i * np + p);
                        let dw = _mm256_broadcast_ps(&*(pair.dw.as_ptr() as *const __m128));
                        for h in 0..2 {
                            acc[i][h] = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(isum[i][h]),
                                _mm256_mul_ps(dw, da[h]),
                                acc[i][h],
                            );
                        }
                        if MIN {
                            let mw = _mm256_broadcast_ps(&*(pair.mw.as_ptr() as *const __m128));
                            for h in 0..2 {
                                let sa = _mm256_loadu_ps(a.s_quad.as_ptr().add(at + 8 * h));
                                acc[i][h] = _mm256_fmadd_ps(mw, sa, acc[i][h]);
                            }
                        }
                    }
                }
                // Each token's 128 bits summed: two horizontal adds leave tokens (0, 2) in the
                // low half and (1, 3) in the high half; the last quad's padding is not written.
                let t0 = q * 4;
                let live = a.t.saturating_sub(t0).min(4);
                for i in 0..R {
                    let h = _mm256_hadd_ps(acc[i][0], acc[i][1]);
                    let h = _mm256_hadd_ps(h, h);
                    let mut eight = [0f32; 8];
                    _mm256_storeu_ps(eight.as_mut_ptr(), h);
                    for (j, &at) in [0usize, 4, 1, 5].iter().enumerate().take(live) {
                        *out.add((t0 + j) * w.n + r0 + i) = eight[at];
                    }
                }
            }
        }
    };
}

kernel!(
    /// The AVX-VNNI batch kernel (`vpdpwssd` on 256 bits).
    vnni,
    "avx2,fma,f16c,avxvnni",
    dp_vnni,
    3
);

kernel!(
    /// The plain AVX2 batch kernel (`vpmaddwd` and `vpaddd`).
    plain,
    "avx2,fma,f16c",
    dp_plain,
    2
);
