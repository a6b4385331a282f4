//! `tandem bench serve --stub`: the benchmark's own ceiling. A built-in OpenAI-style server on
//! loopback that answers every (streamed) request at once — `max_tokens` chunks of one word each,
//! usage last, no model behind it — so what the client measures against it
//! is the most the client can measure: a figure from a real server near it says the client, not
//! the server, was the limit.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::extract::Json;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

/// The model the stub lists.
pub const STUB_MODEL: &str = "stub";

fn chunk(chat: bool, i: usize) -> String {
    let piece = if i == 0 { "tok" } else { " tok" };
    let choice = if chat {
        json!({ "index": 0, "delta": { "content": piece }, "finish_reason": null })
    } else {
        json!({ "index": 0, "text": piece, "finish_reason": null })
    };
    let object = if chat { "chat.completion.chunk" } else { "text_completion" };
    format!(
        "data: {}\n\n",
        json!({ "id": "stub", "object": object, "created": 0, "model": STUB_MODEL, "choices": [choice] })
    )
}

async fn complete(chat: bool, body: Value) -> Response {
    let n = body["max_tokens"].as_u64().or(body["max_completion_tokens"].as_u64()).unwrap_or(16)
        as usize;
    let prompt_tokens = body["prompt"].as_array().map_or(1, Vec::len);
    if body["stream"].as_bool() != Some(true) {
        // The benchmark always streams; the stub answers nothing else.
        let err = json!({ "error": { "message": "the stub server only streams", "type": "invalid_request_error" } });
        return (axum::http::StatusCode::BAD_REQUEST, Json(err)).into_response();
    }
    // Every chunk after the first is the same: shared bytes, not rebuilt per token.
    let (first, rest) = (Bytes::from(chunk(chat, 0)), Bytes::from(chunk(chat, 1)));
    let mut frames: Vec<Result<Bytes, Infallible>> = Vec::with_capacity(n + 1);
    frames.extend((0..n).map(|i| Ok(if i == 0 { first.clone() } else { rest.clone() })));
    let mut buf = String::new();
    buf.push_str(&format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({ "id": "stub", "choices": [], "usage": { "prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n } })
    ));
    frames.push(Ok(Bytes::from(buf)));
    // One write per chunk, the task yielding between them, as a server sending each token when
    // it is made: the client gets no help from chunks arriving together.
    let stream = futures_util::stream::unfold(frames.into_iter(), |mut it| async move {
        let next = it.next()?;
        tokio::task::yield_now().await;
        Some((next, it))
    });
    ([(header::CONTENT_TYPE, "text/event-stream")], Body::from_stream(stream)).into_response()
}

/// Starts the stub on a free loopback port on its own runtime of `threads` threads; returns its
/// base URL. It lives until the process ends.
pub fn start(threads: usize) -> anyhow::Result<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("bench-stub")
        .enable_all()
        .build()?;
    let listener =
        rt.block_on(tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))))?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route(
            "/v1/models",
            get(|| async {
                Json(json!({ "object": "list", "data": [{ "id": STUB_MODEL, "object": "model" }] }))
            }),
        )
        .route("/v1/completions", post(|Json(b): Json<Value>| complete(false, b)))
        .route("/v1/chat/completions", post(|Json(b): Json<Value>| complete(true, b)));
    std::thread::Builder::new().name("bench-stub".into()).spawn(move || {
        rt.block_on(async move {
            let _ = axum::serve(listener, app).await;
        })
    })?;
    Ok(format!("http://{addr}/v1"))
}
