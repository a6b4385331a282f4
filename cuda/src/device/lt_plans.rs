//! cuBLASLt algorithms chosen by measurement for the products of a captured decode step:
//! cuBLAS's own choice (`cublasGemmEx`'s heuristic) leaves some shapes 5–20 % slower than
//! another algorithm cuBLASLt offers for the same operation (`tandem-gpu bench-gemm`). Before
//! a decode graph of a size is captured, [`Gpu::tune_gemm`] times cuBLAS and each of
//! cuBLASLt's first candidates on the model's own weight matrices, one after another as a step
//! reads them, and keeps a candidate only where it is clearly faster; [`Gpu::gemm`] then runs
//! that shape through `cublasLtMatmul` with it (`TANDEM_GEMM_TUNE=off`: never).

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::{result as lr, sys as lsys};
use cudarc::driver::{sys as dsys, CudaSlice};

use super::{ptr, time_ms, Dtype, Gpu};
use crate::CudaError;

/// Calls per graph [`graph_us`] captures.
pub const CALLS: usize = 20;

/// Candidates of cuBLASLt's heuristic [`Gpu::tune_gemm`] times for a shape.
const CANDIDATES: usize = 6;
/// Workspace an algorithm may use, bytes.
pub const LT_WORKSPACE: usize = 32 << 20;
/// A candidate replaces cuBLAS's choice only below this share of its time.
const KEEP_BELOW: f64 = 0.97;

/// GPU time per call of `f` run [`CALLS`] times inside one captured graph (as decode steps
/// run, so launch costs are the graph's, not the host's), µs, median of `reps` replays.
pub fn graph_us(
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

/// A product as [`Gpu::gemm`] names it: rows, columns, k, f32 output, accumulate.
pub type GemmKey = (usize, usize, usize, bool, bool);

/// One `cublasLtMatmul` operation: its descriptors and the algorithm chosen for it.
struct LtOp {
    desc: lsys::cublasLtMatmulDesc_t,
    w: lsys::cublasLtMatrixLayout_t,
    a: lsys::cublasLtMatrixLayout_t,
    c: lsys::cublasLtMatrixLayout_t,
    algo: Option<lsys::cublasLtMatmulAlgo_t>,
}

// SAFETY: the descriptors are plain host objects, used by one thread at a time (the Mutex).
unsafe impl Send for LtOp {}

impl Drop for LtOp {
    fn drop(&mut self) {
        // SAFETY: created by `LtOp::new`, destroyed once.
        unsafe {
            lsys::cublasLtMatrixLayoutDestroy(self.w);
            lsys::cublasLtMatrixLayoutDestroy(self.a);
            lsys::cublasLtMatrixLayoutDestroy(self.c);
            lsys::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}

fn blas(e: lr::CublasError) -> CudaError {
    CudaError::Blas(format!("cuBLASLt: {e:?}"))
}

fn lt_status(st: lsys::cublasStatus_t, what: &str) -> Result<(), CudaError> {
    match st {
        lsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        _ => Err(CudaError::Blas(format!("{what}: {st:?}"))),
    }
}

impl LtOp {
    /// [`Gpu::gemm`]'s layout as cuBLASLt sees it: column-major Cᵀ (n×m) = W (k×n stored,
    /// transposed) · Aᵀ (k×m), 16-bit inputs of `dtype`, f32 accumulation.
    fn new(dtype: Dtype, (m, n, k, c_f32, _): GemmKey) -> Result<LtOp, CudaError> {
        let ab = match dtype {
            Dtype::Bf16 => lsys::cudaDataType_t::CUDA_R_16BF,
            Dtype::F16 => lsys::cudaDataType_t::CUDA_R_16F,
        };
        let ct = if c_f32 { lsys::cudaDataType_t::CUDA_R_32F } else { ab };
        let desc = lr::create_matmul_desc(
            lsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lsys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(blas)?;
        let layout = |ty, rows: usize, cols: usize, ld: usize| {
            lr::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64).map_err(blas)
        };
        let op = LtOp {
            desc,
            w: layout(ab, k, n, k)?,
            a: layout(ab, k, m, k)?,
            c: layout(ct, n, m, n)?,
            algo: None,
        };
        let t = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T as i32;
        // SAFETY: TRANSA takes an i32 operation.
        unsafe {
            lr::set_matmul_desc_attribute(
                op.desc,
                lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &t as *const i32 as *const c_void,
                size_of::<i32>(),
            )
            .map_err(blas)?;
        }
        Ok(op)
    }

    /// The heuristic's first `max` algorithms that run within [`LT_WORKSPACE`].
    fn candidates(
        &self,
        handle: lsys::cublasLtHandle_t,
        max: usize,
    ) -> Result<Vec<lsys::cublasLtMatmulAlgo_t>, CudaError> {
        let pref = lr::create_matmul_pref().map_err(blas)?;
        let wsz = LT_WORKSPACE as u64;
        let mut results: Vec<lsys::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; max];
        let mut found = 0i32;
        // SAFETY: the preference takes a u64 workspace size; `results` holds `max` entries.
        let st = unsafe {
            lr::set_matmul_pref_attribute(
                pref,
                lsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &wsz as *const u64 as *const c_void,
                size_of::<u64>(),
            )
            .map_err(blas)
            .and_then(|_| {
                lt_status(
                    lsys::cublasLtMatmulAlgoGetHeuristic(
                        handle,
                        self.desc,
                        self.w,
                        self.a,
                        self.c,
                        self.c,
                        pref,
                        max as i32,
                        results.as_mut_ptr(),
                        &mut found,
                    ),
                    "cublasLtMatmulAlgoGetHeuristic",
                )
            })
        };
        // SAFETY: created above.
        unsafe { lsys::cublasLtMatmulPreferenceDestroy(pref) };
        st?;
        Ok(results
            .iter()
            .take(found.max(0) as usize)
            .filter(|r| {
                r.state == lsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && r.workspaceSize <= LT_WORKSPACE
            })
            .map(|r| r.algo)
            .collect())
    }
}

/// The cuBLASLt handle, its workspace, and the algorithms chosen so far.
pub struct LtPlans {
    handle: lsys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    ops: Mutex<HashMap<GemmKey, LtOp>>,
    /// Shapes already timed (kept or not).
    tried: Mutex<HashSet<GemmKey>>,
    /// What each timing found, in order.
    results: Mutex<Vec<(GemmKey, Tuned)>>,
}

// SAFETY: the handle is used on the Gpu's one stream, by one thread at a time.
unsafe impl Send for LtPlans {}
unsafe impl Sync for LtPlans {}

impl Drop for LtPlans {
    fn drop(&mut self) {
        self.ops.lock().map(|mut o| o.clear()).ok();
        // SAFETY: created by `LtPlans::new`, destroyed once, after its operations.
        unsafe { lsys::cublasLtDestroy(self.handle) };
    }
}

/// Whether decode graphs' products are tuned (`TANDEM_GEMM_TUNE`, on unless `off`).
pub fn tune_on() -> bool {
    std::env::var("TANDEM_GEMM_TUNE").as_deref() != Ok("off")
}

impl LtPlans {
    /// A cuBLASLt handle and workspace on `g`'s context.
    fn new(g: &Gpu) -> Result<LtPlans, CudaError> {
        let handle = lr::create_handle().map_err(blas)?;
        Ok(LtPlans {
            handle,
            workspace: g.zeros::<u8>(LT_WORKSPACE)?,
            ops: Mutex::new(HashMap::new()),
            tried: Mutex::new(HashSet::new()),
            results: Mutex::new(Vec::new()),
        })
    }
}

/// What [`Gpu::tune_gemm`] measured for a shape: cuBLAS's time and the best candidate's, µs
/// per call on the model's matrices, and whether that candidate was kept.
#[derive(Debug, Clone, Copy)]
pub struct Tuned {
    /// cuBLAS's own choice.
    pub cublas_us: f64,
    /// The fastest cuBLASLt candidate.
    pub best_us: f64,
    /// Whether [`Gpu::gemm`] takes it from now on.
    pub kept: bool,
}

impl Gpu {
    /// Runs the product through the cuBLASLt algorithm chosen for its shape, if one was
    /// ([`Gpu::tune_gemm`]); false where cuBLAS should run it.
    pub(super) fn lt_gemm(&self, key: GemmKey, a: u64, w: u64, c: u64) -> Result<bool, CudaError> {
        let Some(lt) = self.lt.get() else { return Ok(false) };
        let ops = lt.ops.lock().map_err(|_| CudaError::Blas("cuBLASLt plans poisoned".into()))?;
        let Some(op) = ops.get(&key) else { return Ok(false) };
        let Some(algo) = op.algo else { return Ok(false) };
        self.lt_call(lt, op, &algo, key.4, (a, w, c))?;
        Ok(true)
    }

    fn lt_call(
        &self,
        lt: &LtPlans,
        op: &LtOp,
        algo: &lsys::cublasLtMatmulAlgo_t,
        accumulate: bool,
        (a, w, c): (u64, u64, u64),
    ) -> Result<(), CudaError> {
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        self.after_blas.store(true, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the operation's layouts describe the caller's a (m×k), w (n×k), c (m×n).
        let st = unsafe {
            lsys::cublasLtMatmul(
                lt.handle,
                op.desc,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                op.w,
                a as *const c_void,
                op.a,
                &beta as *const f32 as *const c_void,
                c as *const c_void,
                op.c,
                c as *mut c_void,
                op.c,
                algo,
                ptr(&lt.workspace) as *mut c_void,
                LT_WORKSPACE,
                self.stream.cu_stream() as lsys::cudaStream_t,
            )
        };
        lt_status(st, "cublasLtMatmul")
    }

    /// Times the product `key` on cuBLAS and on cuBLASLt's first candidates, cycling through
    /// `weights` (the model's matrices of that shape, as a step reads them) with `a` and `c`
    /// as scratch (their contents are overwritten), and keeps the fastest candidate where it
    /// takes under 97 % of cuBLAS's time. Once per shape; `None` when already timed, when
    /// [`Gpu::gemm`] takes the shape to `gemv` or the stream kernels, or with
    /// `TANDEM_GEMM_TUNE=off`.
    pub fn tune_gemm(
        &self,
        key: GemmKey,
        weights: &[u64],
        a: u64,
        c: u64,
    ) -> Result<Option<Tuned>, CudaError> {
        let (m, n, k, ..) = key;
        // Shapes `gemm` gives its own kernels never reach cuBLAS.
        let own = (m == 1 && self.gemv_takes(n, k)) || self.stream_gemm_takes(m, n, k);
        if !tune_on() || own {
            return Ok(None);
        }
        let lt = self.lt_plans()?;
        if weights.is_empty()
            || !lt.tried.lock().map_err(|_| CudaError::Blas("poisoned".into()))?.insert(key)
        {
            return Ok(None);
        }
        let (m, n, k, c_f32, accumulate) = key;
        let mut i = 0usize;
        let mut next = || {
            i = (i + 1) % weights.len();
            weights[i]
        };
        let reps = 3;
        let cublas_us =
            graph_us(self, reps, || self.gemm(m, n, k, a, next(), c, c_f32, accumulate))?;
        let mut op = LtOp::new(self.dtype, key)?;
        let best = self
            .time_lt_candidates(lt, &op, (CANDIDATES, reps), (a, c, accumulate), &mut next)?
            .into_iter()
            .min_by(|x, y| x.0.total_cmp(&y.0));
        let Some((best_us, algo)) = best.filter(|b| b.0.is_finite()) else { return Ok(None) };
        let kept = best_us < KEEP_BELOW * cublas_us;
        if kept {
            op.algo = Some(algo);
            lt.ops.lock().map_err(|_| CudaError::Blas("poisoned".into()))?.insert(key, op);
        }
        let tuned = Tuned { cublas_us, best_us, kept };
        lt.results.lock().map_err(|_| CudaError::Blas("poisoned".into()))?.push((key, tuned));
        Ok(Some(tuned))
    }

    /// Each of cuBLASLt's first `max` candidates for `op`, timed by [`graph_us`] (`reps`) over
    /// scratch `a` and `c` (accumulated into with `acc`) and the weights `next_w` hands out, µs
    /// per call (infinite where it fails to run), in the heuristic's order.
    fn time_lt_candidates(
        &self,
        lt: &LtPlans,
        op: &LtOp,
        (max, reps): (usize, usize),
        (a, c, acc): (u64, u64, bool),
        next_w: &mut dyn FnMut() -> u64,
    ) -> Result<Vec<(f64, lsys::cublasLtMatmulAlgo_t)>, CudaError> {
        let mut out = Vec::new();
        for algo in op.candidates(lt.handle, max)? {
            let us = graph_us(self, reps, || self.lt_call(lt, op, &algo, acc, (a, next_w(), c)));
            out.push((us.unwrap_or(f64::INFINITY), algo));
        }
        Ok(out)
    }

    /// cuBLASLt's first `max` candidates for the product `key`, µs per call on scratch `(a, c)`
    /// and the weights `next_w` hands out, in the heuristic's order (`tandem-gpu bench-gemm`).
    pub fn lt_candidate_us(
        &self,
        key: GemmKey,
        max: usize,
        reps: usize,
        (a, c): (u64, u64),
        next_w: &mut dyn FnMut() -> u64,
    ) -> Result<Vec<f64>, CudaError> {
        let lt = self.lt_plans()?;
        let op = LtOp::new(self.dtype, key)?;
        let t = self.time_lt_candidates(lt, &op, (max, reps), (a, c, key.4), next_w)?;
        Ok(t.into_iter().map(|x| x.0).collect())
    }

    /// Makes [`Gpu::gemm`] run `key` with cuBLASLt's candidate `index` (for the checks, which
    /// compare every candidate's product with the host's); false where there is no such
    /// candidate. [`Gpu::unpin_lt`] undoes it.
    pub fn pin_lt_candidate(&self, key: GemmKey, index: usize) -> Result<bool, CudaError> {
        let lt = self.lt_plans()?;
        let mut op = LtOp::new(self.dtype, key)?;
        let Some(algo) = op.candidates(lt.handle, index + 1)?.get(index).copied() else {
            return Ok(false);
        };
        op.algo = Some(algo);
        lt.ops.lock().map_err(|_| CudaError::Blas("poisoned".into()))?.insert(key, op);
        Ok(true)
    }

    /// Back to cuBLAS for `key`.
    pub fn unpin_lt(&self, key: GemmKey) {
        if let Some(mut ops) = self.lt.get().and_then(|lt| lt.ops.lock().ok()) {
            ops.remove(&key);
        }
    }

    /// The plans, made on first use.
    fn lt_plans(&self) -> Result<&LtPlans, CudaError> {
        Ok(match self.lt.get() {
            Some(lt) => lt,
            None => {
                let made = LtPlans::new(self)?;
                self.lt.get_or_init(|| made)
            }
        })
    }

    /// Every shape [`Gpu::tune_gemm`] timed so far, in order, with what it found.
    pub fn gemm_tunings(&self) -> Vec<(GemmKey, Tuned)> {
        self.lt.get().and_then(|lt| lt.results.lock().ok().map(|r| r.clone())).unwrap_or_default()
    }
}
