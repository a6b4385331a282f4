//! A model whose weight matrices are all of one K-quant type gives the exact path's logits on
//! the CPU fast path (its fused q|k|v and gate|up of one type, so Q2_K's values and group
//! minimums stacked as one layer). That each type reaches its integer kernel is checked by the
//! kernel tests (`linear.rs`): an f32 fallback would pass here too.

use tandem_engine::backend::{ForwardBatch, KernelPath, Logits};
use tandem_engine::{LoadOptions, Model};

mod common;

/// Hidden and feed-forward widths: whole 256-weight super-blocks.
const H: u64 = 256;
const FF: u64 = 512;

/// Random super-blocks of `ty` (GGML type id) for `n` rows of `k`: random bytes with small
/// positive `d` (and `dmin`) where each type keeps them.
fn random_k_quant(ty: u32, n: u64, k: u64, seed: &mut u64) -> Vec<u8> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    // Block bytes and where `d` (then `dmin`) sit.
    let (bytes, scales): (usize, &[usize]) = match ty {
        10 => (84, &[80, 82]), // Q2_K
        11 => (110, &[108]),   // Q3_K
        12 => (144, &[0, 2]),  // Q4_K
        13 => (176, &[0, 2]),  // Q5_K
        14 => (210, &[208]),   // Q6_K
        _ => unreachable!(),
    };
    let mut out = Vec::new();
    for _ in 0..n * k / 256 {
        let mut b: Vec<u8> = (0..bytes).map(|_| next() as u8).collect();
        for (i, &at) in scales.iter().enumerate() {
            let v = (0.0004 + (next() % 1000) as f32 * 1e-6) / (1 + i) as f32;
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        out.extend(b);
    }
    out
}

fn last_logits(m: &mut Model, tokens: &[u32]) -> Vec<f32> {
    let table: Vec<u32> = (0..4).collect();
    let mut b = ForwardBatch::default();
    b.push_seq(tokens, 0, &table, 16, Logits::Last);
    m.backend.forward(&b).unwrap()
}

#[test]
fn every_k_quant_model_matches_the_exact_path() {
    let dir = std::env::temp_dir().join(format!("tandem-kq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (ty, name) in [(10, "Q2_K"), (11, "Q3_K"), (12, "Q4_K"), (13, "Q5_K"), (14, "Q6_K")] {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ ty as u64;
        let w = common::tiny_llama(H, FF, |_, n, k| (ty, random_k_quant(ty, n, k, &mut seed)));
        let p = dir.join(format!("{name}.gguf"));
        std::fs::write(&p, w.build()).unwrap();
        let load = |kernel| {
            let opts = LoadOptions { kernel, ..LoadOptions::with_kv_tokens(64) };
            Model::load(&p, opts).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let (mut exact, mut fast) = (load(KernelPath::Exact), load(KernelPath::Fast));
        for tokens in [&[0u32, 5, 7, 9][..], &[2, 3, 30, 31, 12, 8, 1]] {
            let (le, lf) = (last_logits(&mut exact, tokens), last_logits(&mut fast, tokens));
            let spread = le.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let worst = le.iter().zip(&lf).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
            eprintln!("{name}: max |fast − exact| {worst:.2e} over logits up to {spread:.3}");
            assert!(spread > 0.05, "{name}: logits too flat to compare ({spread})");
            assert!(worst <= 2e-3 * spread, "{name} {tokens:?}: {worst} against {spread}");
        }
    }
}
