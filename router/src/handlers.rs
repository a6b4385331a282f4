//! The HTTP handlers: `/v1/completions`, `/v1/chat/completions` (whole or streamed as
//! server-sent events), `/v1/models`, `/health` and `/metrics`.
//!
//! A generation request is parsed and validated here (every mistake is a 4xx with OpenAI's
//! error JSON), tokenized, and sent to a decode worker — one `Generate` stream per prompt — with
//! the prefill worker to use. When the client goes away, the worker streams are dropped, which
//! aborts the requests on the workers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::StreamExt;
use tandem_engine::sampling::sampling_params::MAX_N;
use tandem_engine::SamplingParams;
use tokio_stream::wrappers::ReceiverStream;

use crate::auth::Tenant;
use crate::error::ApiError;
use crate::models::ServedModel;
use crate::openai::{self, ChatRequest, CommonParams, CompletionRequest, PromptInput};
use crate::prompt;
use crate::relay::{collect, record_done, start, stream_task, Prepared};
use crate::responses::{self, Endpoint};
use crate::state::{unix_now, AppState};
use crate::tools::Tools;

/// Most prompts one completions request may carry.
const MAX_BATCH: usize = 64;

/// The model the request names (404 for one not served, 503 while it loads or unloads).
fn check_model(st: &AppState, c: &CommonParams) -> Result<Arc<ServedModel>, ApiError> {
    match &c.model {
        None => Err(ApiError::invalid(Some("model"), "you must provide a model parameter")),
        Some(m) => st.models.resolve(m),
    }
}

fn token_prompt(m: &ServedModel, ids: &[i64], param: &str) -> Result<Vec<u32>, ApiError> {
    let vocab = m.info.config.vocab_size as i64;
    ids.iter()
        .map(|&t| {
            if (0..vocab).contains(&t) {
                Ok(t as u32)
            } else {
                Err(ApiError::invalid(
                    Some(param),
                    format!("token id {t} is outside the vocabulary (0..{vocab})"),
                ))
            }
        })
        .collect()
}

fn encode(st: &AppState, m: &ServedModel, text: &str) -> Result<Vec<u32>, ApiError> {
    prompt::encode_text(&m.info.tokenizer, text, st.prompt_limit(m))
}

/// The completion budget a request asked for: the parameter's name, its value and the default.
struct Budget<'a> {
    param: &'a str,
    requested: Option<i64>,
    default: Option<usize>,
}

#[allow(clippy::too_many_arguments)]
fn finish_prepare(
    st: &AppState,
    model: Arc<ServedModel>,
    ep: Endpoint,
    c: &CommonParams,
    prompts: Vec<Vec<u32>>,
    echo: Vec<Option<String>>,
    base: SamplingParams,
    budget: Budget,
    logprobs: bool,
) -> Result<Prepared, ApiError> {
    if let Some(limit) = st.max_prompt_tokens {
        if let Some(p) = prompts.iter().find(|p| p.len() > limit) {
            let param = if ep == Endpoint::Chat { "messages" } else { "prompt" };
            return Err(ApiError::invalid(
                Some(param),
                format!("the prompt has {} tokens; this server accepts at most {limit}", p.len()),
            ));
        }
    }
    let max_len = st.max_model_len(&model);
    let params = prompts
        .iter()
        .map(|p| {
            openai::max_tokens(budget.param, budget.requested, budget.default, p.len(), max_len)
                .map(|m| SamplingParams { max_tokens: m, ..base.clone() })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let vocab = model.info.config.vocab_size;
    for p in &params {
        openai::check_params(p, vocab)?;
    }
    if c.stream_options.is_some() && c.stream != Some(true) {
        return Err(ApiError::invalid(
            Some("stream_options"),
            "stream_options may only be set when stream is true",
        ));
    }
    let prefix = if ep == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    Ok(Prepared {
        ep,
        id: st.new_id(prefix),
        created: unix_now(),
        n: base.n,
        keep: base.n,
        echo_logprobs: false,
        prompt_logprobs: base.prompt_logprobs,
        beam: false,
        prompts,
        echo,
        params,
        stream: c.stream.unwrap_or(false),
        include_usage: c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        logprobs,
        cache_salt: c.cache_salt.clone().unwrap_or_default(),
        priority: c.priority.unwrap_or(0),
        no_speculation: c.speculative == Some(false),
        tool_names: None,
        tool_format: Default::default(),
        prefill_hint: None,
        dispatch: Duration::ZERO,
        accept: Duration::ZERO,
        model,
    })
}

/// Sets the request's structured-output constraint, compiled here first so that one that cannot
/// be used is refused before it is routed.
fn constrain(m: &ServedModel, c: &CommonParams, p: &mut SamplingParams) -> Result<(), ApiError> {
    if let Some((param, constraint)) = c.structured_fields().constraint()? {
        crate::structured::check(m.grammars(), &param, &constraint)?;
        p.structured = Some(constraint);
    }
    Ok(())
}

pub(crate) fn prepare_completion(st: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let (r, common): (CompletionRequest, CommonParams) = openai::parse_body(body)?;
    let m = check_model(st, &common)?;
    if r.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(Some("suffix"), "suffix is not supported"));
    }
    let logprobs = r.logprobs.map(|k| openai::logprob_count("logprobs", k)).transpose()?;
    let mut base = openai::sampling_params(&common, logprobs)?;
    constrain(&m, &common, &mut base)?;
    // best_of: that many completions are generated and the n with the highest cumulative
    // log-probability returned (known only at the end, so not streamed).
    let keep = base.n;
    if let Some(b) = r.best_of {
        if b < keep as i64 || b > MAX_N as i64 {
            return Err(ApiError::invalid(
                Some("best_of"),
                format!("best_of must be between n ({keep}) and {MAX_N}, got {b}"),
            ));
        }
        if b as usize > keep && common.stream == Some(true) {
            return Err(ApiError::invalid(
                Some("best_of"),
                "best_of greater than n cannot be streamed: the best completions are known only at the end",
            ));
        }
        base.n = b as usize;
    }
    let echo = r.echo.unwrap_or(false);
    if echo && logprobs.is_some() {
        if common.stream == Some(true) {
            return Err(ApiError::invalid(
                Some("echo"),
                "echo with logprobs is answered whole: it cannot be streamed",
            ));
        }
        // The echoed prompt's tokens are scored too (computed on the decode worker), with as
        // many alternatives as either use asks for.
        base.prompt_logprobs = base.prompt_logprobs.max(logprobs);
    }
    let (prompts, texts): (Vec<Vec<u32>>, Vec<Option<String>>) = match r.prompt {
        None => return Err(ApiError::invalid(Some("prompt"), "prompt is required")),
        Some(PromptInput::Text(t)) => (vec![encode(st, &m, &t)?], vec![Some(t)]),
        Some(PromptInput::Texts(ts)) => {
            let ids = ts.iter().map(|t| encode(st, &m, t)).collect::<Result<Vec<_>, _>>()?;
            (ids, ts.into_iter().map(Some).collect())
        }
        Some(PromptInput::Tokens(ids)) => (vec![token_prompt(&m, &ids, "prompt")?], vec![None]),
        Some(PromptInput::TokenLists(ls)) => (
            ls.iter().map(|l| token_prompt(&m, l, "prompt")).collect::<Result<Vec<_>, _>>()?,
            vec![None; ls.len()],
        ),
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid(Some("prompt"), "prompt must not be an empty list"));
    }
    if prompts.len() > MAX_BATCH {
        return Err(ApiError::invalid(
            Some("prompt"),
            format!("at most {MAX_BATCH} prompts per request, got {}", prompts.len()),
        ));
    }
    let echo_texts: Vec<Option<String>> = if echo {
        prompts
            .iter()
            .zip(texts)
            .map(|(ids, t)| {
                Some(t.unwrap_or_else(|| m.info.tokenizer.decode(ids, false).unwrap_or_default()))
            })
            .collect()
    } else {
        vec![None; prompts.len()]
    };
    let vocab = m.info.config.vocab_size;
    let mut p = finish_prepare(
        st,
        m,
        Endpoint::Completions,
        &common,
        prompts,
        echo_texts,
        base,
        Budget { param: "max_tokens", requested: common.max_tokens, default: Some(16) },
        logprobs.is_some(),
    )?;
    p.keep = keep;
    p.echo_logprobs = echo && logprobs.is_some();
    p.prompt_logprobs = common.prompt_logprobs.map(|k| k as usize);
    let other = keep < p.n || p.echo_logprobs || p.prompt_logprobs.is_some();
    if let Some(lp) = crate::beam::requested(&common, other)? {
        crate::beam::apply(&mut p, lp, vocab)?;
        p.beam = true;
    }
    Ok(p)
}

pub(crate) fn prepare_chat(st: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let (r, common): (ChatRequest, CommonParams) = openai::parse_body(body)?;
    let m = check_model(st, &common)?;
    let tools = Tools::from_request(
        r.tools.as_deref(),
        r.tool_choice.as_ref(),
        r.parallel_tool_calls,
        m.tool_format,
    )?;
    let want = r.logprobs.unwrap_or(false);
    let top = r.top_logprobs.map(|k| openai::logprob_count("top_logprobs", k)).transpose()?;
    if top.is_some_and(|k| k > 0) && !want {
        return Err(ApiError::invalid(
            Some("top_logprobs"),
            "top_logprobs requires logprobs to be true",
        ));
    }
    let mut base = openai::sampling_params(&common, want.then(|| top.unwrap_or(0)))?;
    constrain(&m, &common, &mut base)?;
    let messages = openai::chat_messages(
        r.messages
            .as_deref()
            .ok_or_else(|| ApiError::invalid(Some("messages"), "messages is required"))?,
    )?;
    let template = m.info.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid(None, "this model has no chat template; use /v1/completions")
    })?;
    let calls = tools.as_ref().filter(|t| t.active());
    if let Some(c) = calls.and_then(Tools::constraint) {
        if base.structured.is_some() {
            return Err(ApiError::invalid(
                Some("tool_choice"),
                "a forced tool call cannot be combined with another structured output constraint",
            ));
        }
        crate::structured::check(m.grammars(), "tools", &c)?;
        base.structured = Some(c);
    }
    let native = template.reads_tools();
    let messages = crate::tools::lay_out(messages, tools.as_ref(), native, m.tool_format);
    let tools_value = calls.filter(|_| native).map(Tools::as_value);
    let ids = prompt::encode_chat_with(
        &m.info.tokenizer,
        template,
        &messages,
        tools_value.as_ref(),
        st.special_tokens,
        st.prompt_limit(&m),
        true,
    )?;
    let (vocab, tool_format) = (m.info.config.vocab_size, m.tool_format);
    let requested = r.max_completion_tokens.or(common.max_tokens);
    let param =
        if r.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" };
    let mut p = finish_prepare(
        st,
        m.clone(),
        Endpoint::Chat,
        &common,
        vec![ids],
        vec![None],
        base,
        Budget { param, requested, default: st.default_max_tokens },
        want,
    )?;
    p.tool_names = calls.map(|t| t.functions.iter().map(|f| f.name.clone()).collect());
    p.tool_format = tool_format;
    if let Some(lp) =
        crate::beam::requested(&common, tools.is_some() || p.prompt_logprobs.is_some())?
    {
        crate::beam::apply(&mut p, lp, vocab)?;
        p.beam = true;
    }
    Ok(p)
}

/// Refuses a body that is not declared as JSON (OpenAI's and vLLM's rule).
pub(crate) fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let value = headers.get(CONTENT_TYPE).map(|v| v.to_str().unwrap_or("?"));
    let mime = value.unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json")) {
        return Ok(());
    }
    Err(ApiError::invalid(None, match value {
        None => "the request has no Content-Type; send the JSON body with 'Content-Type: application/json'".to_string(),
        Some(v) => format!("unsupported Content-Type '{v}'; send the JSON body with 'Content-Type: application/json'"),
    }))
}

/// Reads a request body of at most `limit` bytes (413 beyond); a body that stalls — no byte
/// for `idle` — is refused with 408, so a half-sent request cannot hold its connection.
pub(crate) async fn read_body(body: Body, limit: usize, idle: Duration) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        match tokio::time::timeout(idle, stream.next()).await {
            Err(_) => {
                return Err(ApiError {
                    status: StatusCode::REQUEST_TIMEOUT,
                    ..ApiError::invalid(
                        None,
                        format!("the request body stalled: no data for {idle:?}"),
                    )
                })
            }
            Ok(None) => return Ok(Bytes::from(buf)),
            Ok(Some(Err(e))) => {
                return Err(ApiError::invalid(
                    None,
                    format!("reading the request body failed: {e}"),
                ))
            }
            Ok(Some(Ok(chunk))) => {
                if buf.len() + chunk.len() > limit {
                    return Err(ApiError { status: StatusCode::PAYLOAD_TOO_LARGE, ..ApiError::invalid(None, format!("the request body is larger than this server's limit of {limit} bytes")) });
                }
                buf.extend_from_slice(&chunk);
            }
        }
    }
}

/// Runs `f` on the blocking pool, at most one such task per core at a time (waiting for a
/// turn does not hold a thread): request parsing and tokenizing.
pub(crate) async fn on_tokenizer_pool<R: Send + 'static>(
    st: &Arc<AppState>,
    f: impl FnOnce(&AppState) -> Result<R, ApiError> + Send + 'static,
) -> Result<R, ApiError> {
    let _turn = st
        .tokenizing
        .acquire()
        .await
        .map_err(|_| ApiError::unavailable("the router is shutting down"))?;
    let state = st.clone();
    tokio::task::spawn_blocking(move || f(&state))
        .await
        .map_err(|e| ApiError::upstream(format!("preparing the request failed: {e}")))?
}

/// Parses, validates and tokenizes a request on the blocking pool, at most one per core at a
/// time (waiting for a turn does not hold a thread).
async fn prepare(
    st: &Arc<AppState>,
    ep: Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<Prepared, ApiError> {
    check_content_type(headers)?;
    let body = read_body(body, st.max_body_bytes, st.body_read_timeout).await?;
    on_tokenizer_pool(st, move |state| match ep {
        Endpoint::Completions => prepare_completion(state, &body),
        Endpoint::Chat => prepare_chat(state, &body),
    })
    .await
}

async fn generate(
    st: Arc<AppState>,
    ep: Endpoint,
    tenant: Option<Extension<Tenant>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let prepared = prepare(&st, ep, &headers, body).await;
    let mut p = match prepared {
        Ok(p) => p,
        Err(e) => {
            tracing::info!(status = e.status.as_u16(), error = %e.message, "request refused");
            record_done(ep, e.status, started);
            return e.into_response();
        }
    };
    p.prefill_hint = headers
        .get(crate::relay::PREFILLER)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_string());
    // A tenant's prompts share cached prefixes only with the same tenant's.
    if let Some(Extension(t)) = tenant {
        p.cache_salt = t.cache_salt(&p.cache_salt);
    }
    let (mut route, streams, accept) = match start(&st, &p).await {
        Ok(x) => x,
        Err(e) => {
            record_done(ep, e.status, started);
            return e.into_response();
        }
    };
    p.dispatch = started.elapsed();
    p.accept = accept;
    if p.stream {
        let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
        tokio::spawn(stream_task(p, route, streams, tx, started));
        let events = ReceiverStream::new(rx).map(Ok::<Event, std::convert::Infallible>);
        return Sse::new(events)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
            .into_response();
    }
    match collect(&p, &mut route, streams, started).await {
        Ok(v) => {
            record_done(ep, StatusCode::OK, started);
            axum::Json(responses::Wire(&v)).into_response()
        }
        Err(e) => {
            record_done(ep, e.status, started);
            e.into_response()
        }
    }
}

/// `POST /v1/completions`.
pub async fn completions(
    State(st): State<Arc<AppState>>,
    tenant: Option<Extension<Tenant>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(st, Endpoint::Completions, tenant, headers, body).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    tenant: Option<Extension<Tenant>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(st, Endpoint::Chat, tenant, headers, body).await
}
