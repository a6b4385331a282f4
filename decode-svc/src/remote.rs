//! Remote prefill: ask a prefill worker for the uncached part of a prompt, wait for its pages
//! and its first token, and continue the request here. A transfer that fails or stalls is
//! detected in bounded time (the receiver's I/O timeout and HTTP/2 keep-alive pings on the RPC);
//! the request is then prefilled locally (`recompute`) or failed (`fail`). Blocks are freed on
//! both sides either way.

use std::time::Instant;

use tandem_engine::llm_engine::remote_prefill::RemotePrefill;
use tandem_proto::v1 as pb;
use tandem_worker::convert::sampled_from_proto;
use tandem_worker::metrics::{count_transfer_failure, observe_transfer};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::Instrument;

use crate::state::DecodeService;
use crate::FailurePolicy;

type Tx = mpsc::UnboundedSender<Result<pb::GenerateResponse, Status>>;

/// Runs [`remote_prefill`] on a task of its own, in the caller's span; should that task panic,
/// the request fails (its client gets an error) instead of waiting forever.
pub(crate) fn spawn_remote_prefill(
    svc: DecodeService,
    req: pb::GenerateRequest,
    rp: RemotePrefill,
    tx: Tx,
) {
    let (rid, engine, transfers) =
        (req.request_id.clone(), svc.engine.clone(), svc.transfers.clone());
    let task = tokio::spawn(remote_prefill(svc, req, rp, tx).instrument(tracing::Span::current()));
    tokio::spawn(async move {
        if let Err(e) = task.await {
            if e.is_panic() {
                tracing::error!(request_id = %rid, "the remote prefill task panicked; failing the request");
                engine.submit(move |s| {
                    transfers.remove_request(&rid);
                    s.fail(&rid, "internal error during the remote prefill");
                });
            }
        }
    });
}

/// Runs the remote prefill of `req` into the blocks of `rp` (over the prefill worker's device
/// link when this worker has one, else TCP), then hands the request back to the engine.
async fn remote_prefill(svc: DecodeService, req: pb::GenerateRequest, rp: RemotePrefill, tx: Tx) {
    let transfer_id = svc.next_transfer_id();
    let rid = req.request_id.clone();
    let stall = svc.cfg.transfer_timeout;
    let started = Instant::now();
    // Pages over a device link to this prefill worker when this worker has one, else TCP.
    let link = match &svc.links {
        Some(links) => match links.get(&req.prefill_worker, &svc.clients, &svc.transfers).await {
            Ok(l) => l,
            Err(e) => {
                settle(&svc, &rid, transfer_id, Err(Failure::Connect(e)), started, None);
                return;
            }
        },
        None => None,
    };
    let skip = rp.num_cached_pages;
    let (mut failed_rx, arrived) = match &link {
        Some(l) => {
            l.begin();
            let expected = rp.block_table.len().saturating_sub(skip) as u32;
            let (f, a) = svc.transfers.register_device(
                transfer_id,
                &rid,
                rp.block_table.clone(),
                l.id,
                expected,
            );
            (f, Some(a))
        }
        None => (svc.transfers.register(transfer_id, &rid, rp.block_table.clone()), None),
    };
    let pre = pb::PrefillRequest {
        request_id: rid.clone(),
        prompt_token_ids: req.prompt_token_ids.clone(),
        params: req.params.clone(),
        cache_salt: req.cache_salt.clone(),
        kv_destination: svc.kv_addr.clone(),
        transfer_id,
        skip_blocks: skip as u32,
        kv_link: link.as_ref().map_or(0, |l| l.id),
    };
    let outcome: Outcome = async {
        let mut client = svc.clients.get(&req.prefill_worker, stall).map_err(Failure::Connect)?;
        let mut call = tonic::Request::new(pre);
        call.set_timeout(svc.cfg.prefill_timeout);
        let resp = tokio::select! {
            r = client.prefill(call) => r.map(|r| r.into_inner()).map_err(|s| {
                // A worker that failed the call for any reason but the request itself may have
                // lost its end of the link (restarted, aborted): make a new one next time.
                if let (Some(l), false) = (&link, s.code() == tonic::Code::InvalidArgument) {
                    l.close();
                }
                Failure::Rpc(format!("prefill worker {}: {}", req.prefill_worker, s.message()))
            }),
            msg = &mut failed_rx => Err(Failure::Receive(msg.unwrap_or_else(|_| "transfer cancelled".into()))),
            _ = tx.closed() => Err(Failure::Cancelled),
        }?;
        if let Some(arrived) = arrived {
            // The prefill worker's pages have left; they land here within the transfer timeout.
            tokio::select! {
                r = arrived => r.map_err(|_| Failure::Receive("the device link closed".into()))?,
                msg = &mut failed_rx => return Err(Failure::Receive(msg.unwrap_or_else(|_| "transfer cancelled".into()))),
                _ = tokio::time::sleep(stall) => return Err(Failure::Receive(format!("pages did not land within {stall:?} of being sent"))),
                _ = tx.closed() => return Err(Failure::Cancelled),
            }
        }
        Ok(resp)
    }
    .await;
    if let Some(l) = &link {
        if outcome.is_err() {
            // Before the blocks can be freed: pages still landing stop (the link closes).
            l.withdraw(&svc.transfers, transfer_id).await;
        }
        l.end();
    }
    settle(&svc, &rid, transfer_id, outcome, started, link.map(|l| l.id));
}

/// Why a remote prefill did not deliver its pages and first token.
#[derive(Debug)]
enum Failure {
    /// No channel to the prefill worker.
    Connect(String),
    /// The Prefill call failed.
    Rpc(String),
    /// The pages did not arrive (the receiver failed, the link closed, or they were late).
    Receive(String),
    /// The client went away: not a failure of the transfer.
    Cancelled,
}

impl Failure {
    /// The `reason` label of `tandem_kv_transfer_failures_total`.
    fn reason(&self) -> &'static str {
        match self {
            Failure::Connect(_) => "connect",
            Failure::Rpc(_) => "rpc",
            Failure::Receive(_) => "receive",
            Failure::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(m) | Failure::Rpc(m) | Failure::Receive(m) => f.write_str(m),
            Failure::Cancelled => f.write_str("the client went away"),
        }
    }
}

type Outcome = Result<pb::PrefillResponse, Failure>;

/// Hands the request back to the engine after its remote prefill: continuing from the first
/// token, or recomputing / failing it by the configured policy.
fn settle(
    svc: &DecodeService,
    rid: &str,
    transfer_id: u64,
    outcome: Outcome,
    started: Instant,
    link: Option<u64>,
) {
    let rid = rid.to_string();
    let policy = svc.cfg.failure_policy;
    let transfers = svc.transfers.clone();
    match outcome {
        Ok(resp) => {
            observe_transfer(resp.bytes_sent, resp.transfer_seconds);
            tracing::info!(request_id = %rid, pages = resp.pages_sent, bytes = resp.bytes_sent, prefill_s = resp.prefill_seconds, transfer_s = resp.transfer_seconds, total_s = started.elapsed().as_secs_f64(), link, "remote prefill done");
            let first = resp.first_token.as_ref().and_then(sampled_from_proto);
            svc.engine.submit(move |s| {
                transfers.remove(transfer_id);
                let res = match first {
                    Some(f) => s.engine.finish_remote_prefill(&rid, f).map_err(|e| e.to_string()),
                    None => Err("the prefill worker sent no first token".to_string()),
                };
                if let Err(e) = res {
                    if s.engine.request_status(&rid).is_some() {
                        tracing::warn!(request_id = %rid, error = %e, "remote prefill result refused; recomputing locally");
                        s.engine.fail_remote_prefill(&rid, true);
                    }
                }
            });
        }
        Err(Failure::Cancelled) => {
            svc.engine.submit(move |_| transfers.remove(transfer_id));
        }
        Err(failure) => {
            let reason = failure.reason();
            count_transfer_failure(reason);
            let recompute = policy == FailurePolicy::Recompute;
            let msg = failure.to_string();
            tracing::warn!(request_id = %rid, reason, error = %msg, recompute, link, "remote prefill failed");
            svc.engine.submit(move |s| {
                transfers.remove(transfer_id);
                if recompute {
                    s.engine.fail_remote_prefill(&rid, true);
                } else {
                    s.fail(&rid, &format!("KV transfer failed: {msg}"));
                }
            });
        }
    }
}
