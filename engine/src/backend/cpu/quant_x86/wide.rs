//! The plain AVX2 kernel (CPUs without VNNI) of steps with fewer than four rows (batches take
//! `wide256.rs`): weight bytes widened to i16 once per pair and tile, activations read as the
//! combined `256·q₁ + q₂` in i16 ([`QActs::q16`]), dot products by `vpmaddwd` alone. The two-level i8 activations would take four `vpmaddubsw` and two
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
        // Q8 as stored (`q + 128`, the minimum term removes the bias) and Q5 unpacked: unsigned
        // bytes.
        let byte = _mm256_set1_epi16(0x00FF);
        let (x0, x1) = if F == F_Q5 {
            q5_bytes(wq)
        } else {
            (load256(wq as *const i8), load256(wq.add(32) as *const i8))
        };
        let v = [
            _mm256_and_si256(x0, byte),
            _mm256_srli_epi16(x0, 8),
            _mm256_and_si256(x1, byte),
            _mm256_srli_epi16(x1, 8),
        ];
        if F != F_G16 {
            return v;
        }
        // Q8G16 has no minimum term: the bias comes off here, leaving the signed values.
        let bias = _mm256_set1_epi16(128);
        [
            _mm256_sub_epi16(v[0], bias),
            _mm256_sub_epi16(v[1], bias),
            _mm256_sub_epi16(v[2], bias),
            _mm256_sub_epi16(v[3], bias),
        ]
    }
}

/// [`dot`] as [`PairSums`]: for [`QFormat::Q8G16`] the low half's sums (`w[0]`, `w[1]`:
/// elements 0..16 of both blocks) apart from the high half's, for its group scales.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_sums<const F: u8>(w: &[__m256i; 4], a: *const i16) -> PairSums {
    if F != F_G16 {
        return (dot(w, a), _mm256_setzero_si256());
    }
    let a = a as *const __m256i;
    let (a0, a1) = (_mm256_loadu_si256(a), _mm256_loadu_si256(a.add(1)));
    let (a2, a3) = (_mm256_loadu_si256(a.add(2)), _mm256_loadu_si256(a.add(3)));
    (
        _mm256_add_epi32(_mm256_madd_epi16(w[0], a0), _mm256_madd_epi16(w[1], a1)),
        _mm256_add_epi32(_mm256_madd_epi16(w[2], a2), _mm256_madd_epi16(w[3], a3)),
    )
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
        QFormat::Q5 => rows_of::<F_Q5>(w, a, rows, out),
        QFormat::Q8G16 => rows_of::<F_G16>(w, a, rows, out),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_of<const F: u8>(
    w: &QMatrix,
    a: &QActs,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    drive_tiles!(F; w, a, rows, out)
}

/// The i16 activations of token `t`, pair `p`.
#[inline]
unsafe fn acts(a: &QActs, t: usize, p: usize) -> *const i16 {
    a.q16.as_ptr().add((t * a.npairs + p) * 64)
}

/// One row × `4·Q` tokens (`t0` a multiple of four): each quad's sums reduced into one vector
/// of (token, block) lanes before they are scaled, the pair's weights widened once for all.
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
        prefetch_pair(w, r + 1, p);
        let wv = widen::<F>(w.qs.as_ptr().add((r * np + p) * pb));
        let (dw, mw) = pair_scales(w, r, p);
        for (q, acc_q) in acc.iter_mut().enumerate() {
            let tq = t0 + 4 * q;
            let mut sums = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
            for (t, s) in sums.iter_mut().enumerate() {
                *s = dot_sums::<F>(&wv, acts(a, tq + t, p));
            }
            let quad = (tq / 4) * np * 8 + p * 8;
            let (da, sa) = (
                _mm256_loadu_ps(a.d4.as_ptr().add(quad)),
                _mm256_loadu_ps(a.s4.as_ptr().add(quad)),
            );
            *acc_q = scale_sums::<F>(*acc_q, reduce_sums::<F>(&sums), dw, mw, da, sa);
        }
    }
    for (q, acc_q) in acc.iter().enumerate() {
        store4(*acc_q, out.add((t0 + 4 * q) * w.n + r), w.n);
    }
}

/// Four rows × one token (decode), the next rows' weights asked for ahead.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_quad<const F: u8>(w: &QMatrix, r0: usize, a: &QActs, out: *mut f32) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let mut acc = _mm256_setzero_ps();
    for p in 0..np {
        let mut sums = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
        for (i, s) in sums.iter_mut().enumerate() {
            prefetch_pair(w, r0 + DECODE_PREFETCH_ROWS + i, p);
            let wv = widen::<F>(w.qs.as_ptr().add(((r0 + i) * np + p) * pb));
            *s = dot_sums::<F>(&wv, acts(a, 0, p));
        }
        let (dw, mw) = rows4_scales(w, r0, p);
        let da = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.d.as_ptr().add(p * 2))));
        let sa = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.s.as_ptr().add(p * 2))));
        acc = scale_sums::<F>(acc, reduce_sums::<F>(&sums), dw, mw, da, sa);
    }
    store4(acc, out.add(r0), 1);
}

/// One row × T tokens (leftovers): eight lanes carry a pair's `(m₀·s₀, m₁·s₁)` four times,
/// `2·m` against `s/8`.
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
        let (dw, mw) = pair_scales(w, r, p);
        // Q8G16's `mw` is its high halves' scales, not a minimum.
        let mw = if F == F_G16 { mw } else { _mm256_add_ps(mw, mw) };
        for (t, acc_t) in acc.iter_mut().enumerate() {
            let (da, sa) = single_scales(a, (t0 + t) * np + p);
            let sums = dot_sums::<F>(&wv, acts(a, t0 + t, p));
            *acc_t = scale_sums::<F>(*acc_t, sums, dw, mw, da, sa);
        }
    }
    for (t, acc_t) in acc.iter().enumerate() {
        *out.add((t0 + t) * w.n + r) = hsum256(*acc_t);
    }
}
