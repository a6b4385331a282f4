//! The `Worker.Status` RPC: what routers and health checks read about a worker.

use tandem_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::engine_loop::EngineHandle;

/// Serves `Worker.Status` from the engine's snapshot.
pub struct StatusService {
    /// The engine.
    pub engine: EngineHandle,
    /// This worker's id.
    pub worker_id: String,
    /// "prefill", "decode" or "both".
    pub role: String,
    /// Served model name.
    pub model: String,
    /// Changes at every process start.
    pub epoch: u64,
    /// Longest prompt plus output the engine accepts.
    pub max_model_len: u32,
}

#[tonic::async_trait]
impl pb::worker_server::Worker for StatusService {
    async fn status(&self, _req: Request<pb::StatusRequest>) -> Result<Response<pb::WorkerStatus>, Status> {
        let alive = self.engine.submit(|_| {});
        let s = self.engine.snapshot();
        Ok(Response::new(pb::WorkerStatus {
            worker_id: self.worker_id.clone(),
            role: self.role.clone(),
            model: self.model.clone(),
            epoch: self.epoch,
            healthy: alive && !s.failed,
            num_blocks: s.num_blocks as u32,
            free_blocks: s.free_blocks as u32,
            running: s.running as u32,
            waiting: s.waiting as u32,
            queued_prefill_tokens: s.queued_prefill_tokens as u64,
            cached_block_hashes: Vec::new(),
            max_model_len: self.max_model_len,
        }))
    }
}

/// A fresh epoch: nanoseconds since the Unix epoch at process start.
pub fn new_epoch() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
}
