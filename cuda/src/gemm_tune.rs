//! What choosing a GEMM's algorithm by measurement would gain: each of a model's decode-step
//! GEMMs (`Gpu::gemm`'s layout: row-major `C = A·Wᵀ`, 16-bit inputs, f32 or 16-bit out), run
//! through `cublasGemmEx` with cuBLAS's own choice, against every algorithm cuBLASLt's
//! heuristic offers for the same operation, and against the same product cut along `k` into
//! 2, 4 or 8 slices run as one strided-batched call (each slice's partial sum written apart,
//! for a following kernel to add up). Each is timed as 20 calls captured in one CUDA graph (as
//! decode steps run), so launch costs are the graph's, not the host's; the split calls read 20
//! different weight matrices, as a step's layers do (from DRAM, not from the L2 cache). Beside
//! them, [`node_us`]: what one kernel node costs such a graph beyond its work.

use crate::device::lt_plans::{graph_us, CALLS};
use crate::device::{ptr, Gpu};
use crate::CudaError;

/// Candidates asked of the heuristic.
const CANDIDATES: usize = 24;

/// One GEMM shape, timed both ways.
#[derive(Debug, Clone)]
pub struct GemmTiming {
    /// Rows (tokens).
    pub m: usize,
    /// Output columns.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// f32 output (else the model's 16-bit type).
    pub c_f32: bool,
    /// cuBLAS's own choice (`cublasGemmEx`), µs per call.
    pub default_us: f64,
    /// The fastest cuBLASLt candidate, µs per call.
    pub best_us: f64,
    /// Its index in the heuristic's list.
    pub best_index: usize,
    /// The heuristic's first candidate, µs per call.
    pub first_us: f64,
    /// Candidates that ran.
    pub candidates: usize,
    /// cuBLAS's choice on 20 different weight matrices, µs per call.
    pub cold_us: f64,
    /// Where [`Gpu::gemm`] takes one of Tandem's own kernels (`gemv` for one row,
    /// `gemm_stream` for 2–64): that kernel on the same 20 matrices, µs per call.
    pub own_cold_us: Option<f64>,
    /// The product cut into `s` slices of `k` (strided-batched, partial sums apart), on 20
    /// different weight matrices: `(s, µs per call)` for each `s` that divides `k` into
    /// multiples of 64.
    pub split_us: Vec<(usize, f64)>,
}

/// Split-K variants timed by [`run`].
pub const SPLITS: [usize; 3] = [2, 4, 8];

/// GPU time per node of a graph of `nodes` empty kernels of `ctas` CTAs of 128 threads, µs:
/// what a kernel node costs a captured step beyond its own work.
pub fn node_us(g: &Gpu, nodes: usize, ctas: usize) -> Result<f64, CudaError> {
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (ctas as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let (x, per) = (0i32, nodes.div_ceil(CALLS).max(1));
    // SAFETY: noop(int) takes one int and touches no memory.
    let us =
        graph_us(g, 20, || (0..per).try_for_each(|_| unsafe { g.launch(&g.k.noop, cfg, &[&x]) }))?;
    Ok(us / per as f64)
}

/// Times each `(m, n, k, c_f32)` both ways on scratch buffers.
pub fn run(
    g: &Gpu,
    shapes: &[(usize, usize, usize, bool)],
    reps: usize,
) -> Result<Vec<GemmTiming>, CudaError> {
    // cuBLAS throughout, Tandem's own kernels only where timed as such.
    let own = (g.gemv_on(), g.stream_gemm_on());
    g.set_gemv(false);
    g.set_stream_gemm(false);
    let out = shapes.iter().try_fold(Vec::new(), |mut out, &shape| {
        out.push(time_shape(g, shape, reps, own)?);
        Ok(out)
    });
    g.set_gemv(own.0);
    g.set_stream_gemm(own.1);
    out
}

/// [`run`] for one shape, cuBLAS and cuBLASLt's candidates against the gemv and stream
/// kernels where `own` says they were on.
fn time_shape(
    g: &Gpu,
    (m, n, k, c_f32): (usize, usize, usize, bool),
    reps: usize,
    own: (bool, bool),
) -> Result<GemmTiming, CudaError> {
    let a = g.zeros::<u16>(m * k)?;
    let w = g.zeros::<u16>(n * k)?;
    let c = g.zeros::<f32>(m * n)?;
    let (ap, wp, cp) = (ptr(&a), ptr(&w), ptr(&c));
    let default_us = graph_us(g, reps, || g.gemm(m, n, k, ap, wp, cp, c_f32, false))?;
    // The same on CALLS different weight matrices (a step's layers), then cut along k.
    let ws_cold = g.zeros::<u16>(CALLS * n * k)?;
    let parts = g.zeros::<f32>(SPLITS[SPLITS.len() - 1] * m * n)?;
    let (wc, pp) = (ptr(&ws_cold), ptr(&parts));
    let mut i = 0usize;
    let mut next_w = || {
        i = (i + 1) % CALLS;
        wc + (2 * i * n * k) as u64
    };
    let cold_us = graph_us(g, reps, || g.gemm(m, n, k, ap, next_w(), cp, c_f32, false))?;
    g.set_stream_gemm(own.1);
    g.set_gemv(own.0);
    let stream = g.stream_gemm_takes(m, n, k);
    let gemv = m == 1 && g.gemv_takes(n, k);
    g.set_stream_gemm(false);
    g.set_gemv(false);
    let own_cold_us = match gemv || stream {
        true => {
            g.set_gemv(own.0);
            g.set_stream_gemm(own.1);
            let us = graph_us(g, reps, || g.gemm(m, n, k, ap, next_w(), cp, c_f32, false));
            g.set_gemv(false);
            g.set_stream_gemm(false);
            Some(us?)
        }
        false => None,
    };
    let mut split_us = Vec::new();
    for s in SPLITS.into_iter().filter(|&s| k % (64 * s) == 0) {
        let us = graph_us(g, reps, || g.gemm_split_k(m, n, k, ap, next_w(), pp, s))?;
        split_us.push((s, us));
    }
    drop((ws_cold, parts));
    // Every candidate on the one matrix, as cuBLAS's own choice was first timed.
    let times =
        g.lt_candidate_us((m, n, k, c_f32, false), CANDIDATES, reps, (ap, cp), &mut || wp)?;
    let (best_index, best_us) = times
        .iter()
        .copied()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((0, f64::INFINITY));
    let timing = GemmTiming {
        m,
        n,
        k,
        c_f32,
        default_us,
        best_us,
        best_index,
        first_us: times.first().copied().unwrap_or(f64::INFINITY),
        candidates: times.len(),
        cold_us,
        own_cold_us,
        split_us,
    };
    Ok(timing)
}
