//! q/k norm + RoPE + KV store of a layer's rows: as a kernel of its own (`qkv_rope_store*`),
//! or fused into the small-tile decode kernel (`attention_dec_rope*`), which then also attends.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::CudaBackend;
use crate::device::ptr;
use crate::plan;
use crate::CudaError;

/// What q/k norm + RoPE + KV store reads of one layer (device pointers; 0 for an absent norm
/// or bias).
pub(super) struct RopeInputs {
    /// The q|k|v GEMM's rows (f32).
    pub qkv: u64,
    /// Each row's position.
    pub pos: u64,
    /// Each row's KV slot in this layer's KV group (-1: not stored).
    pub slot: u64,
    /// RoPE inverse frequencies.
    pub inv_freq: u64,
    /// Per-head q norm weights (Qwen3, Gemma 3), or 0.
    pub q_norm: u64,
    /// Per-head k norm weights, or 0.
    pub k_norm: u64,
    /// q|k|v bias (Qwen2), or 0.
    pub bias: u64,
    /// 1 for interleaved rotation pairs, 0 for halves.
    pub interleaved: i32,
    /// The norms' epsilon.
    pub eps: f32,
}

impl CudaBackend {
    /// Norms and rotates the `t` rows' queries into the f32 query buffer (and `q16`, when not
    /// 0), and stores their keys and values in the layer's caches `(k, v)`.
    pub(super) fn rope_store(
        &self,
        t: usize,
        r: &RopeInputs,
        (kc, vc): (u64, u64),
        q16: u64,
    ) -> Result<(), CudaError> {
        let (g, c) = (&self.gpu, &self.cfg);
        let (nh, nkv, hd) = (c.num_heads as i32, c.num_kv_heads as i32, c.head_dim as i32);
        let (cfg, per_warp) =
            crate::device::rope_config(t, c.num_heads + 2 * c.num_kv_heads, c.head_dim);
        let (num_tokens, bs, q) = (t as i32, self.block_size as i32, ptr(&self.a.q));
        // SAFETY: qkv_rope_store's parameters over buffers sized for at least `t` rows.
        unsafe {
            g.launch(
                g.rope_for(c.head_dim, per_warp as usize),
                cfg,
                &[
                    &r.qkv,
                    &r.pos,
                    &r.slot,
                    &r.inv_freq,
                    &r.q_norm,
                    &r.k_norm,
                    &q,
                    &q16,
                    &kc,
                    &vc,
                    &nh,
                    &nkv,
                    &hd,
                    &r.interleaved,
                    &r.eps,
                    &bs,
                    &r.bias,
                    &num_tokens,
                    &per_warp,
                ],
            )
        }
    }

    /// Attention of `num_tiles` small-tile entries over `t` rows on `f` (an
    /// `attention_dec_rope*` kernel), which norms, rotates and stores the rows first: `cache`
    /// is the layer's K and V caches and its KV group's block tables.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_fused(
        &self,
        f: &CudaFunction,
        t: usize,
        num_tiles: usize,
        r: &RopeInputs,
        (kc, vc, bt): (u64, u64, u64),
        scale: f32,
        window: i32,
    ) -> Result<(), CudaError> {
        let (g, c, a) = (&self.gpu, &self.cfg, &self.a);
        let (nh, nkv, hd) = (c.num_heads as i32, c.num_kv_heads as i32, c.head_dim as i32);
        let cfg = LaunchConfig {
            grid_dim: (nkv as u32, num_tiles as u32, 1),
            block_dim: (32 * plan::dec_warps(c.head_dim) as u32, 1, 1),
            shared_mem_bytes: plan::dec_smem_bytes(c.head_dim),
        };
        let (q, tiles, att) = (ptr(&a.q), ptr(&a.tiles), ptr(&a.att));
        let (pa, pm, pc) = (ptr(&a.part_acc), ptr(&a.part_ml), ptr(&a.split_count));
        let (ti, bs) = (t as i32, self.block_size as i32);
        // SAFETY: the paged-attention parameters, then qkv_rope_store's inputs, over buffers
        // sized for at least `t` rows and `num_tiles` tile entries.
        unsafe {
            g.launch(
                f,
                cfg,
                &[
                    &q,
                    &kc,
                    &vc,
                    &tiles,
                    &bt,
                    &att,
                    &pa,
                    &pm,
                    &pc,
                    &ti,
                    &nh,
                    &nkv,
                    &hd,
                    &bs,
                    &scale,
                    &window,
                    &r.qkv,
                    &r.pos,
                    &r.slot,
                    &r.inv_freq,
                    &r.q_norm,
                    &r.k_norm,
                    &r.bias,
                    &r.interleaved,
                    &r.eps,
                ],
            )
        }
    }
}
