//! `DecodeService`: the decode worker's state shared by its gRPC handlers and its remote
//! prefill tasks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tandem_worker::EngineHandle;

use crate::clients::PrefillClients;
use crate::links::DeviceLinks;
use crate::transfers::Transfers;
use crate::DecodeConfig;

/// The decode service (cheap to clone: its state is shared).
#[derive(Clone)]
pub struct DecodeService(Arc<Shared>);

impl std::ops::Deref for DecodeService {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// State shared by the decode service's handlers.
pub struct Shared {
    pub(crate) engine: EngineHandle,
    pub(crate) cfg: DecodeConfig,
    pub(crate) transfers: Transfers,
    pub(crate) kv_addr: String,
    pub(crate) clients: PrefillClients,
    pub(crate) links: Option<Arc<DeviceLinks>>,
    next_transfer: AtomicU64,
    /// Hands the engine thread's outputs to the streams, started by the first request (on the
    /// runtime that serves it).
    courier: std::sync::OnceLock<tandem_worker::outbox::Courier>,
}

impl DecodeService {
    /// The service over `engine`, receiving KV pages at `kv_addr` (TCP) or over `links`.
    pub fn new(
        engine: EngineHandle,
        cfg: DecodeConfig,
        transfers: Transfers,
        kv_addr: String,
        links: Option<Arc<DeviceLinks>>,
    ) -> DecodeService {
        let seed = tandem_worker::status::new_epoch() & 0xFFFF_FFFF;
        DecodeService(Arc::new(Shared {
            engine,
            cfg,
            transfers,
            kv_addr,
            clients: PrefillClients::default(),
            links,
            next_transfer: AtomicU64::new(seed << 32),
            courier: std::sync::OnceLock::new(),
        }))
    }

    /// The courier of the engine's outputs (started on the calling runtime the first time).
    pub(crate) fn courier(&self) -> tandem_worker::outbox::Courier {
        self.courier.get_or_init(tandem_worker::outbox::Courier::spawn).clone()
    }

    pub(crate) fn next_transfer_id(&self) -> u64 {
        self.next_transfer.fetch_add(1, Ordering::Relaxed)
    }
}
