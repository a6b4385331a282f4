//! `AppState`: what every gateway handler shares — the model, the workers, routing, limits and
//! the structured-output compiler.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusHandle;
use tandem_engine::sampling::structured::{GrammarCompiler, StructuredError};
use tandem_engine::ModelInfo;

use crate::auth::ApiKeys;
use crate::prompt::SpecialTokens;
use crate::routing::Routing;
use crate::workers::Workers;

/// Everything the handlers share.
pub struct AppState {
    /// The name clients use for the model.
    pub model_name: String,
    /// Tokenizer, chat template and configuration of the model.
    pub info: ModelInfo,
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
    /// How the model writes tool calls (from the chat template unless set).
    pub tool_format: crate::tool_format::ToolCallFormat,
    /// A request body that sends nothing for this long is refused (408).
    pub body_read_timeout: Duration,
    /// Requests being parsed and tokenized at once (off the async threads), at most one per
    /// core: a flood of large prompts queues here instead of taking every thread.
    pub(crate) tokenizing: tokio::sync::Semaphore,
    ids: AtomicU64,
    /// Structured-output constraints are compiled here too, to refuse bad ones early.
    grammars: std::sync::OnceLock<Result<GrammarCompiler, StructuredError>>,
}

impl AppState {
    /// The state over a model and its workers.
    pub fn new(
        model_name: String,
        info: ModelInfo,
        pool: Workers,
        routing: Routing,
        metrics: Option<PrometheusHandle>,
    ) -> AppState {
        let started = unix_now();
        let tool_format = info
            .chat_template
            .as_ref()
            .map(|t| crate::tool_format::ToolCallFormat::from_template(t.source()))
            .unwrap_or_default();
        let seed =
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
                ^ (std::process::id() as u64) << 40;
        AppState {
            model_name,
            info,
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
            tool_format,
            body_read_timeout: Duration::from_secs(10),
            tokenizing: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()),
            ),
            ids: AtomicU64::new(seed),
            grammars: std::sync::OnceLock::new(),
        }
    }

    /// The constraint compiler for the model's vocabulary (built on first use).
    pub(crate) fn grammars(&self) -> Result<&GrammarCompiler, &StructuredError> {
        self.grammars
            .get_or_init(|| GrammarCompiler::new(&self.info.tokenizer, self.info.config.vocab_size))
            .as_ref()
    }

    pub(crate) fn new_id(&self, prefix: &str) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    pub(crate) fn max_model_len(&self) -> usize {
        match self.pool.current().max_model_len() {
            0 => self.info.config.max_position_embeddings,
            n => n,
        }
    }

    /// The most tokens a prompt may have: `--max-prompt-tokens`, and one less than the context.
    pub(crate) fn prompt_limit(&self) -> usize {
        self.max_prompt_tokens
            .unwrap_or(usize::MAX)
            .min(self.max_model_len().saturating_sub(1))
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
