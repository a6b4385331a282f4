//! The CPU fast path's two-pass LM head (`backend/cpu/head.rs`) on the real models: a batch of
//! decode rows (`Logits::Last`) against the same batch asking for exact rows (the one-pass
//! head). Every logit within the refine margin of its row's best is the one-pass value, the
//! argmax is the same, and the top entries' log-probs (the probabilities a sampler draws from)
//! move by a few thousandths of a nat at most.

use tandem_engine::backend::cpu::head::{two_pass, REFINE_MARGIN};
use tandem_engine::backend::cpu::quant::QKernel;
use tandem_engine::backend::{ForwardBatch, KernelPath, Logits};
use tandem_engine::{model_files::model_fetch, LoadOptions, Model};

const PROMPTS: [&str; 6] = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "Water boils at",
    "The three primary colours are red,",
    "Translate to German: Good morning! ->",
];

fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)) as f64;
    let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    row[i] as f64 - lse
}

fn check(path: &std::path::Path) {
    let mut model = Model::load(
        path,
        LoadOptions { kernel: KernelPath::Fast, ..LoadOptions::with_kv_tokens(1024) },
    )
    .unwrap();
    let vocab = model.config.vocab_size;
    // The most prompts whose batch takes two passes (AVX-512 batches of four rows or more take
    // the one-pass i16 kernel).
    let Some(rows) = (2..=PROMPTS.len()).rev().find(|&t| two_pass(QKernel::detect(), vocab, t))
    else {
        eprintln!(
            "SKIPPED: kernel {:?} takes the one-pass head (the two-pass head needs AVX-512 VNNI \
             or AVX-VNNI; TANDEM_LM_HEAD=one-pass turns it off); head_tests covers the logic",
            QKernel::detect()
        );
        return;
    };
    let bs = model.backend.kv_cache_spec().block_size;
    // A page per logical block and KV group (Gemma 3's sliding-window layers have their own).
    let groups = model.backend.kv_groups().num_groups();
    let mut batch = ForwardBatch::with_kv_groups(groups);
    let mut next_block = 0u32;
    for p in &PROMPTS[..rows] {
        let ids = model.tokenizer.encode(p, true).unwrap();
        let pages = ids.len().div_ceil(bs) * groups;
        let blocks: Vec<u32> = (0..pages as u32).map(|b| next_block + b).collect();
        next_block += blocks.len() as u32;
        batch.push_seq(&ids, 0, &blocks, bs, Logits::Last);
    }
    let two = model.backend.forward(&batch).unwrap();
    let mut exact = batch.clone();
    exact.logits_exact.iter_mut().for_each(|e| *e = true);
    let one = model.backend.forward(&exact).unwrap();
    assert_eq!(one.len(), rows * vocab);
    let (mut refined, mut moved, mut worst_top) = (0usize, 0usize, 0f64);
    for (ri, (o, t)) in one.chunks_exact(vocab).zip(two.chunks_exact(vocab)).enumerate() {
        let best = o.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        for r in 0..vocab {
            if o[r] >= best - REFINE_MARGIN + 0.5 {
                refined += 1;
                assert!(
                    (t[r] - o[r]).abs() <= 1e-4 * (1.0 + o[r].abs()),
                    "prompt {ri} token {r}: {} two-pass vs {} one-pass",
                    t[r],
                    o[r]
                );
            } else {
                moved += usize::from((t[r] - o[r]).abs() > 1e-4);
            }
        }
        let mut top: Vec<usize> = (0..vocab).collect();
        top.sort_by(|&i, &j| o[j].total_cmp(&o[i]));
        assert_eq!(
            (0..vocab).max_by(|&i, &j| t[i].total_cmp(&t[j])).unwrap(),
            top[0],
            "prompt {ri}: argmax"
        );
        for &i in &top[..5] {
            worst_top = worst_top.max((log_softmax_at(o, i) - log_softmax_at(t, i)).abs());
        }
    }
    eprintln!(
        "{}: {refined} entries within the margin (of {}), {moved} far entries moved by > 1e-4, \
         worst top-5 log-prob change {worst_top:.2e}",
        path.display(),
        rows * vocab
    );
    assert!(moved > 0, "the first pass is the coarse one");
    assert!(worst_top < 4e-3, "top-5 log-probs moved by {worst_top}");
}

#[test]
fn gemma3_two_pass_head_equals_one_pass_on_likely_tokens() {
    check(&model_fetch::GEMMA3_270M.path().expect("fetch Gemma 3 270M"));
}

#[test]
fn smollm2_two_pass_head_equals_one_pass_on_likely_tokens() {
    check(&model_fetch::default_model_path().expect("fetch the default model"));
}
