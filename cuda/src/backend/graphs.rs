//! Decode steps through CUDA graphs: one graph per captured batch size, replayed with the
//! uploaded plan's inputs (`BatchPlan::padded_decode` puts them at fixed places).

use cudarc::driver::{sys as dsys, CudaGraph};
use tandem_engine::backend::ForwardBatch;

use super::{CudaBackend, DecodeGraph};
use crate::device::lt_plans::GemmKey;
use crate::device::ptr;
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
    /// its contexts cut into splits (by length for graphs of at most
    /// [`plan::by_length_max`] sequences), the entries padded to the graph's grid. `None` when `b` is
    /// not a decode step that fits.
    pub(super) fn graph_plan(&self, b: &ForwardBatch, size: usize) -> Option<BatchPlan> {
        let mut p = BatchPlan::padded_decode(b, size, self.max_blocks_per_seq)?;
        let entries = self.graph_entries(size);
        if entries > size && size <= plan::by_length_max() {
            p.split_balanced(plan::MIN_PIECE, entries);
        } else if entries > size {
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
        // The products' algorithms first (their scratch is the activations this run rewrites),
        // then one eager run: loads every kernel and lets cuBLAS pick its algorithms.
        self.tune_products(size)?;
        let tiling = (entries, self.small_tiles(self.group(), size));
        self.enqueue(size, tiling, (&[], 0), sections, layers, size, 0)?;
        self.gpu.sync()?;
        let (graph, nodes) = self.capture_graph(|be, s| {
            be.enqueue(size, tiling, (&[], 0), sections, layers, size, 0)?;
            // A diagnostic only (benchmarks ask for it): a failure leaves no census, not no graph.
            Ok(be.census_on.then(|| census(s.cu_stream()).ok()).flatten())
        })?;
        if let Some(c) = nodes {
            self.census.insert(size, c);
        }
        self.graphs.insert(size, DecodeGraph(graph));
        self.capture_seconds += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// The cuBLAS products of a decode step of `t` rows timed against cuBLASLt's candidates on
    /// the model's own matrices, the faster kept ([`Gpu::tune_gemm`]): q|k|v, o, gate|up and
    /// down, each where cuBLAS runs it (not on `gemv` or the stream kernels; o and down also
    /// where cut along k, whose last layer's down is not). One GPU alone only.
    fn tune_products(&self, t: usize) -> Result<(), CudaError> {
        let (g, c, a) = (&self.gpu, &self.cfg, &self.a);
        if self.tp.is_some() || t < 2 {
            return Ok(());
        }
        let (h, qs, kvs, ff) = (c.hidden_size, c.q_size(), c.kv_size(), c.intermediate_size);
        let layers = &self.w.layers;
        let mats = |f: fn(&crate::weights::LayerWeights) -> u64| layers.iter().map(f).collect();
        // Gemma's post-norms take o and down aside (overwritten, not accumulated).
        let (into, acc) = match c.post_norms {
            true => (ptr(&a.proj), false),
            false => (ptr(&a.x), true),
        };
        let shapes: [(GemmKey, Vec<u64>, u64, u64); 4] = [
            ((t, qs + 2 * kvs, h, true, false), mats(|l| ptr(&l.qkv)), ptr(&a.hb), ptr(&a.qkv)),
            ((t, h, qs, true, acc), mats(|l| ptr(&l.o)), ptr(&a.att), into),
            ((t, 2 * ff, h, false, false), mats(|l| ptr(&l.gate_up)), ptr(&a.hb), ptr(&a.gu)),
            ((t, h, ff, true, acc), mats(|l| ptr(&l.down)), ptr(&a.act), into),
        ];
        for (i, (key, weights, a, out)) in shapes.into_iter().enumerate() {
            // gate|up with its activation in one stream kernel is not a cuBLAS product.
            if i != 2 || !g.gemm_glu_takes(t, ff, h) {
                g.tune_gemm(key, &weights, a, out)?;
            }
        }
        Ok(())
    }

    /// GPU time of one replay of the decode graph that serves `b` (a decode step), median of
    /// `reps` replays in ms; captures the graph if needed. Logits stay on the device. Each
    /// replay is timed alone (launched on an idle stream), or, after
    /// [`CudaBackend::set_replay_chain`], as `n` replays launched back to back.
    pub fn replay_ms(&mut self, b: &ForwardBatch, reps: usize) -> Result<f64, CudaError> {
        let size = self.ready_graph(b)?;
        let g = &self.graphs[&size].0;
        match self.chain {
            0 | 1 => {
                crate::device::time_ms(&self.gpu, 3, reps, || g.launch().map_err(CudaError::from))
            }
            n => {
                let launch_all = || (0..n).try_for_each(|_| g.launch().map_err(CudaError::from));
                Ok(crate::device::time_ms(&self.gpu, 1, reps, launch_all)? / n as f64)
            }
        }
    }

    /// Uploads the plan of decode step `b` and captures its graph if needed; the graph's size.
    fn ready_graph(&mut self, b: &ForwardBatch) -> Result<usize, CudaError> {
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
        Ok(size)
    }

    /// GPU time of this backend's decode graph for `b` and `other`'s for `ob` replayed at
    /// once, each on its own stream (both backends on one GPU), median of `reps`, ms: what a
    /// decode step run as two independent halves on two streams would take.
    pub fn replay_pair_ms(
        &mut self,
        other: &mut CudaBackend,
        b: &ForwardBatch,
        ob: &ForwardBatch,
        reps: usize,
    ) -> Result<f64, CudaError> {
        let (sa, sb) = (self.ready_graph(b)?, other.ready_graph(ob)?);
        let (ga, gb) = (&self.graphs[&sa].0, &other.graphs[&sb].0);
        let (a, o) = (&self.gpu.stream, &other.gpu.stream);
        crate::device::time_ms(&self.gpu, 3, reps, || {
            o.join(a)?;
            ga.launch()?;
            gb.launch()?;
            a.join(o).map_err(CudaError::from)
        })
    }

    /// The nodes of the decode graph that serves `n` sequences (once captured), counted by
    /// kernel name (`memset`, `memcpy` and other node types by their type), most frequent first.
    pub fn graph_census(&self, n: usize) -> Option<&[(String, usize)]> {
        let size = plan::graph_size_for(&self.graph_sizes, n)?;
        self.census.get(&size).map(|v| v.as_slice())
    }

    /// Counts the nodes of every graph captured from now on ([`CudaBackend::graph_census`]);
    /// off by default, so serving never calls the driver's graph-inspection entry points.
    pub fn set_graph_census(&mut self, on: bool) {
        self.census_on = on;
    }

    /// Captures what `queue` puts on the stream as a graph, instantiated and uploaded, with
    /// what `queue` returns. Work queued before is not part of the graph.
    pub(super) fn capture_graph<R>(
        &self,
        queue: impl FnOnce(&Self, &cudarc::driver::CudaStream) -> Result<R, CudaError>,
    ) -> Result<(CudaGraph, R), CudaError> {
        let s = self.gpu.stream.clone();
        s.begin_capture(dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::from)?;
        let r = queue(self, &s);
        let graph = s.end_capture(dsys::CUgraphInstantiate_flags(0)).map_err(CudaError::from)?;
        let r = r?;
        let graph =
            graph.ok_or_else(|| CudaError::Driver("graph capture produced no graph".into()))?;
        graph.upload().map_err(CudaError::from)?;
        Ok((graph, r))
    }

    /// Drops every captured graph (decode and mixed-step): the next steps capture again with
    /// the kernels now chosen.
    pub(super) fn drop_graphs(&mut self) {
        self.graphs.clear();
        self.mixed_graphs.clear();
        self.mixed_seen.clear();
    }

    /// Times [`CudaBackend::replay_ms`] over `n` back-to-back replays (0 or 1: each alone).
    pub fn set_replay_chain(&mut self, n: usize) {
        self.chain = n;
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

/// The nodes captured so far on `stream` (inside a capture), counted by kernel name.
fn census(stream: dsys::CUstream) -> Result<Vec<(String, usize)>, CudaError> {
    use std::ffi::{c_char, CStr};
    let check = |r: dsys::CUresult, what: &str| match r {
        dsys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(CudaError::Driver(format!("{what}: {e:?}"))),
    };
    let mut status = dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let (mut id, mut graph) = (0u64, std::ptr::null_mut());
    let (mut deps, mut edges, mut ndeps) = (std::ptr::null(), std::ptr::null(), 0usize);
    // SAFETY: out-pointers to locals; the graph stays owned by the capture.
    check(
        unsafe {
            dsys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                &mut id,
                &mut graph,
                &mut deps,
                &mut edges,
                &mut ndeps,
            )
        },
        "cuStreamGetCaptureInfo",
    )?;
    let mut n = 0usize;
    // SAFETY: counting pass (null node array), then a pass into a buffer of that size.
    check(
        unsafe { dsys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) },
        "cuGraphGetNodes",
    )?;
    let mut nodes = vec![std::ptr::null_mut(); n];
    check(unsafe { dsys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }, "cuGraphGetNodes")?;
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    for &node in &nodes[..n] {
        let mut ty = dsys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: a node of the capture's graph.
        check(unsafe { dsys::cuGraphNodeGetType(node, &mut ty) }, "cuGraphNodeGetType")?;
        let name = match ty {
            dsys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => {
                // SAFETY: a kernel node's parameters; the names are static strings of the
                // loaded modules.
                let mut p: dsys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
                check(
                    unsafe { dsys::cuGraphKernelNodeGetParams_v2(node, &mut p) },
                    "cuGraphKernelNodeGetParams",
                )?;
                let mut c: *const c_char = std::ptr::null();
                let r = if !p.func.is_null() {
                    unsafe { dsys::cuFuncGetName(&mut c, p.func) }
                } else {
                    unsafe { dsys::cuKernelGetName(&mut c, p.kern) }
                };
                match (r, c.is_null()) {
                    (dsys::CUresult::CUDA_SUCCESS, false) => {
                        unsafe { CStr::from_ptr(c) }.to_string_lossy().into_owned()
                    }
                    _ => "kernel (unnamed)".to_string(),
                }
            }
            other => format!("{other:?}").replace("CU_GRAPH_NODE_TYPE_", "").to_lowercase(),
        };
        *counts.entry(name).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(v)
}
