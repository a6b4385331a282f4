//! x86-64 SIMD kernels for [`super::quant`]: AVX-512 VNNI, AVX-VNNI and plain AVX2, each
//! computing a tile of one weight row against up to four activation rows, so that the unpacked
//! weights are reused across the batch. Selected at run time; never AMX.

use std::arch::x86_64::*;

use super::quant::{QActs, QFormat, QKernel, QMatrix};

/// Tokens per tile.
const NT: usize = 4;

/// Dispatches to the kernel's tile loop.
///
/// # Safety
/// The CPU must support `kernel`; `out` as in [`super::quant::matmul_rows`].
pub unsafe fn matmul_rows(kernel: QKernel, w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    match kernel {
        // One to three tokens: the 256-bit kernel measured faster on this class of CPU (AMD EPYC:
        // ~130-170 vs ~100-150 tok/s over the default model's matmuls); batches use the 512-bit
        // multi-row tiles.
        QKernel::Avx512Vnni if a.t < 4 && is_x86_feature_detected!("avxvnni") => rows_avx2::<true>(w, a, rows, out),
        QKernel::Avx512Vnni => rows_avx512(w, a, rows, out),
        QKernel::AvxVnni => rows_avx2::<true>(w, a, rows, out),
        _ => rows_avx2::<false>(w, a, rows, out),
    }
}

#[inline(always)]
unsafe fn pair_f64(p: *const f32) -> f64 {
    std::ptr::read_unaligned(p as *const f64)
}

/// A pair's `(d₀, d₁, m₀, m₁)`, converted from f16.
#[inline(always)]
unsafe fn pair_dm(w: &QMatrix, r: usize, p: usize) -> __m128 {
    _mm_cvtph_ps(_mm_loadl_epi64(w.dm.as_ptr().add((r * w.npairs + p) * 4) as *const __m128i))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_avx512(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    // Tiles of RT rows × T tokens: short rows (9 pairs at k = 576) make per-row overhead matter,
    // so decode (one token) takes four rows at a time; batches take two rows × four tokens.
    let mut r = rows.start;
    while r < rows.end {
        let nr = rows.end - r;
        let mut t0 = 0;
        if a.t == 1 && nr >= 4 {
            tile_avx512::<4, 1>(w, r, a, 0, out);
            r += 4;
            continue;
        }
        let rt = if nr >= 3 { 3 } else if nr >= 2 { 2 } else { 1 };
        while t0 < a.t {
            let nt = (a.t - t0).min(NT);
            match (rt, nt) {
                (3, 4) => tile_avx512::<3, 4>(w, r, a, t0, out),
                (3, 3) => tile_avx512::<3, 3>(w, r, a, t0, out),
                (3, 2) => tile_avx512::<3, 2>(w, r, a, t0, out),
                (3, _) => tile_avx512::<3, 1>(w, r, a, t0, out),
                (2, 4) => tile_avx512::<2, 4>(w, r, a, t0, out),
                (2, 3) => tile_avx512::<2, 3>(w, r, a, t0, out),
                (2, 2) => tile_avx512::<2, 2>(w, r, a, t0, out),
                (2, _) => tile_avx512::<2, 1>(w, r, a, t0, out),
                (_, 4) => tile_avx512::<1, 4>(w, r, a, t0, out),
                (_, 3) => tile_avx512::<1, 3>(w, r, a, t0, out),
                (_, 2) => tile_avx512::<1, 2>(w, r, a, t0, out),
                _ => tile_avx512::<1, 1>(w, r, a, t0, out),
            }
            t0 += nt;
        }
        r += rt;
    }
}

#[inline(always)]
unsafe fn load_w512(w: &QMatrix, row_base: *const u8, p: usize) -> __m512i {
    match w.format {
        QFormat::Q4_1 => {
            let mask = _mm256_set1_epi8(0x0F);
            let v = _mm256_loadu_si256(row_base.add(p * 32) as *const __m256i);
            let lo = _mm256_and_si256(v, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
        }
        QFormat::Q8_0 => _mm512_loadu_si512(row_base.add(p * 64) as *const _),
    }
}

/// RT rows × T tokens. The minimum terms ride along in the same accumulators: a pair's
/// `(m₀·s₀, m₁·s₁)` pattern over 16 lanes sums to eight times the pair's value, hence `s/8`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_avx512<const RT: usize, const T: usize>(w: &QMatrix, r0: usize, a: &QActs, t0: usize, out: *mut f32) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let mut acc = [[_mm512_setzero_ps(); T]; RT];
    for p in 0..np {
        let mut wz = [_mm512_setzero_si512(); RT];
        let mut dw = [_mm512_setzero_ps(); RT];
        let mut mw = [_mm512_setzero_ps(); RT];
        for i in 0..RT {
            let r = r0 + i;
            wz[i] = load_w512(w, w.qs.as_ptr().add(r * np * pb), p);
            let dm = pair_dm(w, r, p);
            dw[i] = _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(dm)));
            mw[i] = _mm512_castpd_ps(_mm512_broadcastsd_pd(_mm_castps_pd(_mm_movehl_ps(dm, dm))));
        }
        for t in 0..T {
            let ti = t0 + t;
            let off = (ti * np + p) * 64;
            let az = _mm512_loadu_si512(a.qs.as_ptr().add(off) as *const _);
            let az2 = _mm512_loadu_si512(a.qs2.as_ptr().add(off) as *const _);
            let da = _mm512_castpd_ps(_mm512_set1_pd(pair_f64(a.d.as_ptr().add((ti * np + p) * 2))));
            let sa = _mm512_castpd_ps(_mm512_set1_pd(pair_f64(a.s8.as_ptr().add((ti * np + p) * 2))));
            for i in 0..RT {
                let isum = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wz[i], az), 8);
                let isum = _mm512_dpbusd_epi32(isum, wz[i], az2);
                let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[i], da), acc[i][t]);
                acc[i][t] = _mm512_fmadd_ps(mw[i], sa, v);
            }
        }
    }
    for i in 0..RT {
        for t in 0..T {
            *out.add((t0 + t) * w.n + r0 + i) = _mm512_reduce_add_ps(acc[i][t]);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows_avx2_vnni(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    rows_avx2_body::<true>(w, a, rows, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2_plain(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    rows_avx2_body::<false>(w, a, rows, out)
}

unsafe fn rows_avx2<const VNNI: bool>(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    if VNNI {
        rows_avx2_vnni(w, a, rows, out)
    } else {
        rows_avx2_plain(w, a, rows, out)
    }
}

#[inline(always)]
unsafe fn rows_avx2_body<const VNNI: bool>(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    for r in rows {
        let mut t0 = 0;
        while t0 < a.t {
            let nt = (a.t - t0).min(NT);
            match nt {
                4 => tile_avx2::<4, VNNI>(w, r, a, t0, out),
                3 => tile_avx2::<3, VNNI>(w, r, a, t0, out),
                2 => tile_avx2::<2, VNNI>(w, r, a, t0, out),
                _ => tile_avx2::<1, VNNI>(w, r, a, t0, out),
            }
            t0 += nt;
        }
    }
}

/// `u8 × i8` dot of 32 bytes into eight i32 lanes, added to `acc`.
#[inline(always)]
unsafe fn dot_u8i8<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    } else {
        let p16 = _mm256_maddubs_epi16(u, s);
        _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
    }
}

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    let x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    _mm_cvtss_f32(x)
}

#[inline(always)]
unsafe fn tile_avx2<const T: usize, const VNNI: bool>(w: &QMatrix, r: usize, a: &QActs, t0: usize, out: *mut f32) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let wq = w.qs.as_ptr().add(r * np * pb);
    let mask = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); T];
    for p in 0..np {
        let (wlo, whi) = match w.format {
            QFormat::Q4_1 => {
                let v = _mm256_loadu_si256(wq.add(p * 32) as *const __m256i);
                (_mm256_and_si256(v, mask), _mm256_and_si256(_mm256_srli_epi16(v, 4), mask))
            }
            QFormat::Q8_0 => (
                _mm256_loadu_si256(wq.add(p * 64) as *const __m256i),
                _mm256_loadu_si256(wq.add(p * 64 + 32) as *const __m256i),
            ),
        };
        let dm = pair_dm(w, r, p);
        let dw = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(dm)));
        // Eight lanes carry the pair's (m₀·s₀, m₁·s₁) four times: 2·m against s/8.
        let mw = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(_mm_movehl_ps(dm, dm))));
        let mw = _mm256_add_ps(mw, mw);
        for (t, acc_t) in acc.iter_mut().enumerate() {
            let ti = t0 + t;
            let off = (ti * np + p) * 64;
            let level = |qs: &[i8]| -> __m256i {
                let ap = qs.as_ptr().add(off);
                let alo = _mm256_loadu_si256(ap as *const __m256i);
                let ahi = _mm256_loadu_si256(ap.add(32) as *const __m256i);
                if VNNI {
                    dot_u8i8::<true>(dot_u8i8::<true>(_mm256_setzero_si256(), wlo, alo), whi, ahi)
                } else if w.format == QFormat::Q8_0 {
                    // u8 weights up to 255 could saturate maddubs' i16 pairs: widen in two steps.
                    _mm256_add_epi32(dot_u8i8_wide(wlo, alo), dot_u8i8_wide(whi, ahi))
                } else {
                    dot_u8i8::<false>(dot_u8i8::<false>(_mm256_setzero_si256(), wlo, alo), whi, ahi)
                }
            };
            let isum = _mm256_add_epi32(_mm256_slli_epi32(level(&a.qs), 8), level(&a.qs2));
            let da = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.d.as_ptr().add((ti * np + p) * 2))));
            let sa = _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.s8.as_ptr().add((ti * np + p) * 2))));
            let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), *acc_t);
            *acc_t = _mm256_fmadd_ps(mw, sa, v);
        }
    }
    for (t, acc_t) in acc.iter().enumerate() {
        let ti = t0 + t;
        *out.add(ti * w.n + r) = hsum256(*acc_t);
    }
}

/// Exact `u8 × i8` dot into i32 lanes without i16 saturation (AVX2 without VNNI): split the
/// unsigned bytes into high and low nibbles, each product fits `maddubs`' i16 pairs.
#[inline(always)]
unsafe fn dot_u8i8_wide(u: __m256i, s: __m256i) -> __m256i {
    let mask = _mm256_set1_epi8(0x0F);
    let ulo = _mm256_and_si256(u, mask);
    let uhi = _mm256_and_si256(_mm256_srli_epi16(u, 4), mask);
    let ones = _mm256_set1_epi16(1);
    let plo = _mm256_madd_epi16(_mm256_maddubs_epi16(ulo, s), ones);
    let phi = _mm256_madd_epi16(_mm256_maddubs_epi16(uhi, s), ones);
    _mm256_add_epi32(plo, _mm256_slli_epi32(phi, 4))
}
