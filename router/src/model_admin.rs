//! Loading and unloading models while serving: `POST /v1/models/{id}/load` and
//! `DELETE /v1/models/{id}`.
//!
//! A model is named from the model directory (`--model-dir`) the gateway and its decode workers
//! share. Loading asks every healthy decode worker to load it (each builds its own engine and
//! KV cache beside the models it serves) and answers `202` with `status: loading` at once; the
//! model turns `ready` — servable by name — once every one of them reports it ready. Unloading
//! refuses new requests for it at once (503), lets the workers finish its running requests,
//! and forgets the model once no worker lists it (their memory is returned). Other gateway
//! replicas learn both from the workers' status ([`adopt`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tandem_engine::ModelInfo;

use crate::error::ApiError;
use crate::handlers::{check_content_type, read_body};
use crate::model_api::object_of;
use crate::models::{Phase, ServedModel};
use crate::state::{unix_now, AppState};
use crate::workers::Worker;

/// Longest a load may take on the workers.
const LOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// How often a load or an unload asks the workers how far they are.
const POLL: Duration = Duration::from_millis(100);
/// Longest an unload waits for the workers to drain (their own drain limit comes first).
const UNLOAD_TIMEOUT: Duration = Duration::from_secs(900);

fn conflict(message: String) -> ApiError {
    ApiError { status: StatusCode::CONFLICT, ..ApiError::invalid(None, message) }
}

/// The optional body of a load: the model's KV cache size.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadRequest {
    /// `"512MiB"`, `"2GiB"` or a number of bytes; absent: the workers' `--kv-cache-memory`.
    kv_cache_memory: Option<Value>,
}

/// The KV cache bytes a load asks for, from its body (empty: none asked).
fn kv_cache_bytes(body: &[u8]) -> Result<Option<u64>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let r: LoadRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("invalid request body: {e}")))?;
    let param = Some("kv_cache_memory");
    let bytes = match r.kv_cache_memory {
        None => return Ok(None),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
            ApiError::invalid(param, "kv_cache_memory must be a whole number of bytes")
        })?,
        Some(Value::String(s)) => {
            tandem_worker::models::parse_size(&s).map_err(|e| ApiError::invalid(param, e))?
        }
        Some(_) => {
            return Err(ApiError::invalid(param, "kv_cache_memory is a size such as \"512MiB\""))
        }
    };
    if bytes == 0 {
        return Err(ApiError::invalid(param, "kv_cache_memory must be more than 0 bytes"));
    }
    Ok(Some(bytes))
}

/// `POST /v1/models/{id}/load` (body optional: `{"kv_cache_memory": "512MiB"}`, the model's own
/// KV cache on each worker): `202` with `status: loading` (or the model as it stands when it is
/// already loading or ready).
pub async fn load(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let res = async {
        let body = read_body(body, st.max_body_bytes, st.body_read_timeout).await?;
        if !body.iter().all(u8::is_ascii_whitespace) {
            check_content_type(&headers)?;
        }
        start_load(&st, &id, kv_cache_bytes(&body)?)
    };
    match res.await {
        Ok((code, v)) => (code, axum::Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

fn start_load(
    st: &Arc<AppState>,
    id: &str,
    kv_cache_bytes: Option<u64>,
) -> Result<(StatusCode, Value), ApiError> {
    let object = |st: &AppState| object_of(st, id).unwrap_or(Value::Null);
    if id == st.models.startup.name {
        return Ok((StatusCode::OK, object(st)));
    }
    let catalog = st.models.catalog.as_ref().ok_or_else(|| {
        ApiError::invalid(
            None,
            format!(
                "this gateway has no model directory (--model-dir): it serves only `{}`",
                st.models.startup.name
            ),
        )
    })?;
    let path = catalog.path(id).map_err(|_| ApiError::model_not_found(id))?;
    let before = st.models.update(id, |p| match p {
        None | Some(Phase::Failed(_)) => Some(Phase::Loading),
        _ => None,
    });
    match before {
        Some(Phase::Ready(_)) => return Ok((StatusCode::OK, object(st))),
        Some(Phase::Loading) => return Ok((StatusCode::ACCEPTED, object(st))),
        Some(Phase::Unloading(_)) => {
            return Err(conflict(format!(
                "the model `{id}` is being unloaded; load it again once it is gone"
            )))
        }
        None | Some(Phase::Failed(_)) => {}
    }
    tracing::info!(model = id, path = %path.display(), "loading a model");
    tokio::spawn(load_task(st.clone(), id.to_string(), path, kv_cache_bytes));
    Ok((StatusCode::ACCEPTED, object(st)))
}

async fn load_task(st: Arc<AppState>, name: String, path: PathBuf, kv_cache_bytes: Option<u64>) {
    let started = Instant::now();
    match load_everywhere(&st, &name, path, kv_cache_bytes).await {
        Ok(m) => {
            tracing::info!(model = %name, seconds = started.elapsed().as_secs_f64(), "model ready");
            st.models.set(&name, Phase::Ready(Arc::new(m)));
        }
        Err(e) => {
            tracing::warn!(model = %name, error = %e, "loading the model failed");
            st.models.set(&name, Phase::Failed(e));
            // What some workers loaded is not served: free it.
            for w in st.pool.current().decode.iter() {
                let _ = w.unload_model(&name).await;
            }
        }
    }
}

/// Model `name` as served from now on, with the shortest context any decode worker's last
/// status gave it (each status call records the worker's models).
fn served(st: &AppState, name: &str, info: ModelInfo) -> ServedModel {
    let pool = st.pool.current();
    let lens = pool.decode.iter().filter_map(|w| w.model(name)).map(|s| s.max_model_len as usize);
    ServedModel::new(name, info, unix_now(), false, lens.min().unwrap_or(0))
}

async fn open_info(path: PathBuf) -> Result<ModelInfo, String> {
    let shown = path.display().to_string();
    tokio::task::spawn_blocking(move || ModelInfo::open(&path))
        .await
        .map_err(|e| format!("opening {shown}: {e}"))?
        .map_err(|e| format!("opening {shown}: {e}"))
}

async fn load_everywhere(
    st: &AppState,
    name: &str,
    path: PathBuf,
    kv_cache_bytes: Option<u64>,
) -> Result<ServedModel, String> {
    let info = open_info(path).await?;
    let workers: Vec<Arc<Worker>> =
        st.pool.current().decode.iter().filter(|w| w.healthy()).cloned().collect();
    if workers.is_empty() {
        return Err("no decode worker is healthy".into());
    }
    for w in &workers {
        w.load_model(name, kv_cache_bytes)
            .await
            .map_err(|e| format!("worker {}: {}", w.addr, e.message()))?;
    }
    let deadline = Instant::now() + LOAD_TIMEOUT;
    loop {
        tokio::time::sleep(POLL).await;
        let mut ready = 0;
        for w in &workers {
            let s = w.status(Duration::from_secs(2), false).await?;
            match s.models.iter().find(|m| m.model == name) {
                Some(m) if m.state == "ready" => ready += 1,
                Some(m) if m.state == "failed" => {
                    return Err(format!("worker {}: {}", w.addr, m.error));
                }
                Some(_) => {}
                None => return Err(format!("worker {} no longer lists the model", w.addr)),
            }
        }
        if ready == workers.len() {
            return Ok(served(st, name, info));
        }
        if Instant::now() > deadline {
            return Err(format!("the workers did not load it within {LOAD_TIMEOUT:?}"));
        }
    }
}

/// `DELETE /v1/models/{id}`: `202` with `status: unloading` while the workers drain it; a
/// model whose load failed is forgotten at once (`deleted: true`).
pub async fn unload(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match start_unload(&st, &id) {
        Ok((code, v)) => (code, axum::Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

fn start_unload(st: &Arc<AppState>, id: &str) -> Result<(StatusCode, Value), ApiError> {
    if id == st.models.startup.name {
        return Err(ApiError::invalid(
            Some("model"),
            format!("`{id}` is the model this gateway started with; it cannot be unloaded"),
        ));
    }
    let before = st.models.update(id, |p| match p {
        Some(Phase::Ready(m)) => Some(Phase::Unloading(m.clone())),
        _ => None,
    });
    let unloading = json!({ "id": id, "object": "model", "deleted": false, "status": "unloading" });
    match before {
        None => Err(ApiError::model_not_found(id)),
        Some(Phase::Loading) => {
            Err(conflict(format!("the model `{id}` is still loading; unload it once it is ready")))
        }
        Some(Phase::Failed(_)) => {
            st.models.remove(id);
            Ok((StatusCode::OK, json!({ "id": id, "object": "model", "deleted": true })))
        }
        Some(Phase::Unloading(_)) => Ok((StatusCode::ACCEPTED, unloading)),
        Some(Phase::Ready(_)) => {
            tracing::info!(model = id, "unloading a model");
            tokio::spawn(unload_task(st.clone(), id.to_string()));
            Ok((StatusCode::ACCEPTED, unloading))
        }
    }
}

async fn unload_task(st: Arc<AppState>, name: String) {
    let started = Instant::now();
    let workers: Vec<Arc<Worker>> = st.pool.current().decode.to_vec();
    for w in &workers {
        if let Err(e) = w.unload_model(&name).await {
            if e.code() != tonic::Code::NotFound {
                tracing::warn!(model = %name, worker = %w.addr, error = %e.message(), "unloading the model failed");
            }
        }
    }
    loop {
        tokio::time::sleep(POLL).await;
        let mut listed = false;
        for w in &workers {
            // A worker that does not answer has nothing to drain for this gateway.
            if let Ok(s) = w.status(Duration::from_secs(2), false).await {
                listed |= s.models.iter().any(|m| m.model == name);
            }
        }
        if !listed {
            break;
        }
        if started.elapsed() > UNLOAD_TIMEOUT {
            tracing::warn!(model = %name, "the workers still list the model; forgetting it anyway");
            break;
        }
    }
    st.models.remove(&name);
    tracing::info!(model = %name, seconds = started.elapsed().as_secs_f64(), "model unloaded");
}

/// Brings the table in line with the workers (another gateway replica loaded or unloaded a
/// model, or a worker restarted): a model every healthy decode worker lists ready and the model
/// directory holds becomes servable here; a ready model that no healthy decode worker lists is
/// forgotten. Runs with the workers' status checks.
pub fn adopt(st: &Arc<AppState>) {
    let pool = st.pool.current();
    let healthy: Vec<&Arc<Worker>> = pool.decode.iter().filter(|w| w.healthy()).collect();
    if healthy.is_empty() {
        return;
    }
    let mut names: Vec<String> =
        healthy[0].models().into_iter().filter(|m| m.state == "ready").map(|m| m.model).collect();
    names.retain(|n| healthy.iter().all(|w| w.serves(n)));
    if let Some(catalog) = &st.models.catalog {
        for name in names {
            let Ok(path) = catalog.path(&name) else { continue };
            let fresh =
                st.models.update(&name, |p| p.is_none().then_some(Phase::Loading)).is_none();
            if fresh {
                tracing::info!(model = %name, "the workers serve a model loaded elsewhere; adopting it");
                tokio::spawn(adopt_task(st.clone(), name, path));
            }
        }
    }
    for (name, phase) in st.models.phases() {
        if matches!(phase, Phase::Ready(_)) && !healthy.iter().any(|w| w.model(&name).is_some()) {
            tracing::info!(model = %name, "no worker lists the model any more; forgetting it");
            st.models.remove(&name);
        }
    }
}

async fn adopt_task(st: Arc<AppState>, name: String, path: PathBuf) {
    match open_info(path).await {
        Ok(info) => {
            st.models.set(&name, Phase::Ready(Arc::new(served(&st, &name, info))));
        }
        Err(e) => {
            tracing::warn!(model = %name, error = %e, "adopting the model failed");
            st.models.remove(&name);
        }
    }
}
