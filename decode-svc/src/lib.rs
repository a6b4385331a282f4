//! Decode worker: continuous batching over the paged KV cache.
//!
//! A request arrives with its prompt's token ids and, in disaggregated serving, the prefill
//! worker the router chose. The worker reserves KV blocks (reusing its own prefix-cache hits),
//! asks the prefill worker for the uncached suffix, receives its pages straight into those
//! blocks (over TCP, or GPU to GPU over a device link with `--kv-transport nccl`), and decodes
//! from the prefill worker's first token. Short suffixes, `n > 1` and requests with no prefill
//! worker are prefilled locally (conditional disaggregation).
//!
//! - [`service`]: the `DecodeWorker` and `KvTransfer` gRPC services.
//! - [`state`]: what the handlers and the remote prefill tasks share.
//! - [`clients`]: gRPC channels to prefill workers.
//! - [`remote`]: the remote prefill of one request and its failure policy.
//! - [`transfers`]: pending transfers and the TCP page receiver.
//! - [`links`]: device links to prefill workers and their receivers.

pub mod clients;
pub mod links;
pub mod remote;
pub mod service;
pub mod state;
pub mod transfers;

use std::time::Duration;

use tandem_engine::LLMEngine;
use tandem_proto::v1 as pb;
use tandem_worker::core_share::CoreShare;
use tandem_worker::serve::{announce_ready, http_routes, serve};
use tandem_worker::status::{new_epoch, StatusService};
use tandem_worker::EngineHandle;

/// What to do when a KV transfer fails or stalls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Prefill the prompt on the decode worker instead.
    Recompute,
    /// Fail the request with an error.
    Fail,
}

/// Decode worker settings.
#[derive(Debug, Clone)]
pub struct DecodeConfig {
    /// Served model name (metrics label, status).
    pub model_name: String,
    /// This worker's id.
    pub worker_id: String,
    /// Address of the gRPC/HTTP listener, e.g. `127.0.0.1:0`.
    pub listen: String,
    /// Address of the KV page listener, e.g. `127.0.0.1:0`.
    pub kv_listen: String,
    /// A transfer with no progress for this long has failed.
    pub transfer_timeout: Duration,
    /// Longest a remote prefill may take in all.
    pub prefill_timeout: Duration,
    /// What a failed transfer does to its request.
    pub failure_policy: FailurePolicy,
    /// Uncached prompt tokens below this are prefilled locally.
    pub min_remote_prefill_tokens: usize,
    /// "decode", or "both" when this worker serves alone (colocated).
    pub role: String,
    /// Exit when standard input closes (started by `tandem up`).
    pub watch_stdin: bool,
    /// How long a signalled worker waits for its requests to finish.
    pub drain_timeout: Duration,
    /// Address prefill workers send KV pages to (default: the KV listener's own address).
    pub kv_advertise: Option<String>,
    /// Publish KV cache events to this Redis.
    pub redis: Option<tandem_worker::redis::RedisConfig>,
    /// Receive KV pages GPU to GPU through this device (instead of TCP).
    pub kv_device: Option<tandem_worker::kv::KvDevice>,
    /// Hold this lock file around each engine step: workers on the same cores take turns
    /// (see [`tandem_worker::core_share`]).
    pub core_share: Option<std::path::PathBuf>,
    /// Models loaded and unloaded while the worker runs (none: only the start-up model).
    pub models: Option<std::sync::Arc<tandem_worker::models::LoadedModels>>,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig {
            model_name: String::new(),
            worker_id: "decode-0".into(),
            listen: "127.0.0.1:0".into(),
            kv_listen: "127.0.0.1:0".into(),
            transfer_timeout: Duration::from_secs(2),
            prefill_timeout: Duration::from_secs(300),
            failure_policy: FailurePolicy::Recompute,
            min_remote_prefill_tokens: 16,
            role: "decode".into(),
            watch_stdin: false,
            drain_timeout: Duration::from_secs(30),
            kv_advertise: None,
            redis: None,
            kv_device: None,
            core_share: None,
            models: None,
        }
    }
}

/// More HTTP routes for the worker's own port, built once the port is bound from the address
/// at which this worker's gRPC services answer: the OpenAI API served by the worker itself
/// (the CLI builds it from the router's front end), as a Gateway API Inference Extension model
/// server is.
pub type FrontEnd = Box<dyn FnOnce(std::net::SocketAddr) -> anyhow::Result<axum::Router> + Send>;

/// Runs a decode worker until shutdown: gRPC (`DecodeWorker`, `KvTransfer`, `Worker`) and HTTP
/// (`/metrics`, `/health`) on `cfg.listen`, KV pages on `cfg.kv_listen`. Prints
/// `TANDEM_READY <role> <addr>` once serving.
pub async fn run(engine: LLMEngine, cfg: DecodeConfig) -> anyhow::Result<()> {
    run_with(engine, cfg, None).await
}

/// [`run`], with `front_end`'s routes beside `/metrics` and `/health`.
pub async fn run_with(
    engine: LLMEngine,
    cfg: DecodeConfig,
    front_end: Option<FrontEnd>,
) -> anyhow::Result<()> {
    let metrics = tandem_worker::metrics::install(&cfg.model_name, &cfg.role, &cfg.worker_id)?;
    let layout = tandem_worker::kv::kv_layout(&engine);
    let block_size = engine.block_manager().block_size();
    let max_model_len = engine.max_model_len() as u32;
    let epoch = new_epoch();
    let device = engine.device();
    let kv_sink = cfg.redis.as_ref().map(|redis| {
        tandem_worker::kv_events::spawn_publisher(redis.clone(), cfg.worker_id.clone(), epoch)
    });
    let share = cfg.core_share.as_deref().map(CoreShare::open).transpose()?;
    let handle = EngineHandle::spawn_with_events(engine, kv_sink, share);
    // This worker's sinks build stream messages only (no page reads): a step's outputs can go
    // out while the next step runs.
    handle.submit(|s| s.set_dispatch_in_step(true));
    let transfers = transfers::Transfers::default();
    let links = cfg.kv_device.as_ref().map(|d| {
        std::sync::Arc::new(links::DeviceLinks::new(
            d.0.clone(),
            layout.clone(),
            cfg.transfer_timeout,
        ))
    });
    let kv_addr = transfers::start_receiver(
        &cfg.kv_listen,
        layout,
        cfg.transfer_timeout,
        handle.clone(),
        transfers.clone(),
    )?;
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let addr = listener.local_addr()?;
    let status = StatusService {
        engine: handle.clone(),
        worker_id: cfg.worker_id.clone(),
        role: cfg.role.clone(),
        model: cfg.model_name.clone(),
        epoch,
        max_model_len,
        block_size: block_size as u32,
        device,
        models: cfg.models.clone(),
    };
    let (watch, drain) = (cfg.watch_stdin, cfg.drain_timeout);
    let advertised = cfg.kv_advertise.clone().unwrap_or_else(|| kv_addr.to_string());
    let svc =
        service::DecodeService::new(handle.clone(), cfg, transfers, advertised, links.clone());
    let grpc =
        tonic::service::Routes::new(pb::decode_worker_server::DecodeWorkerServer::new(svc.clone()))
            .add_service(pb::kv_transfer_server::KvTransferServer::new(svc))
            .add_service(pb::worker_server::WorkerServer::new(status));
    let mut http = http_routes(metrics, handle);
    if let Some(build) = front_end {
        // The front end reaches this worker over loopback when it listens on every address.
        let own = match addr.ip().is_unspecified() {
            true => std::net::SocketAddr::from(([127, 0, 0, 1], addr.port())),
            false => addr,
        };
        http = http.merge(build(own)?);
        tracing::info!(%addr, "serving the OpenAI API on the worker's port");
    }
    tracing::info!(%addr, %kv_addr, "decode worker serving");
    announce_ready("decode", addr);
    let served = serve(listener, grpc, http, watch, drain).await;
    if let Some(l) = links {
        l.close_all(Duration::from_secs(5)).await;
    }
    served
}
