//! The `PrefillWorker` gRPC service: prefill a prompt in chunks, ship its KV pages to the
//! decode worker that asked, and answer with the first token once every page is acknowledged.
//! The prompt's blocks stay pinned until then and are released (full blocks stay in the prefix
//! cache) whatever happens, including the caller going away mid-call.

use std::time::{Duration, Instant};

use tandem_engine::sampling::sampler::{SampledToken, TokenLogprob};
use tandem_engine::{LLMEngine, Prompt, RequestOptions, RequestOutput};
use tandem_kv_transfer::device::SendOptions;
use tandem_kv_transfer::tcp::TcpSender;
use tandem_kv_transfer::{KvLayout, KvPage, TransferError};
use tandem_proto::v1 as pb;
use tandem_worker::convert::{engine_status, params_from_proto, sampled_to_proto};
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
            other => {
                other.strip_prefix("stall-after-pages=")?.parse().ok().map(Fault::StallAfterPages)
            }
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

/// Bytes of pages read from the engine per engine-thread call while shipping (each call waits
/// for the engine's current step, so few large reads beat many small ones).
const BYTES_PER_READ: usize = 32 << 20;

/// A finished prefill as its subscriber hands it over.
struct Finished {
    out: RequestOutput,
    /// The request's pinned blocks, in logical order (`None`: already released).
    blocks: Option<Vec<u32>>,
    /// Over TCP: the pages to ship, `(logical index, block)`.
    to_ship: Vec<(usize, u32)>,
    /// Over TCP: the payloads of the first of them, up to a read's worth.
    pages: Result<Vec<Vec<u8>>, String>,
}

impl Finished {
    /// Takes the blocks of finished prefill `rid` and, with `first_pages` = (skip, count) (over
    /// TCP), lists the pages to ship from `skip` on (`LLMEngine::prefill_pages_to_ship`) and
    /// reads the payloads of the first `count`.
    fn read(
        engine: &LLMEngine,
        rid: &str,
        out: RequestOutput,
        first_pages: Option<(usize, usize)>,
    ) -> Finished {
        let blocks = engine.prefill_blocks(rid);
        let (to_ship, count) = match first_pages {
            Some((skip, count)) => {
                (engine.prefill_pages_to_ship(rid, skip).unwrap_or_default(), count)
            }
            None => (Vec::new(), 0),
        };
        let pages = to_ship
            .iter()
            .take(count)
            .map(|&(_, id)| engine.read_kv_block(id).map_err(|e| e.to_string()))
            .collect();
        Finished { out, blocks, to_ship, pages }
    }
}

fn first_token(out: &RequestOutput) -> Option<SampledToken> {
    let c = out.outputs.first()?;
    if let Some(s) = c.logprobs.first() {
        return Some(s.clone());
    }
    Some(SampledToken {
        chosen: TokenLogprob {
            token_id: *c.token_ids.first()?,
            logprob: c.cumulative_logprob as f32,
        },
        top: Vec::new(),
        rank: None,
    })
}

impl PrefillService {
    /// Reads the pages of `ids` on the engine thread. The engine may be in the middle of a long
    /// step: while waiting, `tx` (once connected) tells the receiver this sender is busy, not
    /// stalled.
    fn read_pages(
        &self,
        ids: Vec<u32>,
        mut tx: Option<&mut TcpSender>,
    ) -> Result<Vec<Vec<u8>>, TransferError> {
        let stopped = || TransferError::Protocol("the engine has stopped".into());
        let (send, recv) = std::sync::mpsc::channel();
        if !self.engine.submit(move |s| {
            let _ = send.send(
                ids.iter().map(|&b| s.engine.read_kv_block(b)).collect::<Result<Vec<_>, _>>(),
            );
        }) {
            return Err(stopped());
        }
        loop {
            match recv.recv_timeout(self.transfer_timeout / 4) {
                Ok(pages) => return pages.map_err(|e| TransferError::Protocol(e.to_string())),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(tx) = tx.as_deref_mut() {
                        tx.keepalive()?;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Err(stopped()),
            }
        }
    }

    /// Pages per read of [`BYTES_PER_READ`].
    fn pages_per_read(&self) -> usize {
        (BYTES_PER_READ / self.layout.page_bytes().max(1)).max(1)
    }

    /// Ships the pages `todo` (logical index, block) over TCP; `read` holds the payloads of the
    /// first ones, read as the prefill finished.
    fn ship(
        &self,
        todo: &[(usize, u32)],
        r: &pb::PrefillRequest,
        read: Result<Vec<Vec<u8>>, String>,
    ) -> Result<(u32, u64), TransferError> {
        let (mut pages, mut bytes) = (0u32, 0u64);
        let mut read = Some(read.map_err(TransferError::Protocol)?);
        let per_read = match read.as_ref().map_or(0, Vec::len) {
            0 => self.pages_per_read(),
            n => n,
        };
        // The first pages were read before connecting, so the connection never idles at the start.
        let mut tx: Option<TcpSender> = None;
        for chunk in todo.chunks(per_read) {
            let payloads = match read.take() {
                Some(first) if first.len() == chunk.len() => first,
                _ => self.read_pages(chunk.iter().map(|&(_, b)| b).collect(), tx.as_mut())?,
            };
            let tx = match &mut tx {
                Some(t) => t,
                None => tx.insert(TcpSender::connect_with_auth(
                    r.kv_destination.as_str(),
                    &self.layout,
                    self.transfer_timeout,
                    tandem_worker::auth::kv_auth(),
                )?),
            };
            for (&(index, _), payload) in chunk.iter().zip(payloads) {
                if self.fault == Some(Fault::StallAfterPages(pages)) {
                    tracing::warn!("fault injection: stalling the transfer");
                    std::thread::sleep(Duration::from_secs(3600));
                }
                let page = KvPage {
                    transfer_id: r.transfer_id,
                    index: index as u32,
                    block_hash: 0,
                    payload,
                };
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
        let tx = match tx {
            Some(t) => t,
            None => TcpSender::connect_with_auth(
                r.kv_destination.as_str(),
                &self.layout,
                self.transfer_timeout,
                tandem_worker::auth::kv_auth(),
            )?,
        };
        tx.finish(r.transfer_id, pages)?;
        Ok((pages, bytes))
    }
}

/// Counts and logs a failed shipment of `r`'s pages; the caller's answer.
fn transfer_failed(r: &pb::PrefillRequest, e: TransferError) -> Status {
    count_transfer_failure(match e {
        TransferError::LayoutMismatch { .. } | TransferError::Refused(_) => "refused",
        TransferError::Timeout(_) => "timeout",
        _ => "send",
    });
    tracing::warn!(error = %e, "shipping KV pages failed");
    let to = if r.kv_link != 0 {
        format!("device link {:#x}", r.kv_link)
    } else {
        r.kv_destination.clone()
    };
    Status::unavailable(format!("KV transfer over {to} failed: {e}"))
}

/// Pages a device transfer shipped while its prompt was still being computed.
#[derive(Debug, Default)]
struct Streamed {
    /// Logical index of the next page to ship.
    next: usize,
    /// The blocks shipped so far (logical pages `skip..next`).
    ids: Vec<u32>,
    /// The engine's preemption count when the first piece left.
    preemptions: Option<u64>,
    /// A preemption happened meanwhile: what left early may be stale.
    preempted: bool,
    pages: u32,
    bytes: u64,
}

/// How long the early shipper waits when no new block is complete.
const PROGRESS_POLL: Duration = Duration::from_millis(1);

impl PrefillService {
    fn send_options(&self) -> SendOptions {
        SendOptions {
            timeout: self.transfer_timeout,
            stall_after_pages: match self.fault {
                Some(Fault::StallAfterPages(n)) => Some(n),
                _ => None,
            },
        }
    }

    /// Waits for the prefill of `rid` to finish, shipping over the request's device link each
    /// block that becomes complete meanwhile (a chunked prefill completes blocks step by step),
    /// so the transfer overlaps the computation of the rest of the prompt.
    async fn stream_while_prefilling(
        &self,
        rid: &str,
        r: &pb::PrefillRequest,
        early: &mut Streamed,
        mut done: tokio::sync::oneshot::Receiver<Result<Finished, String>>,
    ) -> Result<Finished, Status> {
        let links =
            self.links.clone().ok_or_else(|| Status::failed_precondition("no device transport"))?;
        loop {
            let id = rid.to_string();
            let progress = tokio::select! {
                out = &mut done => return out.map_err(|_| Status::internal("the prefill was dropped"))?.map_err(Status::internal),
                p = self.engine.call(move |s| s.engine.prefill_progress(&id)) => p.flatten(),
            };
            let piece = match progress {
                Some(p) => {
                    early.preempted |=
                        *early.preemptions.get_or_insert(p.preemptions) != p.preemptions;
                    if early.preempted || p.complete_blocks.len() <= early.next {
                        None
                    } else {
                        Some(p.complete_blocks[early.next..].to_vec())
                    }
                }
                None => None,
            };
            let Some(piece) = piece else {
                tokio::time::sleep(PROGRESS_POLL).await;
                continue;
            };
            let (l, opts, link, tid, first) =
                (links.clone(), self.send_options(), r.kv_link, r.transfer_id, early.next as u32);
            let blocks = piece.clone();
            let sent = tokio::task::spawn_blocking(move || l.send(link, tid, first, &blocks, opts))
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
            let bytes = sent.map_err(|e| transfer_failed(r, e))?;
            early.next += piece.len();
            early.pages += piece.len() as u32;
            early.bytes += bytes;
            early.ids.extend(piece);
        }
    }

    /// Ships the pages GPU to GPU over the device link the request names: those not shipped
    /// early, or all of them again when a preemption may have moved what left early.
    fn ship_device(
        &self,
        blocks: &[u32],
        r: &pb::PrefillRequest,
        early: &Streamed,
    ) -> Result<(u32, u64), TransferError> {
        let links = self.links.as_ref().ok_or_else(|| {
            TransferError::Refused(
                "this prefill worker has no device transport (start it with --kv-transport nccl)"
                    .into(),
            )
        })?;
        let skip = (r.skip_blocks as usize).min(blocks.len());
        let stale = early.preempted || !blocks[skip..].starts_with(&early.ids);
        let from = if stale { skip } else { early.next.clamp(skip, blocks.len()) };
        if stale && early.pages > 0 {
            tracing::warn!(
                early_pages = early.pages,
                "a preemption may have moved pages shipped early; shipping them all again"
            );
        }
        let mut bytes = early.bytes;
        if from < blocks.len() {
            bytes += links.send(
                r.kv_link,
                r.transfer_id,
                from as u32,
                &blocks[from..],
                self.send_options(),
            )?;
        }
        Ok((early.pages + (blocks.len() - from) as u32, bytes))
    }
}

#[tonic::async_trait]
impl pb::kv_transfer_server::KvTransfer for PrefillService {
    async fn endpoint(
        &self,
        _req: Request<pb::EndpointRequest>,
    ) -> Result<Response<pb::TransferEndpoint>, Status> {
        Err(Status::unimplemented(
            "prefill workers send KV pages; ask a decode worker where it receives them",
        ))
    }

    async fn join_link(
        &self,
        req: Request<pb::JoinLinkRequest>,
    ) -> Result<Response<pb::JoinLinkResponse>, Status> {
        let links = self.links.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "this prefill worker has no device transport (start it with --kv-transport nccl)",
            )
        })?;
        links.join(req.into_inner()).await?;
        Ok(Response::new(pb::JoinLinkResponse {}))
    }
}

#[tonic::async_trait]
impl pb::prefill_worker_server::PrefillWorker for PrefillService {
    async fn prefill(
        &self,
        req: Request<pb::PrefillRequest>,
    ) -> Result<Response<pb::PrefillResponse>, Status> {
        let r = req.into_inner();
        let params = params_from_proto(
            r.params.as_ref().ok_or_else(|| Status::invalid_argument("params are missing"))?,
        )?;
        let rid = format!("{}/{:x}", r.request_id, r.transfer_id);
        let span =
            tracing::info_span!("prefill", request_id = %r.request_id, transfer_id = r.transfer_id);
        async move {
            let started = Instant::now();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut tx = Some(tx);
            let (id, tokens) = (rid.clone(), r.prompt_token_ids.clone());
            // Over TCP the first pages are read as the prefill finishes, on the engine thread
            // before its next step: waiting for a later turn between steps costs a whole step.
            let first_pages =
                (r.kv_link == 0).then(|| (r.skip_blocks as usize, self.pages_per_read()));
            let opts = RequestOptions {
                prefill_only: true,
                cache_salt: (!r.cache_salt.is_empty()).then(|| r.cache_salt.clone()),
                ..Default::default()
            };
            // Armed before the request is queued: if the caller goes away while the engine thread
            // adds it, the abort queued behind it still releases it (jobs run in order).
            let _release = Release { engine: self.engine.clone(), rid: rid.clone() };
            self.engine
                .call(move |s| {
                    s.engine.add_request_with(&id, Prompt::TokenIds(tokens), params, opts)?;
                    let sub_id = id.clone();
                    s.subscribe(
                        &id,
                        Box::new(move |engine, ev| {
                            let done = match ev {
                                EngineEvent::Output(o) if o.finished => {
                                    Some(Ok(Finished::read(engine, &sub_id, o, first_pages)))
                                }
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
                .map_err(|e| engine_status(&e))?;
            let mut early = Streamed { next: r.skip_blocks as usize, ..Default::default() };
            let done = if r.kv_link != 0 && self.links.is_some() {
                self.stream_while_prefilling(&rid, &r, &mut early, rx).await?
            } else {
                rx.await
                    .map_err(|_| Status::internal("the prefill was dropped"))?
                    .map_err(Status::internal)?
            };
            let first = first_token(&done.out)
                .ok_or_else(|| Status::internal("the prefill produced no token"))?;
            let num_cached = done.out.metrics.num_cached_tokens as u32;
            let prefill_seconds = started.elapsed().as_secs_f64();
            let blocks =
                done.blocks.ok_or_else(|| Status::internal("the prefill's blocks are gone"))?;
            let (svc, req2, read, to_ship) = (self.clone(), r.clone(), done.pages, done.to_ship);
            let t0 = Instant::now();
            let early_pages = early.pages;
            let shipped = tokio::task::spawn_blocking(move || {
                if req2.kv_link != 0 {
                    svc.ship_device(&blocks, &req2, &early)
                } else {
                    svc.ship(&to_ship, &req2, read)
                }
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
            let transfer_seconds = t0.elapsed().as_secs_f64();
            match shipped {
                Ok((pages, bytes)) => {
                    observe_transfer(bytes, transfer_seconds);
                    tracing::info!(
                        pages,
                        bytes,
                        early_pages,
                        prefill_seconds,
                        transfer_seconds,
                        "pages shipped"
                    );
                    Ok(Response::new(pb::PrefillResponse {
                        first_token: Some(sampled_to_proto(&first)),
                        pages_sent: pages,
                        bytes_sent: bytes,
                        num_cached_tokens: num_cached,
                        prefill_seconds,
                        transfer_seconds,
                    }))
                }
                Err(e) => Err(transfer_failed(&r, e)),
            }
        }
        .instrument(span)
        .await
    }
}
