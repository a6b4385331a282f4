//! The two-pass head against the one-pass one on random Q8_0 heads, on every kernel of this CPU
//! (the scalar oracle included, so the logic is checked on any machine).

use std::sync::Arc;

use super::super::linear::{Linear, QuantLinear};
use super::super::quant::tests_support::random_gguf;
use super::super::quant::{q8_pos, scalar, QActs, QKernel, QMatrix, QK};
use super::*;
use crate::model_files::dtype::GgmlType;
use crate::sampling::sampler::Rng;

fn head(n: usize, k: usize, seed: u64) -> QMatrix {
    QMatrix::from_gguf(GgmlType::Q8_0, &random_gguf(GgmlType::Q8_0, n, k, seed), n, k).unwrap()
}

/// `t` activation rows of width `k` whose logits spread as a language model's do: row `i`'s
/// scale grows with `i` (flat to peaked), with a few outliers as in Gemma's residual stream.
fn acts(t: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut x = Vec::with_capacity(t * k);
    for i in 0..t {
        let scale = 0.3 + 0.35 * i as f32;
        for j in 0..k {
            let v = (rng.next_f64() as f32 - 0.5) * scale;
            x.push(if j % 97 == 5 { v * 8.0 } else { v });
        }
    }
    x
}

fn log_sum_exp(row: &[f32]) -> f64 {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)) as f64;
    m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
}

#[test]
fn coarse_activations_give_the_first_level_alone_on_every_kernel() {
    // A Q8_0 head and a Q6_K one (Q8G16: group scales, no minimum term).
    let q6 = |n: usize, k: usize| {
        let data = super::super::quant::tests_support::random_k(GgmlType::Q6_K, n, k, 5);
        QMatrix::from_gguf(GgmlType::Q6_K, &data, n, k).unwrap()
    };
    for (w, k) in [(head(40, 320, 3), 320), (q6(40, 512), 512)] {
        coarse_on_every_kernel(&w, k);
    }
}

fn coarse_on_every_kernel(w: &QMatrix, k: usize) {
    let (n, t) = (w.n, 9);
    let x = acts(t, k, 4);
    let mut a = QActs::default();
    a.quantize_for(&x, t, k, QKernel::Avx2);
    let c = a.coarse();
    for &kernel in &QKernel::available() {
        let mut out = vec![0f32; t * n];
        QuantLinear::new(Arc::new(w.clone()), kernel).forward_quantized(&c, &mut out);
        let mut wr = vec![0f32; k];
        for r in 0..n {
            w.row_f32(r, &mut wr);
            for ti in 0..t {
                // Σ w·d·q₁ from the dequantised row and the first level's bytes.
                let np = a.npairs;
                let want: f64 = (0..k)
                    .map(|e| {
                        let (blk, j) = (e / QK, e % QK);
                        let (p, b) = (blk / 2, blk % 2);
                        let q1 = a.qs[(ti * np + p) * 64 + q8_pos(b, j)] as f64;
                        let d = a.d[(ti * np + p) * 2 + b] as f64 * 256.0;
                        wr[e] as f64 * d * q1
                    })
                    .sum();
                let got = out[ti * n + r] as f64;
                // Rounding of the kernels' f32 sums, relative to the terms' magnitude.
                let mass: f64 = (0..k).map(|e| (wr[e] * x[ti * k + e]).abs() as f64).sum();
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + mass),
                    "{kernel:?} [{ti},{r}]: {got} vs {want}"
                );
                // And it differs from both levels' value by at most the first level's rounding,
                // half a step (`d/2`) of each element.
                let bound: f64 = (0..k)
                    .map(|e| {
                        let (blk, b) = (e / QK, (e / QK) % 2);
                        let d = a.d[(ti * np + blk / 2) * 2 + b] as f64 * 256.0;
                        wr[e].abs() as f64 * d / 2.0
                    })
                    .sum();
                let full = scalar::dot(w, r, &a, ti) as f64;
                assert!((got - full).abs() <= bound * 1.01 + 1e-4 * mass, "{got} vs {full}");
            }
        }
    }
}

#[test]
fn a_token_alone_gives_its_row_of_the_batch() {
    let (n, k, t) = (24, 192, 7);
    let w = head(n, k, 5);
    let mut a = QActs::default();
    a.quantize_for(&acts(t, k, 6), t, k, QKernel::Avx2);
    for &kernel in &QKernel::available() {
        let lin = QuantLinear::new(Arc::new(w.clone()), kernel);
        let mut all = vec![0f32; t * n];
        lin.forward_quantized(&a, &mut all);
        for ti in 0..t {
            let mut one = vec![0f32; n];
            lin.forward_quantized(&a.token(ti), &mut one);
            for r in 0..n {
                let want = all[ti * n + r];
                assert!((one[r] - want).abs() <= 1e-4 * (1.0 + want.abs()), "{kernel:?} {ti} {r}");
            }
        }
    }
}

#[test]
fn two_passes_keep_every_likely_logit_and_the_softmax() {
    let (n, k, t) = (20_000, 256, 6);
    let w = head(n, k, 7);
    let x = acts(t, k, 8);
    let mut a = QActs::default();
    a.quantize_for(&x, t, k, QKernel::Avx2);
    for &kernel in &QKernel::available() {
        let lin = QuantLinear::new(Arc::new(w.clone()), kernel);
        let mut one = vec![0f32; t * n];
        lin.forward_quantized(&a, &mut one);
        let mut two = vec![0f32; t * n];
        lin.forward_quantized(&a.coarse(), &mut two);
        let refined = refine(kernel, &w, &a, &[], &mut two);
        let (mut moved_tail, mut worst_lse) = (0usize, 0f64);
        for ti in 0..t {
            let (o, p) = (&one[ti * n..(ti + 1) * n], &two[ti * n..(ti + 1) * n]);
            let best = o.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            for r in 0..n {
                if o[r] >= best - REFINE_MARGIN + 0.5 {
                    assert!(
                        (p[r] - o[r]).abs() <= 1e-4 * (1.0 + o[r].abs()),
                        "{kernel:?} row {ti} entry {r} within the margin: {} vs {}",
                        p[r],
                        o[r]
                    );
                } else {
                    assert!((p[r] - o[r]).abs() < 2.0, "{kernel:?} far entry {r}: {}", p[r]);
                    moved_tail += usize::from((p[r] - o[r]).abs() > 1e-3);
                }
            }
            let argmax = |v: &[f32]| (0..n).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap();
            assert_eq!(argmax(o), argmax(p), "{kernel:?} row {ti}");
            worst_lse = worst_lse.max((log_sum_exp(o) - log_sum_exp(p)).abs());
        }
        eprintln!(
            "{kernel:?}: {refined} of {} entries recomputed, {moved_tail} far entries moved \
             by > 1e-3, worst log-sum-exp change {worst_lse:.2e}",
            t * n
        );
        // The first pass is coarse (else this test checks nothing), the second pass touches a
        // minority, and the normaliser barely moves.
        assert!(moved_tail > n / 10, "{kernel:?}: the first pass moved only {moved_tail}");
        assert!(refined < t * n / 2, "{kernel:?}: {refined} recomputed");
        assert!(worst_lse < 1e-3, "{kernel:?}: log-sum-exp moved {worst_lse}");
    }
}

#[test]
fn the_4_bit_copy_keeps_every_likely_logit_and_its_error_within_the_spread() {
    let (n, k) = (TWO_PASS_MIN_ROWS + 100, 256);
    let w = head(n, k, 9);
    let coarse = CoarseHead::for_head(&w).expect("a Q8_0 head of this many rows takes a copy");
    assert_eq!(coarse.w.format, QFormat::Q4_1);
    for &kernel in &QKernel::available() {
        let lin = Arc::new(QuantLinear::new(Arc::new(w.clone()), kernel)).into_lm_head();
        let mut moved = 0usize;
        for t in 1..=COARSE_MAX_ROWS {
            let x = acts(t, k, 10 + t as u64);
            let mut one = vec![0f32; t * n];
            lin.forward_logits(&x, t, &vec![true; t], &mut one);
            let mut two = vec![f32::NAN; t * n];
            lin.forward_logits(&x, t, &vec![false; t], &mut two);
            // The copy's own pass.
            let mut a = QActs::default();
            a.quantize_for(&x, t, k, kernel);
            let mut first = vec![0f32; t * n];
            QuantLinear::new(Arc::new(coarse.w.clone()), kernel).forward_quantized(&a, &mut first);
            for ti in 0..t {
                let row = ti * n..(ti + 1) * n;
                let (o, p, f) = (&one[row.clone()], &two[row.clone()], &first[row]);
                let best = o.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let spread = coarse.spread(&x[ti * k..(ti + 1) * k]);
                let mut sq = 0f64;
                for r in 0..n {
                    // The copy's error: within the spread everywhere.
                    let e = (f[r] - o[r]).abs();
                    sq += (e as f64).powi(2);
                    assert!(e <= spread, "{kernel:?} t={t} [{ti},{r}]: {e} > {spread}");
                    if o[r] >= best - REFINE_MARGIN {
                        let d = (p[r] - o[r]).abs();
                        assert!(d <= 1e-4 * (1.0 + o[r].abs()), "{kernel:?} t={t} [{ti},{r}]");
                    } else {
                        // The far entries are the copy's, or recomputed.
                        let near = |a: f32, b: f32| (a - b).abs() <= 1e-4 * (1.0 + b.abs());
                        assert!(
                            near(p[r], f[r]) || near(p[r], o[r]),
                            "{kernel:?} t={t} [{ti},{r}]"
                        );
                        moved += usize::from(near(p[r], f[r]) && e > 1e-3);
                    }
                }
                // The spread is COARSE_SIGMAS standard deviations of the copy's error.
                let rms = (sq / n as f64).sqrt() as f32;
                let sigma = spread / COARSE_SIGMAS;
                assert!(rms <= sigma * 1.3 && rms >= sigma * 0.7, "{kernel:?}: {rms} vs {sigma}");
            }
        }
        // Rows of flat logits have most entries within the margin; the peaked ones do not.
        assert!(moved > n / 2, "{kernel:?}: only {moved} far entries kept the copy's values");
    }
}
