//! Sampling where the logits are: a backend that says it samples on the device gets plain
//! requests' rows as `(temperature, seed)` and returns tokens; everything else still reaches the
//! host sampler. The device here is the CPU backend wrapped to sample with the reference
//! Gumbel-max, so the engine's plumbing is checked without a GPU (the CUDA kernel is checked
//! against the same reference on a GPU by `tandem-gpu check`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tandem_engine::backend::{BackendError, ForwardBatch, KvCacheSpec, ModelBackend, RowSampling};
use tandem_engine::model_files::tokenizer::Tokenizer;
use tandem_engine::sampling::sampler::{gumbel_max, TokenLogprob};
use tandem_engine::{
    model_files::model_fetch, CompletionOutput, EngineConfig, LLMEngine, LoadOptions, Model,
    ModelConfig, Prompt, SamplingParams,
};

/// The CPU backend, sampling "on the device" with the reference sampler; counts the rows.
/// With `launches`, it also overlaps steps: a launch computes the tokens and keeps them until
/// they are collected, and any other use of the device before that fails the test. With
/// `ahead` too, it takes deferred tokens: a second pass may be launched before the first is
/// collected, its deferred tokens taken from the first's (everything runs at once, so in
/// launch order, as on a device's stream), and counts those passes.
struct DeviceSampling {
    inner: Box<dyn ModelBackend>,
    rows: Arc<AtomicUsize>,
    /// Rows sampled under a token mask.
    masked: Arc<AtomicUsize>,
    /// Passes launched (overlapping steps), when counted.
    launches: Option<Arc<AtomicUsize>>,
    /// Passes launched with deferred tokens, when the backend takes them.
    ahead: Option<Arc<AtomicUsize>>,
    /// The launched passes' tokens, until collected (oldest first).
    launched: std::collections::VecDeque<Vec<TokenLogprob>>,
}

impl DeviceSampling {
    fn new(inner: Box<dyn ModelBackend>, rows: Arc<AtomicUsize>) -> Self {
        let masked = Arc::new(AtomicUsize::new(0));
        DeviceSampling { inner, rows, masked, launches: None, ahead: None, launched: [].into() }
    }

    /// The device is idle: nothing launched is left uncollected (a backend that takes
    /// deferred tokens queues its work after the launched passes instead).
    fn idle(&self) {
        assert!(
            self.ahead.is_some() || self.launched.is_empty(),
            "the device was used before its launched pass was collected"
        );
    }
}

impl ModelBackend for DeviceSampling {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn device(&self) -> String {
        format!("{} (sampling on the device)", self.inner.device())
    }
    fn kv_cache_spec(&self) -> KvCacheSpec {
        self.inner.kv_cache_spec()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>, BackendError> {
        self.idle();
        self.inner.forward(batch)
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn overlaps_steps(&self) -> bool {
        self.launches.is_some()
    }
    fn takes_deferred_tokens(&self) -> bool {
        self.ahead.is_some()
    }
    fn launch_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
    ) -> Result<(), BackendError> {
        self.idle();
        assert!(self.launched.len() < 2, "at most two passes launched");
        let mut batch = batch.clone();
        if !batch.deferred.is_empty() {
            let ahead = self.ahead.as_ref().expect("deferred tokens only when taken");
            ahead.fetch_add(1, Ordering::Relaxed);
            assert_eq!(self.launched.len(), 1, "deferred tokens read the one launched pass");
            let prev = &self.launched[0];
            for (tok, row) in std::mem::take(&mut batch.deferred) {
                batch.token_ids[tok as usize] = prev[row as usize].token_id;
            }
        }
        let tokens = self.forward_sampled(&batch, rows, &mut Vec::new)?;
        self.launches
            .as_ref()
            .expect("launched only when overlapping")
            .fetch_add(1, Ordering::Relaxed);
        self.launched.push_back(tokens);
        Ok(())
    }
    fn collect_sampled(&mut self) -> Result<Vec<TokenLogprob>, BackendError> {
        Ok(self.launched.pop_front().expect("a launched pass to collect"))
    }
    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
        masks: &mut dyn FnMut() -> Vec<Option<Vec<u32>>>,
    ) -> Result<Vec<TokenLogprob>, BackendError> {
        assert_eq!(rows.len(), batch.logits_indices.len());
        self.idle();
        let mut logits = self.inner.forward(batch)?;
        let masks = masks();
        assert!(masks.is_empty() || masks.len() == rows.len());
        let vocab = self.inner.config().vocab_size;
        self.rows.fetch_add(rows.len(), Ordering::Relaxed);
        // A masked row's disallowed tokens to minus infinity first (as the CUDA kernel does).
        for (row, m) in logits.chunks_exact_mut(vocab).zip(masks) {
            let Some(m) = m else { continue };
            self.masked.fetch_add(1, Ordering::Relaxed);
            for (i, l) in row.iter_mut().enumerate() {
                if (m[i / 32] >> (i % 32)) & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Ok(logits.chunks_exact(vocab).zip(rows).map(|(l, r)| gumbel_max(l, r)).collect())
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.idle();
        self.inner.copy_blocks(pairs)
    }
    fn swap_out(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.idle();
        self.inner.swap_out(pairs)
    }
    fn swap_in(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.idle();
        self.inner.swap_in(pairs)
    }
    fn num_host_blocks(&self) -> usize {
        self.inner.num_host_blocks()
    }
    fn read_block(&self, block: u32) -> Result<Vec<u8>, BackendError> {
        self.inner.read_block(block)
    }
    fn write_block(&mut self, block: u32, page: &[u8]) -> Result<(), BackendError> {
        self.idle();
        self.inner.write_block(block, page)
    }
}

fn model() -> Model {
    Model::load(&model_fetch::default_model_path().unwrap(), LoadOptions::with_kv_tokens(4096))
        .unwrap()
}

/// An engine whose backend samples on the "device", and the counter of rows it sampled.
fn device_engine() -> (LLMEngine, Arc<AtomicUsize>) {
    let mut m = model();
    let rows = Arc::new(AtomicUsize::new(0));
    m.backend = Box::new(DeviceSampling::new(m.backend, rows.clone()));
    (LLMEngine::new(m, EngineConfig::default()), rows)
}

/// Structured outputs sampled on the "device": every constrained row goes with its token mask;
/// greedy outputs equal the host sampler's, seeded ones (the device's own random stream, as for
/// free requests) are valid and reproducible, in a batch with a free request.
#[test]
fn constrained_rows_are_sampled_on_the_device_with_their_masks() {
    use tandem_engine::sampling::structured::StructuredOutput;
    let schema = StructuredOutput::Json(serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"], "additionalProperties": false
    }));
    let p = |t: f32| SamplingParams {
        temperature: t,
        seed: Some(4),
        max_tokens: 40,
        structured: Some(schema.clone()),
        ..Default::default()
    };
    let free = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let reqs = [
        ("greedy", "A person as JSON:", p(0.0)),
        ("sampled", "A person as JSON:", p(0.9)),
        ("free", "Once upon a time", free),
    ];
    let host = run(&mut LLMEngine::new(model(), EngineConfig::default()), &reqs);
    let mut m = model();
    let (rows, masked) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    m.backend = Box::new(DeviceSampling {
        masked: masked.clone(),
        ..DeviceSampling::new(m.backend, rows.clone())
    });
    let dev = run(&mut LLMEngine::new(m, EngineConfig::default()), &reqs);
    for id in ["greedy", "free"] {
        assert_eq!(host[id][0].token_ids, dev[id][0].token_ids, "{id}");
    }
    for id in ["greedy", "sampled"] {
        let v: serde_json::Value = serde_json::from_str(&dev[id][0].text).unwrap();
        assert!(v["age"].as_u64().unwrap() < 100, "{v}");
    }
    let constrained = dev["greedy"][0].token_ids.len() + dev["sampled"][0].token_ids.len();
    assert_eq!(masked.load(Ordering::Relaxed), constrained, "every constrained token had its mask");
    assert_eq!(rows.load(Ordering::Relaxed), constrained + 8);
    let (mut e, _) = device_engine();
    let again = run(&mut e, &reqs[1..2]);
    assert_eq!(again["sampled"][0].token_ids, dev["sampled"][0].token_ids, "reproducible");
}

fn run(
    e: &mut LLMEngine,
    reqs: &[(&str, &str, SamplingParams)],
) -> std::collections::HashMap<String, Vec<CompletionOutput>> {
    for (id, text, p) in reqs {
        let ids = e.tokenizer.encode(text, true).unwrap();
        e.add_request(id, Prompt::TokenIds(ids), p.clone(), None).unwrap();
    }
    let out = e.run_to_completion().unwrap();
    e.check_invariants().unwrap();
    out
}

const PROMPTS: [&str; 4] =
    ["The capital of France is", "def add(a, b):\n    return", "Once upon a time", "1, 2, 3, 4,"];

#[test]
fn greedy_on_the_device_equals_the_host_sampler() {
    let p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(12) };
    let reqs: Vec<(&str, &str, SamplingParams)> =
        PROMPTS.iter().map(|t| (*t, *t, p.clone())).collect();
    let host = run(&mut LLMEngine::new(model(), EngineConfig::default()), &reqs);
    let (mut e, rows) = device_engine();
    let dev = run(&mut e, &reqs);
    // Every token of every request was chosen on the device.
    assert_eq!(rows.load(Ordering::Relaxed), PROMPTS.len() * 12);
    for t in PROMPTS {
        let (h, d) = (&host[t][0], &dev[t][0]);
        assert_eq!(h.token_ids, d.token_ids, "{t}");
        assert_eq!(h.text, d.text);
        assert!(
            (h.cumulative_logprob - d.cumulative_logprob).abs() < 1e-3,
            "{t}: {} vs {}",
            h.cumulative_logprob,
            d.cumulative_logprob
        );
    }
}

#[test]
fn seeded_device_sampling_is_reproducible_in_any_batch() {
    let p = |seed| SamplingParams {
        temperature: 0.6,
        seed: Some(seed),
        max_tokens: 16,
        ignore_eos: true,
        ..Default::default()
    };
    let (mut e, rows) = device_engine();
    let alone = run(&mut e, &[("a", "Once upon a time", p(7))]);
    let mixed = run(
        &mut e,
        &[
            ("x", "The capital of France is", p(1)),
            ("b", "Once upon a time", p(7)),
            ("y", "Once upon a time", p(8)),
        ],
    );
    assert_eq!(alone["a"][0].token_ids, mixed["b"][0].token_ids);
    assert_ne!(mixed["b"][0].token_ids, mixed["y"][0].token_ids);
    assert_eq!(rows.load(Ordering::Relaxed), 4 * 16);
}

#[test]
fn requests_the_device_cannot_sample_reach_the_host_sampler() {
    let (mut e, rows) = device_engine();
    // Alternatives asked for: the whole row is needed on the host, for every request of a step.
    let top = SamplingParams { logprobs: Some(3), ignore_eos: true, ..SamplingParams::greedy(6) };
    let plain = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) };
    let out = run(&mut e, &[("top", "Water boils at", top), ("plain", "Water boils at", plain)]);
    assert_eq!(rows.load(Ordering::Relaxed), 0);
    assert!(out["top"][0].logprobs.iter().all(|l| l.top.len() == 3));
    assert_eq!(out["top"][0].token_ids, out["plain"][0].token_ids);
    // Penalties and n > 1 (forks off the prompt's row) stay on the host too.
    let pen =
        SamplingParams { repetition_penalty: 1.3, ignore_eos: true, ..SamplingParams::greedy(4) };
    let n2 = SamplingParams {
        n: 2,
        temperature: 0.8,
        seed: Some(3),
        ignore_eos: true,
        max_tokens: 1,
        ..Default::default()
    };
    run(&mut e, &[("pen", "Water boils at", pen), ("n2", "Water boils at", n2)]);
    assert_eq!(rows.load(Ordering::Relaxed), 0);
}

#[test]
fn filtered_sampling_runs_on_the_device_within_the_filters() {
    let (mut e, rows) = device_engine();
    // top_k = 1 and a tiny top_p keep only the most likely token: greedy's output at any seed.
    let greedy = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let k1 = SamplingParams { temperature: 1.5, top_k: 1, seed: Some(4), ..greedy.clone() };
    let p0 = SamplingParams { temperature: 1.5, top_p: 1e-6, seed: Some(5), ..greedy.clone() };
    let mp = SamplingParams {
        temperature: 0.7,
        top_k: 20,
        top_p: 0.9,
        min_p: 0.05,
        seed: Some(6),
        ..greedy.clone()
    };
    let out = run(
        &mut e,
        &[
            ("g", "The capital of France is", greedy),
            ("k1", "The capital of France is", k1),
            ("p0", "The capital of France is", p0),
            ("mp", "Once upon a time", mp),
        ],
    );
    assert_eq!(rows.load(Ordering::Relaxed), 4 * 8);
    assert_eq!(out["g"][0].token_ids, out["k1"][0].token_ids);
    assert_eq!(out["g"][0].token_ids, out["p0"][0].token_ids);
    assert_eq!(out["mp"][0].token_ids.len(), 8);
}

#[test]
fn detokenize_off_returns_the_same_tokens_without_text() {
    let (mut e, _) = device_engine();
    let on = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let off = SamplingParams { detokenize: false, ..on.clone() };
    let out = run(&mut e, &[("on", "Once upon a time", on), ("off", "Once upon a time", off)]);
    assert_eq!(out["on"][0].token_ids, out["off"][0].token_ids);
    assert!(!out["on"][0].text.is_empty());
    assert_eq!(out["off"][0].text, "");
    let stop =
        SamplingParams { detokenize: false, stop: vec!["x".into()], ..SamplingParams::greedy(4) };
    assert!(e.add_request("s", Prompt::TokenIds(vec![1, 2]), stop, None).is_err());
}

#[test]
fn a_model_without_a_tokenizer_serves_token_ids() {
    let mut m = model();
    m.tokenizer = Tokenizer::ids_only();
    let mut e = LLMEngine::new(m, EngineConfig::default());
    let err = e
        .add_request("t", Prompt::Text("hello".into()), SamplingParams::greedy(4), None)
        .unwrap_err();
    assert!(err.to_string().contains("without a tokenizer"), "{err}");
    e.add_request(
        "ids",
        Prompt::TokenIds(vec![504, 3458, 282]),
        SamplingParams { ignore_eos: true, ..SamplingParams::greedy(5) },
        None,
    )
    .unwrap();
    let out = e.run_to_completion().unwrap();
    assert_eq!(out["ids"][0].token_ids.len(), 5);
    assert_eq!(out["ids"][0].text, "");
    e.check_invariants().unwrap();
}

/// An engine whose "device" overlaps steps, and the counter of its launches.
fn overlap_engine(cfg: EngineConfig) -> (LLMEngine, Arc<AtomicUsize>) {
    let mut m = model();
    let launches = Arc::new(AtomicUsize::new(0));
    m.backend = Box::new(DeviceSampling {
        launches: Some(launches.clone()),
        ..DeviceSampling::new(m.backend, Arc::new(AtomicUsize::new(0)))
    });
    (LLMEngine::new(m, cfg), launches)
}

/// An engine whose "device" overlaps steps and takes deferred tokens (steps planned ahead),
/// with a KV cache of `kv_tokens` (and swap space); the counters of its launches and of those planned ahead.
fn ahead_engine(cfg: EngineConfig, kv_tokens: usize) -> (LLMEngine, [Arc<AtomicUsize>; 2]) {
    let mut m = Model::load(
        &model_fetch::default_model_path().unwrap(),
        LoadOptions { swap_space_bytes: 16 << 20, ..LoadOptions::with_kv_tokens(kv_tokens) },
    )
    .unwrap();
    let (launches, ahead) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    m.backend = Box::new(DeviceSampling {
        launches: Some(launches.clone()),
        ahead: Some(ahead.clone()),
        ..DeviceSampling::new(m.backend, Arc::new(AtomicUsize::new(0)))
    });
    (LLMEngine::new(m, cfg), [launches, ahead])
}

/// Steps planned and launched before the previous step's tokens reach the host choose the same
/// tokens as steps that wait for them: greedy and seeded rows, requests that end by
/// `max_tokens` (1, 2, …), by a stop string and by EOS (planned one step too far, their extra
/// row dropped), `min_tokens` (host-sampled until reached), and a request with alternatives
/// (host-sampled: its steps run after the one in flight is collected); every block given back.
#[test]
fn steps_planned_ahead_give_the_tokens_of_waiting_steps() {
    let greedy = |n| SamplingParams { ignore_eos: true, ..SamplingParams::greedy(n) };
    let seeded = SamplingParams { temperature: 0.8, seed: Some(11), ..greedy(10) };
    let stop = SamplingParams { stop: vec![",".into()], ..SamplingParams::greedy(16) };
    let min = SamplingParams { min_tokens: 3, ..greedy(6) };
    let top = SamplingParams { logprobs: Some(2), ..greedy(5) };
    let reqs = [
        ("one", PROMPTS[2], greedy(1)),
        ("two", PROMPTS[2], greedy(2)),
        ("greedy", PROMPTS[0], greedy(12)),
        ("seeded", PROMPTS[1], seeded),
        ("stop", PROMPTS[3], stop),
        (
            "eos",
            "The capital of France is Paris. The capital of Italy is",
            SamplingParams::greedy(40),
        ),
        ("min", PROMPTS[1], min),
    ];
    let waiting = EngineConfig { overlap_steps: false, ..Default::default() };
    let (mut e, _) = ahead_engine(waiting, 4096);
    let want = run(&mut e, &reqs);
    let (mut e, [launches, ahead]) = ahead_engine(EngineConfig::default(), 4096);
    let got = run(&mut e, &reqs);
    assert!(ahead.load(Ordering::Relaxed) >= 8, "decode steps were planned ahead");
    assert!(launches.load(Ordering::Relaxed) > ahead.load(Ordering::Relaxed));
    for (id, _, _) in &reqs {
        let (w, g) = (&want[*id][0], &got[*id][0]);
        assert_eq!((&w.token_ids, &w.text), (&g.token_ids, &g.text), "{id}");
        assert_eq!((w.finish_reason, &w.stop_reason), (g.finish_reason, &g.stop_reason), "{id}");
    }
    assert_eq!(got["eos"][0].finish_reason, Some(tandem_engine::FinishReason::Stop));
    let bm = e.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks(), "every block given back");
    // A host-sampled request beside planned-ahead ones.
    let mixed = run(&mut e, &[("top", PROMPTS[2], top), ("g", PROMPTS[0], greedy(12))]);
    assert_eq!(mixed["g"][0].token_ids, want["greedy"][0].token_ids);
    assert_eq!(mixed["top"][0].logprobs.len(), 5);
    let off = EngineConfig { async_scheduling: false, ..Default::default() };
    let (mut e, [_, ahead]) = ahead_engine(off, 4096);
    assert_eq!(run(&mut e, &reqs[2..3])["greedy"][0].token_ids, want["greedy"][0].token_ids);
    assert_eq!(ahead.load(Ordering::Relaxed), 0, "async scheduling off: nothing planned ahead");
}

/// Under memory pressure, steps planned ahead preempt (by recompute and by swap) sequences
/// whose token is still on the device, and still give the tokens of waiting steps.
#[test]
fn steps_planned_ahead_survive_preemption() {
    let p = |seed| SamplingParams {
        temperature: 0.7,
        seed: Some(seed),
        max_tokens: 24,
        ignore_eos: true,
        ..Default::default()
    };
    let reqs: Vec<(String, &str, SamplingParams)> =
        (0..8).map(|i| (format!("r{i}"), PROMPTS[i % 4], p(i as u64))).collect();
    let reqs: Vec<(&str, &str, SamplingParams)> =
        reqs.iter().map(|(id, t, p)| (id.as_str(), *t, p.clone())).collect();
    for mode in [
        tandem_engine::scheduling::scheduler::PreemptionMode::Recompute,
        tandem_engine::scheduling::scheduler::PreemptionMode::Swap,
    ] {
        let cfg = |overlap| {
            let mut c = EngineConfig { overlap_steps: overlap, ..Default::default() };
            c.scheduler.preemption_mode = mode;
            c
        };
        let (mut e, _) = ahead_engine(cfg(false), 160);
        let want = run(&mut e, &reqs);
        let (mut e, [_, ahead]) = ahead_engine(cfg(true), 160);
        let got = run(&mut e, &reqs);
        assert!(e.stats().num_preemptions > 0, "{mode:?}: the pool was short");
        assert!(ahead.load(Ordering::Relaxed) > 0);
        for (id, _, _) in &reqs {
            assert_eq!(want[*id][0].token_ids, got[*id][0].token_ids, "{mode:?} {id}");
        }
        let bm = e.block_manager();
        assert_eq!(bm.num_free_blocks(), bm.num_blocks(), "{mode:?}: every block given back");
    }
}

/// Overlapped steps choose the same tokens as steps that wait for them — greedy, seeded, with
/// a stop string and EOS, beside a request the host samples (whose steps cannot overlap) — and
/// give every block back.
#[test]
fn overlapped_steps_give_the_tokens_of_waiting_steps() {
    let greedy = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(10) };
    let seeded = SamplingParams { temperature: 0.8, seed: Some(11), ..greedy.clone() };
    let stop = SamplingParams { stop: vec![",".into()], ..SamplingParams::greedy(16) };
    let eos = SamplingParams::greedy(40);
    let reqs = [
        ("greedy", PROMPTS[0], greedy.clone()),
        ("seeded", PROMPTS[1], seeded),
        ("stop", PROMPTS[3], stop),
        ("eos", "The capital of France is Paris. The capital of Italy is", eos),
    ];
    let waiting = EngineConfig { overlap_steps: false, ..Default::default() };
    let (mut e, launches) = overlap_engine(waiting);
    let want = run(&mut e, &reqs);
    assert_eq!(launches.load(Ordering::Relaxed), 0, "overlap off: nothing launched");
    let (mut e, launches) = overlap_engine(EngineConfig::default());
    let got = run(&mut e, &reqs);
    assert!(launches.load(Ordering::Relaxed) >= 10, "the decode steps were launched");
    for (id, _, _) in &reqs {
        let (w, g) = (&want[*id][0], &got[*id][0]);
        assert_eq!((&w.token_ids, &w.text), (&g.token_ids, &g.text), "{id}");
        assert_eq!((w.finish_reason, &w.stop_reason), (g.finish_reason, &g.stop_reason), "{id}");
    }
    let bm = e.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks(), "every block given back");
    // A request with alternatives is sampled on the host: its steps wait, the others' still match.
    let top = SamplingParams { logprobs: Some(2), ..greedy.clone() };
    let launched = launches.load(Ordering::Relaxed);
    let mixed = run(&mut e, &[("top", PROMPTS[2], top), ("g", PROMPTS[0], greedy)]);
    assert_eq!(launches.load(Ordering::Relaxed), launched, "no step with a host row was launched");
    assert_eq!(mixed["g"][0].token_ids, want["greedy"][0].token_ids);
    assert_eq!(mixed["top"][0].logprobs.len(), 10);
}

/// With a step in flight, `step` returns the news of the step before it: the first call only
/// launches the prompt, the last only collects, and the engine stays unfinished until then.
#[test]
fn a_step_returns_the_news_of_the_step_before_it() {
    let (mut e, launches) = overlap_engine(EngineConfig::default());
    let p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(3) };
    e.add_request("r", Prompt::TokenIds(vec![504, 3458, 282, 1141]), p, None).unwrap();
    let mut news = Vec::new();
    while e.has_unfinished_requests() {
        let out = e.step().unwrap();
        news.push(out.iter().map(|o| o.outputs[0].token_ids.len()).sum::<usize>());
    }
    // Prompt + 2 decodes launched; each step's token arrives one call later.
    assert_eq!(launches.load(Ordering::Relaxed), 3);
    assert_eq!(news, vec![0, 1, 1, 1]);
    assert!(!e.has_model_work());
}

/// Aborting a request while its step runs: the step's tokens are taken first, the request ends
/// with `abort`, the others go on unchanged, and no block is left held.
#[test]
fn abort_while_a_step_is_in_flight() {
    let p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let (mut e, _) = overlap_engine(EngineConfig { zero_freed_blocks: true, ..Default::default() });
    let alone = run(&mut e, &[("b", PROMPTS[1], p.clone())]);
    for (id, text) in [("a", PROMPTS[0]), ("b", PROMPTS[1])] {
        let ids = e.tokenizer.encode(text, true).unwrap();
        e.add_request(id, Prompt::TokenIds(ids), p.clone(), None).unwrap();
    }
    // The prompts' step, then the first decode launched (the prompts' tokens come back).
    let mut b_tokens = Vec::new();
    for _ in 0..2 {
        for o in e.step().unwrap() {
            if o.request_id == "b" {
                b_tokens.extend(o.outputs[0].token_ids.iter().copied());
            }
        }
    }
    assert_eq!(b_tokens.len(), 1);
    assert!(e.abort_request("a"));
    e.check_invariants().unwrap();
    let out = e.run_to_completion().unwrap();
    assert_eq!(out["a"][0].finish_reason, Some(tandem_engine::FinishReason::Abort));
    b_tokens.extend(out["b"][0].token_ids.iter().copied());
    assert_eq!(b_tokens, alone["b"][0].token_ids);
    e.check_invariants().unwrap();
    let bm = e.block_manager();
    assert_eq!(bm.num_free_blocks(), bm.num_blocks());
}

/// Aborting a request that already ended (a server aborts every stream it drops, finished or
/// not) leaves the step in flight running: nothing is collected, the next step is still planned
/// ahead of it, and the other request's tokens are those of a run without the abort.
#[test]
fn aborting_a_finished_request_leaves_the_step_in_flight() {
    let long = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) };
    let short = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(2) };
    let (mut e, [_, ahead]) = ahead_engine(EngineConfig::default(), 4096);
    let alone = run(&mut e, &[("b", PROMPTS[1], long.clone())]);
    let planned_alone = ahead.load(Ordering::Relaxed);
    for (id, text, p) in [("a", PROMPTS[0], short), ("b", PROMPTS[1], long)] {
        let ids = e.tokenizer.encode(text, true).unwrap();
        e.add_request(id, Prompt::TokenIds(ids), p, None).unwrap();
    }
    let mut b_tokens = Vec::new();
    let mut a_done = false;
    while !a_done {
        for o in e.step().unwrap() {
            a_done |= o.request_id == "a" && o.finished;
            if o.request_id == "b" {
                b_tokens.extend(o.outputs[0].token_ids.iter().copied());
            }
        }
    }
    assert!(e.has_model_work(), "b's next step is in flight");
    let planned_before = ahead.load(Ordering::Relaxed);
    assert!(!e.abort_request("a"), "a had ended");
    assert!(!e.has_pending_outputs(), "the step in flight was not collected");
    let out = e.run_to_completion().unwrap();
    b_tokens.extend(out["b"][0].token_ids.iter().copied());
    assert_eq!(b_tokens, alone["b"][0].token_ids);
    // Every step of b after a's end was planned ahead, as without the abort.
    let planned = ahead.load(Ordering::Relaxed) - planned_before;
    assert!(
        planned + 2 >= planned_alone,
        "{planned} planned ahead after the abort, {planned_alone} alone"
    );
    e.check_invariants().unwrap();
}

/// The step records (`LLMEngine::record_steps`) account for every prompt token and decode row
/// the engine computed, and the positions each decode row attends, in the order the steps'
/// tokens came back — whether steps wait, overlap the device or are planned ahead of the step
/// in flight.
#[test]
fn step_records_count_every_prompt_token_and_decode_row() {
    let p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(9) };
    let engines = [
        (
            "waiting",
            LLMEngine::new(model(), EngineConfig { overlap_steps: false, ..Default::default() }),
        ),
        ("overlapping", overlap_engine(EngineConfig::default()).0),
        ("ahead", ahead_engine(EngineConfig::default(), 4096).0),
    ];
    for (name, mut e) in engines {
        assert!(e.take_step_records().is_empty(), "{name}: nothing recorded before it is asked");
        e.record_steps();
        let mut prompt = 0;
        for t in PROMPTS {
            let ids = e.tokenizer.encode(t, true).unwrap();
            prompt += ids.len();
            e.add_request(t, Prompt::TokenIds(ids), p.clone(), None).unwrap();
        }
        e.run_to_completion().unwrap();
        let r = e.take_step_records();
        assert_eq!(r.iter().map(|r| r.prompt_tokens).sum::<usize>(), prompt, "{name}");
        // A request's first token comes with its prompt; its other 8 are decode rows, the one
        // making token t (2..=9) attending the prompt and t - 1 tokens.
        assert_eq!(r.iter().map(|r| r.decode_rows).sum::<usize>(), PROMPTS.len() * 8, "{name}");
        let positions: usize = r.iter().map(|r| r.decode_positions).sum();
        assert_eq!(positions, 8 * prompt + PROMPTS.len() * (1..=8).sum::<usize>(), "{name}");
        assert!(r.iter().all(|r| r.launched <= r.collected && r.device.is_none()), "{name}");
        assert!(r.windows(2).all(|w| w[0].collected <= w[1].collected), "{name}");
        assert!(e.take_step_records().is_empty(), "{name}: records are taken once");
    }
}
