//! The paged-attention kernels' parameters, and attention of long chunks through cuBLAS: the
//! sequence's K and V gathered from the paged cache, scores and softmax materialised, then the
//! weighted sum.

use cudarc::driver::LaunchConfig;

use super::CudaBackend;
use crate::device::{ptr, Dtype, KernelArg, Operand};
use crate::plan::LongSeq;
use crate::CudaError;

/// One layer's parameters of every paged-attention kernel (`ATTENTION_ARGS` in
/// kernels/attention.cu), in their order: device pointers, then sizes, scale and window.
#[derive(Clone, Copy)]
pub(super) struct PagedAttention {
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    /// The tile entries this launch takes.
    pub tiles: u64,
    pub block_tables: u64,
    pub out: u64,
    pub part_acc: u64,
    pub part_ml: u64,
    pub split_count: u64,
    pub num_tokens: i32,
    pub nh: i32,
    pub nkv: i32,
    pub hd: i32,
    pub block_size: i32,
    pub scale: f32,
    /// Positions a row sees (i32::MAX: all).
    pub window: i32,
}

impl PagedAttention {
    /// The kernel arguments, in `ATTENTION_ARGS`'s order.
    pub fn args(&self) -> [&dyn KernelArg; 16] {
        [
            &self.q,
            &self.k_cache,
            &self.v_cache,
            &self.tiles,
            &self.block_tables,
            &self.out,
            &self.part_acc,
            &self.part_ml,
            &self.split_count,
            &self.num_tokens,
            &self.nh,
            &self.nkv,
            &self.hd,
            &self.block_size,
            &self.scale,
            &self.window,
        ]
    }
}

impl CudaBackend {
    /// Attention of one long chunk through cuBLAS: gather the sequence's K/V per query head,
    /// S = Q·Kᵀ·scale (f32), causal softmax to 16-bit P, O = P·V written into the chunk's rows of
    /// the attention output. Rows are processed in chunks that fit the score buffer.
    /// `cache`: the layer's K and V caches and its KV group's block tables.
    pub(super) fn attend_long(
        &self,
        s: &LongSeq,
        cache: (u64, u64, u64),
        scale: f32,
        window: i32,
    ) -> Result<(), CudaError> {
        let (g, c, a) = (&self.gpu, &self.cfg, &self.a);
        let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let ctx = s.pos0 + s.len;
        let (kg, vg) = (ptr(&a.kg), ptr(&a.vg));
        let (kc, vc, bt) = cache;
        let bt = bt + 4 * s.bt_off as u64;
        let cfg = LaunchConfig {
            grid_dim: (ctx as u32, nh as u32, 1),
            block_dim: ((hd / 8) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ci, nhi, nkvi, hdi, bsi) =
            (ctx as i32, nh as i32, nkv as i32, hd as i32, self.block_size as i32);
        // SAFETY: gather_kv's parameters; kg/vg hold nh × max_model_len × hd ≥ nh × ctx × hd.
        unsafe {
            g.launch(&g.k.gather_kv, cfg, &[&kc, &vc, &bt, &kg, &vg, &ci, &nhi, &nkvi, &hdi, &bsi])?
        };
        let rows_cap = (a.scores.len() / (nh * ctx)).max(1);
        let mut r0 = 0;
        while r0 < s.len {
            let n = (s.len - r0).min(rows_cap);
            // Positions this chunk of rows can see.
            let cctx = s.pos0 + r0 + n;
            let qrow = (s.row0 + r0) * nh * hd;
            let k = Operand { ptr: kg, ld: hd, stride: ctx * hd, trans: true };
            let sc = Operand { ptr: ptr(&a.scores), ld: cctx, stride: n * cctx, trans: false };
            let q = Operand {
                ptr: ptr(&a.q16) + 2 * qrow as u64,
                ld: nh * hd,
                stride: hd,
                trans: false,
            };
            g.gemm_batched(Dtype::F16, cctx, n, hd, scale, k, q, 0.0, sc, true, nh)?;
            let (ni, cci, p0) = (n as i32, cctx as i32, (s.pos0 + r0) as i32);
            let cfg = LaunchConfig {
                grid_dim: (n as u32, nh as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: softmax_causal over nh × n × cctx scores (≤ the buffer by rows_cap).
            unsafe {
                g.launch(
                    &g.k.softmax_causal,
                    cfg,
                    &[&ptr(&a.scores), &ptr(&a.probs), &ni, &cci, &p0, &window],
                )?
            };
            let v = Operand { ptr: vg, ld: hd, stride: ctx * hd, trans: false };
            let p = Operand { ptr: ptr(&a.probs), ld: cctx, stride: n * cctx, trans: false };
            if g.dtype == Dtype::F16 {
                let o = Operand {
                    ptr: ptr(&a.att) + 2 * qrow as u64,
                    ld: nh * hd,
                    stride: hd,
                    trans: false,
                };
                g.gemm_batched(Dtype::F16, hd, n, cctx, 1.0, v, p, 0.0, o, false, nh)?;
            } else {
                let o = Operand {
                    ptr: ptr(&a.o32) + 4 * qrow as u64,
                    ld: nh * hd,
                    stride: hd,
                    trans: false,
                };
                g.gemm_batched(Dtype::F16, hd, n, cctx, 1.0, v, p, 0.0, o, true, nh)?;
                let (src, dst, cnt) = (
                    ptr(&a.o32) + 4 * qrow as u64,
                    ptr(&a.att) + 2 * qrow as u64,
                    (n * nh * hd) as i64,
                );
                let cfg = LaunchConfig {
                    grid_dim: ((g.num_sms * 4) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: to_model(const float*, h16*, long long) over the chunk's rows.
                unsafe { g.launch(&g.k.to_model, cfg, &[&src, &dst, &cnt])? };
            }
            r0 += n;
        }
        Ok(())
    }
}
