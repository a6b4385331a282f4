//! KV cache events on Redis Streams: workers publish the blocks their prefix cache stores and
//! evicts, routers read them to know which worker holds which prompt prefix.
//!
//! One stream, [`EVENTS_STREAM`], carries every worker's events. An entry's fields: `w` worker
//! id, `e` epoch (changes at every process start), `s` sequence number (1, 2, … per epoch; a
//! gap means events were lost), `k` kind (`stored`, `removed`, `cleared`), `h` the block hashes
//! as little-endian u64s. A worker that cannot reach Redis keeps numbering its events, so
//! readers see the gap and resynchronise from the worker's `Status`.

use std::collections::HashMap;
use std::time::Duration;

use tandem_engine::scheduling::block_hash::BlockHash;
use tandem_engine::scheduling::block_manager::KvEvent;
use tokio::sync::mpsc;

use crate::redis::{bytes, RedisConfig};

/// The Redis stream of KV events.
pub const EVENTS_STREAM: &str = "tandem:kv:events";

/// Entries kept in the stream (approximately).
const MAX_LEN: &str = "100000";

/// One event as read from the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireEvent {
    /// Worker id.
    pub worker: String,
    /// The worker's process epoch.
    pub epoch: u64,
    /// Sequence number within the epoch.
    pub seq: u64,
    /// What changed.
    pub event: KvEvent,
}

/// The stream fields of an event.
pub fn encode(worker: &str, epoch: u64, seq: u64, ev: &KvEvent) -> Vec<(&'static str, Vec<u8>)> {
    let (kind, hashes): (&str, &[BlockHash]) = match ev {
        KvEvent::Stored(h) => ("stored", h),
        KvEvent::Removed(h) => ("removed", h),
        KvEvent::Cleared => ("cleared", &[]),
    };
    let h: Vec<u8> = hashes.iter().flat_map(|x| x.0.to_le_bytes()).collect();
    vec![
        ("w", worker.as_bytes().to_vec()),
        ("e", epoch.to_string().into_bytes()),
        ("s", seq.to_string().into_bytes()),
        ("k", kind.as_bytes().to_vec()),
        ("h", h),
    ]
}

/// Parses an entry's fields (a stream entry's field → value map).
pub fn decode(fields: &HashMap<String, redis::Value>) -> Option<WireEvent> {
    let field = |name: &str| fields.get(name).and_then(bytes);
    let text = |name: &str| std::str::from_utf8(field(name)?).ok();
    let w = field("w").map(|v| String::from_utf8_lossy(v).into_owned());
    let e: Option<u64> = text("e").and_then(|t| t.parse().ok());
    let s: Option<u64> = text("s").and_then(|t| t.parse().ok());
    let k = field("k").map(<[u8]>::to_vec);
    let h = field("h").map(<[u8]>::to_vec);
    let hashes = || -> Option<Vec<BlockHash>> {
        let h = h.clone()?;
        (h.len() % 8 == 0).then(|| {
            h.chunks_exact(8)
                .map(|c| BlockHash(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
                .collect()
        })
    };
    let event = match k?.as_slice() {
        b"stored" => KvEvent::Stored(hashes()?),
        b"removed" => KvEvent::Removed(hashes()?),
        b"cleared" => KvEvent::Cleared,
        _ => return None,
    };
    Some(WireEvent { worker: w?, epoch: e?, seq: s?, event })
}

/// Starts the publisher task; send it `(seq, event)` pairs in order. Events that cannot be
/// written (Redis down) are dropped and counted; the gap tells readers to resynchronise.
pub fn spawn_publisher(
    redis: RedisConfig,
    worker: String,
    epoch: u64,
) -> mpsc::UnboundedSender<(u64, KvEvent)> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, KvEvent)>();
    let url = redis.redacted();
    // The configuration was checked at start-up; a client that still cannot be made drops
    // every event (counted), as an unreachable Redis would.
    let manager = redis.manager(Duration::from_secs(1));
    tokio::spawn(async move {
        let mut conn = match manager {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::error!(%url, error = %e, "redis cannot be used; KV events are dropped");
                None
            }
        };
        let mut up = None;
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            let Some(c) = conn.as_mut() else {
                metrics::counter!("tandem_kv_events_dropped_total").increment(batch.len() as u64);
                continue;
            };
            for (i, (seq, ev)) in batch.iter().enumerate() {
                let mut cmd = redis::cmd("XADD");
                cmd.arg(EVENTS_STREAM).arg("MAXLEN").arg("~").arg(MAX_LEN).arg("*");
                for (name, value) in encode(&worker, epoch, *seq, ev) {
                    cmd.arg(name).arg(value);
                }
                if let Err(e) = cmd.query_async::<redis::Value>(c).await {
                    if up != Some(false) {
                        tracing::warn!(%url, error = %e, "redis unreachable; KV events are dropped until it returns");
                        up = Some(false);
                    }
                    metrics::counter!("tandem_kv_events_dropped_total")
                        .increment((batch.len() - i) as u64);
                    break;
                }
                if up != Some(true) {
                    tracing::info!(%url, "publishing KV events to redis");
                    up = Some(true);
                }
                metrics::counter!("tandem_kv_events_published_total").increment(1);
            }
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_round_trip() {
        for ev in [
            KvEvent::Stored(vec![BlockHash(1), BlockHash(u64::MAX)]),
            KvEvent::Removed(vec![BlockHash(7)]),
            KvEvent::Cleared,
        ] {
            let fields: HashMap<String, redis::Value> = encode("prefill-1", 99, 5, &ev)
                .into_iter()
                .map(|(k, v)| (k.to_string(), redis::Value::BulkString(v)))
                .collect();
            assert_eq!(
                decode(&fields),
                Some(WireEvent { worker: "prefill-1".into(), epoch: 99, seq: 5, event: ev })
            );
        }
        let bogus = HashMap::from([("k".to_string(), redis::Value::BulkString(b"bogus".to_vec()))]);
        assert_eq!(decode(&bogus), None);
    }
}
