//! The projections into the residual stream (attention output and down): one cuBLAS GEMM
//! accumulating into the f32 residual, summed across a tensor-parallel group; or, with a
//! post-norm (Gemma), written aside, normed and added.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::CudaBackend;
use crate::device::ptr;
use crate::CudaError;

impl CudaBackend {
    /// Projection `which` (0: attention output, 1: down) of `t` rows of width `k` into the
    /// residual stream. True when the group's all-reduce also applied `next_norm` (the RMSNorm
    /// that reads the sum) into the 16-bit activations; otherwise the caller norms.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn project_into_residual(
        &self,
        t: usize,
        k: usize,
        a: u64,
        w: u64,
        post_norm: Option<&CudaSlice<f32>>,
        which: usize,
        next_norm: Option<u64>,
    ) -> Result<bool, CudaError> {
        let (g, h) = (&self.gpu, self.cfg.hidden_size);
        let Some(norm) = post_norm else {
            let (dst, add) = self.reduce_target(which, t * h);
            g.gemm(t, h, k, a, w, dst, true, add)?;
            return self.all_reduce(which, t, next_norm);
        };
        let proj = ptr(&self.a.proj);
        g.gemm(t, h, k, a, w, proj, true, false)?;
        let (hi, eps) = (h as i32, self.cfg.rms_norm_eps);
        // SAFETY: rmsnorm_add(float* x, const float* y, const float* w, int H, float eps) over t
        // rows of the residual and of `proj` (sized for the post-norm models' t × h).
        unsafe {
            g.launch(&g.k.rmsnorm_add, rows(t), &[&ptr(&self.a.x), &proj, &ptr(norm), &hi, &eps])?
        };
        Ok(false)
    }
}

/// One CTA of 256 threads per row.
fn rows(t: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (t as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}
