//! A decode worker hands a step's outputs to their streams during the next step, once that
//! step's pass is launched (`LoopState::set_dispatch_in_step`). Checked on the real default
//! model on the CPU behind a backend that launches passes and plans steps ahead as the CUDA
//! backend does: the streams hear the same tokens, in order, as with outputs handed out
//! between steps and as an offline run; each delivery comes one launch later (a finishing one
//! not, where finished outputs go out at once); a request aborted while its output is held
//! hears nothing more, and the others finish.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use tandem_engine::backend::{BackendError, ForwardBatch, KvCacheSpec, ModelBackend, RowSampling};
use tandem_engine::model_files::model_fetch::default_model_path;
use tandem_engine::sampling::sampler::{gumbel_max, TokenLogprob};
use tandem_engine::{LLMEngine, LoadOptions, Model, ModelConfig, Prompt, SamplingParams};
use tandem_worker::engine_loop::{EngineEvent, EngineHandle};

/// The CPU backend as a device that queues passes: a launch computes its tokens at once and
/// keeps them until collected; a pass launched behind an uncollected one takes its deferred
/// tokens from that one's. Counts launches.
struct Queued {
    inner: Box<dyn ModelBackend>,
    launched: VecDeque<Vec<TokenLogprob>>,
    launches: Arc<AtomicUsize>,
}

impl ModelBackend for Queued {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn device(&self) -> String {
        format!("{} (queued passes)", self.inner.device())
    }
    fn kv_cache_spec(&self) -> KvCacheSpec {
        self.inner.kv_cache_spec()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, BackendError> {
        self.inner.forward(batch)
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn overlaps_steps(&self) -> bool {
        true
    }
    fn takes_deferred_tokens(&self) -> bool {
        true
    }
    fn launch_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
    ) -> Result<(), BackendError> {
        let mut batch = batch.clone();
        for (tok, row) in std::mem::take(&mut batch.deferred) {
            let prev = self.launched.back().expect("deferred tokens read a launched pass");
            batch.token_ids[tok as usize] = prev[row as usize].token_id;
        }
        let tokens = self.forward_sampled(&batch, rows, &mut Vec::new)?;
        self.launched.push_back(tokens);
        self.launches.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn collect_sampled(&mut self) -> Result<Vec<TokenLogprob>, BackendError> {
        Ok(self.launched.pop_front().expect("a launched pass to collect"))
    }
    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
        _masks: &mut dyn FnMut() -> Vec<Option<Vec<u32>>>,
    ) -> Result<Vec<TokenLogprob>, BackendError> {
        let logits = self.inner.forward(batch)?;
        let vocab = self.inner.config().vocab_size;
        Ok(logits.chunks_exact(vocab).zip(rows).map(|(l, r)| gumbel_max(l, r)).collect())
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.inner.copy_blocks(pairs)
    }
    fn swap_out(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.inner.swap_out(pairs)
    }
    fn swap_in(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.inner.swap_in(pairs)
    }
    fn num_host_blocks(&self) -> usize {
        self.inner.num_host_blocks()
    }
    fn read_block(&self, block: u32) -> Result<Vec<u8>, BackendError> {
        self.inner.read_block(block)
    }
    fn write_block(&mut self, block: u32, page: &[u8]) -> Result<(), BackendError> {
        self.inner.write_block(block, page)
    }
}

fn model() -> Model {
    Model::load(&default_model_path().unwrap(), LoadOptions::with_kv_tokens(4096)).unwrap()
}

fn params(max_tokens: usize) -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) }
}

const PROMPTS: [(&str, &str, usize); 3] = [
    ("a", "The capital of France is", 12),
    ("b", "Once upon a time, in a small village,", 16),
    ("c", "def add(x, y):", 9),
];

/// One delivery: its new tokens, whether the request finished, launches made by then.
type Heard = (Vec<u32>, bool, usize);

/// Runs PROMPTS through an engine thread (dispatch in step `on`, finished outputs at once
/// `at_once`), aborting `abort` once it has heard two deliveries; every request's deliveries.
fn serve(on: bool, at_once: bool, abort: Option<&'static str>) -> HashMap<String, Vec<Heard>> {
    let mut m = model();
    let launches = Arc::new(AtomicUsize::new(0));
    m.backend =
        Box::new(Queued { inner: m.backend, launched: [].into(), launches: launches.clone() });
    let handle = EngineHandle::spawn(LLMEngine::new(m, Default::default()));
    handle.submit(move |s| {
        s.set_dispatch_in_step(on);
        s.set_finished_at_once(at_once);
    });
    let heard: Arc<Mutex<HashMap<String, Vec<Heard>>>> = Default::default();
    let heard_out = heard.clone();
    let (done_tx, done_rx) = mpsc::channel::<String>();
    // One job: the three requests start in the same step every time.
    let h = handle.clone();
    handle.submit(move |s| {
        for (id, prompt, n) in PROMPTS {
            let (heard, done, launches, h) =
                (heard.clone(), done_tx.clone(), launches.clone(), h.clone());
            s.engine.add_request(id, Prompt::Text(prompt.into()), params(n), None).unwrap();
            s.subscribe(
                id,
                Box::new(move |_, ev| {
                    let EngineEvent::Output(o) = ev else { panic!("{id} failed: {ev:?}") };
                    let tokens: Vec<u32> =
                        o.outputs.iter().flat_map(|c| c.token_ids.clone()).collect();
                    let mut all = heard.lock().unwrap();
                    let mine = all.entry(id.to_string()).or_default();
                    mine.push((tokens, o.finished, launches.load(Ordering::SeqCst)));
                    if o.finished {
                        let _ = done.send(id.to_string());
                    } else if Some(id) == abort && mine.len() == 2 {
                        // Between steps, like a client that hangs up.
                        let done = done.clone();
                        h.submit(move |s| {
                            assert!(s.abort(id));
                            let _ = done.send(id.to_string());
                        });
                    }
                }),
            );
        }
    });
    for _ in PROMPTS {
        done_rx.recv_timeout(Duration::from_secs(120)).expect("every request ends");
    }
    let idle = handle.call_blocking(|s| !s.engine.has_unfinished_requests()).unwrap();
    assert!(idle, "nothing left running");
    // Anything still held for the aborted request would have been delivered by now.
    std::thread::sleep(Duration::from_millis(50));
    let out = heard_out.lock().unwrap().clone();
    out
}

/// PROMPTS run together offline on the plain CPU backend: each request's tokens.
fn offline() -> HashMap<String, Vec<u32>> {
    let mut e = LLMEngine::new(model(), Default::default());
    for (id, prompt, n) in PROMPTS {
        e.add_request(id, Prompt::Text(prompt.into()), params(n), None).unwrap();
    }
    let mut out: HashMap<String, Vec<u32>> = HashMap::new();
    while e.has_unfinished_requests() {
        for o in e.step().unwrap() {
            let tokens = o.outputs.iter().flat_map(|c| c.token_ids.clone());
            out.entry(o.request_id.clone()).or_default().extend(tokens);
        }
    }
    out
}

/// `heard` carries `want`'s tokens in order and finishes once, with its last delivery.
fn assert_stream(heard: &[Heard], want: &[u32], what: &str) {
    let tokens: Vec<u32> = heard.iter().flat_map(|h| h.0.clone()).collect();
    assert_eq!(tokens, want, "{what}");
    assert_eq!(heard.iter().filter(|h| h.1).count(), 1, "{what} finishes once");
    assert!(heard.last().unwrap().1, "{what}: its last delivery finishes it");
}

/// One request's deliveries between steps (`a`) and another way (`b`), pair by pair (the same
/// steps both ways), and the launches made by `a`'s last.
fn side_by_side<'a>(
    a: &'a [Heard],
    b: &'a [Heard],
) -> (usize, impl Iterator<Item = (&'a Heard, &'a Heard)>) {
    assert_eq!(a.len(), b.len(), "{a:?} / {b:?}");
    (a.iter().map(|h| h.2).max().unwrap(), a.iter().zip(b))
}

#[test]
fn outputs_handed_out_during_the_next_step_keep_every_token_in_order() {
    let want = offline();
    let off = serve(false, false, None);
    let on = serve(true, false, None);
    for (id, _, n) in PROMPTS {
        assert_eq!(want[id].len(), n, "{id}");
        for (mode, got) in [("between steps", &off), ("in step", &on)] {
            assert_stream(&got[id], &want[id], &format!("{id}, {mode}"));
        }
        // A delivery is never earlier, and where a later step was launched at all, it comes
        // after that launch.
        let (last, pairs) = side_by_side(&off[id], &on[id]);
        for (x, y) in pairs {
            assert!(y.2 >= x.2 && (x.2 == last || y.2 > x.2), "{id}: {x:?} / {y:?}");
        }
    }
}

#[test]
fn a_request_aborted_while_its_output_is_held_hears_nothing_more() {
    let heard = serve(true, false, Some("b"));
    let b = &heard["b"];
    assert_eq!(b.len(), 2, "b hears nothing after its abort: {b:?}");
    assert!(!b.iter().any(|h| h.1), "{b:?}");
    for id in ["a", "c"] {
        assert!(heard[id].last().unwrap().1, "{id} finished");
    }
}

#[test]
fn finished_outputs_handed_out_at_once_come_before_the_next_launch() {
    let want = offline();
    let off = serve(false, false, None);
    let mixed = serve(true, true, None);
    for (id, _, _) in PROMPTS {
        assert_stream(&mixed[id], &want[id], id);
        // Finishing deliveries as between steps; the others still one launch later where a
        // later step was launched.
        let (last, pairs) = side_by_side(&off[id], &mixed[id]);
        for (x, y) in pairs {
            match y.1 {
                true => assert_eq!(y.2, x.2, "{id}: its last output at once: {x:?} / {y:?}"),
                false => assert!(x.2 == last || y.2 > x.2, "{id}: {x:?} / {y:?}"),
            }
        }
    }
}
