//! KV cache events on Redis Streams: workers publish the blocks their prefix cache stores and
//! evicts, routers read them to know which worker holds which prompt prefix.
//!
//! One stream, [`EVENTS_STREAM`], carries every worker's events. An entry's fields: `w` worker
//! id, `e` epoch (changes at every process start), `s` sequence number (1, 2, … per epoch; a
//! gap means events were lost), `k` kind (`stored`, `removed`, `cleared`), `h` the block hashes
//! as little-endian u64s. A worker that cannot reach Redis keeps numbering its events, so
//! readers see the gap and resynchronise from the worker's `Status`.

use std::time::Duration;

use tandem_engine::scheduling::block_hash::BlockHash;
use tandem_engine::scheduling::block_manager::KvEvent;
use tokio::sync::mpsc;

use crate::redis::{RedisConn, Reply};

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

/// Parses an entry's field list (`[name, value, name, value, …]`).
pub fn decode(fields: &[Reply]) -> Option<WireEvent> {
    let (mut w, mut e, mut s, mut k, mut h) = (None, None, None, None, None);
    for pair in fields.chunks(2) {
        let (Some(name), Some(value)) = (pair[0].bytes(), pair.get(1).and_then(Reply::bytes))
        else {
            continue;
        };
        match name {
            b"w" => w = Some(String::from_utf8_lossy(value).into_owned()),
            b"e" => e = std::str::from_utf8(value).ok()?.parse().ok(),
            b"s" => s = std::str::from_utf8(value).ok()?.parse().ok(),
            b"k" => k = Some(value.to_vec()),
            b"h" => h = Some(value.to_vec()),
            _ => {}
        }
    }
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
    url: String,
    worker: String,
    epoch: u64,
) -> mpsc::UnboundedSender<(u64, KvEvent)> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, KvEvent)>();
    tokio::spawn(async move {
        let mut conn: Option<RedisConn> = None;
        let mut next_try = tokio::time::Instant::now();
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            if conn.is_none() && tokio::time::Instant::now() >= next_try {
                match RedisConn::connect(&url, Duration::from_secs(1)).await {
                    Ok(c) => {
                        tracing::info!(%url, "publishing KV events to redis");
                        conn = Some(c);
                    }
                    Err(e) => {
                        tracing::warn!(%url, error = %e, "redis unreachable; KV events are dropped until it returns");
                        next_try = tokio::time::Instant::now() + Duration::from_millis(500);
                    }
                }
            }
            let Some(c) = conn.as_mut() else {
                metrics::counter!("tandem_kv_events_dropped_total").increment(batch.len() as u64);
                continue;
            };
            for (i, (seq, ev)) in batch.iter().enumerate() {
                let fields = encode(&worker, epoch, *seq, ev);
                let mut args: Vec<&[u8]> = vec![
                    b"XADD",
                    EVENTS_STREAM.as_bytes(),
                    b"MAXLEN",
                    b"~",
                    MAX_LEN.as_bytes(),
                    b"*",
                ];
                for (name, value) in &fields {
                    args.push(name.as_bytes());
                    args.push(value);
                }
                if let Err(e) = c.cmd(&args).await {
                    tracing::warn!(error = %e, "publishing a KV event failed; reconnecting");
                    metrics::counter!("tandem_kv_events_dropped_total")
                        .increment((batch.len() - i) as u64);
                    conn = None;
                    next_try = tokio::time::Instant::now() + Duration::from_millis(200);
                    break;
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
            let fields: Vec<Reply> = encode("prefill-1", 99, 5, &ev)
                .into_iter()
                .flat_map(|(k, v)| [Reply::Bulk(Some(k.as_bytes().to_vec())), Reply::Bulk(Some(v))])
                .collect();
            assert_eq!(
                decode(&fields),
                Some(WireEvent { worker: "prefill-1".into(), epoch: 99, seq: 5, event: ev })
            );
        }
        assert_eq!(
            decode(&[Reply::Bulk(Some(b"k".to_vec())), Reply::Bulk(Some(b"bogus".to_vec()))]),
            None
        );
    }
}
