//! Hand-over of a step's events from the engine thread to the async tasks that stream them, in
//! one message per step instead of one per request.
//!
//! Waking a task of the async runtime from the engine thread may cost a system call (a parked
//! worker thread is unparked); with hundreds of streams that was a wake-up per stream per step,
//! on the thread every step waits for. A [`Courier`] instead owns each stream's *target* (what
//! runs on the runtime with the stream's events: build the message, send it) and the engine
//! thread only queues `(stream, event)` pairs in its outbox, which [`flush`] (called once the
//! step's outputs are dispatched) hands to each courier in one message. Per event the engine
//! thread moves the event into a vector: no allocation of its own, and no reference count
//! shared with the runtime's threads is touched (a cloned sender or a boxed closure per event
//! each cost a cache line that the runtime's threads then take back).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::sink::{EngineEvent, Sink};

/// What runs on a courier's task with each event of one stream, in order.
pub type Target = Box<dyn FnMut(EngineEvent) + Send>;

/// One entry of a courier's batch.
// `Event` is the entry of every token and the others are rare: boxing it would put back the
// allocation per event that holding a request's completion inline saves.
#[allow(clippy::large_enum_variant)]
enum Msg {
    /// A stream's target, before any of its events.
    Open(u64, Target),
    /// One event of a stream.
    Event(u64, EngineEvent),
    /// The stream ended (its sink was dropped): its target is dropped.
    Close(u64),
}

type Batch = Vec<Msg>;

thread_local! {
    /// This thread's queued messages, one batch per courier in the order each was first used.
    static OUTBOX: RefCell<Vec<(UnboundedSender<Batch>, Batch)>> = const { RefCell::new(Vec::new()) };
}

/// A task on an async runtime that runs the targets of streams fed from the engine thread.
#[derive(Clone)]
pub struct Courier {
    tx: UnboundedSender<Batch>,
    next: Arc<AtomicU64>,
}

impl Courier {
    /// Starts a courier on the current runtime (call it from inside one); it ends when every
    /// handle and every sink made by [`Courier::sink`] is dropped.
    pub fn spawn() -> Courier {
        let (tx, mut rx) = unbounded_channel::<Batch>();
        tokio::spawn(async move {
            let mut streams: HashMap<u64, Target> = HashMap::new();
            while let Some(batch) = rx.recv().await {
                for m in batch {
                    match m {
                        Msg::Open(key, target) => {
                            streams.insert(key, target);
                        }
                        Msg::Event(key, ev) => {
                            if let Some(target) = streams.get_mut(&key) {
                                target(ev);
                            }
                        }
                        Msg::Close(key) => {
                            streams.remove(&key);
                        }
                    }
                }
            }
        });
        Courier { tx, next: Arc::new(AtomicU64::new(0)) }
    }

    /// Opens a stream whose events run `target` on this courier's task, in order, handed over
    /// at the next [`flush`]; dropping the returned end drops the target after the events
    /// queued before. Call it on the thread that sends the events (the engine thread): the
    /// target goes into that thread's outbox ahead of them.
    pub fn open(&self, target: Target) -> Stream {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        queue(&self.tx, Msg::Open(key, target));
        Stream { tx: self.tx.clone(), key }
    }

    /// [`Courier::open`] as a sink for the engine loop (see [`crate::engine_loop::LoopState::subscribe`]).
    pub fn sink(&self, target: Target) -> Sink {
        let stream = self.open(target);
        Box::new(move |_, ev| stream.send(ev))
    }
}

/// The sending end of one stream of a [`Courier`]: closes the stream when dropped.
pub struct Stream {
    tx: UnboundedSender<Batch>,
    key: u64,
}

impl Stream {
    /// Queues `ev` in this thread's outbox, for the next [`flush`].
    pub fn send(&self, ev: EngineEvent) {
        queue(&self.tx, Msg::Event(self.key, ev));
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        queue(&self.tx, Msg::Close(self.key));
    }
}

/// Adds `m` to this thread's batch for the courier behind `tx` (the sender is cloned only for
/// the first message of a flush).
fn queue(tx: &UnboundedSender<Batch>, m: Msg) {
    // At thread exit the outbox may be gone: the message goes with it (its courier's task
    // drops its targets when its last sender goes).
    let _ = OUTBOX.try_with(|o| {
        let mut o = o.borrow_mut();
        match o.iter_mut().find(|(t, _)| t.same_channel(tx)) {
            Some((_, batch)) => batch.push(m),
            None => o.push((tx.clone(), vec![m])),
        }
    });
}

/// Hands every message queued on this thread to its courier, one message per courier, in the
/// order they were queued. A courier whose runtime is gone drops them (with their targets, so
/// their streams' receivers see the streams end).
pub fn flush() {
    let queued = OUTBOX.with(|o| std::mem::take(&mut *o.borrow_mut()));
    for (tx, batch) in queued {
        let _ = tx.send(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_engine::RequestOutput;

    fn output(id: &str, finished: bool) -> EngineEvent {
        EngineEvent::Output(RequestOutput {
            request_id: id.to_string(),
            prompt_token_ids: Arc::new(vec![1, 2]),
            outputs: Default::default(),
            finished,
            prompt_logprobs: None,
            metrics: Default::default(),
        })
    }

    /// Each stream's events arrive in order, one hand-over per flush; dropping a stream's end
    /// drops its target (its sender goes, so its receiver sees the end) after the events
    /// queued before.
    #[test]
    fn events_arrive_in_order_and_a_dropped_stream_ends() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let courier = rt.block_on(async { Courier::spawn() });
        let mut receivers = Vec::new();
        let mut streams = Vec::new();
        for _ in 0..3 {
            let (tx, rx) = unbounded_channel::<(usize, String)>();
            let mut n = 0;
            streams.push(courier.open(Box::new(move |ev| {
                if let EngineEvent::Output(o) = ev {
                    let _ = tx.send((n, o.request_id));
                    n += 1;
                }
            })));
            receivers.push(rx);
        }
        for i in 0..50 {
            for (s, stream) in streams.iter().enumerate() {
                stream.send(output(&format!("{s}-{i}"), false));
            }
        }
        // Nothing moves before the flush.
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(receivers.iter_mut().all(|rx| rx.try_recv().is_err()));
        drop(streams.remove(1));
        flush();
        // A lost event or a target never dropped fails here instead of hanging the test.
        const WAIT: std::time::Duration = std::time::Duration::from_secs(30);
        rt.block_on(async {
            for (s, rx) in receivers.iter_mut().enumerate() {
                for i in 0..50 {
                    let got =
                        tokio::time::timeout(WAIT, rx.recv()).await.expect("every event arrives");
                    assert_eq!(got, Some((i, format!("{s}-{i}"))));
                }
            }
            // Stream 1's end was dropped: its target (and sender) are gone.
            let end = tokio::time::timeout(WAIT, receivers[1].recv())
                .await
                .expect("the dropped stream ends");
            assert_eq!(end, None);
        });
        // Streams 0 and 2 stay open.
        assert!(receivers[0].try_recv().is_err() && !receivers[0].is_closed());

        // A courier whose runtime has ended: the flush drops its messages and targets.
        drop(rt);
        for stream in &streams {
            stream.send(output("late", true));
        }
        flush();
        assert!(receivers[0].is_closed() && receivers[2].is_closed());
        assert!(receivers[0].try_recv().is_err());
    }
}
