//! The workers a router sends requests to: their gRPC channels, health and load.
//!
//! Which worker takes a request is decided in [`crate::routing`]; this module knows the
//! workers: their channels and what their status checks said (health, id, block size, context
//! length).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tandem_proto::v1 as pb;
use tandem_proto::v1::decode_worker_client::DecodeWorkerClient;
use tandem_proto::v1::worker_client::WorkerClient;
use tandem_worker::auth::{authed, AuthChannel};
use tonic::transport::{Channel, Endpoint};

/// Status checks in a row a worker may leave unanswered (each bounded by its timeout) before
/// it counts as unhealthy.
pub const MISSED_CHECKS: u32 = 3;

/// One worker as the router sees it.
pub struct Worker {
    /// "host:port" of its gRPC listener.
    pub addr: String,
    channel: Channel,
    healthy: AtomicBool,
    /// Status checks in a row that got no answer in time.
    missed: AtomicU32,
    max_model_len: AtomicU32,
    block_size: AtomicU32,
    waiting: AtomicU32,
    worker_id: Mutex<String>,
    models: Mutex<Vec<pb::ModelState>>,
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
            missed: AtomicU32::new(0),
            max_model_len: AtomicU32::new(0),
            block_size: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            worker_id: Mutex::new(String::new()),
            models: Mutex::new(Vec::new()),
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

    /// Sequences waiting on the worker's engine at its last status check.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Whether its last status check succeeded.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// A decode client on the worker's channel.
    pub fn decode_client(&self) -> DecodeWorkerClient<AuthChannel> {
        DecodeWorkerClient::new(authed(self.channel.clone()))
    }

    /// Asks the worker for its status (bounded by `timeout`) and records its health.
    pub async fn check(&self, timeout: Duration) -> Result<pb::WorkerStatus, String> {
        self.status(timeout, false).await
    }

    /// Asks the worker for its status, with every cached block hash when `hashes`.
    pub async fn status(
        &self,
        timeout: Duration,
        hashes: bool,
    ) -> Result<pb::WorkerStatus, String> {
        let mut client = WorkerClient::new(authed(self.channel.clone()));
        let mut req = tonic::Request::new(pb::StatusRequest { include_block_hashes: hashes });
        req.set_timeout(timeout);
        let answer = tokio::time::timeout(timeout, client.status(req)).await;
        // tonic reports its own deadline (the request's timeout) as Cancelled.
        let late = answer.is_err()
            || matches!(&answer, Ok(Err(e)) if matches!(e.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled));
        let res = match answer {
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
        // A refused connection or an unhealthy report takes the worker out at once. A late
        // answer alone does not until MISSED_CHECKS in a row: under a burst of load the status
        // answer can queue behind the streams' frames on the same connection, and one slow
        // check must not turn every new request away (with one worker: every request).
        let missed = if late { self.missed.fetch_add(1, Ordering::Relaxed) + 1 } else { 0 };
        if !late {
            self.missed.store(0, Ordering::Relaxed);
        }
        let healthy = match &res {
            Ok(_) => true,
            Err(_) if late && missed < MISSED_CHECKS => self.healthy(),
            Err(_) => false,
        };
        self.healthy.store(healthy, Ordering::Relaxed);
        if let Ok(s) = &res {
            self.max_model_len.store(s.max_model_len, Ordering::Relaxed);
            self.block_size.store(s.block_size, Ordering::Relaxed);
            self.waiting.store(s.waiting, Ordering::Relaxed);
            *self.worker_id.lock().expect("worker id lock") = s.worker_id.clone();
            *self.models.lock().expect("worker models lock") = s.models.clone();
        }
        res
    }

    /// The state of a model the worker loaded after start-up, as its last status said.
    pub fn model(&self, name: &str) -> Option<pb::ModelState> {
        self.models.lock().expect("worker models lock").iter().find(|m| m.model == name).cloned()
    }

    /// The models the worker loaded after start-up, as its last status said.
    pub fn models(&self) -> Vec<pb::ModelState> {
        self.models.lock().expect("worker models lock").clone()
    }

    /// Whether the worker is healthy and its last status listed `name` ready.
    pub fn serves(&self, name: &str) -> bool {
        self.healthy() && self.model(name).is_some_and(|m| m.state == "ready")
    }

    /// Asks the worker to load model `name` from its model directory, with a KV cache of
    /// `kv_cache_bytes` (none: the worker's flags); it answers at once.
    pub async fn load_model(
        &self,
        name: &str,
        kv_cache_bytes: Option<u64>,
    ) -> Result<pb::ModelState, tonic::Status> {
        let mut client = WorkerClient::new(authed(self.channel.clone()));
        let mut req =
            tonic::Request::new(pb::LoadModelRequest { model: name.to_string(), kv_cache_bytes });
        req.set_timeout(Duration::from_secs(10));
        client.load_model(req).await.map(tonic::Response::into_inner)
    }

    /// Asks the worker to unload model `name` (it answers at once and drains in the
    /// background).
    pub async fn unload_model(&self, name: &str) -> Result<pb::ModelState, tonic::Status> {
        let mut client = WorkerClient::new(authed(self.channel.clone()));
        let mut req = tonic::Request::new(pb::UnloadModelRequest { model: name.to_string() });
        req.set_timeout(Duration::from_secs(10));
        client.unload_model(req).await.map(tonic::Response::into_inner)
    }

    /// Marks the worker failed until its next successful status check.
    pub fn mark_failed(&self) {
        self.healthy.store(false, Ordering::Relaxed);
    }
}

/// The router's decode and prefill workers at one moment.
pub struct WorkerPool {
    /// Decode workers (requests enter here).
    pub decode: Vec<Arc<Worker>>,
    /// Prefill workers (empty: every prompt is prefilled on its decode worker).
    pub prefill: Vec<Arc<Worker>>,
}

impl WorkerPool {
    /// A pool over the given addresses.
    pub fn new(decode: &[String], prefill: &[String]) -> anyhow::Result<WorkerPool> {
        let mk = |v: &[String]| {
            v.iter().map(|a| Worker::new(a).map(Arc::new)).collect::<anyhow::Result<Vec<_>>>()
        };
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
        self.decode
            .iter()
            .filter(|w| w.healthy())
            .map(|w| w.max_model_len.load(Ordering::Relaxed) as usize)
            .filter(|&l| l > 0)
            .min()
            .unwrap_or(0)
    }

    /// Checks every worker once.
    pub async fn check_all(
        &self,
        timeout: Duration,
    ) -> Vec<(String, &'static str, Result<pb::WorkerStatus, String>)> {
        let all = self
            .decode
            .iter()
            .map(|w| (w, "decode"))
            .chain(self.prefill.iter().map(|w| (w, "prefill")));
        let futs =
            all.map(|(w, role)| async move { (w.addr.clone(), role, w.check(timeout).await) });
        futures_util::future::join_all(futs).await
    }
}

/// Where the router's workers come from: fixed addresses, and `dns:host:port` entries (a
/// Kubernetes headless Service) whose addresses are looked up again by [`Workers::refresh`].
/// Workers that stay keep their channel and state; new addresses join; gone ones leave.
pub struct Workers {
    decode_sources: Vec<String>,
    prefill_sources: Vec<String>,
    current: RwLock<Arc<WorkerPool>>,
}

/// The prefix of a worker entry that names a DNS name to look up repeatedly.
pub const DNS_PREFIX: &str = "dns:";

impl Workers {
    /// Workers from the command line's entries (fixed addresses join at once, DNS entries at
    /// the first refresh).
    pub fn new(decode: &[String], prefill: &[String]) -> anyhow::Result<Workers> {
        let fixed = |v: &[String]| {
            v.iter().filter(|a| !a.starts_with(DNS_PREFIX)).cloned().collect::<Vec<_>>()
        };
        let pool = WorkerPool::new(&fixed(decode), &fixed(prefill))?;
        Ok(Workers {
            decode_sources: decode.to_vec(),
            prefill_sources: prefill.to_vec(),
            current: RwLock::new(Arc::new(pool)),
        })
    }

    /// The workers now.
    pub fn current(&self) -> Arc<WorkerPool> {
        self.current.read().expect("workers lock").clone()
    }

    /// Whether any entry is looked up in DNS.
    pub fn dynamic(&self) -> bool {
        self.decode_sources.iter().chain(&self.prefill_sources).any(|s| s.starts_with(DNS_PREFIX))
    }

    /// Looks the DNS entries up again and updates the members; returns the workers that left.
    /// A failed lookup keeps that entry's previous members (a DNS hiccup is not an outage).
    pub async fn refresh(&self) -> Vec<Arc<Worker>> {
        let old = self.current();
        let decode = resolve(&self.decode_sources, &old.decode).await;
        let prefill = resolve(&self.prefill_sources, &old.prefill).await;
        let keep = |want: BTreeSet<String>, have: &[Arc<Worker>]| -> Vec<Arc<Worker>> {
            want.into_iter()
                .filter_map(|addr| match have.iter().find(|w| w.addr == addr) {
                    Some(w) => Some(w.clone()),
                    None => Worker::new(&addr)
                        .map(Arc::new)
                        .map_err(|e| tracing::warn!(%addr, "bad worker address: {e}"))
                        .ok(),
                })
                .collect()
        };
        let next =
            WorkerPool { decode: keep(decode, &old.decode), prefill: keep(prefill, &old.prefill) };
        let gone: Vec<Arc<Worker>> =
            old.all().filter(|w| !next.all().any(|n| n.addr == w.addr)).cloned().collect();
        let joined: Vec<String> = next
            .all()
            .filter(|w| !old.all().any(|o| o.addr == w.addr))
            .map(|w| w.addr.clone())
            .collect();
        if !gone.is_empty() || !joined.is_empty() {
            tracing::info!(joined = ?joined, left = ?gone.iter().map(|w| &w.addr).collect::<Vec<_>>(), "workers changed");
            *self.current.write().expect("workers lock") = Arc::new(next);
        }
        gone
    }
}

/// The addresses `sources` name now; `previous` stands in for an entry whose lookup failed.
async fn resolve(sources: &[String], previous: &[Arc<Worker>]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for s in sources {
        let Some(name) = s.strip_prefix(DNS_PREFIX) else {
            out.insert(s.clone());
            continue;
        };
        let port = name.rsplit_once(':').map(|(_, p)| p).unwrap_or_default();
        match tokio::time::timeout(Duration::from_secs(2), tokio::net::lookup_host(name)).await {
            Ok(Ok(addrs)) => out.extend(addrs.filter(|a| a.is_ipv4()).map(|a| a.to_string())),
            failed => {
                let why = failed.map_or_else(
                    |_| "timed out".to_string(),
                    |r| r.err().map(|e| e.to_string()).unwrap_or_default(),
                );
                tracing::warn!(%name, "worker lookup failed ({why}); keeping its previous members");
                out.extend(
                    previous
                        .iter()
                        .filter(|w| w.addr.ends_with(&format!(":{port}")))
                        .map(|w| w.addr.clone()),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dns_entries_follow_the_lookup_and_fixed_ones_stay() {
        let w = Workers::new(
            &["dns:localhost:50061".into(), "10.0.0.9:50061".into()],
            &["dns:localhost:50051".into()],
        )
        .unwrap();
        assert!(w.dynamic());
        assert_eq!(w.current().decode.len(), 1, "fixed addresses join at once");
        let gone = w.refresh().await;
        assert!(gone.is_empty());
        let now = w.current();
        let decode: Vec<&str> = now.decode.iter().map(|w| w.addr.as_str()).collect();
        assert_eq!(decode, ["10.0.0.9:50061", "127.0.0.1:50061"]);
        assert_eq!(now.prefill[0].addr, "127.0.0.1:50051");
        // Unchanged lookup: the same worker objects (channels, health) are kept.
        let before = now.decode[1].clone();
        w.refresh().await;
        assert!(Arc::ptr_eq(&before, &w.current().decode[1]));
        assert!(!Workers::new(&["127.0.0.1:1".into()], &[]).unwrap().dynamic());
    }

    /// A worker whose status answers come late stays in service until MISSED_CHECKS checks
    /// in a row went unanswered; one that refuses connections is out at the first check.
    #[tokio::test]
    async fn late_status_answers_take_a_worker_out_only_after_several_in_a_row() {
        // Accepts connections and never speaks HTTP/2: every check runs into its timeout.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let w = Worker::new(&addr).unwrap();
        for i in 1..MISSED_CHECKS {
            let err = w.check(Duration::from_millis(100)).await.unwrap_err();
            assert!(w.healthy(), "still healthy after {i} late answer(s): {err}");
        }
        assert!(w.check(Duration::from_millis(100)).await.is_err());
        assert!(!w.healthy(), "out after {MISSED_CHECKS} late answers in a row");

        // Nothing listens: refused at once.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let gone = Worker::new(&format!("127.0.0.1:{port}")).unwrap();
        assert!(gone.healthy());
        assert!(gone.check(Duration::from_millis(500)).await.is_err());
        assert!(!gone.healthy(), "a refused connection takes the worker out at once");
    }
}
