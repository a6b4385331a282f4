//! Prefill worker: chunked prefill and KV page shipping.
//!
//! A decode worker calls `PrefillWorker.Prefill` with a prompt, the address of its KV page
//! listener and the number of leading blocks it already holds. The prefill worker runs the
//! prompt through chunked prefill (reusing its own prefix cache), samples the first token,
//! streams the remaining blocks' pages into the decode worker's reserved blocks (over TCP, or
//! GPU to GPU over a device link the decode worker set up with `KvTransfer.JoinLink`), and
//! answers with the first token once the decode worker acknowledged every page. Its blocks are
//! then released; full ones stay in its prefix cache for the next prompt that shares them.

pub mod links;
pub mod service;

use std::time::Duration;

use tandem_engine::LLMEngine;
use tandem_proto::v1 as pb;
use tandem_worker::core_share::CoreShare;
use tandem_worker::serve::{announce_ready, http_routes, serve};
use tandem_worker::status::{new_epoch, StatusService};
use tandem_worker::EngineHandle;

pub use service::{Fault, PrefillService};

/// Prefill worker settings.
#[derive(Debug, Clone)]
pub struct PrefillConfig {
    /// Served model name (metrics label, status).
    pub model_name: String,
    /// This worker's id.
    pub worker_id: String,
    /// Address of the gRPC/HTTP listener, e.g. `127.0.0.1:0`.
    pub listen: String,
    /// A transfer with no progress for this long has failed.
    pub transfer_timeout: Duration,
    /// Exit when standard input closes (started by `tandem up`).
    pub watch_stdin: bool,
    /// How long a signalled worker waits for its requests to finish.
    pub drain_timeout: Duration,
    /// Publish KV cache events to this Redis.
    pub redis: Option<tandem_worker::redis::RedisConfig>,
    /// Injected fault, for tests.
    pub fault: Option<Fault>,
    /// Send KV pages GPU to GPU through this device when a decode worker asks (device links).
    pub kv_device: Option<tandem_worker::kv::KvDevice>,
    /// Hold this lock file around each engine step: workers on the same cores take turns
    /// (see [`tandem_worker::core_share`]).
    pub core_share: Option<std::path::PathBuf>,
}

impl Default for PrefillConfig {
    fn default() -> Self {
        PrefillConfig {
            model_name: String::new(),
            worker_id: "prefill-0".into(),
            listen: "127.0.0.1:0".into(),
            transfer_timeout: Duration::from_secs(2),
            watch_stdin: false,
            drain_timeout: Duration::from_secs(30),
            fault: None,
            redis: None,
            kv_device: None,
            core_share: None,
        }
    }
}

/// Runs a prefill worker until shutdown: gRPC (`PrefillWorker`, `Worker`) and HTTP
/// (`/metrics`, `/health`) on `cfg.listen`. Prints `TANDEM_READY prefill <addr>` once serving.
pub async fn run(engine: LLMEngine, cfg: PrefillConfig) -> anyhow::Result<()> {
    let metrics = tandem_worker::metrics::install(&cfg.model_name, "prefill", &cfg.worker_id)?;
    let layout = tandem_worker::kv::kv_layout(&engine);
    let max_model_len = engine.max_prefill_only_len() as u32;
    let block_size = engine.block_manager().block_size();
    let epoch = new_epoch();
    let device = engine.device();
    let kv_sink = cfg.redis.as_ref().map(|redis| {
        tandem_worker::kv_events::spawn_publisher(redis.clone(), cfg.worker_id.clone(), epoch)
    });
    let share = cfg.core_share.as_deref().map(CoreShare::open).transpose()?;
    let handle = EngineHandle::spawn_with_events(engine, kv_sink, share);
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let addr = listener.local_addr()?;
    let status = StatusService {
        engine: handle.clone(),
        worker_id: cfg.worker_id.clone(),
        role: "prefill".into(),
        model: cfg.model_name.clone(),
        epoch,
        max_model_len,
        block_size: block_size as u32,
        device,
        models: None,
    };
    let links = cfg
        .kv_device
        .as_ref()
        .map(|d| std::sync::Arc::new(links::PrefillLinks::new(d.0.clone(), layout.clone())));
    let svc = PrefillService {
        engine: handle.clone(),
        layout,
        transfer_timeout: cfg.transfer_timeout,
        fault: cfg.fault,
        links: links.clone(),
    };
    if let Some(f) = cfg.fault {
        tracing::warn!(fault = ?f, "fault injection is on");
    }
    let grpc = tonic::service::Routes::new(pb::prefill_worker_server::PrefillWorkerServer::new(
        svc.clone(),
    ))
    .add_service(pb::kv_transfer_server::KvTransferServer::new(svc))
    .add_service(pb::worker_server::WorkerServer::new(status));
    tracing::info!(%addr, "prefill worker serving");
    announce_ready("prefill", addr);
    let served =
        serve(listener, grpc, http_routes(metrics, handle), cfg.watch_stdin, cfg.drain_timeout)
            .await;
    if let Some(l) = links {
        l.close_all();
    }
    served
}
