//! Decode steps through CUDA graphs: one graph per captured batch size, replayed with the
//! uploaded plan's inputs (`BatchPlan::padded_decode` puts them at fixed places).

use cudarc::driver::sys as dsys;
use tandem_engine::backend::ForwardBatch;

use super::{CudaBackend, DecodeGraph};
use crate::plan::{self, BatchPlan};
use crate::CudaError;

impl CudaBackend {
    /// Replays (capturing first if needed) the decode graph of `size` sequences over the
    /// uploaded padded plan.
    pub(super) fn replay(&mut self, size: usize) -> Result<(), CudaError> {
        if !self.graphs.contains_key(&size) {
            self.capture(size)?;
        }
        self.graphs[&size].0.launch().map_err(CudaError::from)
    }

    /// The decode step `b` as the graph of `size` sequences reads it: padded to that size,
    /// its contexts cut into splits, the entries padded to the graph's grid. `None` when `b` is
    /// not a decode step that fits.
    pub(super) fn graph_plan(&self, b: &ForwardBatch, size: usize) -> Option<BatchPlan> {
        let mut p = BatchPlan::padded_decode(b, size, self.max_blocks_per_seq)?;
        let entries = self.graph_entries(size);
        if entries > size {
            p.split_contexts(self.splits(size, size, p.max_context), Some(entries));
        }
        Some(p)
    }

    pub(super) fn capture(&mut self, size: usize) -> Result<(), CudaError> {
        let start = std::time::Instant::now();
        let entries = self.graph_entries(size);
        let layers = self.cfg.num_layers;
        // Where `BatchPlan::padded_decode` puts each group's slots and tables for this size.
        let sections = (size, size * self.max_blocks_per_seq);
        // One eager run first: loads every kernel and lets cuBLAS pick its algorithms.
        let tiling = (entries, self.group() <= 8);
        self.enqueue(size, tiling, (&[], 0), sections, layers, size, 0)?;
        self.gpu.sync()?;
        let s = self.gpu.stream.clone();
        s.begin_capture(dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::from)?;
        let r = self.enqueue(size, tiling, (&[], 0), sections, layers, size, 0);
        let graph = s.end_capture(dsys::CUgraphInstantiate_flags(0)).map_err(CudaError::from)?;
        r?;
        let graph =
            graph.ok_or_else(|| CudaError::Driver("graph capture produced no graph".into()))?;
        graph.upload().map_err(CudaError::from)?;
        self.graphs.insert(size, DecodeGraph(graph));
        self.capture_seconds += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// GPU time of one replay of the decode graph that serves `b` (a decode step), median of
    /// `reps` replays in ms; captures the graph if needed. Logits stay on the device.
    pub fn replay_ms(&mut self, b: &ForwardBatch, reps: usize) -> Result<f64, CudaError> {
        self.validate(b).map_err(|e| CudaError::Unsupported(e.to_string()))?;
        let size = plan::graph_size_for(&self.graph_sizes, b.num_tokens())
            .ok_or_else(|| CudaError::Unsupported("batch larger than every graph".into()))?;
        let p = self
            .graph_plan(b, size)
            .ok_or_else(|| CudaError::Unsupported("not a decode step".into()))?;
        self.gpu.bind()?;
        self.upload_plan(&p)?;
        if !self.graphs.contains_key(&size) {
            self.capture(size)?;
        }
        let g = &self.graphs[&size].0;
        crate::device::time_ms(&self.gpu, 3, reps, || g.launch().map_err(CudaError::from))
    }

    /// Captures the decode graphs of every size up front (`progress` is told each size).
    pub fn capture_all(&mut self, mut progress: impl FnMut(usize, usize)) -> Result<(), CudaError> {
        // Inert inputs: padding rows only, so the eager warm-up run stores nothing.
        let Some(&max) = self.graph_sizes.last() else { return Ok(()) };
        let entries = self.graph_sizes.iter().map(|&s| self.graph_entries(s)).max().unwrap_or(0);
        let p = BatchPlan {
            logits_rows: (0..max as i32).collect(),
            tiles: vec![0; entries * plan::TILE_INTS],
            ..BatchPlan::inert(max, self.max_blocks_per_seq, self.kv_groups.num_groups())
        };
        self.upload_plan(&p)?;
        let sizes = self.graph_sizes.clone();
        for (i, &s) in sizes.iter().enumerate().rev() {
            if !self.graphs.contains_key(&s) {
                self.capture(s)?;
            }
            progress(sizes.len() - i, sizes.len());
        }
        Ok(())
    }
}
