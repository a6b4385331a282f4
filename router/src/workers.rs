//! The workers a router sends requests to: their gRPC channels, health and load.
//!
//! Decode workers are chosen by fewest requests in flight from this router (ties broken round
//! robin), skipping workers whose last status check failed; prefill workers the same way.
//! Prefix-aware routing replaces this choice in a later stage.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
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
    inflight: AtomicUsize,
    healthy: AtomicBool,
    max_model_len: AtomicU32,
}

impl Worker {
    fn new(addr: &str) -> anyhow::Result<Worker> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(1))
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .connect_lazy();
        Ok(Worker { addr: addr.to_string(), channel, inflight: AtomicUsize::new(0), healthy: AtomicBool::new(true), max_model_len: AtomicU32::new(0) })
    }

    /// Requests this router has in flight on the worker.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
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
        let mut client = WorkerClient::new(self.channel.clone());
        let mut req = tonic::Request::new(pb::StatusRequest { include_block_hashes: false });
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
        }
        res
    }

    /// Marks the worker failed until its next successful status check.
    pub fn mark_failed(&self) {
        self.healthy.store(false, Ordering::Relaxed);
    }
}

/// Counts a request in flight on a worker until dropped.
pub struct InflightGuard(Arc<Worker>);

impl InflightGuard {
    /// The worker.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.0
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The router's decode and prefill workers.
pub struct WorkerPool {
    /// Decode workers (requests enter here).
    pub decode: Vec<Arc<Worker>>,
    /// Prefill workers (empty: every prompt is prefilled on its decode worker).
    pub prefill: Vec<Arc<Worker>>,
    rr: AtomicUsize,
}

fn pick(workers: &[Arc<Worker>], rr: usize) -> Option<Arc<Worker>> {
    let healthy: Vec<&Arc<Worker>> = workers.iter().filter(|w| w.healthy()).collect();
    let pool = if healthy.is_empty() { workers.iter().collect() } else { healthy };
    let n = pool.len();
    (0..n).map(|i| pool[(rr + i) % n]).min_by_key(|w| w.inflight()).cloned()
}

impl WorkerPool {
    /// A pool over the given addresses.
    pub fn new(decode: &[String], prefill: &[String]) -> anyhow::Result<WorkerPool> {
        let mk = |v: &[String]| v.iter().map(|a| Worker::new(a).map(Arc::new)).collect::<anyhow::Result<Vec<_>>>();
        Ok(WorkerPool { decode: mk(decode)?, prefill: mk(prefill)?, rr: AtomicUsize::new(0) })
    }

    /// Picks a decode worker and (when there are any) a prefill worker for one request.
    pub fn route(&self) -> Option<(InflightGuard, Option<Arc<Worker>>)> {
        let rr = self.rr.fetch_add(1, Ordering::Relaxed);
        let d = pick(&self.decode, rr)?;
        d.inflight.fetch_add(1, Ordering::Relaxed);
        let p = pick(&self.prefill, rr).filter(|p| p.healthy());
        Some((InflightGuard(d), p))
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
