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

/// Tallies of [`compare`] over rows.
#[derive(Default)]
struct Tally {
    refined: usize,
    moved: usize,
    worst_top: f64,
}

/// One logits row `t` against the one-pass row `o` (prompt `ri`): every entry within the
/// margin (less `inside`) equal, the argmax the same; counts the far entries that moved.
fn compare(ri: usize, o: &[f32], t: &[f32], inside: f32, tally: &mut Tally) {
    let vocab = o.len();
    let best = o.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for r in 0..vocab {
        if o[r] >= best - REFINE_MARGIN + inside {
            tally.refined += 1;
            assert!(
                (t[r] - o[r]).abs() <= 1e-4 * (1.0 + o[r].abs()),
                "prompt {ri} token {r}: {} first pass vs {} one-pass",
                t[r],
                o[r]
            );
        } else {
            tally.moved += usize::from((t[r] - o[r]).abs() > 1e-4);
        }
    }
    let mut top: Vec<usize> = (0..vocab).collect();
    top.sort_by(|&i, &j| o[j].total_cmp(&o[i]));
    let argmax = (0..vocab).max_by(|&i, &j| t[i].total_cmp(&t[j])).unwrap();
    assert_eq!(argmax, top[0], "prompt {ri}: argmax");
    for &i in &top[..5] {
        tally.worst_top = tally.worst_top.max((log_softmax_at(o, i) - log_softmax_at(t, i)).abs());
    }
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
    let mut tally = Tally::default();
    for (ri, (o, t)) in one.chunks_exact(vocab).zip(two.chunks_exact(vocab)).enumerate() {
        compare(ri, o, t, 0.5, &mut tally);
    }
    let Tally { refined, moved, worst_top } = tally;
    eprintln!(
        "{}: {refined} entries within the margin (of {}), {moved} far entries moved by > 1e-4, \
         worst top-5 log-prob change {worst_top:.2e}",
        path.display(),
        rows * vocab
    );
    assert!(moved > 0, "the first pass is the coarse one");
    assert!(worst_top < 4e-3, "top-5 log-probs moved by {worst_top}");
}

/// The head of a one-row step on its 4-bit copy (`head::CoarseHead`, for heads of 8-bit
/// weights: both models' tied Q8_0 embeddings) against the one-pass head, prompt by prompt.
fn check_coarse(path: &std::path::Path) {
    let mut model = Model::load(
        path,
        LoadOptions { kernel: KernelPath::Fast, ..LoadOptions::with_kv_tokens(1024) },
    )
    .unwrap();
    let vocab = model.config.vocab_size;
    let bs = model.backend.kv_cache_spec().block_size;
    let groups = model.backend.kv_groups().num_groups();
    let mut tally = Tally::default();
    for (pi, p) in PROMPTS.iter().enumerate() {
        let ids = model.tokenizer.encode(p, true).unwrap();
        let blocks: Vec<u32> = (0..(ids.len().div_ceil(bs) * groups) as u32).collect();
        let mut batch = ForwardBatch::with_kv_groups(groups);
        batch.push_seq(&ids, 0, &blocks, bs, Logits::Last);
        let t = model.backend.forward(&batch).unwrap();
        let mut exact = batch.clone();
        exact.logits_exact.iter_mut().for_each(|e| *e = true);
        let o = model.backend.forward(&exact).unwrap();
        compare(pi, &o, &t, 0.0, &mut tally);
    }
    let Tally { refined, moved, worst_top } = tally;
    eprintln!(
        "{}: {refined} entries within the margin, {moved} far entries moved by > 1e-4 (of {}), \
         worst top-5 log-prob change {worst_top:.2e}",
        path.display(),
        PROMPTS.len() * vocab
    );
    assert!(moved > vocab, "the far entries are the copy's");
    assert!(worst_top < 4e-3, "top-5 log-probs moved by {worst_top}");
}

#[test]
fn gemma3_one_row_head_on_its_4_bit_copy_equals_one_pass_on_likely_tokens() {
    check_coarse(&model_fetch::GEMMA3_270M.path().expect("fetch Gemma 3 270M"));
}

#[test]
fn smollm2_one_row_head_on_its_4_bit_copy_equals_one_pass_on_likely_tokens() {
    check_coarse(&model_fetch::default_model_path().expect("fetch the default model"));
}

#[test]
fn gemma3_two_pass_head_equals_one_pass_on_likely_tokens() {
    check(&model_fetch::GEMMA3_270M.path().expect("fetch Gemma 3 270M"));
}

#[test]
fn smollm2_two_pass_head_equals_one_pass_on_likely_tokens() {
    check(&model_fetch::default_model_path().expect("fetch the default model"));
}

/// The runner hands each step's logits buffer back to the backend, which returns the next
/// step's logits in it without clearing it: every entry must be written again, whichever head
/// runs (two passes, one pass, a longer or shorter batch than the buffer's last).
#[test]
fn a_recycled_logits_buffer_is_overwritten_entirely() {
    let path = model_fetch::default_model_path().expect("fetch the default model");
    let mut model = Model::load(
        &path,
        LoadOptions { kernel: KernelPath::Fast, ..LoadOptions::with_kv_tokens(1024) },
    )
    .unwrap();
    let bs = model.backend.kv_cache_spec().block_size;
    let batch = |n: usize, logits: Logits| {
        let mut b = ForwardBatch::default();
        let mut next = 0u32;
        for p in &PROMPTS[..n] {
            let ids = model.tokenizer.encode(p, true).unwrap();
            let blocks: Vec<u32> = (next..next + ids.len().div_ceil(bs) as u32).collect();
            next += blocks.len() as u32;
            b.push_seq(&ids, 0, &blocks, bs, logits);
        }
        b
    };
    let cases = [batch(3, Logits::Last), batch(3, Logits::LastExact), batch(2, Logits::Last)];
    let fresh: Vec<Vec<f32>> = cases.iter().map(|b| model.backend.forward(b).unwrap()).collect();
    for (b, want) in cases.iter().zip(&fresh) {
        // A buffer of NaN, longer than this batch's logits.
        model.backend.recycle_logits(vec![f32::NAN; 5 * model.config.vocab_size]);
        let got = model.backend.forward(b).unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got.iter().zip(want).all(|(g, w)| g.to_bits() == w.to_bits()), "stale entries");
    }
}
