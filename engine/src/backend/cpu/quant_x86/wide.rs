//! The plain AVX2 kernel (CPUs without VNNI): weight bytes widened to i16 once per pair and
//! tile, activations read as the combined `256·q₁ + q₂` in i16 ([`QActs::q16`]), dot products
//! by `vpmaddwd` alone. The two-level i8 activations would take four `vpmaddubsw` and two
//! `vpmaddwd` per pair and token to combine their levels; here four `vpmaddwd` give the same
//! integer sums, so results equal the VNNI kernels' exactly.
//!
//! Lanes. Weight bytes widen without shuffles: masking a 16-bit lane keeps its even byte,
//! shifting it right by 8 its odd byte. So a product vector's 32-bit lane `k` sums bytes of
//! the four-byte group `k`, and lanes alternate blocks `(b₀, b₁)` as in the VNNI kernels,
//! whose reductions and epilogues apply unchanged.

use super::*;

/// A pair's 64 weights as four vectors of 16 × i16, in [`super::super::quant::wide_pos`]
/// order: even then odd bytes of elements 0..16 of both blocks, then of 16..32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn widen<const F: u8>(wq: *const u8) -> [__m256i; 4] {
    if F == F_Q4 {
        // The nibbles of a 16-bit lane: low ones of its even and odd byte, then high ones.
        let v = load256(wq as *const i8);
        let m = _mm256_set1_epi16(0x000F);
        [
            _mm256_and_si256(v, m),
            _mm256_and_si256(_mm256_srli_epi16(v, 8), m),
            _mm256_and_si256(_mm256_srli_epi16(v, 4), m),
            _mm256_srli_epi16(v, 12),
        ]
    } else {
        // Q8 as stored (`q + 128`, the minimum term removes the bias) and U6: unsigned bytes.
        let byte = _mm256_set1_epi16(0x00FF);
        let (x0, x1) = (load256(wq as *const i8), load256(wq.add(32) as *const i8));
        [
            _mm256_and_si256(x0, byte),
            _mm256_srli_epi16(x0, 8),
            _mm256_and_si256(x1, byte),
            _mm256_srli_epi16(x1, 8),
        ]
    }
}

/// `Σ w·a` of one pair against one token's 64 i16 activations, lanes alternating blocks.
/// Each lane adds two products of at most 255·32639 per `vpmaddwd`: far within i32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot(w: &[__m256i; 4], a: *const i16) -> __m256i {
    let a = a as *const __m256i;
    let (a0, a1) = (_mm256_loadu_si256(a), _mm256_loadu_si256(a.add(1)));
    let (a2, a3) = (_mm256_loadu_si256(a.add(2)), _mm256_loadu_si256(a.add(3)));
    let p01 = _mm256_add_epi32(_mm256_madd_epi16(w[0], a0), _mm256_madd_epi16(w[1], a1));
    let p23 = _mm256_add_epi32(_mm256_madd_epi16(w[2], a2), _mm256_madd_epi16(w[3], a3));
    _mm256_add_epi32(p01, p23)
}

/// Rows `rows` of `out = a · wᵀ`; `a` must carry [`QActs::q16`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    assert_eq!(a.q16.len(), a.qs.len(), "activations quantised without the i16 layout");
    match w.format {
        QFormat::Q4_1 => rows_of::<F_Q4>(w, a, rows, out),
        QFormat::Q8_0 => rows_of::<F_Q8>(w, a, rows, out),
        QFormat::U6 => rows_of::<F_U6>(w, a, rows, out),
    }
}

/// Decode takes four rows at a time; batches one row against eight or four tokens, in blocks
/// of tokens whose activations stay in L1 while the rows stream by.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_of<const F: u8>(
    w: &QMatrix,
    a: &QActs,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    if a.t == 1 {
        let mut r = rows.start;
        while r + 4 <= rows.end {
            rows_quad::<F>(w, r, a, out);
            r += 4;
        }
        for r in r..rows.end {
            tile::<1, F>(w, r, a, 0, out);
        }
        return;
    }
    for tb in token_blocks(a.t, a.npairs * (64 * 2 + 2 * 2 * 4)) {
        for r in rows.clone() {
            let mut t0 = tb.start;
            while t0 < tb.end {
                let left = tb.end - t0;
                let nt = match left {
                    8.. => {
                        tile_quads::<2, F>(w, r, a, t0, out);
                        8
                    }
                    4..=7 => {
                        tile_quads::<1, F>(w, r, a, t0, out);
                        4
                    }
                    3 => {
                        tile::<3, F>(w, r, a, t0, out);
                        3
                    }
                    2 => {
                        tile::<2, F>(w, r, a, t0, out);
                        2
                    }
                    _ => {
                        tile::<1, F>(w, r, a, t0, out);
                        1
                    }
                };
                t0 += nt;
            }
        }
    }
}

/// The i16 activations of token `t`, pair `p`.
#[inline]
unsafe fn acts(a: &QActs, t: usize, p: usize) -> *const i16 {
    a.q16.as_ptr().add((t * a.npairs + p) * 64)
}

/// One row × `4·Q` tokens (`t0` a multiple of four); the epilogue of `super`'s quad tiles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_quads<const Q: usize, const F: u8>(
    w: &QMatrix,
    r: usize,
    a: &QActs,
    t0: usize,
    out: *mut f32,
) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let mut acc = [_mm256_setzero_ps(); Q];
    for p in 0..np {
        let wv = widen::<F>(w.qs.as_ptr().add((r * np + p) * pb));
        let dm = pair_dm(w, r, p);
        let dw = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(dm)));
        let mw = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(_mm_movehl_ps(dm, dm))));
        for (q, acc_q) in acc.iter_mut().enumerate() {
            let tq = t0 + 4 * q;
            let mut isum = [_mm256_setzero_si256(); 4];
            for (t, s) in isum.iter_mut().enumerate() {
                *s = dot(&wv, acts(a, tq + t, p));
            }
            let quad = (tq / 4) * np * 8 + p * 8;
            let da = _mm256_loadu_ps(a.d4.as_ptr().add(quad));
            let v = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(reduce_quad(&isum)),
                _mm256_mul_ps(dw, da),
                *acc_q,
            );
            *acc_q = _mm256_fmadd_ps(mw, _mm256_loadu_ps(a.s4.as_ptr().add(quad)), v);
        }
    }
    for (q, acc_q) in acc.iter().enumerate() {
        let tq = t0 + 4 * q;
        let h = _mm256_hadd_ps(*acc_q, *acc_q);
        let (lo, hi) = (_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        *out.add(tq * w.n + r) = _mm_cvtss_f32(lo);
        *out.add((tq + 1) * w.n + r) = _mm_cvtss_f32(_mm_movehdup_ps(lo));
        *out.add((tq + 2) * w.n + r) = _mm_cvtss_f32(hi);
        *out.add((tq + 3) * w.n + r) = _mm_cvtss_f32(_mm_movehdup_ps(hi));
    }
}

/// Four rows × one token (decode): the token's activations are loaded once for four rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_quad<const F: u8>(w: &QMatrix, r0: usize, a: &QActs, out: *mut f32) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let mut acc = _mm256_setzero_ps();
    for p in 0..np {
        let mut isum = [_mm256_setzero_si256(); 4];
        let mut dm = [_mm_setzero_ps(); 4];
        for (i, (s, d)) in isum.iter_mut().zip(dm.iter_mut()).enumerate() {
            prefetch_pair(w, r0 + 4 + i, p);
            *s = dot(&widen::<F>(w.qs.as_ptr().add(((r0 + i) * np + p) * pb)), acts(a, 0, p));
            *d = pair_dm(w, r0 + i, p);
        }
        let (d01, d23) = (_mm_movelh_ps(dm[0], dm[1]), _mm_movelh_ps(dm[2], dm[3]));
        let dw = _mm256_insertf128_ps(_mm256_castps128_ps256(d01), d23, 1);
        let da = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.d.as_ptr().add(p * 2))));
        let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce_quad(&isum)), _mm256_mul_ps(dw, da), acc);
        let (m01, m23) = (_mm_movehl_ps(dm[1], dm[0]), _mm_movehl_ps(dm[3], dm[2]));
        let mw = _mm256_insertf128_ps(_mm256_castps128_ps256(m01), m23, 1);
        let sa = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.s.as_ptr().add(p * 2))));
        acc = _mm256_fmadd_ps(mw, sa, v);
    }
    let h = _mm256_hadd_ps(acc, acc);
    let (lo, hi) = (_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    *out.add(r0) = _mm_cvtss_f32(lo);
    *out.add(r0 + 1) = _mm_cvtss_f32(_mm_movehdup_ps(lo));
    *out.add(r0 + 2) = _mm_cvtss_f32(hi);
    *out.add(r0 + 3) = _mm_cvtss_f32(_mm_movehdup_ps(hi));
}

/// One row × T tokens (leftovers), with the epilogue of the VNNI kernels' single tiles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const T: usize, const F: u8>(
    w: &QMatrix,
    r: usize,
    a: &QActs,
    t0: usize,
    out: *mut f32,
) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let mut acc = [_mm256_setzero_ps(); T];
    for p in 0..np {
        let wv = widen::<F>(w.qs.as_ptr().add((r * np + p) * pb));
        let dm = pair_dm(w, r, p);
        let dw = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(dm)));
        let mw = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(_mm_movehl_ps(dm, dm))));
        let mw = _mm256_add_ps(mw, mw);
        for (t, acc_t) in acc.iter_mut().enumerate() {
            let at = (t0 + t) * np + p;
            let isum = dot(&wv, acts(a, t0 + t, p));
            let da = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.d.as_ptr().add(at * 2))));
            let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), *acc_t);
            let sa = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.s8.as_ptr().add(at * 2))));
            *acc_t = _mm256_fmadd_ps(mw, sa, v);
        }
    }
    for (t, acc_t) in acc.iter().enumerate() {
        *out.add((t0 + t) * w.n + r) = hsum256(*acc_t);
    }
}
