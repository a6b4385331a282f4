//! The router's operational endpoints: `/health`, `/metrics`, `/debug/routing`, and the
//! OpenAI-style answers to unknown paths and methods.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::handlers::AppState;

/// `GET /health`: 200 only when at least one decode worker answers its status check; the
/// status says `degraded` while any worker does not.
pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    let checks = st.pool.current().check_all(Duration::from_secs(1)).await;
    let decode_ok = checks.iter().any(|(_, role, r)| *role == "decode" && r.is_ok());
    let workers: Vec<Value> = checks
        .iter()
        .map(|(addr, role, r)| match r {
            Ok(s) => json!({ "address": addr, "role": role, "healthy": true, "worker_id": s.worker_id, "running": s.running, "waiting": s.waiting, "free_blocks": s.free_blocks, "num_blocks": s.num_blocks }),
            Err(e) => json!({ "address": addr, "role": role, "healthy": false, "error": e }),
        })
        .collect();
    // Degraded: serving, with some worker down (a dead prefill worker's prompts are prefilled
    // on the decode workers meanwhile).
    let all_ok = checks.iter().all(|(_, _, r)| r.is_ok());
    let (code, status) = match (decode_ok, all_ok) {
        (true, true) => (StatusCode::OK, "ok"),
        (true, false) => (StatusCode::OK, "degraded"),
        (false, _) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    (code, axum::Json(json!({ "status": status, "workers": workers }))).into_response()
}

/// `GET /debug/routing`: the index, the loads and the last routing decisions with every
/// candidate's cached blocks, load and cost.
pub async fn debug_routing(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(st.routing.debug(&st.pool.current())).into_response()
}

/// `GET /metrics`.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    match &st.metrics {
        Some(h) => h.render().into_response(),
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
