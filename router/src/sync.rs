//! The router's Redis side: reading the workers' KV events into the exact index, and sharing
//! booked load with the other router replicas. Both loops reconnect by themselves; while Redis
//! is away the router routes with its approximate index and its own load, and no request fails
//! because of it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge};
use tandem_worker::kv_events::{decode, EVENTS_STREAM};
use tandem_worker::redis::{RedisConn, Reply};

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
pub fn spawn<S: Shared>(state: Arc<S>, url: String) {
    tokio::spawn(events_loop(state.clone(), url));
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

async fn events_loop<S: Shared>(state: Arc<S>, url: String) {
    loop {
        let mut conn = match RedisConn::connect(&url, Duration::from_secs(1)).await {
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
        let mut last = match conn
            .cmd(&[b"XREVRANGE", EVENTS_STREAM.as_bytes(), b"+", b"-", b"COUNT", b"1"])
            .await
        {
            Ok(r) => r
                .items()
                .first()
                .and_then(|e| e.items().first())
                .and_then(Reply::text)
                .unwrap_or_else(|| "0-0".into()),
            Err(_) => continue,
        };
        resync(&*state, true).await;
        state.routing().exact_live.store(true, Ordering::Relaxed);
        gauge!("tandem_router_redis_up").set(1.0);
        tracing::info!(%url, "reading KV events; routing on the exact index");
        loop {
            let args: [&[u8]; 7] = [
                b"XREAD",
                b"COUNT",
                b"1000",
                b"BLOCK",
                b"500",
                b"STREAMS",
                EVENTS_STREAM.as_bytes(),
            ];
            let mut full: Vec<&[u8]> = args.to_vec();
            full.push(last.as_bytes());
            let reply = match conn.cmd_timeout(&full, Duration::from_secs(3)).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "lost redis; routing on the approximate index until it returns");
                    break;
                }
            };
            let mut next_last = None;
            for stream in reply.items() {
                for entry in stream.items().get(1).map(Reply::items).unwrap_or(&[]) {
                    let items = entry.items();
                    if let Some(id) = items.first().and_then(Reply::text) {
                        next_last = Some(id);
                    }
                    let Some(ev) = items.get(1).and_then(|f| decode(f.items())) else { continue };
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
            }
            if let Some(l) = next_last {
                last = l;
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
    url: String,
    field: String,
    conn: tokio::sync::Mutex<Option<RedisConn>>,
}

impl LoadSync {
    /// A syncer for router `router_id`.
    pub fn new(url: String, router_id: &str) -> LoadSync {
        LoadSync { url, field: router_id.to_string(), conn: tokio::sync::Mutex::new(None) }
    }

    /// One exchange, bounded by `timeout`; on failure the other replicas' load is taken as
    /// unknown (zero) until the next success.
    pub async fn exchange(&self, routing: &Routing, timeout: Duration) {
        let Ok(mut guard) = tokio::time::timeout(timeout, self.conn.lock()).await else { return };
        let fut = async {
            if guard.is_none() {
                *guard = Some(RedisConn::connect(&self.url, Duration::from_millis(500)).await?);
            }
            let c = guard.as_mut().expect("connected above");
            let now = now_ms();
            let mine = serde_json::to_vec(&LoadEntry { at: now, loads: routing.load.local() })
                .unwrap_or_default();
            let replies = c
                .pipeline(&[
                    &[b"HSET", LOAD_KEY.as_bytes(), self.field.as_bytes(), &mine],
                    &[b"HGETALL", LOAD_KEY.as_bytes()],
                ])
                .await?;
            let mut sum: HashMap<String, Load> = HashMap::new();
            let mut stale: Vec<String> = Vec::new();
            for pair in replies[1].items().chunks(2) {
                let (Some(field), Some(value)) =
                    (pair[0].text(), pair.get(1).and_then(Reply::bytes))
                else {
                    continue;
                };
                if field == self.field {
                    continue;
                }
                match serde_json::from_slice::<LoadEntry>(value) {
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
                let mut args: Vec<&[u8]> = vec![b"HDEL", LOAD_KEY.as_bytes()];
                args.extend(stale.iter().map(|f| f.as_bytes()));
                c.cmd(&args).await?;
            }
            Ok::<_, tandem_worker::redis::RedisError>(sum)
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(sum)) => routing.load.set_remote(sum),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "sharing load through redis failed");
                routing.load.set_remote(HashMap::new());
                *guard = None;
            }
            Err(_) => {
                routing.load.set_remote(HashMap::new());
                *guard = None;
            }
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
