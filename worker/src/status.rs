//! The `Worker.Status` RPC: what routers and health checks read about a worker.

use std::sync::Arc;

use tandem_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::engine_loop::EngineHandle;
use crate::models::{LoadedModels, ModelError};

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
    /// Tokens per KV block.
    pub block_size: u32,
    /// What runs the model.
    pub device: String,
    /// Models loaded after start-up (none: this worker serves only its start-up model).
    pub models: Option<Arc<LoadedModels>>,
}

/// The gRPC status of a model error.
pub fn model_status(e: &ModelError) -> Status {
    match e {
        ModelError::NotInCatalog(_) | ModelError::NotLoaded(_) => Status::not_found(e.to_string()),
        // Not `unavailable`: that says the worker itself is down.
        ModelError::NotReady(..) | ModelError::NoCatalog | ModelError::StartUpModel(_) => {
            Status::failed_precondition(e.to_string())
        }
    }
}

impl StatusService {
    fn models(&self) -> Result<&Arc<LoadedModels>, Status> {
        self.models.as_ref().ok_or_else(|| {
            Status::failed_precondition(format!(
                "this {} worker serves only its start-up model",
                self.role
            ))
        })
    }
}

#[tonic::async_trait]
impl pb::worker_server::Worker for StatusService {
    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::WorkerStatus>, Status> {
        let with_hashes = req.into_inner().include_block_hashes;
        let s = self.engine.snapshot();
        let (alive, event_seq, cached_block_hashes) = if with_hashes {
            // On the engine thread: the hashes and the event number describe the same moment.
            let polled = self
                .engine
                .call(|s| {
                    let seq = s.flush_kv_events();
                    (
                        seq,
                        s.engine
                            .block_manager()
                            .cached_hashes()
                            .into_iter()
                            .map(|h| h.0)
                            .collect::<Vec<u64>>(),
                    )
                })
                .await;
            let alive = polled.is_some();
            let (seq, hashes) = polled.unwrap_or_default();
            (alive, seq, hashes)
        } else {
            (self.engine.submit(|_| {}), s.event_seq, Vec::new())
        };
        Ok(Response::new(pb::WorkerStatus {
            worker_id: self.worker_id.clone(),
            role: self.role.clone(),
            model: self.model.clone(),
            epoch: self.epoch,
            healthy: alive && !s.failed && !crate::serve::draining(),
            num_blocks: s.num_blocks as u32,
            free_blocks: s.free_blocks as u32,
            running: s.running as u32,
            waiting: s.waiting as u32,
            queued_prefill_tokens: s.queued_prefill_tokens as u64,
            cached_block_hashes,
            max_model_len: self.max_model_len,
            block_size: self.block_size,
            event_seq,
            device: self.device.clone(),
            models: self.models.as_ref().map(|m| m.states()).unwrap_or_default(),
        }))
    }

    async fn load_model(
        &self,
        req: Request<pb::LoadModelRequest>,
    ) -> Result<Response<pb::ModelState>, Status> {
        let r = req.into_inner();
        self.models()?
            .load(&r.model, r.kv_cache_bytes)
            .map(Response::new)
            .map_err(|e| model_status(&e))
    }

    async fn unload_model(
        &self,
        req: Request<pb::UnloadModelRequest>,
    ) -> Result<Response<pb::ModelState>, Status> {
        let name = req.into_inner().model;
        self.models()?.unload(&name).map(Response::new).map_err(|e| model_status(&e))
    }
}

/// A fresh epoch: nanoseconds since the Unix epoch at process start.
pub fn new_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}
