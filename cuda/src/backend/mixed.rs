//! Steps with prompt chunks through CUDA graphs. A decode graph holds only decode steps; a step
//! that also carries prompt chunks (what a server runs whenever requests arrive while others
//! decode) would otherwise launch its few hundred kernels one by one. Such a step is padded to
//! a [`MixedShape`] (rows and logits rows rounded up, attention grids as large as those rows
//! can need) and replayed from the graph captured for that shape: every kernel reads the plan
//! from the same device buffers, so only the launch grids are fixed at capture, and padding
//! rows and tiles do nothing.
//!
//! A shape is captured the second time a step needs it (one-off shapes stay eager), at most
//! [`MAX_MIXED_GRAPHS`] of them; the step that captures runs eagerly first, which also lets
//! cuBLAS choose its algorithms for the shape. A capture that fails costs nothing but the
//! graphs: the step already ran, and later steps run eagerly.

use tandem_engine::backend::ForwardBatch;

use super::{CudaBackend, DecodeGraph, Pass, SPLIT_ROWS};
use crate::plan::{self, BatchPlan, MixedLimits, MixedShape, TILE_INTS};
use crate::CudaError;

/// Most mixed-step graphs one backend keeps.
pub(super) const MAX_MIXED_GRAPHS: usize = 64;

impl CudaBackend {
    /// The shape of the graph that would run the eager plan `p` of `b` (`small`: its tiles
    /// take the small-tile kernel), when such a graph may serve it: a full pass on one GPU with
    /// one KV group, mixed graphs on, within the buffers.
    pub(super) fn mixed_shape(
        &self,
        b: &ForwardBatch,
        p: &BatchPlan,
        small: bool,
    ) -> Option<MixedShape> {
        let eligible = self.use_graphs
            && self.use_mixed_graphs
            && self.tp.is_none()
            && self.kv_groups.num_groups() == 1
            && (p.long.is_empty() || self.prefill_kernel().is_some())
            && b.logits_indices.len() <= self.logits_cap;
        if !eligible {
            return None;
        }
        let long_min = self.opts.long_prompt_min_tokens;
        let lim = MixedLimits {
            split_rows: SPLIT_ROWS,
            split_ctas: plan::split_ctas_per_sm_max() * self.gpu.num_sms,
            num_kv_heads: self.cfg.num_kv_heads,
            long_tile_tokens: (plan::prefill_rows() / self.group()).max(1),
            long_min,
            max_rows: plan::mixed_graph_max_rows(),
        };
        let long_chunks = !p.long.is_empty();
        let shape =
            MixedShape::holding(b.num_tokens(), p.logits_rows.len(), small, long_chunks, &lim)?;
        let rows = self.opts.max_num_batched_tokens.max(self.opts.max_graph_batch);
        let entries = self.a.tiles.len() / TILE_INTS;
        // The bounds hold by construction (plan.rs tests them); checked again here so that
        // a plan outside them runs eagerly rather than failing.
        let fits = shape.rows <= rows
            && shape.logits <= self.logits_cap
            && shape.entries + shape.long_entries <= entries
            && p.num_tiles() <= shape.entries
            && p.num_long_tiles() <= shape.long_entries
            // Split partial results are kept for SPLIT_ROWS rows, at the graph's row stride.
            && (b.num_tokens() > SPLIT_ROWS || shape.rows <= SPLIT_ROWS)
            && long_min >= 1;
        fits.then_some(shape)
    }

    /// Runs the plan `p` of `b` padded to `shape`: replays the shape's graph, or runs eagerly
    /// (capturing the graph when the shape is asked for the second time). The logits rows of
    /// `b` lead the logits buffer, in order, as an eager pass leaves them.
    pub(super) fn mixed_pass(
        &mut self,
        b: &ForwardBatch,
        mut p: BatchPlan,
        shape: MixedShape,
    ) -> Result<Pass, CudaError> {
        let first = b.logits_indices.len();
        p.pad_to(&shape);
        self.upload_plan(&p)?;
        self.take_deferred(b)?;
        if let Some(g) = self.mixed_graphs.get(&shape) {
            g.0.launch().map_err(CudaError::from)?;
            return Ok(Pass::Eager(first));
        }
        let layers = self.cfg.num_layers;
        let launch = |be: &Self| {
            be.enqueue(
                shape.rows,
                (shape.entries, shape.small_tiles),
                (&p.long, shape.long_entries),
                (p.slot_stride, p.bt_stride),
                layers,
                shape.logits,
                0,
            )
        };
        launch(self)?;
        let seen = self.mixed_seen.entry(shape).or_insert(0);
        *seen += 1;
        if *seen >= 2 && self.mixed_graphs.len() < MAX_MIXED_GRAPHS {
            let start = std::time::Instant::now();
            match self.capture_graph(|be, _| launch(be)) {
                Ok((graph, ())) => {
                    self.mixed_graphs.insert(shape, DecodeGraph(graph));
                    let secs = start.elapsed().as_secs_f64();
                    self.capture_seconds += secs;
                    tracing::info!(
                        rows = shape.rows,
                        logits = shape.logits,
                        small_tiles = shape.small_tiles,
                        ms = secs * 1e3,
                        graphs = self.mixed_graphs.len(),
                        "captured a mixed-step graph"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, rows = shape.rows, "a mixed-step graph could not be captured; steps with prompt chunks run eagerly from now on");
                    self.set_mixed_graphs(false);
                }
            }
        }
        Ok(Pass::Eager(first))
    }

    /// Replays steps with prompt chunks from mixed-step graphs (on, the default) or runs them
    /// eagerly (for comparison); off drops the graphs.
    pub fn set_mixed_graphs(&mut self, on: bool) {
        self.use_mixed_graphs = on;
        self.mixed_graphs.clear();
        self.mixed_seen.clear();
    }

    /// Wall time of one full pass of `b`, ms: the median over `reps` runs of `chain` passes
    /// queued back to back (each uploading its plan and launching its kernels or graph, as a
    /// server's steps do) and waited for together, divided by `chain`.
    pub fn step_ms(
        &mut self,
        b: &ForwardBatch,
        chain: usize,
        reps: usize,
    ) -> Result<f64, CudaError> {
        self.validate(b).map_err(|e| CudaError::Unsupported(e.to_string()))?;
        self.gpu.bind()?;
        let (layers, chain) = (self.cfg.num_layers, chain.max(1));
        for _ in 0..3 {
            self.pass(b, layers)?;
        }
        self.gpu.sync()?;
        let mut ts = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            let t0 = std::time::Instant::now();
            for _ in 0..chain {
                self.pass(b, layers)?;
            }
            self.gpu.sync()?;
            ts.push(t0.elapsed().as_secs_f64() * 1e3 / chain as f64);
        }
        ts.sort_by(f64::total_cmp);
        Ok(ts[ts.len() / 2])
    }

    /// Mixed-step graphs captured so far.
    pub fn mixed_graph_count(&self) -> usize {
        self.mixed_graphs.len()
    }
}
