//! Choosing the workers for a request.
//!
//! Policies: `kv` (default) scores every healthy worker with [`crate::cost`] using the prefix it
//! already caches — from the exact [`KvIndex`] while KV events flow from Redis, otherwise from
//! the [`ApproxIndex`] of this router's own decisions — and the load every router put on it;
//! `round-robin` and `least-loaded` ignore the cache. Each decision is kept for
//! `GET /debug/routing` and counted in Prometheus.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram};
use serde_json::{json, Value};
use tandem_engine::scheduling::block_hash::{salt_digest, BlockHash, DEFAULT_HASH_SEED};

use crate::cost::{self, Candidate, CostConfig};
use crate::kv_index::{ApproxIndex, KvIndex, Matches, PrefixIndex};
use crate::load::{LoadBook, LoadTicket};
use crate::workers::{Worker, WorkerPool};

/// How workers are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Cached prefix against load (the cost function).
    Kv,
    /// In turn.
    RoundRobin,
    /// Least booked load.
    LeastLoaded,
}

/// Routing settings.
#[derive(Debug, Clone)]
pub struct RoutingConfig {
    /// The policy.
    pub policy: Policy,
    /// Cost weights and margin.
    pub cost: CostConfig,
    /// How long the approximate index remembers a decision.
    pub approx_ttl: Duration,
    /// Most blocks the approximate index holds.
    pub approx_max_blocks: usize,
    /// Tokens per block until a worker reports its own.
    pub default_block_size: usize,
    /// Conditional disaggregation: while every prefill worker has more prompt tokens than this
    /// queued (booked by all routers), a prompt is prefilled on its decode worker instead of
    /// waiting in that queue.
    pub max_prefill_queue_tokens: f64,
}

/// Default of [`RoutingConfig::max_prefill_queue_tokens`]: a few seconds of prefill on a CPU.
pub const MAX_PREFILL_QUEUE_TOKENS: f64 = 2048.0;

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            policy: Policy::Kv,
            cost: CostConfig::default(),
            approx_ttl: Duration::from_secs(120),
            approx_max_blocks: 1 << 20,
            default_block_size: 16,
            max_prefill_queue_tokens: MAX_PREFILL_QUEUE_TOKENS,
        }
    }
}

/// Where a request goes.
pub struct Route {
    /// The decode worker.
    pub decode: Arc<Worker>,
    /// The prefill worker, if any.
    pub prefill: Option<Arc<Worker>>,
    /// The load this request put on them.
    pub ticket: LoadTicket,
}

/// Decisions kept for `/debug/routing`.
const KEEP_DECISIONS: usize = 64;

/// The router's routing state.
pub struct Routing {
    /// Settings.
    pub cfg: RoutingConfig,
    /// Exact index from KV events.
    pub exact: Mutex<KvIndex>,
    /// Approximate index from this router's decisions.
    pub approx: Mutex<ApproxIndex>,
    /// Whether the exact index is fed (Redis reachable, events flowing).
    pub exact_live: AtomicBool,
    /// Booked load, shared with other replicas.
    pub load: Arc<LoadBook>,
    decisions: Mutex<VecDeque<Value>>,
    rr: AtomicU64,
    rng: AtomicU64,
}

fn next_rand(state: &AtomicU64) -> f64 {
    // SplitMix64 over an atomic counter: cheap, lock-free, good enough to break ties.
    let mut z = state
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl Routing {
    /// Routing state with `cfg`.
    pub fn new(cfg: RoutingConfig) -> Routing {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7);
        Routing {
            approx: Mutex::new(ApproxIndex::new(cfg.approx_ttl, cfg.approx_max_blocks)),
            cfg,
            exact: Mutex::new(KvIndex::default()),
            exact_live: AtomicBool::new(false),
            load: Arc::new(LoadBook::default()),
            decisions: Mutex::new(VecDeque::new()),
            rr: AtomicU64::new(0),
            rng: AtomicU64::new(seed),
        }
    }

    /// Leading blocks of `hashes` each worker of `workers` caches, keyed by address.
    fn matches(&self, hashes: &[u64], workers: &[Arc<Worker>]) -> (Matches, &'static str) {
        if self.exact_live.load(Ordering::Relaxed) {
            let by_id = self.exact.lock().expect("index lock").match_blocks(hashes);
            let m = workers
                .iter()
                .filter_map(|w| by_id.get(&w.worker_id()).map(|&n| (w.addr.clone(), n)))
                .collect();
            (m, "exact")
        } else {
            (self.approx.lock().expect("index lock").match_blocks(hashes), "approximate")
        }
    }

    fn choose(
        &self,
        workers: &[Arc<Worker>],
        exclude: &[String],
        matches: &Matches,
        prompt: usize,
        bs: usize,
    ) -> (Option<Arc<Worker>>, Vec<Candidate>) {
        // A worker known to be unhealthy is skipped at once (its status check runs every second,
        // so one that recovers is back within a second).
        let pool: Vec<(usize, &Arc<Worker>)> = workers
            .iter()
            .enumerate()
            .filter(|(_, w)| w.healthy() && !exclude.contains(&w.addr))
            .collect();
        if pool.is_empty() {
            return (None, Vec::new());
        }
        let cands: Vec<Candidate> = pool
            .iter()
            .map(|(i, w)| {
                let l = self.load.get(&w.addr);
                let cached = matches.get(&w.addr).copied().unwrap_or(0) * bs;
                let cost = cost::cost(
                    &self.cfg.cost,
                    bs,
                    prompt,
                    cached,
                    l.prefill_tokens,
                    l.decode_blocks,
                );
                Candidate {
                    index: *i,
                    cached_tokens: cached,
                    queued_prefill_tokens: l.prefill_tokens,
                    active_decode_blocks: l.decode_blocks,
                    cost,
                }
            })
            .collect();
        let index = match self.cfg.policy {
            Policy::Kv => cost::pick(&self.cfg.cost, &cands, next_rand(&self.rng)).map(|c| c.index),
            Policy::RoundRobin => {
                Some(cands[(self.rr.fetch_add(1, Ordering::Relaxed) as usize) % cands.len()].index)
            }
            Policy::LeastLoaded => cands
                .iter()
                .min_by(|a, b| {
                    (a.queued_prefill_tokens / bs as f64 + a.active_decode_blocks)
                        .total_cmp(&(b.queued_prefill_tokens / bs as f64 + b.active_decode_blocks))
                })
                .map(|c| c.index),
        };
        (index.map(|i| workers[i].clone()), cands)
    }

    /// Chooses the decode worker (not one of `exclude`) and, when the pool has prefill workers,
    /// the prefill worker for a prompt (`prefill_hint`, an endpoint picker's choice, when it
    /// names one of them that is healthy); books the load.
    pub fn route(
        &self,
        pool: &WorkerPool,
        request_id: &str,
        prompt: &[u32],
        cache_salt: &str,
        exclude: &[String],
        prefill_hint: Option<&str>,
    ) -> Option<Route> {
        let bs = pool.block_size(self.cfg.default_block_size);
        let salt = if cache_salt.is_empty() { 0 } else { salt_digest(cache_salt) };
        // The last prompt token is always computed, so only blocks before it can be reused.
        let usable = prompt.len().saturating_sub(1) / bs * bs;
        let hashes: Vec<u64> = BlockHash::chain(DEFAULT_HASH_SEED, &prompt[..usable], bs, salt)
            .into_iter()
            .map(|h| h.0)
            .collect();
        let all: Vec<Arc<Worker>> = pool.all().cloned().collect();
        let (matches, mode) = self.matches(&hashes, &all);
        let (decode, d_cands) = self.choose(&pool.decode, exclude, &matches, prompt.len(), bs);
        let decode = decode?;
        let saturated: Vec<String> = pool
            .prefill
            .iter()
            .filter(|w| self.load.get(&w.addr).prefill_tokens > self.cfg.max_prefill_queue_tokens)
            .map(|w| w.addr.clone())
            .collect();
        // Only a known worker: a client cannot make the workers call an address of its own.
        let hinted = prefill_hint
            .and_then(|h| pool.prefill.iter().find(|w| w.addr == h && w.healthy()))
            .cloned();
        let (prefill, p_cands) = if hinted.is_some() {
            (hinted, Vec::new())
        } else if pool.prefill.is_empty() {
            (None, Vec::new())
        } else {
            self.choose(&pool.prefill, &saturated, &matches, prompt.len(), bs)
        };
        let prefill = prefill.filter(|p| p.healthy());
        if prefill.is_none() && !saturated.is_empty() {
            counter!("tandem_router_prefill_skipped_total", "reason" => "queue_full").increment(1);
        }
        // Book: uncached prompt tokens where the prompt is computed, blocks where it decodes.
        let computing = prefill.as_ref().unwrap_or(&decode);
        let cached = matches.get(&computing.addr).copied().unwrap_or(0) * bs;
        let uncached = prompt.len().saturating_sub(cached) as f64;
        let blocks = prompt.len().div_ceil(bs) as f64 + 1.0;
        let ticket = self.load.book(&computing.addr, uncached, &decode.addr, blocks);
        {
            let now = Instant::now();
            let mut approx = self.approx.lock().expect("index lock");
            approx.insert(&computing.addr, &hashes, now);
            if prefill.is_some() {
                approx.insert(&decode.addr, &hashes, now);
            }
        }
        histogram!("tandem_router_prefix_match_blocks").record((cached / bs) as f64);
        counter!("tandem_router_routed_total", "mode" => mode).increment(1);
        let desc = |cands: &[Candidate], workers: &[Arc<Worker>], chosen: &Arc<Worker>| -> Value {
            json!({
                "chosen": chosen.addr,
                "candidates": cands.iter().map(|c| json!({
                    "worker": workers[c.index].addr, "worker_id": workers[c.index].worker_id(), "cached_blocks": c.cached_tokens / bs,
                    "queued_prefill_tokens": c.queued_prefill_tokens, "active_decode_blocks": c.active_decode_blocks, "cost": c.cost,
                })).collect::<Vec<_>>(),
            })
        };
        let record = json!({
            "request_id": request_id,
            "time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
            "index": mode,
            "prompt_tokens": prompt.len(),
            "prompt_blocks": hashes.len(),
            "matched_blocks": cached / bs,
            "decode": desc(&d_cands, &pool.decode, &decode),
            "prefill": prefill.as_ref().map(|p| desc(&p_cands, &pool.prefill, p)),
        });
        tracing::debug!(request_id, index = mode, matched_blocks = cached / bs, prompt_blocks = hashes.len(), decode = %decode.addr, prefill = ?prefill.as_ref().map(|p| &p.addr), "routed");
        {
            let mut d = self.decisions.lock().expect("decisions lock");
            if d.len() == KEEP_DECISIONS {
                d.pop_front();
            }
            d.push_back(record);
        }
        Some(Route { decode, prefill, ticket })
    }

    /// Chooses a decode worker for a model loaded after start-up among those whose status lists
    /// it ready (not one of `exclude`), by load alone: such a model is prefilled on its decode
    /// worker, and the prefix indexes hold the start-up model's blocks. Books the load.
    pub fn route_model(
        &self,
        pool: &WorkerPool,
        request_id: &str,
        prompt_len: usize,
        model: &str,
        exclude: &[String],
    ) -> Option<Route> {
        let bs = pool.block_size(self.cfg.default_block_size);
        let serving: Vec<Arc<Worker>> =
            pool.decode.iter().filter(|w| w.serves(model)).cloned().collect();
        let (decode, _) = self.choose(&serving, exclude, &Matches::default(), prompt_len, bs);
        let decode = decode?;
        let blocks = prompt_len.div_ceil(bs) as f64 + 1.0;
        let ticket = self.load.book(&decode.addr, prompt_len as f64, &decode.addr, blocks);
        counter!("tandem_router_routed_total", "mode" => "model").increment(1);
        tracing::info!(request_id, model, decode = %decode.addr, "routed");
        let record = json!({
            "request_id": request_id,
            "time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
            "index": "none",
            "model": model,
            "prompt_tokens": prompt_len,
            "decode": { "chosen": decode.addr, "serving": serving.iter().map(|w| w.addr.clone()).collect::<Vec<_>>() },
            "prefill": Value::Null,
        });
        {
            let mut d = self.decisions.lock().expect("decisions lock");
            if d.len() == KEEP_DECISIONS {
                d.pop_front();
            }
            d.push_back(record);
        }
        Some(Route { decode, prefill: None, ticket })
    }

    /// Updates the index and load gauges.
    pub fn publish_gauges(&self, pool: &WorkerPool) {
        gauge!("tandem_router_index_blocks", "index" => "exact")
            .set(self.exact.lock().expect("index lock").len() as f64);
        gauge!("tandem_router_index_blocks", "index" => "approximate")
            .set(self.approx.lock().expect("index lock").len() as f64);
        gauge!("tandem_router_exact_index_live").set(if self.exact_live.load(Ordering::Relaxed) {
            1.0
        } else {
            0.0
        });
        for w in pool.all() {
            let l = self.load.get(&w.addr);
            gauge!("tandem_router_worker_queued_prefill_tokens", "target" => w.addr.clone())
                .set(l.prefill_tokens);
            gauge!("tandem_router_worker_active_decode_blocks", "target" => w.addr.clone())
                .set(l.decode_blocks);
        }
    }

    /// What `GET /debug/routing` shows: the index, the loads and the last decisions.
    pub fn debug(&self, pool: &WorkerPool) -> Value {
        let exact = self.exact.lock().expect("index lock");
        let workers: Vec<Value> = pool
            .all()
            .map(|w| {
                let id = w.worker_id();
                let l = self.load.get(&w.addr);
                json!({ "address": w.addr, "worker_id": id, "healthy": w.healthy(), "indexed_blocks": exact.worker_blocks(&id), "queued_prefill_tokens": l.prefill_tokens, "active_decode_blocks": l.decode_blocks })
            })
            .collect();
        let index: Vec<Value> = exact.workers().into_iter().map(|(id, epoch, seq, n)| json!({ "worker_id": id, "epoch": epoch, "last_seq": seq, "blocks": n })).collect();
        json!({
            "policy": format!("{:?}", self.cfg.policy),
            "index": if self.exact_live.load(Ordering::Relaxed) { "exact" } else { "approximate" },
            "exact_blocks": exact.len(),
            "approximate_blocks": self.approx.lock().expect("index lock").len(),
            "exact_workers": index,
            "workers": workers,
            "decisions": self.decisions.lock().expect("decisions lock").iter().cloned().collect::<Vec<_>>(),
        })
    }

    /// Forgets a worker that stopped answering.
    pub fn forget(&self, w: &Worker) {
        let id = w.worker_id();
        if !id.is_empty() {
            self.exact.lock().expect("index lock").remove_worker(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_saturated_prefill_worker_is_skipped_until_its_queue_drains() {
        let pool = WorkerPool::new(&["127.0.0.1:7001".into()], &["127.0.0.1:7002".into()]).unwrap();
        let r =
            Routing::new(RoutingConfig { max_prefill_queue_tokens: 1500.0, ..Default::default() });
        let prompt = |i: u32| -> Vec<u32> { (0..1000).map(|j| i * 7919 + j).collect() };
        let first = r.route(&pool, "a", &prompt(1), "", &[], None).unwrap();
        let second = r.route(&pool, "b", &prompt(2), "", &[], None).unwrap();
        assert!(
            first.prefill.is_some() && second.prefill.is_some(),
            "room in the queue: remote prefill"
        );
        // 2000 tokens queued > 1500: the next prompt is prefilled where it decodes.
        let mut third = r.route(&pool, "c", &prompt(3), "", &[], None).unwrap();
        assert!(third.prefill.is_none(), "queue full: local prefill");
        assert_eq!(
            r.load.get("127.0.0.1:7001").prefill_tokens,
            1000.0,
            "booked on the decode worker"
        );
        third.ticket.first_token();
        // Once the queued prompts have their first tokens, remote prefill resumes.
        let (mut first, mut second) = (first, second);
        first.ticket.first_token();
        second.ticket.first_token();
        assert!(r.route(&pool, "d", &prompt(4), "", &[], None).unwrap().prefill.is_some());
    }

    #[tokio::test]
    async fn a_named_prefill_worker_is_used_and_booked_only_when_known() {
        let prefill = ["127.0.0.1:7102".to_string(), "127.0.0.1:7103".to_string()];
        let pool = WorkerPool::new(&["127.0.0.1:7101".into()], &prefill).unwrap();
        let r = Routing::new(RoutingConfig::default());
        let prompt: Vec<u32> = (0..640).collect();
        for named in &prefill {
            let route = r.route(&pool, "a", &prompt, "", &[], Some(named)).unwrap();
            assert_eq!(route.prefill.as_ref().unwrap().addr, *named);
            assert_eq!(r.load.get(named).prefill_tokens, 640.0, "booked where it is computed");
        }
        // An address the router does not know is not used: the router chooses.
        let route = r.route(&pool, "b", &prompt, "", &[], Some("10.1.1.1:1")).unwrap();
        assert!(prefill.contains(&route.prefill.unwrap().addr));
    }
}
