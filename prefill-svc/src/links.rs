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
        let remote = r
            .layout
            .as_ref()
            .ok_or_else(|| tonic::Status::invalid_argument("the layout is missing"))?;
        let remote = tandem_worker::kv::layout_from_proto(remote)
            .map_err(tonic::Status::invalid_argument)?;
        self.layout
            .check(&remote)
            .map_err(|e| tonic::Status::failed_precondition(e.to_string()))?;
        self.device
            .info()
            .check(&DeviceKvInfo { page_bytes: r.device_page_bytes, dtype: r.device_dtype.clone() })
            .map_err(|e| tonic::Status::failed_precondition(e.to_string()))?;
        let id: [u8; 128] = r.nccl_unique_id.as_slice().try_into().map_err(|_| {
            tonic::Status::invalid_argument(format!(
                "a link id is 128 bytes, not {}",
                r.nccl_unique_id.len()
            ))
        })?;
        let dev = self.device.clone();
        let join = tokio::task::spawn_blocking(move || dev.connect(LinkRole::Sender, &id));
        let link = match tokio::time::timeout(JOIN_TIMEOUT, join).await {
            Ok(Ok(Ok(l))) => l,
            Ok(Ok(Err(e))) => {
                return Err(tonic::Status::unavailable(format!("joining the device link: {e}")))
            }
            Ok(Err(e)) => return Err(tonic::Status::internal(e.to_string())),
            Err(_) => {
                return Err(tonic::Status::deadline_exceeded("joining the device link timed out"))
            }
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
    pub fn send(
        &self,
        link_id: u64,
        transfer_id: u64,
        first_index: u32,
        blocks: &[u32],
        opts: SendOptions,
    ) -> Result<u64, TransferError> {
        let slot =
            self.links.lock().expect("links lock").get(&link_id).cloned().ok_or_else(|| {
                TransferError::Refused(format!(
                    "no device link {link_id:#x} here (this worker may have restarted)"
                ))
            })?;
        let mut guard = slot.lock().expect("link lock");
        let link = guard
            .as_mut()
            .ok_or_else(|| TransferError::Refused(format!("device link {link_id:#x} is closed")))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tandem_kv_transfer::device::{Received, TransferHeader};
    use tandem_kv_transfer::KvDtype;

    /// A pool whose links fail their first send after `fail_after` good ones.
    struct FakePool {
        joins: AtomicUsize,
        fail_after: usize,
    }

    struct FakeLink {
        sends: usize,
        fail_after: usize,
    }

    impl DeviceLink for FakeLink {
        fn send(
            &mut self,
            _id: u64,
            _first: u32,
            blocks: &[u32],
            opts: SendOptions,
        ) -> Result<u64, TransferError> {
            self.sends += 1;
            if self.sends > self.fail_after {
                return Err(TransferError::Timeout(opts.timeout));
            }
            Ok(blocks.len() as u64 * 64)
        }
        fn recv(
            &mut self,
            _: &mut dyn FnMut(&TransferHeader) -> Option<Vec<u32>>,
            _: &dyn Fn() -> bool,
            _: Duration,
        ) -> Result<Option<Received>, TransferError> {
            unreachable!("a prefill worker only sends")
        }
    }

    impl DeviceKv for FakePool {
        fn info(&self) -> DeviceKvInfo {
            DeviceKvInfo { page_bytes: 64, dtype: "bf16".into() }
        }
        fn new_link_id(&self) -> Result<[u8; 128], TransferError> {
            Ok([7; 128])
        }
        fn connect(
            &self,
            role: LinkRole,
            _id: &[u8; 128],
        ) -> Result<Box<dyn DeviceLink>, TransferError> {
            assert_eq!(role, LinkRole::Sender);
            self.joins.fetch_add(1, Ordering::SeqCst);
            Ok(Box::new(FakeLink { sends: 0, fail_after: self.fail_after }))
        }
    }

    fn layout() -> KvLayout {
        KvLayout {
            model_id: "m".into(),
            dtype: KvDtype::F32,
            block_size: 16,
            num_layers: 2,
            num_kv_heads: 1,
            head_dim: 4,
            hash_seed: 1,
        }
    }

    fn request(
        link_id: u64,
        layout: &KvLayout,
        page_bytes: u64,
        dtype: &str,
        id_len: usize,
    ) -> pb::JoinLinkRequest {
        pb::JoinLinkRequest {
            link_id,
            nccl_unique_id: vec![1; id_len],
            layout: Some(tandem_worker::kv::layout_to_proto(layout)),
            device_page_bytes: page_bytes,
            device_dtype: dtype.into(),
        }
    }

    #[tokio::test]
    async fn joins_only_a_matching_peer_and_forgets_a_failed_link() {
        let pool = Arc::new(FakePool { joins: AtomicUsize::new(0), fail_after: 2 });
        let links = PrefillLinks::new(pool.clone(), layout());
        let opts = SendOptions { timeout: Duration::from_millis(10), stall_after_pages: None };

        // The same handshake as a TCP session, plus the device's page size and type.
        let mut other = layout();
        other.num_layers = 3;
        let e = links.join(request(1, &other, 64, "bf16", 128)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("num_layers"), "{}", e.message());
        let e = links.join(request(1, &layout(), 64, "f16", 128)).await.unwrap_err();
        assert!(e.message().contains("device KV dtype"), "{}", e.message());
        let e = links.join(request(1, &layout(), 128, "bf16", 128)).await.unwrap_err();
        assert!(e.message().contains("device page bytes"), "{}", e.message());
        let e = links.join(request(1, &layout(), 64, "bf16", 100)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(pool.joins.load(Ordering::SeqCst), 0, "refused before joining");
        assert!(
            matches!(links.send(1, 9, 0, &[1, 2], opts), Err(TransferError::Refused(_))),
            "no link 1 yet"
        );

        links.join(request(1, &layout(), 64, "bf16", 128)).await.unwrap();
        assert_eq!(links.send(1, 9, 0, &[1, 2], opts).unwrap(), 128);
        assert_eq!(links.send(1, 10, 0, &[3], opts).unwrap(), 64, "the link is reused");
        assert!(matches!(links.send(1, 11, 0, &[4], opts), Err(TransferError::Timeout(_))));
        let e = links.send(1, 12, 0, &[4], opts).unwrap_err();
        assert!(e.to_string().contains("no device link"), "a failed link is gone: {e}");
        assert_eq!(pool.joins.load(Ordering::SeqCst), 1);
    }
}
