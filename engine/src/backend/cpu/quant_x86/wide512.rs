//! The AVX-512 batch kernel on i16 activations: the combined `256·q₁ + q₂` of each activation
//! against weights widened to i16, dot products by `vpdpwssd`, four tokens per instruction.
//!
//! Layout. A 512-bit register holds one eighth of a pair (eight values) for four tokens, one
//! token per 128 bits ([`QActs::q16_quad`]); the row's same eight weights are broadcast to all
//! four. So the eight `vpdpwssd` of a pair accumulate into one register of (token, block)
//! lanes — 32-bit lanes `(b₀, b₀, b₁, b₁)` in each token's 128 bits, as the eight values are two
//! four-byte groups of the Q8 pair order — and a pair's scales are applied once for the four
//! tokens: one conversion, one multiply and two FMAs per pair, row and quad, where the
//! two-level i8 tiles spend a shift, a conversion, a multiply and two FMAs per pair, row and
//! token besides two `vpdpbusd`.
//!
//! Weights are widened once per row group and token block into a per-thread scratch
//! (`(d₀, d₀, d₁, d₁)`, `(m₀, m₀, m₁, m₁)` and the pair's 64 values as i16), from which each
//! eighth is broadcast.

use super::*;

/// Rows per tile.
const RT: usize = 4;

/// Quads of tokens per tile.
const QT: usize = 3;

/// Rows `rows` of `out = a · wᵀ` for batches; `a` must carry [`QActs::q16_quad`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    if w.offset.is_some() {
        rows_of::<false>(w, a, rows, out)
    } else {
        rows_of::<true>(w, a, rows, out)
    }
}

/// [`rows`]; `MIN`: the widened weights carry a minimum term (else they are signed and it is
/// skipped).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_of<const MIN: bool>(
    w: &QMatrix,
    a: &QActs,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    let np = w.npairs;
    let quads = a.t.div_ceil(4);
    assert_eq!(a.q16_quad.len(), quads * np * 256, "activations quantised without the quad layout");
    // The closure only loops and calls functions compiled with the kernel's features (the row
    // widening, a tile); it touches no vector type itself, so nothing is left out of line
    // (`engine/tests/simd_codegen.rs`). Moving the loop into a target-feature function, where
    // the widening inlines, measured no faster.
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        scratch.resize(RT * np, WidePair::ZERO);
        // Quads in blocks of whole tiles whose activations stay in L2 while the row groups go
        // by: each row group is widened once per block, so blocks are long.
        let block = (L2_ACTS / (np * QUAD_PAIR_BYTES) / QT * QT).max(QT);
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
                let mut q = q0;
                while q < q1 {
                    let nq = (q1 - q).min(QT);
                    match (rt, nq) {
                        (4, 3) => tile::<4, 3, MIN>(w, sc, r, a, q, out),
                        (4, 2) => tile::<4, 2, MIN>(w, sc, r, a, q, out),
                        (4, _) => tile::<4, 1, MIN>(w, sc, r, a, q, out),
                        (3, 3) => tile::<3, 3, MIN>(w, sc, r, a, q, out),
                        (3, 2) => tile::<3, 2, MIN>(w, sc, r, a, q, out),
                        (3, _) => tile::<3, 1, MIN>(w, sc, r, a, q, out),
                        (2, 3) => tile::<2, 3, MIN>(w, sc, r, a, q, out),
                        (2, 2) => tile::<2, 2, MIN>(w, sc, r, a, q, out),
                        (2, _) => tile::<2, 1, MIN>(w, sc, r, a, q, out),
                        (_, 3) => tile::<1, 3, MIN>(w, sc, r, a, q, out),
                        (_, 2) => tile::<1, 2, MIN>(w, sc, r, a, q, out),
                        (_, _) => tile::<1, 1, MIN>(w, sc, r, a, q, out),
                    }
                    q += nq;
                }
                r += rt;
            }
            q0 = q1;
        }
    })
}

/// Row `r`'s pairs widened into `dst`: unsigned i16 in the Q8 pair order (Q4 nibbles split, Q5
/// with their high bits added, Q8 as stored `q + 128`; Q8G16 as `q·s`; symmetric types less
/// their [`QMatrix::offset`], signed), scales and minimums in their lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
unsafe fn widen_row(w: &QMatrix, r: usize, dst: &mut [WidePair]) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let row = w.qs.as_ptr().add(r * np * pb);
    for (p, d) in dst.iter_mut().enumerate() {
        let at = row.add(p * pb);
        let (lo, hi) = match w.format {
            QFormat::Q4_1 | QFormat::Q5 => {
                let v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(at as *const __m256i));
                let lo = _mm512_and_si512(v, _mm512_set1_epi16(0x0F));
                let hi = _mm512_srli_epi16(v, 4);
                if w.format == QFormat::Q4_1 {
                    (lo, hi)
                } else {
                    let high = std::ptr::read_unaligned(at.add(32) as *const u64);
                    let sixteen = _mm512_set1_epi16(16);
                    (
                        _mm512_mask_add_epi16(lo, high as u32, lo, sixteen),
                        _mm512_mask_add_epi16(hi, (high >> 32) as u32, hi, sixteen),
                    )
                }
            }
            QFormat::Q8_0 => (
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(at as *const __m256i)),
                _mm512_cvtepu8_epi16(_mm256_loadu_si256(at.add(32) as *const __m256i)),
            ),
            QFormat::Q8G16 => {
                // Signed values times their groups' sub-scales (see `g16_subscales`); no
                // offset to take off after.
                let (slo, shi) = g16_subscales(w, r, p);
                let bias = _mm512_set1_epi16(128);
                let lo = _mm512_cvtepu8_epi16(_mm256_loadu_si256(at as *const __m256i));
                let hi = _mm512_cvtepu8_epi16(_mm256_loadu_si256(at.add(32) as *const __m256i));
                (
                    _mm512_mullo_epi16(_mm512_sub_epi16(lo, bias), _mm512_broadcast_i32x4(slo)),
                    _mm512_mullo_epi16(_mm512_sub_epi16(hi, bias), _mm512_broadcast_i32x4(shi)),
                )
            }
        };
        let (lo, hi) = match w.offset {
            // Symmetric types signed: no minimum term.
            Some(z) if w.format != QFormat::Q8G16 => {
                let z = _mm512_set1_epi16(z as i16);
                (_mm512_sub_epi16(lo, z), _mm512_sub_epi16(hi, z))
            }
            _ => (lo, hi),
        };
        _mm512_storeu_si512(d.q.as_mut_ptr() as *mut _, lo);
        _mm512_storeu_si512(d.q.as_mut_ptr().add(32) as *mut _, hi);
        store_wide_scales(w, r, p, d);
    }
}

/// `acc + w·x` on i16 pairs (`vpdpwssd`), written out: the intrinsic is compiled as `vpmaddwd`
/// and `vpaddd` without a tuned target CPU, one instruction more per eighth of a pair.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpwssd {0}, {1}, {2}",
        inout(zmm_reg) acc,
        in(zmm_reg) w,
        in(zmm_reg) x,
        options(pure, nomem, nostack),
    );
    acc
}

/// RT rows (widened in `sc`, row `i` at `sc[i·npairs..]`) × Q quads of tokens from quad `q0`.
// Rows and quads index several register arrays at once.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const R: usize, const Q: usize, const MIN: bool>(
    w: &QMatrix,
    sc: *const WidePair,
    r0: usize,
    a: &QActs,
    q0: usize,
    out: *mut f32,
) {
    let np = w.npairs;
    let mut acc = [[_mm512_setzero_ps(); Q]; R];
    for p in 0..np {
        let x = |q: usize, c: usize| a.q16_quad.as_ptr().add((((q0 + q) * np + p) * 8 + c) * 32);
        let mut isum = [[_mm512_setzero_si512(); Q]; R];
        for c in 0..8 {
            let mut xv = [_mm512_setzero_si512(); Q];
            for q in 0..Q {
                xv[q] = _mm512_loadu_si512(x(q, c) as *const _);
            }
            for i in 0..R {
                let wq = (*sc.add(i * np + p)).q.as_ptr().add(c * 8);
                let wb = _mm512_broadcast_i32x4(_mm_loadu_si128(wq as *const __m128i));
                for q in 0..Q {
                    isum[i][q] = if c == 0 {
                        _mm512_madd_epi16(wb, xv[q])
                    } else {
                        dpwssd(isum[i][q], wb, xv[q])
                    };
                }
            }
        }
        let mut da = [_mm512_setzero_ps(); Q];
        let mut sa = [_mm512_setzero_ps(); Q];
        for q in 0..Q {
            let at = ((q0 + q) * np + p) * 16;
            da[q] = _mm512_loadu_ps(a.d_quad.as_ptr().add(at));
            if MIN {
                sa[q] = _mm512_loadu_ps(a.s_quad.as_ptr().add(at));
            }
        }
        for i in 0..R {
            let pair = &*sc.add(i * np + p);
            let dw = _mm512_broadcast_f32x4(_mm_loadu_ps(pair.dw.as_ptr()));
            for q in 0..Q {
                acc[i][q] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(isum[i][q]),
                    _mm512_mul_ps(dw, da[q]),
                    acc[i][q],
                );
            }
            if MIN {
                let mw = _mm512_broadcast_f32x4(_mm_loadu_ps(pair.mw.as_ptr()));
                for q in 0..Q {
                    acc[i][q] = _mm512_fmadd_ps(mw, sa[q], acc[i][q]);
                }
            }
        }
    }
    // Each token's 128 bits summed; the last quad's padding is not written.
    for i in 0..R {
        for q in 0..Q {
            let v = acc[i][q];
            let parts = [
                _mm512_castps512_ps128(v),
                _mm512_extractf32x4_ps(v, 1),
                _mm512_extractf32x4_ps(v, 2),
                _mm512_extractf32x4_ps(v, 3),
            ];
            let sums =
                _mm_hadd_ps(_mm_hadd_ps(parts[0], parts[1]), _mm_hadd_ps(parts[2], parts[3]));
            let mut four = [0f32; 4];
            _mm_storeu_ps(four.as_mut_ptr(), sums);
            let t0 = (q0 + q) * 4;
            for (j, &v) in four.iter().enumerate().take(a.t.saturating_sub(t0)) {
                *out.add((t0 + j) * w.n + r0 + i) = v;
            }
        }
    }
}
