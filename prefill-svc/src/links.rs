//! Device links of a prefill worker: the sending ends of the links decode workers ask it to join
//! (`KvTransfer.JoinLink`), by link id. A link carries one transfer at a time; a send that fails
//! closes the link (its communicator is aborted), and the decode worker makes a new one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem_kv_transfer::device::{DeviceKv, DeviceKvInfo, DeviceLink, LinkRole, SendOptions};
use tandem_kv_transfer::{KvLayout, TransferError};
use tandem_proto::v1 as pb;

/// How long joining a link may take.
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);

type Slot = Arc<Mutex<Option<Box<dyn DeviceLink>>>>;

/// The sending ends of this worker's device links.
pub struct PrefillLinks {
    device: Arc<dyn DeviceKv>,
    layout: KvLayout,
    links: Mutex<HashMap<u64, Slot>>,
}

impl PrefillLinks {
    /// Links from `device` (this worker's pool) for transfers of `layout`.
    pub fn new(device: Arc<dyn DeviceKv>, layout: KvLayout) -> PrefillLinks {
        PrefillLinks { device, layout, links: Mutex::default() }
    }

    /// Checks a join request against this side (the same handshake as a TCP session) and
    /// joins; returns once both ends have joined.
    pub async fn join(&self, r: pb::JoinLinkRequest) -> Result<(), tonic::Status> {
        let remote = r.layout.as_ref().ok_or_else(|| tonic::Status::invalid_argument("the layout is missing"))?;
        let remote = tandem_worker::kv::layout_from_proto(remote).map_err(tonic::Status::invalid_argument)?;
        self.layout.check(&remote).map_err(|e| tonic::Status::failed_precondition(e.to_string()))?;
        self.device.info().check(&DeviceKvInfo { page_bytes: r.device_page_bytes, dtype: r.device_dtype.clone() }).map_err(|e| tonic::Status::failed_precondition(e.to_string()))?;
        let id: [u8; 128] = r.nccl_unique_id.as_slice().try_into().map_err(|_| tonic::Status::invalid_argument(format!("a link id is 128 bytes, not {}", r.nccl_unique_id.len())))?;
        let dev = self.device.clone();
        let join = tokio::task::spawn_blocking(move || dev.connect(LinkRole::Sender, &id));
        let link = match tokio::time::timeout(JOIN_TIMEOUT, join).await {
            Ok(Ok(Ok(l))) => l,
            Ok(Ok(Err(e))) => return Err(tonic::Status::unavailable(format!("joining the device link: {e}"))),
            Ok(Err(e)) => return Err(tonic::Status::internal(e.to_string())),
            Err(_) => return Err(tonic::Status::deadline_exceeded("joining the device link timed out")),
        };
        tracing::info!(link = r.link_id, "joined a device link");
        self.links.lock().expect("links lock").insert(r.link_id, Arc::new(Mutex::new(Some(link))));
        Ok(())
    }

    /// Closes every link (at shutdown: their communicators are aborted).
    pub fn close_all(&self) {
        for (_, slot) in self.links.lock().expect("links lock").drain() {
            if let Ok(mut l) = slot.try_lock() {
                l.take();
            }
        }
    }

    /// Sends `blocks` (pages `first_index..`) as `transfer_id` over link `link_id`, blocking
    /// until they have left; a failed link is closed and forgotten.
    pub fn send(&self, link_id: u64, transfer_id: u64, first_index: u32, blocks: &[u32], opts: SendOptions) -> Result<u64, TransferError> {
        let slot = self.links.lock().expect("links lock").get(&link_id).cloned().ok_or_else(|| TransferError::Refused(format!("no device link {link_id:#x} here (this worker may have restarted)")))?;
        let mut guard = slot.lock().expect("link lock");
        let link = guard.as_mut().ok_or_else(|| TransferError::Refused(format!("device link {link_id:#x} is closed")))?;
        let res = link.send(transfer_id, first_index, blocks, opts);
        if res.is_err() {
            // Dropping the link aborts its communicator.
            *guard = None;
            drop(guard);
            self.links.lock().expect("links lock").remove(&link_id);
        }
        res
    }
}
