//! The router's operational endpoints: `/health`, `/metrics`, `/debug/routing`, and the
//! OpenAI-style answers to unknown paths and methods.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::AppState;

/// One worker as the cluster endpoints and `/health` show it.
fn worker_json(
    addr: &str,
    role: &str,
    r: &Result<tandem_proto::v1::WorkerStatus, String>,
) -> Value {
    match r {
        Ok(s) => json!({
            "address": addr, "role": role, "healthy": s.healthy, "worker_id": s.worker_id,
            "device": s.device, "model": s.model, "running": s.running, "waiting": s.waiting,
            "queued_prefill_tokens": s.queued_prefill_tokens, "free_blocks": s.free_blocks,
            "num_blocks": s.num_blocks, "block_size": s.block_size,
            "kv_usage": if s.num_blocks > 0 { 1.0 - s.free_blocks as f64 / s.num_blocks as f64 } else { 0.0 },
            "loaded_models": s.models.iter().map(|m| json!({
                "model": m.model, "state": m.state, "error": m.error, "active": m.active,
                "num_blocks": m.num_blocks, "free_blocks": m.free_blocks, "max_model_len": m.max_model_len,
            })).collect::<Vec<_>>(),
        }),
        Err(e) => json!({ "address": addr, "role": role, "healthy": false, "error": e }),
    }
}

/// `GET /health`: `healthy` (200) when every worker answers, `degraded` (200) while a decode
/// worker answers but some worker does not, `unhealthy` (503) when no decode worker answers;
/// `reason` says which workers are missing and what that means.
pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    let checks = st.pool.current().check_all(Duration::from_secs(1)).await;
    // A worker that answers its status check counts as up (its own `healthy` is in the list).
    let up = |r: &Result<tandem_proto::v1::WorkerStatus, String>| r.is_ok();
    let decode_ok = checks.iter().any(|(_, role, r)| *role == "decode" && up(r));
    let down: Vec<String> = checks
        .iter()
        .filter(|(_, _, r)| !up(r))
        .map(|(a, role, _)| format!("{role} worker {a}"))
        .collect();
    let workers: Vec<Value> = checks.iter().map(|(a, role, r)| worker_json(a, role, r)).collect();
    let (code, status, reason) = match (decode_ok, down.is_empty()) {
        (true, true) => (StatusCode::OK, "healthy", format!("all {} workers answer", checks.len())),
        // A dead prefill worker's prompts are prefilled on the decode workers meanwhile.
        (true, false) => {
            (StatusCode::OK, "degraded", format!("serving; not answering: {}", down.join(", ")))
        }
        (false, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "unhealthy",
            format!("no decode worker answers; not answering: {}", down.join(", ")),
        ),
    };
    (code, axum::Json(json!({ "status": status, "reason": reason, "workers": workers })))
        .into_response()
}

/// `GET /v1/cluster/nodes`: every worker with its role, device, load and KV usage.
pub async fn cluster_nodes(State(st): State<Arc<AppState>>) -> Response {
    let checks = st.pool.current().check_all(Duration::from_secs(1)).await;
    let nodes: Vec<Value> = checks.iter().map(|(a, role, r)| worker_json(a, role, r)).collect();
    axum::Json(json!({ "object": "list", "data": nodes })).into_response()
}

/// `GET /v1/cluster/status`: the fleet's capacity and use, summed over the workers that answer
/// (the numbers the metrics export per worker).
pub async fn cluster_status(State(st): State<Arc<AppState>>) -> Response {
    let checks = st.pool.current().check_all(Duration::from_secs(1)).await;
    let mut roles = serde_json::Map::new();
    for role in ["prefill", "decode"] {
        let of_role: Vec<_> = checks.iter().filter(|(_, r, _)| *r == role).collect();
        let ok: Vec<_> =
            of_role.iter().filter_map(|(_, _, r)| r.as_ref().ok()).filter(|s| s.healthy).collect();
        let (blocks, free) = ok
            .iter()
            .fold((0u64, 0u64), |(b, f), s| (b + s.num_blocks as u64, f + s.free_blocks as u64));
        roles.insert(
            role.into(),
            json!({
                "workers": of_role.len(), "healthy": ok.len(),
                "running": ok.iter().map(|s| s.running as u64).sum::<u64>(),
                "waiting": ok.iter().map(|s| s.waiting as u64).sum::<u64>(),
                "kv_blocks": blocks, "kv_free_blocks": free,
                "kv_usage": if blocks > 0 { 1.0 - free as f64 / blocks as f64 } else { 0.0 },
            }),
        );
    }
    let index = if st.routing.exact_live.load(std::sync::atomic::Ordering::Relaxed) {
        "exact"
    } else {
        "approximate"
    };
    let loaded: Vec<Value> = st
        .models
        .phases()
        .into_iter()
        .map(|(name, p)| json!({ "model": name, "status": p.name() }))
        .collect();
    axum::Json(json!({ "model": st.models.startup.name, "loaded_models": loaded, "routing_index": index, "roles": roles }))
        .into_response()
}

/// `GET /debug/routing`: the index, the loads and the last routing decisions with every
/// candidate's cached blocks, load and cost.
pub async fn debug_routing(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(st.routing.debug(&st.pool.current())).into_response()
}

/// `GET /metrics`.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    match &st.metrics {
        Some(h) => tandem_worker::metrics::render(h).into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

/// Unknown paths: OpenAI-style 404.
pub async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no route for {}", uri.path()),
        kind: "not_found_error",
        param: None,
        code: None,
    }
    .into_response()
}

/// Wrong method on a known path: OpenAI-style 405.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("method {method} is not allowed on {}", uri.path()),
        kind: "invalid_request_error",
        param: None,
        code: None,
    }
    .into_response()
}
