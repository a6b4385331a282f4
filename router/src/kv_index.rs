//! The router's view of which worker caches which KV blocks.
//!
//! [`KvIndex`] is exact: built from the workers' KV events (block hash → workers holding it),
//! with per-worker epochs (a new process purges its predecessor's entries) and sequence numbers
//! (a gap asks for a resync from the worker's `Status`). [`ApproxIndex`] is the fallback with
//! no events: it remembers where this router sent each prompt's blocks, for a TTL.
//!
//! Both answer [`PrefixIndex::match_blocks`]: for a prompt's chained block hashes, how many
//! leading blocks each worker holds.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tandem_engine::scheduling::block_manager::KvEvent;

/// A prefix-match answer: leading blocks held, per worker id.
pub type Matches = HashMap<String, usize>;

/// What can answer longest-prefix queries.
pub trait PrefixIndex {
    /// Leading blocks of `hashes` each worker holds (workers holding none are absent).
    fn match_blocks(&self, hashes: &[u64]) -> Matches;
}

/// Walks the prefix while any worker still holds it.
fn walk<'a, F: Fn(u64) -> Option<&'a HashSet<String>>>(hashes: &[u64], holders: F) -> Matches {
    let mut out = Matches::new();
    let Some(first) = hashes.first().and_then(|&h| holders(h)) else { return out };
    let mut alive: Vec<&String> = first.iter().collect();
    for w in &alive {
        out.insert((*w).clone(), 1);
    }
    for &h in &hashes[1..] {
        let Some(set) = holders(h) else { break };
        alive.retain(|w| set.contains(*w));
        if alive.is_empty() {
            break;
        }
        for w in &alive {
            *out.get_mut(*w).expect("seeded above") += 1;
        }
    }
    out
}

#[derive(Debug, Default)]
struct WorkerEntry {
    epoch: u64,
    last_seq: u64,
    hashes: HashSet<u64>,
    needs_resync: bool,
}

/// What applying one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The event was applied.
    Ok,
    /// A new epoch: the worker's old entries were purged, then the event applied.
    NewEpoch,
    /// Already seen (or from an older epoch): ignored.
    Stale,
    /// Events were lost before this one: the worker needs a resync (the event is not applied).
    Gap,
}

/// The exact index, fed by KV events.
#[derive(Debug, Default)]
pub struct KvIndex {
    blocks: HashMap<u64, HashSet<String>>,
    workers: HashMap<String, WorkerEntry>,
}

impl KvIndex {
    /// Applies event `seq` of `worker`'s `epoch`.
    pub fn apply(&mut self, worker: &str, epoch: u64, seq: u64, event: &KvEvent) -> Applied {
        let mut result = Applied::Ok;
        let known = self.workers.get(worker).map(|w| (w.epoch, w.last_seq, w.needs_resync));
        match known {
            Some((e, _, _)) if epoch < e => return Applied::Stale,
            Some((e, last, resync)) if epoch == e => {
                if seq <= last {
                    return Applied::Stale;
                }
                if resync || seq != last + 1 {
                    self.workers.get_mut(worker).expect("known").needs_resync = true;
                    return Applied::Gap;
                }
            }
            _ => {
                // A worker we have not seen, or a new process: start over from this epoch.
                self.remove_worker(worker);
                self.workers
                    .insert(worker.to_string(), WorkerEntry { epoch, ..Default::default() });
                if known.is_some() {
                    result = Applied::NewEpoch;
                }
                if seq != 1 {
                    // We joined mid-stream: what came before is unknown.
                    self.workers.get_mut(worker).expect("inserted").needs_resync = true;
                    return Applied::Gap;
                }
            }
        }
        let entry = self.workers.get_mut(worker).expect("present");
        entry.last_seq = seq;
        match event {
            KvEvent::Stored(hs) => {
                for h in hs {
                    entry.hashes.insert(h.0);
                    self.blocks.entry(h.0).or_default().insert(worker.to_string());
                }
            }
            KvEvent::Removed(hs) => {
                for h in hs {
                    entry.hashes.remove(&h.0);
                    if let Some(set) = self.blocks.get_mut(&h.0) {
                        set.remove(worker);
                        if set.is_empty() {
                            self.blocks.remove(&h.0);
                        }
                    }
                }
            }
            KvEvent::Cleared => {
                let old: Vec<u64> = entry.hashes.drain().collect();
                self.unlink(worker, &old);
            }
        }
        result
    }

    fn unlink(&mut self, worker: &str, hashes: &[u64]) {
        for h in hashes {
            if let Some(set) = self.blocks.get_mut(h) {
                set.remove(worker);
                if set.is_empty() {
                    self.blocks.remove(h);
                }
            }
        }
    }

    /// Replaces a worker's entries with a snapshot taken at event `seq` of `epoch`.
    pub fn resync(&mut self, worker: &str, epoch: u64, seq: u64, hashes: &[u64]) {
        self.remove_worker(worker);
        for &h in hashes {
            self.blocks.entry(h).or_default().insert(worker.to_string());
        }
        self.workers.insert(
            worker.to_string(),
            WorkerEntry {
                epoch,
                last_seq: seq,
                hashes: hashes.iter().copied().collect(),
                needs_resync: false,
            },
        );
    }

    /// Forgets a worker (it disappeared).
    pub fn remove_worker(&mut self, worker: &str) {
        if let Some(w) = self.workers.remove(worker) {
            let old: Vec<u64> = w.hashes.into_iter().collect();
            self.unlink(worker, &old);
        }
    }

    /// Workers whose events had a gap.
    pub fn needing_resync(&self) -> Vec<String> {
        self.workers.iter().filter(|(_, w)| w.needs_resync).map(|(k, _)| k.clone()).collect()
    }

    /// Distinct blocks indexed.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks indexed for one worker.
    pub fn worker_blocks(&self, worker: &str) -> usize {
        self.workers.get(worker).map_or(0, |w| w.hashes.len())
    }

    /// Workers known, with their epoch and last sequence number.
    pub fn workers(&self) -> Vec<(String, u64, u64, usize)> {
        let mut v: Vec<_> = self
            .workers
            .iter()
            .map(|(k, w)| (k.clone(), w.epoch, w.last_seq, w.hashes.len()))
            .collect();
        v.sort();
        v
    }
}

impl PrefixIndex for KvIndex {
    fn match_blocks(&self, hashes: &[u64]) -> Matches {
        walk(hashes, |h| self.blocks.get(&h))
    }
}

/// The approximate index: where this router sent prompts, remembered for a TTL.
#[derive(Debug)]
pub struct ApproxIndex {
    ttl: Duration,
    blocks: HashMap<u64, HashMap<String, Instant>>,
    max_blocks: usize,
}

impl ApproxIndex {
    /// An index whose entries live `ttl`, holding at most `max_blocks` blocks.
    pub fn new(ttl: Duration, max_blocks: usize) -> ApproxIndex {
        ApproxIndex { ttl, blocks: HashMap::new(), max_blocks }
    }

    /// Records that `worker` now holds `hashes`.
    pub fn insert(&mut self, worker: &str, hashes: &[u64], now: Instant) {
        if self.blocks.len() + hashes.len() > self.max_blocks {
            self.prune(now);
        }
        for &h in hashes {
            self.blocks.entry(h).or_default().insert(worker.to_string(), now + self.ttl);
        }
    }

    /// Drops expired entries.
    pub fn prune(&mut self, now: Instant) {
        self.blocks.retain(|_, m| {
            m.retain(|_, exp| *exp > now);
            !m.is_empty()
        });
    }

    /// Forgets a worker.
    pub fn remove_worker(&mut self, worker: &str) {
        self.blocks.retain(|_, m| {
            m.remove(worker);
            !m.is_empty()
        });
    }

    /// Distinct blocks remembered.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Leading blocks each worker holds, by this index, at `now`.
    pub fn match_at(&self, hashes: &[u64], now: Instant) -> Matches {
        let live: Vec<Option<HashSet<String>>> = hashes
            .iter()
            .map(|h| {
                self.blocks
                    .get(h)
                    .map(|m| m.iter().filter(|(_, e)| **e > now).map(|(w, _)| w.clone()).collect())
            })
            .collect();
        let idx: HashMap<u64, &HashSet<String>> =
            hashes.iter().zip(&live).filter_map(|(h, s)| Some((*h, s.as_ref()?))).collect();
        walk(hashes, |h| idx.get(&h).copied())
    }
}

impl PrefixIndex for ApproxIndex {
    fn match_blocks(&self, hashes: &[u64]) -> Matches {
        self.match_at(hashes, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_engine::scheduling::block_hash::BlockHash;

    fn stored(h: &[u64]) -> KvEvent {
        KvEvent::Stored(h.iter().map(|&x| BlockHash(x)).collect())
    }
    fn removed(h: &[u64]) -> KvEvent {
        KvEvent::Removed(h.iter().map(|&x| BlockHash(x)).collect())
    }

    #[test]
    fn longest_prefix_per_worker() {
        let mut ix = KvIndex::default();
        assert_eq!(ix.apply("a", 1, 1, &stored(&[10, 11, 12])), Applied::Ok);
        assert_eq!(ix.apply("b", 1, 1, &stored(&[10, 11, 99])), Applied::Ok);
        let m = ix.match_blocks(&[10, 11, 12, 13]);
        assert_eq!(m.get("a"), Some(&3));
        assert_eq!(m.get("b"), Some(&2));
        // Holding a later block without the earlier ones is no prefix.
        assert_eq!(ix.apply("c", 1, 1, &stored(&[11, 12])), Applied::Ok);
        assert_eq!(ix.match_blocks(&[10, 11, 12]).get("c"), None);
        assert!(ix.match_blocks(&[42]).is_empty());
        assert!(ix.match_blocks(&[]).is_empty());
    }

    #[test]
    fn removal_and_cleared() {
        let mut ix = KvIndex::default();
        ix.apply("a", 1, 1, &stored(&[1, 2, 3]));
        ix.apply("a", 1, 2, &removed(&[2]));
        assert_eq!(ix.match_blocks(&[1, 2, 3]).get("a"), Some(&1));
        assert_eq!(ix.worker_blocks("a"), 2);
        ix.apply("a", 1, 3, &KvEvent::Cleared);
        assert!(ix.match_blocks(&[1]).is_empty());
        assert_eq!(ix.len(), 0);
    }

    #[test]
    fn new_epoch_purges_the_old_process() {
        let mut ix = KvIndex::default();
        ix.apply("a", 1, 1, &stored(&[1, 2]));
        ix.apply("b", 1, 1, &stored(&[1]));
        // The restarted worker's first event: its old blocks are gone, b's stay.
        assert_eq!(ix.apply("a", 2, 1, &KvEvent::Cleared), Applied::NewEpoch);
        assert_eq!(ix.match_blocks(&[1, 2]).get("a"), None);
        assert_eq!(ix.match_blocks(&[1, 2]).get("b"), Some(&1));
        // A late event of the old process is ignored.
        assert_eq!(ix.apply("a", 1, 2, &stored(&[1, 2])), Applied::Stale);
        assert_eq!(ix.match_blocks(&[1]).get("a"), None);
    }

    #[test]
    fn gaps_ask_for_a_resync_and_duplicates_are_ignored() {
        let mut ix = KvIndex::default();
        ix.apply("a", 1, 1, &stored(&[1]));
        assert_eq!(ix.apply("a", 1, 1, &stored(&[1])), Applied::Stale);
        assert_eq!(ix.apply("a", 1, 3, &stored(&[2])), Applied::Gap);
        assert_eq!(ix.needing_resync(), vec!["a".to_string()]);
        // Until the resync, further events are not applied.
        assert_eq!(ix.apply("a", 1, 4, &stored(&[3])), Applied::Gap);
        ix.resync("a", 1, 4, &[1, 2, 3]);
        assert!(ix.needing_resync().is_empty());
        assert_eq!(ix.match_blocks(&[1, 2, 3]).get("a"), Some(&3));
        assert_eq!(ix.apply("a", 1, 4, &stored(&[9])), Applied::Stale);
        assert_eq!(ix.apply("a", 1, 5, &removed(&[3])), Applied::Ok);
        assert_eq!(ix.match_blocks(&[1, 2, 3]).get("a"), Some(&2));
        // Joining mid-stream (first event seen is not 1) also needs a resync.
        assert_eq!(ix.apply("z", 7, 40, &stored(&[5])), Applied::Gap);
        assert_eq!(ix.match_blocks(&[5]).get("z"), None);
    }

    #[test]
    fn removing_a_worker() {
        let mut ix = KvIndex::default();
        ix.apply("a", 1, 1, &stored(&[1, 2]));
        ix.apply("b", 1, 1, &stored(&[1, 2]));
        ix.remove_worker("a");
        assert_eq!(ix.match_blocks(&[1, 2]).keys().collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(ix.len(), 2);
        ix.remove_worker("b");
        assert!(ix.is_empty());
    }

    #[test]
    fn approximate_entries_expire() {
        let t0 = Instant::now();
        let mut ix = ApproxIndex::new(Duration::from_secs(10), 1000);
        ix.insert("a", &[1, 2, 3], t0);
        ix.insert("b", &[1], t0 + Duration::from_secs(5));
        let m = ix.match_at(&[1, 2, 3], t0 + Duration::from_secs(1));
        assert_eq!((m.get("a"), m.get("b")), (Some(&3), Some(&1)));
        let m = ix.match_at(&[1, 2, 3], t0 + Duration::from_secs(12));
        assert_eq!((m.get("a"), m.get("b")), (None, Some(&1)));
        ix.prune(t0 + Duration::from_secs(20));
        assert!(ix.is_empty());
    }
}
