//! Relaying the decode workers' streams to the client: the deltas of every prompt's completions
//! merged, accumulated into one response or sent as server-sent events chunk by chunk (tool
//! calls read out of the text on the way), with the request's usage and timing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::sse::Event;
use futures_util::StreamExt;
use metrics::{counter, histogram};
use serde_json::{json, Value};
use tandem_engine::SamplingParams;
use tandem_proto::v1 as pb;
use tandem_worker::convert::params_to_proto;

use crate::error::ApiError;
use crate::responses::{self, Choice, Endpoint, Header};
use crate::routing::Route;
use crate::state::AppState;

/// The header an endpoint picker names the prefill worker in (llm-d's name).
pub const PREFILLER: &str = "x-prefiller-host-port";

/// A validated generation request.
#[derive(Clone)]
pub(crate) struct Prepared {
    pub(crate) ep: Endpoint,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) prompts: Vec<Vec<u32>>,
    pub(crate) echo: Vec<Option<String>>,
    pub(crate) params: Vec<SamplingParams>,
    pub(crate) n: usize,
    /// Completions returned per prompt: `n`, or fewer than generated with `best_of`.
    pub(crate) keep: usize,
    /// `echo` with `logprobs`: the prompt's tokens are scored in the response too.
    pub(crate) echo_logprobs: bool,
    /// vLLM's `prompt_logprobs`: the prompt's tokens scored, with this many alternatives.
    pub(crate) prompt_logprobs: Option<usize>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) logprobs: bool,
    pub(crate) cache_salt: String,
    pub(crate) priority: i32,
    pub(crate) no_speculation: bool,
    /// The functions whose calls are read out of the output (chat with tools).
    pub(crate) tool_names: Option<Vec<String>>,
    /// How the model writes calls.
    pub(crate) tool_format: crate::tool_format::ToolCallFormat,
    /// From receipt until the worker streams started (the router's part of the queue time).
    pub(crate) dispatch: Duration,
    /// Of `dispatch`, the generate calls: from the first call until every worker answered (its
    /// engine thread took the prompt).
    pub(crate) accept: Duration,
    /// The prefill worker an endpoint picker named (`x-prefiller-host-port`); used when it is
    /// one of this front end's healthy prefill workers.
    pub(crate) prefill_hint: Option<String>,
    /// Beam search (`n` is the width; the parameters carry the length penalty): each choice
    /// reports its beam's cumulative log-probability.
    pub(crate) beam: bool,
    /// The model, held until the request ends.
    pub(crate) model: Arc<crate::models::ServedModel>,
}

/// A decode worker's stream of one prompt's deltas.
pub(crate) type WorkerStream = tonic::Streaming<pb::GenerateResponse>;

pub(crate) fn merged(
    streams: Vec<WorkerStream>,
) -> impl futures_util::Stream<Item = (usize, Result<pb::GenerateResponse, tonic::Status>)> + Send + Unpin
{
    futures_util::stream::select_all(
        streams.into_iter().enumerate().map(|(i, s)| s.map(move |r| (i, r)).boxed()),
    )
}

/// Records a request's time to its first token and where it went, on the router's clock:
/// `prepare` (receipt until the first generate call: parsing, templating, tokenizing, routing),
/// `worker_accept` (the generate calls until every worker answered, its engine thread having
/// taken the prompt) and `first_token_wait` (from there until the first token arrived here;
/// the worker's own `tandem_time_to_first_token_seconds` is the engine's part of it).
pub(crate) fn record_first_token(p: &Prepared, started: Instant) {
    let ttft = started.elapsed();
    histogram!("tandem_time_to_first_token_seconds").record(ttft.as_secs_f64());
    let phase = |name: &'static str, d: Duration| {
        histogram!("tandem_router_first_token_phase_seconds", "phase" => name)
            .record(d.as_secs_f64())
    };
    phase("prepare", p.dispatch.saturating_sub(p.accept));
    phase("worker_accept", p.accept);
    phase("first_token_wait", ttft.saturating_sub(p.dispatch));
}

pub(crate) fn record_done(ep: Endpoint, code: StatusCode, started: Instant) {
    counter!("tandem_router_requests_total", "endpoint" => ep.label(), "code" => code.as_u16().to_string()).increment(1);
    if code.is_success() {
        histogram!("tandem_e2e_request_latency_seconds").record(started.elapsed().as_secs_f64());
    }
}

/// Of each prompt's `n` completions, the `keep` with the highest cumulative log-probability,
/// best first.
fn best_of(choices: Vec<Choice>, n: usize, keep: usize) -> Vec<Choice> {
    let mut out = Vec::with_capacity(choices.len() / n.max(1) * keep);
    for group in choices.chunks(n.max(1)) {
        let mut g = group.to_vec();
        g.sort_by(|a, b| b.cumulative_logprob.total_cmp(&a.cumulative_logprob));
        out.extend(g.into_iter().take(keep));
    }
    out
}

pub(crate) async fn collect(
    p: &Prepared,
    route: &mut Route,
    streams: Vec<WorkerStream>,
    started: Instant,
) -> Result<Value, ApiError> {
    let mut choices = vec![Choice::default(); p.prompts.len() * p.n];
    let mut prompt_tokens = vec![0usize; p.prompts.len()];
    let mut finished = vec![false; p.prompts.len()];
    let mut first = true;
    let mut timing = pb::RequestTiming::default();
    let mut prompt_lps: Vec<Vec<pb::SampledToken>> = vec![Vec::new(); p.prompts.len()];
    let mut s = merged(streams);
    while let Some((pi, r)) = s.next().await {
        let resp = r.map_err(|e| ApiError::from_status(&e))?;
        prompt_tokens[pi] = resp.prompt_tokens as usize;
        if let Some(t) = resp.timing.as_ref().filter(|_| resp.finished) {
            timing = t.clone();
        }
        if !resp.prompt_logprobs.is_empty() {
            prompt_lps[pi] = resp.prompt_logprobs;
        }
        for d in &resp.outputs {
            if first && !d.token_ids.is_empty() {
                first = false;
                route.ticket.first_token();
                record_first_token(p, started);
            }
            if let Some(c) = choices.get_mut(pi * p.n + d.index as usize) {
                c.push(d);
            }
        }
        finished[pi] |= resp.finished;
    }
    if finished.iter().any(|f| !f) {
        return Err(ApiError::upstream(
            "the decode worker closed the stream before the request finished",
        ));
    }
    let h = Header { id: &p.id, created: p.created, model: &p.model.name };
    let generated: usize = choices.iter().map(|c| c.num_tokens).sum();
    let choices = if p.keep < p.n { best_of(choices, p.n, p.keep) } else { choices };
    let mut v = responses::full_response(
        p.ep,
        &h,
        &p.model.info.tokenizer,
        &choices,
        p.logprobs,
        prompt_tokens.iter().sum(),
        &p.echo,
    );
    v["timing"] = responses::timing(p.dispatch, &timing, started.elapsed());
    let tok = &p.model.info.tokenizer;
    if p.echo_logprobs {
        let k = p.params[0].logprobs.unwrap_or(0);
        for (i, c) in v["choices"].as_array_mut().into_iter().flatten().enumerate() {
            let pi = i / p.keep.max(1);
            let scored = responses::with_top(&prompt_lps[pi], k);
            let lp = responses::echo_logprobs(tok, &p.prompts[pi], &scored, &c["logprobs"]);
            c["logprobs"] = lp;
        }
    }
    if let Some(k) = p.prompt_logprobs {
        let scored =
            |pi: usize| responses::prompt_logprobs(tok, &p.prompts[pi], &prompt_lps[pi], k);
        match p.ep {
            // vLLM: on each completion choice, and once for the chat's one prompt.
            Endpoint::Completions => {
                for (i, c) in v["choices"].as_array_mut().into_iter().flatten().enumerate() {
                    c["prompt_logprobs"] = scored(i / p.keep.max(1));
                }
            }
            Endpoint::Chat => v["prompt_logprobs"] = scored(0),
        }
    }
    if p.beam {
        for (c, out) in choices.iter().zip(v["choices"].as_array_mut().into_iter().flatten()) {
            out["cumulative_logprob"] = json!(c.cumulative_logprob);
        }
    }
    // Usage counts every completion generated, kept or not.
    v["usage"] = responses::usage(prompt_tokens.iter().sum(), generated);
    if let Some(names) = &p.tool_names {
        for (c, out) in choices.iter().zip(v["choices"].as_array_mut().into_iter().flatten()) {
            if let Some((content, calls)) = p.tool_format.parse_calls(&c.text, names) {
                out["message"] = crate::tools::message_with_calls(content, &calls);
                out["finish_reason"] = "tool_calls".into();
            }
        }
    }
    Ok(v)
}

fn sse_data(v: &Value) -> Event {
    Event::default().data(serde_json::to_string(&responses::Wire(v)).unwrap_or_default())
}

/// Streams a request's chunks; stops (dropping the worker streams, which aborts the requests)
/// as soon as the client goes away.
pub(crate) async fn stream_task(
    p: Prepared,
    mut route: Route,
    streams: Vec<WorkerStream>,
    tx: tokio::sync::mpsc::Sender<Event>,
    started: Instant,
) {
    let h = Header { id: &p.id, created: p.created, model: &p.model.name };
    let tok = &p.model.info.tokenizer;
    let total = p.prompts.len() * p.n;
    let mut offsets = vec![0usize; total];
    let mut tokens = vec![0usize; total];
    let mut prompt_tokens = vec![0usize; p.prompts.len()];
    let mut finished = vec![false; p.prompts.len()];
    let mut first = true;
    let mut ended = 0;
    let mut call_streams: Vec<Option<crate::tool_stream::CallStream>> = (0..total)
        .map(|_| {
            let names = p.tool_names.clone();
            names.map(|n| crate::tool_stream::CallStream::new(p.tool_format, n))
        })
        .collect();
    macro_rules! send {
        ($ev:expr) => {
            if tx.send($ev).await.is_err() {
                tracing::info!(request_id = %p.id, "client disconnected; aborting");
                return;
            }
        };
    }
    if p.ep == Endpoint::Chat {
        for i in 0..total {
            send!(sse_data(&responses::chunk(p.ep, &h, vec![responses::chat_role_choice(i)])));
        }
    }
    for (pi, e) in p.echo.iter().enumerate() {
        if let Some(text) = e {
            for j in 0..p.n {
                let i = pi * p.n + j;
                offsets[i] = text.len();
                send!(sse_data(&responses::chunk(
                    p.ep,
                    &h,
                    vec![responses::chunk_choice(
                        p.ep,
                        tok,
                        i,
                        text,
                        &[],
                        false,
                        0,
                        None,
                        Value::Null
                    )]
                )));
            }
        }
    }
    let mut s = merged(streams);
    loop {
        let next = tokio::select! {
            n = s.next() => n,
            _ = tx.closed() => {
                tracing::info!(request_id = %p.id, "client disconnected; aborting");
                return;
            }
        };
        let Some((pi, r)) = next else { break };
        let resp = match r {
            Ok(r) => r,
            Err(e) => {
                let err = ApiError::from_status(&e);
                tracing::warn!(request_id = %p.id, error = %err.message, "worker stream failed");
                record_done(p.ep, err.status, started);
                send!(sse_data(&json!({ "error": err.body() })));
                let _ = tx.send(Event::default().data("[DONE]")).await;
                return;
            }
        };
        prompt_tokens[pi] = resp.prompt_tokens as usize;
        finished[pi] |= resp.finished;
        for d in &resp.outputs {
            let i = pi * p.n + d.index as usize;
            if i >= total {
                continue;
            }
            if first && !d.token_ids.is_empty() {
                first = false;
                route.ticket.first_token();
                record_first_token(&p, started);
            }
            let finish = (!d.finish_reason.is_empty()).then_some(d.finish_reason.as_str());
            if d.text.is_empty() && d.logprobs.is_empty() && finish.is_none() {
                tokens[i] += d.token_ids.len();
                continue;
            }
            // The chunk that ends the last choice carries the request's timing.
            if finish.is_some() {
                ended += 1;
            }
            let timing = (finish.is_some() && ended == total).then(|| {
                let t = resp.timing.clone().unwrap_or_default();
                responses::timing(p.dispatch, &t, started.elapsed())
            });
            if let Some(cs) = call_streams.get_mut(i).and_then(Option::as_mut) {
                let lp = match p.logprobs {
                    true => responses::chat_logprobs(tok, &d.logprobs),
                    false => Value::Null,
                };
                tokens[i] += d.token_ids.len();
                let chunks = crate::tool_stream::chunk_choices(cs, i, &d.text, finish, lp);
                let last = chunks.len().saturating_sub(1);
                for (k, c) in chunks.into_iter().enumerate() {
                    let mut chunk = responses::chunk(p.ep, &h, vec![c]);
                    if let Some(t) = timing.as_ref().filter(|_| k == last) {
                        chunk["timing"] = t.clone();
                    }
                    send!(sse_data(&chunk));
                }
                continue;
            }
            let stop = responses::stop_reason(d);
            let event = if p.logprobs {
                let c = responses::chunk_choice(
                    p.ep,
                    tok,
                    i,
                    &d.text,
                    &d.logprobs,
                    true,
                    offsets[i],
                    finish,
                    stop,
                );
                let mut chunk = responses::chunk(p.ep, &h, vec![c]);
                if let Some(t) = timing {
                    chunk["timing"] = t;
                }
                sse_data(&chunk)
            } else {
                // The common case, once a token: written without a `Value` tree.
                let (ep, t) = (p.ep, timing.as_ref());
                Event::default()
                    .data(responses::text_chunk_json(ep, &h, i, &d.text, finish, &stop, t))
            };
            offsets[i] += d.text.len();
            tokens[i] += d.token_ids.len();
            send!(event);
        }
    }
    if finished.iter().any(|f| !f) {
        let err =
            ApiError::upstream("the decode worker closed the stream before the request finished");
        record_done(p.ep, err.status, started);
        send!(sse_data(&json!({ "error": err.body() })));
    } else {
        record_done(p.ep, StatusCode::OK, started);
        if p.include_usage {
            let mut u = responses::chunk(p.ep, &h, vec![]);
            u["usage"] = responses::usage(prompt_tokens.iter().sum(), tokens.iter().sum());
            send!(sse_data(&u));
        }
    }
    let _ = tx.send(Event::default().data("[DONE]")).await;
}

/// Starts one `Generate` stream per prompt on a decode worker; a worker that cannot be reached
/// is marked failed and another one is tried.
pub(crate) async fn start(
    st: &AppState,
    p: &Prepared,
) -> Result<(Route, Vec<WorkerStream>, Duration), ApiError> {
    let all = st.pool.current();
    // A prompt its decode worker computes itself — several completions or beams fork from it
    // there, or its tokens are scored — books no prefill worker.
    let local = p.n > 1 || p.beam || p.prompt_logprobs.is_some() || p.echo_logprobs;
    let decode_only;
    let pool = if local && !all.prefill.is_empty() {
        decode_only =
            crate::workers::WorkerPool { decode: all.decode.clone(), prefill: Vec::new() };
        &decode_only
    } else {
        &*all
    };
    let mut last_err = match pool.decode.len() {
        0 => ApiError::unavailable("no decode worker is configured"),
        n => ApiError::unavailable(format!(
            "no decode worker is healthy ({n} configured; see /health)"
        )),
    };
    let mut tried: Vec<String> = Vec::new();
    for _attempt in 0..pool.decode.len().max(1) {
        // See the other replicas' latest load, then decide (the booking wakes the load loop,
        // which publishes ours).
        if let Some(sync) = &st.load_sync {
            sync.exchange(&st.routing, Duration::from_millis(100)).await;
        }
        let hint = p.prefill_hint.as_deref();
        let route = match p.model.startup {
            true => st.routing.route(pool, &p.id, &p.prompts[0], &p.cache_salt, &tried, hint),
            false => {
                let len = p.prompts.iter().map(Vec::len).sum();
                st.routing.route_model(pool, &p.id, len, &p.model.name, &tried)
            }
        };
        let Some(route) = route else {
            if !p.model.startup && tried.is_empty() {
                last_err = ApiError::unavailable(format!(
                    "no healthy decode worker serves the model `{}` now",
                    p.model.name
                ));
            }
            break;
        };
        let worker = route.decode.clone();
        let prefill = route.prefill.clone();
        let prefill_addr = prefill.as_ref().map(|w| w.addr.clone()).unwrap_or_default();
        counter!("tandem_router_decisions_total", "decode_worker" => worker.addr.clone(), "prefill_worker" => if prefill_addr.is_empty() { "none".to_string() } else { prefill_addr.clone() }).increment(1);
        tracing::debug!(request_id = %p.id, decode_worker = %worker.addr, prefill_worker = %prefill_addr, prompts = p.prompts.len(), prompt_tokens = p.prompts.iter().map(Vec::len).sum::<usize>(), "routing request");
        let mut streams = Vec::with_capacity(p.prompts.len());
        let mut failed = None;
        let calls = Instant::now();
        for (i, (ids, params)) in p.prompts.iter().zip(&p.params).enumerate() {
            let req = pb::GenerateRequest {
                request_id: if p.prompts.len() == 1 {
                    p.id.clone()
                } else {
                    format!("{}-{i}", p.id)
                },
                prompt_token_ids: ids.clone(),
                params: Some(params_to_proto(params)),
                priority: p.priority,
                cache_salt: p.cache_salt.clone(),
                prefill_worker: prefill_addr.clone(),
                no_speculation: p.no_speculation,
                group: p.id.clone(),
                model: if p.model.startup { String::new() } else { p.model.name.clone() },
            };
            match worker.decode_client().generate(req).await {
                Ok(s) => streams.push(s.into_inner()),
                Err(s) => {
                    failed = Some(s);
                    break;
                }
            }
        }
        match failed {
            None => return Ok((route, streams, calls.elapsed())),
            Some(s) if s.code() == tonic::Code::Unavailable => {
                tracing::warn!(request_id = %p.id, decode_worker = %worker.addr, error = %s.message(), "decode worker unreachable; trying another");
                worker.mark_failed();
                tried.push(worker.addr.clone());
                last_err = ApiError::from_status(&s);
            }
            // The worker no longer (or not yet) serves a model loaded after start-up: another
            // one may.
            Some(s)
                if !p.model.startup
                    && matches!(
                        s.code(),
                        tonic::Code::NotFound | tonic::Code::FailedPrecondition
                    ) =>
            {
                tracing::info!(request_id = %p.id, decode_worker = %worker.addr, error = %s.message(), "the worker does not serve the model now; trying another");
                tried.push(worker.addr.clone());
                last_err = ApiError::unavailable(format!(
                    "no decode worker serves the model `{}` now: {}",
                    p.model.name,
                    s.message()
                ));
            }
            Some(s) => return Err(ApiError::from_status(&s)),
        }
    }
    Err(last_err)
}
