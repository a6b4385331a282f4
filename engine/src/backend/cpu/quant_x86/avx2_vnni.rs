//! The AVX-VNNI tile kernels (`vpdpbusd` on 256 bits), also the decode kernel of AVX-512 CPUs
//! that have AVX-VNNI. Q8 weights stay biased (`q + 128`); the minimum term removes the bias.

use super::*;

/// Rows `rows` of `out = a · wᵀ`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn rows(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    match (w.format, a.coarse) {
        (QFormat::Q4_1, false) => rows_of::<F_Q4, true>(w, a, rows, out),
        (QFormat::Q8_0, false) => rows_of::<F_Q8, true>(w, a, rows, out),
        (QFormat::Q5, false) => rows_of::<F_Q5, true>(w, a, rows, out),
        (QFormat::Q8G16, false) => rows_of::<F_G16, true>(w, a, rows, out),
        (QFormat::Q4_1, true) => rows_of::<F_Q4, false>(w, a, rows, out),
        (QFormat::Q8_0, true) => rows_of::<F_Q8, false>(w, a, rows, out),
        (QFormat::Q5, true) => rows_of::<F_Q5, false>(w, a, rows, out),
        (QFormat::Q8G16, true) => rows_of::<F_G16, false>(w, a, rows, out),
    }
}

/// `L2`: whether the activations' second level is added (see `rows_avx512`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows_of<const F: u8, const L2: bool>(
    w: &QMatrix,
    a: &QActs,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    drive_tiles!(F, L2; w, a, rows, out)
}

/// One row × `4·Q` tokens (`t0` a multiple of four): each quad's integer sums are
/// reduced into one vector of (token, block) lanes before conversion, so the
/// scaling costs one multiply and two FMAs per pair for four tokens instead of for
/// each; the pair's weights are unpacked and its scales broadcast once for all `Q`
/// quads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tile_quads<const Q: usize, const F: u8, const L2: bool>(
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
        let wq = w.qs.as_ptr().add((r * np + p) * pb);
        let (wlo, whi) = pair_weights::<F>(wq);
        let (dw, mw) = pair_scales(w, r, p);
        for (q, acc_q) in acc.iter_mut().enumerate() {
            let tq = t0 + 4 * q;
            let mut sums = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
            for (t, s) in sums.iter_mut().enumerate() {
                let off = ((tq + t) * np + p) * 64;
                let (a1, a2) = (a.qs.as_ptr().add(off), a.qs2.as_ptr().add(off));
                let bias = g16_bias::<F, L2>(a1, a2);
                *s = pair_vnni_sums::<F, L2>(wlo, whi, a1, a2, bias);
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

/// Four rows × one token (decode): as [`tile_quads`] with rows in place of tokens,
/// the rows' scales gathered into one vector per pair.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows_quad<const F: u8, const L2: bool>(w: &QMatrix, r0: usize, a: &QActs, out: *mut f32) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let mut acc = _mm256_setzero_ps();
    for p in 0..np {
        let (a1, a2) = (a.qs.as_ptr().add(p * 64), a.qs2.as_ptr().add(p * 64));
        // The four rows share the token: its bias once.
        let bias = g16_bias::<F, L2>(a1, a2);
        let mut sums = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
        for (i, s) in sums.iter_mut().enumerate() {
            prefetch_pair(w, r0 + DECODE_PREFETCH_ROWS + i, p);
            let wq = w.qs.as_ptr().add(((r0 + i) * np + p) * pb);
            let (wlo, whi) = pair_weights::<F>(wq);
            *s = pair_vnni_sums::<F, L2>(wlo, whi, a1, a2, bias);
        }
        let (dw, mw) = rows4_scales(w, r0, p);
        let da = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.d.as_ptr().add(p * 2))));
        let sa = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.s.as_ptr().add(p * 2))));
        acc = scale_sums::<F>(acc, reduce_sums::<F>(&sums), dw, mw, da, sa);
    }
    store4(acc, out.add(r0), 1);
}

/// One row × T tokens (the leftovers of four-token quads, and single rows of
/// decode). Eight lanes carry a pair's `(m₀·s₀, m₁·s₁)` four times: `2·m` against
/// `s/8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tile<const T: usize, const F: u8, const L2: bool>(
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
        let (wlo, whi) = pair_weights::<F>(w.qs.as_ptr().add((r * np + p) * pb));
        let (dw, mw) = pair_scales(w, r, p);
        // Q8G16's `mw` is its high halves' scales, not a minimum.
        let mw = if F == F_G16 { mw } else { _mm256_add_ps(mw, mw) };
        for (t, acc_t) in acc.iter_mut().enumerate() {
            let at = (t0 + t) * np + p;
            let (a1, a2) = (a.qs.as_ptr().add(at * 64), a.qs2.as_ptr().add(at * 64));
            let (da, sa) = single_scales(a, at);
            let sums = pair_vnni_sums::<F, L2>(wlo, whi, a1, a2, g16_bias::<F, L2>(a1, a2));
            *acc_t = scale_sums::<F>(*acc_t, sums, dw, mw, da, sa);
        }
    }
    for (t, acc_t) in acc.iter().enumerate() {
        *out.add((t0 + t) * w.n + r) = hsum256(*acc_t);
    }
}
