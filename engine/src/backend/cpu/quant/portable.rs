//! The matmul kernel of CPUs without Tandem's x86 SIMD kernels (ARM, every other architecture,
//! and x86 with `TANDEM_CPU_KERNEL=scalar`): plain Rust written for the compiler's
//! vectoriser. [`scalar::dot`](super::scalar::dot), the oracle the SIMD kernels are tested
//! against, reads one weight row and one token a pair at a time, unpacking nibbles and picking
//! each value's block by index; compiled for a baseline x86-64 it ran SmolLM2-135M Q4_1 at
//! 8.8 prompt and 6.3 decode tok/s on a 2-core AMD EPYC family 25 model 1 (Zen 3).
//!
//! Here a row's weights are widened once into i16 (for every token of the call), each token's
//! two activation levels once into the combined `256·q₁ + q₂` (for every row), and a pair's
//! integer sums run over fixed-size arrays with eight i32 lanes (value `j` in lane `j % 8`: lanes
//! 0–3 are block 0, lanes 4–7 block 1 in the Q8 pair order), which the compiler turns into
//! widening multiply-adds (NEON's `smlal`, SSE2's `pmaddwd`). The integer sums equal the
//! oracle's and the floats are combined in its order, so the results are bit for bit its own.

use super::{QActs, QFormat, QMatrix};

/// Values of a pair.
const PAIR: usize = 64;

/// Pair `wq` of a matrix in `format` unpacked into its 64 values in the Q8 pair order: Q4 low
/// nibbles then high, Q5 with their fifth bits, Q8 as stored; Q8G16 signed (`q - 128`).
fn widen_pair(format: QFormat, wq: &[u8], out: &mut [i16; PAIR]) {
    match format {
        QFormat::Q4_1 => {
            for i in 0..32 {
                out[i] = (wq[i] & 0x0F) as i16;
                out[32 + i] = (wq[i] >> 4) as i16;
            }
        }
        QFormat::Q5 => {
            let mask = u64::from_le_bytes(wq[32..40].try_into().expect("a Q5 pair's mask"));
            for i in 0..32 {
                out[i] = ((wq[i] & 0x0F) as u64 | ((mask >> i) & 1) << 4) as i16;
                out[32 + i] = ((wq[i] >> 4) as u64 | ((mask >> (32 + i)) & 1) << 4) as i16;
            }
        }
        QFormat::Q8_0 => {
            for (o, &q) in out.iter_mut().zip(&wq[..PAIR]) {
                *o = q as i16;
            }
        }
        QFormat::Q8G16 => {
            for (o, &q) in out.iter_mut().zip(&wq[..PAIR]) {
                *o = q as i16 - 128;
            }
        }
    }
}

/// `Σ w·x` of values `j ≡ l (mod 8)` into lane `l`, over the 32 values of `w` and `x`.
#[inline(always)]
fn lanes32(w: &[i16], x: &[i16]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (wc, xc) in w[..32].chunks_exact(8).zip(x[..32].chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += wc[l] as i32 * xc[l] as i32;
        }
    }
    lanes
}

/// Rows `rows` of `out = a · wᵀ` (`out` is `a.t × w.n`, row-major).
///
/// # Safety
/// `out` must point to `a.t × w.n` floats, and no other thread may write the same rows.
pub unsafe fn rows(w: &QMatrix, a: &QActs, rows: std::ops::Range<usize>, out: *mut f32) {
    let np = w.npairs;
    let pb = w.format.pair_bytes();
    // Every token's combined activations: `256·q₁ + q₂` fits i16 (|q₁|, |q₂| ≤ 127).
    let x: Vec<i16> =
        a.qs.iter().zip(&a.qs2).map(|(&q1, &q2)| 256 * q1 as i16 + q2 as i16).collect();
    let mut wrow = vec![[0i16; PAIR]; np];
    let g16 = w.format == QFormat::Q8G16;
    // A row's scales as f32 (stored as f16): block b of pair p at 2p + b, with the minimums
    // beside them; Q8G16's four group scales of a pair at 4p + 2h + b.
    let mut scales = vec![0f32; np * 4];
    for r in rows {
        for (p, wp) in wrow.iter_mut().enumerate() {
            let at = (r * np + p) * pb;
            widen_pair(w.format, &w.qs[at..at + pb], wp);
            for b in 0..2 {
                if g16 {
                    for h in 0..2 {
                        scales[4 * p + 2 * h + b] = w.group_scale(r, p, b, h);
                    }
                } else {
                    scales[4 * p + b] = w.scale(r, p, b);
                    scales[4 * p + 2 + b] = w.min(r, p, b);
                }
            }
        }
        for t in 0..a.t {
            let mut acc = 0f32;
            for (p, wp) in wrow.iter().enumerate() {
                let xp = &x[(t * np + p) * PAIR..(t * np + p + 1) * PAIR];
                let (lo, hi) = (lanes32(&wp[..32], &xp[..32]), lanes32(&wp[32..], &xp[32..]));
                let block = |l: &[i32; 8], b: usize| l[4 * b..4 * b + 4].iter().sum::<i32>();
                let ai = (t * np + p) * 2;
                let sc = &scales[4 * p..4 * p + 4];
                if g16 {
                    // Group (b, h) of 16: block b of half h, taken in the oracle's order.
                    for (h, l) in [lo, hi].iter().enumerate() {
                        for b in 0..2 {
                            acc += sc[2 * h + b] * a.d[ai + b] * block(l, b) as f32;
                        }
                    }
                } else {
                    for b in 0..2 {
                        let s = block(&lo, b) + block(&hi, b);
                        acc += sc[b] * a.d[ai + b] * s as f32 + sc[2 + b] * a.s[ai + b];
                    }
                }
            }
            *out.add(t * w.n + r) = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::scalar;
    use super::*;

    /// Every format (Q4_K comes as Q4_1, Q5_K as Q5, Q6_K as Q8G16), batches of one and
    /// several tokens: the kernel's results are the oracle's, bit for bit.
    #[test]
    fn rows_equal_the_oracle_bit_for_bit() {
        use super::super::tests_support::{random_gguf, random_k};
        use crate::model_files::dtype::GgmlType;
        let types = [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        let (n, k) = (20, 512);
        for ty in types {
            let data = match ty {
                GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => random_k(ty, n, k, 5),
                _ => random_gguf(ty, n, k, 5),
            };
            let w = QMatrix::from_gguf(ty, &data, n, k).unwrap();
            for t in [1, 5] {
                let mut rng = crate::sampling::sampler::Rng::new(t as u64);
                let x: Vec<f32> = (0..t * k).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect();
                let mut a = QActs::default();
                a.quantize(&x, t, k);
                let mut out = vec![0f32; t * n];
                // SAFETY: `out` holds t × n floats.
                unsafe { rows(&w, &a, 0..n, out.as_mut_ptr()) };
                for r in 0..n {
                    for ti in 0..t {
                        let want = scalar::dot(&w, r, &a, ti);
                        assert_eq!(out[ti * n + r].to_bits(), want.to_bits(), "{ty:?} {r},{ti}");
                    }
                }
            }
        }
    }
}
