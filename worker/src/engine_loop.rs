//! `EngineHandle`: an [`LLMEngine`] driven by its own thread, as a server runs it.
//!
//! The engine is synchronous and owns the KV cache; every access goes through closures sent to
//! its thread and run between steps, so a page write, an abort and a new request never race a
//! forward pass. Each request's outputs go to the sink subscribed for it. The thread sleeps when
//! there is nothing to run and exits when the last handle is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tandem_engine::scheduling::block_manager::KvEvent;
use tandem_engine::{LLMEngine, RequestOutput};

use crate::core_share::{self, CoreShare};
use crate::metrics as m;
pub use crate::snapshot::Snapshot;
use crate::step_log::StepLog;

pub use crate::sink::{EngineEvent, Sink};

/// A request's sink and when it last heard a token (for the inter-token histogram): one map
/// entry, so each output costs one lookup.
struct Subscriber {
    sink: Sink,
    last_token: Option<Instant>,
}

/// The engine and the subscribers of its requests, as seen by closures run on its thread.
pub struct LoopState {
    /// The engine.
    pub engine: LLMEngine,
    sinks: HashMap<String, Subscriber>,
    /// When requests without a subscriber last made a token.
    last_token: HashMap<String, Instant>,
    /// A request was aborted or failed since the held outputs were checked.
    dropped_since_held: bool,
    kv_sink: Option<KvEventSink>,
    kv_seq: u64,
    /// Whether this engine sets the worker's engine gauges (the start-up model's engine; a
    /// model loaded later has its figures in `Worker.Status`).
    gauges: bool,
    /// A step's outputs go to their sinks during the next step, once its pass is launched
    /// ([`LoopState::set_dispatch_in_step`]).
    dispatch_in_step: bool,
    /// With dispatch in step, finished requests' outputs still go out at once (default;
    /// [`LoopState::set_finished_at_once`]).
    finished_at_once: bool,
}

/// Where a worker's KV events go, numbered from 1 (see [`crate::kv_events`]).
pub type KvEventSink = tokio::sync::mpsc::UnboundedSender<(u64, KvEvent)>;

impl LoopState {
    /// Numbers and hands over the engine's pending KV events; returns the last sequence number
    /// (the state the prefix cache is in now corresponds exactly to the events up to it).
    pub fn flush_kv_events(&mut self) -> u64 {
        if let Some(sink) = &self.kv_sink {
            for ev in self.engine.take_kv_events() {
                self.kv_seq += 1;
                let _ = sink.send((self.kv_seq, ev));
            }
        }
        self.kv_seq
    }

    /// Routes the events of `request_id` to `sink` until it finishes.
    pub fn subscribe(&mut self, request_id: &str, sink: Sink) {
        self.sinks.insert(request_id.to_string(), Subscriber { sink, last_token: None });
    }

    /// Fails a request: its subscriber hears `message`, and the request is aborted with its
    /// blocks freed.
    pub fn fail(&mut self, request_id: &str, message: &str) {
        if let Some(mut s) = self.sinks.remove(request_id) {
            (s.sink)(&self.engine, EngineEvent::Failed(message.to_string()));
            drop(s);
            crate::outbox::flush();
        }
        self.engine.abort_request(request_id);
        self.last_token.remove(request_id);
        self.dropped_since_held = true;
    }

    /// Aborts a request quietly (its client is gone); returns whether it was known.
    pub fn abort(&mut self, request_id: &str) -> bool {
        if self.sinks.remove(request_id).is_some() {
            // A courier's stream closes with its sink: handed over now, not at the next step.
            crate::outbox::flush();
        }
        self.last_token.remove(request_id);
        self.dropped_since_held = true;
        self.engine.abort_request(request_id) | self.engine.release_prefill(request_id)
    }

    /// Hands each step's outputs to their sinks during the next step, right after its pass is
    /// launched on a backend that overlaps steps, instead of before that step is planned: the
    /// host's path from one step's tokens to the next step's launch no longer carries them
    /// (each stream hears a token one step's planning later). Only for sinks that do not read
    /// the engine's pages (a decode worker's; a prefill worker's read a finished request's
    /// pages before the next step). `TANDEM_DISPATCH_IN_STEP=0` keeps it off.
    pub fn set_dispatch_in_step(&mut self, on: bool) {
        self.dispatch_in_step =
            on && std::env::var("TANDEM_DISPATCH_IN_STEP").as_deref() != Ok("0");
        self.finished_at_once =
            std::env::var("TANDEM_DISPATCH_FINISHED_AT_ONCE").as_deref() != Ok("0");
    }

    /// With dispatch in step on, a step's outputs that finish their requests still go out
    /// before the next step (the rest are held): a client whose stream ends sends its next
    /// request one step earlier. On by default ([`LoopState::set_dispatch_in_step`] reads
    /// `TANDEM_DISPATCH_FINISHED_AT_ONCE=0` to keep it off): on one NVIDIA H100 80GB HBM3
    /// (SmolLM2-135M shape, random Q8_0 in f16; decode and mixed-step graphs,
    /// `attention_dec_rope64`, 2-32-row stream products, cuBLAS above, device sampling; 2,048
    /// requests of 108 + 128 at 256 streams, rounds alternating on one machine) `tandem up` served 88-91 % of `bench engine`'s output tok/s in nine rounds
    /// with it against 84-89 % without (docs/gpu-runs/h100-2026-12-07-wide/, k126-k128).
    pub fn set_finished_at_once(&mut self, on: bool) {
        self.finished_at_once = on;
    }

    fn dispatch(&mut self, outs: Vec<RequestOutput>) {
        deliver(&mut self.sinks, &mut self.last_token, &self.engine, outs);
    }

    /// Fails every request with a subscriber (see [`LoopState::fail`]).
    pub fn fail_all(&mut self, message: &str) {
        let ids: Vec<String> = self.sinks.keys().cloned().collect();
        for id in ids {
            self.fail(&id, message);
        }
    }
}

/// Hands `outs` to their requests' sinks (see [`Sink`]) and counts their tokens.
fn deliver(
    sinks: &mut HashMap<String, Subscriber>,
    last_token: &mut HashMap<String, Instant>,
    engine: &LLMEngine,
    outs: Vec<RequestOutput>,
) {
    let now = Instant::now();
    for out in outs {
        let new_tokens: usize = out.outputs.iter().map(|c| c.token_ids.len()).sum();
        // A finished request's subscriber leaves the map; the others are looked up once.
        let mut removed = None;
        let mut sub = if out.finished {
            removed = sinks.remove(out.request_id.as_str());
            removed.as_mut()
        } else {
            sinks.get_mut(out.request_id.as_str())
        };
        // Each token is counted once across roles, where it was computed: a remotely
        // prefilled request's prompt and first token belong to the prefill worker's counts.
        let mut generated = new_tokens;
        if new_tokens > 0 {
            let prev = match sub.as_deref_mut() {
                Some(s) => s.last_token.replace(now),
                None if out.finished => last_token.remove(out.request_id.as_str()),
                None => last_token.insert(out.request_id.clone(), now),
            };
            match prev {
                Some(prev) => m::observe_inter_token(
                    now.duration_since(prev).as_secs_f64() / new_tokens as f64,
                ),
                None if out.metrics.remote_prefill => generated -= 1,
                None => {}
            }
        }
        m::count_generation_tokens(generated as u64);
        if out.finished {
            m::observe_finished(&out.metrics, out.prompt_token_ids.len());
            for c in &out.outputs {
                m::count_success(c.finish_reason.map_or("abort", |r| r.as_str()));
            }
            if sub.is_none() {
                last_token.remove(out.request_id.as_str());
            }
        }
        if let Some(s) = sub {
            (s.sink)(engine, EngineEvent::Output(out));
        }
        drop(removed);
    }
    // Events that courier sinks queued (see [`crate::outbox`]): handed over once for the step.
    crate::outbox::flush();
}

type Job = Box<dyn FnOnce(&mut LoopState) + Send>;

/// A cloneable handle on the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Job>,
    snapshot: Arc<Mutex<Snapshot>>,
    exited: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn spawn(engine: LLMEngine) -> EngineHandle {
        EngineHandle::spawn_with_events(engine, None, None)
    }

    /// Starts the thread of an engine that does not set the worker's engine gauges (a model
    /// loaded beside the start-up one); with `share`, its steps take turns at the cores too.
    pub fn spawn_unlisted(engine: LLMEngine, share: Option<CoreShare>) -> EngineHandle {
        EngineHandle::start(engine, None, share, false)
    }

    /// Starts the engine thread; with `kv_sink`, the engine's KV events go there; with `share`,
    /// each step holds the cores it shares with other workers (see [`CoreShare`]).
    pub fn spawn_with_events(
        engine: LLMEngine,
        kv_sink: Option<KvEventSink>,
        share: Option<CoreShare>,
    ) -> EngineHandle {
        EngineHandle::start(engine, kv_sink, share, true)
    }

    fn start(
        mut engine: LLMEngine,
        kv_sink: Option<KvEventSink>,
        share: Option<CoreShare>,
        gauges: bool,
    ) -> EngineHandle {
        let (tx, rx) = channel::<Job>();
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let snap = snapshot.clone();
        if kv_sink.is_some() {
            engine.enable_kv_events();
        }
        let mut state = LoopState {
            engine,
            sinks: HashMap::new(),
            last_token: HashMap::new(),
            dropped_since_held: false,
            kv_sink,
            kv_seq: 0,
            gauges,
            dispatch_in_step: false,
            finished_at_once: false,
        };
        publish(&mut state, &snap, false);
        let exited = Arc::new(AtomicBool::new(false));
        let done = exited.clone();
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                // A panic leaves the engine in an unknown state: fail loudly and let the
                // supervisor (tandem up, Kubernetes) restart the process.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run(&mut state, &rx, &snap, share)
                }))
                .is_err()
                {
                    tracing::error!("the engine thread panicked; exiting");
                    std::process::exit(70);
                }
                // Every handle is gone and every request finished: the engine (weights, KV
                // cache) is freed before the flag says so.
                drop(state);
                done.store(true, Ordering::Release);
            })
            .expect("spawn the engine thread");
        EngineHandle { tx, snapshot, exited }
    }

    /// Set once the engine thread has ended and dropped the engine (after the last handle is
    /// dropped and its requests finished).
    pub fn exited(&self) -> Arc<AtomicBool> {
        self.exited.clone()
    }

    /// Runs `job` on the engine thread between steps. Returns false when the thread is gone.
    pub fn submit(&self, job: impl FnOnce(&mut LoopState) + Send + 'static) -> bool {
        self.tx.send(Box::new(job)).is_ok()
    }

    /// Runs `f` on the engine thread and returns its result.
    pub async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut LoopState) -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !self.submit(move |s| {
            let _ = tx.send(f(s));
        }) {
            return None;
        }
        rx.await.ok()
    }

    /// Like [`EngineHandle::call`], blocking the calling (non-async) thread.
    pub fn call_blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut LoopState) -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = channel();
        if !self.submit(move |s| {
            let _ = tx.send(f(s));
        }) {
            return None;
        }
        rx.recv().ok()
    }

    /// The engine's state after its last step.
    pub fn snapshot(&self) -> Snapshot {
        *self.snapshot.lock().expect("snapshot lock")
    }
}

fn publish(state: &mut LoopState, snap: &Mutex<Snapshot>, failed: bool) {
    state.flush_kv_events();
    let e = &state.engine;
    let (waiting, running, swapped) = e.queue_lengths();
    let bm = e.block_manager();
    let s = Snapshot {
        waiting,
        running,
        swapped,
        num_blocks: bm.num_blocks(),
        block_size: bm.block_size(),
        free_blocks: bm.num_free_blocks(),
        queued_prefill_tokens: e.queued_prefill_tokens(),
        stats: e.stats(),
        failed,
        event_seq: state.kv_seq,
    };
    let prev = std::mem::replace(&mut *snap.lock().expect("snapshot lock"), s);
    if state.gauges {
        m::publish_engine(&prev, &s);
    }
}

/// A step (or a batch of jobs between steps) longer than this is logged at debug level:
/// streams wait for it.
const SLOW: Duration = Duration::from_millis(500);

/// Where the engine thread's time went since the step before (see
/// `tandem_engine_between_steps_seconds`).
#[derive(Default)]
struct Between {
    idle: f64,
    jobs: f64,
    dispatch: f64,
}

impl Between {
    /// Adds the time since `since` to `part` and returns now.
    fn lap(part: &mut f64, since: Instant) -> Instant {
        let now = Instant::now();
        *part += now.duration_since(since).as_secs_f64();
        now
    }
}

fn run(
    state: &mut LoopState,
    rx: &Receiver<Job>,
    snap: &Mutex<Snapshot>,
    mut share: Option<CoreShare>,
) {
    let mut failed = false;
    // The engine's phase totals at the last step recorded in the metrics.
    let mut phases = state.engine.phase_seconds();
    let mut between = Between::default();
    let mut log = if state.gauges { StepLog::from_env(&mut state.engine) } else { None };
    // With dispatch in step: the last step's outputs, handed out during the next one.
    let mut held: Vec<RequestOutput> = Vec::new();
    loop {
        let busy = state.engine.has_unfinished_requests() || state.engine.has_pending_outputs();
        let mut clock = Instant::now();
        if !busy && !held.is_empty() {
            state.dispatch(std::mem::take(&mut held));
        }
        if !busy {
            if let Some(log) = log.as_mut() {
                log.flush();
            }
            match rx.recv() {
                Ok(job) => {
                    clock = Between::lap(&mut between.idle, clock);
                    job(state)
                }
                Err(_) => return,
            }
        }
        while let Ok(job) = rx.try_recv() {
            job(state);
        }
        let jobs_ms = clock.elapsed().as_millis() as u64;
        clock = Between::lap(&mut between.jobs, clock);
        if jobs_ms > SLOW.as_millis() as u64 {
            tracing::debug!(ms = jobs_ms, "slow engine jobs (between steps)");
        }
        if state.engine.has_pending_outputs() {
            // News made between steps (a remote prefill's first token) goes out now, not
            // after the next forward pass (or, on shared cores, after another worker's step).
            // After the held outputs: a request's news stays in step order.
            let mut outs = std::mem::take(&mut held);
            outs.extend(state.engine.take_pending_outputs());
            state.dispatch(outs);
            publish(state, snap, failed);
            clock = Between::lap(&mut between.dispatch, clock);
        }
        if let Some(share) = share.as_mut() {
            // Only a step that runs the model takes the cores (not one that just waits for
            // remote KV); waiting for them, the thread keeps taking jobs.
            if !state.engine.has_model_work() {
                share.release();
            } else if !share.poll() {
                match rx.recv_timeout(core_share::POLL) {
                    Ok(job) => {
                        clock = Between::lap(&mut between.idle, clock);
                        job(state);
                        Between::lap(&mut between.jobs, clock);
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        Between::lap(&mut between.idle, clock);
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                continue;
            }
        }
        if !(state.engine.has_unfinished_requests() || state.engine.has_pending_outputs()) {
            publish(state, snap, failed);
            Between::lap(&mut between.dispatch, clock);
            continue;
        }
        let step_started = Instant::now();
        // Requests aborted since their outputs were held have no sink left to hear them.
        if std::mem::take(&mut state.dropped_since_held) {
            held.retain(|o| state.sinks.contains_key(&o.request_id));
        }
        let mut hold = Some(std::mem::take(&mut held));
        let LoopState { engine, sinks, last_token, .. } = &mut *state;
        let stepped = engine.step_with(&mut |e| {
            if let Some(outs) = hold.take().filter(|o| !o.is_empty()) {
                deliver(sinks, last_token, e, outs);
            }
        });
        if let Some(outs) = hold.take().filter(|o| !o.is_empty()) {
            // The step failed before its launch: no later than now.
            state.dispatch(outs);
        }
        if let Some(share) = share.as_mut() {
            share.release();
        }
        if step_started.elapsed() > SLOW {
            let plan = state.engine.last_schedule();
            tracing::debug!(
                ms = step_started.elapsed().as_millis() as u64,
                tokens = plan.num_batched_tokens,
                seqs = plan.scheduled.len(),
                preempted = plan.preempted.len(),
                "slow engine step"
            );
        }
        if let Some(log) = log.as_mut() {
            log.write(&mut state.engine, (between.idle, between.jobs, between.dispatch));
        }
        match stepped {
            Ok(outs) => {
                let idle = outs.is_empty() && state.engine.last_schedule().is_empty();
                let tokens = state.engine.last_schedule().num_batched_tokens;
                if state.gauges && tokens > 0 {
                    m::observe_step(tokens, step_started.elapsed().as_secs_f64());
                    let now = state.engine.phase_seconds();
                    m::observe_step_phases(&now.since(&phases));
                    phases = now;
                    let b = std::mem::take(&mut between);
                    m::observe_between_steps(b.idle, b.jobs, b.dispatch);
                }
                failed = false;
                let clock = Instant::now();
                if state.dispatch_in_step && share.is_none() && state.engine.step_in_flight() {
                    // A request appears once in a step's outputs, and nothing of it is held
                    // from before: handing its last output over now keeps its order.
                    let at_once = state.finished_at_once;
                    let (now, later): (Vec<_>, Vec<_>) =
                        outs.into_iter().partition(|o| at_once && o.finished);
                    if !now.is_empty() {
                        state.dispatch(now);
                    }
                    held = later;
                } else {
                    state.dispatch(outs);
                }
                publish(state, snap, failed);
                let clock = Between::lap(&mut between.dispatch, clock);
                if idle {
                    // Only requests waiting for remote KV: wait for news instead of spinning.
                    match rx.recv_timeout(Duration::from_millis(2)) {
                        Ok(job) => {
                            let clock = Between::lap(&mut between.idle, clock);
                            job(state);
                            Between::lap(&mut between.jobs, clock);
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            Between::lap(&mut between.idle, clock);
                        }
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "engine step failed; failing its requests");
                failed = true;
                state.fail_all(&format!("engine step failed: {e}"));
                publish(state, snap, failed);
            }
        }
    }
}
