//! q/k norm + RoPE + KV store of a layer's rows: as a kernel of its own (`qkv_rope_store*`),
//! or fused into the small-tile decode kernel (`attention_dec_rope*`), which then also attends.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::attention::PagedAttention;
use super::CudaBackend;
use crate::device::{ptr, KernelArg};
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
    pub qkv_bias: u64,
    /// 1 for interleaved rotation pairs, 0 for halves.
    pub interleaved: i32,
    /// The norms' epsilon.
    pub eps: f32,
}

impl RopeInputs {
    /// The fused decode kernel's parameters after the paged-attention ones, in
    /// `ROPE_FUSED_ARGS`'s order (kernels/attention_decode.cu).
    pub fn fused_args(&self) -> [&dyn KernelArg; 9] {
        [
            &self.qkv,
            &self.pos,
            &self.slot,
            &self.inv_freq,
            &self.q_norm,
            &self.k_norm,
            &self.qkv_bias,
            &self.interleaved,
            &self.eps,
        ]
    }
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
                    &r.qkv_bias,
                    &num_tokens,
                    &per_warp,
                ],
            )
        }
    }

    /// Attention of `num_tiles` small-tile entries on `f` (an `attention_dec_rope*` kernel),
    /// which norms, rotates and stores the rows of `r` first.
    pub(super) fn attend_fused(
        &self,
        f: &CudaFunction,
        num_tiles: usize,
        att: &PagedAttention,
        r: &RopeInputs,
    ) -> Result<(), CudaError> {
        let hd = self.cfg.head_dim;
        let cfg = LaunchConfig {
            grid_dim: (att.nkv as u32, num_tiles as u32, 1),
            block_dim: (32 * plan::dec_warps(hd) as u32, 1, 1),
            shared_mem_bytes: plan::dec_smem_bytes(hd),
        };
        let args: Vec<&dyn KernelArg> = att.args().into_iter().chain(r.fused_args()).collect();
        // SAFETY: the paged-attention parameters, then qkv_rope_store's inputs, over buffers
        // sized for the layer's rows and `num_tiles` tile entries.
        unsafe { self.gpu.launch(f, cfg, &args) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::attention::PagedAttention;
    use super::RopeInputs;
    use crate::device::KERNEL_SOURCE;

    /// The parameter names of the kernel source's `#define NAME` list of declarations.
    fn params(name: &str) -> Vec<String> {
        let at = KERNEL_SOURCE.find(&format!("#define {name}")).expect("the macro");
        let mut decl = String::new();
        for line in KERNEL_SOURCE[at..].lines() {
            decl.push_str(line.trim_end_matches('\\'));
            if !line.ends_with('\\') {
                break;
            }
        }
        let decl = decl.trim_start_matches(&format!("#define {name}"));
        decl.split(',').map(|p| p.split_whitespace().last().expect("a name").to_string()).collect()
    }

    /// The host's argument lists follow the kernels' parameter lists, name for name: each
    /// argument is the field of that name (a swapped pair would launch with wrong pointers,
    /// which only a GPU would show).
    #[test]
    fn launch_arguments_follow_the_kernels_parameters() {
        let p = PagedAttention {
            q: 1,
            k_cache: 2,
            v_cache: 3,
            tiles: 4,
            block_tables: 5,
            out: 6,
            part_acc: 7,
            part_ml: 8,
            split_count: 9,
            num_tokens: 10,
            nh: 11,
            nkv: 12,
            hd: 13,
            block_size: 14,
            scale: 15.0,
            window: 16,
        };
        let field = |n: &str| -> *const u8 {
            match n {
                "q" => &p.q as *const u64 as _,
                "k_cache" => &p.k_cache as *const u64 as _,
                "v_cache" => &p.v_cache as *const u64 as _,
                "tiles" => &p.tiles as *const u64 as _,
                "block_tables" => &p.block_tables as *const u64 as _,
                "out" => &p.out as *const u64 as _,
                "part_acc" => &p.part_acc as *const u64 as _,
                "part_ml" => &p.part_ml as *const u64 as _,
                "split_count" => &p.split_count as *const u64 as _,
                "num_tokens" => &p.num_tokens as *const i32 as _,
                "nh" => &p.nh as *const i32 as _,
                "nkv" => &p.nkv as *const i32 as _,
                "hd" => &p.hd as *const i32 as _,
                "block_size" => &p.block_size as *const i32 as _,
                "scale" => &p.scale as *const f32 as _,
                "window" => &p.window as *const i32 as _,
                other => panic!("no field for the kernels' parameter `{other}`"),
            }
        };
        let names = params("ATTENTION_ARGS");
        assert_eq!(names.len(), 16, "{names:?}");
        for (a, n) in p.args().iter().zip(&names) {
            assert_eq!(a.param() as *const u8, field(n), "argument for `{n}`");
        }
        let r = RopeInputs {
            qkv: 1,
            pos: 2,
            slot: 3,
            inv_freq: 4,
            q_norm: 5,
            k_norm: 6,
            qkv_bias: 7,
            interleaved: 8,
            eps: 9.0,
        };
        let rfield = |n: &str| -> *const u8 {
            match n {
                "qkv" => &r.qkv as *const u64 as _,
                "pos" => &r.pos as *const u64 as _,
                "slot" => &r.slot as *const u64 as _,
                "inv_freq" => &r.inv_freq as *const u64 as _,
                "q_norm" => &r.q_norm as *const u64 as _,
                "k_norm" => &r.k_norm as *const u64 as _,
                "qkv_bias" => &r.qkv_bias as *const u64 as _,
                "interleaved" => &r.interleaved as *const i32 as _,
                "eps" => &r.eps as *const f32 as _,
                other => panic!("no field for the kernels' parameter `{other}`"),
            }
        };
        let names = params("ROPE_FUSED_ARGS");
        assert_eq!(names.len(), 9, "{names:?}");
        for (a, n) in r.fused_args().iter().zip(&names) {
            assert_eq!(a.param() as *const u8, rfield(n), "argument for `{n}`");
        }
    }
}
