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
struct DeviceSampling {
    inner: Box<dyn ModelBackend>,
    rows: Arc<AtomicUsize>,
    /// Rows sampled under a token mask.
    masked: Arc<AtomicUsize>,
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
        self.inner.forward(batch)
    }
    fn samples_on_device(&self) -> bool {
        true
    }
    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch,
        rows: &[RowSampling],
        masks: &mut dyn FnMut() -> Vec<Option<Vec<u32>>>,
    ) -> Result<Vec<TokenLogprob>, BackendError> {
        assert_eq!(rows.len(), batch.logits_indices.len());
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
    Model::load(&model_fetch::default_model_path().unwrap(), LoadOptions::with_kv_tokens(4096))
        .unwrap()
}

/// An engine whose backend samples on the "device", and the counter of rows it sampled.
fn device_engine() -> (LLMEngine, Arc<AtomicUsize>) {
    let mut m = model();
    let rows = Arc::new(AtomicUsize::new(0));
    m.backend = Box::new(DeviceSampling {
        inner: m.backend,
        rows: rows.clone(),
        masked: Arc::new(AtomicUsize::new(0)),
    });
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
    m.backend =
        Box::new(DeviceSampling { inner: m.backend, rows: rows.clone(), masked: masked.clone() });
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
