//! Products into the residual stream cut along k: the attention output and down projections
//! of a decode step have few output columns (the hidden size) and a long k, so cuBLAS's tiles
//! of 33–256 rows leave most SMs idle and the product takes its fixed latency, not its bytes'
//! time. Cut into slices run as one strided-batched call, each slice's partial sum written
//! apart, the slices keep more SMs reading; the RMSNorm that reads the residual next adds them in
//! (`rmsnorm_parts*`, kernels/layers.cu) so no kernel is added to the step.

use cudarc::driver::CudaFunction;

use super::{Gpu, Operand};
use crate::CudaError;

/// Most slices a product is cut into.
pub const SPLIT_MAX_SLICES: usize = 8;
/// Most rows times slices of a product cut along k (the backend's partial-sum buffer holds
/// this many rows of the hidden size).
pub const SPLIT_PART_ROWS: usize = 1024;
/// Most rows times slices [`auto_slices`] takes: the partial sums are written and read back
/// (through the L2 cache, but written back to DRAM as the attention's pages stream through),
/// and on one NVIDIA H100 Qwen3-0.6B's step at 256 sequences was 1.5 % slower with 8 slices of
/// 256 rows than uncut, level with 2, while 64 rows in 4 slices and 128 in 2 or 4 gained
/// 1.5 % and 0.8 % (docs/gpu-runs/h100-2026-12-06b-splitk/1-k103/).
pub const SPLIT_AUTO_PART_ROWS: usize = 256;
/// Largest weight matrix [`auto_slices`] cuts, bytes: larger products are bound by their bytes,
/// not their latency (the Llama-3-8B shape's 32-117 MiB o and down took 2-13 % longer cut in
/// 2-8 slices at 64 and 256 rows, the same record).
pub const SPLIT_AUTO_MAX_BYTES: usize = 16 << 20;

/// How [`Gpu::split_slices`] chooses (`TANDEM_SPLIT_K`: `off`, a fixed count, or `auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitK {
    /// Never cut (cuBLAS accumulates into the residual).
    Off,
    /// This many slices wherever they divide k.
    Fixed(usize),
    /// [`auto_slices`]'s rule.
    Auto,
}

impl SplitK {
    /// From `TANDEM_SPLIT_K` (unset or unknown: [`SplitK::Auto`]).
    pub fn from_env() -> Self {
        match std::env::var("TANDEM_SPLIT_K").as_deref() {
            Ok("off") | Ok("0") | Ok("1") => SplitK::Off,
            Ok(v) => match v.parse::<usize>() {
                Ok(n) => SplitK::Fixed(n.min(SPLIT_MAX_SLICES)),
                Err(_) => SplitK::Auto,
            },
            Err(_) => SplitK::Auto,
        }
    }
}

/// Whether `k` cut into `s` slices leaves each a whole number of 64-wide steps (so every
/// slice starts 128-byte aligned and cuBLAS keeps its fast kernels).
pub fn slices_fit(k: usize, s: usize) -> bool {
    s >= 2 && k.is_multiple_of(64 * s)
}

/// Slices for a product of `m` rows, `n` columns over `k` in 16-bit weights: 4, else 2, where
/// the weights are at most [`SPLIT_AUTO_MAX_BYTES`], the slices fit k and rows times slices
/// stay within [`SPLIT_AUTO_PART_ROWS`]; 1 (no cut) otherwise.
pub fn auto_slices(m: usize, n: usize, k: usize) -> usize {
    if 2 * n * k > SPLIT_AUTO_MAX_BYTES {
        return 1;
    }
    [4, 2].into_iter().find(|&s| s * m <= SPLIT_AUTO_PART_ROWS && slices_fit(k, s)).unwrap_or(1)
}

impl Gpu {
    /// Slices of k for a product into the residual of `m` rows, `n` columns over `k`, where
    /// the caller can add the slices in afterwards: 1 (don't cut) for rows the stream kernels
    /// or `gemv` take, or where `TANDEM_SPLIT_K` says so; never more than
    /// [`SPLIT_PART_ROWS`] rows times slices.
    pub fn split_slices(&self, m: usize, n: usize, k: usize) -> usize {
        if m == 1 || self.stream_gemm_takes(m, n, k) {
            return 1;
        }
        match self.split_k {
            SplitK::Off => 1,
            SplitK::Fixed(s) if slices_fit(k, s) && s * m <= SPLIT_PART_ROWS => s,
            SplitK::Fixed(_) => 1,
            SplitK::Auto => auto_slices(m, n, k),
        }
    }

    /// `C_s = A[:, s·kc..(s+1)·kc] · W[:, s·kc..(s+1)·kc]ᵀ` for `s < slices`, `kc = k / slices`:
    /// [`Gpu::gemm`]'s product (row-major A `m×k`, W `n×k`) cut along k, each slice's partial
    /// sum written apart (row-major `m×n` f32 at `c + s·m·n` floats), in one strided-batched call.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_split_k(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: u64,
        w: u64,
        c: u64,
        slices: usize,
    ) -> Result<(), CudaError> {
        let kc = k / slices;
        // Column-major Cᵀ_s (n×m) = W_s (k×n stored, transposed) · A_sᵀ (k×m), slices kc apart.
        let wo = Operand { ptr: w, ld: k, stride: kc, trans: true };
        let ao = Operand { ptr: a, ld: k, stride: kc, trans: false };
        let co = Operand { ptr: c, ld: n, stride: m * n, trans: false };
        self.gemm_batched(self.dtype, n, m, kc, 1.0, wo, ao, 0.0, co, true, slices)
    }

    /// The `rmsnorm_parts` kernel for rows `h` wide at 256 threads a row (as
    /// [`Gpu::rmsnorm_for`] picks the plain one).
    pub fn rmsnorm_parts_for(&self, h: usize) -> &CudaFunction {
        match (h.is_multiple_of(4), h.div_ceil(4 * 256)) {
            (true, 0..=1) => &self.k.rmsnorm_parts[0],
            (true, 2) => &self.k.rmsnorm_parts[1],
            (true, 3..=4) => &self.k.rmsnorm_parts[2],
            _ => &self.k.rmsnorm_parts[3],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_slices_cut_small_products_of_few_rows() {
        // Qwen3-0.6B's o (1,024 columns over 2,048) and down (over 3,072).
        assert_eq!(auto_slices(64, 1024, 2048), 4);
        assert_eq!(auto_slices(48, 1024, 3072), 4);
        assert_eq!(auto_slices(128, 1024, 3072), 2);
        assert_eq!(auto_slices(129, 1024, 2048), 1);
        assert_eq!(auto_slices(256, 1024, 2048), 1);
        // k that 4 slices don't divide into 64-wide steps: 2 if they do, else none.
        assert_eq!(auto_slices(64, 1024, 384), 2);
        assert_eq!(auto_slices(64, 576, 576), 1);
        // The Llama-3-8B shape's o (32 MiB): bound by its bytes, not cut.
        assert_eq!(auto_slices(64, 4096, 4096), 1);
    }

    #[test]
    fn slices_divide_k_into_whole_steps() {
        assert!(slices_fit(3072, 8));
        assert!(!slices_fit(1536, 16));
        assert!(!slices_fit(2048, 1));
        assert!(!slices_fit(576, 2));
    }
}
