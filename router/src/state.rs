//! `AppState`: what every gateway handler shares — the models, the workers, routing and limits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusHandle;
use tandem_engine::ModelInfo;

use crate::auth::ApiKeys;
use crate::models::{ModelTable, ServedModel};
use crate::prompt::SpecialTokens;
use crate::routing::Routing;
use crate::workers::Workers;

/// Everything the handlers share.
pub struct AppState {
    /// The models served: the start-up model and those loaded since.
    pub models: ModelTable,
    /// Decode and prefill workers.
    pub pool: Workers,
    /// Worker choice: indexes, load, decisions.
    pub routing: Routing,
    /// Load shared with other router replicas (with Redis).
    pub load_sync: Option<crate::sync::LoadSync>,
    /// Renders `/metrics`, when a recorder is installed.
    pub metrics: Option<PrometheusHandle>,
    /// When the router started (Unix seconds).
    pub started: u64,
    /// API keys (none: the gateway is open).
    pub api_keys: Option<Arc<ApiKeys>>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Longest prompt accepted, in tokens (none: the context window is the limit).
    pub max_prompt_tokens: Option<usize>,
    /// Completion budget of a chat request that gives none (none: the rest of the context).
    pub default_max_tokens: Option<usize>,
    /// How special-token text inside chat messages is tokenized.
    pub special_tokens: SpecialTokens,
    /// A request body that sends nothing for this long is refused (408).
    pub body_read_timeout: Duration,
    /// Requests being parsed and tokenized at once (off the async threads), at most one per
    /// core: a flood of large prompts queues here instead of taking every thread.
    pub(crate) tokenizing: tokio::sync::Semaphore,
    ids: AtomicU64,
}

impl AppState {
    /// The state over a model (`model_name`, `info`) and its workers.
    pub fn new(
        model_name: String,
        info: ModelInfo,
        pool: Workers,
        routing: Routing,
        metrics: Option<PrometheusHandle>,
    ) -> AppState {
        let started = unix_now();
        let seed =
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
                ^ (std::process::id() as u64) << 40;
        AppState {
            models: ModelTable::new(ServedModel::new(&model_name, info, started, true, 0), None),
            pool,
            routing,
            load_sync: None,
            metrics,
            started,
            api_keys: None,
            max_body_bytes: crate::MAX_BODY_BYTES,
            max_prompt_tokens: None,
            default_max_tokens: None,
            special_tokens: SpecialTokens::default(),
            body_read_timeout: Duration::from_secs(10),
            tokenizing: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()),
            ),
            ids: AtomicU64::new(seed),
        }
    }

    pub(crate) fn new_id(&self, prefix: &str) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// The context length of model `m`: what its workers run it with, or its configuration's.
    pub(crate) fn max_model_len(&self, m: &ServedModel) -> usize {
        let reported =
            if m.startup { self.pool.current().max_model_len() } else { m.max_model_len };
        match reported {
            0 => m.info.config.max_position_embeddings,
            n => n,
        }
    }

    /// The most tokens a prompt for `m` may have: `--max-prompt-tokens`, and one less than the
    /// context.
    pub(crate) fn prompt_limit(&self, m: &ServedModel) -> usize {
        self.max_prompt_tokens
            .unwrap_or(usize::MAX)
            .min(self.max_model_len(m).saturating_sub(1))
            .max(1)
    }
}

impl crate::sync::Shared for AppState {
    fn routing(&self) -> &Routing {
        &self.routing
    }
    fn workers(&self) -> &Workers {
        &self.pool
    }
    fn load_sync(&self) -> Option<&crate::sync::LoadSync> {
        self.load_sync.as_ref()
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
