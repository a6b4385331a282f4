//! `tandem bench`: measurements of the engine on this machine.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::{Args, Subcommand};
use tandem_engine::backend::ForwardBatch;
use tandem_engine::{LoadOptions, Model};

/// Benchmark subcommands.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Offline engine benchmark: prompt processing and decode speed of one stream.
    Engine(EngineArgs),
}

/// Arguments of `tandem bench engine`.
#[derive(Args, Debug)]
pub struct EngineArgs {
    /// Model file or directory; default: the embedded default model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens decoded after the prompt.
    #[arg(long, default_value_t = 128)]
    pub decode_tokens: usize,
    /// Repetitions; the best is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
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
        BenchCommand::Engine(a) => engine(a),
    }
}

fn engine(a: EngineArgs) -> Result<()> {
    let path = crate::generate_cmd::model_path(a.model)?;
    let total = a.prompt_tokens + a.decode_tokens;
    let t0 = Instant::now();
    let mut model = Model::load(&path, LoadOptions::with_kv_tokens(total))?;
    let load_s = t0.elapsed().as_secs_f64();
    let spec = model.backend.kv_cache_spec();
    let table: Vec<u32> = (0..spec.num_blocks as u32).collect();
    let vocab = model.config.vocab_size as u32;
    // A deterministic pseudo-random prompt of ordinary tokens.
    let prompt: Vec<u32> = (0..a.prompt_tokens as u64).map(|i| ((i * 2654435761 + 17) % (vocab as u64 - 100) + 100) as u32).collect();
    let (mut best_pp, mut best_tg) = (0f64, 0f64);
    for _ in 0..a.repeat.max(1) {
        let mut b = ForwardBatch::default();
        b.push_seq(&prompt, 0, &table, spec.block_size, false);
        let t = Instant::now();
        let logits = model.backend.forward(&b)?;
        best_pp = best_pp.max(a.prompt_tokens as f64 / t.elapsed().as_secs_f64());
        let mut next = argmax(&logits);
        let t = Instant::now();
        for i in 0..a.decode_tokens {
            let mut b = ForwardBatch::default();
            b.push_seq(&[next], a.prompt_tokens + i, &table, spec.block_size, false);
            next = argmax(&model.backend.forward(&b)?);
        }
        best_tg = best_tg.max(a.decode_tokens as f64 / t.elapsed().as_secs_f64());
    }
    let rss = peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"model": path.display().to_string(), "kernel": "exact", "prompt_tokens": a.prompt_tokens,
                "decode_tokens": a.decode_tokens, "prompt_tok_per_s": best_pp, "decode_tok_per_s": best_tg,
                "load_s": load_s, "peak_rss_mib": rss, "threads": rayon_threads()})
        );
    } else {
        println!("model            {}", path.display());
        println!("threads          {}", rayon_threads());
        println!("load             {load_s:.2} s");
        println!("prompt ({:>4} tok) {best_pp:.1} tok/s", a.prompt_tokens);
        println!("decode ({:>4} tok) {best_tg:.1} tok/s", a.decode_tokens);
        println!("peak RSS         {rss:.0} MiB");
    }
    Ok(())
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}
