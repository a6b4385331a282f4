//! How `Gpu` launches its kernels: plainly, or as programmatic dependents of the stream's
//! previous kernel (sm_90 and later), which lets a kernel's CTAs be scheduled while that kernel
//! drains; every kernel begins with `KERNEL_ENTRY` (kernels/common.cu), which waits for it.

use std::ffi::c_void;
use std::sync::atomic::Ordering::Relaxed;

use cudarc::driver::{sys as dsys, CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};

use super::Gpu;
use crate::CudaError;

/// Kernels [`Gpu::launch`] always launches plainly, not as programmatic dependents: the
/// attention kernels that wait at entry. As dependents (scheduled while `qkv_rope_store` still
/// ran, doing nothing) the decode kernel made Qwen3-0.6B steps at 16 and 64 sequences 3–6 %
/// slower on an NVIDIA H200 than plain launches everywhere (`attention_dec128`, cuBLAS GEMMs,
/// decode graphs, bf16 random weights; `tandem-gpu bench-decode`,
/// docs/gpu-runs/h200-2026-11-28f-pdl/). The fused decode kernels are dependents: they copy
/// pages before they wait ([`PDL_PLAIN_WAITING`] otherwise).
pub const PDL_PLAIN: [&str; 8] = [
    "attention",
    "attention_decode",
    "attention_mma64",
    "attention_mma128",
    "attention_dec64",
    "attention_dec128",
    "attention_prefill64",
    "attention_prefill128",
];

/// The fused decode kernels, launched plainly too where they wait at entry
/// (`TANDEM_DEC_EARLY_COPIES=off`: [`crate::plan::dec_early_copies`]).
pub const PDL_PLAIN_WAITING: [&str; 2] = ["attention_dec_rope64", "attention_dec_rope128"];

/// Kernels [`Gpu::launch`] launches plainly right after a cuBLAS GEMM: the RMSNorm kernels
/// (those that add a split-k product's slices too).
/// As dependents of the GEMMs they made the Llama-3-8B shape's step at 16 sequences 1.5 %
/// slower on an NVIDIA H200 (same kernel path and record as [`PDL_PLAIN`]); after Tandem's own
/// kernels (the one-row `gemv`, `embed`) they gain.
pub const PDL_PLAIN_AFTER_GEMM: [&str; 8] = [
    "rmsnorm",
    "rmsnorm_v1",
    "rmsnorm_v2",
    "rmsnorm_v4",
    "rmsnorm_parts",
    "rmsnorm_parts_v1",
    "rmsnorm_parts_v2",
    "rmsnorm_parts_v4",
];

impl Gpu {
    /// Launches `f` with raw arguments (device pointers as `u64`): as a programmatic dependent
    /// of the stream's previous kernel where [`Gpu::pdl`] says so and the kernel is not kept
    /// plain ([`PDL_PLAIN`], or [`PDL_PLAIN_AFTER_GEMM`] right after a cuBLAS GEMM); every
    /// kernel of kernels/*.cu waits for its predecessor before it touches memory.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and type, and every
    /// pointer must address enough device memory for the launch.
    pub unsafe fn launch(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<(), CudaError> {
        let after_blas = self.after_blas.swap(false, Relaxed);
        let k = f.cu_function() as usize;
        if self.pdl()
            && !self.pdl_skip.contains(&k)
            && !(after_blas && self.pdl_after_gemm.contains(&k))
        {
            // SAFETY: forwarded to the caller.
            return unsafe { self.launch_dependent(f, cfg, args) };
        }
        let mut b = self.stream.launch_builder(f);
        for a in args {
            a.push(&mut b);
        }
        // SAFETY: forwarded to the caller.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(CudaError::from)
    }

    /// `cuLaunchKernelEx` with programmatic stream serialization allowed: the kernel's CTAs may
    /// be scheduled once every CTA of the stream's previous kernel has started (or triggered),
    /// and `griddepcontrol.wait` in the kernel holds them until that kernel has finished and
    /// its writes are visible. Captured into a graph, the edge stays programmatic.
    ///
    /// # Safety
    /// As [`Gpu::launch`]; the kernel must wait (`KERNEL_ENTRY`) before touching memory.
    unsafe fn launch_dependent(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<(), CudaError> {
        // SAFETY: forwarded to the caller.
        unsafe { self.launch_ex(f, cfg, (true, 1), args) }
    }

    /// Launches `f` as thread-block clusters of `cluster_y` CTAs along the grid's y (sm_90 and
    /// later; `cluster_y` divides the grid's y and is at most 8), as a programmatic dependent of
    /// the stream's previous kernel where [`Gpu::pdl`] says so.
    ///
    /// # Safety
    /// As [`Gpu::launch`]; the kernel must wait (`griddepcontrol.wait`) before touching memory
    /// another kernel writes.
    pub unsafe fn launch_cluster(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        cluster_y: u32,
        args: &[&dyn KernelArg],
    ) -> Result<(), CudaError> {
        self.after_blas.store(false, Relaxed);
        let dependent = self.pdl() && !self.pdl_skip.contains(&(f.cu_function() as usize));
        // SAFETY: forwarded to the caller.
        unsafe { self.launch_ex(f, cfg, (dependent, cluster_y), args) }
    }

    /// `cuLaunchKernelEx` with programmatic stream serialization (`dependent`) and clusters of
    /// `cluster_y` CTAs along y (where more than one).
    ///
    /// # Safety
    /// As [`Gpu::launch_cluster`].
    unsafe fn launch_ex(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        (dependent, cluster_y): (bool, u32),
        args: &[&dyn KernelArg],
    ) -> Result<(), CudaError> {
        let mut params: Vec<*mut c_void> = args.iter().map(|a| a.param()).collect();
        let mut attrs: Vec<dsys::CUlaunchAttribute> = Vec::with_capacity(2);
        if dependent {
            // SAFETY: a zeroed attribute is a valid plain-data value; id and value are set.
            let mut attr: dsys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                dsys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            attrs.push(attr);
        }
        if cluster_y > 1 {
            // SAFETY: as above.
            let mut attr: dsys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = dsys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attr.value.clusterDim.x = 1;
            attr.value.clusterDim.y = cluster_y;
            attr.value.clusterDim.z = 1;
            attrs.push(attr);
        }
        let conf = dsys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        self.bind()?;
        // SAFETY: `params` and `attrs` point at values alive for this call; the rest is
        // forwarded to the caller.
        unsafe {
            dsys::cuLaunchKernelEx(
                &conf,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(CudaError::from)
    }

    /// Whether kernels launch as programmatic dependents (see [`Gpu::launch`]).
    pub fn pdl(&self) -> bool {
        self.use_pdl
    }
}

/// A value that can be pushed as a kernel argument.
pub trait KernelArg {
    /// Pushes `self` onto the launch.
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>);
    /// The address of the value, as `cuLaunchKernelEx` takes each parameter.
    fn param(&self) -> *mut c_void;
}

impl<T: DeviceRepr> KernelArg for T {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
        b.arg(self);
    }
    fn param(&self) -> *mut c_void {
        self as *const T as *mut c_void
    }
}
