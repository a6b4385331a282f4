//! Checks of the norm kernels: RMSNorm (with and without a row gather, at widths taking each
//! load path), Gemma's post-norm add, and a split-k product's slices added into the residual
//! by the RMSNorm after it.

use cudarc::driver::LaunchConfig;
use tandem_engine::backend::cpu::ops;

use super::{abs_err, bf, rel_err, result, round_bf, unbf, CheckResult, Rng};
use crate::device::{ptr, Gpu};
use crate::CudaError;

/// Gemma's norm of a sub-layer's output added to the residual, against the CPU formula.
pub(super) fn rmsnorm_add(g: &Gpu) -> Result<CheckResult, CudaError> {
    let (rows, h, eps) = (5, 640, 1e-6f32);
    let mut r = Rng::new(12);
    let (x, y, w) = (r.vec(rows * h, 2.0), r.vec(rows * h, 30.0), r.vec(h, 1.5));
    let mut want = x.clone();
    for (xr, yr) in want.chunks_exact_mut(h).zip(y.chunks_exact(h)) {
        let ms = yr.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for ((a, b), c) in xr.iter_mut().zip(yr).zip(&w) {
            *a += (*b as f64 * inv * *c as f64) as f32;
        }
    }
    let (dx, dy, dw) = (g.upload(&x)?, g.upload(&y)?, g.upload(&w)?);
    let hi = h as i32;
    let cfg =
        LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: rmsnorm_add(float*, const float*, const float*, int, float) over rows × h.
    unsafe { g.launch(&g.k.rmsnorm_add, cfg, &[&ptr(&dx), &ptr(&dy), &ptr(&dw), &hi, &eps])? };
    let got = g.read(&dx, rows * h)?;
    Ok(result("post-norm add f32 (tol 1e-5 rel)", rel_err(&got, &want, 1.0), 1e-5))
}

pub(super) fn rmsnorm(g: &Gpu, u: f64) -> Result<Vec<CheckResult>, CudaError> {
    // A width of a multiple of 4 (16-byte loads) and one that is not (scalar loads).
    // Widths held in registers (576, 4096), past them (8200), and not a multiple of 4 (574).
    // Each register variant (576: one vector a thread, 2048: two, 4096: four), and the general
    // kernel on a width a variant would take.
    let mut out = rmsnorm_at(g, u, 576, false)?;
    for h in [2048, 4096, 8200, 574] {
        out.extend(rmsnorm_at(g, u, h, false)?);
    }
    out.extend(rmsnorm_at(g, u, 576, true)?);
    Ok(out)
}

fn rmsnorm_at(g: &Gpu, u: f64, h: usize, general: bool) -> Result<Vec<CheckResult>, CudaError> {
    let f = if general { &g.k.rmsnorm } else { g.rmsnorm_for(h) };
    let tag = if general { ", general kernel" } else { "" };
    let (rows, eps) = (13, 1e-5f32);
    let mut r = Rng::new(3);
    let x = r.vec(rows * h, 3.0);
    let w = r.vec(h, 1.0);
    let mut want = vec![0f32; rows * h];
    ops::rms_norm(&x, &w, eps, &mut want);
    let (dx, dw, dy) = (g.upload(&x)?, g.upload(&w)?, g.zeros::<u16>(rows * h)?);
    let hi = h as i32;
    let cfg = |n: usize| LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: rmsnorm(const float*, const int*, const float*, h16*, int, float).
    unsafe { g.launch(f, cfg(rows), &[&ptr(&dx), &0u64, &ptr(&dw), &ptr(&dy), &hi, &eps])? };
    let got = unbf(&g.read(&dy, rows * h)?);
    let sel = [12i32, 0, 5];
    let dsel = g.upload(&sel)?;
    // SAFETY: as above, gathering rows `sel`.
    unsafe {
        g.launch(f, cfg(sel.len()), &[&ptr(&dx), &ptr(&dsel), &ptr(&dw), &ptr(&dy), &hi, &eps])?
    };
    let got_sel = unbf(&g.read(&dy, sel.len() * h)?);
    let want_sel: Vec<f32> =
        sel.iter().flat_map(|&i| want[i as usize * h..(i as usize + 1) * h].to_vec()).collect();
    Ok(vec![
        // Output rounded to 16 bits: within u relative (plus a floor for values near zero).
        result(
            &format!("rmsnorm f32→16-bit, width {h}{tag} (tol 1.05u)"),
            rel_err(&got, &want, 1e-2),
            1.05 * u,
        ),
        result(
            &format!("rmsnorm with row gather, width {h}{tag} (tol 1.05u)"),
            rel_err(&got_sel, &want_sel, 1e-2),
            1.05 * u,
        ),
    ])
}

/// A product into the residual cut along k ([`Gpu::gemm_split_k`]) and the `rmsnorm_parts`
/// kernel that adds its slices in and norms, against `x + A·Wᵀ` in f64 and the CPU RMSNorm of
/// it: the residual written back and the normed rows. Shapes of Qwen3-0.6B's o projection, the
/// SmolLM2 shape's down, the 8B shape's width (four vectors a thread) and a width not a
/// multiple of 4 (the scalar path).
pub(super) fn rmsnorm_parts(g: &Gpu, u: f64) -> Result<Vec<CheckResult>, CudaError> {
    let mut out = Vec::new();
    for (m, n, k, slices) in
        [(64, 1024, 2048, 8), (200, 576, 1536, 4), (33, 4096, 1024, 2), (40, 574, 512, 2)]
    {
        let eps = 1e-6f32;
        let mut r = Rng::new(29);
        let a = round_bf(&r.vec(m * k, 1.0));
        let w = round_bf(&r.vec(n * k, 1.0));
        let x0 = r.vec(m * n, 8.0);
        let nw = r.vec(n, 1.0);
        let mut sum = x0.clone();
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|l| a[i * k + l] as f64 * w[j * k + l] as f64).sum();
                sum[i * n + j] = (x0[i * n + j] as f64 + s) as f32;
            }
        }
        let mut want = vec![0f32; m * n];
        ops::rms_norm(&sum, &nw, eps, &mut want);
        let (da, dw, dx, dn) =
            (g.upload(&bf(&a))?, g.upload(&bf(&w))?, g.upload(&x0)?, g.upload(&nw)?);
        let (parts, dy) = (g.zeros::<f32>(slices * m * n)?, g.zeros::<u16>(m * n)?);
        g.gemm_split_k(m, n, k, ptr(&da), ptr(&dw), ptr(&parts), slices)?;
        let (hi, ns, stride) = (n as i32, slices as i32, (m * n) as i64);
        let cfg = LaunchConfig {
            grid_dim: (m as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: rmsnorm_parts*(float*, const float*, int, long long, const float*, h16*, int,
        // float) over m rows of n; `parts` holds `slices` × m × n floats.
        unsafe {
            g.launch(
                g.rmsnorm_parts_for(n),
                cfg,
                &[&ptr(&dx), &ptr(&parts), &ns, &stride, &ptr(&dn), &ptr(&dy), &hi, &eps],
            )?
        };
        let (got_x, got_y) = (g.read(&dx, m * n)?, unbf(&g.read(&dy, m * n)?));
        let tag = format!("{m}x{n}x{k} in {slices} slices");
        out.push(result(
            // f32 sums of k products of ±1 values: relative to the sum's scale (√k), as gemm's.
            &format!("split-k product added into the residual, {tag}"),
            abs_err(&got_x, &sum) / (k as f64).sqrt(),
            1e-4,
        ));
        out.push(result(
            &format!("rmsnorm of residual plus slices, {tag} (tol 1.1u)"),
            rel_err(&got_y, &want, 1e-2),
            1.1 * u,
        ));
    }
    Ok(out)
}
