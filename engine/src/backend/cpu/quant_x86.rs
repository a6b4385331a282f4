//! x86-64 SIMD kernels for [`super::quant`]: AVX-512 VNNI, AVX-VNNI and plain AVX2, each
//! computing tiles of weight rows × activation rows, so that unpacked weights are reused across
//! the batch. Selected at run time; never AMX.
//!
//! Code generation. An intrinsic is inlined only into a function compiled with its target
//! features; anywhere else it becomes a call per instruction (this once made the AVX2 path 15x
//! slower). So every function here that touches a vector type carries `#[target_feature]`,
//! helpers included, and no kernel uses a closure. `engine/tests/simd_codegen.rs` checks the
//! compiled engine for out-of-line intrinsics. The batch kernels on i16 activations are in
//! `quant_x86/wide512.rs` (AVX-512) and `quant_x86/wide256.rs` (AVX-VNNI and plain AVX2); the
//! plain AVX2 kernel of fewer than four rows in `quant_x86/wide.rs`.

use std::arch::x86_64::*;

use super::quant::{QActs, QFormat, QKernel, QMatrix};

/// Tokens per tile.
const NT: usize = 4;

/// Dispatches to the kernel's tile loop.
///
/// # Safety
/// The CPU must support `kernel`; `out` as in `super::linear::matmul_rows`.
pub unsafe fn matmul_rows(
    kernel: QKernel,
    w: &QMatrix,
    a: &QActs,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    match kernel {
        // One to three tokens: the 256-bit kernel measured faster on AMD EPYC (~130-170 vs
        // ~100-150 tok/s over the default model's matmuls); batches use the 512-bit tiles.
        // Except Q5 weights, whose high bits take one masked add on 512 bits and ten
        // operations on 256 (SmolLM2 Q4_K_M, mostly Q5_0, decodes 234 -> 257 tok/s on the
        // 2-core Zen 5 with the 512-bit kernel).
        QKernel::Avx512Vnni if a.t < 4 && w.format != QFormat::Q5 && prefer_256_for_decode() => {
            avx2_vnni::rows(w, a, rows, out)
        }
        QKernel::Avx512Vnni if a.coarse => rows_avx512::<false>(w, a, rows, out),
        QKernel::Avx512Vnni if !a.q16_quad.is_empty() => wide512::rows(w, a, rows, out),
        QKernel::Avx512Vnni => rows_avx512::<true>(w, a, rows, out),
        QKernel::AvxVnni if !a.q16_quad.is_empty() && !a.coarse => {
            wide256::vnni::rows(w, a, rows, out)
        }
        QKernel::AvxVnni => avx2_vnni::rows(w, a, rows, out),
        _ if !a.q16_quad.is_empty() => wide256::plain::rows(w, a, rows, out),
        _ => wide::rows(w, a, rows, out),
    }
}

/// The AVX-512 i8 tiles on both levels, which an AVX-512 CPU with AVX-VNNI runs only when
/// `TANDEM_CPU_KERNEL=avx512` asks for them: for the oracle test, whatever the environment.
///
/// # Safety
/// As [`matmul_rows`], on a CPU with AVX-512 VNNI.
#[cfg(test)]
pub(super) unsafe fn rows_i8_avx512(
    w: &QMatrix,
    a: &QActs,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    rows_avx512::<true>(w, a, rows, out)
}

/// Whether an AVX-512 CPU runs decode-sized matmuls on the 256-bit VNNI kernel (it has AVX-VNNI
/// and `TANDEM_CPU_KERNEL` is not `avx512`).
fn prefer_256_for_decode() -> bool {
    static PREFER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PREFER.get_or_init(|| {
        is_x86_feature_detected!("avxvnni") && QKernel::requested() != Ok(Some(QKernel::Avx512Vnni))
    })
}

#[inline]
unsafe fn pair_f64(p: *const f32) -> f64 {
    std::ptr::read_unaligned(p as *const f64)
}

/// A pair's `(d₀, d₁, m₀, m₁)`, converted from f16; for [`QFormat::Q8G16`] its groups' scales
/// `(d₀,lo, d₁,lo, d₀,hi, d₁,hi)` (`d` times the sub-scales).
#[inline]
#[target_feature(enable = "sse2,f16c")]
unsafe fn pair_dm(w: &QMatrix, r: usize, p: usize) -> __m128 {
    let at = r * w.npairs + p;
    let dm = _mm_cvtph_ps(_mm_loadl_epi64(w.dm.as_ptr().add(at * 4) as *const __m128i));
    if w.format != QFormat::Q8G16 {
        return dm;
    }
    let d = _mm_cvtph_ps(_mm_set1_epi16(w.dk.get_unchecked(at).to_bits() as i16));
    _mm_mul_ps(dm, d)
}

/// `L2`: whether the activations' second level is added (false for [`QActs::coarse`] ones,
/// whose second level is zero).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_avx512<const L2: bool>(
    w: &QMatrix,
    a: &QActs,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    if w.format == QFormat::Q8G16 {
        rows_avx512_of::<L2, true>(w, a, rows, out)
    } else {
        rows_avx512_of::<L2, false>(w, a, rows, out)
    }
}

/// `G`: the weights are [`QFormat::Q8G16`] (see [`tile_avx512`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_avx512_of<const L2: bool, const G: bool>(
    w: &QMatrix,
    a: &QActs,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    // Tiles of RT rows × T tokens: short rows (9 pairs at k = 576) make per-row overhead matter,
    // so decode (one token) takes four rows at a time; batches take three rows × four tokens,
    // in blocks of tokens whose activations stay in L1 while the rows stream by.
    if a.t == 1 {
        let mut r = rows.start;
        while r + 4 <= rows.end {
            tile_avx512::<4, 1, L2, G>(w, r, a, 0, out);
            r += 4;
        }
        for r in r..rows.end {
            tile_avx512::<1, 1, L2, G>(w, r, a, 0, out);
        }
        return;
    }
    for tb in token_blocks(a.t, a.npairs * (64 * 2 + 2 * 2 * 4)) {
        let mut r = rows.start;
        while r < rows.end {
            let nr = rows.end - r;
            let rt = if nr >= 3 {
                3
            } else if nr >= 2 {
                2
            } else {
                1
            };
            let mut t0 = tb.start;
            while t0 < tb.end {
                let nt = (tb.end - t0).min(NT);
                match (rt, nt) {
                    (3, 4) => tile_avx512::<3, 4, L2, G>(w, r, a, t0, out),
                    (3, 3) => tile_avx512::<3, 3, L2, G>(w, r, a, t0, out),
                    (3, 2) => tile_avx512::<3, 2, L2, G>(w, r, a, t0, out),
                    (3, _) => tile_avx512::<3, 1, L2, G>(w, r, a, t0, out),
                    (2, 4) => tile_avx512::<2, 4, L2, G>(w, r, a, t0, out),
                    (2, 3) => tile_avx512::<2, 3, L2, G>(w, r, a, t0, out),
                    (2, 2) => tile_avx512::<2, 2, L2, G>(w, r, a, t0, out),
                    (2, _) => tile_avx512::<2, 1, L2, G>(w, r, a, t0, out),
                    (_, 4) => tile_avx512::<1, 4, L2, G>(w, r, a, t0, out),
                    (_, 3) => tile_avx512::<1, 3, L2, G>(w, r, a, t0, out),
                    (_, 2) => tile_avx512::<1, 2, L2, G>(w, r, a, t0, out),
                    _ => tile_avx512::<1, 1, L2, G>(w, r, a, t0, out),
                }
                t0 += nt;
            }
            r += rt;
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn load_w512(w: &QMatrix, row_base: *const u8, p: usize) -> __m512i {
    match w.format {
        QFormat::Q4_1 => {
            let mask = _mm256_set1_epi8(0x0F);
            let v = _mm256_loadu_si256(row_base.add(p * 32) as *const __m256i);
            let lo = _mm256_and_si256(v, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
        }
        QFormat::Q5 => {
            let mask = _mm256_set1_epi8(0x0F);
            let v = _mm256_loadu_si256(row_base.add(p * 40) as *const __m256i);
            let lo = _mm256_and_si256(v, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            let w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            let high: __mmask64 = std::ptr::read_unaligned(row_base.add(p * 40 + 32) as *const u64);
            _mm512_mask_add_epi8(w, high, w, _mm512_set1_epi8(16))
        }
        QFormat::Q8_0 | QFormat::Q8G16 => _mm512_loadu_si512(row_base.add(p * 64) as *const _),
    }
}

/// RT rows × T tokens. The minimum terms ride along in the same accumulators: a pair's
/// `(m₀·s₀, m₁·s₁)` pattern over 16 lanes sums to eight times the pair's value, hence `s/8`.
/// [`QFormat::Q8G16`] weights (`G`) have no minimum: the activations' sums times 128 (what the
/// bias of the stored bytes adds) are taken from the integer sums, whose lanes 0..8 are the
/// pair's low half and 8..16 its high half, each scaled by its groups' scales.
// Rows and tokens index several register arrays at once.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_avx512<const RT: usize, const T: usize, const L2: bool, const G: bool>(
    w: &QMatrix,
    r0: usize,
    a: &QActs,
    t0: usize,
    out: *mut f32,
) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    let mut acc = [[_mm512_setzero_ps(); T]; RT];
    for p in 0..np {
        let mut wz = [_mm512_setzero_si512(); RT];
        let mut dw = [_mm512_setzero_ps(); RT];
        let mut mw = [_mm512_setzero_ps(); RT];
        for i in 0..RT {
            let r = r0 + i;
            prefetch_pair(w, r + DECODE_PREFETCH_ROWS, p);
            wz[i] = load_w512(w, w.qs.as_ptr().add(r * np * pb), p);
            let dm = pair_dm(w, r, p);
            let lo = _mm512_broadcastsd_pd(_mm_castps_pd(dm));
            let hi = _mm512_broadcastsd_pd(_mm_castps_pd(_mm_movehl_ps(dm, dm)));
            if G {
                // Low half's group scales in lanes 0..8, high half's in 8..16.
                dw[i] = _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm512_castpd512_pd256(hi), 1));
            } else {
                dw[i] = _mm512_castpd_ps(lo);
                mw[i] = _mm512_castpd_ps(hi);
            }
        }
        for t in 0..T {
            let ti = t0 + t;
            let off = (ti * np + p) * 64;
            let az = _mm512_loadu_si512(a.qs.as_ptr().add(off) as *const _);
            let az2 = if L2 {
                _mm512_loadu_si512(a.qs2.as_ptr().add(off) as *const _)
            } else {
                _mm512_setzero_si512()
            };
            let da =
                _mm512_castpd_ps(_mm512_set1_pd(pair_f64(a.d.as_ptr().add((ti * np + p) * 2))));
            let sa =
                _mm512_castpd_ps(_mm512_set1_pd(pair_f64(a.s8.as_ptr().add((ti * np + p) * 2))));
            let bias = if G {
                let c = _mm512_set1_epi8(-128);
                let b = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c, az), 8);
                if L2 {
                    _mm512_dpbusd_epi32(b, c, az2)
                } else {
                    b
                }
            } else {
                _mm512_setzero_si512()
            };
            for i in 0..RT {
                let isum =
                    _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wz[i], az), 8);
                let isum = if L2 { _mm512_dpbusd_epi32(isum, wz[i], az2) } else { isum };
                if G {
                    let isum = _mm512_sub_epi32(isum, bias);
                    acc[i][t] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(isum),
                        _mm512_mul_ps(dw[i], da),
                        acc[i][t],
                    );
                    continue;
                }
                let v =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[i], da), acc[i][t]);
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

/// Activation bytes a token block should stay within (part of a 32-48 KiB L1 data cache).
const L1_ACTS: usize = 24 * 1024;

/// Consecutive blocks of the `t` tokens, each a multiple of [`NT`] tokens whose activations
/// (`bytes_per_token` each) fit [`L1_ACTS`].
fn token_blocks(t: usize, bytes_per_token: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let block = (L1_ACTS / bytes_per_token.max(1) / NT).max(1) * NT;
    (0..t.div_ceil(block)).map(move |b| b * block..((b + 1) * block).min(t))
}

/// Horizontal sum of eight floats.
#[inline]
#[target_feature(enable = "avx")]
unsafe fn hsum256(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    let x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    _mm_cvtss_f32(x)
}

/// Asks for the bytes of pair `p` of row `r` ahead of their use (a row past the matrix's end is
/// harmless: a prefetch never faults). Decode reads each weight once: four rows' streams at a
/// time outrun the hardware prefetcher (Gemma 3's 262k-row LM head: 87 -> 131 tok/s on a
/// 2-core AMD EPYC family 26 model 2 (Zen 5) with the AVX2 kernel), asked for
/// [`DECODE_PREFETCH_ROWS`] rows ahead. Batch tiles ask for the next rows too: the first token
/// block of a step reads its weights from memory, and stalled on them (Gemma 3 batched decode,
/// 32 × (64 + 64), AVX-512 VNNI tiles on the same CPU: 334 -> 413 tok/s).
/// How far ahead decode asks for rows: a 400-700-byte row (k = 576 or 640) four rows on is
/// too close to cover the memory's latency. Sixteen rows on, single-stream decode on a 2-core
/// AMD EPYC family 26 model 2 (Zen 5) (`bench single --decode-tokens 256`, four alternations): Gemma 3 270M Q4_K_M
/// 121.7 -> 129.4 tok/s (AVX-512 path), 114.1 -> 126.2 (AVX-VNNI); SmolLM2 Q4_K_M 252.9 ->
/// 283.0, 232.7 -> 264.4.
const DECODE_PREFETCH_ROWS: usize = 16;

#[inline]
#[target_feature(enable = "sse")]
unsafe fn prefetch_pair(w: &QMatrix, r: usize, p: usize) {
    let pb = w.format.pair_bytes();
    let at = w.qs.as_ptr().wrapping_add((r * w.npairs + p) * pb);
    _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(pb - 1) as *const i8);
}

#[inline]
#[target_feature(enable = "avx")]
unsafe fn load256(p: *const i8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// One pair against one activation row with AVX-VNNI: `(Σ w·q₁ << 8) + Σ w·q₂` in i32 lanes
/// (lane parity = block); `wlo`/`whi` hold the unsigned weight bytes of elements 0..16 and
/// 16..32 of both blocks (Q4 nibbles split, Q8 as stored `q + 128`, U6 as stored), `a1`/`a2`
/// point at the row's 64 bytes of each level. Four `vpdpbusd` and a shift; two without the
/// second level (`L2` false).
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn pair_vnni<const L2: bool>(
    wlo: __m256i,
    whi: __m256i,
    a1: *const i8,
    a2: *const i8,
) -> __m256i {
    let s = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), wlo, load256(a1));
    let s = _mm256_slli_epi32(_mm256_dpbusd_avx_epi32(s, whi, load256(a1.add(32))), 8);
    if !L2 {
        return s;
    }
    _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(s, wlo, load256(a2)), whi, load256(a2.add(32)))
}

/// One half of a pair against one activation row with AVX-VNNI: `(Σ w·q₁ << 8) + Σ w·q₂` over
/// the 32 bytes at `a1` (and `a2`), lanes alternating blocks.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn half_vnni<const L2: bool>(w: __m256i, a1: *const i8, a2: *const i8) -> __m256i {
    let s = _mm256_slli_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, load256(a1)), 8);
    if !L2 {
        return s;
    }
    _mm256_dpbusd_avx_epi32(s, w, load256(a2))
}

/// What the weights' bias of 128 adds to a [`QFormat::Q8G16`] pair's half sums against one
/// activation row ([`half_vnni`] of bytes of 128: 128 times the activations' sums); zero for
/// the other formats, whose minimum term takes the bias off. It depends on the activations
/// alone, so tiles of several rows compute it once.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn g16_bias<const F: u8, const L2: bool>(a1: *const i8, a2: *const i8) -> PairSums {
    let zero = _mm256_setzero_si256();
    if F != F_G16 {
        return (zero, zero);
    }
    let c = _mm256_set1_epi8(-128);
    (half_vnni::<L2>(c, a1, a2), half_vnni::<L2>(c, a1.add(32), a2.add(32)))
}

/// `acc + cvt(lo)·dlo·da + cvt(hi)·dhi·da`: a [`QFormat::Q8G16`] pair's half sums scaled by
/// their groups' scales (no minimum term).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_halves(
    acc: __m256,
    lo: __m256i,
    hi: __m256i,
    dlo: __m256,
    dhi: __m256,
    da: __m256,
) -> __m256 {
    let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(dlo, da), acc);
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(dhi, da), acc)
}

/// A pair's integer sums as the tiles carry them: the pair's sum and zero, or for
/// [`QFormat::Q8G16`] its low and high halves' sums ([`scale_sums`] scales either).
type PairSums = (__m256i, __m256i);

/// A pair against one activation row as [`PairSums`]: [`pair_vnni`], or for
/// [`QFormat::Q8G16`] its halves' sums ([`half_vnni`]) less `bias` ([`g16_bias`]).
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn pair_vnni_sums<const F: u8, const L2: bool>(
    wlo: __m256i,
    whi: __m256i,
    a1: *const i8,
    a2: *const i8,
    bias: PairSums,
) -> PairSums {
    if F != F_G16 {
        return (pair_vnni::<L2>(wlo, whi, a1, a2), _mm256_setzero_si256());
    }
    let lo = half_vnni::<L2>(wlo, a1, a2);
    let hi = half_vnni::<L2>(whi, a1.add(32), a2.add(32));
    (_mm256_sub_epi32(lo, bias.0), _mm256_sub_epi32(hi, bias.1))
}

/// Four tokens' (or rows') [`PairSums`] reduced by [`reduce_quad`] (the high halves only for
/// [`QFormat::Q8G16`]).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn reduce_sums<const F: u8>(s: &[PairSums; 4]) -> PairSums {
    let lo = reduce_quad(&[s[0].0, s[1].0, s[2].0, s[3].0]);
    if F != F_G16 {
        return (lo, _mm256_setzero_si256());
    }
    (lo, reduce_quad(&[s[0].1, s[1].1, s[2].1, s[3].1]))
}

/// `acc` plus a pair's scaled sums: [`scale_pair`], or for [`QFormat::Q8G16`]
/// [`scale_halves`] with `dw` and `mw` holding the low and high halves' group scales (as
/// [`pair_scales`] gives them) and no minimum term (`sa` unused).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_sums<const F: u8>(
    acc: __m256,
    s: PairSums,
    dw: __m256,
    mw: __m256,
    da: __m256,
    sa: __m256,
) -> __m256 {
    if F == F_G16 {
        scale_halves(acc, s.0, s.1, dw, mw, da)
    } else {
        scale_pair(acc, s.0, dw, da, mw, sa)
    }
}

/// Four tokens' pair sums (i32 lanes alternating block 0, block 1) reduced into one vector
/// `(t₀b₀, t₀b₁, t₁b₀, t₁b₁, t₂b₀, t₂b₁, t₃b₀, t₃b₁)`: in-lane 64-bit unpacks pair tokens,
/// a cross-lane permute sums the halves.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn reduce_quad(s: &[__m256i; 4]) -> __m256i {
    let e = _mm256_add_epi32(_mm256_unpacklo_epi64(s[0], s[1]), _mm256_unpackhi_epi64(s[0], s[1]));
    let f = _mm256_add_epi32(_mm256_unpacklo_epi64(s[2], s[3]), _mm256_unpackhi_epi64(s[2], s[3]));
    _mm256_add_epi32(_mm256_permute2x128_si256(e, f, 0x20), _mm256_permute2x128_si256(e, f, 0x31))
}

/// The body of a 256-bit kernel's `rows_of` over its tile functions (`tile_quads::<Q, G…>`,
/// `tile::<T, G…>`, `rows_quad::<G…>`, with the kernel's own const parameters `G…`): decode four rows at a time (independent chains, short
/// rows); batches one row against eight, four, then fewer tokens, in blocks of tokens whose
/// activations stay in L1 while the rows stream by. A macro, not a function over function
/// pointers, so each tile stays a direct call (inlined) in its kernel's target features.
macro_rules! drive_tiles {
    ($($G:ident),+; $w:ident, $a:ident, $rows:ident, $out:ident) => {{
        if $a.t == 1 {
            let mut r = $rows.start;
            while r + 4 <= $rows.end {
                rows_quad::<$($G),+>($w, r, $a, $out);
                r += 4;
            }
            for r in r..$rows.end {
                tile::<1, $($G),+>($w, r, $a, 0, $out);
            }
            return;
        }
        for tb in token_blocks($a.t, $a.npairs * (64 * 2 + 2 * 2 * 4)) {
            for r in $rows.clone() {
                let mut t0 = tb.start;
                while t0 < tb.end {
                    let nt = match tb.end - t0 {
                        8.. => {
                            tile_quads::<2, $($G),+>($w, r, $a, t0, $out);
                            8
                        }
                        4..=7 => {
                            tile_quads::<1, $($G),+>($w, r, $a, t0, $out);
                            4
                        }
                        3 => {
                            tile::<3, $($G),+>($w, r, $a, t0, $out);
                            3
                        }
                        2 => {
                            tile::<2, $($G),+>($w, r, $a, t0, $out);
                            2
                        }
                        _ => {
                            tile::<1, $($G),+>($w, r, $a, t0, $out);
                            1
                        }
                    };
                    t0 += nt;
                }
            }
        }
    }};
}

/// `acc + cvt(isum)·dw·da + mw·sa`: a pair's integer sums scaled into the accumulator.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_pair(
    acc: __m256,
    isum: __m256i,
    dw: __m256,
    da: __m256,
    mw: __m256,
    sa: __m256,
) -> __m256 {
    _mm256_fmadd_ps(mw, sa, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), acc))
}

/// A pair's `(d₀, d₁)` and `(m₀, m₁)` broadcast over eight lanes ([`QFormat::Q8G16`]: its low
/// and high halves' group scales).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn pair_scales(w: &QMatrix, r: usize, p: usize) -> (__m256, __m256) {
    let dm = pair_dm(w, r, p);
    let dw = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(dm)));
    (dw, _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(_mm_movehl_ps(dm, dm)))))
}

/// Four rows' pair scales side by side, `(d₀, d₁)` and `(m₀, m₁)` of rows `r0..r0+4`
/// ([`QFormat::Q8G16`]: the low and high halves' group scales).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn rows4_scales(w: &QMatrix, r0: usize, p: usize) -> (__m256, __m256) {
    let dm =
        [pair_dm(w, r0, p), pair_dm(w, r0 + 1, p), pair_dm(w, r0 + 2, p), pair_dm(w, r0 + 3, p)];
    let (d01, d23) = (_mm_movelh_ps(dm[0], dm[1]), _mm_movelh_ps(dm[2], dm[3]));
    let (m01, m23) = (_mm_movehl_ps(dm[1], dm[0]), _mm_movehl_ps(dm[3], dm[2]));
    (
        _mm256_insertf128_ps(_mm256_castps128_ps256(d01), d23, 1),
        _mm256_insertf128_ps(_mm256_castps128_ps256(m01), m23, 1),
    )
}

/// Activation scales of one token's pair `at` (token × pairs + pair) for the single tiles:
/// `(d₀, d₁)` and `(s₀/8, s₁/8)`, each four times.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn single_scales(a: &QActs, at: usize) -> (__m256, __m256) {
    (
        _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.d.as_ptr().add(at * 2)))),
        _mm256_castpd_ps(_mm256_set1_pd(pair_f64(a.s8.as_ptr().add(at * 2)))),
    )
}

/// Adds the blocks of `acc`'s lanes `(x₀b₀, x₀b₁, x₁b₀, x₁b₁ | x₂b₀, x₂b₁, x₃b₀, x₃b₁)` and
/// writes `x₀..x₃` to `at`, `at + stride`, `at + 2·stride`, `at + 3·stride`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store4(acc: __m256, at: *mut f32, stride: usize) {
    let h = _mm256_hadd_ps(acc, acc);
    let (lo, hi) = (_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    *at = _mm_cvtss_f32(lo);
    *at.add(stride) = _mm_cvtss_f32(_mm_movehdup_ps(lo));
    *at.add(2 * stride) = _mm_cvtss_f32(hi);
    *at.add(3 * stride) = _mm_cvtss_f32(_mm_movehdup_ps(hi));
}

/// Weight formats of the AVX2 tile kernels' const parameter: 4-bit pairs, 8-bit (stored
/// `q + 128`), [`QFormat::Q5`] (nibbles and a mask of high bits) and [`QFormat::Q8G16`] (bytes
/// as 8-bit, a scale per group of 16).
const F_Q4: u8 = 0;
const F_Q8: u8 = 1;
const F_Q5: u8 = 2;
const F_G16: u8 = 3;

/// 16 in each byte of 32 whose bit of `bits` is set (byte `i` for bit `i`): a [`QFormat::Q5`]
/// pair's high bits for one half of the unpacked pair.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn high_bits(bits: u32) -> __m256i {
    // Byte i of the result takes mask byte i / 8 (a shuffle within each 128-bit lane of the
    // broadcast word), then tests its bit i % 8.
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), spread);
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

/// A [`QFormat::Q5`] pair's 64 values as unsigned bytes in the Q8 layout: elements 0..16 of both
/// blocks, then 16..32.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q5_bytes(wq: *const u8) -> (__m256i, __m256i) {
    let v = load256(wq as *const i8);
    let nib = _mm256_set1_epi8(0x0F);
    let high = std::ptr::read_unaligned(wq.add(32) as *const u64);
    (
        _mm256_or_si256(_mm256_and_si256(v, nib), high_bits(high as u32)),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(v, 4), nib),
            high_bits((high >> 32) as u32),
        ),
    )
}

/// A pair's weights as unsigned bytes in the Q8 pair order, positions 0..32 and 32..64: Q4
/// nibbles split low / high, Q8 bytes as stored, Q5 values unpacked (elements 0..16 of both
/// blocks, then 16..32, as Q4's low and high nibbles).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pair_weights<const F: u8>(wq: *const u8) -> (__m256i, __m256i) {
    match F {
        F_Q8 | F_G16 => (load256(wq as *const i8), load256(wq.add(32) as *const i8)),
        F_Q5 => q5_bytes(wq),
        _ => {
            let v = load256(wq as *const i8);
            let mask = _mm256_set1_epi8(0x0F);
            (_mm256_and_si256(v, mask), _mm256_and_si256(_mm256_srli_epi16(v, 4), mask))
        }
    }
}

/// A pair widened for the i16 batch kernels (`wide512.rs`, `wide256.rs`): its scales
/// `(d₀, d₀, d₁, d₁)`, minimums `(m₀, m₀, m₁, m₁)` (the lanes of a token's products) and 64
/// values as i16 in the Q8 pair order.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct WidePair {
    dw: [f32; 4],
    mw: [f32; 4],
    q: [i16; 64],
}

impl WidePair {
    const ZERO: WidePair = WidePair { dw: [0.0; 4], mw: [0.0; 4], q: [0; 64] };
}

/// Asks for row `r`'s weights and scales ahead of their widening by an i16 batch kernel: while
/// one row group's tiles run, the next group's bytes arrive (a decode step's LM head streams its
/// weights from memory: Gemma 3's 262,144 × 640 Q8_0 head at 32 tokens, the AVX-512 kernel on a
/// 2-core AMD EPYC family 26 model 2 (Zen 5), 185 -> 262 GMAC/s). A row past the matrix's end is
/// harmless: a prefetch never faults.
#[inline]
#[target_feature(enable = "sse")]
unsafe fn prefetch_row(w: &QMatrix, r: usize) {
    let bytes = w.npairs * w.format.pair_bytes();
    let row = w.qs.as_ptr().wrapping_add(r * bytes);
    for off in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(off) as *const i8);
    }
    let dm = w.dm.as_ptr().wrapping_add(r * w.npairs * 4) as *const u8;
    for off in (0..w.npairs * 8).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(dm.wrapping_add(off) as *const i8);
    }
}

/// Stores the scales of pair `p` of row `r` in `d`'s lanes: `(d₀, d₁, m₀, m₁)` becomes
/// `(d₀, d₀, d₁, d₁)` and `(m₀, m₀, m₁, m₁)` (zero for symmetric types, [`QMatrix::offset`],
/// whose widened values are signed). A [`QFormat::Q8G16`] pair, widened to its values
/// times their sub-scales ([`g16_subscales`]), takes its super-block's `d` in every lane and no
/// minimum.
#[inline]
#[target_feature(enable = "sse2,f16c")]
unsafe fn store_wide_scales(w: &QMatrix, r: usize, p: usize, d: &mut WidePair) {
    if w.format == QFormat::Q8G16 {
        let dk = w.dk.get_unchecked(r * w.npairs + p).to_bits() as i16;
        _mm_storeu_ps(d.dw.as_mut_ptr(), _mm_cvtph_ps(_mm_set1_epi16(dk)));
        _mm_storeu_ps(d.mw.as_mut_ptr(), _mm_setzero_ps());
        return;
    }
    let dm = pair_dm(w, r, p);
    _mm_storeu_ps(d.dw.as_mut_ptr(), _mm_unpacklo_ps(dm, dm));
    // Symmetric types are widened signed (`widen_offset`): no minimum.
    let mw = if w.offset.is_some() { _mm_setzero_ps() } else { _mm_unpackhi_ps(dm, dm) };
    _mm_storeu_ps(d.mw.as_mut_ptr(), mw);
}

/// A [`QFormat::Q8G16`] pair's integer sub-scales as i16 in the lanes of eight consecutive
/// weights of the Q8 order, `(s₀ ×4, s₁ ×4)`, for its low and high halves. The i16 batch
/// kernels widen such a pair to `q·s` (|q| ≤ 32, |s| ≤ 128: at most 4096 in magnitude), so
/// that one scale `d` serves the pair; a lane's sixteen products with activations of at most
/// 32639 stay below 2³¹.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn g16_subscales(w: &QMatrix, r: usize, p: usize) -> (__m128i, __m128i) {
    let at = w.dm.as_ptr().add((r * w.npairs + p) * 4) as *const __m128i;
    let s = _mm_cvtps_epi32(_mm_cvtph_ps(_mm_loadl_epi64(at)));
    let s = _mm_packs_epi32(s, _mm_setzero_si128());
    (
        _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3)),
        _mm_shuffle_epi8(s, _mm_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7)),
    )
}

thread_local! {
    /// Each thread's widened rows for the i16 batch kernels.
    static SCRATCH: std::cell::RefCell<Vec<WidePair>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Activation bytes a block of tokens of the i16 batch kernels should stay within (part of a
/// 1-2 MiB L2). Measured on a 2-core AMD EPYC family 26 model 2 (Zen 5, 1 MiB L2 per core), the
/// AVX-512 kernel, 2 threads, t = 512, Q4_1 1536×576 / Q5_1 576×1536: 24 KiB blocks 218 / 229
/// GMAC/s, 160 KiB 261 / 268, 400 KiB 262 / 284, all tokens at once (2 MB) 263 / 227.
const L2_ACTS: usize = 384 * 1024;

/// Activation bytes of a quad of tokens per pair: values, scales, sums.
const QUAD_PAIR_BYTES: usize = 256 * 2 + 16 * 4 * 2;

// After `drive_tiles!`, which they use.
mod avx2_vnni;
mod wide;
mod wide256;
mod wide512;
