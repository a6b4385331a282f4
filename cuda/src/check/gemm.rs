//! Checks of [`Gpu::gemm`] on each of its paths (cuBLAS, the one-row `gemv` kernel, the
//! `gemm_stream` kernels of 2–64 rows) against an f64 product on the host.

use super::{abs_err, bf, rel_err, result, round_bf, unbf, CheckResult, Rng};
use cudarc::driver::LaunchConfig;

use crate::device::{ptr, Gpu};
use crate::CudaError;

pub(super) fn gemm(g: &Gpu, u: f64) -> Result<Vec<CheckResult>, CudaError> {
    let mut out = gemm_shape(g, u, 37, 300, 576)?;
    // Decode-sized (one to eight rows), as decode steps run them: one row on the gemv kernel
    // (one row of w per warp; two, an odd count of them, with k not a multiple of its 256-wide
    // step), more on cuBLAS; one row on cuBLAS too.
    for m in [1, 5, 8] {
        out.extend(gemm_shape(g, u, m, 1000, 4096)?);
    }
    out.extend(gemm_shape(g, u, 1, 16 * g.num_sms + 1, 1000)?);
    let was = g.gemv_on();
    g.set_gemv(false);
    let cublas = gemm_shape(g, u, 1, 1000, 4096);
    g.set_gemv(was);
    out.extend(cublas?);
    // 2–64 rows on the stream kernels (sm_90; every size they can take, not only the default
    // limit): tiles of 8, 16 and 64 rows of A, k in 1, 2, 3, 4 and 8 slices, fewer rows than
    // slices, slices of fewer stages than the pipeline holds and of more; then one such shape
    // on cuBLAS.
    let rows = g.stream_gemm_max_rows();
    g.set_stream_gemm_max_rows(64);
    let stream =
        [(2, 1024, 2048), (5, 4096, 1024), (16, 960, 576), (33, 6144, 1024), (48, 128, 128)]
            .into_iter()
            .chain([(64, 1024, 3072)])
            .try_fold(Vec::new(), |mut v, (m, n, k)| {
                v.extend(gemm_shape(g, u, m, n, k)?);
                Ok::<_, CudaError>(v)
            })
            .and_then(|v| Ok((v, repeat_bits(g, 64, 1024, 3072)?)));
    g.set_stream_gemm_max_rows(rows);
    let (stream, repeat) = stream?;
    out.extend(stream);
    out.push(repeat);
    let was = g.stream_gemm_on();
    g.set_stream_gemm(false);
    let cublas = gemm_shape(g, u, 16, 1024, 2048);
    g.set_stream_gemm(was);
    out.extend(cublas?);
    out.extend(lt_candidates(g, u)?);
    Ok(out)
}

/// Decode-graph products through cuBLASLt ([`Gpu::tune_gemm`] keeps one where it is faster):
/// each of the heuristic's first three candidates pinned for the three products
/// [`gemm_shape`] makes of a shape (f32 accumulated, f32, 16-bit), against the host's.
fn lt_candidates(g: &Gpu, u: f64) -> Result<Vec<CheckResult>, CudaError> {
    let mut out = Vec::new();
    for (m, n, k) in [(96, 1024, 2048), (130, 4096, 1024)] {
        let keys = [(m, n, k, true, true), (m, n, k, true, false), (m, n, k, false, false)];
        for index in 0..3 {
            let mut pinned = true;
            for key in keys {
                pinned &= g.pin_lt_candidate(key, index)?;
            }
            let got = if pinned { Some(gemm_shape(g, u, m, n, k)) } else { None };
            keys.into_iter().for_each(|key| g.unpin_lt(key));
            if let Some(got) = got {
                out.extend(got?.into_iter().map(|mut r| {
                    r.name = r.name.replace("(cuBLAS)", &format!("(cuBLASLt candidate {index})"));
                    r
                }));
            }
        }
    }
    Ok(out)
}

/// The same product twice gives the same bits (a stream product's slices are added in one
/// order, whatever order its CTAs ran in).
fn repeat_bits(g: &Gpu, m: usize, n: usize, k: usize) -> Result<CheckResult, CudaError> {
    let mut r = Rng::new(3);
    let (da, dw) = (g.upload(&bf(&r.vec(m * k, 1.0)))?, g.upload(&bf(&r.vec(n * k, 1.0)))?);
    let c0 = r.vec(m * n, 1.0);
    let mut runs = Vec::new();
    for _ in 0..3 {
        let c = g.upload(&c0)?;
        g.gemm(m, n, k, ptr(&da), ptr(&dw), ptr(&c), true, true)?;
        runs.push(g.read(&c, m * n)?);
    }
    let differ = (runs.iter().skip(1))
        .map(|run| run.iter().zip(&runs[0]).filter(|(a, b)| a.to_bits() != b.to_bits()).count())
        .sum::<usize>();
    Ok(result(
        &format!("gemm {m}x{n}x{k} ({}) three times: values that differ", path(g, m, n, k)),
        differ as f64,
        0.0,
    ))
}

/// Which kernel [`Gpu::gemm`] takes for a product of `m` rows, `n` columns over `k`.
fn path(g: &Gpu, m: usize, n: usize, k: usize) -> &'static str {
    match () {
        _ if m == 1 && g.gemv_takes(n, k) => "gemv",
        _ if g.stream_gemm_takes(m, n, k) => "gemm_stream",
        _ => "cuBLAS",
    }
}

fn gemm_shape(
    g: &Gpu,
    u: f64,
    m: usize,
    n: usize,
    k: usize,
) -> Result<Vec<CheckResult>, CudaError> {
    let mut r = Rng::new(1);
    let a = round_bf(&r.vec(m * k, 1.0));
    let w = round_bf(&r.vec(n * k, 1.0));
    let c0 = r.vec(m * n, 1.0);
    let mut reference = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k).map(|l| a[i * k + l] as f64 * w[j * k + l] as f64).sum();
            reference[i * n + j] = s as f32;
        }
    }
    let (da, dw) = (g.upload(&bf(&a))?, g.upload(&bf(&w))?);
    let cf = g.upload(&c0)?;
    g.gemm(m, n, k, ptr(&da), ptr(&dw), ptr(&cf), true, true)?;
    let got = g.read(&cf, m * n)?;
    let acc_ref: Vec<f32> = reference.iter().zip(&c0).map(|(x, y)| x + y).collect();
    let cf2 = g.upload(&c0)?;
    g.gemm(m, n, k, ptr(&da), ptr(&dw), ptr(&cf2), true, false)?;
    let got_set = g.read(&cf2, m * n)?;
    let cb = g.zeros::<u16>(m * n)?;
    g.gemm(m, n, k, ptr(&da), ptr(&dw), ptr(&cb), false, false)?;
    let got_b = unbf(&g.read(&cb, m * n)?);
    let path = path(g, m, n, k);
    Ok(vec![
        // f32 accumulation over k products of ±1 values: relative to the sum's scale (√k).
        result(
            &format!("gemm {m}x{n}x{k} 16-bit→f32 ({path}), accumulate"),
            abs_err(&got, &acc_ref) / (k as f64).sqrt(),
            1e-4,
        ),
        result(
            &format!("gemm {m}x{n}x{k} 16-bit→f32 ({path}), overwrite"),
            abs_err(&got_set, &reference) / (k as f64).sqrt(),
            1e-4,
        ),
        // 16-bit output: one rounding.
        result(
            &format!("gemm {m}x{n}x{k} 16-bit→16-bit ({path}) (tol u)"),
            rel_err(&got_b, &reference, 1.0),
            u,
        ),
    ])
}

/// Gate|up and the activation in the stream kernel's gated epilogue ([`Gpu::gemm_glu`]) give
/// the bits of the product to the 16-bit type followed by the `silu_mul` kernel.
pub(super) fn glu(g: &Gpu) -> Result<Vec<CheckResult>, CudaError> {
    let rows = g.stream_gemm_max_rows();
    g.set_stream_gemm_max_rows(64);
    let out = glu_shapes(g);
    g.set_stream_gemm_max_rows(rows);
    out
}

fn glu_shapes(g: &Gpu) -> Result<Vec<CheckResult>, CudaError> {
    let mut out = Vec::new();
    // Qwen3-0.6B's and the SmolLM2 shape's MLPs, a small one cut into 2 slices, GeGLU (Gemma).
    for (m, f, k, gelu) in
        [(8, 3072, 1024, false), (64, 1536, 576, false), (3, 96, 128, false), (16, 2048, 640, true)]
    {
        if !g.gemm_glu_takes(m, f, k) {
            continue;
        }
        let mut r = Rng::new(4);
        let (da, dw) = (g.upload(&bf(&r.vec(m * k, 1.0)))?, g.upload(&bf(&r.vec(2 * f * k, 0.1)))?);
        let (gu, want, got) =
            (g.zeros::<u16>(m * 2 * f)?, g.zeros::<u16>(m * f)?, g.zeros::<u16>(m * f)?);
        g.gemm(m, 2 * f, k, ptr(&da), ptr(&dw), ptr(&gu), false, false)?;
        let cfg = LaunchConfig {
            grid_dim: (f.div_ceil(1024) as u32, m as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (fi, gi) = (f as i32, gelu as i32);
        // SAFETY: silu_mul(const h16* gu, h16* out, int F, int gelu) over m rows of these.
        unsafe { g.launch(&g.k.silu_mul, cfg, &[&ptr(&gu), &ptr(&want), &fi, &gi])? };
        let took = g.gemm_glu((m, f, k), ptr(&da), ptr(&dw), ptr(&got), gelu)?;
        let (want, got) = (g.read(&want, m * f)?, g.read(&got, m * f)?);
        let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
        let act = if gelu { "GeGLU" } else { "SwiGLU" };
        out.push(result(
            &format!("gemm_glu {m}x{f}x{k} {act} against gemm + silu_mul: values that differ (taken: {took})"),
            if took { differ as f64 } else { f64::INFINITY },
            0.0,
        ));
    }
    Ok(out)
}
