//! The LM head of a large vocabulary on the CPU fast path, in two passes.
//!
//! A vocabulary of 49k-262k rows makes the LM head the largest matmul of a batched decode step
//! (Gemma 3 270M: 262,144 × 640, more multiply-adds per token than its 18 layers together).
//! The fast path's activations carry two int8 levels (`quant.rs`); the first alone moves a logit
//! by a few hundredths of a nat. So the head first runs on the first level over the whole
//! vocabulary (half the integer work), then recomputes on both levels every entry within
//! [`REFINE_MARGIN`] nats of its row's best. Those entries - the argmax, the top log-probs,
//! every token a sampler at temperature 1 draws but once in thousands of steps - are the
//! one-pass head's values. An entry further down keeps its first-level value: each weighs less
//! than e⁻⁸ of the best in the softmax, so the normaliser, and with it every likely token's
//! probability, moves by about a thousandth (measured on SmolLM2 and Gemma 3 by
//! `engine/tests/lm_head.rs`), far below the fast path's own distance from the exact one. Rows
//! whose far entries can matter - reported log-probs, beams, biases, penalties, grammars
//! (`SamplingParams::reads_far_logits`), teacher-forced scoring - take the one-pass head
//! ([`crate::backend::Logits::LastExact`], [`crate::backend::Logits::All`]).

use super::linear::matmul_rows;
use super::pool::{OutPtr, ThreadPool};
use super::quant::{q8_pos, takes_quad_layout, wide_pos, QActs, QKernel, QMatrix};

/// Rows from which an LM head takes two passes (smaller heads cost little either way).
pub const TWO_PASS_MIN_ROWS: usize = 16_384;

/// Entries within this many nats (logit units) of their row's best are recomputed exactly.
pub const REFINE_MARGIN: f32 = 8.0;

/// Whether a head of `n` rows, `t` logits rows, runs in two passes on `kernel`: only where the
/// first level alone is cheaper, for batches (one token's head is bound by reading the weights,
/// which both passes do once), unless `TANDEM_LM_HEAD=one-pass`. The first pass runs on the
/// i8 VNNI tiles, which skip the second level's `vpdpbusd`. The i16 batch kernels
/// ([`takes_quad_layout`]) cost the same on one level or two; on AVX-512 the batch kernel
/// outruns the first level alone (SmolLM2 Q4_K_M batched decode, 32 × (64 + 64), ~900 tok/s
/// in two passes, ~925 in one on a 2-core AMD EPYC family 26 model 2 (Zen 5)), on AVX-VNNI the
/// i8 first pass wins (Gemma 3 270M Q4_K_M, same load and CPU: head 2.68 s in one pass on the
/// 256-bit batch kernel, 2.37 s in two).
pub fn two_pass(kernel: QKernel, n: usize, t: usize) -> bool {
    static ONE_PASS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let one_pass =
        *ONE_PASS.get_or_init(|| std::env::var("TANDEM_LM_HEAD").is_ok_and(|v| v == "one-pass"));
    let vnni_i8_tiles = kernel == QKernel::AvxVnni
        || (kernel == QKernel::Avx512Vnni && !takes_quad_layout(kernel, t));
    n >= TWO_PASS_MIN_ROWS && t >= 2 && vnni_i8_tiles && !one_pass
}

impl QActs {
    /// The first level alone: `qs2` zero and the sums (`s`, `s8`, `s4`) of `q₁` alone, so any
    /// kernel computes `Σ w·d·q₁`; `coarse` tells the VNNI kernels to skip the second level.
    pub fn coarse(&self) -> QActs {
        let np = self.npairs;
        let mut c = QActs {
            t: self.t,
            npairs: np,
            qs: self.qs.clone(),
            qs2: vec![0; self.qs2.len()],
            q16: Vec::new(),
            // `256·q₁ + q₂` with `|q₂| ≤ 127` rounds to `256·q₁`.
            q16_quad: self.q16_quad.iter().map(|&v| ((v as i32 + 128) >> 8 << 8) as i16).collect(),
            d_quad: self.d_quad.clone(),
            s_quad: vec![0.0; self.s_quad.len()],
            d: self.d.clone(),
            s: vec![0.0; self.s.len()],
            s8: vec![0.0; self.s8.len()],
            d4: self.d4.clone(),
            s4: vec![0.0; self.s4.len()],
            coarse: true,
        };
        for ti in 0..self.t {
            for p in 0..np {
                let pair = &self.qs[(ti * np + p) * 64..(ti * np + p + 1) * 64];
                for b in 0..2 {
                    let sum: i32 = (0..32).map(|j| pair[q8_pos(b, j)] as i32).sum();
                    let at = (ti * np + p) * 2 + b;
                    // `d` is the scale of the combined `256·q₁ + q₂`.
                    let s = self.d[at] * 256.0 * sum as f32;
                    c.s[at] = s;
                    c.s8[at] = s * 0.125;
                    c.s4[(ti / 4) * np * 8 + p * 8 + (ti % 4) * 2 + b] = s;
                    if !c.s_quad.is_empty() {
                        let lane = (((ti / 4) * np + p) * 4 + ti % 4) * 4 + 2 * b;
                        c.s_quad[lane..lane + 2].fill(s * 0.5);
                    }
                }
            }
        }
        if !self.q16.is_empty() {
            c.q16 = vec![0; self.q16.len()];
            for (i, &q) in self.qs.iter().enumerate() {
                let (pair, j) = (i / 64, i % 64);
                c.q16[pair * 64 + wide_pos(j)] = 256 * q as i16;
            }
        }
        c
    }

    /// Token `t` alone, as a one-token batch.
    pub fn token(&self, t: usize) -> QActs {
        let np = self.npairs;
        let (r64, r2) = (t * np * 64..(t + 1) * np * 64, t * np * 2..(t + 1) * np * 2);
        let (mut d4, mut s4) = (vec![0.0; np * 8], vec![0.0; np * 8]);
        for p in 0..np {
            for b in 0..2 {
                d4[p * 8 + b] = self.d[(t * np + p) * 2 + b];
                s4[p * 8 + b] = self.s[(t * np + p) * 2 + b];
            }
        }
        QActs {
            t: 1,
            npairs: np,
            qs: self.qs[r64.clone()].to_vec(),
            qs2: self.qs2[r64.clone()].to_vec(),
            // The per-token i16 layout, which a batch quantised for the i16 batch kernels
            // lacks, from the two levels.
            q16: {
                let mut q16 = vec![0i16; np * 64];
                for (j, (&q1, &q2)) in self.qs[r64.clone()].iter().zip(&self.qs2[r64]).enumerate() {
                    q16[(j / 64) * 64 + wide_pos(j % 64)] = 256 * q1 as i16 + q2 as i16;
                }
                q16
            },
            // One row takes the i8 tiles.
            q16_quad: Vec::new(),
            d_quad: Vec::new(),
            s_quad: Vec::new(),
            d: self.d[r2.clone()].to_vec(),
            s: self.s[r2.clone()].to_vec(),
            s8: self.s8[r2].to_vec(),
            d4,
            s4,
            coarse: self.coarse,
        }
    }
}

/// The second pass: `out` (`a.t × w.n`) holds the first-level logits of `a`'s rows; every entry
/// within [`REFINE_MARGIN`] of its row's best is replaced by its value on both levels. Rows are
/// spread over the CPU pool. Returns how many entries were recomputed.
pub fn refine(kernel: QKernel, w: &QMatrix, a: &QActs, out: &mut [f32]) -> usize {
    let n = w.n;
    assert_eq!(out.len(), a.t * n, "refine: logits size");
    let ptr = OutPtr(out.as_mut_ptr());
    let count = std::sync::atomic::AtomicUsize::new(0);
    ThreadPool::global().run(a.t, &|t| {
        // SAFETY: each task owns logits row `t`.
        let row = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(t * n), n) };
        // A few hundred entries of 262,144 pass. The row (1 MiB, read from memory: a batch's
        // logits outgrow the caches) is read once, for the maxima of its chunks (which
        // vectorise); then only the chunks that reach the floor are tested entry by entry.
        let chunk_max: Vec<f32> = row.chunks(SCAN_CHUNK).map(row_max).collect();
        let floor = row_max(&chunk_max) - REFINE_MARGIN;
        let one = a.token(t);
        let mut done = 0;
        for (c, _) in chunk_max.iter().enumerate().filter(|(_, &m)| m >= floor) {
            let (c0, c1) = (c * SCAN_CHUNK, ((c + 1) * SCAN_CHUNK).min(n));
            for r in c0..c1 {
                if row[r] >= floor {
                    // SAFETY: a one-token batch writes entry `r` of the `n` floats at `row`.
                    unsafe { matmul_rows(kernel, w, &one, r..r + 1, row.as_mut_ptr()) };
                    done += 1;
                }
            }
        }
        count.fetch_add(done, std::sync::atomic::Ordering::Relaxed);
    });
    count.into_inner()
}

/// Entries of a logits row whose maximum [`refine`] tests at once.
const SCAN_CHUNK: usize = 64;

/// The largest entry (NaN-free logits), in eight lanes the compiler vectorises.
fn row_max(row: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            m[j] = if c[j] > m[j] { c[j] } else { m[j] };
        }
    }
    tail.iter().chain(&m).fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a })
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod head_tests;
