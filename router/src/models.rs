//! The models the gateway serves: the start-up model, and models loaded while it runs
//! (`POST /v1/models/{id}/load`) from the model directory its workers share.
//!
//! Each model carries what the gateway needs of it — its name, tokenizer, chat template, tool
//! call format and structured-output compiler — so a request is tokenized, checked and relayed
//! with its own model's. A request holds its [`ServedModel`] until it ends, so unloading a
//! model never pulls the tokenizer from under a running request.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use serde_json::{json, Value};
use tandem_engine::sampling::structured::{GrammarCompiler, StructuredError};
use tandem_engine::ModelInfo;
use tandem_worker::models::ModelCatalog;

use crate::error::ApiError;
use crate::tool_format::ToolCallFormat;

/// One model as the gateway serves it.
pub struct ServedModel {
    /// The name clients use.
    pub name: String,
    /// Tokenizer, chat template and configuration.
    pub info: ModelInfo,
    /// How the model writes tool calls (from its chat template unless set).
    pub tool_format: ToolCallFormat,
    /// When it became servable (Unix seconds).
    pub created: u64,
    /// Whether it is the start-up model.
    pub startup: bool,
    /// Longest prompt plus output its workers run it with (0 for the start-up model: read from
    /// the workers' status as it changes).
    pub max_model_len: usize,
    grammars: OnceLock<Result<GrammarCompiler, StructuredError>>,
}

impl ServedModel {
    /// The model `name` over `info`, created at `created`, run with a context of
    /// `max_model_len` tokens.
    pub fn new(
        name: &str,
        info: ModelInfo,
        created: u64,
        startup: bool,
        max_model_len: usize,
    ) -> ServedModel {
        let tool_format = info
            .chat_template
            .as_ref()
            .map(|t| ToolCallFormat::from_template(t.source()))
            .unwrap_or_default();
        ServedModel {
            name: name.to_string(),
            info,
            tool_format,
            created,
            startup,
            max_model_len,
            grammars: OnceLock::new(),
        }
    }

    /// The constraint compiler for the model's vocabulary (built on first use).
    pub(crate) fn grammars(&self) -> Result<&GrammarCompiler, &StructuredError> {
        self.grammars
            .get_or_init(|| GrammarCompiler::new(&self.info.tokenizer, self.info.config.vocab_size))
            .as_ref()
    }
}

/// Where a model loaded after start-up stands.
#[derive(Clone)]
pub enum Phase {
    /// The workers are loading it.
    Loading,
    /// Every decode worker serves it.
    Ready(Arc<ServedModel>),
    /// New requests are refused; the workers finish its running ones, then free it.
    Unloading(Arc<ServedModel>),
    /// The load failed (why).
    Failed(String),
}

impl Phase {
    /// The state's name in the API.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::Ready(_) => "ready",
            Phase::Unloading(_) => "unloading",
            Phase::Failed(_) => "failed",
        }
    }
}

/// The start-up model and the models loaded since.
pub struct ModelTable {
    /// The model the gateway started with (never unloaded).
    pub startup: Arc<ServedModel>,
    /// The directory models are loaded from (none: only the start-up model).
    pub catalog: Option<ModelCatalog>,
    loaded: RwLock<BTreeMap<String, Phase>>,
}

impl ModelTable {
    /// A table of the start-up model alone, loading from `catalog`.
    pub fn new(startup: ServedModel, catalog: Option<ModelCatalog>) -> ModelTable {
        ModelTable { startup: Arc::new(startup), catalog, loaded: RwLock::new(BTreeMap::new()) }
    }

    /// The model a request names: 404 for an unknown name, 503 while it loads or unloads.
    pub fn resolve(&self, name: &str) -> Result<Arc<ServedModel>, ApiError> {
        if name == self.startup.name {
            return Ok(self.startup.clone());
        }
        match self.phase(name) {
            Some(Phase::Ready(m)) => Ok(m),
            Some(Phase::Loading) => {
                Err(ApiError::unavailable(format!("the model `{name}` is still loading")))
            }
            Some(Phase::Unloading(_)) => {
                Err(ApiError::unavailable(format!("the model `{name}` is being unloaded")))
            }
            Some(Phase::Failed(_)) | None => Err(ApiError::model_not_found(name)),
        }
    }

    /// Where model `name` (loaded after start-up) stands.
    pub fn phase(&self, name: &str) -> Option<Phase> {
        self.loaded.read().expect("model table lock").get(name).cloned()
    }

    /// Every model loaded after start-up with its phase, by name.
    pub fn phases(&self) -> Vec<(String, Phase)> {
        let t = self.loaded.read().expect("model table lock");
        t.iter().map(|(n, p)| (n.clone(), p.clone())).collect()
    }

    /// Sets the phase of `name`; returns the previous one.
    pub(crate) fn set(&self, name: &str, phase: Phase) -> Option<Phase> {
        self.loaded.write().expect("model table lock").insert(name.to_string(), phase)
    }

    /// Sets the phase of `name` if `f` accepts the current one (atomically); returns the
    /// current phase either way (before the change).
    pub(crate) fn update(
        &self,
        name: &str,
        f: impl FnOnce(Option<&Phase>) -> Option<Phase>,
    ) -> Option<Phase> {
        let mut t = self.loaded.write().expect("model table lock");
        let before = t.get(name).cloned();
        if let Some(next) = f(before.as_ref()) {
            t.insert(name.to_string(), next);
        }
        before
    }

    /// Forgets `name`.
    pub(crate) fn remove(&self, name: &str) -> Option<Phase> {
        self.loaded.write().expect("model table lock").remove(name)
    }
}

/// A model object as `GET /v1/models` lists it, with Tandem's `status` beside OpenAI's fields.
pub fn model_object(m: &ServedModel, max_model_len: usize, status: &str) -> Value {
    json!({
        "id": m.name, "object": "model", "created": m.created, "owned_by": "tandem",
        "root": m.name, "max_model_len": max_model_len, "status": status,
    })
}

/// A model object for a model that is not servable (loading, or its load failed).
pub fn pending_object(name: &str, phase: &Phase) -> Value {
    let mut v =
        json!({ "id": name, "object": "model", "owned_by": "tandem", "status": phase.name() });
    if let Phase::Failed(e) = phase {
        v["error"] = json!(e);
    }
    v
}
