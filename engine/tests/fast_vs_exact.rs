//! The fast path against the exact path on GGUF files a user brings (made by `llama-quantize`,
//! so not in CI): teacher-forced log-probs of the Gemma 3 golden prompts and their reference
//! continuations, per file.
//!
//! ```text
//! TANDEM_GGUF_FILES=a.gguf:b.gguf cargo test --release -p tandem-engine --test fast_vs_exact -- --ignored --nocapture
//! ```
//! Files of other models than Gemma 3 270M work too: the prompts are re-tokenised.

use serde::Deserialize;
use tandem_engine::backend::KernelPath;
use tandem_engine::{score, LoadOptions, Model};

/// Worst |Δ log-prob| allowed between the paths over every prompt position's five most likely
/// tokens. Measured on Gemma 3 270M (AMD EPYC Zen 5, 2026-11-24, every kernel): Q2_K 0.015,
/// Q3_K_M 0.051, Q4_K_M 0.026, Q5_K_M 0.030 — the f16-rounded group scales and the two-level
/// activations, not the file's bit width.
const TOL: f32 = 0.1;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt: String,
}

fn load(path: &str, kernel: KernelPath) -> Model {
    Model::load(path.as_ref(), LoadOptions { kernel, ..LoadOptions::with_kv_tokens(1024) })
        .unwrap_or_else(|e| panic!("load {path}: {e}"))
}

#[test]
#[ignore = "needs TANDEM_GGUF_FILES: GGUF files made with llama-quantize (see the module docs)"]
fn fast_path_matches_exact_path_on_user_files() {
    let files = std::env::var("TANDEM_GGUF_FILES").expect("TANDEM_GGUF_FILES");
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden/gemma-3-270m-q4_k_m.json");
    let g: Golden = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    for path in files.split(':').filter(|s| !s.is_empty()) {
        let (mut exact, mut fast) = (load(path, KernelPath::Exact), load(path, KernelPath::Fast));
        let mut worst = 0f32;
        for c in &g.cases {
            let ids = exact.tokenizer.encode(&c.prompt, true).unwrap();
            let (le, lf) = (score(&mut exact, &ids).unwrap(), score(&mut fast, &ids).unwrap());
            for (re, rf) in le.iter().zip(&lf) {
                let mut top: Vec<usize> = (0..re.len()).collect();
                top.select_nth_unstable_by(5, |&a, &b| re[b].total_cmp(&re[a]));
                for &t in &top[..5] {
                    worst = worst.max((re[t] - rf[t]).abs());
                }
            }
        }
        eprintln!("{path}: fast against exact, worst |Δ logprob| over the top 5 = {worst:.4}");
        assert!(worst <= TOL, "{path}: {worst}");
    }
}
