//! Device links to prefill workers: KV pages GPU to GPU (NCCL) instead of over TCP.
//!
//! One link per prefill worker, made when the first request goes there and reused after: this
//! worker makes the link id, starts joining as the receiving end and asks the prefill worker to
//! join as the sender (`KvTransfer.JoinLink`, which carries the same layout handshake as a TCP
//! session). A thread per link then receives transfer after transfer, each into the blocks
//! reserved for its request, and reports each arrival (checksums verified) or failure.
//!
//! A link that fails (a stalled or dead peer, a malformed header) is closed: its communicator is
//! aborted, its streams drained, every transfer still awaited on it fails, and the next request
//! to that prefill worker makes a new one. A request that gives up on its transfer while the
//! pages are landing closes the link the same way before its blocks are freed, so no page can
//! land in a block that has another owner.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tandem_kv_transfer::device::{DeviceKv, DeviceLink, LinkRole};
use tandem_kv_transfer::KvLayout;
use tandem_proto::v1 as pb;
use tandem_proto::v1::kv_transfer_client::KvTransferClient;
use tandem_worker::auth::authed;
use tokio::sync::watch;

use crate::clients::PrefillClients;
use crate::transfers::Transfers;

/// How long joining a link may take (NCCL's first communicator in a process takes seconds).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a prefill worker that would not join a device link gets its pages over TCP instead
/// before it is asked again.
const REFUSED_FOR: Duration = Duration::from_secs(60);

#[derive(Default)]
struct LinkState {
    /// Transfers requested over the link and not yet settled.
    outstanding: usize,
    /// The transfer whose pages are landing now.
    receiving: Option<u64>,
}

/// One link to a prefill worker, as the request tasks see it.
pub struct Link {
    /// The id prefill requests name it by.
    pub id: u64,
    state: Mutex<LinkState>,
    wake: Condvar,
    closed: AtomicBool,
    ended: watch::Sender<bool>,
}

impl Link {
    fn new(id: u64) -> Link {
        Link {
            id,
            state: Mutex::default(),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
            ended: watch::channel(false).0,
        }
    }

    /// Whether the link is closed (or closing).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Closes the link: its receiver stops, aborts the communicator and fails what is still
    /// awaited on it; the next request to the prefill worker makes a new link.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_all();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.state.lock().expect("link state lock")
    }

    /// A transfer is about to be requested over the link (the receiver starts listening).
    pub fn begin(&self) {
        self.lock().outstanding += 1;
        self.wake.notify_all();
    }

    /// A transfer begun with [`Link::begin`] is settled.
    pub fn end(&self) {
        let mut s = self.lock();
        s.outstanding = s.outstanding.saturating_sub(1);
    }

    /// Gives up transfer `id`: it is withdrawn from `transfers`, and when its pages are landing
    /// right now the link is closed and this returns once the link's streams are drained. Call
    /// before the transfer's blocks are freed.
    pub async fn withdraw(&self, transfers: &Transfers, id: u64) {
        let landing = transfers.withdraw(id, || self.lock().receiving == Some(id));
        if landing {
            tracing::warn!(
                transfer_id = id,
                link = self.id,
                "transfer given up while its pages land; closing the link"
            );
            self.close();
            self.ended().await;
        }
    }

    /// Returns once the link's receiver has ended (its communicator aborted and drained).
    async fn ended(&self) {
        let _ = self.ended.subscribe().wait_for(|&e| e).await;
    }
}

/// The device links of a decode worker, one per prefill worker.
pub struct DeviceLinks {
    device: Arc<dyn DeviceKv>,
    layout: KvLayout,
    transfer_timeout: Duration,
    links: Mutex<HashMap<String, Arc<Link>>>,
    /// Prefill workers that would not join, and when they said so.
    refused: Mutex<HashMap<String, std::time::Instant>>,
    connecting: tokio::sync::Mutex<()>,
}

fn new_link_id() -> u64 {
    let t = tandem_worker::status::new_epoch();
    (t.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id()).rotate_left(40)) | 1
}

impl DeviceLinks {
    /// Links from `device` (this worker's pool) for transfers of `layout`.
    pub fn new(
        device: Arc<dyn DeviceKv>,
        layout: KvLayout,
        transfer_timeout: Duration,
    ) -> DeviceLinks {
        DeviceLinks {
            device,
            layout,
            transfer_timeout,
            links: Mutex::default(),
            refused: Mutex::default(),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// Closes every link and waits (up to `wait`) until their receivers have aborted the
    /// communicators and drained their streams: at shutdown, before the process tears CUDA down.
    pub async fn close_all(&self, wait: Duration) {
        let links: Vec<Arc<Link>> =
            self.links.lock().expect("links lock").drain().map(|(_, l)| l).collect();
        for l in &links {
            l.close();
        }
        for l in links {
            if tokio::time::timeout(wait, l.ended()).await.is_err() {
                tracing::warn!(link = l.id, "a device link's receiver did not stop in time");
            }
        }
    }

    fn live(&self, addr: &str) -> Option<Arc<Link>> {
        self.links.lock().expect("links lock").get(addr).filter(|l| !l.is_closed()).cloned()
    }

    fn recently_refused(&self, addr: &str) -> bool {
        self.refused
            .lock()
            .expect("refused lock")
            .get(addr)
            .is_some_and(|t| t.elapsed() < REFUSED_FOR)
    }

    /// The link to the prefill worker at `addr`, made (and its receiver started) if there is
    /// none or the last one closed; `None` when that worker would not join one lately (it is
    /// not on a GPU, or not started with `--kv-transport nccl`): its pages then come over TCP.
    pub async fn get(
        &self,
        addr: &str,
        clients: &PrefillClients,
        transfers: &Transfers,
    ) -> Result<Option<Arc<Link>>, String> {
        if let Some(l) = self.live(addr) {
            return Ok(Some(l));
        }
        if self.recently_refused(addr) {
            return Ok(None);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(l) = self.live(addr) {
            return Ok(Some(l));
        }
        if self.recently_refused(addr) {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        let id_bytes = self.device.new_link_id().map_err(|e| e.to_string())?;
        let link_id = new_link_id();
        let dev = self.device.clone();
        let join = tokio::task::spawn_blocking(move || dev.connect(LinkRole::Receiver, &id_bytes));
        let info = self.device.info();
        let req = pb::JoinLinkRequest {
            link_id,
            nccl_unique_id: id_bytes.to_vec(),
            layout: Some(tandem_worker::kv::layout_to_proto(&self.layout)),
            device_page_bytes: info.page_bytes,
            device_dtype: info.dtype,
        };
        let mut client =
            KvTransferClient::new(authed(clients.channel(addr, self.transfer_timeout)?));
        let mut call = tonic::Request::new(req);
        call.set_timeout(CONNECT_TIMEOUT);
        if let Err(s) = client.join_link(call).await {
            // Our end is waiting for a peer that will not come: join it ourselves in the
            // background so that the waiting ends (NCCL refuses two ends on one GPU), and let
            // both go; nobody waits for that here.
            let dev = self.device.clone();
            tokio::spawn(async move {
                let other = tokio::task::spawn_blocking(move || {
                    drop(dev.connect(LinkRole::Sender, &id_bytes))
                });
                if tokio::time::timeout(CONNECT_TIMEOUT, join).await.is_err() {
                    tracing::warn!(
                        "an abandoned device link end did not stop waiting for its peer"
                    );
                }
                drop(other);
            });
            tracing::warn!(
                prefill = addr,
                error = s.message(),
                "the prefill worker would not join a device link; its pages come over TCP for now"
            );
            self.refused
                .lock()
                .expect("refused lock")
                .insert(addr.to_string(), std::time::Instant::now());
            return Ok(None);
        }
        let dl = match tokio::time::timeout(CONNECT_TIMEOUT, join).await {
            Ok(Ok(Ok(dl))) => dl,
            Ok(Ok(Err(e))) => return Err(format!("joining the device link with {addr}: {e}")),
            Ok(Err(e)) => return Err(format!("joining the device link with {addr}: {e}")),
            Err(_) => return Err(format!("joining the device link with {addr} timed out")),
        };
        let link = Arc::new(Link::new(link_id));
        let (l, t, timeout) = (link.clone(), transfers.clone(), self.transfer_timeout);
        std::thread::Builder::new()
            .name("kv-link".into())
            .spawn(move || receive(l, dl, t, timeout))
            .map_err(|e| format!("starting the link's receiver: {e}"))?;
        tracing::info!(
            prefill = addr,
            link = link_id,
            seconds = started.elapsed().as_secs_f64(),
            "device link to the prefill worker up"
        );
        self.links.lock().expect("links lock").insert(addr.to_string(), link.clone());
        Ok(Some(link))
    }
}

/// The receiving loop of one link: waits while no transfer is outstanding, receives each
/// transfer into the blocks of its request, and closes the link on the first link error.
fn receive(link: Arc<Link>, dl: Box<dyn DeviceLink>, transfers: Transfers, timeout: Duration) {
    /// Whatever ends this thread (a panic included), the link ends with it, in this order: its
    /// communicator aborted and streams drained (dropping it), the link closed, what is awaited
    /// on it failed, and those waiting for the end told.
    struct Ending {
        link: Arc<Link>,
        transfers: Transfers,
        reason: String,
        dl: Option<Box<dyn DeviceLink>>,
    }
    impl Drop for Ending {
        fn drop(&mut self) {
            self.link.close();
            drop(self.dl.take());
            self.link.lock().receiving = None;
            self.transfers.fail_link(self.link.id, &self.reason);
            self.link.ended.send_replace(true);
        }
    }
    let mut ending = Ending {
        link: link.clone(),
        transfers: transfers.clone(),
        reason: "the device link's receiver stopped".into(),
        dl: Some(dl),
    };
    let dl = ending.dl.as_mut().expect("set above");
    let reason = loop {
        {
            let mut s = link.lock();
            while s.outstanding == 0 && !link.is_closed() {
                s = link
                    .wake
                    .wait_timeout(s, Duration::from_millis(200))
                    .expect("link state lock")
                    .0;
            }
        }
        if link.is_closed() {
            break "the device link was closed".to_string();
        }
        let mut route = |h: &tandem_kv_transfer::device::TransferHeader| {
            transfers.route_device(h.transfer_id, link.id, h.first_index, h.pages, || {
                link.lock().receiving = Some(h.transfer_id)
            })
        };
        match dl.recv(&mut route, &|| !link.is_closed(), timeout) {
            Ok(None) => continue,
            Ok(Some(r)) => {
                link.lock().receiving = None;
                let id = r.header.transfer_id;
                if r.stored {
                    if let Err(e) = &r.verdict {
                        tracing::warn!(transfer_id = id, error = %e, "KV pages arrived corrupt");
                    }
                    transfers.report_arrival(
                        id,
                        r.header.pages,
                        r.verdict.map_err(|e| e.to_string()),
                    );
                } else {
                    tracing::debug!(
                        transfer_id = id,
                        pages = r.header.pages,
                        "pages of a withdrawn transfer received and dropped"
                    );
                }
            }
            Err(e) => {
                let id = link.lock().receiving.take();
                tracing::warn!(link = link.id, transfer_id = ?id, error = %e, "device link failed");
                if let Some(id) = id {
                    transfers.report_failure(id, format!("device link: {e}"));
                }
                break format!("device link failed: {e}");
            }
        }
    };
    ending.reason = reason;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_transfer_withdrawn_mid_landing_closes_the_link_and_waits_for_it() {
        let transfers = Transfers::default();
        let link = Arc::new(Link::new(5));
        let (_fail, _arrive) = transfers.register_device(9, "r", vec![4, 5, 6], 5, 3);
        // The receiver claims transfer 9's pages 1..3.
        let blocks = transfers.route_device(9, 5, 1, 2, || link.lock().receiving = Some(9));
        assert_eq!(blocks, Some(vec![5, 6]));
        // A transfer of another link, or pages out of range, are not routed.
        assert_eq!(transfers.route_device(9, 6, 0, 1, || {}), None);
        assert_eq!(transfers.route_device(9, 5, 2, 2, || {}), None);
        let l2 = link.clone();
        let waiter = tokio::spawn(async move { l2.withdraw(&Transfers::default(), 0).await });
        waiter.await.unwrap(); // not landing: returns at once
        let (l3, t3) = (link.clone(), transfers.clone());
        let withdraw = tokio::spawn(async move { l3.withdraw(&t3, 9).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(link.is_closed(), "withdrawing a landing transfer closes the link");
        assert!(!withdraw.is_finished(), "and waits until the link has ended");
        link.ended.send_replace(true);
        withdraw.await.unwrap();
        // Withdrawn: a later header for it goes nowhere.
        assert_eq!(transfers.route_device(9, 5, 0, 1, || {}), None);
    }

    #[tokio::test]
    async fn a_transfer_withdrawn_before_its_header_leaves_the_link_open() {
        let transfers = Transfers::default();
        let link = Link::new(5);
        let (_fail, _arrive) = transfers.register_device(9, "r", vec![4], 5, 1);
        link.withdraw(&transfers, 9).await;
        assert!(!link.is_closed());
        assert_eq!(transfers.route_device(9, 5, 0, 1, || panic!("not claimed")), None);
    }

    #[test]
    fn arrivals_and_link_failures_reach_the_request() {
        let transfers = Transfers::default();
        let (mut fail, mut arrive) = transfers.register_device(1, "a", vec![1, 2, 3, 4], 7, 3);
        let (mut fail2, _a2) = transfers.register_device(2, "b", vec![2], 7, 1);
        let (mut fail3, _a3) = transfers.register_device(3, "c", vec![3], 8, 1);
        // Three pages expected (one was cached here), landing in two pieces.
        transfers.report_arrival(1, 2, Ok(()));
        assert!(arrive.try_recv().is_err(), "not complete after the first piece");
        transfers.report_arrival(1, 1, Ok(()));
        assert!(arrive.try_recv().is_ok());
        assert!(fail.try_recv().is_err());
        transfers.fail_link(7, "gone");
        assert_eq!(fail2.try_recv().unwrap(), "gone");
        assert!(fail3.try_recv().is_err(), "another link's transfer is not failed");
    }

    /// A link that plays a script: each call receives the next header (routing it as the real
    /// link does), fails, or panics.
    enum Step {
        Pages(u64, u32, u32, bool),
        Fail,
        Panic,
    }

    struct Scripted(std::collections::VecDeque<Step>, Arc<AtomicBool>);

    impl DeviceLink for Scripted {
        fn send(
            &mut self,
            _: u64,
            _: u32,
            _: &[u32],
            _: tandem_kv_transfer::device::SendOptions,
        ) -> Result<u64, tandem_kv_transfer::TransferError> {
            unreachable!()
        }
        fn recv(
            &mut self,
            route: &mut dyn FnMut(&tandem_kv_transfer::device::TransferHeader) -> Option<Vec<u32>>,
            keep_waiting: &dyn Fn() -> bool,
            _: Duration,
        ) -> Result<Option<tandem_kv_transfer::device::Received>, tandem_kv_transfer::TransferError>
        {
            match self.0.pop_front() {
                Some(Step::Pages(id, first, pages, good)) => {
                    let header = tandem_kv_transfer::device::TransferHeader {
                        transfer_id: id,
                        first_index: first,
                        pages,
                        page_bytes: 64,
                    };
                    let stored = route(&header).is_some();
                    let verdict = if good {
                        Ok(())
                    } else {
                        Err(tandem_kv_transfer::TransferError::Checksum {
                            transfer_id: id,
                            index: first,
                            expected: 1,
                            actual: 2,
                        })
                    };
                    Ok(Some(tandem_kv_transfer::device::Received { header, stored, verdict }))
                }
                Some(Step::Fail) => {
                    Err(tandem_kv_transfer::TransferError::Timeout(Duration::from_secs(2)))
                }
                Some(Step::Panic) => panic!("scripted panic"),
                None => {
                    while keep_waiting() {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Ok(None)
                }
            }
        }
    }

    impl Drop for Scripted {
        fn drop(&mut self) {
            self.1.store(true, Ordering::SeqCst);
        }
    }

    async fn ended(link: &Link) {
        tokio::time::timeout(Duration::from_secs(10), link.ended())
            .await
            .expect("the receiver ended");
    }

    #[tokio::test]
    async fn the_receiver_reports_pieces_checksums_and_its_own_end() {
        let transfers = Transfers::default();
        let link = Arc::new(Link::new(3));
        let (_fail1, mut arrive1) = transfers.register_device(1, "a", vec![10, 11, 12], 3, 3);
        let (mut fail2, _a2) = transfers.register_device(2, "b", vec![20], 3, 1);
        let (mut fail3, _a3) = transfers.register_device(3, "c", vec![30], 3, 1);
        let dropped = Arc::new(AtomicBool::new(false));
        let script = [
            Step::Pages(1, 0, 2, true),
            Step::Pages(99, 0, 1, true),
            Step::Pages(1, 2, 1, true),
            Step::Pages(2, 0, 1, false),
            Step::Fail,
        ];
        let dl = Box::new(Scripted(script.into_iter().collect(), dropped.clone()));
        link.begin();
        let (l, t) = (link.clone(), transfers.clone());
        std::thread::spawn(move || receive(l, dl, t, Duration::from_secs(2)));
        ended(&link).await;
        assert!(arrive1.try_recv().is_ok(), "transfer 1 complete after its two pieces");
        assert!(
            fail2.try_recv().unwrap().contains("checksum"),
            "a corrupt piece fails its transfer"
        );
        assert!(
            fail3.try_recv().unwrap().contains("failed"),
            "a failed link fails what is awaited on it"
        );
        assert!(
            link.is_closed() && dropped.load(Ordering::SeqCst),
            "closed, and the link dropped (aborted) before the end was told"
        );
    }

    #[tokio::test]
    async fn a_panicking_receiver_still_ends_its_link() {
        let transfers = Transfers::default();
        let link = Arc::new(Link::new(4));
        let (mut fail, _a) = transfers.register_device(1, "a", vec![1], 4, 1);
        let dropped = Arc::new(AtomicBool::new(false));
        let dl = Box::new(Scripted([Step::Panic].into_iter().collect(), dropped.clone()));
        link.begin();
        let (l, t) = (link.clone(), transfers.clone());
        let h = std::thread::spawn(move || receive(l, dl, t, Duration::from_secs(2)));
        ended(&link).await;
        assert!(h.join().is_err());
        assert!(dropped.load(Ordering::SeqCst) && link.is_closed());
        assert!(fail.try_recv().is_ok(), "the request waiting on it is told");
    }

    #[tokio::test]
    async fn closing_an_idle_link_ends_its_receiver() {
        let link = Arc::new(Link::new(6));
        let dropped = Arc::new(AtomicBool::new(false));
        let dl = Box::new(Scripted(Default::default(), dropped.clone()));
        let (l, t) = (link.clone(), Transfers::default());
        std::thread::spawn(move || receive(l, dl, t, Duration::from_secs(2)));
        link.close();
        ended(&link).await;
        assert!(dropped.load(Ordering::SeqCst));
    }

    /// A receiver that ended before anyone waited for it still reads as ended (its end is kept,
    /// not only told to those already waiting).
    #[tokio::test]
    async fn a_link_that_ended_before_the_wait_reads_as_ended() {
        let link = Arc::new(Link::new(7));
        let dl = Box::new(Scripted(Default::default(), Arc::new(AtomicBool::new(false))));
        let (l, t) = (link.clone(), Transfers::default());
        let h = std::thread::spawn(move || receive(l, dl, t, Duration::from_secs(2)));
        link.close();
        h.join().unwrap();
        ended(&link).await;
    }

    /// A device whose link ends wait for each other, as NCCL's do: a receiver's `connect`
    /// returns only once a sender joined with the same id.
    #[derive(Default)]
    struct Rendezvous {
        joined: Mutex<Vec<[u8; 128]>>,
        wake: Condvar,
    }

    impl DeviceKv for Rendezvous {
        fn info(&self) -> tandem_kv_transfer::device::DeviceKvInfo {
            tandem_kv_transfer::device::DeviceKvInfo { page_bytes: 64, dtype: "bf16".into() }
        }
        fn new_link_id(&self) -> Result<[u8; 128], tandem_kv_transfer::TransferError> {
            Ok([3; 128])
        }
        fn connect(
            &self,
            role: LinkRole,
            id: &[u8; 128],
        ) -> Result<Box<dyn DeviceLink>, tandem_kv_transfer::TransferError> {
            let mut j = self.joined.lock().unwrap();
            if role == LinkRole::Sender {
                j.push(*id);
                self.wake.notify_all();
            } else {
                while !j.contains(id) {
                    j = self.wake.wait(j).unwrap();
                }
            }
            Ok(Box::new(Scripted(Default::default(), Arc::new(AtomicBool::new(false)))))
        }
    }

    /// A prefill worker that refuses every device link.
    #[derive(Clone, Default)]
    struct Refuser(Arc<std::sync::atomic::AtomicUsize>);

    #[tonic::async_trait]
    impl pb::kv_transfer_server::KvTransfer for Refuser {
        async fn endpoint(
            &self,
            _: tonic::Request<pb::EndpointRequest>,
        ) -> Result<tonic::Response<pb::TransferEndpoint>, tonic::Status> {
            Err(tonic::Status::unimplemented("no"))
        }
        async fn join_link(
            &self,
            _: tonic::Request<pb::JoinLinkRequest>,
        ) -> Result<tonic::Response<pb::JoinLinkResponse>, tonic::Status> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(tonic::Status::failed_precondition("this prefill worker has no device transport"))
        }
    }

    #[tokio::test]
    async fn a_prefill_worker_that_will_not_join_gets_its_pages_over_tcp() {
        let refuser = Refuser::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let routes = tonic::service::Routes::new(pb::kv_transfer_server::KvTransferServer::new(
            refuser.clone(),
        ))
        .into_axum_router();
        tokio::spawn(async move { axum::serve(listener, routes).await });
        let device = Arc::new(Rendezvous::default());
        let layout = KvLayout {
            model_id: "m".into(),
            dtype: tandem_kv_transfer::KvDtype::F32,
            block_size: 16,
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 4,
            hash_seed: 0,
        };
        let links = DeviceLinks::new(device.clone(), layout, Duration::from_secs(2));
        let (clients, transfers) = (PrefillClients::default(), Transfers::default());
        let got =
            tokio::time::timeout(Duration::from_secs(10), links.get(&addr, &clients, &transfers))
                .await
                .expect("no hang");
        assert!(matches!(got, Ok(None)), "TCP instead");
        assert_eq!(refuser.0.load(Ordering::SeqCst), 1);
        // Asked once, not on every request.
        assert!(matches!(links.get(&addr, &clients, &transfers).await, Ok(None)));
        assert_eq!(refuser.0.load(Ordering::SeqCst), 1);
        // The abandoned end was released: the sender side joined with its id in the background.
        for _ in 0..1000 {
            if device.joined.lock().unwrap().contains(&[3; 128]) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the abandoned receiving end was never released");
    }
}
