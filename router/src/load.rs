//! Worker load as the router tracks it, shared among router replicas.
//!
//! A request adds its uncached prompt tokens to its prefill worker's queue and its KV blocks to
//! its decode worker when it is dispatched; the prefill share leaves at the first token, the
//! decode share at completion (a [`LoadTicket`] does both, also when the request fails or the
//! client goes away). Each replica publishes its own totals to Redis as soon as they change and
//! reads the others', so two routers see each other's load; without Redis each sees its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Load on one worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Load {
    /// Prompt tokens queued for prefill.
    pub prefill_tokens: f64,
    /// KV blocks of requests decoding.
    pub decode_blocks: f64,
}

/// This router's load per worker address, plus the other replicas' last published loads.
#[derive(Debug, Default)]
pub struct LoadBook {
    local: Mutex<HashMap<String, Load>>,
    remote: Mutex<HashMap<String, Load>>,
    /// Signalled when this router's load changes, so replicas hear of it at once.
    pub changed: tokio::sync::Notify,
}

impl LoadBook {
    /// The load on `worker` from every router.
    pub fn get(&self, worker: &str) -> Load {
        let l = self.local.lock().expect("load lock").get(worker).copied().unwrap_or_default();
        let r = self.remote.lock().expect("load lock").get(worker).copied().unwrap_or_default();
        Load {
            prefill_tokens: l.prefill_tokens + r.prefill_tokens,
            decode_blocks: l.decode_blocks + r.decode_blocks,
        }
    }

    fn add(&self, worker: &str, prefill: f64, decode: f64) {
        let mut m = self.local.lock().expect("load lock");
        let e = m.entry(worker.to_string()).or_default();
        e.prefill_tokens = (e.prefill_tokens + prefill).max(0.0);
        e.decode_blocks = (e.decode_blocks + decode).max(0.0);
    }

    /// This router's own loads (what it publishes).
    pub fn local(&self) -> HashMap<String, Load> {
        self.local.lock().expect("load lock").clone()
    }

    /// Replaces the other replicas' loads.
    pub fn set_remote(&self, remote: HashMap<String, Load>) {
        *self.remote.lock().expect("load lock") = remote;
    }

    /// Books a request: `prefill_tokens` on `prefill` (or on `decode` when colocated) until the
    /// first token, `decode_blocks` on `decode` until the ticket is dropped.
    pub fn book(
        self: &Arc<Self>,
        prefill: &str,
        prefill_tokens: f64,
        decode: &str,
        decode_blocks: f64,
    ) -> LoadTicket {
        self.add(prefill, prefill_tokens, 0.0);
        self.add(decode, 0.0, decode_blocks);
        self.changed.notify_one();
        LoadTicket {
            book: self.clone(),
            prefill: Some((prefill.to_string(), prefill_tokens)),
            decode: (decode.to_string(), decode_blocks),
        }
    }
}

/// A request's booked load; dropping it releases everything left.
#[derive(Debug)]
pub struct LoadTicket {
    book: Arc<LoadBook>,
    prefill: Option<(String, f64)>,
    decode: (String, f64),
}

impl LoadTicket {
    /// The prompt has been prefilled: its prefill share leaves the queue.
    pub fn first_token(&mut self) {
        if let Some((w, t)) = self.prefill.take() {
            self.book.add(&w, -t, 0.0);
            self.book.changed.notify_one();
        }
    }
}

impl Drop for LoadTicket {
    fn drop(&mut self) {
        self.first_token();
        let (w, b) = &self.decode;
        self.book.add(w, 0.0, -b);
        self.book.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_move_and_release_load() {
        let book = Arc::new(LoadBook::default());
        let mut t = book.book("p", 300.0, "d", 20.0);
        let t2 = book.book("p", 100.0, "d", 5.0);
        assert_eq!(book.get("p").prefill_tokens, 400.0);
        assert_eq!(book.get("d").decode_blocks, 25.0);
        t.first_token();
        t.first_token();
        assert_eq!(book.get("p").prefill_tokens, 100.0);
        drop(t);
        assert_eq!(book.get("d").decode_blocks, 5.0);
        drop(t2);
        assert_eq!(book.get("p"), Load::default());
        assert_eq!(book.get("d"), Load::default());
        // Other replicas' published loads add up with ours.
        book.set_remote(HashMap::from([(
            "p".to_string(),
            Load { prefill_tokens: 64.0, decode_blocks: 1.0 },
        )]));
        let _t3 = book.book("p", 10.0, "d", 1.0);
        assert_eq!(book.get("p").prefill_tokens, 74.0);
    }
}
