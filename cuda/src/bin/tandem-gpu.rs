//! `tandem-gpu`: the CUDA backend's checks and benchmarks, run on a machine with an NVIDIA GPU
//! (scripts/gpu/run.sh builds it and runs every section).
//!
//! ```text
//! tandem-gpu info
//! tandem-gpu check [bf16|f16]             every kernel against the CPU exact path
//! tandem-gpu e2e MODEL.gguf [f16|bf16] [TOL_NATS]   the real model against the CPU exact path
//! tandem-gpu windows MODEL...             sliding-window models through the engine, with and
//!                                         without KV groups (pages given back past the window)
//! tandem-gpu bench-decode CONFIG.json [BATCHES] [CONTEXT] [TP]   e.g. 1,16,64,256 1024 (TP: GPUs 0..TP)
//! tandem-gpu bench-prefill CONFIG.json [PROMPTS] [LEN] [TP]      e.g. 4 2048
//! tandem-gpu bench-mixed CONFIG.json [DECODE] [CONTEXT] [CHUNKS] [DTYPE]  e.g. 256 100-300 2x108
//!                                         steps with prompt chunks: eager vs mixed-step graph
//! tandem-gpu step CONFIG.json BATCH [CONTEXT]   one decode step's graph, for a profiler
//!                                         (scripts/gpu/step_kernels.py: time per kernel)
//! tandem-gpu tp-check MODEL|CONFIG.json [TP] [PROMPTS] [STEPS]  TP GPUs against one, greedy (bf16)
//! tandem-gpu bench-pages CONFIG.json [COUNTS] [CHUNK] [CTAS] [STAGES]  e.g. 1,16,256,4096 64 96 3 (two GPUs)
//! tandem-gpu bench-gemm CONFIG.json [BATCHES] [TP]   a step's GEMMs: cuBLAS, cuBLASLt, cut along k
//! tandem-gpu bench-lanes CONFIG.json [BATCHES] [CONTEXT]   two half steps at once on two streams
//! tandem-gpu bench-nodes                  what a kernel node costs a graph (empty kernels)
//! ```
//! Every figure line names the device. Exit status 1 when a check fails.

use std::path::Path;
use std::process::ExitCode;

use tandem_cuda::tensor_parallel::check as tp_check;
use tandem_cuda::{bench, check, e2e, CudaError, Dtype, Gpu, WeightSource};

fn report(device: &str, rs: &[check::CheckResult]) -> bool {
    let mut ok = true;
    for r in rs {
        let verdict = if r.passed() { "PASS" } else { "FAIL" };
        ok &= r.passed();
        println!("[{device}] {verdict} {:<100} err {:.3e} (tol {:.1e})", r.name, r.max_err, r.tol);
    }
    ok
}

fn print_profile(device: &str, p: &[(&str, f64)]) {
    let total: f64 = p.iter().map(|x| x.1).sum();
    let parts: Vec<String> =
        p.iter().map(|(n, ms)| format!("{n} {ms:.2} ms ({:.0}%)", 100.0 * ms / total)).collect();
    println!("[{device}]   eager stages, {total:.2} ms: {}", parts.join(", "));
}

fn dtype(s: Option<&str>, default: Dtype) -> Result<Dtype, CudaError> {
    s.map_or(Ok(default), |s| {
        Dtype::parse(s).ok_or_else(|| CudaError::Unsupported(format!("dtype '{s}' (bf16 or f16)")))
    })
}

/// The random-weight shape named by argument 1 (default `cfg`) and the batch sizes of
/// argument 2 (default `batches`, comma-separated).
fn shape_and_batches(
    args: &[String],
    cfg: &str,
    batches: &str,
) -> Result<(tandem_engine::ModelConfig, Vec<usize>), CudaError> {
    let c = tandem_cuda::dummy_config(Path::new(args.get(1).map_or(cfg, String::as_str)))?;
    let b = args.get(2).map_or(batches, String::as_str);
    Ok((c, b.split(',').filter_map(|s| s.parse().ok()).collect()))
}

/// One context ("1024", the default) or a spread of them ("100-2048").
fn parse_context(arg: Option<&str>) -> Result<(usize, usize), CudaError> {
    let s = arg.unwrap_or("1024");
    let (lo, hi) = match s.split_once('-') {
        Some((lo, hi)) => (lo.parse().ok(), hi.parse().ok()),
        None => (s.parse().ok(), None),
    };
    match (lo, hi) {
        (Some(lo), hi) => Ok((lo, hi.unwrap_or(lo))),
        _ => Err(CudaError::Unsupported("context: N or LO-HI".into())),
    }
}

fn run(args: &[String]) -> Result<bool, CudaError> {
    let cmd = args.first().map(String::as_str).unwrap_or("info");
    let arg = |i: usize| args.get(i).map(String::as_str);
    match cmd {
        "info" => {
            let g = Gpu::open(0, Dtype::Bf16)?;
            let (free, total) = g.mem_info()?;
            println!(
                "[{}] {} SMs, {:.1} GiB free of {:.1} GiB",
                g.name,
                g.num_sms,
                free as f64 / (1u64 << 30) as f64,
                total as f64 / (1u64 << 30) as f64
            );
            // The attention kernels' registers and how many CTAs fit on an SM.
            for (name, f, threads, smem) in tandem_cuda::device::attention_kernels(&g) {
                let regs = f.num_regs().map_err(CudaError::from)?;
                let fit = f
                    .occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)
                    .map_err(CudaError::from)?;
                println!("[{}] {name}: {regs} registers/thread, {threads} threads, {smem} B dynamic shared memory, {fit} CTAs/SM", g.name);
            }
            Ok(true)
        }
        "check" => {
            let g = Gpu::open(0, dtype(arg(1), Dtype::Bf16)?)?;
            Ok(report(&g.name, &check::run_all(&g)?))
        }
        "e2e" => {
            let path =
                arg(1).ok_or_else(|| CudaError::Unsupported("e2e needs a model path".into()))?;
            let d = dtype(arg(2), Dtype::F16)?;
            let tol: f64 = arg(3).and_then(|s| s.parse().ok()).unwrap_or(0.1);
            let name = Gpu::open(0, d)?.name;
            let (rs, _) = e2e::run(Path::new(path), 0, d, tol)?;
            Ok(report(&name, &rs))
        }
        "windows" => {
            // Each model with sliding-window layers, through the engine with and without KV
            // groups.
            let name = Gpu::open(0, Dtype::F16)?.name;
            let mut ok = args.len() > 1;
            for path in &args[1..] {
                ok &= report(&name, &tandem_cuda::windows::check(Path::new(path), 0)?);
            }
            Ok(ok)
        }
        "bench-decode" => {
            let (cfg, batches) = shape_and_batches(args, "cuda/configs/llama-3-8b.json", "1,16,64,256")?;
            let context = parse_context(arg(3))?;
            let tp: usize = arg(4).and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
            let (name, lim) = bench::group_limits(tp)?;
            println!("[{name}] limit: device copy {:.0} GB/s (read+write; the slowest GPU), cuBLAS bf16 GEMM {:.0} TFLOP/s", lim.hbm_bytes_per_s / 1e9, lim.gemm_flops / 1e12);
            for r in bench::decode(&cfg, &batches, context, &lim, tp)? {
                if let Some((ms, path)) = r.all_reduce {
                    println!("[{name}] TP={tp} batch {:>3}: the step's {} all-reduces ({path}) alone in a graph: {ms:.3} ms = {:.1}% of the step", r.batch, 2 * cfg.num_layers, 100.0 * ms / r.step_ms);
                }
                let ctx = match r.context {
                    (lo, hi) if lo == hi => format!("context {lo}"),
                    (lo, hi) => format!("contexts {lo}-{hi}"),
                };
                println!(
                    "[{name}] decode {} TP={tp} batch {:>3} {ctx}: step {:.3} ms, {:.2} GB read, roofline {:.3} ms -> {:.1}% of HBM roofline, {:.0} tok/s (CUDA-core attention: {:.3} ms, {:.1}%)",
                    cfg.name,
                    r.batch,
                    r.step_ms,
                    r.bytes / 1e9,
                    r.roofline_ms,
                    100.0 * r.roofline_ms / r.step_ms,
                    r.batch as f64 / (r.step_ms / 1e3),
                    r.tile_step_ms,
                    100.0 * r.roofline_ms / r.tile_step_ms
                );
                if r.compute_bound_ms > r.roofline_ms * 1.001 {
                    println!("[{name}]   with the GEMMs' arithmetic at the measured peak (weights then KV, one after the other): bound {:.3} ms -> {:.1}% of it", r.compute_bound_ms, 100.0 * r.compute_bound_ms / r.step_ms);
                }
                print_profile(&name, &r.profile);
                println!("[{name}]   the 16-row tensor-core attention kernel on the decode tiles: step {:.3} ms, {:.1}%", r.rows16.0, 100.0 * r.roofline_ms / r.rows16.0);
                print_profile(&name, &r.rows16.1);
                println!("[{name}]   q/k norm + RoPE + KV store as a kernel of its own (not fused into the decode kernel): step {:.3} ms, {:.1}%", r.unfused_rope_ms, 100.0 * r.roofline_ms / r.unfused_rope_ms);
                for ((m, n, k, c_f32, acc), t) in &r.gemm_tunings {
                    println!("[{name}]   gemm {m}x{n}x{k}{}{} on the model's matrices: cuBLAS {:.2} us, best cuBLASLt candidate {:.2} us -> {}", if *c_f32 { " f32" } else { "" }, if *acc { " +=" } else { "" }, t.cublas_us, t.best_us, if t.kept { "kept" } else { "cuBLAS kept" });
                }
                if let Some(ms) = r.cublas_step_ms {
                    println!("[{name}]   every product on cuBLAS instead of Tandem's own GEMM kernels (gemv, gemm_stream): step {ms:.3} ms, {:.1}%", 100.0 * r.roofline_ms / ms);
                }
                if let Some(ms) = r.chained_ms {
                    println!("[{name}]   10 replays back to back: {ms:.3} ms per step, {:.1}%", 100.0 * r.roofline_ms / ms);
                }
                if let Some(c) = &r.census {
                    let total: usize = c.iter().map(|x| x.1).sum();
                    let names: Vec<String> = c.iter().map(|(n, k)| format!("{k} {}", n.chars().take(60).collect::<String>())).collect();
                    println!("[{name}]   graph: {total} nodes: {}", names.join(", "));
                }
                if let Some(ms) = r.batch_order_step_ms {
                    println!("[{name}]   attention tiles in the batch's order instead of longest context first: {ms:.3} ms, {:.1}%", 100.0 * r.roofline_ms / ms);
                }
            }
            Ok(true)
        }
        "bench-lanes" => {
            let (cfg, batches) = shape_and_batches(args, "cuda/configs/qwen3-0.6b.json", "16,64,256")?;
            let context = parse_context(arg(3))?;
            let name = Gpu::open(0, Dtype::Bf16)?.name;
            for (batch, whole, half, pair) in bench::lanes(&cfg, &batches, context)? {
                println!("[{name}] decode {} batch {batch:>3} contexts {}-{}: whole step {whole:.3} ms, half {half:.3} ms, two halves at once on two streams {pair:.3} ms -> {:.2}x the whole step", cfg.name, context.0, context.1, whole / pair);
            }
            Ok(true)
        }
        "step" => {
            let (cfg, batches) = shape_and_batches(args, "cuda/configs/llama-3-8b.json", "64")?;
            let batch = batches.first().copied().unwrap_or(64).max(1);
            let context = parse_context(arg(3))?;
            let name = Gpu::open(0, Dtype::Bf16)?.name;
            let ms = bench::step_for_profiler(&cfg, batch, context)?;
            println!("[{name}] decode {} batch {batch} contexts {}-{}: step {ms:.3} ms (graph replay, median of 20); then 4 replays inside the profiler's range", cfg.name, context.0, context.1);
            Ok(true)
        }
        "bench-gemm" => {
            // The model's decode-step GEMMs at each batch size: cuBLAS's choice against the
            // fastest cuBLASLt candidate.
            let (cfg, batches) =
                shape_and_batches(args, "cuda/configs/qwen3-0.6b.json", "1,32,64,128,256")?;
            // With a tensor-parallel size: one rank's shapes.
            let tp: usize = arg(3).and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
            let cfg = tandem_cuda::tensor_parallel::shard::Shard { rank: 0, size: tp }.local_config(&cfg);
            let g = Gpu::open(0, Dtype::Bf16)?;
            let (h, q, kv, f) = (cfg.hidden_size, cfg.q_size(), cfg.kv_size(), cfg.intermediate_size);
            let mut shapes = Vec::new();
            for &m in &batches {
                // q|k|v to f32, gate|up to the 16-bit type; o and down accumulate into the f32
                // residual (as the backend runs them).
                shapes.extend([(m, q + 2 * kv, h, true), (m, h, q, true), (m, 2 * f, h, false), (m, h, f, true)]);
            }
            let (mut total, mut cold) = ((0.0, 0.0), (0.0, 0.0));
            for t in tandem_cuda::gemm_tune::run(&g, &shapes, 20)? {
                total.0 += t.default_us;
                total.1 += t.best_us.min(t.default_us);
                cold.0 += t.cold_us;
                cold.1 += t.own_cold_us.unwrap_or(t.cold_us);
                println!(
                    "[{}] gemm {} TP={tp} m={:>4} n={:>5} k={:>5}: cuBLAS {:.2} us, cuBLASLt first {:.2} us, best {:.2} us (candidate {} of {}) -> {:.2}x",
                    g.name, cfg.name, t.m, t.n, t.k, t.default_us, t.first_us, t.best_us, t.best_index, t.candidates, t.default_us / t.best_us
                );
                let splits: Vec<String> = t.split_us.iter().map(|(s, us)| format!("{s} slices {us:.2} us")).collect();
                let own = match t.own_cold_us {
                    Some(own) => format!("cuBLAS {:.2} us, {} {own:.2} us -> {:.2}x", t.cold_us, if t.m == 1 { "the gemv kernel" } else { "gemm_stream" }, t.cold_us / own),
                    None => format!("cuBLAS {:.2} us", t.cold_us),
                };
                println!("[{}]   20 different weight matrices: {own}; cut along k (partial sums apart): {}", g.name, splits.join(", "));
            }
            println!("[{}] all shapes: cuBLAS {:.1} us, best of both {:.1} us; on 20 matrices each: cuBLAS {:.1} us, as Gpu::gemm runs them {:.1} us", g.name, total.0, total.1, cold.0, cold.1);
            Ok(true)
        }
        "bench-nodes" => {
            // What a kernel node costs a captured graph: graphs of empty kernels.
            let g = Gpu::open(0, Dtype::Bf16)?;
            for ctas in [1, g.num_sms, 4 * g.num_sms] {
                for nodes in [20, 300] {
                    let us = tandem_cuda::gemm_tune::node_us(&g, nodes, ctas)?;
                    println!("[{}] graph of {nodes} empty kernels of {ctas} CTAs x 128 threads: {us:.2} us per node", g.name);
                }
            }
            Ok(true)
        }
        "bench-pages" => {
            let cfg = tandem_cuda::dummy_config(Path::new(
                arg(1).unwrap_or("cuda/configs/llama-3-8b.json"),
            ))?;
            let counts: Vec<usize> = arg(2)
                .unwrap_or("1,16,256,4096")
                .split(',')
                .filter_map(|s| s.parse().ok())
                .filter(|&n| n > 0)
                .collect();
            let chunk: usize = arg(3).and_then(|s| s.parse().ok()).unwrap_or(64);
            let ctas: usize = arg(4).and_then(|s| s.parse().ok()).unwrap_or(96);
            let stages: usize = arg(5).and_then(|s| s.parse().ok()).unwrap_or(3);
            if !tandem_cuda::nccl::nccl_present() {
                return Err(CudaError::Unavailable("libnccl is not installed".into()));
            }
            let (a, b) =
                (Gpu::open(0, Dtype::Bf16)?.name.clone(), Gpu::open(1, Dtype::Bf16)?.name.clone());
            let name = format!("{a} -> {b}");
            let mut ok = true;
            println!("[{name}] chunks of {chunk} pages, {stages} staging buffers, gather/scatter on {} CTAs", if ctas == 0 { "all".to_string() } else { ctas.to_string() });
            for r in bench::pages(&cfg, &counts, chunk, ctas, stages)? {
                ok &= r.differing == 0 && r.bad_sums == 0;
                println!(
                    "[{name}] KV pages {} {:>5} x {} KiB = {:.1} MiB: paged {:.3} ms = {:.1} GB/s, raw NCCL {:.3} ms = {:.1} GB/s -> {:.1}% of raw; {} pages checked, {} differ, {} checksums off the reference",
                    cfg.name,
                    r.pages,
                    r.bytes / r.pages / 1024,
                    r.bytes as f64 / (1 << 20) as f64,
                    r.paged_ms,
                    r.bytes as f64 / r.paged_ms / 1e6,
                    r.raw_ms,
                    r.bytes as f64 / r.raw_ms / 1e6,
                    100.0 * r.raw_ms / r.paged_ms,
                    r.checked,
                    r.differing,
                    r.bad_sums
                );
            }
            Ok(ok)
        }
        "bench-prefill" => {
            let cfg = tandem_cuda::dummy_config(Path::new(
                arg(1).unwrap_or("cuda/configs/llama-3-8b.json"),
            ))?;
            let prompts: usize = arg(2).and_then(|s| s.parse().ok()).unwrap_or(4);
            let len: usize = arg(3).and_then(|s| s.parse().ok()).unwrap_or(2048);
            let tp: usize = arg(4).and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
            let (name, lim) = bench::group_limits(tp)?;
            println!("[{name}] limit: cuBLAS bf16 GEMM {:.0} TFLOP/s (every GPU's together)", lim.gemm_flops / 1e12);
            // Attention on the flash-attention prefill kernel, then on cuBLAS GEMMs.
            for (mma, what) in [(true, "prefill kernel"), (false, "GEMM attention")] {
                let r = bench::prefill(&cfg, prompts, len, tp, mma)?;
                let achieved = r.flops / (r.ms / 1e3);
                println!(
                    "[{name}] prefill {} TP={tp} {}x{} tokens ({what}): {:.1} ms, {:.0} tok/s, {:.0} TFLOP/s = {:.1}% of GEMM peak",
                    cfg.name,
                    r.prompts,
                    r.len,
                    r.ms,
                    (r.prompts * r.len) as f64 / (r.ms / 1e3),
                    achieved / 1e12,
                    100.0 * achieved / lim.gemm_flops
                );
                if let Some(ms) = r.batch_order_ms {
                    let achieved = r.flops / (ms / 1e3);
                    println!("[{name}]   prefill-kernel tiles in the batch's order instead of longest context first: {ms:.1} ms, {:.1}% of GEMM peak", 100.0 * achieved / lim.gemm_flops);
                }
                if let Some(ms) = r.small_tiles_ms {
                    let achieved = r.flops / (ms / 1e3);
                    println!("[{name}]   every chunk on the small-tile kernel instead: {ms:.1} ms, {:.1}% of GEMM peak", 100.0 * achieved / lim.gemm_flops);
                }
                print_profile(&name, &r.profile);
            }
            Ok(true)
        }
        "bench-mixed" => {
            // bench-mixed CFG DECODE CONTEXT CHUNKS [DTYPE]: CHUNKS as "1x108,2x108,4x512".
            let (cfg, decode) = shape_and_batches(args, "cuda/configs/qwen3-0.6b.json", "256")?;
            let context = parse_context(arg(3))?;
            let chunks: Vec<(usize, usize)> = arg(4)
                .unwrap_or("1x108,2x108,4x108")
                .split(',')
                .filter_map(|c| c.split_once('x'))
                .filter_map(|(n, l)| Some((n.parse().ok()?, l.parse().ok()?)))
                .collect();
            let d = dtype(arg(5), Dtype::Bf16)?;
            let name = Gpu::open(0, d)?.name;
            for &n in &decode {
                for r in bench::mixed(&cfg, d, n, context, &chunks)? {
                    println!(
                        "[{name}] mixed step {} {}: {} decode rows + {}x{} prompt tokens: eager {:.3} ms, mixed-step graph {:.3} ms ({:.2}x); the decode rows alone (decode graph) {:.3} ms; graph vs eager logits {}",
                        cfg.name,
                        d.name(),
                        r.decode,
                        r.prompts,
                        r.prompt_len,
                        r.eager_ms,
                        r.graph_ms,
                        r.eager_ms / r.graph_ms,
                        r.decode_ms,
                        r.logit_diff.map_or("n/a (no graph holds the step)".into(), |(d, m)| format!("max |diff| {d:.3e} (largest |logit| {m:.2})"))
                    );
                }
            }
            Ok(true)
        }
        "tp-check" => {
            let path = Path::new(arg(1).unwrap_or("tests/data/tiny-llama"));
            let tp: usize = arg(2).and_then(|s| s.parse().ok()).unwrap_or(2);
            let prompts: usize = arg(3).and_then(|s| s.parse().ok()).unwrap_or(8);
            let steps: usize = arg(4).and_then(|s| s.parse().ok()).unwrap_or(64);
            let name = Gpu::open(0, Dtype::Bf16)?.name;
            let json = path.extension().is_some_and(|e| e == "json");
            let r = if json {
                let cfg = tandem_cuda::dummy_config(path)?;
                tp_check::run(&cfg, WeightSource::Dummy(7), tp, Dtype::Bf16, prompts, steps)?
            } else {
                let (files, cfg) = tandem_engine::model_files::weights::ModelFiles::open(path)?;
                tp_check::run(&cfg, WeightSource::Files(&files), tp, Dtype::Bf16, prompts, steps)?
            };
            let what = if json { "random weights, seed 7" } else { "its weights" };
            println!("[{name}] TP={tp} vs one GPU, {} ({what}), bf16: prefill logits max |diff| {:.3e} (largest |logit| {:.2})", path.display(), r.max_abs_logit_diff, r.max_abs_logit);
            let mut ok = r.sampling_mismatches == 0;
            for (s, (a, m)) in r.agreed.iter().zip(&r.margins).enumerate() {
                match m {
                    None => println!("[{name}]   sequence {s}: {a}/{} greedy tokens equal", r.steps),
                    Some(m) => {
                        // A difference is acceptable only where one GPU's top two were within
                        // rounding of each other.
                        let tie = *m < 0.05;
                        ok &= tie;
                        println!("[{name}]   sequence {s}: equal for {a}/{} tokens, then parts where one GPU's top-2 margin is {m:.4} ({})", r.steps, if tie { "a near-tie" } else { "NOT a near-tie" });
                    }
                }
            }
            let total: usize = r.agreed.iter().sum();
            println!("[{name}] {} TP={tp}: {total}/{} greedy tokens equal; device sampling at temperature 0 vs the logits' argmax: {} mismatches", if ok { "PASS" } else { "FAIL" }, r.steps * r.agreed.len(), r.sampling_mismatches);
            Ok(ok)
        }
        other => Err(CudaError::Unsupported(format!(
            "unknown command '{other}' (info, check, e2e, windows, bench-decode, bench-prefill, bench-mixed, bench-gemm, bench-lanes, bench-nodes, bench-pages, step, tp-check)"
        ))),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("tandem-gpu: {e}");
            ExitCode::from(2)
        }
    }
}
