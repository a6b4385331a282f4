//! `tandem decode`, `tandem prefill`, `tandem router`: the three services as processes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use tandem_engine::{model_files::model_fetch, LLMEngine, ModelInfo};
use tandem_worker::redis::RedisConfig;

use crate::engine_args::{DeviceArg, EngineArgs};

/// Model selection shared by the services.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model file (.gguf) or Hugging Face directory; default: SmolLM2-135M-Instruct, fetched
    /// into the cache on first use.
    #[arg(long, env = "TANDEM_MODEL")]
    pub model: Option<PathBuf>,
    /// The name clients use for the model; default: the file name up to its first dot.
    #[arg(long, env = "TANDEM_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Directory of models that can be loaded while serving (`POST /v1/models/NAME/load`):
    /// each `NAME.gguf` file or Hugging Face directory `NAME/` is model `NAME`. Give the router
    /// and the decode workers the same directory.
    #[arg(long)]
    pub model_dir: Option<PathBuf>,
}

impl ModelArgs {
    /// The catalog of `--model-dir`, if given.
    pub fn catalog(&self) -> Result<Option<tandem_worker::models::ModelCatalog>> {
        self.model_dir
            .as_deref()
            .map(tandem_worker::models::ModelCatalog::open)
            .transpose()
            .map_err(anyhow::Error::msg)
    }

    /// The model path, fetching the default model if needed.
    pub fn path(&self) -> Result<PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => Ok(model_fetch::default_model_path()?),
        }
    }

    /// The served name for the model at `path`.
    pub fn served_name(&self, path: &Path) -> String {
        if let Some(n) = &self.served_model_name {
            return n.clone();
        }
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        file.split('.').next().filter(|s| !s.is_empty()).unwrap_or("model").to_string()
    }
}

/// Parses durations such as `2s`, `500ms`, `1.5s`, `5m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, mult) = if let Some(v) = t.strip_suffix("ms") {
        (v, 1e-3)
    } else if let Some(v) = t.strip_suffix('s') {
        (v, 1.0)
    } else if let Some(v) = t.strip_suffix('m') {
        (v, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 =
        num.trim().parse().map_err(|_| format!("invalid duration '{s}' (use e.g. 2s, 500ms)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("duration '{s}' must be positive"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

/// What a failed KV transfer does.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PolicyArg {
    /// Prefill locally on the decode worker.
    Recompute,
    /// Fail the request.
    Fail,
}

/// KV page transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    /// TCP between hosts.
    Tcp,
    /// NCCL send/recv between GPUs.
    Nccl,
}

/// Where Redis is (routers and workers take the same flags).
#[derive(Args, Debug, Clone, Default)]
pub struct RedisArgs {
    /// `redis://[[user]:password@]host[:port][/db]`, or `rediss://…` for TLS.
    #[arg(long, env = "TANDEM_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Redis password (or the ACL user's, the user named in the URL), kept out of the URL
    /// (e.g. from a Kubernetes Secret).
    #[arg(long, env = "TANDEM_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,
    /// PEM CA certificate to trust for `rediss://` (default: the system's roots).
    #[arg(long, env = "TANDEM_REDIS_CA_CERT")]
    pub redis_ca_cert: Option<PathBuf>,
    /// PEM client certificate, for a Redis that asks clients for one (with `--redis-client-key`).
    #[arg(long, env = "TANDEM_REDIS_CLIENT_CERT", requires = "redis_client_key")]
    pub redis_client_cert: Option<PathBuf>,
    /// PEM key of `--redis-client-cert`.
    #[arg(long, env = "TANDEM_REDIS_CLIENT_KEY", requires = "redis_client_cert")]
    pub redis_client_key: Option<PathBuf>,
}

impl RedisArgs {
    /// The configuration, checked now (URL, certificate files) so that a mistake stops the
    /// process at start-up instead of looking like an outage.
    pub fn config(&self) -> Result<Option<RedisConfig>> {
        let Some(url) = &self.redis_url else {
            anyhow::ensure!(
                self.redis_ca_cert.is_none() && self.redis_client_cert.is_none(),
                "Redis certificates are given without --redis-url"
            );
            return Ok(None);
        };
        let url = match &self.redis_password {
            Some(pw) => tandem_worker::redis::with_password(url, pw)?,
            None => url.clone(),
        };
        let cfg = RedisConfig {
            url,
            ca_cert: self.redis_ca_cert.clone(),
            client_cert: self.redis_client_cert.clone().zip(self.redis_client_key.clone()),
        };
        cfg.client()?;
        Ok(Some(cfg))
    }
}

/// Flags every worker takes.
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// A KV transfer with no progress for this long has failed.
    #[arg(long, env = "TANDEM_TRANSFER_TIMEOUT", value_parser = parse_duration, default_value = "2s")]
    pub transfer_timeout: Duration,
    /// Redis to publish KV cache events to, for prefix-aware routing.
    #[command(flatten)]
    pub redis: RedisArgs,
    /// How KV pages travel between prefill and decode workers: `tcp`, or `nccl` (GPU to GPU;
    /// both workers on `--device cuda`).
    #[arg(long, value_enum, env = "TANDEM_KV_TRANSPORT", default_value = "tcp")]
    pub kv_transport: TransportArg,
    /// Exit when standard input closes.
    #[arg(long, hide = true)]
    pub watch_stdin: bool,
    /// On SIGTERM, how long to wait for the requests in flight before exiting (the worker
    /// reports itself unavailable meanwhile).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub drain_timeout: Duration,
    /// Hold this lock file around each engine step, so workers on the same CPU cores take
    /// turns a step at a time instead of slowing each other down (`tandem up` sets it on CPU).
    #[arg(long, env = "TANDEM_CORE_SHARE_LOCK")]
    pub core_share_lock: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Arguments of `tandem decode`.
#[derive(Args, Debug, Clone)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// gRPC and HTTP (`/metrics`, `/health`) listen address.
    #[arg(long, default_value = "127.0.0.1:50061")]
    pub listen: String,
    /// KV page listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub kv_listen: String,
    /// Address prefill workers send KV pages to, when it differs from the listen address
    /// (e.g. `$(POD_IP):50062` with `--kv-listen 0.0.0.0:50062`).
    #[arg(long)]
    pub kv_advertise: Option<String>,
    /// Worker id (metrics label, status).
    #[arg(long, default_value = "decode-0")]
    pub worker_id: String,
    /// Longest a remote prefill may take in all.
    #[arg(long, value_parser = parse_duration, default_value = "300s")]
    pub prefill_timeout: Duration,
    /// What a failed or stalled KV transfer does to its request.
    #[arg(long, env = "TANDEM_KV_FAILURE_POLICY", value_enum, default_value = "recompute")]
    pub kv_failure_policy: PolicyArg,
    /// Prompts with fewer uncached tokens than this are prefilled here, not remotely.
    #[arg(long, env = "TANDEM_DISAGG_MIN_TOKENS", default_value_t = 16)]
    pub disagg_min_tokens: usize,
    /// This worker serves alone (prefill and decode): its role label is `both`.
    #[arg(long)]
    pub colocated: bool,
    /// Also serve the OpenAI API on the listen port, as a Gateway API Inference Extension model
    /// server: requests decode here; their prompts are prefilled by `--prefill-workers` (or
    /// here, with none).
    #[arg(long)]
    pub serve_openai: bool,
    /// Prefill workers for requests that come in through `--serve-openai`.
    #[arg(long, value_delimiter = ',', requires = "serve_openai")]
    pub prefill_workers: Vec<String>,
    /// API keys (one `KEY` or `KEY:TENANT` per line) the `--serve-openai` API requires, as the
    /// router does (`TANDEM_API_KEYS` is read too).
    #[arg(long, requires = "serve_openai")]
    pub api_keys_file: Option<PathBuf>,
    #[command(flatten)]
    pub worker: WorkerArgs,
}

/// Arguments of `tandem prefill`.
#[derive(Args, Debug, Clone)]
pub struct PrefillArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// gRPC and HTTP (`/metrics`, `/health`) listen address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: String,
    /// Worker id (metrics label, status).
    #[arg(long, default_value = "prefill-0")]
    pub worker_id: String,
    #[command(flatten)]
    pub worker: WorkerArgs,
}

/// Arguments of `tandem router`.
#[derive(Args, Debug, Clone)]
pub struct RouterArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// HTTP listen address of the OpenAI API.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: String,
    /// Decode workers' gRPC addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub decode_workers: Vec<String>,
    /// Prefill workers' gRPC addresses, comma-separated (none: decode workers prefill).
    #[arg(long, value_delimiter = ',')]
    pub prefill_workers: Vec<String>,
    /// Redis for the workers' KV events and load shared among routers; without it, routing
    /// uses an approximate index of this router's own decisions.
    #[command(flatten)]
    pub redis: RedisArgs,
    /// How workers are chosen.
    #[arg(long, env = "TANDEM_ROUTING_POLICY", value_enum, default_value = "kv")]
    pub routing_policy: RoutingPolicyArg,
    /// Weight of the prefill term (uncached prompt blocks plus queued prefill, in blocks).
    #[arg(long, env = "TANDEM_OVERLAP_WEIGHT", default_value_t = 1.0)]
    pub overlap_weight: f64,
    /// Weight of the decode term (KV blocks of requests decoding on the worker).
    #[arg(long, env = "TANDEM_DECODE_WEIGHT", default_value_t = 0.1)]
    pub decode_weight: f64,
    /// Workers within this fraction of the best cost are picked at random among.
    #[arg(long, default_value_t = 0.05)]
    pub route_margin: f64,
    /// How long the approximate index remembers where a prompt went.
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub approx_ttl: Duration,
    /// This router's name in metrics (default: random).
    #[arg(long)]
    pub router_id: Option<String>,
    /// Exit when standard input closes.
    #[arg(long, hide = true)]
    pub watch_stdin: bool,
    /// File of API keys for `/v1/*`, one `KEY` or `KEY:TENANT` per line (tenants do not share
    /// cached prefixes). Without keys here or in `TANDEM_API_KEYS` the API is open.
    #[arg(long, env = "TANDEM_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Most requests of one key in flight at once (429 beyond).
    #[arg(long, env = "TANDEM_MAX_CONCURRENT_PER_KEY")]
    pub max_concurrent_per_key: Option<usize>,
    /// Requests per second one key may send (bursts up to the same number; 429 beyond).
    #[arg(long, env = "TANDEM_REQUESTS_PER_SECOND_PER_KEY")]
    pub requests_per_second_per_key: Option<f64>,
    /// Largest request body, in bytes (413 beyond).
    #[arg(long, env = "TANDEM_MAX_BODY_BYTES", default_value_t = tandem_router::MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Longest prompt, in tokens (400 beyond; default: the context window).
    #[arg(long, env = "TANDEM_MAX_PROMPT_TOKENS")]
    pub max_prompt_tokens: Option<usize>,
    /// A Jinja chat template file to use instead of the model's own (for instance one that
    /// reads `tools`, so tool definitions and calls are laid out the model's way).
    #[arg(long, env = "TANDEM_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// Completion tokens of a chat request that sets neither max_tokens nor
    /// max_completion_tokens; 0 = the rest of the context window (as vLLM does). Completions keep
    /// the OpenAI default of 16.
    #[arg(long, env = "TANDEM_DEFAULT_MAX_TOKENS", default_value_t = DEFAULT_MAX_TOKENS)]
    pub default_max_tokens: usize,
    /// How special-token text inside chat messages (e.g. `<|im_end|>` typed by a user) is
    /// tokenized: `plain` (default) as the characters it is made of, so a message cannot forge
    /// the chat template's markup; `control` as control tokens.
    #[arg(long, env = "TANDEM_SPECIAL_TOKENS_IN_MESSAGES", default_value = "plain")]
    pub special_tokens_in_messages: tandem_router::prompt::SpecialTokens,
    /// How the model writes tool calls: `hermes` (`<tool_call>` blocks) or `llama3_json`
    /// (`{"name", "parameters"}` objects); default: read from the chat template.
    #[arg(long, env = "TANDEM_TOOL_CALL_PARSER")]
    pub tool_call_parser: Option<tandem_router::tool_format::ToolCallFormat>,
    /// Also serve the endpoint picker of a Gateway API Inference Extension `InferencePool`
    /// (Envoy's `ext_proc` protocol, with gRPC health) on this address, e.g. `0.0.0.0:9002`.
    #[arg(long, env = "TANDEM_EPP_LISTEN")]
    pub epp_listen: Option<String>,
    /// The endpoint picker sheds a request (429) when every eligible decode worker has at
    /// least this many sequences waiting.
    #[arg(long, env = "TANDEM_EPP_SHED_WAITING")]
    pub epp_shed_waiting: Option<u32>,
    /// Conditional disaggregation: while every prefill worker has more prompt tokens queued than
    /// this, prompts are prefilled on their decode worker.
    #[arg(long, env = "TANDEM_MAX_PREFILL_QUEUE_TOKENS", default_value_t = tandem_router::routing::MAX_PREFILL_QUEUE_TOKENS)]
    pub max_prefill_queue_tokens: f64,
}

/// The router's default completion budget for chat requests that give none.
pub const DEFAULT_MAX_TOKENS: usize = 1024;

/// The router's API keys: the file's and `TANDEM_API_KEYS`' (comma-separated) together.
fn api_keys(a: &RouterArgs) -> Result<Option<Arc<tandem_router::auth::ApiKeys>>> {
    let limits = tandem_router::auth::KeyLimits {
        max_concurrent: a.max_concurrent_per_key,
        requests_per_second: a.requests_per_second_per_key,
    };
    load_api_keys(a.api_keys_file.as_deref(), limits)
}

/// The API keys of `file` and `TANDEM_API_KEYS` (None: the API is open).
fn load_api_keys(
    file: Option<&Path>,
    limits: tandem_router::auth::KeyLimits,
) -> Result<Option<Arc<tandem_router::auth::ApiKeys>>> {
    let mut entries: Vec<String> = Vec::new();
    if let Some(p) = file {
        entries.extend(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading {}", p.display()))?
                .lines()
                .map(str::to_string),
        );
    }
    if let Ok(env) = std::env::var("TANDEM_API_KEYS") {
        entries.extend(env.split(',').map(str::to_string));
    }
    if entries.iter().all(|e| e.trim().is_empty() || e.trim().starts_with('#')) {
        if file.is_some() {
            anyhow::bail!("the API keys file has no keys");
        }
        return Ok(None);
    }
    let keys = tandem_router::auth::ApiKeys::parse(entries.iter().map(String::as_str), limits)?;
    tracing::info!(keys = keys.len(), "API keys required on /v1");
    Ok(Some(Arc::new(keys)))
}

/// Routing policy.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoutingPolicyArg {
    /// Cached prefix against load.
    Kv,
    /// In turn.
    RoundRobin,
    /// Least booked load.
    LeastLoaded,
}

fn runtime(gpu: bool) -> Result<tokio::runtime::Runtime> {
    // The engine runs on its own thread; the runtime only moves bytes.
    let env = std::env::var("TANDEM_RUNTIME_THREADS").ok();
    let threads = runtime_threads(env.as_deref(), gpu)?;
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build()?)
}

/// Async runtime threads of a server on a GPU host (`tandem up --device cuda` gives its
/// router the same): with 2, the router's runtime was 82 % busy at 256 streams on an H200 host
/// and a request's preparation queued 4-5 ms behind the streams it relays; 4 took it to
/// 0.5-1.3 ms (client TTFT mean 37-45 ms against 48-56), 8 did no better (docs/gpu.md).
pub const GPU_RUNTIME_THREADS: usize = 4;

/// Threads of a server process's async runtime (router, workers): 2 (on CPU the cores belong
/// to the engine's kernels), [`GPU_RUNTIME_THREADS`] for a worker on `--device cuda`, or
/// `TANDEM_RUNTIME_THREADS` (1 to 64).
fn runtime_threads(env: Option<&str>, gpu: bool) -> Result<usize> {
    match env.map(str::trim) {
        None | Some("") if gpu => Ok(GPU_RUNTIME_THREADS),
        None | Some("") => Ok(2),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=64).contains(&n) => Ok(n),
            _ => anyhow::bail!("TANDEM_RUNTIME_THREADS={v}: expected a whole number from 1 to 64"),
        },
    }
}

/// Runs a server to completion; tasks still blocked when it returns (a peer that never answers)
/// get a moment, not a say in whether the process exits.
fn block_on(server: impl std::future::Future<Output = Result<()>>, gpu: bool) -> Result<()> {
    let rt = runtime(gpu)?;
    let r = rt.block_on(server);
    rt.shutdown_timeout(Duration::from_secs(2));
    r
}

fn load_engine(
    model: &ModelArgs,
    worker: &WorkerArgs,
) -> Result<(LLMEngine, String, Option<tandem_worker::kv::KvDevice>)> {
    let path = model.path()?;
    let name = model.served_name(&path);
    let (m, device) = worker
        .engine
        .load_model_with_device(&path)
        .with_context(|| format!("loading {}", path.display()))?;
    let device = match (worker.kv_transport, device) {
        (TransportArg::Tcp, _) => None,
        (TransportArg::Nccl, Some(d)) => Some(d),
        (TransportArg::Nccl, None) if worker.engine.tensor_parallel_size > 1 => {
            anyhow::bail!("--kv-transport nccl moves pages between two single GPUs; a tensor-parallel worker exchanges them with --kv-transport tcp, re-sharded by KV head")
        }
        (TransportArg::Nccl, None) => {
            anyhow::bail!("--kv-transport nccl moves KV pages between GPUs: it needs --device cuda")
        }
    };
    Ok((worker.engine.build_engine(m)?, name, device))
}

/// `tandem decode`.
pub fn run_decode(a: DecodeArgs) -> Result<()> {
    // Before the model loads: a Redis setting that cannot work stops the process at once.
    let redis = a.worker.redis.config()?;
    let catalog = a.model.catalog()?;
    let (engine, name, kv_device) = load_engine(&a.model, &a.worker)?;
    let engine_args = a.worker.engine.clone();
    let factory: tandem_worker::models::EngineFactory =
        Arc::new(move |path: &Path, kv_bytes: Option<u64>| {
            let mut args = engine_args.clone();
            if let Some(b) = kv_bytes {
                (args.kv_cache_memory, args.kv_cache_fraction) = (Some(b.to_string()), None);
            }
            let m = args.load_model(path).with_context(|| format!("loading {}", path.display()))?;
            args.build_engine(m)
        });
    let models = Arc::new(
        tandem_worker::models::LoadedModels::new(catalog, factory, &name, a.worker.drain_timeout)
            .with_core_share(a.worker.core_share_lock.clone()),
    );
    let front_end = match a.serve_openai {
        true => Some(openai_front_end(&a, &name)?),
        false => None,
    };
    let cfg = tandem_decode::DecodeConfig {
        kv_device,
        model_name: name,
        worker_id: a.worker_id,
        listen: a.listen,
        kv_listen: a.kv_listen,
        kv_advertise: a.kv_advertise,
        drain_timeout: a.worker.drain_timeout,
        transfer_timeout: a.worker.transfer_timeout,
        prefill_timeout: a.prefill_timeout,
        failure_policy: match a.kv_failure_policy {
            PolicyArg::Recompute => tandem_decode::FailurePolicy::Recompute,
            PolicyArg::Fail => tandem_decode::FailurePolicy::Fail,
        },
        min_remote_prefill_tokens: a.disagg_min_tokens,
        role: if a.colocated { "both".into() } else { "decode".into() },
        watch_stdin: a.worker.watch_stdin,
        redis,
        core_share: a.worker.core_share_lock,
        models: Some(models),
    };
    let gpu = a.worker.engine.device == DeviceArg::Cuda;
    block_on(tandem_decode::run_with(engine, cfg, front_end), gpu)
}

/// The OpenAI API for a decode worker's own port (`--serve-openai`): the router's front end with
/// this worker as its one decode worker, this process's metrics, and no Redis.
fn openai_front_end(a: &DecodeArgs, name: &str) -> Result<tandem_decode::FrontEnd> {
    let path = a.model.path()?;
    let info = ModelInfo::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let (name, prefill, id) = (name.to_string(), a.prefill_workers.clone(), a.worker_id.clone());
    let api_keys = load_api_keys(a.api_keys_file.as_deref(), Default::default())?;
    Ok(Box::new(move |own: std::net::SocketAddr| {
        let cfg = tandem_router::RouterConfig {
            listen: own.to_string(),
            model_name: name,
            decode_workers: vec![own.to_string()],
            prefill_workers: prefill,
            watch_stdin: false,
            redis: None,
            routing: Default::default(),
            router_id: format!("{id}-api"),
            api_keys,
            max_body_bytes: tandem_router::MAX_BODY_BYTES,
            max_prompt_tokens: None,
            default_max_tokens: Some(DEFAULT_MAX_TOKENS),
            special_tokens: Default::default(),
            tool_call_parser: None,
            epp_listen: None,
            epp: Default::default(),
            catalog: None,
        };
        let state = tandem_router::front_end(info, &cfg, None)?;
        let upkeep = state.clone();
        tokio::spawn(async move {
            tandem_router::learn_workers(&upkeep).await;
            tandem_router::spawn_upkeep(upkeep, None);
        });
        Ok(tandem_router::api_routes(state))
    }))
}

/// `tandem prefill`.
pub fn run_prefill(a: PrefillArgs) -> Result<()> {
    // Before the model loads: a Redis setting that cannot work stops the process at once.
    let redis = a.worker.redis.config()?;
    if a.model.model_dir.is_some() {
        anyhow::bail!(
            "--model-dir is for decode workers and routers: models loaded while serving are prefilled on the decode workers"
        );
    }
    let (engine, name, kv_device) = load_engine(&a.model, &a.worker)?;
    let fault =
        std::env::var("TANDEM_FAULT_INJECT").ok().and_then(|s| tandem_prefill::Fault::parse(&s));
    let cfg = tandem_prefill::PrefillConfig {
        kv_device,
        model_name: name,
        worker_id: a.worker_id,
        listen: a.listen,
        transfer_timeout: a.worker.transfer_timeout,
        watch_stdin: a.worker.watch_stdin,
        drain_timeout: a.worker.drain_timeout,
        fault,
        redis,
        core_share: a.worker.core_share_lock,
    };
    let gpu = a.worker.engine.device == DeviceArg::Cuda;
    block_on(tandem_prefill::run(engine, cfg), gpu)
}

/// `tandem router`.
pub fn run_router(a: RouterArgs) -> Result<()> {
    let path = a.model.path()?;
    let mut info = ModelInfo::open(&path).with_context(|| format!("opening {}", path.display()))?;
    if let Some(t) = &a.chat_template {
        let src = std::fs::read_to_string(t)
            .with_context(|| format!("reading the chat template {}", t.display()))?;
        info.set_chat_template(&src).with_context(|| format!("chat template {}", t.display()))?;
    }
    let api_keys = api_keys(&a)?;
    let cfg = tandem_router::RouterConfig {
        listen: a.listen,
        model_name: a.model.served_name(&path),
        decode_workers: a.decode_workers,
        prefill_workers: a.prefill_workers,
        watch_stdin: a.watch_stdin,
        redis: a.redis.config()?,
        routing: tandem_router::routing::RoutingConfig {
            policy: match a.routing_policy {
                RoutingPolicyArg::Kv => tandem_router::routing::Policy::Kv,
                RoutingPolicyArg::RoundRobin => tandem_router::routing::Policy::RoundRobin,
                RoutingPolicyArg::LeastLoaded => tandem_router::routing::Policy::LeastLoaded,
            },
            cost: tandem_router::cost::CostConfig {
                overlap_weight: a.overlap_weight,
                decode_weight: a.decode_weight,
                margin: a.route_margin,
                ..Default::default()
            },
            approx_ttl: a.approx_ttl,
            max_prefill_queue_tokens: a.max_prefill_queue_tokens,
            ..Default::default()
        },
        router_id: a.router_id.unwrap_or_else(|| format!("router-{:x}", std::process::id())),
        api_keys,
        max_body_bytes: a.max_body_bytes,
        max_prompt_tokens: a.max_prompt_tokens,
        default_max_tokens: (a.default_max_tokens > 0).then_some(a.default_max_tokens),
        special_tokens: a.special_tokens_in_messages,
        tool_call_parser: a.tool_call_parser,
        epp_listen: a.epp_listen,
        epp: tandem_router::epp::PickerConfig { shed_waiting: a.epp_shed_waiting },
        catalog: a.model.catalog()?,
    };
    block_on(tandem_router::run(info, cfg), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_threads_default_by_device_and_refuse_what_is_not_a_count() {
        assert_eq!(runtime_threads(None, false).unwrap(), 2);
        assert_eq!(runtime_threads(Some(""), false).unwrap(), 2);
        assert_eq!(runtime_threads(None, true).unwrap(), GPU_RUNTIME_THREADS);
        assert_eq!(runtime_threads(Some(" 8 "), false).unwrap(), 8);
        assert_eq!(runtime_threads(Some("3"), true).unwrap(), 3);
        for bad in ["0", "65", "two", "-1"] {
            let e = runtime_threads(Some(bad), true).unwrap_err().to_string();
            assert!(e.contains("TANDEM_RUNTIME_THREADS"), "{bad}: {e}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn served_names() {
        let m = ModelArgs { model: None, served_model_name: None, model_dir: None };
        assert_eq!(
            m.served_name(Path::new("/c/SmolLM2-135M-Instruct.Q4_1.gguf")),
            "SmolLM2-135M-Instruct"
        );
        let m = ModelArgs { model: None, served_model_name: Some("x".into()), model_dir: None };
        assert_eq!(m.served_name(Path::new("/c/a.gguf")), "x");
    }
}
