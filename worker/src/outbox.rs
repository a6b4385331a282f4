//! Hand-over of a step's outputs from the engine thread to the async tasks that stream them, in
//! one message per step instead of one per request.
//!
//! Waking a task of the async runtime from the engine thread may cost a system call (a parked
//! worker thread is unparked); with hundreds of streams that was a wake-up per stream per step,
//! on the thread every step waits for. A sink instead [`Courier::defer`]s its delivery: it goes
//! into the engine thread's outbox, which [`flush`] (called once the step's outputs are
//! dispatched) hands to each courier in one message; the courier's task then runs the
//! deliveries, in order, on the runtime.

use std::cell::RefCell;

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

/// A delivery: sends one event to one stream.
pub type Delivery = Box<dyn FnOnce() + Send>;

type Batch = Vec<Delivery>;

thread_local! {
    static OUTBOX: RefCell<Vec<(UnboundedSender<Batch>, Delivery)>> = const { RefCell::new(Vec::new()) };
}

/// A task on an async runtime that runs deliveries handed over from the engine thread.
#[derive(Clone)]
pub struct Courier {
    tx: UnboundedSender<Batch>,
}

impl Courier {
    /// Starts a courier on the current runtime (call it from inside one); it ends when every
    /// handle is dropped.
    pub fn spawn() -> Courier {
        let (tx, mut rx) = unbounded_channel::<Batch>();
        tokio::spawn(async move {
            while let Some(batch) = rx.recv().await {
                for d in batch {
                    d();
                }
            }
        });
        Courier { tx }
    }

    /// Queues `d` in this thread's outbox, for the next [`flush`].
    pub fn defer(&self, d: Delivery) {
        OUTBOX.with(|o| o.borrow_mut().push((self.tx.clone(), d)));
    }
}

/// Hands every delivery queued on this thread to its courier, one message per courier and in
/// the order they were queued; a courier whose runtime is gone has its deliveries run here.
pub fn flush() {
    let queued = OUTBOX.with(|o| std::mem::take(&mut *o.borrow_mut()));
    let mut it = queued.into_iter().peekable();
    while let Some((tx, first)) = it.next() {
        let mut batch = vec![first];
        while let Some((_, d)) = it.next_if(|(t, _)| t.same_channel(&tx)) {
            batch.push(d);
        }
        if let Err(e) = tx.send(batch) {
            e.0.into_iter().for_each(|d| d());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deliveries arrive in order, one hand-over per flush, and none is lost when the courier's
    /// runtime has ended.
    #[test]
    fn deliveries_arrive_in_order_and_survive_a_gone_runtime() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        let courier = rt.block_on(async { Courier::spawn() });
        let (tx, mut rx) = unbounded_channel::<u32>();
        for i in 0..100 {
            let tx = tx.clone();
            courier.defer(Box::new(move || {
                let _ = tx.send(i);
            }));
        }
        // Nothing moves before the flush.
        assert!(rx.try_recv().is_err());
        flush();
        let got: Vec<u32> = rt.block_on(async {
            let mut v = Vec::new();
            while v.len() < 100 {
                v.push(rx.recv().await.unwrap());
            }
            v
        });
        assert_eq!(got, (0..100).collect::<Vec<_>>());

        drop(rt);
        let tx2 = tx.clone();
        courier.defer(Box::new(move || {
            let _ = tx2.send(7);
        }));
        flush();
        assert_eq!(rx.try_recv().ok(), Some(7), "run here when the courier is gone");
    }
}
