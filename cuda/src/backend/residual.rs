//! The projections into the residual stream (attention output and down): one cuBLAS GEMM
//! accumulating into the f32 residual, summed across a tensor-parallel group; or cut along k
//! into slices whose partial sums the following RMSNorm adds in; or, with a post-norm (Gemma),
//! written aside, normed and added.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::CudaBackend;
use crate::device::ptr;
use crate::CudaError;

/// What a projection into the residual left for the RMSNorm that reads the residual next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Residual {
    /// The residual holds the sum; the caller norms it.
    Summed,
    /// The group's all-reduce also applied the next RMSNorm into the 16-bit activations.
    Normed,
    /// The product's slices of k sit in the partial-sum buffer, this many: the next RMSNorm
    /// adds them into the residual first ([`CudaBackend::norm_parts`]).
    Parts(usize),
}

impl CudaBackend {
    /// Projection `which` (0: attention output, 1: down) of `t` rows of width `k` into the
    /// residual stream. `next_norm` is the RMSNorm over all `t` rows that reads the residual
    /// next, if any (the final norm takes only the logits rows): a tensor-parallel group's
    /// all-reduce applies it ([`Residual::Normed`]); alone, the product may be cut along k for
    /// it to add up ([`Residual::Parts`]).
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
    ) -> Result<Residual, CudaError> {
        let (g, h) = (&self.gpu, self.cfg.hidden_size);
        let Some(norm) = post_norm else {
            let slices = match (&self.tp, next_norm) {
                (None, Some(_)) => g.split_slices(t, h, k),
                _ => 1,
            };
            if slices > 1 {
                g.gemm_split_k(t, h, k, a, w, ptr(&self.a.parts), slices)?;
                return Ok(Residual::Parts(slices));
            }
            let (dst, add) = self.reduce_target(which, t * h);
            g.gemm(t, h, k, a, w, dst, true, add)?;
            return Ok(match self.all_reduce(which, t, next_norm)? {
                true => Residual::Normed,
                false => Residual::Summed,
            });
        };
        let proj = ptr(&self.a.proj);
        g.gemm(t, h, k, a, w, proj, true, false)?;
        let (hi, eps) = (h as i32, self.cfg.rms_norm_eps);
        // SAFETY: rmsnorm_add(float* x, const float* y, const float* w, int H, float eps) over t
        // rows of the residual and of `proj` (sized for the post-norm models' t × h).
        unsafe {
            g.launch(&g.k.rmsnorm_add, rows(t), &[&ptr(&self.a.x), &proj, &ptr(norm), &hi, &eps])?
        };
        Ok(Residual::Summed)
    }

    /// RMSNorm of the residual's `t` rows plus the `slices` partial sums a projection left
    /// ([`Residual::Parts`]), the sum written back to the residual, with `weights` into the
    /// 16-bit activations.
    pub(super) fn norm_parts(
        &self,
        t: usize,
        slices: usize,
        weights: u64,
    ) -> Result<(), CudaError> {
        let (g, h) = (&self.gpu, self.cfg.hidden_size);
        let (hi, eps, n) = (h as i32, self.cfg.rms_norm_eps, slices as i32);
        let stride = (t * h) as i64;
        let (x, parts, hb) = (ptr(&self.a.x), ptr(&self.a.parts), ptr(&self.a.hb));
        // SAFETY: rmsnorm_parts*(float* x, const float* parts, int nparts, long long pstride,
        // const float* w, h16* y, int H, float eps) over t rows; `parts` holds `slices` × t × h
        // floats (split_slices keeps slices × t within SPLIT_PART_ROWS and the buffer's rows).
        unsafe {
            g.launch(
                g.rmsnorm_parts_for(h),
                rows(t),
                &[&x, &parts, &n, &stride, &weights, &hb, &hi, &eps],
            )
        }
    }
}

/// One CTA of 256 threads per row.
fn rows(t: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (t as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}
