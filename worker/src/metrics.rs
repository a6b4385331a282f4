//! Prometheus metrics of a Tandem process, named after vLLM's (`vllm:` becomes `tandem_`).
//! Every series carries the process's `model`, `role` and `worker` labels. Histograms are true
//! Prometheus histograms (bucketed), so `histogram_quantile` works on them.
//!
//! The series whose meaning matches vLLM's are also exported under vLLM's own names and label
//! (`vllm:num_requests_waiting{model_name}`, `vllm:kv_cache_usage_perc`, …): aliases rather
//! than a switch, because what reads them — the Gateway API Inference Extension's endpoint
//! picker, KEDA scalers, vLLM's Grafana dashboards — expects those names unconfigured, while
//! Tandem's own dashboards and alerts use `tandem_`; both sets together are a few dozen series
//! per process. Tandem's prefix-cache counters count blocks where vLLM's count tokens, so they
//! have no alias. [`render`] also refreshes the `process_*` metrics (Linux `/proc`).

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tandem_engine::scheduling::request_output::RequestMetrics;

use crate::snapshot::Snapshot;

/// Finish reasons of `request_success_total`, as vLLM labels them.
const FINISH_REASONS: [&str; 3] = ["stop", "length", "abort"];

/// One series under Tandem's name and under vLLM's (labelled `model_name`).
struct Both<T>(T, T);

impl Both<Counter> {
    fn new(tandem: &'static str, vllm: &'static str, model: &str) -> Self {
        Both(counter!(tandem), counter!(vllm, "model_name" => model.to_string()))
    }
    fn increment(&self, n: u64) {
        self.0.increment(n);
        self.1.increment(n);
    }
}

impl Both<Gauge> {
    fn new(tandem: &'static str, vllm: &'static str, model: &str) -> Self {
        Both(gauge!(tandem), gauge!(vllm, "model_name" => model.to_string()))
    }
    fn set(&self, v: f64) {
        self.0.set(v);
        self.1.set(v);
    }
}

impl Both<Histogram> {
    fn new(tandem: &'static str, vllm: &'static str, model: &str) -> Self {
        Both(histogram!(tandem), histogram!(vllm, "model_name" => model.to_string()))
    }
    fn record(&self, v: f64) {
        self.0.record(v);
        self.1.record(v);
    }
}

/// Handles of the series that have a vLLM alias, registered once with the recorder (the hot
/// paths then update them without a lookup).
struct Aliased {
    running: Both<Gauge>,
    waiting: Both<Gauge>,
    kv_usage: Both<Gauge>,
    /// `vllm:gpu_cache_usage_perc`, the name vLLM used before 0.10 (older pickers read it).
    kv_usage_legacy: Gauge,
    preemptions: Both<Counter>,
    spec_drafts: Both<Counter>,
    spec_draft_tokens: Both<Counter>,
    spec_accepted: Both<Counter>,
    prompt_tokens: Both<Counter>,
    generation_tokens: Both<Counter>,
    /// By [`FINISH_REASONS`].
    success: [Both<Counter>; 3],
    inter_token: Both<Histogram>,
    prompt_len: Both<Histogram>,
    ttft: Both<Histogram>,
    queue_time: Both<Histogram>,
    e2e: Both<Histogram>,
    /// Tokens computed by each engine step (`vllm:iteration_tokens_total`).
    iteration_tokens: Both<Histogram>,
    /// Wall time of each engine step (schedule, forward pass, sampling, outputs).
    step_seconds: Histogram,
    /// Each step's phases, by [`PHASES`].
    phase_seconds: [Histogram; 4],
    /// The device's time on each step, where the backend measures it.
    device_seconds: Histogram,
    /// The engine thread's time before each step, by [`BETWEEN`].
    between_seconds: [Histogram; 3],
    model: String,
}

static ALIASED: std::sync::OnceLock<Aliased> = std::sync::OnceLock::new();

impl Aliased {
    fn new(model: &str) -> Aliased {
        let success = FINISH_REASONS.map(|r| {
            Both(
                counter!("tandem_request_success_total", "finished_reason" => r),
                counter!("vllm:request_success_total", "model_name" => model.to_string(), "finished_reason" => r),
            )
        });
        Aliased {
            running: Both::<Gauge>::new(
                "tandem_num_requests_running",
                "vllm:num_requests_running",
                model,
            ),
            waiting: Both::<Gauge>::new(
                "tandem_num_requests_waiting",
                "vllm:num_requests_waiting",
                model,
            ),
            kv_usage: Both::<Gauge>::new(
                "tandem_kv_cache_usage_ratio",
                "vllm:kv_cache_usage_perc",
                model,
            ),
            kv_usage_legacy: gauge!("vllm:gpu_cache_usage_perc", "model_name" => model.to_string()),
            preemptions: Both::<Counter>::new(
                "tandem_num_preemptions_total",
                "vllm:num_preemptions_total",
                model,
            ),
            spec_drafts: Both::<Counter>::new(
                "tandem_spec_decode_num_drafts_total",
                "vllm:spec_decode_num_drafts_total",
                model,
            ),
            spec_draft_tokens: Both::<Counter>::new(
                "tandem_spec_decode_draft_tokens_total",
                "vllm:spec_decode_num_draft_tokens_total",
                model,
            ),
            spec_accepted: Both::<Counter>::new(
                "tandem_spec_decode_accepted_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_total",
                model,
            ),
            prompt_tokens: Both::<Counter>::new(
                "tandem_prompt_tokens_total",
                "vllm:prompt_tokens_total",
                model,
            ),
            generation_tokens: Both::<Counter>::new(
                "tandem_generation_tokens_total",
                "vllm:generation_tokens_total",
                model,
            ),
            success,
            inter_token: Both::<Histogram>::new(
                "tandem_inter_token_latency_seconds",
                "vllm:inter_token_latency_seconds",
                model,
            ),
            prompt_len: Both::<Histogram>::new(
                "tandem_request_prompt_tokens",
                "vllm:request_prompt_tokens",
                model,
            ),
            ttft: Both::<Histogram>::new(
                "tandem_time_to_first_token_seconds",
                "vllm:time_to_first_token_seconds",
                model,
            ),
            queue_time: Both::<Histogram>::new(
                "tandem_request_queue_time_seconds",
                "vllm:request_queue_time_seconds",
                model,
            ),
            e2e: Both::<Histogram>::new(
                "tandem_e2e_request_latency_seconds",
                "vllm:e2e_request_latency_seconds",
                model,
            ),
            iteration_tokens: Both::<Histogram>::new(
                "tandem_iteration_tokens",
                "vllm:iteration_tokens_total",
                model,
            ),
            step_seconds: histogram!("tandem_engine_step_seconds"),
            phase_seconds: PHASES.map(|p| histogram!("tandem_engine_phase_seconds", "phase" => p)),
            device_seconds: histogram!("tandem_engine_device_seconds"),
            between_seconds: BETWEEN
                .map(|p| histogram!("tandem_engine_between_steps_seconds", "part" => p)),
            model: model.to_string(),
        }
    }
}

/// The aliased series, once [`install`] has registered them for a worker (a router and a
/// process without a recorder record none).
fn aliased() -> Option<&'static Aliased> {
    ALIASED.get()
}

/// `/metrics`: the `process_*` metrics refreshed, then everything rendered.
pub fn render(handle: &PrometheusHandle) -> String {
    crate::process_metrics::refresh();
    handle.render()
}

/// Latency buckets in seconds (5 ms to 10 min).
const LATENCY_BUCKETS: [f64; 20] = [
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 600.0,
];
/// Token-count buckets.
const TOKEN_BUCKETS: [f64; 12] =
    [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0];

/// Tokens-per-step buckets (vLLM's for `iteration_tokens_total`, and 16384).
const ITERATION_BUCKETS: [f64; 14] = [
    1.0, 8.0, 16.0, 24.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// Buckets of one phase of an engine step, seconds (10 µs to 2.5 s).
const PHASE_BUCKETS: [f64; 16] = [
    0.00001, 0.00003, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064,
    0.125, 0.25, 0.5, 2.5,
];
/// Engine-step buckets in seconds (0.5 ms to 2.5 s: a GPU decode step takes a few ms).
const STEP_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.006, 0.008, 0.012, 0.016, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

/// Installs the process-wide recorder with the process's labels; returns the handle that
/// renders `/metrics`. Calling it twice in one process fails.
pub fn install(model: &str, role: &str, worker: &str) -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .add_global_label("model", model)
        .add_global_label("role", role)
        .add_global_label("worker", worker)
        .set_buckets_for_metric(Matcher::Full("tandem_engine_step_seconds".into()), &STEP_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full("tandem_engine_phase_seconds".into()),
            &PHASE_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("tandem_engine_between_steps_seconds".into()),
            &PHASE_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("tandem_engine_device_seconds".into()),
            &PHASE_BUCKETS,
        )?
        // The hand-off takes microseconds to a step or two: the latency buckets start at 5 ms.
        .set_buckets_for_metric(
            Matcher::Full("tandem_worker_handoff_seconds".into()),
            &PHASE_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("tandem_iteration_tokens".into()),
            &ITERATION_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("vllm:iteration_tokens_total".into()),
            &ITERATION_BUCKETS,
        )?
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_tokens".into()), &TOKEN_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_blocks".into()), &TOKEN_BUCKETS)?
        .install_recorder()?;
    if role != "router" {
        let _ = ALIASED.set(Aliased::new(model));
    }
    describe();
    zero_known_series(role);
    Ok(handle)
}

fn describe() {
    describe_gauge!("tandem_num_requests_running", "Sequences running on the engine.");
    describe_gauge!("tandem_num_requests_waiting", "Sequences waiting to be scheduled.");
    describe_gauge!("tandem_num_requests_swapped", "Sequences swapped to host memory.");
    describe_gauge!("tandem_kv_cache_usage_ratio", "Fraction of KV blocks in use (0-1).");
    describe_gauge!("tandem_kv_cache_free_blocks", "KV blocks free or evictable.");
    describe_gauge!("tandem_kv_cache_num_blocks", "KV blocks in the pool.");
    describe_gauge!("tandem_queued_prefill_tokens", "Prompt tokens not yet computed.");
    describe_counter!(
        "tandem_prefix_cache_queries_total",
        Unit::Count,
        "Prompt blocks looked up in the prefix cache."
    );
    describe_counter!(
        "tandem_prefix_cache_hits_total",
        Unit::Count,
        "Prompt blocks found in the prefix cache."
    );
    describe_counter!(
        "tandem_prompt_tokens_total",
        Unit::Count,
        "Prompt tokens of finished requests prefilled here (a remotely prefilled prompt counts on its prefill worker)."
    );
    describe_counter!(
        "tandem_generation_tokens_total",
        Unit::Count,
        "Tokens generated here (a remotely prefilled request's first token counts on its prefill worker)."
    );
    describe_counter!("tandem_num_preemptions_total", Unit::Count, "Sequences preempted.");
    describe_counter!(
        "tandem_request_success_total",
        Unit::Count,
        "Completions finished, by finish reason (stop, length, abort)."
    );
    describe_histogram!(
        "tandem_time_to_first_token_seconds",
        Unit::Seconds,
        "Arrival to first token."
    );
    describe_histogram!(
        "tandem_inter_token_latency_seconds",
        Unit::Seconds,
        "Time between output tokens."
    );
    describe_histogram!("tandem_e2e_request_latency_seconds", Unit::Seconds, "Arrival to finish.");
    describe_histogram!(
        "tandem_request_queue_time_seconds",
        Unit::Seconds,
        "Arrival to first schedule."
    );
    describe_histogram!(
        "tandem_request_prompt_tokens",
        Unit::Count,
        "Prompt length of finished requests."
    );
    describe_histogram!(
        "tandem_iteration_tokens",
        Unit::Count,
        "Tokens computed by each engine step (prompt and generated)."
    );
    describe_histogram!(
        "tandem_engine_step_seconds",
        Unit::Seconds,
        "Wall time of each engine step that ran the model; its sum against wall time is how busy the engine thread was."
    );
    describe_histogram!(
        "tandem_engine_phase_seconds",
        Unit::Seconds,
        "Wall time of each phase of an engine step (schedule, forward, update, outputs); the forward phase includes the device's work and the wait for its tokens, the others are host work between device passes."
    );
    describe_histogram!(
        "tandem_engine_device_seconds",
        Unit::Seconds,
        "The device's own time on each engine step (GPU: from the device reaching the step's pass to its tokens' copy); against the step's wall time it says whether steps wait for the device or for the host."
    );
    describe_histogram!(
        "tandem_engine_between_steps_seconds",
        Unit::Seconds,
        "The engine thread's time outside the steps before each step that ran the model, by part: idle (nothing to run, or waiting for remote KV or shared cores), jobs (requests added, aborts, page writes), dispatch (the outputs handed to their streams and the engine's state published)."
    );
    describe_counter!(
        "tandem_kv_transfer_bytes_total",
        Unit::Bytes,
        "KV page bytes moved between workers."
    );
    describe_histogram!("tandem_kv_transfer_seconds", Unit::Seconds, "Duration of KV transfers.");
    describe_histogram!(
        "tandem_worker_handoff_seconds",
        Unit::Seconds,
        "From a generate call's arrival at the worker until its engine thread took the prompt (it takes new requests between steps)."
    );
    describe_counter!(
        "tandem_kv_transfer_failures_total",
        Unit::Count,
        "KV transfers that failed, by reason."
    );
    describe_counter!(
        "tandem_spec_decode_num_drafts_total",
        Unit::Count,
        "Speculative verification steps."
    );
    describe_counter!(
        "tandem_spec_decode_draft_tokens_total",
        Unit::Count,
        "Draft tokens proposed."
    );
    describe_counter!(
        "tandem_spec_decode_accepted_tokens_total",
        Unit::Count,
        "Draft tokens accepted."
    );
    describe_counter!(
        "tandem_spec_decode_accepted_tokens_per_pos_total",
        Unit::Count,
        "Draft tokens accepted, by position in the draft."
    );
    describe_counter!("tandem_disagg_decisions_total", Unit::Count, "Where prompts were prefilled: remote, local_short, local_no_worker, local_n, local_no_blocks.");
}

/// Publishes the engine gauges and the counters' growth since `prev`.
pub(crate) fn publish_engine(prev: &Snapshot, s: &Snapshot) {
    gauge!("tandem_num_requests_swapped").set(s.swapped as f64);
    gauge!("tandem_kv_cache_num_blocks").set(s.num_blocks as f64);
    gauge!("tandem_kv_cache_free_blocks").set(s.free_blocks as f64);
    gauge!("tandem_queued_prefill_tokens").set(s.queued_prefill_tokens as f64);
    let d = |a: u64, b: u64| b.saturating_sub(a);
    counter!("tandem_prefix_cache_queries_total")
        .increment(d(prev.stats.prefix_cache_queries, s.stats.prefix_cache_queries));
    counter!("tandem_prefix_cache_hits_total")
        .increment(d(prev.stats.prefix_cache_hits, s.stats.prefix_cache_hits));
    for (i, (a, b)) in prev
        .stats
        .spec_accepted_per_position
        .iter()
        .zip(&s.stats.spec_accepted_per_position)
        .enumerate()
    {
        if b > a {
            counter!("tandem_spec_decode_accepted_tokens_per_pos_total", "position" => i.to_string()).increment(b - a);
        }
    }
    let Some(m) = aliased() else { return };
    m.running.set(s.running as f64);
    m.waiting.set(s.waiting as f64);
    let usage =
        if s.num_blocks == 0 { 0.0 } else { 1.0 - s.free_blocks as f64 / s.num_blocks as f64 };
    m.kv_usage.set(usage);
    m.kv_usage_legacy.set(usage);
    if prev.num_blocks != s.num_blocks || prev.block_size != s.block_size {
        gauge!("vllm:cache_config_info", "model_name" => m.model.clone(),
            "block_size" => s.block_size.to_string(), "num_gpu_blocks" => s.num_blocks.to_string())
        .set(1.0);
    }
    let (p, n) = (&prev.stats, &s.stats);
    m.preemptions.increment(d(p.num_preemptions, n.num_preemptions));
    m.spec_drafts.increment(d(p.spec_drafts, n.spec_drafts));
    m.spec_draft_tokens.increment(d(p.spec_draft_tokens, n.spec_draft_tokens));
    m.spec_accepted.increment(d(p.spec_accepted_tokens, n.spec_accepted_tokens));
}

pub(crate) fn count_generation_tokens(n: u64) {
    if let Some(m) = aliased().filter(|_| n > 0) {
        m.generation_tokens.increment(n);
    }
}

pub(crate) fn observe_inter_token(seconds: f64) {
    if let Some(m) = aliased() {
        m.inter_token.record(seconds);
    }
}

/// One engine step that computed `tokens` tokens in `seconds`.
pub(crate) fn observe_step(tokens: usize, seconds: f64) {
    if let Some(m) = aliased() {
        m.iteration_tokens.record(tokens as f64);
        m.step_seconds.record(seconds);
    }
}

/// The phases of `LLMEngine::step`, as the `phase` label names them.
const PHASES: [&str; 4] = ["schedule", "forward", "update", "outputs"];

/// The split of the engine steps since the last one recorded, by [`PHASES`].
pub(crate) fn observe_step_phases(p: &tandem_engine::llm_engine::PhaseSeconds) {
    if let Some(m) = aliased() {
        for (h, s) in m.phase_seconds.iter().zip([p.schedule, p.forward, p.update, p.outputs]) {
            h.record(s.max(0.0));
        }
        if p.device > 0.0 {
            m.device_seconds.record(p.device);
        }
    }
}

/// The parts of the engine thread's time between steps, as the `part` label names them.
const BETWEEN: [&str; 3] = ["idle", "jobs", "dispatch"];

/// The engine thread's time since the step before, by [`BETWEEN`] (recorded before each step
/// that ran the model).
pub(crate) fn observe_between_steps(idle: f64, jobs: f64, dispatch: f64) {
    if let Some(m) = aliased() {
        for (h, s) in m.between_seconds.iter().zip([idle, jobs, dispatch]) {
            h.record(s.max(0.0));
        }
    }
}

/// Counts one finished completion by its finish reason (`stop`, `length`, `abort`).
pub(crate) fn count_success(reason: &str) {
    let i = FINISH_REASONS.iter().position(|r| *r == reason).unwrap_or(2);
    if let Some(m) = aliased() {
        m.success[i].increment(1);
    }
}

/// A finished request's histograms and its prompt's tokens (`prompt_tokens` long), which count
/// as this worker's unless another worker prefilled them.
pub(crate) fn observe_finished(r: &RequestMetrics, prompt_tokens: usize) {
    let Some(m) = aliased() else { return };
    if !r.remote_prefill {
        m.prompt_tokens.increment(prompt_tokens as u64);
    }
    m.prompt_len.record(prompt_tokens as f64);
    if let Some(t) = r.ttft() {
        m.ttft.record(t);
    }
    if let Some(t) = r.queue_time() {
        m.queue_time.record(t);
    }
    if let Some(f) = r.finished_time {
        m.e2e.record(f - r.arrival_time);
    }
}

/// Starts the labelled counters a role can increment at 0, so rates and dashboards show "none
/// yet" instead of no data (a failure counter that appears only with the first failure hides
/// the failures that never happened and the ones that did alike).
fn zero_known_series(role: &str) {
    let reasons: &[&'static str] = if role == "prefill" {
        &["refused", "timeout", "send"]
    } else {
        &["connect", "rpc", "receive"]
    };
    for &r in reasons {
        counter!("tandem_kv_transfer_failures_total", "reason" => r).increment(0);
    }
    if let Some(m) = aliased() {
        for c in m.success.iter().chain([&m.prompt_tokens, &m.generation_tokens]) {
            c.increment(0);
        }
    }
    if role != "prefill" {
        for d in ["remote", "local_short", "local_no_worker", "local_n", "local_no_blocks"] {
            counter!("tandem_disagg_decisions_total", "decision" => d).increment(0);
        }
    }
}

/// Records how long a generate call waited, from its handler's start, for the engine thread to
/// take its prompt (the thread takes jobs between steps).
pub fn observe_handoff(seconds: f64) {
    histogram!("tandem_worker_handoff_seconds").record(seconds);
}

/// Counts where a prompt was prefilled.
pub fn count_disagg_decision(decision: &'static str) {
    counter!("tandem_disagg_decisions_total", "decision" => decision).increment(1);
}

/// Records a finished KV transfer.
pub fn observe_transfer(bytes: u64, seconds: f64) {
    counter!("tandem_kv_transfer_bytes_total").increment(bytes);
    histogram!("tandem_kv_transfer_seconds").record(seconds);
}

/// Counts a failed KV transfer.
pub fn count_transfer_failure(reason: &'static str) {
    counter!("tandem_kv_transfer_failures_total", "reason" => reason).increment(1);
}
