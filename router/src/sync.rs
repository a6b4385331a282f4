//! The router's Redis side: reading the workers' KV events into the exact index, and sharing
//! booked load with the other router replicas. Both loops reconnect by themselves; while Redis
//! is away the router routes with its approximate index and its own load, and no request fails
//! because of it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge};
use redis::streams::{StreamRangeReply, StreamReadReply};
use tandem_worker::kv_events::{decode, EVENTS_STREAM};
use tandem_worker::redis::{RedisConfig, RedisError, RedisManager};

use crate::kv_index::Applied;
use crate::load::Load;
use crate::routing::Routing;
use crate::workers::Workers;

/// What the Redis loops work on: the router's routing state, its workers and its load syncer
/// (the HTTP handlers' state provides them).
pub trait Shared: Send + Sync + 'static {
    /// Indexes and load.
    fn routing(&self) -> &Routing;
    /// The workers.
    fn workers(&self) -> &Workers;
    /// The load syncer, with Redis.
    fn load_sync(&self) -> Option<&LoadSync>;
}

/// Redis hash of every router's booked load: field = router id, value = `{"at": ms, "loads": {…}}`.
const LOAD_KEY: &str = "tandem:load";
/// A replica's entry older than this is ignored (and removed): that router is gone.
const LOAD_TTL_MS: u64 = 2000;

#[derive(serde::Serialize, serde::Deserialize)]
struct LoadEntry {
    at: u64,
    loads: HashMap<String, Load>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Starts both loops.
pub fn spawn<S: Shared>(state: Arc<S>, redis: RedisConfig) {
    tokio::spawn(events_loop(state.clone(), redis));
    tokio::spawn(load_loop(state));
}

/// Replaces the index entries of every worker that needs it with a snapshot from its Status.
async fn resync<S: Shared>(state: &S, all: bool) {
    let wanted = if all {
        state.workers().current().all().map(|w| w.worker_id()).collect::<Vec<_>>()
    } else {
        state.routing().exact.lock().expect("index lock").needing_resync()
    };
    for w in state.workers().current().all() {
        let id = w.worker_id();
        if !(all || wanted.contains(&id)) {
            continue;
        }
        match w.status(Duration::from_secs(2), true).await {
            Ok(s) => {
                state.routing().exact.lock().expect("index lock").resync(
                    &s.worker_id,
                    s.epoch,
                    s.event_seq,
                    &s.cached_block_hashes,
                );
                counter!("tandem_router_index_resyncs_total").increment(1);
                tracing::info!(worker = %s.worker_id, blocks = s.cached_block_hashes.len(), seq = s.event_seq, "index resynchronised from the worker's status");
            }
            Err(e) => {
                tracing::warn!(worker = %w.addr, error = %e, "resync failed; the worker is left out of the index");
                state.routing().forget(w);
            }
        }
    }
}

async fn events_loop<S: Shared>(state: Arc<S>, redis: RedisConfig) {
    let url = redis.redacted();
    loop {
        // Blocking reads wait up to 500 ms on the server: answers come well within 3 s.
        let mut conn = match redis.connect(Duration::from_secs(3)).await {
            Ok(c) => c,
            Err(e) => {
                state.routing().exact_live.store(false, Ordering::Relaxed);
                gauge!("tandem_router_redis_up").set(0.0);
                tracing::debug!(error = %e, "redis unreachable; routing on the approximate index");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        // Start after the newest entry, then take a snapshot: every later event is applied on
        // top of it, every earlier one is already in it (by sequence number).
        let newest = redis::cmd("XREVRANGE")
            .arg(EVENTS_STREAM)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async::<StreamRangeReply>(&mut conn)
            .await;
        let mut last = match newest {
            Ok(r) => r.ids.first().map_or_else(|| "0-0".to_string(), |e| e.id.clone()),
            Err(e) => {
                tracing::warn!(%url, error = %e, "reading the KV event stream failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        resync(&*state, true).await;
        state.routing().exact_live.store(true, Ordering::Relaxed);
        gauge!("tandem_router_redis_up").set(1.0);
        tracing::info!(%url, "reading KV events; routing on the exact index");
        loop {
            let reply = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(1000)
                .arg("BLOCK")
                .arg(500)
                .arg("STREAMS")
                .arg(EVENTS_STREAM)
                .arg(&last)
                .query_async::<Option<StreamReadReply>>(&mut conn)
                .await;
            let reply = match reply {
                Ok(r) => r.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(error = %e, "lost redis; routing on the approximate index until it returns");
                    break;
                }
            };
            for entry in reply.keys.iter().flat_map(|k| &k.ids) {
                last.clone_from(&entry.id);
                let Some(ev) = decode(&entry.map) else { continue };
                let applied = state
                    .routing()
                    .exact
                    .lock()
                    .expect("index lock")
                    .apply(&ev.worker, ev.epoch, ev.seq, &ev.event);
                let kind = match applied {
                    Applied::Ok => "applied",
                    Applied::NewEpoch => "new_epoch",
                    Applied::Stale => "stale",
                    Applied::Gap => "gap",
                };
                counter!("tandem_router_kv_events_total", "result" => kind).increment(1);
                if applied == Applied::NewEpoch {
                    tracing::info!(worker = %ev.worker, epoch = ev.epoch, "worker restarted: its old index entries are purged");
                }
            }
            if !state.routing().exact.lock().expect("index lock").needing_resync().is_empty() {
                resync(&*state, false).await;
            }
            state.routing().publish_gauges(&state.workers().current());
        }
        state.routing().exact_live.store(false, Ordering::Relaxed);
        gauge!("tandem_router_redis_up").set(0.0);
    }
}

/// Exchanges this router's booked load with the other replicas' through Redis, in one round
/// trip: writes its own totals with a timestamp into one hash and reads every replica's entry,
/// ignoring (and removing) entries older than 2 s, so a dead replica's load vanishes. Called
/// before every routing decision, by the load loop when a booking or release changes the
/// load, and every 250 ms.
pub struct LoadSync {
    conn: Result<RedisManager, String>,
    field: String,
}

impl LoadSync {
    /// A syncer for router `router_id`.
    pub fn new(redis: RedisConfig, router_id: &str) -> LoadSync {
        let conn = redis.manager(Duration::from_millis(500)).map_err(|e| e.to_string());
        LoadSync { conn, field: router_id.to_string() }
    }

    /// One exchange, bounded by `timeout`; on failure the other replicas' load is taken as
    /// unknown (zero) until the next success.
    pub async fn exchange(&self, routing: &Routing, timeout: Duration) {
        let mut c = match &self.conn {
            Ok(c) => c.clone(),
            Err(e) => {
                tracing::debug!(error = %e, "sharing load through redis is off");
                return;
            }
        };
        let fut = async {
            let c = &mut c;
            let now = now_ms();
            let mine = serde_json::to_vec(&LoadEntry { at: now, loads: routing.load.local() })
                .unwrap_or_default();
            let (all,): (HashMap<String, Vec<u8>>,) = redis::pipe()
                .cmd("HSET")
                .arg(LOAD_KEY)
                .arg(&self.field)
                .arg(mine)
                .ignore()
                .cmd("HGETALL")
                .arg(LOAD_KEY)
                .query_async(c)
                .await?;
            let mut sum: HashMap<String, Load> = HashMap::new();
            let mut stale: Vec<String> = Vec::new();
            for (field, value) in all {
                if field == self.field {
                    continue;
                }
                match serde_json::from_slice::<LoadEntry>(&value) {
                    Ok(e) if now.saturating_sub(e.at) <= LOAD_TTL_MS => {
                        for (w, l) in e.loads {
                            let s = sum.entry(w).or_default();
                            s.prefill_tokens += l.prefill_tokens;
                            s.decode_blocks += l.decode_blocks;
                        }
                    }
                    _ => stale.push(field),
                }
            }
            if !stale.is_empty() {
                redis::cmd("HDEL").arg(LOAD_KEY).arg(&stale).query_async::<()>(c).await?;
            }
            Ok::<_, RedisError>(sum)
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(sum)) => routing.load.set_remote(sum),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "sharing load through redis failed");
                routing.load.set_remote(HashMap::new());
            }
            Err(_) => routing.load.set_remote(HashMap::new()),
        }
    }
}

async fn load_loop<S: Shared>(state: Arc<S>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        // Every 250 ms, and at once when a booking or a release changes this router's load.
        tokio::select! {
            _ = tick.tick() => {}
            _ = state.routing().load.changed.notified() => {}
        }
        if let Some(sync) = state.load_sync() {
            sync.exchange(state.routing(), Duration::from_millis(500)).await;
        }
    }
}
