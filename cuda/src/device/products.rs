//! [`Gpu::gemm`]'s products on Tandem's own kernels instead of cuBLAS: one row on `gemv`, 2–64
//! rows on `gemm_stream*` (kernels/gemm_stream.cu: the weights streamed through shared memory by
//! cp.async, the slices of a product cut along k summed inside a thread-block cluster). Both are
//! decode-step sizes, where each weight is read once and cuBLAS's tiles leave SMs idle.

use std::sync::atomic::Ordering::Relaxed;

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::Gpu;
use crate::CudaError;

/// Output columns of one `gemm_stream` CTA (`GS_COLS`).
pub const STREAM_COLS: usize = 64;
/// k of one pipeline stage (`GS_KSTEP`).
pub const STREAM_KSTEP: usize = 64;
/// Pipeline stages (`GS_STAGES`).
pub const STREAM_STAGES: usize = 4;
/// Threads of one `gemm_stream` CTA.
pub const STREAM_THREADS: u32 = 128;
/// Most rows a stream product takes (its largest tile of A).
pub const STREAM_MAX_ROWS: usize = 64;
/// Most slices of k (CTAs of a cluster, the portable limit).
pub const STREAM_MAX_SLICES: usize = 8;

/// The rows of A a `gemm_stream` kernel holds for a product of `m` rows: 8, 16, 32 or 64.
pub fn stream_tile_rows(m: usize) -> usize {
    m.next_power_of_two().clamp(8, STREAM_MAX_ROWS)
}

/// Dynamic shared memory of a `gemm_stream` kernel holding `rows` rows of A, bytes: its stages,
/// and 1,024 bytes to start them on a 1,024-byte boundary (the warpgroup MMA's swizzle).
pub fn stream_smem_bytes(rows: usize) -> usize {
    STREAM_STAGES * (STREAM_COLS + rows) * 128 + 1024
}

/// Slices of k for a stream product of `n` columns over `k` on `sms` SMs: the fewest (at most
/// 8, each a whole number of 64-wide stages) that give `fill` CTAs an SM, else the most.
pub fn stream_slices(n: usize, k: usize, sms: usize, fill: f64) -> usize {
    let (tiles, stages) = (n / STREAM_COLS, k / STREAM_KSTEP);
    let mut best = 1;
    for s in (1..=STREAM_MAX_SLICES.min(stages)).filter(|&s| stages.is_multiple_of(s)) {
        best = s;
        if (tiles * s) as f64 >= fill * sms as f64 {
            break;
        }
    }
    best
}

impl Gpu {
    /// Whether products of one row take the `gemv` kernel.
    pub fn gemv_on(&self) -> bool {
        self.use_gemv.load(Relaxed)
    }

    /// Whether [`Gpu::gemm`] takes a product of one row, `n` columns over `k` on the `gemv`
    /// kernel: switched on, k a multiple of 8, and weights of at most `TANDEM_GEMV_MAX_MB`
    /// (default 16: on one NVIDIA H200 — decode graphs, `attention_dec_rope128/64`, bf16
    /// random weights — the Llama-3-8B shape's step at one sequence took 4.69 ms with
    /// its 32–1,002 MiB matrices on `gemv` and 4.57 on cuBLAS, while Qwen3-0.6B's and the
    /// SmolLM2 shape's, whose layers' matrices are at most 12 MiB, took 0.86 / 0.63 ms against
    /// 1.18 / 0.85; docs/gpu-runs/h200-2026-12-02b-stream-gemm/5-k85/).
    pub fn gemv_takes(&self, n: usize, k: usize) -> bool {
        self.gemv_on() && k.is_multiple_of(8) && 2 * n * k <= self.gemv_max_bytes
    }

    /// Products of one row on the `gemv` kernel (on) or cuBLAS (off) from now on; graphs
    /// captured before keep what they captured.
    pub fn set_gemv(&self, on: bool) {
        self.use_gemv.store(on, Relaxed)
    }

    /// Whether products of 2–64 rows take the `gemm_stream` kernels where they apply.
    pub fn stream_gemm_on(&self) -> bool {
        self.use_stream_gemm.load(Relaxed)
    }

    /// Products of 2–64 rows on the `gemm_stream` kernels (on) or cuBLAS (off) from now on;
    /// graphs captured before keep what they captured.
    pub fn set_stream_gemm(&self, on: bool) {
        self.use_stream_gemm.store(on, Relaxed)
    }

    /// Most rows a product may have to take the `gemm_stream` kernels (2–64).
    pub fn stream_gemm_max_rows(&self) -> usize {
        self.stream_gemm_rows.load(Relaxed)
    }

    /// Products of up to `rows` rows (at most 64) take the `gemm_stream` kernels from now on.
    pub fn set_stream_gemm_max_rows(&self, rows: usize) {
        self.stream_gemm_rows.store(rows.min(STREAM_MAX_ROWS), Relaxed)
    }

    /// Whether [`Gpu::gemm`] takes a product of `m` rows, `n` columns over `k` on the
    /// `gemm_stream` kernels: switched on, sm_90 or later (clusters), 2 to
    /// [`Gpu::stream_gemm_max_rows`] rows (`TANDEM_STREAM_GEMM_MAX_ROWS`, default 32: on one
    /// H200 — bf16 random weights, decode graphs, `attention_dec_rope128/64`, the warpgroup MMA
    /// — the decode step at 64 sequences was 0.3–2 % slower on them than on cuBLAS, at 2–32
    /// faster; docs/gpu-runs/h200-2026-12-03-wgmma/1-k87/), n a multiple of 64 and k of 64, and weights of at most
    /// `TANDEM_STREAM_GEMM_MAX_MB` (default 64; the larger products cuBLAS already reads near
    /// the copy bandwidth).
    pub fn stream_gemm_takes(&self, m: usize, n: usize, k: usize) -> bool {
        self.stream_gemm_on()
            && self.sm >= 90
            && (2..=self.stream_gemm_max_rows()).contains(&m)
            && n.is_multiple_of(STREAM_COLS)
            && k.is_multiple_of(STREAM_KSTEP)
            && 2 * n * k <= self.stream_gemm_max_bytes
    }

    /// The `gemm_stream` kernel for a tile of `rows` rows of A.
    fn stream_kernel(&self, rows: usize) -> &CudaFunction {
        match rows {
            8 => &self.k.gemm_stream[0],
            16 => &self.k.gemm_stream[1],
            32 => &self.k.gemm_stream[2],
            _ => &self.k.gemm_stream[3],
        }
    }

    /// [`Gpu::gemm`] of 2–64 rows on a `gemm_stream` kernel ([`Gpu::stream_gemm_takes`]): 64
    /// columns a CTA, k cut into [`stream_slices`] run as one cluster.
    pub(super) fn stream_gemm(
        &self,
        mnk: (usize, usize, usize),
        a: u64,
        w: u64,
        (c, c_f32): (u64, bool),
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let mode = (accumulate as i32, (!c_f32) as i32, 0);
        // SAFETY: the caller's a (m×k), w (n×k), c (m×n, f32 or 16-bit as `c_f32` says), with
        // the shape `stream_gemm_takes` allowed.
        unsafe { self.launch_stream(mnk, (a, w, c), mode) }
    }

    /// Launches `gemm_streamR` over `(a, w, c)` for `(m, n, k)` with `(accumulate, out16, glu)`:
    /// grid (n / 64, slices), or (n / 32, slices) gated, where n is the output's width and the
    /// slices are the plain product's of `n` (gated: `2n`) columns, so a gated product adds
    /// every sum in the plain one's order.
    ///
    /// # Safety
    /// gemm_streamR(const h16* a, const h16* w, void* c, int M, int N, int K, int KS,
    /// int accumulate, int out16, int glu): `a` must address m×k values, `w` n×k (gated: 2n×k),
    /// `c` m×n (f32 unless out16); n a multiple of 64 (gated: 32), k of 64, every pointer
    /// 16-byte aligned, so each copied chunk and each 4-column store is whole and aligned.
    unsafe fn launch_stream(
        &self,
        (m, n, k): (usize, usize, usize),
        (a, w, c): (u64, u64, u64),
        (acc, out16, glu): (i32, i32, i32),
    ) -> Result<(), CudaError> {
        let rows = stream_tile_rows(m);
        let (cols, width) = if glu != 0 { (STREAM_COLS / 2, 2 * n) } else { (STREAM_COLS, n) };
        let slices = stream_slices(width, k, self.num_sms, self.stream_gemm_fill);
        let cfg = LaunchConfig {
            grid_dim: ((n / cols) as u32, slices as u32, 1),
            block_dim: (STREAM_THREADS, 1, 1),
            shared_mem_bytes: stream_smem_bytes(rows) as u32,
        };
        let (mi, ni, ki, ks) = (m as i32, n as i32, k as i32, (k / slices) as i32);
        let args: [&dyn super::KernelArg; 10] =
            [&a, &w, &c, &mi, &ni, &ki, &ks, &acc, &out16, &glu];
        // SAFETY: forwarded to the caller; k / slices is a whole number of stages.
        unsafe { self.launch_cluster(self.stream_kernel(rows), cfg, slices as u32, &args) }
    }

    /// Whether [`Gpu::gemm_glu`] takes a gated product of `m` rows, `f` features over `k`.
    pub fn gemm_glu_takes(&self, m: usize, f: usize, k: usize) -> bool {
        self.use_gemm_glu.load(Relaxed)
            && f.is_multiple_of(STREAM_COLS / 2)
            && self.stream_gemm_takes(m, 2 * f, k)
    }

    /// `out[m×f] = act(A · W_gateᵀ) · (A · W_upᵀ)` in the 16-bit type, `gate_up` the fused
    /// `[gate; up]` matrix (2f × k), act SiLU or (`gelu`) GELU's tanh form, on a
    /// `gemm_stream` kernel: bit for bit [`Gpu::gemm`] of the 2f columns to the 16-bit type
    /// followed by the `silu_mul` kernel, one kernel and no gate|up in memory. Returns false
    /// (and does nothing) where [`Gpu::gemm_glu_takes`] says no.
    pub fn gemm_glu(
        &self,
        (m, f, k): (usize, usize, usize),
        a: u64,
        gate_up: u64,
        out: u64,
        gelu: bool,
    ) -> Result<bool, CudaError> {
        if !self.gemm_glu_takes(m, f, k) || !(a | gate_up | out).is_multiple_of(16) {
            return Ok(false);
        }
        let glu = if gelu { 2 } else { 1 };
        // SAFETY: gate_up is the 2f × k matrix, out m × f 16-bit; f a multiple of 32 and the
        // rest as `gemm_glu_takes` and the alignment test above allowed.
        unsafe { self.launch_stream((m, f, k), (a, gate_up, out), (0, 1, glu))? };
        Ok(true)
    }

    /// [`Gpu::gemm`] of one row (f32 or 16-bit out) on the `gemv` kernel: one warp per row of `w` over
    /// the whole of `k`, or per two rows where that still leaves 8 warps per SM; no split of
    /// k. On an H100 it beat cuBLAS for one row (the SmolLM2-135M shape's step 13 % faster)
    /// and lost from two on (docs/gpu-runs/h100-2026-11-28-step-kernels/5-gemv/).
    pub(super) fn gemv(
        &self,
        n: usize,
        k: usize,
        a: u64,
        w: u64,
        (c, c_f32): (u64, bool),
        accumulate: bool,
    ) -> Result<(), CudaError> {
        const WARPS: usize = 4;
        let r = if n / 2 >= 8 * self.num_sms { 2 } else { 1 };
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(r * WARPS) as u32, 1, 1),
            block_dim: (32 * WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ni, ki, ri, acc) = (n as i32, k as i32, r as i32, accumulate as i32);
        let out16 = (!c_f32) as i32;
        // SAFETY: gemv(const h16* a, const h16* w, void* y, int N, int K, int R,
        // int accumulate, int out16): the caller's a (1×k), w (n×k) and c (1×n, f32 or 16-bit
        // as `c_f32` says); k a multiple of 8, so every row starts 16-byte aligned.
        unsafe { self.launch(&self.k.gemv, cfg, &[&a, &w, &c, &ni, &ki, &ri, &acc, &out16]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_fill_the_gpu_with_whole_stages() {
        // Qwen3-0.6B's products on 132 SMs, one CTA an SM wanted.
        assert_eq!(stream_slices(4096, 1024, 132, 1.0), 4); // 64 tiles: 256 CTAs (2: 128)
        assert_eq!(stream_slices(6144, 1024, 132, 1.0), 2); // 96 tiles: 192
        assert_eq!(stream_slices(1024, 2048, 132, 1.0), 8); // 16 tiles: 128, the most
        assert_eq!(stream_slices(1024, 3072, 132, 1.0), 8); // 48 stages
                                                            // Enough tiles alone: no cut.
        assert_eq!(stream_slices(65536, 1024, 132, 1.0), 1);
        // The SmolLM2 shape's k of 576 is 9 stages: 3 slices of 3, not a power of two.
        assert_eq!(stream_slices(960, 576, 132, 1.0), 3);
        assert_eq!(stream_slices(576, 1536, 132, 1.0), 8);
        // No slice shorter than a stage.
        assert_eq!(stream_slices(64, 128, 132, 1.0), 2);
        assert_eq!(stream_slices(64, 64, 132, 1.0), 1);
        for (n, k) in [(960, 576), (3072, 576), (576, 1536), (4096, 4096), (128, 448)] {
            for fill in [0.5, 1.0, 1.5, 3.0] {
                let s = stream_slices(n, k, 132, fill);
                let ok = (1..=STREAM_MAX_SLICES).contains(&s) && k % (STREAM_KSTEP * s) == 0;
                assert!(ok, "{n}x{k} fill {fill}: {s}");
            }
        }
    }

    #[test]
    fn tiles_hold_every_row_in_the_stages() {
        for m in 2..=STREAM_MAX_ROWS {
            let r = stream_tile_rows(m);
            assert!(r >= m && [8, 16, 32, 64].contains(&r), "{m}: {r}");
            // The f32 partial tile (rows × (64 + 4) floats) reuses the stages' memory.
            assert!(r * (STREAM_COLS + 4) * 4 <= stream_smem_bytes(r));
        }
        assert_eq!(stream_smem_bytes(64), 65536 + 1024);
    }
}
