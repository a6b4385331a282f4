//! The AVX-512 batch kernel on i16 activations: the combined `256·q₁ + q₂` of each activation
//! ([`QActs::q16_pair`], Q8 pair order) against weights widened to i16 once per pair and tile,
//! dot products by `vpdpwssd`. The two-level i8 kernel spends two `vpdpbusd` and a shift per
//! pair, row and token for the same integer sums; here two `vpdpwssd` give them exactly.
//!
//! Lanes. `vpmovzxbw` widens 32 weight bytes in order, so a 32-bit lane `k` holds bytes `2k`
//! and `2k + 1` of a four-byte group of one block: lanes go `(b₀, b₀, b₁, b₁)` in every 128
//! bits, and a pair's scales are broadcast as `(d₀, d₀, d₁, d₁)`.
//!
//! Minimum terms (`Σ m_w·s_a` per pair) are not added per pair: before the pair loop, each
//! row's `(d₀, d₁, m₀, m₁)` of four pairs at a time meet the token's `(0, 0, s₀, s₁)`
//! ([`QActs::s_pair`]), one FMA per four pairs instead of one per pair.

use super::*;

/// Rows `rows` of `out = a · wᵀ` for batches (`a.t ≥ 2`); `a` must carry [`QActs::q16_pair`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    assert_eq!(a.q16_pair.len(), a.qs.len(), "activations quantised without the pair-order i16");
    // Three rows × four tokens keep twelve accumulators, six widened weight vectors and three
    // scale vectors in registers; tokens go in blocks whose activations stay in L1.
    for tb in token_blocks(a.t, a.npairs * (64 * 2 + 2 * 2 * 4)) {
        let mut r = rows.start;
        while r < rows.end {
            let rt = (rows.end - r).min(3);
            let mut t0 = tb.start;
            while t0 < tb.end {
                let nt = (tb.end - t0).min(NT);
                match (rt, nt) {
                    (3, 4) => tile::<3, 4>(w, r, a, t0, out),
                    (3, 3) => tile::<3, 3>(w, r, a, t0, out),
                    (3, 2) => tile::<3, 2>(w, r, a, t0, out),
                    (3, _) => tile::<3, 1>(w, r, a, t0, out),
                    (2, 4) => tile::<2, 4>(w, r, a, t0, out),
                    (2, 3) => tile::<2, 3>(w, r, a, t0, out),
                    (2, 2) => tile::<2, 2>(w, r, a, t0, out),
                    (2, _) => tile::<2, 1>(w, r, a, t0, out),
                    (_, 4) => tile::<1, 4>(w, r, a, t0, out),
                    (_, 3) => tile::<1, 3>(w, r, a, t0, out),
                    (_, 2) => tile::<1, 2>(w, r, a, t0, out),
                    _ => tile::<1, 1>(w, r, a, t0, out),
                }
                t0 += nt;
            }
            r += rt;
        }
    }
}

/// A pair's 64 weights as unsigned i16 in the Q8 pair order: elements 0..16 of both blocks,
/// then 16..32 (Q4 nibbles split, Q5 with their high bits added, Q8 as stored `q + 128`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn widen(w: &QMatrix, row_base: *const u8, p: usize) -> [__m512i; 2] {
    let pb = w.format.pair_bytes();
    let at = row_base.add(p * pb);
    match w.format {
        QFormat::Q4_1 | QFormat::Q5 => {
            let v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(at as *const __m256i));
            let lo = _mm512_and_si512(v, _mm512_set1_epi16(0x0F));
            let hi = _mm512_srli_epi16(v, 4);
            if w.format == QFormat::Q4_1 {
                return [lo, hi];
            }
            let high = std::ptr::read_unaligned(at.add(32) as *const u64);
            let sixteen = _mm512_set1_epi16(16);
            [
                _mm512_mask_add_epi16(lo, high as u32, lo, sixteen),
                _mm512_mask_add_epi16(hi, (high >> 32) as u32, hi, sixteen),
            ]
        }
        QFormat::Q8_0 => [
            _mm512_cvtepu8_epi16(_mm256_loadu_si256(at as *const __m256i)),
            _mm512_cvtepu8_epi16(_mm256_loadu_si256(at.add(32) as *const __m256i)),
        ],
    }
}

/// `(x₀, x₁)` as `(x₀, x₀, x₁, x₁)` in every 128 bits.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair_lanes(x: __m128) -> __m512 {
    _mm512_broadcast_f32x4(_mm_unpacklo_ps(x, x))
}

/// RT rows × T tokens.
// Rows and tokens index several register arrays at once.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const RT: usize, const T: usize>(
    w: &QMatrix,
    r0: usize,
    a: &QActs,
    t0: usize,
    out: *mut f32,
) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let mut acc = min_terms::<RT, T>(w, r0, a, t0);
    for p in 0..np {
        let mut wv = [[_mm512_setzero_si512(); 2]; RT];
        let mut dw = [_mm512_setzero_ps(); RT];
        for i in 0..RT {
            let r = r0 + i;
            prefetch_pair(w, r + RT, p);
            wv[i] = widen(w, w.qs.as_ptr().add(r * np * pb), p);
            dw[i] = pair_lanes(pair_dm(w, r, p));
        }
        for t in 0..T {
            let at = (t0 + t) * np + p;
            let x = a.q16_pair.as_ptr().add(at * 64);
            let (xlo, xhi) =
                (_mm512_loadu_si512(x as *const _), _mm512_loadu_si512(x.add(32) as *const _));
            let da = _mm512_broadcast_f32x4(_mm_loadu_ps(a.d_pair.as_ptr().add(at * 4)));
            for i in 0..RT {
                // Written out: the intrinsic is compiled as `vpmaddwd` + `vpaddd` (one
                // instruction more per pair, row and token) without a tuned target CPU.
                let mut isum = _mm512_madd_epi16(wv[i][0], xlo);
                std::arch::asm!(
                    "vpdpwssd {0}, {1}, {2}",
                    inout(zmm_reg) isum,
                    in(zmm_reg) wv[i][1],
                    in(zmm_reg) xhi,
                    options(pure, nomem, nostack),
                );
                acc[i][t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[i], da), acc[i][t]);
            }
        }
    }
    for i in 0..RT {
        for t in 0..T {
            *out.add((t0 + t) * w.n + r0 + i) = _mm512_reduce_add_ps(acc[i][t]);
        }
    }
}

/// The tile's minimum terms, the accumulators' starting values: each row's `(d₀, d₁, m₀, m₁)`
/// of four pairs at a time against the token's [`QActs::s_pair`] `(0, 0, s₀, s₁)`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn min_terms<const RT: usize, const T: usize>(
    w: &QMatrix,
    r0: usize,
    a: &QActs,
    t0: usize,
) -> [[__m512; T]; RT] {
    let np = w.npairs;
    let np4 = np.next_multiple_of(4);
    let mut acc = [[_mm512_setzero_ps(); T]; RT];
    for p in (0..np).step_by(4) {
        // The last row's f16 scales end the matrix: masked, not read past.
        let lanes = ((1u32 << (4 * (np - p).min(4))) - 1) as u16;
        let mut wm = [_mm512_setzero_ps(); RT];
        for i in 0..RT {
            let at = w.dm.as_ptr().add(((r0 + i) * np + p) * 4);
            wm[i] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, at as *const i16));
        }
        for t in 0..T {
            let sv = _mm512_loadu_ps(a.s_pair.as_ptr().add(((t0 + t) * np4 + p) * 4));
            for i in 0..RT {
                acc[i][t] = _mm512_fmadd_ps(wm[i], sv, acc[i][t]);
            }
        }
    }
    acc
}
