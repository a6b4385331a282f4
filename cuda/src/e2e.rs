//! End-to-end check on a real model: the CUDA backend against the CPU exact path — top-5
//! log-probabilities at the first 16 positions of each prompt (within 0.1 nats), greedy
//! continuations token for token except at near-ties (top-2 margin under 0.1 nats, reported),
//! a mixed batch against the same prompts run alone, and graph replay against eager decode and
//! against an eager step with prompt chunks.

use std::path::Path;

use tandem_engine::backend::{ForwardBatch, KernelPath, Logits, ModelBackend, RowSampling};
use tandem_engine::model_files::weights::ModelFiles;
use tandem_engine::{KvCacheSize, LoadOptions, Model};

use crate::check::CheckResult;
use crate::{CudaBackend, CudaBackendOptions, CudaError, Dtype, WeightSource};

const PROMPTS: [&str; 4] = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old woodcutter who",
    "Q: What is the boiling point of water at sea level in degrees Celsius?\nA: The boiling point of water is",
];

const POSITIONS: usize = 16;
const GREEDY_STEPS: usize = 32;
/// Top-2 margin under which a greedy difference is a near-tie.
const TIE_NATS: f64 = 0.1;

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    row.iter().map(|&x| x as f64 - z).collect()
}

fn top_k(lp: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..lp.len()).collect();
    idx.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// One sequence in blocks `first..`, all positions or the last.
fn batch(tokens: &[u32], start: usize, blocks: &[u32], logits: Logits) -> ForwardBatch {
    let mut b = ForwardBatch::default();
    b.push_seq(tokens, start, blocks, 16, logits);
    b
}

/// Greedy continuation of `prompt` on `be`, with the log-probs of every step.
fn greedy(
    be: &mut dyn ModelBackend,
    prompt: &[u32],
    blocks: &[u32],
) -> Result<(Vec<u32>, Vec<Vec<f64>>), String> {
    let vocab = be.config().vocab_size;
    let mut toks = prompt.to_vec();
    let mut out = Vec::new();
    let mut lps = Vec::new();
    let mut logits =
        be.forward(&batch(prompt, 0, blocks, Logits::Last)).map_err(|e| e.to_string())?;
    for _ in 0..GREEDY_STEPS {
        let lp = log_softmax(&logits[..vocab]);
        let next = top_k(&lp, 1)[0] as u32;
        lps.push(lp);
        out.push(next);
        toks.push(next);
        logits = be
            .forward(&batch(&[next], toks.len() - 1, blocks, Logits::Last))
            .map_err(|e| e.to_string())?;
    }
    Ok((out, lps))
}

/// What the greedy comparison found for one prompt.
#[derive(Debug)]
pub struct GreedyReport {
    /// Tokens compared before the first difference (or all).
    pub agreed: usize,
    /// At the first difference: the CPU's top-2 margin in nats.
    pub tie_margin: Option<f64>,
}

/// Runs the comparison for the model at `path` on GPU `ordinal` in `dtype`, with `tol` nats
/// allowed on the log-probs.
pub fn run(
    path: &Path,
    ordinal: usize,
    dtype: Dtype,
    tol: f64,
) -> Result<(Vec<CheckResult>, Vec<GreedyReport>), CudaError> {
    let opts = LoadOptions {
        kernel: KernelPath::Exact,
        block_size: 16,
        kv_cache: KvCacheSize::Tokens(16 * 256),
        swap_space_bytes: 0,
        // Pages laid out as the GPU's: every layer in one.
        hybrid_kv: false,
    };
    let mut cpu = Model::load(path, opts)?;
    let (files, cfg) = ModelFiles::open(path)?;
    let gopts = CudaBackendOptions {
        num_blocks: Some(256),
        num_host_blocks: 4,
        max_num_batched_tokens: 1024,
        max_model_len: 1024,
        max_graph_batch: 8,
        // Pages laid out as the CPU's here: every layer in one (`windows.rs` checks the KV
        // groups of sliding-window models).
        hybrid_kv: false,
        ..Default::default()
    };
    let mut gpu: CudaBackend =
        crate::load(ordinal, dtype, &cfg, WeightSource::Files(&files), gopts)?;
    let vocab = cfg.vocab_size;
    let mut results = Vec::new();
    let mut reports = Vec::new();
    let err = |e: String| CudaError::Driver(e);
    let blocks: Vec<u32> = (0..16).collect();
    let mut encoded = Vec::new();
    for (pi, text) in PROMPTS.iter().enumerate() {
        let toks = cpu.tokenizer.encode(text, true).map_err(|e| err(e.to_string()))?;
        assert!(toks.len() >= POSITIONS, "prompt {pi} is shorter than {POSITIONS} tokens");
        encoded.push(toks.clone());
        // Teacher-forced: every position's distribution.
        let b = batch(&toks[..POSITIONS], 0, &blocks, Logits::All);
        let lc = cpu.backend.forward(&b).map_err(|e| err(e.to_string()))?;
        let lg = gpu.forward(&b).map_err(|e| err(e.to_string()))?;
        let mut worst = 0f64;
        for p in 0..POSITIONS {
            let (a, g) = (
                log_softmax(&lc[p * vocab..(p + 1) * vocab]),
                log_softmax(&lg[p * vocab..(p + 1) * vocab]),
            );
            for i in top_k(&a, 5) {
                worst = worst.max((a[i] - g[i]).abs());
            }
        }
        results.push(CheckResult {
            name: format!(
                "{}: prompt {pi}: top-5 log-probs, first {POSITIONS} positions (nats)",
                dtype.name()
            ),
            max_err: worst,
            tol,
        });
        if pi == 0 {
            // The KV page of the first block as the transfer format carries it: the GPU's
            // (16-bit, reordered) against the CPU's f32, relative to the page's scale.
            let (pc, pg) = (
                cpu.backend.read_block(0).map_err(|e| err(e.to_string()))?,
                gpu.read_block(0).map_err(|e| err(e.to_string()))?,
            );
            let f = |b: &[u8]| -> Vec<f32> {
                b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            };
            let (vc, vg) = (f(&pc), f(&pg));
            let scale = vc.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
            let diff =
                vc.iter().zip(&vg).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max) / scale;
            results.push(CheckResult {
                name: format!(
                    "{}: KV page of block 0 (read_block) vs the CPU's, max diff / max |value|",
                    dtype.name()
                ),
                max_err: diff,
                tol: 0.05,
            });
            // Writing a page back and reading it again returns it unchanged.
            gpu.write_block(200, &pg).map_err(|e| err(e.to_string()))?;
            let back = gpu.read_block(200).map_err(|e| err(e.to_string()))?;
            results.push(CheckResult {
                name: "write_block then read_block round trip (differing bytes)".into(),
                max_err: back.iter().zip(&pg).filter(|(a, b)| a != b).count() as f64,
                tol: 0.0,
            });
            // Swap preemption: out to page-locked host memory, the device block overwritten,
            // back in (to another block) unchanged; a copy-on-write copy likewise.
            gpu.swap_out(&[(0, 3)]).map_err(|e| err(e.to_string()))?;
            gpu.write_block(0, &vec![0u8; pg.len()]).map_err(|e| err(e.to_string()))?;
            gpu.swap_in(&[(3, 201)]).map_err(|e| err(e.to_string()))?;
            gpu.copy_blocks(&[(201, 0)]).map_err(|e| err(e.to_string()))?;
            let (a, b) = (
                gpu.read_block(201).map_err(|e| err(e.to_string()))?,
                gpu.read_block(0).map_err(|e| err(e.to_string()))?,
            );
            let bad = a.iter().zip(&pg).filter(|(x, y)| x != y).count()
                + b.iter().zip(&pg).filter(|(x, y)| x != y).count();
            results.push(CheckResult {
                name: "swap out, overwrite, swap in, copy back (differing bytes)".into(),
                max_err: bad as f64,
                tol: 0.0,
            });
        }
        // Greedy continuations (the GPU's decode steps replay graphs).
        let (tc, lpc) = greedy(cpu.backend.as_mut(), &toks, &blocks).map_err(err)?;
        let (tg, _) = greedy(&mut gpu, &toks, &blocks).map_err(err)?;
        let agreed = tc.iter().zip(&tg).take_while(|(a, b)| a == b).count();
        let tie_margin = (agreed < GREEDY_STEPS).then(|| {
            let lp = &lpc[agreed];
            let t2 = top_k(lp, 2);
            lp[t2[0]] - lp[t2[1]]
        });
        let bad = tie_margin.map_or(0.0, |m| if m < TIE_NATS { 0.0 } else { 1.0 });
        results.push(CheckResult {
            name: format!(
                "prompt {pi}: greedy {agreed}/{GREEDY_STEPS} tokens equal{}",
                tie_margin
                    .map_or(String::new(), |m| format!(", then a near-tie of margin {m:.4} nats"))
            ),
            max_err: bad,
            tol: 0.0,
        });
        reports.push(GreedyReport { agreed, tie_margin });
    }
    // A long prompt (all four, twice) teacher-forced at every position: on the CPU in one pass;
    // on the GPU as a 60-token chunk (tile kernel) then the rest after that cached prefix (the
    // long-chunk path: the flash-attention prefill kernel where the tensor-core kernels apply,
    // else cuBLAS attention), again with the tile kernel only, and again with the tensor-core
    // kernels off (CUDA-core tiles, cuBLAS attention).
    let long: Vec<u32> = encoded.iter().chain(encoded.iter()).flatten().copied().collect();
    let lblocks: Vec<u32> = (100..100 + long.len().div_ceil(16) as u32).collect();
    let split = 60;
    let lc = cpu
        .backend
        .forward(&batch(&long, 0, &lblocks, Logits::All))
        .map_err(|e| err(e.to_string()))?;
    let chunked = |gpu: &mut CudaBackend| -> Result<Vec<f32>, CudaError> {
        let mut out = gpu
            .forward(&batch(&long[..split], 0, &lblocks, Logits::All))
            .map_err(|e| err(e.to_string()))?;
        out.extend(
            gpu.forward(&batch(&long[split..], split, &lblocks, Logits::All))
                .map_err(|e| err(e.to_string()))?,
        );
        Ok(out)
    };
    let lg = chunked(&mut gpu)?;
    gpu.set_mma_attention(false);
    let lgemm = chunked(&mut gpu)?;
    gpu.set_mma_attention(true);
    gpu.set_long_prompt_min(usize::MAX);
    let lt =
        gpu.forward(&batch(&long, 0, &lblocks, Logits::All)).map_err(|e| err(e.to_string()))?;
    gpu.set_long_prompt_min(64);
    let (mut worst, mut paths, mut kernels) = (0f64, 0f64, 0f64);
    for p in 0..long.len() {
        let a = log_softmax(&lc[p * vocab..(p + 1) * vocab]);
        let (g, t, c) = (
            log_softmax(&lg[p * vocab..(p + 1) * vocab]),
            log_softmax(&lt[p * vocab..(p + 1) * vocab]),
            log_softmax(&lgemm[p * vocab..(p + 1) * vocab]),
        );
        for i in top_k(&a, 5) {
            worst = worst.max((a[i] - g[i]).abs());
            paths = paths.max((g[i] - t[i]).abs());
            kernels = kernels.max((g[i] - c[i]).abs());
        }
    }
    // bf16 keeps 8 significant bits against f16's 11: its rounding noise, amplified through the
    // layers and growing with position, is allowed 3× (against the CPU) and 8× (between two GPU
    // paths) what f16 is.
    let noise = if dtype == Dtype::Bf16 { 8.0 } else { 1.0 };
    results.push(CheckResult {
        name: format!("{}: {}-token prompt, chunk of {split} then a long chunk, top-5 log-probs at every position (nats)", dtype.name(), long.len()),
        max_err: worst,
        tol: if dtype == Dtype::Bf16 { 3.0 * tol } else { tol },
    });
    results.push(CheckResult {
        name: format!(
            "{}: same prompt, long-chunk path vs tile kernel, top-5 log-probs (nats)",
            dtype.name()
        ),
        max_err: paths,
        tol: 0.05 * noise,
    });
    results.push(CheckResult {
        name: format!(
            "{}: same chunks, tensor-core kernels vs CUDA-core tiles and cuBLAS attention, top-5 log-probs (nats)",
            dtype.name()
        ),
        max_err: kernels,
        tol: 0.05 * noise,
    });
    // The four prompts in one batch (different block ranges) against each alone.
    let mut mixed = ForwardBatch::default();
    for (i, t) in encoded.iter().enumerate() {
        let blk: Vec<u32> = (16 * i as u32 + 16..16 * i as u32 + 32).collect();
        mixed.push_seq(t, 0, &blk, 16, Logits::Last);
    }
    let lm = gpu.forward(&mixed).map_err(|e| err(e.to_string()))?;
    let mut worst = 0f64;
    for (i, t) in encoded.iter().enumerate() {
        let alone =
            gpu.forward(&batch(t, 0, &blocks, Logits::Last)).map_err(|e| err(e.to_string()))?;
        let (a, m) = (log_softmax(&alone[..vocab]), log_softmax(&lm[i * vocab..(i + 1) * vocab]));
        for j in top_k(&a, 5) {
            worst = worst.max((a[j] - m[j]).abs());
        }
    }
    results.push(CheckResult {
        name: "mixed batch of 4 prompts vs each alone, top-5 log-probs (nats)".into(),
        max_err: worst,
        tol: 0.02,
    });
    // Two decode rows beside two prompt chunks: eagerly, then from the step's mixed-step graph
    // (captured on the second run, replayed on the third). Chunks long enough for the prefill
    // kernel inside such graphs: `tandem-gpu bench-mixed` compares them on model shapes.
    let mut ms = ForwardBatch::default();
    for (i, t) in encoded.iter().enumerate() {
        let blk: Vec<u32> = (16 * i as u32 + 16..16 * i as u32 + 32).collect();
        match i {
            0 | 1 => ms.push_seq(&[t[0]], t.len(), &blk, 16, Logits::Last),
            // Their first 16 tokens: short chunks, which every kernel set takes in a graph.
            _ => ms.push_seq(&t[..POSITIONS], 0, &blk, 16, Logits::Last),
        }
    }
    gpu.set_mixed_graphs(false);
    let leager = gpu.forward(&ms).map_err(|e| err(e.to_string()))?;
    gpu.set_mixed_graphs(true);
    let mut lgraph = Vec::new();
    for _ in 0..3 {
        lgraph = gpu.forward(&ms).map_err(|e| err(e.to_string()))?;
    }
    let diff = lgraph.iter().zip(&leager).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    results.push(CheckResult {
        name: format!(
            "{}: step of 2 decode rows and 2 prompt chunks, mixed-step graph replay ({} captured) vs eager logits (max abs)",
            dtype.name(),
            gpu.mixed_graph_count()
        ),
        max_err: if gpu.mixed_graph_count() == 1 { diff } else { f64::INFINITY },
        tol: 0.05 * noise,
    });
    // Steps of one graph shape with and without a chunk for the prefill kernel: A, two decode
    // rows and a 2-token chunk (small tiles, no long chunk), run until its graph is captured;
    // then B, one 64-token chunk (a long chunk; no other tiles, so small tiles too), run three
    // times through the graphs and compared with B run eagerly. A graph of A replayed for B
    // would leave B's rows unrotated, unstored and unattended.
    let long: Vec<u32> = encoded.iter().flatten().copied().cycle().take(64).collect();
    let mut sa = ForwardBatch::default();
    for (i, t) in encoded.iter().enumerate().take(3) {
        let blk: Vec<u32> = (16 * i as u32 + 16..16 * i as u32 + 32).collect();
        match i {
            0 | 1 => sa.push_seq(&[t[0]], t.len(), &blk, 16, Logits::Last),
            _ => sa.push_seq(&t[..2], 0, &blk, 16, Logits::Last),
        }
    }
    // Blocks no other check uses.
    let sb = batch(&long, 0, &(128..144).collect::<Vec<u32>>(), Logits::Last);
    let run_b = |gpu: &mut CudaBackend, n: usize| -> Result<Vec<f32>, CudaError> {
        let mut l = Vec::new();
        for _ in 0..n {
            l = gpu.forward(&sb).map_err(|e| err(e.to_string()))?;
        }
        Ok(l)
    };
    gpu.set_mixed_graphs(true);
    for _ in 0..2 {
        gpu.forward(&sa).map_err(|e| err(e.to_string()))?;
    }
    let captured_a = gpu.mixed_graph_count();
    let lgraph = run_b(&mut gpu, 3)?;
    let captured = gpu.mixed_graph_count();
    gpu.set_mixed_graphs(false);
    let leager = run_b(&mut gpu, 1)?;
    gpu.set_mixed_graphs(true);
    let diff = lgraph.iter().zip(&leager).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    results.push(CheckResult {
        name: format!(
            "{}: a 64-token chunk after a step of its graph shape without one, mixed-step graph replay ({captured_a} then {captured} captured) vs eager logits (max abs)",
            dtype.name()
        ),
        max_err: if captured_a == 1 && captured == 2 { diff } else { f64::INFINITY },
        tol: 0.05 * noise,
    });
    // One decode step of all four: graph replay against eager.
    let mut step = ForwardBatch::default();
    for (i, t) in encoded.iter().enumerate() {
        let blk: Vec<u32> = (16 * i as u32 + 16..16 * i as u32 + 32).collect();
        step.push_seq(&[t[0]], t.len(), &blk, 16, Logits::Last);
    }
    let lgraph = gpu.forward(&step).map_err(|e| err(e.to_string()))?;
    gpu.set_graphs(false);
    let leager = gpu.forward(&step).map_err(|e| err(e.to_string()))?;
    let diff = lgraph.iter().zip(&leager).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    results.push(CheckResult {
        name: format!(
            "{}: decode step of 4, graph replay (context split) vs eager logits (max abs)",
            dtype.name()
        ),
        max_err: diff,
        tol: 0.05 * noise,
    });
    // The same step sampled greedily on the device, eagerly and through the graph: the argmax of
    // each path's own logits, with its log-probability.
    let rows = vec![RowSampling::new(0.0, 0); encoded.len()];
    for (path, logits) in [("eager", &leager), ("graph", &lgraph)] {
        gpu.set_graphs(path == "graph");
        let got =
            gpu.forward_sampled(&step, &rows, &mut Vec::new).map_err(|e| err(e.to_string()))?;
        let (mut wrong, mut lp) = (0usize, 0f64);
        for (i, t) in got.iter().enumerate() {
            let row = log_softmax(&logits[i * vocab..(i + 1) * vocab]);
            let best = top_k(&row, 1)[0];
            wrong += usize::from(t.token_id as usize != best);
            lp = lp.max((t.logprob as f64 - row[best]).abs());
        }
        results.push(CheckResult {
            name: format!(
                "{path} decode step sampled on the device: tokens ≠ argmax of its logits"
            ),
            max_err: wrong as f64,
            tol: 0.0,
        });
        results.push(CheckResult {
            name: format!("{path} decode step sampled on the device: log-prob vs host (abs)"),
            max_err: lp,
            tol: 1e-4,
        });
        // Structured outputs: rows 0 and 2 allow only the even tokens, and their choice is the
        // argmax over those (the log-probability under the masked row); rows 1 and 3 are free.
        let words = vocab.div_ceil(32);
        let even = vec![0x5555_5555u32; words];
        let masks: Vec<Option<Vec<u32>>> = vec![Some(even.clone()), None, Some(even), None];
        let mut give = || masks.clone();
        let got = gpu.forward_sampled(&step, &rows, &mut give).map_err(|e| err(e.to_string()))?;
        let mut wrong = 0usize;
        for (i, t) in got.iter().enumerate() {
            let mut row = logits[i * vocab..(i + 1) * vocab].to_vec();
            if masks[i].is_some() {
                for (j, l) in row.iter_mut().enumerate() {
                    if j % 2 == 1 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            let best = top_k(&log_softmax(&row), 1)[0];
            wrong += usize::from(t.token_id as usize != best);
        }
        results.push(CheckResult {
            name: format!("{path} decode step with token masks: tokens ≠ argmax over the allowed"),
            max_err: wrong as f64,
            tol: 0.0,
        });
    }
    Ok((results, reports))
}
