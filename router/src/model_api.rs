//! The models' own endpoints: `GET /v1/models`, `GET /v1/models/{id}` (OpenAI's shapes), and
//! vLLM's `POST /tokenize` and `POST /detokenize`, with the named model's tokenizer and chat
//! template (loading and unloading: [`crate::model_admin`]).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::handlers::{check_content_type, on_tokenizer_pool, read_body};
use crate::models::{model_object, pending_object, Phase, ServedModel};
use crate::state::AppState;
use crate::{openai, prompt};

/// The model object of `name` in whatever phase it is (none: not known).
pub(crate) fn object_of(st: &AppState, name: &str) -> Option<Value> {
    let startup = &st.models.startup;
    if name == startup.name {
        return Some(model_object(startup, st.max_model_len(startup), "ready"));
    }
    Some(match st.models.phase(name)? {
        Phase::Ready(m) => model_object(&m, st.max_model_len(&m), "ready"),
        Phase::Unloading(m) => model_object(&m, st.max_model_len(&m), "unloading"),
        p => pending_object(name, &p),
    })
}

/// `GET /v1/models`: the start-up model, then the models loaded since (with their `status`:
/// `ready`, `loading`, `unloading` or `failed`).
pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    let startup = &st.models.startup;
    let mut data = vec![model_object(startup, st.max_model_len(startup), "ready")];
    data.extend(st.models.phases().into_iter().filter_map(|(n, _)| object_of(&st, &n)));
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

/// `GET /v1/models/{id}`: the model, or 404 for a name not served.
pub async fn model(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match object_of(&st, &id) {
        Some(v) => axum::Json(v).into_response(),
        None => ApiError::model_not_found(&id).into_response(),
    }
}

/// `POST /tokenize`: a prompt, or messages rendered by the chat template.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<openai::Message>>,
    /// Prompts: BOS and the like (default true); messages: the template already adds them, so
    /// only what it leaves out (default false).
    add_special_tokens: Option<bool>,
    /// Messages: open the assistant's turn (default true).
    add_generation_prompt: Option<bool>,
    /// Also return each token's text.
    #[serde(default)]
    return_token_strs: bool,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<i64>,
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(None, format!("invalid request body: {e}")))
}

/// The model named (the start-up model when none is).
fn check_model(st: &AppState, model: &Option<String>) -> Result<Arc<ServedModel>, ApiError> {
    match model {
        Some(m) => st.models.resolve(m),
        None => Ok(st.models.startup.clone()),
    }
}

fn tokenize(st: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let r: TokenizeRequest = parse(body)?;
    let m = check_model(st, &r.model)?;
    let tok = &m.info.tokenizer;
    let ids = match (&r.prompt, &r.messages) {
        (Some(text), None) => {
            if r.add_generation_prompt.is_some() {
                return Err(ApiError::invalid(
                    Some("add_generation_prompt"),
                    "add_generation_prompt applies to messages",
                ));
            }
            prompt::check_text_len(tok, text, st.prompt_limit(&m), "prompt")?;
            tok.encode(text, r.add_special_tokens.unwrap_or(true)).map_err(|e| {
                ApiError::invalid(Some("prompt"), format!("the prompt cannot be tokenized: {e}"))
            })?
        }
        (None, Some(messages)) => {
            if r.add_special_tokens == Some(true) {
                return Err(ApiError::invalid(
                    Some("add_special_tokens"),
                    "the chat template adds the special tokens; add_special_tokens true is not supported with messages",
                ));
            }
            let template = m.info.chat_template.as_ref().ok_or_else(|| {
                ApiError::invalid(
                    Some("messages"),
                    "this model has no chat template; tokenize a prompt",
                )
            })?;
            prompt::encode_chat_with(
                tok,
                template,
                &openai::chat_messages(messages)?,
                None,
                st.special_tokens,
                st.prompt_limit(&m),
                r.add_generation_prompt.unwrap_or(true),
            )?
        }
        _ => return Err(ApiError::invalid(None, "give exactly one of prompt and messages")),
    };
    let strs = r.return_token_strs.then(|| {
        ids.iter().map(|&t| tok.decode(&[t], false).unwrap_or_default()).collect::<Vec<_>>()
    });
    Ok(
        json!({ "count": ids.len(), "max_model_len": st.max_model_len(&m), "tokens": ids, "token_strs": strs }),
    )
}

fn detokenize(st: &AppState, body: &[u8]) -> Result<Value, ApiError> {
    let r: DetokenizeRequest = parse(body)?;
    let m = check_model(st, &r.model)?;
    let vocab = m.info.config.vocab_size as i64;
    let ids = r
        .tokens
        .iter()
        .map(|&t| {
            (0..vocab).contains(&t).then_some(t as u32).ok_or_else(|| {
                ApiError::invalid(
                    Some("tokens"),
                    format!("token id {t} is outside the vocabulary (0..{vocab})"),
                )
            })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let text = m
        .info
        .tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::invalid(Some("tokens"), format!("cannot decode: {e}")))?;
    Ok(json!({ "prompt": text }))
}

async fn run(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
    f: fn(&AppState, &[u8]) -> Result<Value, ApiError>,
) -> Response {
    let res = async {
        check_content_type(&headers)?;
        let body = read_body(body, st.max_body_bytes, st.body_read_timeout).await?;
        on_tokenizer_pool(&st, move |s| f(s, &body)).await
    };
    match res.await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /tokenize`.
pub async fn tokenize_handler(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run(st, headers, body, tokenize).await
}

/// `POST /detokenize`.
pub async fn detokenize_handler(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run(st, headers, body, detokenize).await
}
