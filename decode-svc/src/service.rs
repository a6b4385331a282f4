//! The `DecodeWorker` gRPC service: a request's entry point on a decode worker.
//!
//! Each request is prefilled here or on the prefill worker the router named (conditional
//! disaggregation), then decoded with continuous batching; its deltas stream back until it
//! finishes. Dropping the stream (the client went away) aborts the request and frees its
//! blocks.

use std::pin::Pin;
use std::task::{Context, Poll};

use tandem_engine::{Prompt, RequestOptions, RequestOutput};
use tandem_proto::v1 as pb;
use tandem_worker::convert::{delta_to_proto, engine_status, params_from_proto};
use tandem_worker::metrics::{count_disagg_decision, observe_handoff};
use tandem_worker::status::model_status;
use tandem_worker::EngineEvent;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::remote::spawn_remote_prefill;
pub use crate::state::DecodeService;

/// A response stream that aborts its request when dropped.
pub struct GenerateStream {
    rx: mpsc::UnboundedReceiver<Result<pb::GenerateResponse, Status>>,
    on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl Stream for GenerateStream {
    type Item = Result<pb::GenerateResponse, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for GenerateStream {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

fn response(out: &RequestOutput, prefill: &str) -> pb::GenerateResponse {
    let m = &out.metrics;
    pb::GenerateResponse {
        request_id: out.request_id.clone(),
        outputs: out.outputs.iter().map(delta_to_proto).collect(),
        finished: out.finished,
        prompt_tokens: out.prompt_token_ids.len() as u32,
        prompt_logprobs: out
            .prompt_logprobs
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(tandem_worker::convert::sampled_to_proto)
            .collect(),
        timing: Some(pb::RequestTiming {
            arrival_time: m.arrival_time,
            first_token_time: m.first_token_time.unwrap_or(0.0),
            finished_time: m.finished_time.unwrap_or(0.0),
            num_cached_tokens: m.num_cached_tokens as u32,
            prefill: prefill.to_string(),
            first_scheduled_time: m.first_scheduled_time.unwrap_or(0.0),
        }),
    }
}

/// How the prompt of a request gets its KV.
pub(crate) enum Placement {
    Local(LocalReason),
    Remote(tandem_engine::llm_engine::remote_prefill::RemotePrefill),
}

/// Why a prompt is prefilled on this worker (the `decision` label of
/// `tandem_disagg_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalReason {
    /// The router named no prefill worker.
    NoWorker,
    /// `n > 1`: the completions fork from a prompt computed here.
    ManyCompletions,
    /// The prompt's log-probabilities are asked for: its logits are computed here.
    PromptLogprobs,
    /// The uncached suffix is shorter than `--disagg-min-tokens`.
    Short,
    /// No free blocks to receive the pages into.
    NoBlocks,
    /// A model loaded after start-up: prefill workers serve only their start-up model.
    LoadedModel,
}

impl LocalReason {
    fn label(self) -> &'static str {
        match self {
            LocalReason::NoWorker => "local_no_worker",
            LocalReason::ManyCompletions => "local_n",
            LocalReason::PromptLogprobs => "local_prompt_logprobs",
            LocalReason::Short => "local_short",
            LocalReason::NoBlocks => "local_no_blocks",
            LocalReason::LoadedModel => "local_loaded_model",
        }
    }
}

#[tonic::async_trait]
impl pb::decode_worker_server::DecodeWorker for DecodeService {
    type GenerateStream = GenerateStream;

    async fn generate(
        &self,
        req: Request<pb::GenerateRequest>,
    ) -> Result<Response<GenerateStream>, Status> {
        let received = std::time::Instant::now();
        let r = req.into_inner();
        if r.request_id.is_empty() {
            return Err(Status::invalid_argument("request_id is empty"));
        }
        let params = params_from_proto(
            r.params.as_ref().ok_or_else(|| Status::invalid_argument("params are missing"))?,
        )?;
        // A model loaded after start-up runs on its own engine, prefilled here; the lease keeps
        // it loaded until this request's stream is dropped.
        let loaded = match &self.cfg.models {
            Some(models) => models.engine(&r.model).map_err(|e| model_status(&e))?,
            None if r.model.is_empty() || r.model == self.cfg.model_name => None,
            None => {
                return Err(Status::not_found(format!(
                    "model {:?} is not served by this worker",
                    r.model
                )))
            }
        };
        let span = tracing::info_span!("generate", request_id = %r.request_id);
        async move {
            let (tx, rx) = mpsc::unbounded_channel();
            let want_remote = !r.prefill_worker.is_empty();
            let (engine_h, lease) = match loaded {
                Some((h, lease)) => (h, Some(lease)),
                None => (self.engine.clone(), None),
            };
            // Where the prompt must be prefilled here whatever the blocks say (None: try remote).
            let forced_local = if lease.is_some() {
                Some(LocalReason::LoadedModel)
            } else if !want_remote {
                Some(LocalReason::NoWorker)
            } else if params.n > 1 {
                Some(LocalReason::ManyCompletions)
            } else if params.prompt_logprobs.is_some() {
                Some(LocalReason::PromptLogprobs)
            } else {
                None
            };
            let min_remote = self.cfg.min_remote_prefill_tokens;
            let id = r.request_id.clone();
            let opts = RequestOptions { priority: r.priority, cache_salt: (!r.cache_salt.is_empty()).then(|| r.cache_salt.clone()), no_speculation: r.no_speculation, group: (!r.group.is_empty()).then(|| r.group.clone()), ..Default::default() };
            let prompt = Prompt::TokenIds(r.prompt_token_ids.clone());
            let sink_tx = tx.clone();
            let courier = self.courier();
            // Armed before the request enters the engine: if this call is dropped while it waits for
            // the engine thread (the client went away meanwhile, as after a stall), the request is
            // aborted instead of staying parked with its blocks.
            let (engine, transfers, gid) = (engine_h.clone(), self.transfers.clone(), r.request_id.clone());
            let on_drop = Box::new(move || {
                let _lease = lease;
                engine.submit(move |s| {
                    transfers.remove_request(&gid);
                    if s.abort(&gid) {
                        tracing::info!(request_id = %gid, "request aborted: its client went away");
                    }
                });
            });
            let mut stream = GenerateStream { rx, on_drop: Some(on_drop) };
            let placement = engine_h
                .call(move |s| {
                    observe_handoff(received.elapsed().as_secs_f64());
                    let mut sink_label = if forced_local.is_none() { "remote" } else { "local" };
                    let placement = if let Some(reason) = forced_local {
                        s.engine.add_request_with(&id, prompt, params, opts)?;
                        Placement::Local(reason)
                    } else {
                        match s.engine.add_remote_prefill(&id, prompt, params, opts)? {
                            Some(rp) if rp.prompt_token_ids.len() - rp.num_cached_tokens >= min_remote.max(1) => Placement::Remote(rp),
                            Some(_) => {
                                s.engine.fail_remote_prefill(&id, true);
                                sink_label = "local";
                                Placement::Local(LocalReason::Short)
                            }
                            None => {
                                sink_label = "local";
                                Placement::Local(LocalReason::NoBlocks)
                            }
                        }
                    };
                    // The events go to the stream through the courier: one hand-over per
                    // step from the engine thread, the message built on the runtime.
                    s.subscribe(
                        &id,
                        courier.sink(Box::new(move |ev| {
                            let _ = sink_tx.send(match ev {
                                EngineEvent::Output(o) => Ok(response(&o, sink_label)),
                                EngineEvent::Failed(msg) => Err(Status::internal(msg)),
                            });
                        })),
                    );
                    Ok::<_, tandem_engine::EngineError>(placement)
                })
                .await;
            let placement = match placement {
                Some(Ok(p)) => p,
                other => {
                    // Not added (or the id belongs to another live request): nothing to abort.
                    stream.on_drop = None;
                    return Err(match other {
                        Some(Err(e)) => engine_status(&e),
                        _ => Status::unavailable("the engine has stopped"),
                    });
                }
            };
            match placement {
                Placement::Local(reason) => {
                    count_disagg_decision(reason.label());
                    tracing::debug!(decision = reason.label(), "prefilling locally");
                }
                Placement::Remote(rp) => {
                    count_disagg_decision("remote");
                    tracing::debug!(prefill_worker = %r.prefill_worker, cached = rp.num_cached_tokens, "prefilling remotely");
                    spawn_remote_prefill(self.clone(), r.clone(), rp, tx.clone());
                }
            }
            Ok(Response::new(stream))
        }
        .instrument(span)
        .await
    }

    async fn abort(
        &self,
        req: Request<pb::AbortRequest>,
    ) -> Result<Response<pb::AbortResponse>, Status> {
        let id = req.into_inner().request_id;
        let loaded = self.cfg.models.as_ref().map(|m| m.engines()).unwrap_or_default();
        for engine in std::iter::once(self.engine.clone()).chain(loaded) {
            let (transfers, id) = (self.transfers.clone(), id.clone());
            let found = engine
                .call(move |s| {
                    transfers.remove_request(&id);
                    let known = s.engine.request_status(&id).is_some();
                    s.fail(&id, "aborted");
                    known
                })
                .await
                .unwrap_or(false);
            if found {
                return Ok(Response::new(pb::AbortResponse { found }));
            }
        }
        Ok(Response::new(pb::AbortResponse { found: false }))
    }
}

#[tonic::async_trait]
impl pb::kv_transfer_server::KvTransfer for DecodeService {
    async fn endpoint(
        &self,
        _req: Request<pb::EndpointRequest>,
    ) -> Result<Response<pb::TransferEndpoint>, Status> {
        let l = self
            .engine
            .call(|s| tandem_worker::kv::kv_layout(&s.engine))
            .await
            .ok_or_else(|| Status::unavailable("the engine has stopped"))?;
        Ok(Response::new(pb::TransferEndpoint {
            transport: if self.links.is_some() { "nccl" } else { "tcp" }.into(),
            address: self.kv_addr.clone(),
            nccl_unique_id: Vec::new(),
            layout: Some(tandem_worker::kv::layout_to_proto(&l)),
        }))
    }

    async fn join_link(
        &self,
        _req: Request<pb::JoinLinkRequest>,
    ) -> Result<Response<pb::JoinLinkResponse>, Status> {
        Err(Status::unimplemented(
            "decode workers receive KV pages; prefill workers join device links",
        ))
    }
}
