//! What choosing a GEMM's algorithm by measurement would gain: each of a model's decode-step
//! GEMMs (`Gpu::gemm`'s layout: row-major `C = A·Wᵀ`, 16-bit inputs, f32 or 16-bit out), run
//! through `cublasGemmEx` with cuBLAS's own choice, against every algorithm cuBLASLt's
//! heuristic offers for the same operation, and against the same product cut along `k` into
//! 2, 4 or 8 slices run as one strided-batched call (each slice's partial sum written apart,
//! for a following kernel to add up). Each is timed as 20 calls captured in one CUDA graph (as
//! decode steps run), so launch costs are the graph's, not the host's; the split calls read 20
//! different weight matrices, as a step's layers do (from DRAM, not from the L2 cache). Beside
//! them, [`node_us`]: what one kernel node costs such a graph beyond its work.

use std::ffi::c_void;

use cudarc::cublaslt::{result as lr, sys as lsys};
use cudarc::driver::sys as dsys;

use crate::device::{ptr, time_ms, Dtype, Gpu};
use crate::CudaError;

/// Calls per captured graph.
const CALLS: usize = 20;
/// Candidates asked of the heuristic.
const CANDIDATES: usize = 24;
/// Workspace the candidates may use, bytes.
const WORKSPACE: usize = 32 << 20;

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

fn lt(st: lsys::cublasStatus_t, what: &str) -> Result<(), CudaError> {
    match st {
        lsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        _ => Err(CudaError::Blas(format!("{what}: {st:?}"))),
    }
}

/// GPU time per call of `f` run CALLS times inside one captured graph, µs (median of `reps`).
pub(crate) fn graph_us(
    g: &Gpu,
    reps: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    f()?;
    g.sync()?;
    let s = g.stream.clone();
    s.begin_capture(dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(CudaError::from)?;
    let mut r = Ok(());
    for _ in 0..CALLS {
        r = r.and_then(|_| f());
    }
    let graph = s.end_capture(dsys::CUgraphInstantiate_flags(0)).map_err(CudaError::from)?;
    r?;
    let graph = graph.ok_or_else(|| CudaError::Driver("empty capture".into()))?;
    let ms = time_ms(g, 3, reps, || graph.launch().map_err(CudaError::from))?;
    Ok(ms * 1e3 / CALLS as f64)
}

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
    let handle =
        lr::create_handle().map_err(|e| CudaError::Blas(format!("cublasLtCreate: {e:?}")))?;
    let ws = g.zeros::<u8>(WORKSPACE)?;
    let wsp = ptr(&ws);
    // cuBLAS throughout, Tandem's own kernels only where timed as such.
    let own = (g.gemv_on(), g.stream_gemm_on());
    g.set_gemv(false);
    g.set_stream_gemm(false);
    let out = shapes.iter().try_fold(Vec::new(), |mut out, &shape| {
        out.push(time_shape(g, shape, reps, handle, wsp, own)?);
        Ok(out)
    });
    g.set_gemv(own.0);
    g.set_stream_gemm(own.1);
    unsafe { lsys::cublasLtDestroy(handle) };
    out
}

/// [`run`] for one shape, cuBLAS (and cuBLASLt `handle`, workspace `wsp`) against the gemv
/// and stream kernels where `own` says they were on.
fn time_shape(
    g: &Gpu,
    (m, n, k, c_f32): (usize, usize, usize, bool),
    reps: usize,
    handle: lsys::cublasLtHandle_t,
    wsp: u64,
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
    let ab = match g.dtype {
        Dtype::Bf16 => lsys::cudaDataType_t::CUDA_R_16BF,
        Dtype::F16 => lsys::cudaDataType_t::CUDA_R_16F,
    };
    let ct = if c_f32 { lsys::cudaDataType_t::CUDA_R_32F } else { ab };
    // Column-major Cᵀ (n×m) = W (k×n stored, transposed) · Aᵀ (k×m).
    let (desc, wl, al, cl, pref) = {
        let blas = |e: cudarc::cublaslt::result::CublasError| CudaError::Blas(format!("{e:?}"));
        let desc = lr::create_matmul_desc(
            lsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lsys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(blas)?;
        let t = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T as i32;
        let wsz = WORKSPACE as u64;
        let pref = lr::create_matmul_pref().map_err(blas)?;
        // SAFETY: each attribute gets a value of its documented type and size.
        unsafe {
            lr::set_matmul_desc_attribute(
                desc,
                lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &t as *const i32 as *const c_void,
                size_of::<i32>(),
            )
            .map_err(blas)?;
            lr::set_matmul_pref_attribute(
                    pref,
                    lsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &wsz as *const u64 as *const c_void,
                    size_of::<u64>(),
                )
                .map_err(blas)?;
        }
        let layout = |ty, rows: usize, cols: usize, ld: usize| {
            lr::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64).map_err(blas)
        };
        (desc, layout(ab, k, n, k)?, layout(ab, k, m, k)?, layout(ct, n, m, n)?, pref)
    };
    let mut results: Vec<lsys::cublasLtMatmulHeuristicResult_t> =
        vec![unsafe { std::mem::zeroed() }; CANDIDATES];
    let mut found = 0i32;
    // SAFETY: the descriptors above; `results` holds CANDIDATES entries.
    lt(
        unsafe {
            lsys::cublasLtMatmulAlgoGetHeuristic(
                handle,
                desc,
                wl,
                al,
                cl,
                cl,
                pref,
                CANDIDATES as i32,
                results.as_mut_ptr(),
                &mut found,
            )
        },
        "cublasLtMatmulAlgoGetHeuristic",
    )?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let stream = g.stream.cu_stream() as lsys::cudaStream_t;
    let mut times = Vec::new();
    for r in results.iter().take(found.max(0) as usize) {
        if r.state != lsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS || r.workspaceSize > WORKSPACE {
            continue;
        }
        let algo = r.algo;
        let call = || {
            let st = unsafe {
                lsys::cublasLtMatmul(
                    handle,
                    desc,
                    &alpha as *const f32 as *const c_void,
                    wp as *const c_void,
                    wl,
                    ap as *const c_void,
                    al,
                    &beta as *const f32 as *const c_void,
                    cp as *const c_void,
                    cl,
                    cp as *mut c_void,
                    cl,
                    &algo,
                    wsp as *mut c_void,
                    WORKSPACE,
                    stream,
                )
            };
            lt(st, "cublasLtMatmul")
        };
        match graph_us(g, reps, call) {
            Ok(us) => times.push(us),
            Err(_) => times.push(f64::INFINITY),
        }
    }
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
    unsafe {
        lsys::cublasLtMatmulPreferenceDestroy(pref);
        lsys::cublasLtMatrixLayoutDestroy(wl);
        lsys::cublasLtMatrixLayoutDestroy(al);
        lsys::cublasLtMatrixLayoutDestroy(cl);
        lsys::cublasLtMatmulDescDestroy(desc);
    }
    Ok(timing)
}
