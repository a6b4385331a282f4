//! The engine's host work per step with an instant device: a backend that samples "on the
//! device", overlaps steps and takes deferred tokens (as the CUDA backend does) but returns its
//! tokens at once, so a run measures scheduling, batch building, applying tokens and building
//! outputs alone. 2,048 requests of 108 + 128 tokens (`N` overrides the count) at 256 sequences
//! and 8,192 tokens a step, the served rounds' shape (docs/gpu.md). Shared by the `host_steps`
//! and `host_steps_mimalloc` examples.

use std::collections::VecDeque;
use std::time::Instant;

use tandem_engine::backend::{BackendError, ForwardBatch, KvCacheSpec, ModelBackend, RowSampling};
use tandem_engine::sampling::sampler::TokenLogprob;
use tandem_engine::scheduling::scheduler::SchedulerConfig;
use tandem_engine::{
    model_files::model_fetch, EngineConfig, LLMEngine, LoadOptions, Model, ModelConfig, Prompt,
    SamplingParams,
};

/// The default model's shape and KV layout, with passes that compute nothing.
struct InstantDevice {
    inner: Box<dyn ModelBackend>,
    launched: VecDeque<Vec<TokenLogprob>>,
}

impl ModelBackend for InstantDevice {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn device(&self) -> String {
        "instant".into()
    }
    fn kv_cache_spec(&self) -> KvCacheSpec {
        self.inner.kv_cache_spec()
    }
    fn forward(&mut self, _: &ForwardBatch) -> Result<Vec<f32>, BackendError> {
        Err(BackendError::InvalidBatch("the instant device only samples".into()))
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
        b: &ForwardBatch,
        rows: &[RowSampling],
    ) -> Result<(), BackendError> {
        // Any tokens of the vocabulary's middle (the requests ignore EOS).
        let tokens = (0..rows.len())
            .map(|i| TokenLogprob {
                token_id: 1000 + ((b.positions.len() + i) % 5000) as u32,
                logprob: -1.0,
            })
            .collect();
        self.launched.push_back(tokens);
        Ok(())
    }
    fn collect_sampled(&mut self) -> Result<Vec<TokenLogprob>, BackendError> {
        self.launched
            .pop_front()
            .ok_or_else(|| BackendError::InvalidBatch("nothing launched".into()))
    }
    fn forward_sampled(
        &mut self,
        b: &ForwardBatch,
        rows: &[RowSampling],
        _: &mut dyn FnMut() -> Vec<Option<Vec<u32>>>,
    ) -> Result<Vec<TokenLogprob>, BackendError> {
        self.launch_sampled(b, rows)?;
        self.collect_sampled()
    }
    fn copy_blocks(&mut self, _: &[(u32, u32)]) -> Result<(), BackendError> {
        Ok(())
    }
    fn swap_out(&mut self, _: &[(u32, u32)]) -> Result<(), BackendError> {
        Ok(())
    }
    fn swap_in(&mut self, _: &[(u32, u32)]) -> Result<(), BackendError> {
        Ok(())
    }
    fn num_host_blocks(&self) -> usize {
        0
    }
    fn read_block(&self, _: u32) -> Result<Vec<u8>, BackendError> {
        Err(BackendError::InvalidBatch("the instant device holds no pages".into()))
    }
    fn write_block(&mut self, _: u32, _: &[u8]) -> Result<(), BackendError> {
        Ok(())
    }
}

/// Runs the requests through an engine on the instant device and prints its host work a step.
pub fn run() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(2048);
    let path = model_fetch::default_model_path()?;
    let mut m = Model::load(&path, LoadOptions::with_kv_tokens(256 * 256))?;
    m.backend = Box::new(InstantDevice { inner: m.backend, launched: VecDeque::new() });
    let scheduler =
        SchedulerConfig { max_num_seqs: 256, max_num_batched_tokens: 8192, ..Default::default() };
    let mut e = LLMEngine::new(m, EngineConfig { scheduler, ..Default::default() });
    let params = SamplingParams {
        ignore_eos: true,
        temperature: 0.6,
        max_tokens: 128,
        ..Default::default()
    };
    let t = Instant::now();
    for i in 0..n {
        let ids = (0..108).map(|j| (1000 + (i * 131 + j * 7) % 40000) as u32).collect();
        e.add_request(&format!("r{i}"), Prompt::TokenIds(ids), params.clone(), None)?;
    }
    let added = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut steps = 0usize;
    while e.has_unfinished_requests() {
        e.step()?;
        steps += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    let p = e.stats().phase_seconds;
    let us = |s: f64| s * 1e6 / steps as f64;
    println!(
        "{n} requests added in {:.1} µs each; {steps} steps of {:.1} µs: schedule {:.1}, launch {:.1}, collect and sample {:.1}, update {:.1}, outputs {:.1} µs",
        added * 1e6 / n as f64,
        us(secs),
        us(p.schedule),
        us(p.launch),
        us(p.forward - p.launch),
        us(p.update),
        us(p.outputs),
    );
    Ok(())
}
