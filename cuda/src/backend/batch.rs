//! A forward batch checked against the backend's limits, uploaded as the kernels' plan and run
//! as one pass (a graph where one fits).

use tandem_engine::backend::{BackendError, ForwardBatch, RowSampling, NO_PAGE};

use std::time::Instant;

use super::host_times::HostTimes;
use super::{CudaBackend, Pass};
use crate::plan::{self, BatchPlan};
use crate::CudaError;

impl CudaBackend {
    pub(crate) fn validate(&self, b: &ForwardBatch) -> Result<(), BackendError> {
        self.validate_with(b, false)
    }

    /// [`CudaBackend::validate`]; deferred tokens are accepted only for a launched pass
    /// (`launched`), one per row of the pass in flight.
    pub(crate) fn validate_with(
        &self,
        b: &ForwardBatch,
        launched: bool,
    ) -> Result<(), BackendError> {
        let t = b.num_tokens();
        let bad = |m: String| Err(BackendError::InvalidBatch(m));
        if !b.deferred.is_empty() && !launched {
            return bad("deferred tokens outside a launched pass".into());
        }
        if b.deferred.len() > self.logits_cap {
            return bad(format!("{} deferred tokens exceed {}", b.deferred.len(), self.logits_cap));
        }
        if t > self.opts.max_num_batched_tokens.max(self.opts.max_graph_batch) {
            return bad(format!(
                "{t} tokens exceed max_num_batched_tokens {}",
                self.opts.max_num_batched_tokens
            ));
        }
        let groups = self.kv_groups.num_groups();
        b.check_layout(groups, self.cfg.vocab_size)?;
        if let Some(&s) = b.slot_mapping.iter().find(|&&s| s as usize >= self.num_slots()) {
            return bad(format!("slot {s} outside the KV cache of {} slots", self.num_slots()));
        }
        if let Some(&i) = b.logits_indices.iter().find(|&&i| i >= t) {
            return bad(format!("logits index {i} outside the batch of {t} tokens"));
        }
        let mut covered = 0;
        let mut bt_total = 0;
        for s in &b.seqs {
            if s.query_start != covered || s.query_len == 0 || s.query_len > s.context_len {
                return bad(format!("sequence slice {s:?} does not tile the batch"));
            }
            if s.context_len > self.opts.max_model_len {
                return bad(format!(
                    "context of {} tokens exceeds max_model_len {}",
                    s.context_len, self.opts.max_model_len
                ));
            }
            if s.context_len.div_ceil(self.block_size) * groups > s.block_table.len()
                || !s.block_table.len().is_multiple_of(groups)
            {
                return bad(format!(
                    "context of {} tokens needs more than {} pages of {groups} groups",
                    s.context_len,
                    s.block_table.len()
                ));
            }
            let outside = |&&x: &&u32| x != NO_PAGE && x as usize >= self.num_blocks;
            if let Some(&blk) = s.block_table.iter().find(outside) {
                return bad(format!("block {blk} outside the pool of {}", self.num_blocks));
            }
            covered += s.query_len;
            bt_total += s.block_table.len();
        }
        if covered != t {
            return bad(format!("sequences cover {covered} of {t} tokens"));
        }
        if bt_total > self.a.block_tables.len() {
            return bad(format!("block tables of {bt_total} entries exceed the device buffer"));
        }
        Ok(())
    }

    /// One sampling row per logits row of the batch.
    pub(crate) fn check_sampling_rows(
        b: &ForwardBatch,
        rows: &[RowSampling],
    ) -> Result<(), BackendError> {
        if rows.len() != b.logits_indices.len() {
            return Err(BackendError::InvalidBatch(format!(
                "{} sampling rows for {} logits rows",
                rows.len(),
                b.logits_indices.len()
            )));
        }
        Ok(())
    }

    pub(super) fn upload_plan(&mut self, p: &BatchPlan) -> Result<(), CudaError> {
        let g = &self.gpu;
        g.write(&mut self.a.tokens, &p.tokens)?;
        g.write(&mut self.a.positions, &p.positions)?;
        g.write(&mut self.a.slots, &p.slots)?;
        // The prefill kernel's tiles after the others (at most one tile per row in all).
        if self.longest_first {
            g.write(&mut self.a.tiles, &p.tiles)?;
            g.write_at(&mut self.a.tiles, p.tiles.len(), &p.long_tiles)?;
        } else {
            let (mut tiles, mut long) = (p.tiles.clone(), p.long_tiles.clone());
            plan::batch_order(&mut tiles);
            plan::batch_order(&mut long);
            g.write(&mut self.a.tiles, &tiles)?;
            g.write_at(&mut self.a.tiles, tiles.len(), &long)?;
        }
        g.write(&mut self.a.block_tables, &p.block_tables)?;
        g.write(&mut self.a.logits_rows, &p.logits_rows)
    }

    /// Runs a pass, through a graph when one fits, leaving logits on the device: a graph's row
    /// `i` is token `i`'s; an eager pass holds the first `Eager(k)` rows of `b.logits_indices`
    /// in order (the rest come from [`CudaBackend::head_only`] in chunks).
    pub(super) fn pass(&mut self, b: &ForwardBatch, num_layers: usize) -> Result<Pass, CudaError> {
        self.gpu.bind()?;
        let n = b.num_tokens();
        let full = num_layers >= self.cfg.num_layers;
        let mut clock = Instant::now();
        // A decode graph leaves token i's logits in row i: it runs a batch that asks for every
        // token's, in order (the runner's always do), so its rows are the ones asked for.
        let every_row = b.logits_indices.len() == n && b.logits_in_order();
        if full && self.use_graphs && every_row {
            if let Some(size) = plan::graph_size_for(&self.graph_sizes, n) {
                if let Some(p) = self.graph_plan(b, size) {
                    HostTimes::lap(&mut self.host_times.plan, &mut clock);
                    self.upload_plan(&p)?;
                    self.take_deferred(b)?;
                    HostTimes::lap(&mut self.host_times.upload, &mut clock);
                    self.replay(size)?;
                    HostTimes::lap(&mut self.host_times.graph, &mut clock);
                    return Ok(Pass::Graph);
                }
            }
        }
        let long_min = if self.gemm_attention { 1 } else { self.opts.long_prompt_min_tokens };
        let mut p = BatchPlan::new(b, self.cfg.num_heads / self.cfg.num_kv_heads, long_min);
        let splits = self.splits(n, p.num_tiles(), p.max_context);
        if splits > 1 {
            p.split_contexts(splits, None);
        }
        let small = self.small_tiles(p.max_tile_rows(self.group()), b.seqs.len());
        if let Some(shape) = self.mixed_shape(b, &p, small).filter(|_| full) {
            HostTimes::lap(&mut self.host_times.plan, &mut clock);
            let r = self.mixed_pass(b, p, shape);
            HostTimes::lap(&mut self.host_times.mixed, &mut clock);
            return r;
        }
        HostTimes::lap(&mut self.host_times.plan, &mut clock);
        self.upload_plan(&p)?;
        self.take_deferred(b)?;
        HostTimes::lap(&mut self.host_times.upload, &mut clock);
        let first = p.logits_rows.len().min(self.logits_cap);
        self.enqueue(
            n,
            (p.num_tiles(), small),
            (&p.long, p.num_long_tiles()),
            (p.slot_stride, p.bt_stride),
            num_layers,
            first,
            0,
        )?;
        HostTimes::lap(&mut self.host_times.eager, &mut clock);
        Ok(Pass::Eager(first))
    }
}
