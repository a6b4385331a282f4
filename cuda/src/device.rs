//! `Gpu`: one CUDA device as the backend uses it — a context with one explicit stream (no
//! per-buffer event tracking, so the stream can be captured into graphs), the kernels of
//! `kernels/*.cu` compiled by NVRTC to a CUBIN for the device's own architecture, and a cuBLAS
//! handle with a fixed workspace (required for GEMMs inside a CUDA graph).
//!
//! Every CUDA library is loaded at run time, so this compiles and links on machines without
//! CUDA; [`Gpu::open`] reports a missing library as an error instead of panicking.

use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

use cudarc::cublas::{sys as bsys, CudaBlas};
use cudarc::driver::{
    sys as dsys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    ValidAsZeroBits,
};
use cudarc::nvrtc::{sys as nsys, Ptx};

use crate::CudaError;

mod launch;
pub mod lt_plans;
pub mod products;
mod rope_launch;
pub mod split_k;
pub use launch::{KernelArg, PDL_PLAIN, PDL_PLAIN_AFTER_GEMM, PDL_PLAIN_WAITING};
pub use rope_launch::{rope_config, rope_config_with, rope_tokens, ROPE_MANY_TOKENS};

/// The kernel source, compiled at run time: the files of `kernels/` in this order (each uses
/// what the ones before it define). `scripts/gpu/nvrtc_check.py` lists the same files.
pub const KERNEL_SOURCE: &str = concat!(
    include_str!("kernels/common.cu"),
    include_str!("kernels/layers.cu"),
    include_str!("kernels/attention.cu"),
    include_str!("kernels/attention_mma.cu"),
    include_str!("kernels/attention_decode.cu"),
    include_str!("kernels/elementwise.cu"),
    include_str!("kernels/sampling.cu"),
    include_str!("kernels/collective.cu"),
    include_str!("kernels/gemv.cu"),
    include_str!("kernels/gemm_stream.cu"),
);

/// Bytes of cuBLAS workspace (fixed, so GEMMs can be captured).
const BLAS_WORKSPACE: usize = 32 << 20;

/// The 16-bit float type of weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// bfloat16: f32's range, 8 significant bits.
    Bf16,
    /// IEEE half: 11 significant bits, range ±65504 (GGUF's own scale type).
    F16,
}

impl Dtype {
    /// Parses `bf16`/`bfloat16` or `f16`/`fp16`/`float16`/`half`.
    pub fn parse(s: &str) -> Option<Dtype> {
        match s {
            "bf16" | "bfloat16" => Some(Dtype::Bf16),
            "f16" | "fp16" | "float16" | "half" => Some(Dtype::F16),
            _ => None,
        }
    }
    /// Rounds `x` to this type (nearest even), as raw bits.
    pub fn from_f32(self, x: f32) -> u16 {
        match self {
            Dtype::Bf16 => half::bf16::from_f32(x).to_bits(),
            Dtype::F16 => half::f16::from_f32(x).to_bits(),
        }
    }
    /// The value of raw bits of this type.
    pub fn to_f32(self, b: u16) -> f32 {
        match self {
            Dtype::Bf16 => half::bf16::from_bits(b).to_f32(),
            Dtype::F16 => half::f16::from_bits(b).to_f32(),
        }
    }
    /// Largest relative error of one rounding to this type (2^-8 or 2^-11).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Dtype::Bf16 => 1.0 / 256.0,
            Dtype::F16 => 1.0 / 2048.0,
        }
    }
    /// The type's name.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }
    fn cuda(self) -> bsys::cudaDataType_t {
        match self {
            Dtype::Bf16 => bsys::cudaDataType_t::CUDA_R_16BF,
            Dtype::F16 => bsys::cudaDataType_t::CUDA_R_16F,
        }
    }
}

/// The attention kernels with the CTA size and dynamic shared memory the backend launches them
/// with (for `tandem-gpu info`'s occupancy report).
pub fn attention_kernels(g: &Gpu) -> Vec<(&'static str, &CudaFunction, u32, u32)> {
    let k = &g.k;
    let dec = |hd: usize| 32 * crate::plan::dec_warps(hd) as u32;
    vec![
        ("attention", &k.attention, 128, 0),
        ("attention_decode", &k.attention_decode, 128, 0),
        ("attention_mma64", &k.attention_mma64, 64, crate::plan::decode_smem_bytes(64)),
        ("attention_mma128", &k.attention_mma128, 64, crate::plan::decode_smem_bytes(128)),
        ("attention_dec64", &k.attention_dec64, dec(64), crate::plan::dec_smem_bytes(64)),
        ("attention_dec128", &k.attention_dec128, dec(128), crate::plan::dec_smem_bytes(128)),
        ("attention_dec_rope64", &k.attention_dec_rope64, dec(64), crate::plan::dec_smem_bytes(64)),
        (
            "attention_dec_rope128",
            &k.attention_dec_rope128,
            dec(128),
            crate::plan::dec_smem_bytes(128),
        ),
        ("attention_prefill64", &k.attention_prefill64, crate::plan::prefill_threads(), 0),
        ("attention_prefill128", &k.attention_prefill128, crate::plan::prefill_threads(), 0),
    ]
}

/// Handles to every kernel of `kernels/*.cu`.
pub struct Kernels {
    /// Embedding lookup.
    pub embed: CudaFunction,
    /// RMSNorm, f32 in, bf16 out, optional row gather (any width; [`Gpu::rmsnorm_for`] picks
    /// the variant for a width).
    pub rmsnorm: CudaFunction,
    /// The same for rows of at most 1, 2 or 4 16-byte vectors a thread (256 threads a row).
    pub rmsnorm_v: [CudaFunction; 3],
    /// RMSNorm of the residual plus a split-k product's slices, written back first (1, 2, 4
    /// and 8 vectors a thread; [`Gpu::rmsnorm_parts_for`]).
    pub rmsnorm_parts: [CudaFunction; 4],
    /// q/k norm, RoPE, KV store (heads up to 1,024 wide; [`Gpu::rope_for`] picks the variant).
    pub qkv_rope_store: CudaFunction,
    /// The same for heads of at most 64, 128 or 256.
    pub qkv_rope_store_p: [CudaFunction; 3],
    /// The same for heads of at most 64, four tokens a warp (prefills).
    pub qkv_rope_store_p1x4: CudaFunction,
    /// Paged attention.
    pub attention: CudaFunction,
    /// Paged attention for tiles of at most 8 query rows.
    pub attention_decode: CudaFunction,
    /// Tensor-core paged attention, head width 64 (sm_80 and later).
    pub attention_mma64: CudaFunction,
    /// Tensor-core paged attention, head width 128 (sm_80 and later).
    pub attention_mma128: CudaFunction,
    /// Tensor-core paged attention for tiles of at most 8 query rows (positions on the mma's M),
    /// head width 64 (sm_80 and later).
    pub attention_dec64: CudaFunction,
    /// The same, head width 128.
    pub attention_dec128: CudaFunction,
    /// `attention_dec64` with q/k norm + RoPE + KV store of the tile's rows fused in.
    pub attention_dec_rope64: CudaFunction,
    /// The same, head width 128.
    pub attention_dec_rope128: CudaFunction,
    /// Flash-attention prefill on tensor cores (64-row tiles), head width 64.
    pub attention_prefill64: CudaFunction,
    /// The same, head width 128.
    pub attention_prefill128: CudaFunction,
    /// SwiGLU (or GeGLU) activation over 16-bit gate|up.
    pub silu_mul: CudaFunction,
    /// RMSNorm of a sub-layer's output added to the residual (Gemma's post-norms).
    pub rmsnorm_add: CudaFunction,
    /// Products of one row (decode steps of one sequence), f32 or 16-bit out.
    pub gemv: CudaFunction,
    /// Products of 2–64 rows, weights streamed through shared memory, for tiles of 8, 16, 32
    /// and 64 rows (sm_90; [`products`]).
    pub gemm_stream: [CudaFunction; 4],
    /// Dummy weights.
    pub fill_random: CudaFunction,
    /// A block of a dummy weight (a tensor-parallel rank's slice).
    pub fill_random_block: CudaFunction,
    /// A tensor-parallel group's all-reduce over peer memory.
    pub tp_all_reduce: CudaFunction,
    /// The same all-reduce with the RMSNorm that follows it.
    pub tp_all_reduce_norm: CudaFunction,
    /// The all-reduce in two shots (groups of more than two), the norm optional.
    pub tp_all_reduce_two_shot: CudaFunction,
    /// The LM head's logits gathered from the ranks' column slices.
    pub tp_gather_columns: CudaFunction,
    /// Token choice per logits row (Gumbel-max, or argmax at temperature 0).
    pub sample_rows: CudaFunction,
    /// Structured outputs: disallowed tokens of logits rows to minus infinity.
    pub mask_rows: CudaFunction,
    /// Tokens of a pass taken from the previous pass's sampled tokens (steps planned ahead).
    pub take_sampled: CudaFunction,
    /// Contiguous per-head K/V of one sequence (GEMM attention).
    pub gather_kv: CudaFunction,
    /// Causal softmax of a score matrix (GEMM attention).
    pub softmax_causal: CudaFunction,
    /// f32 to the model's 16-bit type.
    pub to_model: CudaFunction,
    /// KV pages from the pool into a staging buffer (NCCL transport).
    pub gather_pages: CudaFunction,
    /// KV pages from a staging buffer into the pool.
    pub scatter_pages: CudaFunction,
    /// An empty kernel (graph node costs).
    pub noop: CudaFunction,
}

/// A CUDA device ready for the backend.
pub struct Gpu {
    /// The context.
    pub ctx: Arc<CudaContext>,
    /// The one stream all work goes to.
    pub stream: Arc<CudaStream>,
    /// The kernels.
    pub k: Kernels,
    /// cuBLAS, bound to `stream`.
    pub blas: CudaBlas,
    _workspace: CudaSlice<u8>,
    /// Device name.
    pub name: String,
    /// Streaming multiprocessors.
    pub num_sms: usize,
    /// Compute capability as `10 · major + minor` (90 for an H100).
    pub sm: u32,
    /// Type of weights and activations.
    pub dtype: Dtype,
    /// Free device memory when the device was opened (what this process uses is measured
    /// against it).
    pub free_at_open: usize,
    /// Products of one row go to the `gemv` kernel (default; `TANDEM_GEMV=off` or
    /// [`Gpu::set_gemv`] keeps every product on cuBLAS, for comparison).
    use_gemv: std::sync::atomic::AtomicBool,
    /// Products of 2–64 rows go to the `gemm_stream` kernels where they apply (sm_90 and
    /// later; `TANDEM_STREAM_GEMM=off` or [`Gpu::set_stream_gemm`] keeps them on cuBLAS).
    use_stream_gemm: std::sync::atomic::AtomicBool,
    /// Gated products (gate|up and the activation) go to the `gemm_stream` kernels' gated
    /// epilogue where they apply (`TANDEM_GEMM_GLU=off` keeps the silu_mul kernel).
    use_gemm_glu: std::sync::atomic::AtomicBool,
    /// Largest weight matrix the `gemv` kernel takes, bytes (`TANDEM_GEMV_MAX_MB`, default 16).
    gemv_max_bytes: usize,
    /// Largest weight matrix the `gemm_stream` kernels take, bytes
    /// (`TANDEM_STREAM_GEMM_MAX_MB`, default 64).
    stream_gemm_max_bytes: usize,
    /// Most rows of a product on the `gemm_stream` kernels ([`Gpu::stream_gemm_max_rows`]).
    stream_gemm_rows: std::sync::atomic::AtomicUsize,
    /// CTAs an SM a stream product's slices of k aim for (`TANDEM_STREAM_GEMM_FILL`, 1.0).
    stream_gemm_fill: f64,
    /// Products into the residual cut along k ([`Gpu::split_slices`]; `TANDEM_SPLIT_K`).
    split_k: split_k::SplitK,
    /// cuBLASLt algorithms chosen by measurement ([`Gpu::tune_gemm`]), made on first use.
    lt: std::sync::OnceLock<lt_plans::LtPlans>,
    /// Kernels launch as programmatic dependents of the kernel before them (sm_90 and later;
    /// `TANDEM_PDL=off` turns it off, for comparison): each may start
    /// while its predecessor drains, and waits for it in `KERNEL_ENTRY` (kernels/common.cu).
    use_pdl: bool,
    /// Kernels launched plainly even with [`Gpu::pdl`] on, as handles: the attention kernels
    /// ([`PDL_PLAIN`]; `TANDEM_PDL_SKIP`, comma-separated kernel names, replaces the list).
    pdl_skip: Vec<usize>,
    /// Kernels launched plainly when the stream's last kernel was a cuBLAS GEMM
    /// ([`PDL_PLAIN_AFTER_GEMM`]), as handles.
    pdl_after_gemm: Vec<usize>,
    /// Whether the stream's last kernel was a cuBLAS GEMM's.
    after_blas: std::sync::atomic::AtomicBool,
}

/// A number from the environment, or `default` where unset or not a number.
fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Whether the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only probes for the shared library.
    unsafe { dsys::is_culib_present() }
}

impl Gpu {
    /// Opens device `ordinal`, compiles the kernels for `dtype` and sets up cuBLAS.
    pub fn open(ordinal: usize, dtype: Dtype) -> Result<Gpu, CudaError> {
        // SAFETY: the probes only try to dlopen the libraries.
        let present = unsafe {
            (dsys::is_culib_present(), nsys::is_culib_present(), bsys::is_culib_present())
        };
        match present {
            (false, _, _) => {
                return Err(CudaError::Unavailable(
                    "libcuda (the NVIDIA driver) is not installed".into(),
                ))
            }
            (_, false, _) => {
                return Err(CudaError::Unavailable(
                    "libnvrtc (CUDA runtime compiler) is not installed".into(),
                ))
            }
            (_, _, false) => {
                return Err(CudaError::Unavailable("libcublas is not installed".into()))
            }
            _ => {}
        }
        let ctx = CudaContext::new(ordinal).map_err(CudaError::from)?;
        let (free_at_open, _) = ctx.mem_get_info().map_err(CudaError::from)?;
        // SAFETY: called before any allocation; all work goes to one stream, synchronised
        // explicitly, which graph capture requires.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(CudaError::from)?;
        let (maj, min) = ctx.compute_capability().map_err(CudaError::from)?;
        let cubin = nvrtc_cubin(KERNEL_SOURCE, &kernel_options(&nvrtc_arch(maj, min), dtype))?;
        let m = ctx.load_module(Ptx::from_binary(cubin)).map_err(CudaError::from)?;
        let f = |name: &str| m.load_function(name).map_err(CudaError::from);
        let k = Kernels {
            embed: f("embed")?,
            rmsnorm: f("rmsnorm")?,
            rmsnorm_v: [f("rmsnorm_v1")?, f("rmsnorm_v2")?, f("rmsnorm_v4")?],
            rmsnorm_parts: [
                f("rmsnorm_parts_v1")?,
                f("rmsnorm_parts_v2")?,
                f("rmsnorm_parts_v4")?,
                f("rmsnorm_parts")?,
            ],
            qkv_rope_store: f("qkv_rope_store")?,
            qkv_rope_store_p: [
                f("qkv_rope_store_p1")?,
                f("qkv_rope_store_p2")?,
                f("qkv_rope_store_p4")?,
            ],
            qkv_rope_store_p1x4: f("qkv_rope_store_p1x4")?,
            attention: f("attention")?,
            attention_decode: f("attention_decode")?,
            attention_mma64: f("attention_mma64")?,
            attention_mma128: f("attention_mma128")?,
            attention_dec64: f("attention_dec64")?,
            attention_dec128: f("attention_dec128")?,
            attention_dec_rope64: f("attention_dec_rope64")?,
            attention_dec_rope128: f("attention_dec_rope128")?,
            attention_prefill64: f("attention_prefill64")?,
            attention_prefill128: f("attention_prefill128")?,
            silu_mul: f("silu_mul")?,
            rmsnorm_add: f("rmsnorm_add")?,
            gemv: f("gemv")?,
            gemm_stream: [
                f("gemm_stream8")?,
                f("gemm_stream16")?,
                f("gemm_stream32")?,
                f("gemm_stream64")?,
            ],
            fill_random: f("fill_random")?,
            fill_random_block: f("fill_random_block")?,
            tp_all_reduce: f("tp_all_reduce")?,
            tp_all_reduce_norm: f("tp_all_reduce_norm")?,
            tp_all_reduce_two_shot: f("tp_all_reduce_two_shot")?,
            tp_gather_columns: f("tp_gather_columns")?,
            sample_rows: f("sample_rows")?,
            mask_rows: f("mask_rows")?,
            take_sampled: f("take_sampled")?,
            gather_kv: f("gather_kv")?,
            softmax_causal: f("softmax_causal")?,
            to_model: f("to_model")?,
            gather_pages: f("gather_pages")?,
            scatter_pages: f("scatter_pages")?,
            noop: f("noop")?,
        };
        // The decode kernels' shared memory is dynamic: allow what their stages take.
        let decode_kernels = [
            (&k.attention_mma64, crate::plan::decode_smem_bytes(64)),
            (&k.attention_mma128, crate::plan::decode_smem_bytes(128)),
            (&k.attention_dec64, crate::plan::dec_smem_bytes(64)),
            (&k.attention_dec128, crate::plan::dec_smem_bytes(128)),
            (&k.attention_dec_rope64, crate::plan::dec_smem_bytes(64)),
            (&k.attention_dec_rope128, crate::plan::dec_smem_bytes(128)),
        ];
        let stream_kernels = (k.gemm_stream.iter().zip([8, 16, 32, 64]))
            .map(|(f, rows)| (f, products::stream_smem_bytes(rows) as u32));
        for (f, bytes) in decode_kernels.into_iter().chain(stream_kernels) {
            let bytes = bytes as i32;
            let attr = dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            f.set_attribute(attr, bytes).map_err(CudaError::from)?;
        }
        let skip = std::env::var("TANDEM_PDL_SKIP").unwrap_or_else(|_| {
            let waiting = (!crate::plan::dec_early_copies()).then_some(PDL_PLAIN_WAITING);
            PDL_PLAIN.into_iter().chain(waiting.into_iter().flatten()).collect::<Vec<_>>().join(",")
        });
        let handles = |names: &str| {
            (names.split(',').filter(|n| !n.is_empty()))
                .map(|name| f(name).map(|k| k.cu_function() as usize))
                .collect::<Result<Vec<_>, _>>()
        };
        let (pdl_skip, pdl_after_gemm) =
            (handles(&skip)?, handles(&PDL_PLAIN_AFTER_GEMM.join(","))?);
        let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Blas(format!("{e:?}")))?;
        let workspace = stream.alloc_zeros::<u8>(BLAS_WORKSPACE).map_err(CudaError::from)?;
        {
            let (wp, _g) = workspace.device_ptr(&stream);
            // SAFETY: the workspace outlives the handle (both live in `Gpu`).
            let st = unsafe {
                bsys::cublasSetWorkspace_v2(*blas.handle(), wp as *mut c_void, BLAS_WORKSPACE)
            };
            if st != bsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(CudaError::Blas(format!("cublasSetWorkspace: {st:?}")));
            }
        }
        let name = ctx.name().map_err(CudaError::from)?;
        let num_sms = ctx
            .attribute(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(CudaError::from)? as usize;
        Ok(Gpu {
            ctx,
            stream,
            k,
            blas,
            _workspace: workspace,
            name,
            num_sms,
            sm: (maj * 10 + min) as u32,
            dtype,
            free_at_open,
            use_gemv: std::sync::atomic::AtomicBool::new(
                std::env::var("TANDEM_GEMV").as_deref() != Ok("off"),
            ),
            gemv_max_bytes: (env_f64("TANDEM_GEMV_MAX_MB", 16.0) * 1048576.0) as usize,
            use_stream_gemm: std::sync::atomic::AtomicBool::new(
                std::env::var("TANDEM_STREAM_GEMM").as_deref() != Ok("off"),
            ),
            use_gemm_glu: std::sync::atomic::AtomicBool::new(
                std::env::var("TANDEM_GEMM_GLU").as_deref() != Ok("off"),
            ),
            stream_gemm_max_bytes: (env_f64("TANDEM_STREAM_GEMM_MAX_MB", 64.0) * 1048576.0)
                as usize,
            stream_gemm_rows: std::sync::atomic::AtomicUsize::new(
                (env_f64("TANDEM_STREAM_GEMM_MAX_ROWS", 32.0) as usize)
                    .min(products::STREAM_MAX_ROWS),
            ),
            stream_gemm_fill: env_f64("TANDEM_STREAM_GEMM_FILL", 1.0),
            split_k: split_k::SplitK::from_env(),
            lt: std::sync::OnceLock::new(),
            use_pdl: maj >= 9 && std::env::var("TANDEM_PDL").as_deref() != Ok("off"),
            pdl_skip,
            pdl_after_gemm,
            after_blas: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Makes the context current on the calling thread (the engine may run on another thread
    /// than the one that opened the device).
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(CudaError::from)
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        self.ctx.mem_get_info().map_err(CudaError::from)
    }

    /// A zeroed device buffer.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.stream.alloc_zeros::<T>(n.max(1)).map_err(CudaError::from)
    }

    /// A device copy of `data`.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, CudaError> {
        if data.is_empty() {
            // SAFETY: a one-element allocation that is never read.
            return unsafe { self.stream.alloc::<T>(1) }.map_err(CudaError::from);
        }
        self.stream.clone_htod(data).map_err(CudaError::from)
    }

    /// Copies `data` into the start of `dst`.
    pub fn write<T: DeviceRepr>(
        &self,
        dst: &mut CudaSlice<T>,
        data: &[T],
    ) -> Result<(), CudaError> {
        self.write_at(dst, 0, data)
    }

    /// Copies `data` into `dst` from element `at` on.
    pub fn write_at<T: DeviceRepr>(
        &self,
        dst: &mut CudaSlice<T>,
        at: usize,
        data: &[T],
    ) -> Result<(), CudaError> {
        if data.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice_mut(at..at + data.len());
        self.stream.memcpy_htod(data, &mut view).map_err(CudaError::from)
    }

    /// Copies the first `n` elements of `src` to the host (waits for the stream).
    pub fn read<T: DeviceRepr + Default + Clone>(
        &self,
        src: &CudaSlice<T>,
        n: usize,
    ) -> Result<Vec<T>, CudaError> {
        let mut out = vec![T::default(); n];
        if n > 0 {
            self.stream.memcpy_dtoh(&src.slice(..n), &mut out).map_err(CudaError::from)?;
        }
        self.stream.synchronize().map_err(CudaError::from)?;
        Ok(out)
    }

    /// Waits for all queued work.
    pub fn sync(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(CudaError::from)
    }

    /// `C[m×n] = A[m×k] · W[n×k]ᵀ (+ C if `accumulate`)`, row-major: `a` and `w` of the
    /// device's 16-bit type, f32 accumulation, `c` 16-bit or f32 (`c_f32`). Pointers are raw
    /// device addresses.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: u64,
        w: u64,
        c: u64,
        c_f32: bool,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        if m == 0 {
            return Ok(());
        }
        if m == 1 && self.gemv_takes(n, k) {
            return self.gemv(n, k, a, w, (c, c_f32), accumulate);
        }
        if self.stream_gemm_takes(m, n, k) && (a | w | c).is_multiple_of(16) {
            return self.stream_gemm((m, n, k), a, w, (c, c_f32), accumulate);
        }
        if self.lt_gemm((m, n, k, c_f32, accumulate), a, w, c)? {
            return Ok(());
        }
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        let ctype = if c_f32 { bsys::cudaDataType_t::CUDA_R_32F } else { self.dtype.cuda() };
        self.after_blas.store(true, std::sync::atomic::Ordering::Relaxed);
        // Row-major C = A·Wᵀ is column-major Cᵀ(n×m) = W(n×k, stored k-major) · Aᵀ.
        // SAFETY: the caller's pointers address m×k, n×k and m×n elements.
        let st = unsafe {
            bsys::cublasGemmEx(
                *self.blas.handle(),
                bsys::cublasOperation_t::CUBLAS_OP_T,
                bsys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                self.dtype.cuda(),
                k as i32,
                a as *const c_void,
                self.dtype.cuda(),
                k as i32,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                ctype,
                n as i32,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if st != bsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(CudaError::Blas(format!("cublasGemmEx {m}x{n}x{k}: {st:?}")));
        }
        Ok(())
    }
}

impl Gpu {
    /// The RMSNorm kernel for rows `h` wide launched with 256 threads a row: the variant whose
    /// threads hold the fewest registers for the row (a 1,024-wide row needs one 16-byte vector a
    /// thread; the general kernel's eight cost a prefill's thousands of rows 2 CTAs per SM).
    pub fn rmsnorm_for(&self, h: usize) -> &CudaFunction {
        let vecs = h.div_ceil(4 * 256);
        match (h.is_multiple_of(4), vecs) {
            (true, 0..=1) => &self.k.rmsnorm_v[0],
            (true, 2) => &self.k.rmsnorm_v[1],
            (true, 3..=4) => &self.k.rmsnorm_v[2],
            _ => &self.k.rmsnorm,
        }
    }

    /// The q/k norm + RoPE + KV store kernel for heads `hd` wide whose warps take `per_warp`
    /// tokens (1, or [`rope_tokens`] where [`rope_config`] says): the variant that holds the
    /// fewest rotation pairs a lane (hd ≤ 64 · pairs).
    pub fn rope_for(&self, hd: usize, per_warp: usize) -> &CudaFunction {
        match hd.div_ceil(64) {
            0..=1 if per_warp > 1 => &self.k.qkv_rope_store_p1x4,
            0..=1 => &self.k.qkv_rope_store_p[0],
            2 => &self.k.qkv_rope_store_p[1],
            3..=4 => &self.k.qkv_rope_store_p[2],
            _ => &self.k.qkv_rope_store,
        }
    }
}

/// One operand of [`Gpu::gemm_batched`]: address, leading dimension, stride between batches
/// (elements), and whether it is transposed.
#[derive(Debug, Clone, Copy)]
pub struct Operand {
    /// Device address.
    pub ptr: u64,
    /// Leading dimension (column-major, as cuBLAS counts it).
    pub ld: usize,
    /// Elements between consecutive batches.
    pub stride: usize,
    /// Transposed.
    pub trans: bool,
}

impl Gpu {
    /// Column-major strided-batched `C = alpha · op(A) · op(B) + beta · C` (cuBLAS conventions:
    /// `C` is `m×n`), `A`/`B` of type `ab`, f32 accumulation, `C` f32 or of type `ab`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_batched(
        &self,
        ab: Dtype,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: Operand,
        b: Operand,
        beta: f32,
        c: Operand,
        c_f32: bool,
        batch: usize,
    ) -> Result<(), CudaError> {
        if m == 0 || n == 0 || batch == 0 {
            return Ok(());
        }
        let op = |t: bool| {
            if t {
                bsys::cublasOperation_t::CUBLAS_OP_T
            } else {
                bsys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let ctype = if c_f32 { bsys::cudaDataType_t::CUDA_R_32F } else { ab.cuda() };
        self.after_blas.store(true, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's operands address `batch` matrices of the stated shapes.
        let st = unsafe {
            bsys::cublasGemmStridedBatchedEx(
                *self.blas.handle(),
                op(a.trans),
                op(b.trans),
                m as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                a.ptr as *const c_void,
                ab.cuda(),
                a.ld as i32,
                a.stride as i64,
                b.ptr as *const c_void,
                ab.cuda(),
                b.ld as i32,
                b.stride as i64,
                &beta as *const f32 as *const c_void,
                c.ptr as *mut c_void,
                ctype,
                c.ld as i32,
                c.stride as i64,
                batch as i32,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if st != bsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(CudaError::Blas(format!(
                "cublasGemmStridedBatchedEx {m}x{n}x{k}x{batch}: {st:?}"
            )));
        }
        Ok(())
    }
}

/// The raw device address of a buffer.
pub fn ptr<T>(s: &CudaSlice<T>) -> u64 {
    let (p, _g) = s.device_ptr(s.stream());
    p
}

/// The architecture NVRTC compiles the kernels for on a device of compute capability
/// `maj.min`: `sm_90a` on Hopper (its arch-specific instructions: the stream GEMMs' warpgroup
/// MMA; such a CUBIN loads on compute capability 9.0 alone, the device it was built on), else
/// `sm_{maj}{min}`.
pub fn nvrtc_arch(maj: i32, min: i32) -> String {
    match (maj, min) {
        (9, 0) => "sm_90a".into(),
        _ => format!("sm_{maj}{min}"),
    }
}

/// NVRTC's options for [`KERNEL_SOURCE`] on GPU architecture `arch` (e.g. `sm_90`) for models
/// in `dtype`: the kernels' sizes the host plans with, and the variants `TANDEM_CUDA_DEFINES`
/// names for comparison (e.g. `TANDEM_CUDA_DEFINES="TANDEM_PF_SPLIT_P"`).
pub fn kernel_options(arch: &str, dtype: Dtype) -> Vec<String> {
    let mut opts = vec![format!("--gpu-architecture={arch}"), "-default-device".into()];
    if dtype == Dtype::F16 {
        opts.push("-DTANDEM_F16".into());
    }
    opts.push(format!("-DPF_WARPS={}", crate::plan::prefill_warps()));
    opts.push(format!("-DMMA_STAGES={}", crate::plan::decode_stages()));
    opts.push(format!("-DDEC_WARPS64={}", crate::plan::dec_warps(64)));
    opts.push(format!("-DDEC_WARPS128={}", crate::plan::dec_warps(128)));
    if crate::plan::dec_early_copies() {
        opts.push("-DTANDEM_DEC_EARLY_COPIES".into());
    }
    if let Ok(defs) = std::env::var("TANDEM_CUDA_DEFINES") {
        opts.extend(defs.split_whitespace().map(|d| format!("-D{d}")));
    }
    opts
}

/// Compiles CUDA C++ to a CUBIN for one real architecture (no driver JIT at load time).
pub fn nvrtc_cubin(src: &str, opts: &[String]) -> Result<Vec<u8>, CudaError> {
    let err = |what: &str, r: nsys::nvrtcResult| CudaError::Nvrtc(format!("{what}: {r:?}"));
    let csrc = CString::new(src).map_err(|e| CudaError::Nvrtc(e.to_string()))?;
    let copts: Vec<CString> =
        opts.iter().map(|s| CString::new(s.as_str()).expect("option without NUL")).collect();
    let ptrs: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: plain NVRTC calls on a program this function creates and destroys.
    unsafe {
        let mut prog: nsys::nvrtcProgram = std::ptr::null_mut();
        let r = nsys::nvrtcCreateProgram(
            &mut prog,
            csrc.as_ptr(),
            std::ptr::null(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if r != nsys::nvrtcResult::NVRTC_SUCCESS {
            return Err(err("nvrtcCreateProgram", r));
        }
        let r = nsys::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
        if r != nsys::nvrtcResult::NVRTC_SUCCESS {
            let mut ls = 0usize;
            nsys::nvrtcGetProgramLogSize(prog, &mut ls);
            let mut log = vec![0u8; ls.max(1)];
            nsys::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut c_char);
            nsys::nvrtcDestroyProgram(&mut prog);
            return Err(CudaError::Nvrtc(format!(
                "compile: {r:?}: {}",
                String::from_utf8_lossy(&log)
            )));
        }
        let mut sz = 0usize;
        let r = nsys::nvrtcGetCUBINSize(prog, &mut sz);
        if r != nsys::nvrtcResult::NVRTC_SUCCESS || sz == 0 {
            nsys::nvrtcDestroyProgram(&mut prog);
            return Err(err("nvrtcGetCUBINSize", r));
        }
        let mut bin = vec![0u8; sz];
        let r = nsys::nvrtcGetCUBIN(prog, bin.as_mut_ptr() as *mut c_char);
        nsys::nvrtcDestroyProgram(&mut prog);
        if r != nsys::nvrtcResult::NVRTC_SUCCESS {
            return Err(err("nvrtcGetCUBIN", r));
        }
        Ok(bin)
    }
}

/// Milliseconds of GPU time `f` takes, median of `reps` after `warm` warm-ups (CUDA events).
pub fn time_ms(
    g: &Gpu,
    warm: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    for _ in 0..warm {
        f()?;
    }
    g.sync()?;
    let e0 = g
        .ctx
        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(CudaError::from)?;
    let e1 = g
        .ctx
        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(CudaError::from)?;
    let mut ts = Vec::with_capacity(reps);
    for _ in 0..reps {
        e0.record(&g.stream).map_err(CudaError::from)?;
        f()?;
        e1.record(&g.stream).map_err(CudaError::from)?;
        e1.synchronize().map_err(CudaError::from)?;
        ts.push(e0.elapsed_ms(&e1).map_err(CudaError::from)? as f64);
    }
    ts.sort_by(f64::total_cmp);
    Ok(ts[ts.len() / 2])
}
