//! Element-wise and normalisation kernels of the CPU backend, in f32.

/// RMSNorm of each `w.len()`-wide row of `x` into `out`: `x / sqrt(mean(x²) + eps) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * inv * g;
        }
    }
}

/// In-place RMSNorm of each `w.len()`-wide row.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

#[inline(always)]
fn silu_mul_body(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let s = *g / (1.0 + exp_fast(-*g));
        *g = s * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    silu_mul_body(gate, up)
}

/// GELU's tanh form as a sigmoid: `½x(1 + tanh t) = x / (1 + e^(−2t))`,
/// `t = √(2/π)(x + 0.044715x³)` (vectorisable, like SiLU).
#[inline(always)]
fn gelu_tanh_mul_body(gate: &mut [f32], up: &[f32]) {
    const C2: f32 = 2.0 * 0.797_884_6; // 2√(2/π)
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let t2 = C2 * (x + 0.044_715 * x * x * x);
        *g = x / (1.0 + exp_fast(-t2)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_tanh_mul_avx2(gate: &mut [f32], up: &[f32]) {
    gelu_tanh_mul_body(gate, up)
}

/// `gate ← gelu(gate) · up` with GELU's tanh approximation (Gemma's `gelu_pytorch_tanh`).
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { gelu_tanh_mul_avx2(gate, up) };
        }
    }
    gelu_tanh_mul_body(gate, up)
}

/// `silu(gate) * up`, written into `gate` (vectorised exp).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { silu_mul_avx2(gate, up) };
        }
    }
    silu_mul_body(gate, up)
}

/// Precomputed inverse frequencies of rotary embeddings for one head width.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f64>,
    interleaved: bool,
}

impl Rope {
    /// Frequencies `theta^(-2i/d)`; `interleaved` pairs (2i, 2i+1), otherwise (i, i+d/2).
    pub fn new(head_dim: usize, theta: f32, interleaved: bool) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64))
            .collect();
        Rope { inv_freq, interleaved }
    }

    /// `(cos, sin)` of every frequency at `pos`, for [`Rope::apply_with`].
    pub fn angles(&self, pos: u32, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
        cos.clear();
        sin.clear();
        for f in &self.inv_freq {
            // Same rounding as an f32 reference: angle in f32, then cos/sin.
            let a = (pos as f32) * (*f as f32);
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }

    /// Rotates every head of one token's vector with precomputed [`Rope::angles`].
    pub fn apply_with(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = self.inv_freq.len();
        let d = half * 2;
        for head in x.chunks_exact_mut(d) {
            for i in 0..half {
                let (a, b) = if self.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

/// Numerically stable in-place softmax with the given exponential.
#[inline(always)]
fn softmax_with(x: &mut [f32], exp: impl Fn(f32) -> f32) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0f32;
    for v in x.iter_mut() {
        *v = exp(*v - m);
        s += *v;
    }
    let inv = 1.0 / s;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Numerically stable in-place softmax.
pub fn softmax(x: &mut [f32]) {
    softmax_with(x, f32::exp)
}

/// `e^x` by range reduction (`x = n·ln2 + r`) and a degree-6 polynomial; relative error below
/// 5e-7. Branch-free and without float-to-int conversions, so the compiler vectorises loops of
/// it.
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    // ln2 split in two for an exact reduction.
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (0.166_666_67 + r * (0.041_666_83 + r * (0.008_333_36 + r * 0.001_388_9)))));
    // 2ⁿ from the bits of `n + 127 + 2²³` (exact: n + 127 is an integer in 1..=254), not from
    // `n as i32`, whose saturating conversion does not vectorise.
    let biased = (n + (127.0 + 8_388_608.0)).to_bits() - 0x4B00_0000;
    f32::from_bits(biased << 23) * p
}

/// The largest of `x` (NaNs ignored; `-inf` when empty), over 16 independent lanes so the loop
/// vectorises (a running maximum is a serial chain, long over a 262k-entry vocabulary row).
#[inline(always)]
pub fn max_lanes(x: &[f32]) -> f32 {
    const L: usize = 16;
    let chunks = x.chunks_exact(L);
    let rest = chunks.remainder();
    let mut lanes = [f32::NEG_INFINITY; L];
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    lanes.iter().chain(rest).copied().fold(f32::NEG_INFINITY, f32::max)
}

#[inline(always)]
fn log_sum_exp_body(x: &[f32]) -> f32 {
    let m = max_lanes(x);
    if m == f32::NEG_INFINITY {
        return m;
    }
    // Terms are at most 1: 16 f32 lanes sum 64 of them each per block of 1024 (relative error
    // ~2⁻¹⁸), blocks add in f64.
    const L: usize = 16;
    let mut s = 0f64;
    for block in x.chunks(1024) {
        let chunks = block.chunks_exact(L);
        let rest = chunks.remainder();
        let mut acc = [0f32; L];
        for c in chunks {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += exp_fast(v - m);
            }
        }
        s += acc.iter().map(|&a| a as f64).sum::<f64>();
        s += rest.iter().map(|&v| exp_fast(v - m) as f64).sum::<f64>();
    }
    (m as f64 + s.ln()) as f32
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn log_sum_exp_avx2(x: &[f32]) -> f32 {
    log_sum_exp_body(x)
}

/// `log Σ e^x` of a row of logits (the log-softmax normaliser), without allocating.
pub fn log_sum_exp(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { log_sum_exp_avx2(x) };
        }
    }
    log_sum_exp_body(x)
}

/// Softmax with [`exp_fast`], for the SIMD attention path: maximum and sum kept in 16
/// independent lanes, so that inlined into a function with vector target features the loops
/// vectorise (one serial sum kept them scalar: a third of a 512-token prefill's attention time
/// went to a scalar `exp`, `perf` on a 2-core AMD EPYC family 26 model 2 (Zen 5), AVX-512
/// attention kernel).
#[inline(always)]
pub fn softmax_fast(x: &mut [f32]) {
    const L: usize = 16;
    let m = max_lanes(x);
    let body = x.len() / L * L;
    let (head, tail) = x.split_at_mut(body);
    let mut sums = [0f32; L];
    for c in head.chunks_exact_mut(L) {
        for (s, v) in sums.iter_mut().zip(c) {
            *v = exp_fast(*v - m);
            *s += *v;
        }
    }
    let mut s = 0f32;
    for v in tail.iter_mut() {
        *v = exp_fast(*v - m);
        s += *v;
    }
    let inv = 1.0 / (s + sums.iter().sum::<f32>());
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Log-softmax of a row of logits, in f64 for the normaliser.
pub fn log_softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f64 = x.iter().map(|&v| ((v - m) as f64).exp()).sum();
    let lse = m as f64 + s.ln();
    x.iter().map(|&v| (v as f64 - lse) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rotate(rope: &Rope, x: &mut [f32], pos: u32) {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        rope.angles(pos, &mut cos, &mut sin);
        rope.apply_with(x, &cos, &sin);
    }

    #[test]
    fn rope_styles_agree_up_to_permutation() {
        let d = 8;
        let x: Vec<f32> = (0..d).map(|i| i as f32 + 1.0).collect();
        // Interleaved layout of the same vector: (x0, x4, x1, x5, ...)
        let mut inter: Vec<f32> = (0..d / 2).flat_map(|i| [x[i], x[i + d / 2]]).collect();
        let mut neox = x.clone();
        rotate(&Rope::new(d, 10000.0, true), &mut inter, 7);
        rotate(&Rope::new(d, 10000.0, false), &mut neox, 7);
        for i in 0..d / 2 {
            assert!((inter[2 * i] - neox[i]).abs() < 1e-5);
            assert!((inter[2 * i + 1] - neox[i + d / 2]).abs() < 1e-5);
        }
        // Position 0 is the identity.
        let mut y = x.clone();
        rotate(&Rope::new(d, 10000.0, false), &mut y, 0);
        assert_eq!(y, x);
    }

    #[test]
    fn gelu_tanh_matches_its_definition() {
        let x: Vec<f32> = (-400..400).map(|i| i as f32 * 0.025).chain([-30.0, 30.0]).collect();
        let mut g = x.clone();
        gelu_tanh_mul(&mut g, &vec![1.0; x.len()]);
        for (a, &x) in g.iter().zip(&x) {
            let c = 0.797_884_560_802_865_4_f64;
            let x64 = x as f64;
            let want = 0.5 * x64 * (1.0 + (c * (x64 + 0.044_715 * x64.powi(3))).tanh());
            assert!(
                (*a as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "gelu({x}) = {a}, want {want}"
            );
        }
    }

    #[test]
    fn exp_fast_and_log_sum_exp_are_accurate() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 20.0 {
            let (a, b) = (exp_fast(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 5e-7, "relative error {worst}");
        let row: Vec<f32> = (0..49152).map(|i| ((i * 7919) % 1000) as f32 / 50.0 - 10.0).collect();
        let exact = log_softmax(&row);
        let lse = log_sum_exp(&row);
        for i in [0, 17, 4000, 49151] {
            assert!((row[i] - lse - exact[i]).abs() < 1e-5);
        }
    }

    #[test]
    fn norms_and_softmax() {
        let mut out = [0f32; 2];
        rms_norm(&[3.0, 4.0], &[1.0, 2.0], 0.0, &mut out);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6 && (out[1] - 8.0 / r).abs() < 1e-6);
        let mut p = [1.0f32, 2.0, 3.0];
        softmax(&mut p);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6 && p[2] > p[1]);
        let lp = log_softmax(&[1.0, 2.0, 3.0]);
        assert!((lp.iter().map(|v| v.exp()).sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
