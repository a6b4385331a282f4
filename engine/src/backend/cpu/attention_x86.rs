//! AVX2/FMA attention for one group of query heads sharing a KV head (head_dim a multiple of 8):
//! q·Kᵀ for eight cached positions at a time (eight independent FMA chains, then one
//! transposing reduction instead of eight horizontal sums), softmax with the vectorised exp, and
//! P·V with one head's output held in registers; `attend_group_512` is the same on 512-bit
//! vectors for the AVX-512 kernel path. Same mathematics as the portable
//! `super::attention::attend_group`; the summation order differs (tested to 1e-5).

use std::arch::x86_64::*;

use super::kv_cache::{CpuKvCache, KvElem};

/// A KV element type the kernels load as f32 vectors (IEEE half through F16C's conversion).
pub trait KvLoad: KvElem {
    /// Eight values at `p` as f32. Inlined into kernels compiled with AVX2 and F16C.
    ///
    /// # Safety
    /// Eight elements must be readable at `p`; the CPU must have AVX2 and F16C.
    unsafe fn load8(p: *const Self) -> __m256;
    /// Sixteen values at `p` as f32. Inlined into kernels compiled with AVX-512F.
    ///
    /// # Safety
    /// Sixteen elements must be readable at `p`; the CPU must have AVX-512F.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl KvLoad for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl KvLoad for half::f16 {
    #[inline(always)]
    unsafe fn load8(p: *const half::f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn load16(p: *const half::f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
}

/// Sums each of eight vectors into one lane of the result.
#[inline(always)]
unsafe fn transpose_sum8(a: &[__m256; 8]) -> __m256 {
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31))
}

/// See the module doc; arguments as the portable `super::attention::attend_group` (`slots`: the cache slot
/// of each context position; `scores`: scratch of `group × slots.len()` floats).
///
/// # Safety
/// The CPU must have AVX2 and FMA; `hd % 8 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_group<E: KvLoad>(
    kv: &CpuKvCache<E>,
    layer: usize,
    qg: &[f32],
    kvh: usize,
    hd: usize,
    slots: &[usize],
    scale: f32,
    scores: &mut [f32],
    o: &mut [f32],
) {
    let group = qg.len() / hd;
    let ctx = slots.len();
    let kptr = |p: usize| kv.k(layer, slots[p]).as_ptr().add(kvh * hd);
    let vscale = _mm256_set1_ps(scale);
    // q·Kᵀ: eight positions at a time for every head of the group, so the eight K rows are
    // read from memory once and from L1 by the other heads (a prefill's context outgrows L2).
    let mut p = 0;
    while p + 8 <= ctx {
        let ks: [*const E; 8] = std::array::from_fn(|i| kptr(p + i));
        for g in 0..group {
            let q = qg.as_ptr().add(g * hd);
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut d = 0;
            while d < hd {
                let qv = _mm256_loadu_ps(q.add(d));
                for i in 0..8 {
                    acc[i] = _mm256_fmadd_ps(qv, E::load8(ks[i].add(d)), acc[i]);
                }
                d += 8;
            }
            let at = scores.as_mut_ptr().add(g * ctx + p);
            _mm256_storeu_ps(at, _mm256_mul_ps(transpose_sum8(&acc), vscale));
        }
        p += 8;
    }
    let tail = p;
    for g in 0..group {
        let q = qg.as_ptr().add(g * hd);
        let row = &mut scores[g * ctx..(g + 1) * ctx];
        let mut p = tail;
        while p < ctx {
            let k = kptr(p);
            let mut acc = _mm256_setzero_ps();
            let mut d = 0;
            while d < hd {
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(d)), E::load8(k.add(d)), acc);
                d += 8;
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
            row[p] = lanes.iter().sum::<f32>() * scale;
            p += 1;
        }
        super::ops::softmax_fast(row);
    }
    // P·V: 16-float column chunks of up to four heads' outputs stay in registers across
    // positions, so each V row chunk is read once for those heads.
    let mut g0 = 0;
    while g0 < group {
        match group - g0 {
            1 => pv_heads::<E, 1>(kv, layer, kvh, hd, slots, scores, g0, o),
            2 => pv_heads::<E, 2>(kv, layer, kvh, hd, slots, scores, g0, o),
            3 => pv_heads::<E, 3>(kv, layer, kvh, hd, slots, scores, g0, o),
            _ => pv_heads::<E, 4>(kv, layer, kvh, hd, slots, scores, g0, o),
        }
        g0 += 4;
    }
}

/// `o[g] = Σ_p scores[g][p]·V[p]` for heads `g0..g0 + G`, 16 columns at a time (eight of the
/// last chunk when `hd` is not a multiple of 16).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_heads<E: KvLoad, const G: usize>(
    kv: &CpuKvCache<E>,
    layer: usize,
    kvh: usize,
    hd: usize,
    slots: &[usize],
    scores: &[f32],
    g0: usize,
    o: &mut [f32],
) {
    let ctx = slots.len();
    let mut d = 0;
    while d < hd {
        let two = hd - d >= 16;
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        for (p, &slot) in slots.iter().enumerate() {
            let v = kv.v(layer, slot).as_ptr().add(kvh * hd + d);
            let v0 = E::load8(v);
            let v1 = if two { E::load8(v.add(8)) } else { _mm256_setzero_ps() };
            for (g, a) in acc.iter_mut().enumerate() {
                let w = _mm256_set1_ps(*scores.get_unchecked((g0 + g) * ctx + p));
                a[0] = _mm256_fmadd_ps(w, v0, a[0]);
                if two {
                    a[1] = _mm256_fmadd_ps(w, v1, a[1]);
                }
            }
        }
        for (g, a) in acc.iter().enumerate() {
            let out = o.as_mut_ptr().add((g0 + g) * hd + d);
            _mm256_storeu_ps(out, a[0]);
            if two {
                _mm256_storeu_ps(out.add(8), a[1]);
            }
        }
        d += if two { 16 } else { 8 };
    }
}

/// [`attend_group`] on 512-bit vectors (the AVX-512 kernel path): each K row chunk and each
/// V row chunk is 16 floats, so q·Kᵀ and P·V take half the instructions; the eight positions'
/// 512-bit sums are folded to 256 bits and then reduced as in the AVX2 kernel.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and FMA; `hd % 16 == 0`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_group_512<E: KvLoad>(
    kv: &CpuKvCache<E>,
    layer: usize,
    qg: &[f32],
    kvh: usize,
    hd: usize,
    slots: &[usize],
    scale: f32,
    scores: &mut [f32],
    o: &mut [f32],
) {
    let group = qg.len() / hd;
    let ctx = slots.len();
    let kptr = |p: usize| kv.k(layer, slots[p]).as_ptr().add(kvh * hd);
    let vscale = _mm256_set1_ps(scale);
    let mut p = 0;
    while p + 8 <= ctx {
        let ks: [*const E; 8] = std::array::from_fn(|i| kptr(p + i));
        for g in 0..group {
            let q = qg.as_ptr().add(g * hd);
            let mut acc = [_mm512_setzero_ps(); 8];
            let mut d = 0;
            while d < hd {
                let qv = _mm512_loadu_ps(q.add(d));
                for i in 0..8 {
                    acc[i] = _mm512_fmadd_ps(qv, E::load16(ks[i].add(d)), acc[i]);
                }
                d += 16;
            }
            // Each 512-bit sum folded to 256 bits (written out: a closure would not inherit
            // this function's target features).
            let mut halves = [_mm256_setzero_ps(); 8];
            for (h, a) in halves.iter_mut().zip(&acc) {
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(*a), 1));
                *h = _mm256_add_ps(_mm512_castps512_ps256(*a), hi);
            }
            let at = scores.as_mut_ptr().add(g * ctx + p);
            _mm256_storeu_ps(at, _mm256_mul_ps(transpose_sum8(&halves), vscale));
        }
        p += 8;
    }
    let tail = p;
    for g in 0..group {
        let q = qg.as_ptr().add(g * hd);
        let row = &mut scores[g * ctx..(g + 1) * ctx];
        for (p, r) in row.iter_mut().enumerate().skip(tail) {
            let k = kptr(p);
            let mut acc = _mm512_setzero_ps();
            let mut d = 0;
            while d < hd {
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(d)), E::load16(k.add(d)), acc);
                d += 16;
            }
            *r = _mm512_reduce_add_ps(acc) * scale;
        }
        super::ops::softmax_fast(row);
    }
    let mut g0 = 0;
    while g0 < group {
        match group - g0 {
            1 => pv_heads_512::<E, 1>(kv, layer, kvh, hd, slots, scores, g0, o),
            2 => pv_heads_512::<E, 2>(kv, layer, kvh, hd, slots, scores, g0, o),
            3 => pv_heads_512::<E, 3>(kv, layer, kvh, hd, slots, scores, g0, o),
            _ => pv_heads_512::<E, 4>(kv, layer, kvh, hd, slots, scores, g0, o),
        }
        g0 += 4;
    }
}

/// [`pv_heads`] on 512-bit vectors: 32 columns at a time (16 for the last chunk when `hd` is
/// not a multiple of 32).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_heads_512<E: KvLoad, const G: usize>(
    kv: &CpuKvCache<E>,
    layer: usize,
    kvh: usize,
    hd: usize,
    slots: &[usize],
    scores: &[f32],
    g0: usize,
    o: &mut [f32],
) {
    let ctx = slots.len();
    let mut d = 0;
    while d < hd {
        let two = hd - d >= 32;
        let mut acc = [[_mm512_setzero_ps(); 2]; G];
        for (p, &slot) in slots.iter().enumerate() {
            let v = kv.v(layer, slot).as_ptr().add(kvh * hd + d);
            let v0 = E::load16(v);
            let v1 = if two { E::load16(v.add(16)) } else { _mm512_setzero_ps() };
            for (g, a) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*scores.get_unchecked((g0 + g) * ctx + p));
                a[0] = _mm512_fmadd_ps(w, v0, a[0]);
                if two {
                    a[1] = _mm512_fmadd_ps(w, v1, a[1]);
                }
            }
        }
        for (g, a) in acc.iter().enumerate() {
            let out = o.as_mut_ptr().add((g0 + g) * hd + d);
            _mm512_storeu_ps(out, a[0]);
            if two {
                _mm512_storeu_ps(out.add(16), a[1]);
            }
        }
        d += if two { 32 } else { 16 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_attention() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        // Head sizes a multiple of 32, of 16 and of 8 only; groups within and beyond four
        // heads; Gemma 3's 256-wide heads.
        // Both element types of the pool.
        for (hd, group) in [(64, 3), (40, 5), (16, 4), (48, 6), (256, 4)] {
            check_shape::<f32>(hd, group);
            check_shape::<half::f16>(hd, group);
        }
    }

    fn check_shape<E: KvLoad>(hd: usize, group: usize) {
        let (layers, blocks, bs, kvh) = (2, 6, 16, 2);
        // Padded blocks: rows are not slots.
        let mut kv = CpuKvCache::<E>::new(layers, blocks, bs, kvh * hd, true);
        let mut rng = crate::sampling::sampler::Rng::new(3);
        let mut r = || rng.next_f64() as f32 * 2.0 - 1.0;
        for l in 0..layers {
            for slot in 0..blocks * bs {
                let k: Vec<f32> = (0..kvh * hd).map(|_| r()).collect();
                let v: Vec<f32> = (0..kvh * hd).map(|_| r()).collect();
                kv.write(l, slot, &k, &v);
            }
        }
        let table = [4usize, 1, 5, 0];
        for ctx in [1, 7, 8, 9, 16, 33, 61] {
            let slots: Vec<usize> = (0..ctx).map(|p| kv.row(table[p / bs] * bs + p % bs)).collect();
            let qg: Vec<f32> = (0..group * hd).map(|_| r()).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let (mut o, mut want) = (vec![0f32; group * hd], vec![0f32; group * hd]);
            let mut scratch = vec![0f32; group * ctx];
            unsafe { attend_group(&kv, 1, &qg, 1, hd, &slots, scale, &mut scratch, &mut o) };
            // The 512-bit kernel where the CPU and the head width allow it.
            let wide = is_x86_feature_detected!("avx512f") && hd.is_multiple_of(16);
            let mut o512 = vec![0f32; group * hd];
            if wide {
                unsafe {
                    attend_group_512(&kv, 1, &qg, 1, hd, &slots, scale, &mut scratch, &mut o512)
                };
            }
            super::super::attention::attend_group(
                &kv,
                1,
                &qg,
                1,
                hd,
                &slots,
                scale,
                &mut scratch,
                &mut want,
            );
            for g in 0..group {
                // The textbook formula, head by head.
                let s0: Vec<f32> = (0..ctx)
                    .map(|p| {
                        (0..hd)
                            .map(|d| qg[g * hd + d] * kv.k(1, slots[p])[hd + d].to_f32())
                            .sum::<f32>()
                            * scale
                    })
                    .collect();
                let m = s0.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = s0.iter().map(|x| (x - m).exp()).sum();
                for d in 0..hd {
                    let naive: f32 = (0..ctx)
                        .map(|p| (s0[p] - m).exp() / z * kv.v(1, slots[p])[hd + d].to_f32())
                        .sum();
                    let i = g * hd + d;
                    assert!(
                        (want[i] - naive).abs() < 1e-5,
                        "portable, ctx {ctx} head {g} dim {d}: {} vs {naive}",
                        want[i]
                    );
                    assert!(
                        (o[i] - naive).abs() < 1e-5,
                        "AVX2, ctx {ctx} head {g} dim {d}: {} vs {naive}",
                        o[i]
                    );
                    assert!(
                        !wide || (o512[i] - naive).abs() < 1e-5,
                        "AVX-512, ctx {ctx} head {g} dim {d}: {} vs {naive}",
                        o512[i]
                    );
                }
            }
        }
    }
}
