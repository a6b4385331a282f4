//! OpenAI-compatible gateway.
//!
//! The router owns the HTTP API (`/v1/completions`, `/v1/chat/completions` with SSE streaming,
//! `/v1/models`, `/health`, `/metrics`). It tokenizes with the model's own tokenizer and chat
//! template, validates every parameter, picks a decode worker and a prefill worker, and relays
//! the decode worker's token stream to the client.
//!
//! - [`openai`]: request bodies and their validation.
//! - [`prompt`]: prompt text to token ids within the admission bounds (length, special tokens).
//! - [`responses`]: response bodies and streamed chunks.
//! - [`handlers`]: the HTTP handlers.
//! - [`routing`]: worker choice — [`kv_index`] (exact from KV events, approximate from
//!   decisions), [`cost`] (cached prefix against load), [`load`] (booked load shared among
//!   replicas) and [`sync`] (the Redis side of both).
//! - [`workers`]: worker channels and health.
//! - [`error`]: OpenAI error JSON.

pub mod auth;
pub mod beam;
pub mod cost;
pub mod epp;
pub mod error;
pub mod handlers;
pub mod kv_index;
pub mod load;
pub mod model_admin;
pub mod model_api;
pub mod models;
pub mod openai;
pub mod prompt;
mod relay;
pub mod responses;
pub mod routing;
pub mod state;
pub mod status_api;
pub mod structured;
pub mod sync;
pub mod tool_format;
pub mod tool_stream;
pub mod tools;
pub mod workers;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use tandem_engine::ModelInfo;

pub use state::AppState;
pub use workers::{WorkerPool, Workers};

/// Router settings.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// HTTP listen address, e.g. `127.0.0.1:8000`.
    pub listen: String,
    /// The name clients use for the model.
    pub model_name: String,
    /// Decode workers' gRPC addresses.
    pub decode_workers: Vec<String>,
    /// Prefill workers' gRPC addresses.
    pub prefill_workers: Vec<String>,
    /// Exit when standard input closes (started by `tandem up`).
    pub watch_stdin: bool,
    /// Redis for KV events and shared load; none: approximate routing.
    pub redis: Option<tandem_worker::redis::RedisConfig>,
    /// Routing policy and weights.
    pub routing: routing::RoutingConfig,
    /// This replica's name (metrics label).
    pub router_id: String,
    /// API keys for `/v1/*` (none: open).
    pub api_keys: Option<Arc<auth::ApiKeys>>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Longest prompt accepted, in tokens (none: the context window).
    pub max_prompt_tokens: Option<usize>,
    /// Completion budget of a chat request that sets neither `max_tokens` nor
    /// `max_completion_tokens` (none: the rest of the context window).
    pub default_max_tokens: Option<usize>,
    /// How special-token text inside chat messages is tokenized.
    pub special_tokens: prompt::SpecialTokens,
    /// How the model writes tool calls (none: read from the chat template).
    pub tool_call_parser: Option<tool_format::ToolCallFormat>,
    /// Serve the endpoint picker (`ext_proc`, with gRPC health) on this address.
    pub epp_listen: Option<String>,
    /// How the endpoint picker sheds load.
    pub epp: epp::PickerConfig,
    /// The directory models are loaded from while serving (none: the start-up model only).
    pub catalog: Option<tandem_worker::models::ModelCatalog>,
}

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// The HTTP application over `state`. With API keys, `/v1/*` and `/debug/routing` need one;
/// `/health` and `/metrics` stay open for probes and scrapers.
pub fn app(state: Arc<AppState>) -> axum::Router {
    api_routes(state.clone()).merge(
        axum::Router::new()
            .route("/health", get(status_api::health))
            .route("/metrics", get(status_api::metrics))
            .fallback(status_api::not_found)
            .method_not_allowed_fallback(status_api::method_not_allowed)
            .with_state(state),
    )
}

/// The OpenAI API (and `/tokenize`, `/detokenize`, the cluster view, `/debug/routing`) without
/// `/health`, `/metrics` or a fallback: what a worker that serves the API itself merges into
/// its own routes.
pub fn api_routes(state: Arc<AppState>) -> axum::Router {
    let mut guarded = axum::Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/models", get(model_api::models))
        .route("/v1/models/{id}", get(model_api::model).delete(model_admin::unload))
        .route("/v1/models/{id}/load", post(model_admin::load))
        .route("/tokenize", post(model_api::tokenize_handler))
        .route("/detokenize", post(model_api::detokenize_handler))
        .route("/v1/cluster/status", get(status_api::cluster_status))
        .route("/v1/cluster/nodes", get(status_api::cluster_nodes))
        .route("/debug/routing", get(status_api::debug_routing));
    if let Some(keys) = state.api_keys.clone() {
        guarded =
            guarded.route_layer(axum::middleware::from_fn_with_state(keys, auth::authenticate));
    }
    // Per route, so it holds wherever these routes are merged.
    guarded
        .method_not_allowed_fallback(status_api::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
}

/// The front end's state over `cfg`'s workers; `metrics` renders the router's `/metrics` (None
/// where the process serves its metrics itself). Nothing is contacted yet: see
/// [`learn_workers`] and [`spawn_upkeep`].
pub fn front_end(
    info: ModelInfo,
    cfg: &RouterConfig,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
) -> anyhow::Result<Arc<AppState>> {
    metrics::describe_counter!(
        "tandem_router_decisions_total",
        "Requests routed, by decode and prefill worker."
    );
    metrics::describe_counter!(
        "tandem_router_requests_total",
        "HTTP generation requests, by endpoint and status code."
    );
    metrics::describe_counter!(
        "tandem_router_routed_total",
        "Routing decisions, by the index used (exact or approximate)."
    );
    metrics::describe_counter!(
        "tandem_router_prefill_skipped_total",
        "Prompts prefilled on their decode worker because every prefill worker's queue was full."
    );
    metrics::describe_histogram!(
        "tandem_router_first_token_phase_seconds",
        metrics::Unit::Seconds,
        "A request's time to its first token on the router's clock, by phase: prepare (receipt to the first generate call), worker_accept (the generate calls until the workers' engine threads took the prompts), first_token_wait (from there to the first token's arrival)."
    );
    metrics::describe_histogram!(
        "tandem_router_prefix_match_blocks",
        "Prompt blocks the chosen worker already caches."
    );
    metrics::describe_gauge!(
        "tandem_router_index_blocks",
        "Blocks in the routing indexes (exact, approximate)."
    );
    metrics::describe_gauge!(
        "tandem_router_exact_index_live",
        "1 while KV events flow from Redis into the exact index."
    );
    metrics::describe_gauge!(
        "tandem_router_redis_up",
        "1 while the router reads KV events from Redis."
    );
    metrics::describe_gauge!(
        "tandem_router_worker_queued_prefill_tokens",
        "Prompt tokens booked for prefill on a worker, all routers."
    );
    metrics::describe_gauge!(
        "tandem_router_worker_active_decode_blocks",
        "KV blocks booked for decoding on a worker, all routers."
    );
    metrics::describe_counter!(
        "tandem_router_kv_events_total",
        "KV events read, by result (applied, new_epoch, stale, gap)."
    );
    metrics::describe_counter!(
        "tandem_router_index_resyncs_total",
        "Workers resynchronised from their Status."
    );
    let pool = Workers::new(&cfg.decode_workers, &cfg.prefill_workers)?;
    let routing = routing::Routing::new(cfg.routing.clone());
    let mut state = AppState::new(cfg.model_name.clone(), info, pool, routing, metrics);
    state.api_keys = cfg.api_keys.clone();
    state.max_body_bytes = cfg.max_body_bytes;
    state.max_prompt_tokens = cfg.max_prompt_tokens;
    state.default_max_tokens = cfg.default_max_tokens;
    state.special_tokens = cfg.special_tokens;
    let startup = Arc::get_mut(&mut state.models.startup).expect("the table is not shared yet");
    if let Some(f) = cfg.tool_call_parser {
        startup.tool_format = f;
    }
    tracing::info!(tool_call_format = startup.tool_format.name(), "tool calls");
    state.models.catalog = cfg.catalog.clone();
    if let Some(redis) = &cfg.redis {
        state.load_sync = Some(sync::LoadSync::new(redis.clone(), &cfg.router_id));
    }
    Ok(Arc::new(state))
}

/// Asks every worker for its status once (ids, block size, health).
pub async fn learn_workers(state: &AppState) {
    state.pool.refresh().await;
    state.pool.current().check_all(Duration::from_secs(1)).await;
}

/// Checks the workers every second (and their DNS entries every five), publishes the routing
/// gauges, and reads the KV events from Redis when configured.
pub fn spawn_upkeep(state: Arc<AppState>, redis: Option<&tandem_worker::redis::RedisConfig>) {
    let checker = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut n: u64 = 0;
        loop {
            tick.tick().await;
            n += 1;
            // DNS entries (a headless Service) are looked up every 5 s.
            if checker.pool.dynamic() && n.is_multiple_of(5) {
                for w in checker.pool.refresh().await {
                    checker.routing.forget(&w);
                }
            }
            let pool = checker.pool.current();
            for (addr, role, r) in pool.check_all(Duration::from_secs(1)).await {
                if let Err(e) = r {
                    tracing::debug!(%addr, role, error = %e, "worker status check failed");
                    if let Some(w) = pool.all().find(|w| w.addr == addr) {
                        checker.routing.forget(w);
                    }
                }
            }
            checker.routing.publish_gauges(&pool);
            model_admin::adopt(&checker);
        }
    });
    if let Some(redis) = redis {
        sync::spawn(state, redis.clone());
    }
}

/// Serves the endpoint picker ([`epp`]) and the gRPC health service on `addr`, in the
/// background.
async fn serve_picker(
    state: Arc<AppState>,
    addr: &str,
    cfg: epp::PickerConfig,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let picker = epp::Picker::new(state, cfg).server();
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer<epp::Picker>>().await;
    tracing::info!(addr = %local, "endpoint picker (ext_proc) serving");
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(health)
            .add_service(picker)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the endpoint picker stopped");
        }
    });
    Ok(())
}

/// Runs the router until shutdown. Prints `TANDEM_READY router <addr>` once serving.
pub async fn run(info: ModelInfo, cfg: RouterConfig) -> anyhow::Result<()> {
    let metrics = tandem_worker::metrics::install(&cfg.model_name, "router", &cfg.router_id)?;
    let state = front_end(info, &cfg, Some(metrics))?;
    // Learn the workers (ids, block size) before routing or reading events.
    learn_workers(&state).await;
    spawn_upkeep(state.clone(), cfg.redis.as_ref());
    if let Some(addr) = &cfg.epp_listen {
        serve_picker(state.clone(), addr, cfg.epp).await?;
    }
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, decode = ?cfg.decode_workers, prefill = ?cfg.prefill_workers, "router serving the OpenAI API");
    tandem_worker::serve::announce_ready("router", addr);
    tandem_worker::serve::serve_http(
        tandem_worker::serve::nodelay(listener),
        app(state),
        tandem_worker::serve::CONN_LIMITS,
        tandem_worker::serve::shutdown_signal(cfg.watch_stdin),
    )
    .await?;
    Ok(())
}
