//! `tandem bench`: measurements of the engine on this machine.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use tandem_engine::backend::{ForwardBatch, Logits};
use tandem_engine::llm_engine::EngineStats;
use tandem_engine::sampling::sampler::argmax;
use tandem_engine::{LoadOptions, Model};

/// Benchmark subcommands.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// One stream on the bare backend: prompt processing and decode speed (llama-bench's
    /// pp/tg workloads).
    Single(SingleArgs),
    /// Offline engine throughput: many requests through LLMEngine (continuous batching).
    Engine(EngineBenchArgs),
    /// The fast path's matmuls alone, over the default model's shapes with synthetic weights.
    Kernels(KernelArgs),
    /// A serving benchmark against any OpenAI-compatible server (vllm bench serve's metrics).
    Serve(crate::bench_serve::ServeArgs),
    /// `tandem up` at saturation for a bounded time: errors, memory and KV pools over time.
    Soak(crate::bench_soak::SoakArgs),
}

/// Arguments of `tandem bench kernels`.
#[derive(Args, Debug)]
pub struct KernelArgs {
    /// Tokens per matmul (1 = single-stream decode).
    #[arg(long, default_value_t = 1)]
    pub tokens: usize,
    /// Passes over all layers.
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
}

/// Arguments of `tandem bench engine`.
#[derive(Args, Debug)]
pub struct EngineBenchArgs {
    /// Model file or directory; default: the embedded default model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Workload preset: `nano-vllm` is nano-vllm's bench.py (256 requests, input and output
    /// lengths uniform in 100..=1024, temperature 0.6); overrides the length and temperature
    /// flags.
    #[arg(long)]
    pub preset: Option<String>,
    /// Requests from a JSON file instead of drawn ones: `{"prompts": [[token ids]...],
    /// "max_tokens": [n...]}` (as `scripts/gpu/hf_baseline.py --dump-workload` writes it, so
    /// both sides run the same requests).
    #[arg(long)]
    pub workload_file: Option<PathBuf>,
    /// Sampling temperature (0 = greedy); every request ignores EOS unless `--stop-at-eos`.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Requests end at EOS (by default they ignore it and run their whole output length).
    #[arg(long)]
    pub stop_at_eos: bool,
    /// Top-p of every request (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Top-k of every request (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,
    /// Number of requests.
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,
    /// Largest prompt length (uniform in min..=max).
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Smallest prompt length.
    #[arg(long, default_value_t = 128)]
    pub min_input_len: usize,
    /// Largest output length.
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Smallest output length.
    #[arg(long, default_value_t = 128)]
    pub min_output_len: usize,
    #[command(flatten)]
    pub engine: crate::engine_args::EngineArgs,
    /// Seed of the workload.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Prompts: `random` token ids, `code` (repetitive source files to continue) or `chat`
    /// (questions through the chat template); the length flags bound the output only for the
    /// text workloads.
    #[arg(long, value_enum, default_value = "random")]
    pub workload: EngineWorkload,
    /// Skip the untimed warm-up request: the first forward passes' one-time costs are timed too.
    #[arg(long)]
    pub cold: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Hold every output to this JSON schema (a file), to measure what constrained decoding
    /// costs; requests then end where their JSON does instead of ignoring EOS.
    #[arg(long)]
    pub json_schema: Option<PathBuf>,
    /// Write every step's record to this file, one JSON object a line (launch and collection
    /// times, prompt tokens, decode rows and the KV positions they attend, device seconds).
    #[arg(long)]
    pub steps_out: Option<PathBuf>,
}

/// Prompt sets of `tandem bench engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineWorkload {
    /// Random token ids.
    Random,
    /// Source code with repeated structure.
    Code,
    /// Free-form chat questions.
    Chat,
}

const CODE_ITEMS: [&str; 8] =
    ["width", "height", "depth", "weight", "color", "price", "owner", "label"];
const CHAT_TOPICS: [&str; 8] = [
    "why the sky is blue",
    "how bread rises",
    "the history of the bicycle",
    "how vaccines work",
    "what makes a good story",
    "how tides happen",
    "the rules of chess",
    "how to learn a new language",
];

/// The `i`-th prompt text of a text workload.
fn workload_text(w: EngineWorkload, i: usize) -> String {
    match w {
        EngineWorkload::Code => {
            let class = format!("Item{i}");
            let mut s = format!("class {class}:\n    def __init__(self):\n");
            for f in CODE_ITEMS {
                s.push_str(&format!("        self._{f} = None\n"));
            }
            for f in &CODE_ITEMS[..3 + i % 4] {
                s.push_str(&format!("\n    def get_{f}(self):\n        return self._{f}\n\n    def set_{f}(self, value):\n        self._{f} = value\n"));
            }
            s
        }
        EngineWorkload::Chat | EngineWorkload::Random => {
            format!("Explain {} in a few paragraphs.", CHAT_TOPICS[i % CHAT_TOPICS.len()])
        }
    }
}
#[derive(Args, Debug)]
pub struct SingleArgs {
    /// CPU kernels.
    #[arg(long, value_enum, default_value = "fast")]
    pub kernel: crate::engine_args::KernelArg,
    /// Model file or directory; default: the embedded default model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens decoded after the prompt.
    #[arg(long, default_value_t = 128)]
    pub decode_tokens: usize,
    /// Repetitions; the mean is reported (and the best).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Decode after the prompt (context grows from `--prompt-tokens`) instead of from a
    /// one-token context.
    #[arg(long)]
    pub decode_after_prompt: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Runs a benchmark.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Single(a) => single(a),
        BenchCommand::Engine(a) => engine(a),
        BenchCommand::Kernels(a) => kernels(a),
        BenchCommand::Serve(a) => crate::bench_serve::run(a),
        BenchCommand::Soak(a) => crate::bench_soak::run(a),
    }
}

fn kernels(a: KernelArgs) -> Result<()> {
    use std::sync::Arc;
    use tandem_engine::backend::cpu::linear::{Linear, QuantLinear};
    use tandem_engine::backend::cpu::quant::{QKernel, QMatrix};
    use tandem_engine::model_files::dtype::GgmlType;
    let mut rng = tandem_engine::sampling::sampler::Rng::new(1);
    let mut mat = |ty: GgmlType, n: usize, k: usize| {
        let bytes: Vec<u8> = (0..ty.bytes_for(n * k))
            .map(|i| if i % ty.block_bytes() < 4 { 0x20 } else { rng.next_u64() as u8 })
            .collect();
        QuantLinear::new(
            Arc::new(QMatrix::from_gguf(ty, &bytes, n, k).expect("valid blocks")),
            QKernel::detect(),
        )
    };
    // SmolLM2-135M: 30 x (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536) + head 49152x576.
    let mut layers = Vec::new();
    for _ in 0..30 {
        layers.push(mat(GgmlType::Q4_1, 960, 576));
        layers.push(mat(GgmlType::Q4_1, 576, 576));
        layers.push(mat(GgmlType::Q4_1, 3072, 576));
        layers.push(mat(GgmlType::Q4_1, 576, 1536));
    }
    let head = mat(GgmlType::Q8_0, 49152, 576);
    let t = a.tokens;
    let x: Vec<f32> = (0..t * 1536).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut out = vec![0f32; t * 49152];
    let run = |out: &mut [f32]| {
        for l in &layers {
            l.forward(&x[..t * l.in_features()], t, &mut out[..t * l.out_features()]);
        }
        head.forward(&x[..t * 576], t, out);
    };
    run(&mut out);
    let start = Instant::now();
    for _ in 0..a.iters {
        run(&mut out);
    }
    let secs = start.elapsed().as_secs_f64();
    let threads = cpu_threads();
    println!(
        "kernel {:?}, threads {threads}, tokens {t}: {:.1} tok/s (matmuls only)",
        QKernel::detect(),
        (a.iters * t) as f64 / secs
    );
    Ok(())
}

/// Requests of a workload file: each prompt's token ids (checked against the vocabulary) and its
/// output length.
fn workload_file(path: &std::path::Path, vocab: u64) -> Result<Vec<(Vec<u32>, usize)>> {
    #[derive(serde::Deserialize)]
    struct Workload {
        prompts: Vec<Vec<u32>>,
        max_tokens: Vec<usize>,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let w: Workload = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a workload file", path.display()))?;
    anyhow::ensure!(
        w.prompts.len() == w.max_tokens.len(),
        "{}: {} prompts but {} max_tokens",
        path.display(),
        w.prompts.len(),
        w.max_tokens.len()
    );
    anyhow::ensure!(
        w.prompts.iter().flatten().all(|&t| (t as u64) < vocab),
        "{}: a token id is outside the vocabulary of {vocab}",
        path.display()
    );
    Ok(w.prompts.into_iter().zip(w.max_tokens).collect())
}

fn engine(a: EngineBenchArgs) -> Result<()> {
    use tandem_engine::{Prompt, SamplingParams};
    let mut a = a;
    if let Some(p) = a.preset.as_deref() {
        match p {
            "nano-vllm" => {
                a.num_prompts = 256;
                (a.min_input_len, a.input_len, a.min_output_len, a.output_len) =
                    (100, 1024, 100, 1024);
                a.temperature = 0.6;
            }
            other => anyhow::bail!("unknown preset '{other}' (known: nano-vllm)"),
        }
    }
    anyhow::ensure!(
        a.min_input_len >= 1 && a.min_input_len <= a.input_len,
        "need 1 <= --min-input-len <= --input-len"
    );
    anyhow::ensure!(
        a.min_output_len >= 1 && a.min_output_len <= a.output_len,
        "need 1 <= --min-output-len <= --output-len"
    );
    let path = crate::generate_cmd::model_path(a.model.clone())?;
    let model = a.engine.load_model(&path)?;
    let vocab = model.config.vocab_size as u64;
    let has_template = model.chat_template.is_some();
    let texts: Vec<Vec<u32>> = match a.workload {
        EngineWorkload::Random => Vec::new(),
        w => (0..a.num_prompts)
            .map(|i| {
                let t = workload_text(w, i);
                let t = if w == EngineWorkload::Chat && has_template {
                    model
                        .apply_chat_template(&[tandem_engine::ChatMessage::new("user", &t)])
                        .unwrap_or(t)
                } else {
                    t
                };
                model.tokenizer.encode(&t, true).map_err(anyhow::Error::from)
            })
            .collect::<Result<_>>()?,
    };
    // The workload's HBM bound on one GPU ([`HbmBound`]): the copy bandwidth measured before
    // the engine's KV pool takes the memory.
    let one_gpu = a.engine.device == crate::engine_args::DeviceArg::Cuda
        && a.engine.tensor_parallel_size == 1;
    let copy_bw = match one_gpu {
        true => Some(tandem_cuda::bench::copy_bandwidth(a.engine.cuda_device)?),
        false => None,
    };
    let weight_bytes = 2 * tandem_cuda::bench::linear_params(&model.config);
    let mut engine = a.engine.build_engine(model)?;
    // One short request first, untimed: the first forward passes pay once for what a server
    // pays at start-up (GPU modules loaded on first launch, cuBLAS workspaces and heuristics,
    // first touches of memory), which made one 128-token prompt's prefill read ~150 ms on an
    // H100 whose served time to first token was 6 ms.
    if !a.cold {
        warm_up(&mut engine, vocab)?;
    }
    let base = engine.stats();
    engine.record_steps();
    let recording = std::time::SystemTime::now();
    let mut rng = tandem_engine::sampling::sampler::Rng::new(a.seed);
    let mut pick = |lo: usize, hi: usize| lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize;
    let mut total_in = 0;
    let mut reqs = Vec::new();
    if let Some(f) = &a.workload_file {
        reqs = workload_file(f, vocab)?;
        a.num_prompts = reqs.len();
        total_in = reqs.iter().map(|r| r.0.len()).sum();
    }
    for i in reqs.len()..a.num_prompts {
        let (li, lo) = (pick(a.min_input_len, a.input_len), pick(a.min_output_len, a.output_len));
        let ids: Vec<u32> = match texts.get(i) {
            Some(t) => t.clone(),
            None => (0..li as u64)
                .map(|j| ((i as u64 * 7919 + j * 104_729) % (vocab - 200) + 100) as u32)
                .collect(),
        };
        let li = ids.len();
        total_in += li;
        reqs.push((ids, lo));
    }
    let structured = match &a.json_schema {
        Some(f) => Some(tandem_engine::sampling::structured::StructuredOutput::Json(
            serde_json::from_str(&std::fs::read_to_string(f)?)?,
        )),
        None => None,
    };
    let prompt_lens: Vec<usize> = reqs.iter().map(|r| r.0.len()).collect();
    let request_id = |i: usize| format!("b{i}");
    for (i, (ids, lo)) in reqs.into_iter().enumerate() {
        let params = SamplingParams {
            ignore_eos: structured.is_none() && !a.stop_at_eos,
            structured: structured.clone(),
            temperature: a.temperature,
            top_p: a.top_p,
            top_k: a.top_k,
            seed: Some(a.seed ^ i as u64),
            ..SamplingParams::greedy(lo)
        };
        engine.add_request(&request_id(i), Prompt::TokenIds(ids), params, None)?;
    }
    let bar = indicatif::ProgressBar::new(a.num_prompts as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    tandem_engine::backend::cpu::profile::reset();
    let t = Instant::now();
    let mut generated = 0usize;
    let mut started = std::collections::HashSet::new();
    // When every request has its first token: the end of the prefill phase.
    let mut prefill_done: Option<(f64, usize)> = None;
    let page_bytes = engine.kv_cache_spec().pool_bytes_per_block;
    let mut peak_pages = 0;
    // Every request's tokens, for the digest that tells two runs' outputs apart.
    let mut tokens: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    while engine.has_unfinished_requests() {
        for out in engine.step()? {
            generated += out.outputs.iter().map(|o| o.token_ids.len()).sum::<usize>();
            let new = out.outputs.iter().flat_map(|o| o.token_ids.iter().copied());
            match tokens.get_mut(&out.request_id) {
                Some(ids) => ids.extend(new),
                None => drop(tokens.insert(out.request_id.clone(), new.collect())),
            }
            if !out.outputs.is_empty() {
                started.insert(out.request_id.clone());
            }
            if out.finished {
                bar.inc(1);
            }
        }
        let bm = engine.block_manager();
        peak_pages = peak_pages.max(bm.num_blocks() - bm.num_free_blocks());
        if prefill_done.is_none() && started.len() == a.num_prompts {
            prefill_done = Some((t.elapsed().as_secs_f64(), generated));
        }
        bar.set_message(format!("{:.1} out tok/s", generated as f64 / t.elapsed().as_secs_f64()));
    }
    bar.finish_and_clear();
    let secs = t.elapsed().as_secs_f64();
    print_profile("engine", secs);
    let stats = since(engine.stats(), base);
    let records = engine.take_step_records();
    if let Some(path) = tandem_worker::step_log::path_from_env() {
        tandem_worker::step_log::write_records(&path, recording, &records)
            .with_context(|| format!("writing the step log {}", path.display()))?;
    }
    let rss = peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64;
    // KV the sequences held at most (pages in use × page bytes), and the pool's size.
    let mib = |pages: usize| (pages * page_bytes) as f64 / (1 << 20) as f64;
    let (peak_kv, pool_kv) = (mib(peak_pages), mib(engine.block_manager().num_blocks()));
    let (pf_s, pf_gen) = prefill_done.unwrap_or((secs, generated));
    let decode_tps = if secs > pf_s { (generated - pf_gen) as f64 / (secs - pf_s) } else { 0.0 };
    let digest = outputs_digest(&tokens);
    let spec = engine.kv_cache_spec();
    let bound = copy_bw.filter(|_| engine.kv_groups().num_groups() == 1).map(|bw| {
        let out_lens =
            (0..prompt_lens.len()).map(|i| tokens.get(&request_id(i)).map_or(0, Vec::len));
        HbmBound::new(
            bw,
            (weight_bytes, stats.steps),
            spec.pool_bytes_per_block / spec.block_size.max(1),
            prompt_lens.iter().copied().zip(out_lens),
        )
    });
    let kinds = crate::bench_steps::classes(
        &records,
        bound.map(|b| crate::bench_steps::BoundRate {
            bytes_per_s: b.bytes_per_s,
            weight_bytes: weight_bytes as f64,
            kv_per_position: (spec.pool_bytes_per_block / spec.block_size.max(1)) as f64,
        }),
    );
    if let Some(f) = &a.steps_out {
        let mut text = String::new();
        for r in &records {
            text += &serde_json::to_string(r)?;
            text.push('\n');
        }
        std::fs::write(f, text)?;
    }
    // Tokens generated: the requested lengths unless requests end early (EOS, a schema's end).
    let total_out = generated;
    let report = serde_json::json!({
        "prefill_seconds": pf_s, "decode_seconds": secs - pf_s, "decode_tok_per_s": decode_tps,
        "prefill_tok_per_s": total_in as f64 / pf_s,
        "model": path.display().to_string(), "requests": a.num_prompts, "input_tokens": total_in, "output_tokens": total_out,
        "seconds": secs, "output_tok_per_s": total_out as f64 / secs, "total_tok_per_s": (total_in + total_out) as f64 / secs,
        "peak_kv_mib": peak_kv, "kv_pool_mib": pool_kv, "kv_groups": engine.kv_groups().num_groups(),
        "requests_per_s": a.num_prompts as f64 / secs, "temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k, "preemptions": stats.num_preemptions, "steps": stats.steps, "peak_rss_mib": rss,
        "workload": format!("{:?}", a.workload).to_lowercase(), "spec_drafts": stats.spec_drafts, "spec_draft_tokens": stats.spec_draft_tokens,
        "spec_accepted_tokens": stats.spec_accepted_tokens,
        "spec_acceptance_rate": if stats.spec_draft_tokens > 0 { stats.spec_accepted_tokens as f64 / stats.spec_draft_tokens as f64 } else { 0.0 },
        "spec_accepted_per_position": stats.spec_accepted_per_position,
        "phase_seconds": { "schedule": stats.phase_seconds.schedule, "forward": stats.phase_seconds.forward,
            "update": stats.phase_seconds.update, "outputs": stats.phase_seconds.outputs,
            "device": stats.phase_seconds.device, "launch": stats.phase_seconds.launch },
        "generated_tokens": generated, "outputs_digest": format!("{digest:016x}"), "json_schema": a.json_schema.as_ref().map(|p| p.display().to_string()),
        "copy_bytes_per_s": bound.map(|b| b.bytes_per_s),
        "hbm_bound_tok_per_s": bound.map(|b| b.tok_per_s(total_out)),
        "hbm_bound_fraction": bound.map(|b| b.share(total_out, secs)),
        "step_kinds": crate::bench_steps::json(&kinds),
    });
    if a.json {
        println!("{report}");
    } else {
        println!("requests         {}", a.num_prompts);
        println!("input tokens     {total_in}");
        println!("output tokens    {total_out}");
        println!("time             {secs:.2} s");
        println!(
            "throughput       {:.1} output tok/s, {:.1} total tok/s, {:.2} req/s",
            total_out as f64 / secs,
            (total_in + total_out) as f64 / secs,
            a.num_prompts as f64 / secs
        );
        println!("prefill phase    {pf_s:.2} s ({:.1} prompt tok/s)", total_in as f64 / pf_s);
        println!("decode phase     {:.2} s ({decode_tps:.1} tok/s)", secs - pf_s);
        println!("steps            {} ({} preemptions)", stats.steps, stats.num_preemptions);
        println!("outputs digest   {digest:016x} (of every request's tokens)");
        if let Some(b) = bound {
            let bound = b.tok_per_s(total_out);
            println!(
                "HBM bound        {bound:.1} output tok/s: {:.1} GB of weights (once a step) + {:.1} GB of KV (each decode token's context) at the device's copy bandwidth, {:.0} GB/s; this run {:.1} % of it",
                b.weight_bytes / 1e9,
                b.kv_bytes / 1e9,
                b.bytes_per_s / 1e9,
                100.0 * b.share(total_out, secs)
            );
        }
        let (p, n) = (stats.phase_seconds, stats.steps.max(1) as f64);
        let us = |s: f64| s / n * 1e6;
        println!(
            "per step         schedule {:.0} µs, forward and sampling {:.0} µs, update {:.0} µs, outputs {:.0} µs",
            us(p.schedule), us(p.forward), us(p.update), us(p.outputs)
        );
        if p.device > 0.0 {
            println!(
                "device           {:.0} µs a step on the device ({:.0} % of the run)",
                us(p.device),
                100.0 * p.device / secs
            );
        }
        if p.launch > 0.0 {
            let parts = engine.backend_host_seconds();
            let parts: Vec<String> =
                parts.iter().map(|(k, s)| format!("{k} {:.0}", us(*s))).collect();
            println!(
                "launch           {:.0} µs a step of forward (backend: {} µs)",
                us(p.launch),
                parts.join(", ")
            );
        }
        println!("steps by kind    (wall: the time a step added to the run; bound: weights + decode KV at the copy bandwidth)");
        for l in crate::bench_steps::lines(&kinds) {
            println!("{l}");
        }
        println!("peak RSS         {rss:.0} MiB");
        println!(
            "peak KV held     {peak_kv:.1} MiB of a {pool_kv:.0} MiB pool ({} KV groups)",
            engine.kv_groups().num_groups()
        );
    }
    Ok(())
}

/// What a run's decode steps must read from GPU memory at least, and how fast that could go:
/// the linear layers' 16-bit weights once a step (and the LM head), and for every token a
/// decode step makes, the KV of its context (prompt and the tokens before it; the first
/// token comes from the prefill), at the device's copy bandwidth. The prefill's arithmetic and
/// the logits are not in it, so it bounds the run from above. On one GPU with one KV group.
#[derive(Debug, Clone, Copy)]
struct HbmBound {
    /// Device copy bandwidth, bytes read plus written per second.
    bytes_per_s: f64,
    /// Weight bytes over the run's steps.
    weight_bytes: f64,
    /// KV bytes the decode tokens read.
    kv_bytes: f64,
}

impl HbmBound {
    /// From the copy bandwidth, (weight bytes a step, steps), the KV bytes of one position (all
    /// layers), and each request's (prompt tokens, output tokens).
    fn new(
        bytes_per_s: f64,
        (weights, steps): (u64, u64),
        kv_per_position: usize,
        requests: impl Iterator<Item = (usize, usize)>,
    ) -> Self {
        // Output token t >= 1 of a prompt of p reads p + t positions.
        let positions: usize = requests.map(|(p, n)| (1..n).map(|t| p + t).sum::<usize>()).sum();
        HbmBound {
            bytes_per_s,
            weight_bytes: weights as f64 * steps as f64,
            kv_bytes: (positions * kv_per_position) as f64,
        }
    }

    /// Output tokens a second the bytes allow, for a run of `out` output tokens.
    fn tok_per_s(&self, out: usize) -> f64 {
        out as f64 / ((self.weight_bytes + self.kv_bytes) / self.bytes_per_s)
    }

    /// The share of the bound a run of `out` output tokens in `secs` seconds reached.
    fn share(&self, out: usize, secs: f64) -> f64 {
        out as f64 / secs / self.tok_per_s(out)
    }
}

/// The standard hasher's digest of every request's id and tokens, in id order: equal digests,
/// equal outputs (runs of one binary on the same seeded workload compare with it, e.g. with and
/// without `--no-step-overlap`).
fn outputs_digest(tokens: &std::collections::BTreeMap<String, Vec<u32>>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    tokens.hash(&mut h);
    h.finish()
}

/// With `TANDEM_CPU_PROFILE=1`: the CPU backend's time per operation over the last `secs`
/// seconds of `phase`, on standard error.
fn print_profile(phase: &str, secs: f64) {
    if let Some(p) = tandem_engine::backend::cpu::profile::report() {
        eprintln!("cpu profile {phase} ({secs:.4} s wall): {p}");
    }
}

fn single(a: SingleArgs) -> Result<()> {
    let path = crate::generate_cmd::model_path(a.model)?;
    let total = a.prompt_tokens + a.decode_tokens;
    let t0 = Instant::now();
    let mut model = Model::load(
        &path,
        LoadOptions { kernel: a.kernel.path(), ..LoadOptions::with_kv_tokens(total) },
    )?;
    let load_s = t0.elapsed().as_secs_f64();
    let spec = model.backend.kv_cache_spec();
    // Every page in order: logical block i's page of KV group g is page i * groups + g.
    let groups = model.backend.kv_groups().num_groups();
    let table: Vec<u32> = (0..spec.num_blocks as u32).collect();
    let vocab = model.config.vocab_size as u32;
    // A deterministic pseudo-random prompt of ordinary tokens.
    let prompt: Vec<u32> = (0..a.prompt_tokens as u64)
        .map(|i| ((i * 2654435761 + 17) % (vocab as u64 - 100) + 100) as u32)
        .collect();
    // Mean over repetitions, as llama-bench reports (`*_best` fields carry the maxima).
    let (mut best_pp, mut best_tg) = (0f64, 0f64);
    let (mut sum_pp, mut sum_tg) = (0f64, 0f64);
    for _ in 0..a.repeat.max(1) {
        let mut b = ForwardBatch::with_kv_groups(groups);
        b.push_seq(&prompt, 0, &table, spec.block_size, Logits::Last);
        let t = Instant::now();
        tandem_engine::backend::cpu::profile::reset();
        let logits = model.backend.forward(&b)?;
        let pp = a.prompt_tokens as f64 / t.elapsed().as_secs_f64();
        print_profile("prompt", t.elapsed().as_secs_f64());
        best_pp = best_pp.max(pp);
        sum_pp += pp;
        // Generation is measured on its own from a one-token context, as llama-bench's tg test
        // does (`--decode-after-prompt` measures it after the prompt instead).
        let mut next = argmax(&logits);
        let start = if a.decode_after_prompt { a.prompt_tokens } else { 0 };
        if !a.decode_after_prompt {
            let mut b = ForwardBatch::with_kv_groups(groups);
            b.push_seq(&prompt[..1], 0, &table, spec.block_size, Logits::Last);
            next = argmax(&model.backend.forward(&b)?);
        }
        tandem_engine::backend::cpu::profile::reset();
        let t = Instant::now();
        for i in 0..a.decode_tokens {
            let mut b = ForwardBatch::with_kv_groups(groups);
            b.push_seq(&[next], start.max(1) + i, &table, spec.block_size, Logits::Last);
            next = argmax(&model.backend.forward(&b)?);
        }
        let tg = a.decode_tokens as f64 / t.elapsed().as_secs_f64();
        print_profile("decode", t.elapsed().as_secs_f64());
        best_tg = best_tg.max(tg);
        sum_tg += tg;
    }
    let reps = a.repeat.max(1) as f64;
    let (mean_pp, mean_tg) = (sum_pp / reps, sum_tg / reps);
    let rss = peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"model": path.display().to_string(), "kernel": format!("{:?}", a.kernel), "prompt_tokens": a.prompt_tokens,
                "decode_tokens": a.decode_tokens, "prompt_tok_per_s": mean_pp, "decode_tok_per_s": mean_tg,
                "prompt_tok_per_s_best": best_pp, "decode_tok_per_s_best": best_tg, "repeat": a.repeat,
                "load_s": load_s, "peak_rss_mib": rss, "threads": cpu_threads()})
        );
    } else {
        println!("model            {}", path.display());
        println!("threads          {}", cpu_threads());
        println!("load             {load_s:.2} s");
        println!("prompt ({:>4} tok) {mean_pp:.1} tok/s (best {best_pp:.1})", a.prompt_tokens);
        println!("decode ({:>4} tok) {mean_tg:.1} tok/s (best {best_tg:.1})", a.decode_tokens);
        println!("peak RSS         {rss:.0} MiB");
    }
    Ok(())
}

/// Threads of the CPU backend's pool (`TANDEM_NUM_THREADS`, else one per core).
fn cpu_threads() -> usize {
    tandem_engine::backend::cpu::pool::ThreadPool::global().num_threads()
}

/// Runs one 64-token prompt for 4 tokens through `engine` (tokens unlike any benchmark prompt's,
/// so no prefix is cached for them).
fn warm_up(engine: &mut tandem_engine::LLMEngine, vocab: u64) -> Result<()> {
    use tandem_engine::{Prompt, SamplingParams};
    let ids: Vec<u32> = (0..64u64).map(|j| ((j * 37 + 11) % (vocab.max(100) - 1)) as u32).collect();
    engine.add_request("warm-up", Prompt::TokenIds(ids), SamplingParams::greedy(4), None)?;
    while engine.has_unfinished_requests() {
        engine.step()?;
    }
    Ok(())
}

/// The counters of `now` since `base`.
fn since(now: EngineStats, base: EngineStats) -> EngineStats {
    let mut per_position = now.spec_accepted_per_position;
    for (p, b) in per_position.iter_mut().zip(base.spec_accepted_per_position) {
        *p -= b;
    }
    EngineStats {
        steps: now.steps - base.steps,
        prefill_tokens_computed: now.prefill_tokens_computed - base.prefill_tokens_computed,
        generation_tokens: now.generation_tokens - base.generation_tokens,
        num_preemptions: now.num_preemptions - base.num_preemptions,
        prefix_cache_queries: now.prefix_cache_queries - base.prefix_cache_queries,
        prefix_cache_hits: now.prefix_cache_hits - base.prefix_cache_hits,
        spec_drafts: now.spec_drafts - base.spec_drafts,
        spec_draft_tokens: now.spec_draft_tokens - base.spec_draft_tokens,
        spec_accepted_tokens: now.spec_accepted_tokens - base.spec_accepted_tokens,
        spec_accepted_per_position: per_position,
        phase_seconds: now.phase_seconds.since(&base.phase_seconds),
    }
}

#[cfg(test)]
mod tests {
    use super::HbmBound;

    #[test]
    fn hbm_bound_counts_weights_per_step_and_each_decode_tokens_context() {
        // A prompt of 100 and 3 output tokens: the 2nd reads 101 positions, the 3rd 102; a
        // request of one token (prefill only) reads none.
        let b = HbmBound::new(446.0, (10, 4), 2, [(100, 3), (50, 1)].into_iter());
        assert_eq!(b.weight_bytes, 40.0);
        assert_eq!(b.kv_bytes, 406.0);
        // 446 bytes at 446 B/s: one second for the run's 4 output tokens.
        assert_eq!(b.tok_per_s(4), 4.0);
        // The same 4 tokens in 2 s: half the bound.
        assert_eq!(b.share(4, 2.0), 0.5);
    }
}
