//! OpenAI-compatible gateway.
//!
//! The router owns the HTTP API (`/v1/completions`, `/v1/chat/completions` with SSE streaming,
//! `/v1/models`, `/health`, `/metrics`). It tokenizes with the model's own tokenizer and chat
//! template, validates every parameter, picks a decode worker and a prefill worker, and relays
//! the decode worker's token stream to the client.
//!
//! - [`openai`]: request bodies and their validation.
//! - [`responses`]: response bodies and streamed chunks.
//! - [`handlers`]: the HTTP handlers.
//! - [`workers`]: worker channels, health and load.
//! - [`error`]: OpenAI error JSON.

pub mod error;
pub mod handlers;
pub mod openai;
pub mod responses;
pub mod workers;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use tandem_engine::ModelInfo;

pub use handlers::AppState;
pub use workers::WorkerPool;

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
}

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 32 << 20;

/// The HTTP application over `state`.
pub fn app(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/models", get(handlers::models))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Runs the router until shutdown. Prints `TANDEM_READY router <addr>` once serving.
pub async fn run(info: ModelInfo, cfg: RouterConfig) -> anyhow::Result<()> {
    let metrics = tandem_worker::metrics::install(&cfg.model_name, "router", "router-0")?;
    metrics::describe_counter!("tandem_router_decisions_total", "Requests routed, by decode and prefill worker.");
    metrics::describe_counter!("tandem_router_requests_total", "HTTP generation requests, by endpoint and status code.");
    let pool = WorkerPool::new(&cfg.decode_workers, &cfg.prefill_workers)?;
    let state = Arc::new(AppState::new(cfg.model_name.clone(), info, pool, Some(metrics)));
    let checker = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tick.tick().await;
            for (addr, role, r) in checker.pool.check_all(Duration::from_secs(1)).await {
                if let Err(e) = r {
                    tracing::debug!(%addr, role, error = %e, "worker status check failed");
                }
            }
        }
    });
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, decode = ?cfg.decode_workers, prefill = ?cfg.prefill_workers, "router serving the OpenAI API");
    tandem_worker::serve::announce_ready("router", addr);
    axum::serve(listener, app(state)).with_graceful_shutdown(tandem_worker::serve::shutdown_signal(cfg.watch_stdin)).await?;
    Ok(())
}
