//! A tensor-parallel rank's share of the backend: the NCCL communicator of its group and the
//! all-reduce that adds the output and down projections' partial products across the group, in
//! place in the f32 residual stream, on the backend's own stream (so decode graphs capture it).

use cudarc::nccl::{result, sys, Id};

use tandem_engine::backend::ForwardBatch;

use super::CudaBackend;
use crate::tensor_parallel::shard::Shard;
use crate::CudaError;

/// This rank's communicator in its tensor-parallel group.
pub(crate) struct Collective {
    comm: sys::ncclComm_t,
    /// Where this rank sits in the group.
    pub(crate) shard: Shard,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time; the backend that
// owns it is used through `&mut self` or from the one thread that drives its rank.
unsafe impl Send for Collective {}

impl Collective {
    /// Joins the group of `shard.size` ranks named by `id` as `shard.rank`, on the device whose
    /// context is current on this thread. Blocks until every rank has joined.
    pub(crate) fn join(id: &Id, shard: Shard) -> Result<Collective, CudaError> {
        let mut comm = std::ptr::null_mut();
        let uid = sys::ncclUniqueId { internal: *id.internal() };
        // SAFETY: `comm` receives the new communicator; ranks and size are in range.
        unsafe { result::comm_init_rank(&mut comm, shard.size as i32, uid, shard.rank as i32)? };
        Ok(Collective { comm, shard })
    }

    /// Sums `count` f32 values at device address `buf` across the group, in place, queued on
    /// `stream`.
    fn all_reduce(
        &self,
        buf: u64,
        count: usize,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CudaError> {
        // SAFETY: `buf` holds `count` f32 values on this rank's device; the stream belongs to
        // the same context.
        unsafe {
            result::all_reduce(
                buf as *const std::ffi::c_void,
                buf as *mut std::ffi::c_void,
                count,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                stream as sys::cudaStream_t,
            )?
        };
        Ok(())
    }
}

impl Drop for Collective {
    fn drop(&mut self) {
        // SAFETY: the communicator is live and dropped once; abort ends any collective a peer
        // will never join instead of waiting for it.
        unsafe {
            let _ = result::comm_abort(self.comm);
        }
    }
}

impl CudaBackend {
    /// Makes this backend rank `c.shard.rank` of a tensor-parallel group: its weights and KV
    /// cache are that rank's slice, and each layer's projections are summed across the group.
    pub(crate) fn set_collective(&mut self, c: Collective) {
        self.graphs.clear();
        self.tp = Some(c);
    }

    /// Whether this backend's output projections add to the residual stream (alone, or rank 0
    /// of a group); the other ranks' products replace it before the all-reduce sums them.
    pub(super) fn leads(&self) -> bool {
        self.tp.as_ref().is_none_or(|c| c.shard.leads())
    }

    /// Sums the first `count` values of the residual stream across the group (nothing alone).
    pub(super) fn all_reduce(&self, count: usize) -> Result<(), CudaError> {
        let Some(c) = &self.tp else { return Ok(()) };
        self.mark("all-reduce")?;
        c.all_reduce(crate::device::ptr(&self.a.x), count, self.gpu.stream.cu_stream())
    }
}

impl CudaBackend {
    /// A follower rank's part of a pass its group's lead runs on the same batch: the same
    /// layers, so the same collectives in the same order — eagerly when `eager` (the lead is
    /// profiling), else through a decode graph where the lead uses one. Its logits stay unread.
    pub(crate) fn follow(
        &mut self,
        b: &ForwardBatch,
        num_layers: usize,
        eager: bool,
    ) -> Result<(), CudaError> {
        let graphs = self.use_graphs;
        self.use_graphs = graphs && !eager;
        let r = self.pass(b, num_layers);
        self.use_graphs = graphs;
        r?;
        self.gpu.sync()
    }
}
