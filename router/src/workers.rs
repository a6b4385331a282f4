//! The workers a router sends requests to: their gRPC channels, health and load.
//!
//! Which worker takes a request is decided in [`crate::routing`]; this module knows the
//! workers: their channels and what their status checks said (health, id, block size, context
//! length).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem_proto::v1 as pb;
use tandem_proto::v1::decode_worker_client::DecodeWorkerClient;
use tandem_proto::v1::worker_client::WorkerClient;
use tonic::transport::{Channel, Endpoint};

/// One worker as the router sees it.
pub struct Worker {
    /// "host:port" of its gRPC listener.
    pub addr: String,
    channel: Channel,
    healthy: AtomicBool,
    max_model_len: AtomicU32,
    block_size: AtomicU32,
    worker_id: Mutex<String>,
}

impl Worker {
    fn new(addr: &str) -> anyhow::Result<Worker> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(1))
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .connect_lazy();
        Ok(Worker {
            addr: addr.to_string(),
            channel,
            healthy: AtomicBool::new(true),
            max_model_len: AtomicU32::new(0),
            block_size: AtomicU32::new(0),
            worker_id: Mutex::new(String::new()),
        })
    }

    /// The worker's id, as its status reported it (empty until the first check).
    pub fn worker_id(&self) -> String {
        self.worker_id.lock().expect("worker id lock").clone()
    }

    /// Tokens per KV block the worker reported (0 until the first check).
    pub fn block_size(&self) -> usize {
        self.block_size.load(Ordering::Relaxed) as usize
    }

    /// Whether its last status check succeeded.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// A decode client on the worker's channel.
    pub fn decode_client(&self) -> DecodeWorkerClient<Channel> {
        DecodeWorkerClient::new(self.channel.clone())
    }

    /// Asks the worker for its status (bounded by `timeout`) and records its health.
    pub async fn check(&self, timeout: Duration) -> Result<pb::WorkerStatus, String> {
        self.status(timeout, false).await
    }

    /// Asks the worker for its status, with every cached block hash when `hashes`.
    pub async fn status(&self, timeout: Duration, hashes: bool) -> Result<pb::WorkerStatus, String> {
        let mut client = WorkerClient::new(self.channel.clone());
        let mut req = tonic::Request::new(pb::StatusRequest { include_block_hashes: hashes });
        req.set_timeout(timeout);
        let res = match tokio::time::timeout(timeout, client.status(req)).await {
            Ok(Ok(r)) => {
                let s = r.into_inner();
                if s.healthy {
                    Ok(s)
                } else {
                    Err(format!("worker {} reports its engine unhealthy", self.addr))
                }
            }
            Ok(Err(e)) => Err(format!("worker {}: {}", self.addr, e.message())),
            Err(_) => Err(format!("worker {} did not answer within {timeout:?}", self.addr)),
        };
        self.healthy.store(res.is_ok(), Ordering::Relaxed);
        if let Ok(s) = &res {
            self.max_model_len.store(s.max_model_len, Ordering::Relaxed);
            self.block_size.store(s.block_size, Ordering::Relaxed);
            *self.worker_id.lock().expect("worker id lock") = s.worker_id.clone();
        }
        res
    }

    /// Marks the worker failed until its next successful status check.
    pub fn mark_failed(&self) {
        self.healthy.store(false, Ordering::Relaxed);
    }
}

/// The router's decode and prefill workers.
pub struct WorkerPool {
    /// Decode workers (requests enter here).
    pub decode: Vec<Arc<Worker>>,
    /// Prefill workers (empty: every prompt is prefilled on its decode worker).
    pub prefill: Vec<Arc<Worker>>,
}

impl WorkerPool {
    /// A pool over the given addresses.
    pub fn new(decode: &[String], prefill: &[String]) -> anyhow::Result<WorkerPool> {
        let mk = |v: &[String]| v.iter().map(|a| Worker::new(a).map(Arc::new)).collect::<anyhow::Result<Vec<_>>>();
        Ok(WorkerPool { decode: mk(decode)?, prefill: mk(prefill)? })
    }

    /// Every worker, decode first.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Worker>> {
        self.decode.iter().chain(self.prefill.iter())
    }

    /// The block size the workers use (the first one reported), or `default`.
    pub fn block_size(&self, default: usize) -> usize {
        self.all().map(|w| w.block_size()).find(|&b| b > 0).unwrap_or(default)
    }

    /// The smallest context length a healthy decode worker reported (0: none known yet).
    pub fn max_model_len(&self) -> usize {
        self.decode.iter().filter(|w| w.healthy()).map(|w| w.max_model_len.load(Ordering::Relaxed) as usize).filter(|&l| l > 0).min().unwrap_or(0)
    }

    /// Checks every worker once.
    pub async fn check_all(&self, timeout: Duration) -> Vec<(String, &'static str, Result<pb::WorkerStatus, String>)> {
        let all = self.decode.iter().map(|w| (w, "decode")).chain(self.prefill.iter().map(|w| (w, "prefill")));
        let futs = all.map(|(w, role)| async move { (w.addr.clone(), role, w.check(timeout).await) });
        futures_util::future::join_all(futs).await
    }
}
