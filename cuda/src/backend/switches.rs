//! The backend's switches and measurements: which attention kernels a pass takes, how many
//! ways a context splits, the comparisons benchmarks flip (graphs, tensor cores, tile order),
//! and per-stage GPU time of an eager pass.

use cudarc::driver::sys as dsys;
use tandem_engine::backend::ForwardBatch;

use super::{CudaBackend, SPLIT_ROWS};
use crate::plan;
use crate::CudaError;

impl CudaBackend {
    /// Turns decode-graph replay on or off (off: every step runs eagerly).
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on && !self.graph_sizes.is_empty();
    }

    /// Prompt chunks of at least `n` tokens attend through cuBLAS GEMMs from now on.
    pub fn set_long_prompt_min(&mut self, n: usize) {
        self.opts.long_prompt_min_tokens = n;
    }

    /// Context splits of the attention kernel for `rows` query rows in `tiles` tiles (the
    /// partial results of more than one split are kept for at most SPLIT_ROWS rows).
    pub(super) fn splits(&self, rows: usize, tiles: usize, max_context: usize) -> usize {
        if rows > SPLIT_ROWS {
            return 1;
        }
        plan::attention_splits(tiles, self.cfg.num_kv_heads, max_context, self.gpu.num_sms)
            .min(plan::MAX_SPLITS)
    }

    /// Tile entries of the decode graph of `size` sequences: the splits of the longest context
    /// it may see (the grid is fixed at capture; a replay's shorter contexts take fewer).
    pub(super) fn graph_entries(&self, size: usize) -> usize {
        size * self.splits(size, size, self.opts.max_model_len)
    }

    /// The tensor-core attention kernel for this model, when the device, head width and block
    /// size allow it and it is not switched off.
    pub(super) fn mma_kernel(&self) -> Option<&cudarc::driver::CudaFunction> {
        if !self.use_mma || self.gpu.sm < 80 || !self.block_size.is_multiple_of(16) {
            return None;
        }
        match self.cfg.head_dim {
            64 => Some(&self.gpu.k.attention_mma64),
            128 => Some(&self.gpu.k.attention_mma128),
            _ => None,
        }
    }

    /// The tensor-core kernel for tiles of at most 8 query rows (positions on the mma's M), where
    /// the tensor-core kernel applies and this one is not switched off.
    pub(super) fn dec_kernel(&self) -> Option<&cudarc::driver::CudaFunction> {
        self.mma_kernel()?;
        if !self.use_dec {
            return None;
        }
        match self.cfg.head_dim {
            64 => Some(&self.gpu.k.attention_dec64),
            _ => Some(&self.gpu.k.attention_dec128),
        }
    }

    /// The small-tile kernel with q/k norm + RoPE + KV store fused in, where the small-tile
    /// kernel applies and the fusion is not switched off.
    pub(super) fn fused_rope_kernel(&self) -> Option<&cudarc::driver::CudaFunction> {
        self.dec_kernel()?;
        if !self.fuse_rope {
            return None;
        }
        match self.cfg.head_dim {
            64 => Some(&self.gpu.k.attention_dec_rope64),
            _ => Some(&self.gpu.k.attention_dec_rope128),
        }
    }

    /// Runs q/k norm + RoPE + KV store inside the small-tile decode kernel where a step allows
    /// it (on by default), or as a kernel of its own (for comparisons); drops the captured graphs.
    pub fn set_fused_rope(&mut self, on: bool) {
        self.fuse_rope = on;
        self.drop_graphs();
    }

    /// Whether the attention tiles of a step of `seqs` sequences, at most `rows` query rows a
    /// tile, take the small-tile kernel ([`plan::small_tiles`]).
    pub(super) fn small_tiles(&self, rows: usize, seqs: usize) -> bool {
        plan::small_tiles(rows, self.group(), seqs * self.cfg.num_kv_heads)
    }

    /// Products of one row on the `gemv` kernel (on, the default) or cuBLAS (off), for
    /// comparison; drops the captured graphs.
    pub fn set_gemv(&mut self, on: bool) {
        self.gpu.set_gemv(on);
        self.drop_graphs();
    }

    /// Products of 2–64 rows on the `gemm_stream` kernels (on, the default on sm_90) or cuBLAS
    /// (off), for comparison; drops the captured graphs.
    pub fn set_stream_gemm(&mut self, on: bool) {
        self.gpu.set_stream_gemm(on);
        self.drop_graphs();
    }

    /// Uses the small-tile tensor-core kernel for decode tiles (on by default), or the 16-row
    /// one for every tile (for comparisons). Graphs captured before keep their kernel.
    pub fn set_dec_attention(&mut self, on: bool) {
        self.use_dec = on;
        self.drop_graphs();
    }

    /// The flash-attention prefill kernel for long chunks, where the tensor-core kernel applies.
    pub(super) fn prefill_kernel(&self) -> Option<&cudarc::driver::CudaFunction> {
        self.mma_kernel()?;
        match self.cfg.head_dim {
            64 => Some(&self.gpu.k.attention_prefill64),
            _ => Some(&self.gpu.k.attention_prefill128),
        }
    }

    /// Uses the tensor-core attention kernel where it applies (on by default), or the CUDA-core
    /// tile kernels everywhere (for comparisons). Graphs captured before keep their kernel.
    pub fn set_mma_attention(&mut self, on: bool) {
        self.use_mma = on;
        self.drop_graphs();
    }

    /// Starts the attention tiles longest context first (the default), or in the batch's
    /// order: for measuring what the order gains (`tandem-gpu bench-decode` with a spread of
    /// contexts).
    pub fn set_longest_first(&mut self, on: bool) {
        self.longest_first = on;
    }

    /// Records the start of stage `name` when profiling (eager runs only).
    pub(super) fn mark(&self, name: &'static str) -> Result<(), CudaError> {
        if let Some(marks) = self.marks.borrow_mut().as_mut() {
            let e = self
                .gpu
                .ctx
                .new_event(Some(dsys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(CudaError::from)?;
            e.record(&self.gpu.stream).map_err(CudaError::from)?;
            marks.push((name, e));
        }
        Ok(())
    }

    /// GPU time per stage of one eager forward pass of `b`, ms, summed over layers.
    pub fn profile(&mut self, b: &ForwardBatch) -> Result<Vec<(&'static str, f64)>, CudaError> {
        self.validate(b).map_err(|e| CudaError::Unsupported(e.to_string()))?;
        let graphs = self.use_graphs;
        self.use_graphs = false;
        *self.marks.borrow_mut() = Some(Vec::new());
        let r = self.run(b, self.cfg.num_layers);
        self.mark("end")?;
        self.use_graphs = graphs;
        let marks = self.marks.borrow_mut().take().unwrap_or_default();
        r?;
        self.gpu.sync()?;
        let mut out: Vec<(&'static str, f64)> = Vec::new();
        for w in marks.windows(2) {
            let ms = w[0].1.elapsed_ms(&w[1].1).map_err(CudaError::from)? as f64;
            match out.iter_mut().find(|(n, _)| *n == w[0].0) {
                Some(e) => e.1 += ms,
                None => out.push((w[0].0, ms)),
            }
        }
        Ok(out)
    }
}
