//! Tests of the quantised formats, the quantiser and the scalar oracle (`quant.rs`).

use super::tests_support::{random_gguf, random_k};
use super::*;

#[test]
fn simd_quantisation_equals_the_portable_one() {
    let (t, k) = (QUAD_MIN_ROWS + 1, 160);
    let mut rng = crate::sampling::sampler::Rng::new(11);
    let x: Vec<f32> = (0..t * k)
        .map(|i| if i % 37 == 0 { 0.0 } else { (rng.next_f64() as f32 - 0.5) * 9.0 })
        .collect();
    let mut a = QActs::default();
    a.quantize_for(&x, t, k, QKernel::Avx2);
    let npairs = a.npairs;
    let mut b = QActs {
        t,
        npairs,
        qs: vec![0; a.qs.len()],
        qs2: vec![0; a.qs.len()],
        q16: vec![0; a.qs.len()],
        q16_quad: vec![0; t.div_ceil(4) * npairs * 256],
        d_quad: Vec::new(),
        s_quad: Vec::new(),
        d: vec![0.0; a.d.len()],
        s: vec![0.0; a.d.len()],
        s8: vec![0.0; a.d.len()],
        d4: Vec::new(),
        s4: Vec::new(),
        coarse: false,
    };
    for ti in 0..t {
        let ptrs = RowPtrs {
            qs: b.qs.as_mut_ptr(),
            qs2: b.qs2.as_mut_ptr(),
            q16: b.q16.as_mut_ptr(),
            q16_quad: b.q16_quad.as_mut_ptr(),
            d: b.d.as_mut_ptr(),
            s: b.s.as_mut_ptr(),
            s8: b.s8.as_mut_ptr(),
        };
        unsafe { quantize_row_body(&x[ti * k..(ti + 1) * k], npairs, ptrs.at(ti, npairs)) };
    }
    assert_eq!(a.qs, b.qs);
    assert_eq!(a.qs2, b.qs2);
    // The per-token i16 layout, which fewer rows than a quad carry: 256·q₁ + q₂ of each
    // Q8-layout byte, at its wide position.
    let few = QUAD_MIN_ROWS - 1;
    let mut f = QActs::default();
    f.quantize_for(&x[..few * k], few, k, QKernel::Avx2);
    assert!(a.q16.is_empty() && !f.q16.is_empty());
    assert_eq!(f.q16, b.q16[..f.q16.len()]);
    for (j, (&q1, &q2)) in f.qs.iter().zip(&f.qs2).enumerate() {
        assert_eq!(f.q16[(j / 64) * 64 + wide_pos(j % 64)], 256 * q1 as i16 + q2 as i16);
    }
    // The batch layout, the same for every SIMD kernel: 256·q₁ + q₂ of each token's Q8
    // position at its quad place, the padding of the last quad zero.
    assert_eq!(a.q16_quad, b.q16_quad);
    let mut c = QActs::default();
    c.quantize_for(&x, t, k, QKernel::Avx512Vnni);
    assert_eq!(c.q16_quad, b.q16_quad);
    let mut want = vec![0i16; t.div_ceil(4) * npairs * 256];
    for (j, (&q1, &q2)) in a.qs.iter().zip(&a.qs2).enumerate() {
        let (ti, p, m) = (j / (npairs * 64), (j / 64) % npairs, j % 64);
        want[(ti / 4) * npairs * 256 + (ti % 4) * 8 + quad_pos(p, m)] = 256 * q1 as i16 + q2 as i16;
    }
    assert_eq!(c.q16_quad, want);
    assert_eq!(a.d, b.d);
    for (u, v) in a.s.iter().zip(&b.s) {
        assert!((u - v).abs() <= 1e-5 * (1.0 + v.abs()));
    }
}

#[test]
fn repack_is_lossless() {
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0] {
        let (n, k) = (3, 96); // odd block count: a padded pair
        let data = random_gguf(ty, n, k, 5);
        let mut want = vec![0f32; n * k];
        crate::model_files::dtype::dequantize(ty, &data, &mut want);
        let m = QMatrix::from_gguf(ty, &data, n, k).unwrap();
        let mut row = vec![0f32; k];
        for r in 0..n {
            m.row_f32(r, &mut row);
            assert_eq!(row, want[r * k..(r + 1) * k], "{ty:?} row {r}");
        }
    }
}

/// Each repacked K-quant weight against the reference dequantiser: Q6_K and Q3_K
/// ([`QFormat::Q8G16`]) exactly, Q4_K and Q5_K up to the f16 rounding of their group scales
/// (2⁻¹¹ relative) and minimums.
#[test]
fn k_quant_repacks_round_only_the_group_scales() {
    for ty in [GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        let (n, k) = (3, 512);
        let data = random_k(ty, n, k, 21);
        let mut want = vec![0f32; n * k];
        crate::model_files::dtype::dequantize(ty, &data, &mut want);
        let m = QMatrix::from_gguf(ty, &data, n, k).unwrap();
        let g16 = matches!(ty, GgmlType::Q3_K | GgmlType::Q6_K);
        assert_eq!(m.format == QFormat::Q8G16, g16, "{ty:?}");
        assert_eq!(m.n, n);
        // The largest |scale · value| and |minimum| a block can have here.
        let big = 0.005 * 63.0 * 32.0;
        let mut a = vec![0f32; k];
        for r in 0..n {
            m.row_f32(r, &mut a);
            for (i, w) in want[r * k..(r + 1) * k].iter().enumerate() {
                let v = a[i];
                if g16 {
                    assert_eq!(v, *w, "{ty:?} row {r} [{i}]");
                } else {
                    assert!(
                        (v - w).abs() <= 2.0 * big / 2048.0,
                        "{ty:?} row {r} [{i}]: {v} vs {w}"
                    );
                }
            }
        }
    }
    // Two super-blocks' worth of bytes for one: refused.
    let q6k = random_k(GgmlType::Q6_K, 1, 512, 1);
    assert!(QMatrix::from_gguf(GgmlType::Q6_K, &q6k, 1, 256).is_none());
}

/// Q2_K's two parts, the [`QFormat::Q8G16`] values and the minimums per group of 16, add up
/// to the reference dequantiser's weights exactly.
#[test]
fn q2_k_splits_into_values_and_group_minimums_without_loss() {
    let (n, k) = (3, 768);
    let data = random_k(GgmlType::Q2_K, n, k, 4);
    let mut want = vec![0f32; n * k];
    crate::model_files::dtype::dequantize(GgmlType::Q2_K, &data, &mut want);
    let (m, mins) = QMatrix::from_q2_k(&data, n, k).unwrap();
    assert_eq!((m.format, m.n, m.k, mins.len()), (QFormat::Q8G16, n, k, n * k / 16));
    assert!(mins.iter().any(|&v| v < 0.0) && want.iter().any(|&v| v > 0.0));
    let mut row = vec![0f32; k];
    for r in 0..n {
        m.row_f32(r, &mut row);
        for (i, w) in want[r * k..(r + 1) * k].iter().enumerate() {
            assert_eq!(row[i] + mins[r * k / 16 + i / 16], *w, "row {r} [{i}]");
        }
    }
    assert!(QMatrix::from_q2_k(&data, n, 512).is_none(), "a size that does not match");
}

#[test]
fn scalar_dot_matches_dequantised_dot() {
    let types = [GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0];
    for ty in types.into_iter().chain([GgmlType::Q3_K, GgmlType::Q6_K]) {
        let (n, t) = (4, 3);
        let (k, data) = if ty.block_size() == 32 {
            (160, random_gguf(ty, n, 160, 9))
        } else {
            (512, random_k(ty, n, 512, 9))
        };
        let mut w = vec![0f32; n * k];
        crate::model_files::dtype::dequantize(ty, &data, &mut w);
        let m = QMatrix::from_gguf(ty, &data, n, k).unwrap();
        let mut rng = crate::sampling::sampler::Rng::new(1);
        let x: Vec<f32> = (0..t * k).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect();
        let mut a = QActs::default();
        a.quantize(&x, t, k);
        for r in 0..n {
            for ti in 0..t {
                let exact: f32 = (0..k).map(|i| w[r * k + i] * x[ti * k + i]).sum();
                let q = scalar::dot(&m, r, &a, ti);
                // Two-level activations: error ~1/65000 of the row's L1 mass.
                let mass: f32 = (0..k).map(|i| (w[r * k + i] * x[ti * k + i]).abs()).sum();
                assert!((q - exact).abs() <= 1e-4 * mass, "{ty:?} {r},{ti}: {q} vs {exact}");
            }
        }
    }
}
