//! The `PrefillWorker` gRPC service: prefill a prompt in chunks, ship its KV pages to the
//! decode worker that asked, and answer with the first token once every page is acknowledged.
//! The prompt's blocks stay pinned until then and are released (full blocks stay in the prefix
//! cache) whatever happens, including the caller going away mid-call.

use std::time::{Duration, Instant};

use tandem_engine::sampler::{SampledToken, TokenLogprob};
use tandem_engine::{Prompt, RequestOptions, RequestOutput};
use tandem_kv_transfer::device::SendOptions;
use tandem_kv_transfer::tcp::TcpSender;
use tandem_kv_transfer::{KvLayout, KvPage, TransferError};
use tandem_proto::v1 as pb;
use tandem_worker::convert::{params_from_proto, sampled_to_proto};
use tandem_worker::metrics::{count_transfer_failure, observe_transfer};
use tandem_worker::{EngineEvent, EngineHandle};
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// Faults a test can inject into the page stream (`TANDEM_FAULT_INJECT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Flip a byte of the first page after its checksum was computed.
    CorruptPage,
    /// Stop sending (without closing) after this many pages.
    StallAfterPages(u32),
}

impl Fault {
    /// Parses `corrupt-page` or `stall-after-pages=N`.
    pub fn parse(s: &str) -> Option<Fault> {
        match s.trim() {
            "corrupt-page" => Some(Fault::CorruptPage),
            other => other.strip_prefix("stall-after-pages=")?.parse().ok().map(Fault::StallAfterPages),
        }
    }
}

/// The prefill service.
#[derive(Clone)]
pub struct PrefillService {
    /// The engine.
    pub engine: EngineHandle,
    /// This engine's KV layout (the handshake's local side).
    pub layout: KvLayout,
    /// I/O timeout of a transfer.
    pub transfer_timeout: Duration,
    /// Injected fault, for tests.
    pub fault: Option<Fault>,
    /// Device links to decode workers (`--kv-transport nccl`).
    pub links: Option<std::sync::Arc<crate::links::PrefillLinks>>,
}

/// Releases a prefill request's blocks when dropped (also when the RPC is cancelled).
struct Release {
    engine: EngineHandle,
    rid: String,
}

impl Drop for Release {
    fn drop(&mut self) {
        let rid = std::mem::take(&mut self.rid);
        self.engine.submit(move |s| {
            s.abort(&rid);
        });
    }
}

/// Pages read from the engine per engine-thread call while shipping.
const PAGES_PER_READ: usize = 4;

fn first_token(out: &RequestOutput) -> Option<SampledToken> {
    let c = out.outputs.first()?;
    if let Some(s) = c.logprobs.first() {
        return Some(s.clone());
    }
    Some(SampledToken { chosen: TokenLogprob { token_id: *c.token_ids.first()?, logprob: c.cumulative_logprob as f32 }, top: Vec::new() })
}

impl PrefillService {
    fn ship(&self, blocks: &[u32], r: &pb::PrefillRequest) -> Result<(u32, u64), TransferError> {
        if r.kv_link != 0 {
            return self.ship_device(blocks, r);
        }
        let mut tx = TcpSender::connect_with_auth(r.kv_destination.as_str(), &self.layout, self.transfer_timeout, tandem_worker::auth::kv_auth())?;
        let (mut pages, mut bytes) = (0u32, 0u64);
        let skip = r.skip_blocks as usize;
        let todo: Vec<(usize, u32)> = blocks.iter().copied().enumerate().skip(skip).collect();
        for chunk in todo.chunks(PAGES_PER_READ) {
            let ids: Vec<u32> = chunk.iter().map(|&(_, b)| b).collect();
            let payloads = self
                .engine
                .call_blocking(move |s| ids.iter().map(|&b| s.engine.read_kv_block(b)).collect::<Result<Vec<_>, _>>())
                .ok_or_else(|| TransferError::Protocol("the engine has stopped".into()))?
                .map_err(|e| TransferError::Protocol(e.to_string()))?;
            for (&(index, _), payload) in chunk.iter().zip(payloads) {
                if self.fault == Some(Fault::StallAfterPages(pages)) {
                    tracing::warn!("fault injection: stalling the transfer");
                    std::thread::sleep(Duration::from_secs(3600));
                }
                let page = KvPage { transfer_id: r.transfer_id, index: index as u32, block_hash: 0, payload };
                if self.fault == Some(Fault::CorruptPage) && pages == 0 {
                    tracing::warn!("fault injection: corrupting a page");
                    let mut wire = page.header().to_vec();
                    let mut bad = page.payload.clone();
                    bad[0] ^= 0x5A;
                    wire.extend(bad);
                    tx.send_raw(&wire)?;
                } else {
                    tx.send(&page)?;
                }
                pages += 1;
                bytes += page.payload.len() as u64;
            }
        }
        tx.finish(r.transfer_id, pages)?;
        Ok((pages, bytes))
    }
}

impl PrefillService {
    /// Ships the pages GPU to GPU over the device link the request names.
    fn ship_device(&self, blocks: &[u32], r: &pb::PrefillRequest) -> Result<(u32, u64), TransferError> {
        let links = self.links.as_ref().ok_or_else(|| TransferError::Refused("this prefill worker has no device transport (start it with --kv-transport nccl)".into()))?;
        let skip = (r.skip_blocks as usize).min(blocks.len());
        let opts = SendOptions {
            timeout: self.transfer_timeout,
            stall_after_pages: match self.fault {
                Some(Fault::StallAfterPages(n)) => Some(n),
                _ => None,
            },
        };
        let bytes = links.send(r.kv_link, r.transfer_id, skip as u32, &blocks[skip..], opts)?;
        Ok(((blocks.len() - skip) as u32, bytes))
    }
}

#[tonic::async_trait]
impl pb::kv_transfer_server::KvTransfer for PrefillService {
    async fn endpoint(&self, _req: Request<pb::EndpointRequest>) -> Result<Response<pb::TransferEndpoint>, Status> {
        Err(Status::unimplemented("prefill workers send KV pages; ask a decode worker where it receives them"))
    }

    async fn join_link(&self, req: Request<pb::JoinLinkRequest>) -> Result<Response<pb::JoinLinkResponse>, Status> {
        let links = self.links.as_ref().ok_or_else(|| Status::failed_precondition("this prefill worker has no device transport (start it with --kv-transport nccl)"))?;
        links.join(req.into_inner()).await?;
        Ok(Response::new(pb::JoinLinkResponse {}))
    }
}

#[tonic::async_trait]
impl pb::prefill_worker_server::PrefillWorker for PrefillService {
    async fn prefill(&self, req: Request<pb::PrefillRequest>) -> Result<Response<pb::PrefillResponse>, Status> {
        let r = req.into_inner();
        let params = params_from_proto(r.params.as_ref().ok_or_else(|| Status::invalid_argument("params are missing"))?);
        params.validate().map_err(Status::invalid_argument)?;
        let rid = format!("{}/{:x}", r.request_id, r.transfer_id);
        let span = tracing::info_span!("prefill", request_id = %r.request_id, transfer_id = r.transfer_id);
        async move {
            let started = Instant::now();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut tx = Some(tx);
            let (id, tokens) = (rid.clone(), r.prompt_token_ids.clone());
            let opts = RequestOptions { prefill_only: true, cache_salt: (!r.cache_salt.is_empty()).then(|| r.cache_salt.clone()), ..Default::default() };
            // Armed before the request is queued: if the caller goes away while the engine thread
            // adds it, the abort queued behind it still releases it (jobs run in order).
            let _release = Release { engine: self.engine.clone(), rid: rid.clone() };
            self.engine
                .call(move |s| {
                    s.engine.add_request_with(&id, Prompt::TokenIds(tokens), params, opts)?;
                    s.subscribe(
                        &id,
                        Box::new(move |ev| {
                            let done = match ev {
                                EngineEvent::Output(o) if o.finished => Some(Ok(o)),
                                EngineEvent::Output(_) => None,
                                EngineEvent::Failed(m) => Some(Err(m)),
                            };
                            if let (Some(d), Some(tx)) = (done, tx.take()) {
                                let _ = tx.send(d);
                            }
                        }),
                    );
                    Ok::<_, tandem_engine::EngineError>(())
                })
                .await
                .ok_or_else(|| Status::unavailable("the engine has stopped"))?
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let out = rx.await.map_err(|_| Status::internal("the prefill was dropped"))?.map_err(Status::internal)?;
            let first = first_token(&out).ok_or_else(|| Status::internal("the prefill produced no token"))?;
            let num_cached = out.metrics.num_cached_tokens as u32;
            let prefill_seconds = started.elapsed().as_secs_f64();
            let id = rid.clone();
            let blocks = self.engine.call(move |s| s.engine.prefill_blocks(&id)).await.flatten().ok_or_else(|| Status::internal("the prefill's blocks are gone"))?;
            let (svc, req2) = (self.clone(), r.clone());
            let t0 = Instant::now();
            let shipped = tokio::task::spawn_blocking(move || svc.ship(&blocks, &req2)).await.map_err(|e| Status::internal(e.to_string()))?;
            let transfer_seconds = t0.elapsed().as_secs_f64();
            match shipped {
                Ok((pages, bytes)) => {
                    observe_transfer(bytes, transfer_seconds);
                    tracing::info!(pages, bytes, prefill_seconds, transfer_seconds, "pages shipped");
                    Ok(Response::new(pb::PrefillResponse {
                        first_token: Some(sampled_to_proto(&first)),
                        pages_sent: pages,
                        bytes_sent: bytes,
                        num_cached_tokens: num_cached,
                        prefill_seconds,
                        transfer_seconds,
                    }))
                }
                Err(e) => {
                    count_transfer_failure(match e {
                        TransferError::LayoutMismatch { .. } | TransferError::Refused(_) => "refused",
                        TransferError::Timeout(_) => "timeout",
                        _ => "send",
                    });
                    tracing::warn!(error = %e, "shipping KV pages failed");
                    Err(Status::unavailable(format!("KV transfer to {} failed: {e}", r.kv_destination)))
                }
            }
        }
        .instrument(span)
        .await
    }
}
