//! `Transfers`: the KV transfers a decode worker is waiting for, and the TCP receiver that
//! writes their pages into the blocks reserved for them.
//!
//! A page is written only while its transfer is registered, and both the write and the
//! transfer's removal run on the engine thread, so a page can never land in a block that was
//! freed (the request was aborted, failed or finished) in the meantime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem_kv_transfer::tcp::{PageSink, TcpReceiver};
use tandem_kv_transfer::{KvLayout, TransferError};
use tandem_worker::EngineHandle;
use tokio::sync::oneshot;

struct Transfer {
    request_id: String,
    blocks: Vec<u32>,
    on_fail: Option<oneshot::Sender<String>>,
    /// Device transfers only.
    device: Option<DeviceWait>,
}

/// What a device transfer waits for: its pages over one link, possibly in several pieces.
struct DeviceWait {
    link: u64,
    on_arrive: Option<oneshot::Sender<()>>,
    expected: u32,
    received: u32,
}

/// The registry of pending transfers (shared by the request tasks and the receiver threads).
#[derive(Clone, Default)]
pub struct Transfers {
    inner: Arc<Mutex<HashMap<u64, Transfer>>>,
}

impl Transfers {
    /// Registers transfer `id` of `request_id` into `blocks`; the receiver reports its failure
    /// on the returned channel.
    pub fn register(
        &self,
        id: u64,
        request_id: &str,
        blocks: Vec<u32>,
    ) -> oneshot::Receiver<String> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(
            id,
            Transfer {
                request_id: request_id.to_string(),
                blocks,
                on_fail: Some(tx),
                device: None,
            },
        );
        rx
    }

    /// Registers transfer `id` of `request_id` into `blocks`, `expected` pages of it coming over
    /// device link `link` (in one piece or several): the receiver reports a failure on the first
    /// channel, the arrival of every expected page (in the blocks, checksums verified) on the
    /// second.
    pub fn register_device(
        &self,
        id: u64,
        request_id: &str,
        blocks: Vec<u32>,
        link: u64,
        expected: u32,
    ) -> (oneshot::Receiver<String>, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let (atx, arx) = oneshot::channel();
        let device = DeviceWait { link, on_arrive: Some(atx), expected, received: 0 };
        self.lock().insert(
            id,
            Transfer {
                request_id: request_id.to_string(),
                blocks,
                on_fail: Some(tx),
                device: Some(device),
            },
        );
        (rx, arx)
    }

    /// The blocks for pages `first..first + pages` of device transfer `id` arriving over `link`,
    /// if it is still awaited there; `claim` runs under the registry's lock when it is (so a
    /// cancellation sees the claim).
    pub(crate) fn route_device(
        &self,
        id: u64,
        link: u64,
        first: u32,
        pages: u32,
        claim: impl FnOnce(),
    ) -> Option<Vec<u32>> {
        let map = self.lock();
        let t = map.get(&id).filter(|t| t.device.as_ref().is_some_and(|d| d.link == link))?;
        let blocks =
            t.blocks.get(first as usize..(first as usize).checked_add(pages as usize)?)?.to_vec();
        claim();
        Some(blocks)
    }

    /// Reports `pages` more pages of device transfer `id` landed (`Ok`), or the piece failed;
    /// the transfer is complete once every expected page has landed.
    pub(crate) fn report_arrival(&self, id: u64, pages: u32, verdict: Result<(), String>) {
        match verdict {
            Ok(()) => {
                let mut map = self.lock();
                let Some(d) = map.get_mut(&id).and_then(|t| t.device.as_mut()) else { return };
                d.received = d.received.saturating_add(pages);
                if d.received >= d.expected {
                    if let Some(tx) = d.on_arrive.take() {
                        let _ = tx.send(());
                    }
                }
            }
            Err(e) => self.report_failure(id, e),
        }
    }

    /// Fails every transfer still awaited over `link` (the link closed).
    pub(crate) fn fail_link(&self, link: u64, message: &str) {
        for t in
            self.lock().values_mut().filter(|t| t.device.as_ref().is_some_and(|d| d.link == link))
        {
            if let Some(tx) = t.on_fail.take() {
                let _ = tx.send(message.to_string());
            }
        }
    }

    /// Forgets transfer `id` now; `check` runs under the registry's lock (so a receiver cannot
    /// claim it afterwards).
    pub(crate) fn withdraw<R>(&self, id: u64, check: impl FnOnce() -> R) -> R {
        let mut map = self.lock();
        map.remove(&id);
        check()
    }

    /// Forgets transfer `id` (call on the engine thread, with the request's state change).
    pub fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Forgets every transfer of `request_id` (call on the engine thread).
    pub fn remove_request(&self, request_id: &str) {
        self.lock().retain(|_, t| t.request_id != request_id);
    }

    fn contains(&self, id: u64) -> bool {
        self.lock().contains_key(&id)
    }

    /// The block page `index` of transfer `id` lands in; none for a page this side gave back
    /// (a window passed it: the receiver refuses a page sent for it).
    fn block(&self, id: u64, index: u32) -> Option<u32> {
        self.lock()
            .get(&id)
            .and_then(|t| t.blocks.get(index as usize).copied())
            .filter(|&b| b != tandem_engine::backend::NO_PAGE)
    }

    pub(crate) fn report_failure(&self, id: u64, message: String) {
        if let Some(tx) = self.lock().get_mut(&id).and_then(|t| t.on_fail.take()) {
            let _ = tx.send(message);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Transfer>> {
        self.inner.lock().expect("transfers lock")
    }
}

/// Writes a connection's pages through the engine thread; writes are queued without waiting
/// and completed by `flush`, so receiving overlaps the engine's steps.
struct EngineSink {
    engine: EngineHandle,
    transfers: Transfers,
    current: Option<u64>,
    error: Arc<Mutex<Option<String>>>,
    /// Answers once the engine thread has run every write queued before the flush began.
    flushing: Option<std::sync::mpsc::Receiver<()>>,
}

impl PageSink for EngineSink {
    fn target(&mut self, transfer_id: u64, index: u32, _block_hash: u64) -> Option<u32> {
        self.current = Some(transfer_id);
        self.transfers.block(transfer_id, index)
    }

    fn write(&mut self, block: u32, payload: Vec<u8>) -> Result<(), String> {
        let id = self.current.expect("target precedes write");
        let (transfers, error) = (self.transfers.clone(), self.error.clone());
        let queued = self.engine.submit(move |s| {
            // Re-checked on the engine thread: the transfer may have been cancelled since.
            let res = if !transfers.contains(id) {
                Err(format!("transfer {id} was cancelled"))
            } else {
                s.engine.write_kv_block(block, &payload).map_err(|e| e.to_string())
            };
            if let Err(e) = res {
                error.lock().expect("sink error lock").get_or_insert(e);
            }
        });
        if !queued {
            return Err("the engine has stopped".into());
        }
        match self.error.lock().expect("sink error lock").clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        while !self.flush_wait(Duration::from_secs(1))? {}
        Ok(())
    }

    fn flush_wait(&mut self, wait: Duration) -> Result<bool, String> {
        let rx = match &self.flushing {
            Some(rx) => rx,
            None => {
                let (tx, rx) = std::sync::mpsc::channel();
                // Jobs run in order: this one runs after every queued write.
                if !self.engine.submit(move |_| {
                    let _ = tx.send(());
                }) {
                    return Err("the engine has stopped".into());
                }
                self.flushing.insert(rx)
            }
        };
        match rx.recv_timeout(wait) {
            Ok(()) => {
                self.flushing = None;
                match self.error.lock().expect("sink error lock").clone() {
                    Some(e) => Err(e),
                    None => Ok(true),
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(false),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err("the engine has stopped".into())
            }
        }
    }
}

/// Listens for KV pages on `addr`, one thread per sending connection. Returns the bound
/// address. A connection that fails (layout mismatch, corrupt page, stall beyond `timeout`)
/// reports the failure to the transfer's request task.
pub fn start_receiver(
    addr: &str,
    layout: KvLayout,
    timeout: Duration,
    engine: EngineHandle,
    transfers: Transfers,
) -> Result<std::net::SocketAddr, TransferError> {
    let receiver = Arc::new(
        TcpReceiver::bind(addr, layout, timeout)?.require_auth(tandem_worker::auth::kv_auth()),
    );
    let local = receiver.local_addr()?;
    std::thread::Builder::new()
        .name("kv-receiver".into())
        .spawn(move || loop {
            let conn = match receiver.accept() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "KV receiver accept failed");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let (receiver, engine, transfers) = (receiver.clone(), engine.clone(), transfers.clone());
            std::thread::spawn(move || {
                let mut sink = EngineSink { engine, transfers: transfers.clone(), current: None, error: Arc::default(), flushing: None };
                match receiver.serve_connection(conn, &mut sink) {
                    Ok(sum) => tracing::debug!(transfer_id = sum.transfer_id, pages = sum.pages, bytes = sum.bytes, "KV pages received"),
                    Err(e) => {
                        tracing::warn!(transfer_id = ?sink.current, error = %e, "KV transfer failed on the receiving side");
                        if let Some(id) = sink.current {
                            transfers.report_failure(id, e.to_string());
                        }
                    }
                }
            });
        })
        .map_err(TransferError::Io)?;
    Ok(local)
}
