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
//!
//! A step of one to [`COARSE_MAX_ROWS`] rows is bound by reading the head's weights, not by its
//! arithmetic: there the first pass runs on a 4-bit copy of a head of 8-bit weights
//! ([`CoarseHead`]), and the refine margin grows by the copy's error spread.

use super::linear::matmul_rows;
use super::pool::{OutPtr, ThreadPool};
use super::quant::{
    q4_pos, q8_pos, takes_quad_layout, wide_pos, QActs, QFormat, QKernel, QMatrix, QK,
};

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
    let vnni_i8_tiles = kernel == QKernel::AvxVnni
        || (kernel == QKernel::Avx512Vnni && !takes_quad_layout(kernel, t));
    n >= TWO_PASS_MIN_ROWS && t >= 2 && vnni_i8_tiles && !one_pass_forced()
}

/// `TANDEM_LM_HEAD=one-pass`: every head takes one pass on its own weights (no first pass on
/// the first activation level or on a 4-bit copy).
fn one_pass_forced() -> bool {
    static ONE_PASS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONE_PASS.get_or_init(|| std::env::var("TANDEM_LM_HEAD").is_ok_and(|v| v == "one-pass"))
}

/// Most logits rows a step may have for the LM head to take its 4-bit copy ([`CoarseHead`]):
/// a step of a few rows reads the head's weights once for all of them, so the bytes read set
/// its time; more rows take the full-precision weights (or [`two_pass`]).
pub const COARSE_MAX_ROWS: usize = 4;

/// A 4-bit copy of a large LM head whose weights take 8 bits or more (Q8_0, Q6_K's
/// [`QFormat::Q8G16`]), for decode steps of one to [`COARSE_MAX_ROWS`] rows. Such a step reads
/// the whole head from memory for each token (Gemma 3 270M: 262,144 × 640 in Q8_0, 189 MB, most
/// of the token's bytes); the copy (Q4_1 blocks of 32, 40 bytes per 64 weights against 72)
/// computes every logit first, then [`refine`] recomputes from the file's weights every entry
/// within [`REFINE_MARGIN`] plus twice [`CoarseHead::spread`] of the first pass's best. The
/// copy's error on a logit is a sum of 640-odd independent rounding errors: its spread follows
/// from each block's mean squared weight error ([`CoarseHead::ms`]) and the activations, and
/// [`COARSE_SIGMAS`] of it cover the largest error over the whole vocabulary with room to
/// spare (Gemma 3 270M: errors of 0.27–0.39 nats r.m.s., at most 2.3, against a spread of
/// ~3.5). A worst-case bound is no use here: summed over 640 inputs it is ~24 nats. The argmax
/// and every likely entry are the one-pass head's (`engine/tests/lm_head.rs`); entries further
/// down keep their 4-bit values.
pub struct CoarseHead {
    /// The copy, in [`QFormat::Q4_1`].
    pub w: QMatrix,
    /// For each block of 32 inputs, the mean of `(copy − weight)²` over the rows and elements.
    pub ms: Vec<f32>,
}

/// Standard deviations of the copy's error on a logit that [`CoarseHead::spread`] gives.
pub const COARSE_SIGMAS: f32 = 9.0;

impl CoarseHead {
    /// The copy of `w`, when `w` is a head worth one: at least [`TWO_PASS_MIN_ROWS`] rows of
    /// 8-bit weights, and `TANDEM_LM_HEAD` not `one-pass`.
    pub fn for_head(w: &QMatrix) -> Option<CoarseHead> {
        let wide = matches!(w.format, QFormat::Q8_0 | QFormat::Q8G16);
        (wide && w.n >= TWO_PASS_MIN_ROWS && !one_pass_forced()).then(|| CoarseHead::new(w))
    }

    /// Quantises `w` to Q4_1 blocks of 32 (each block's minimum and step, rounded to f16 first,
    /// then the values to the nearest of the 16 levels), on every core.
    pub fn new(w: &QMatrix) -> CoarseHead {
        let mut c = QMatrix::zeroed(QFormat::Q4_1, w.n, w.k);
        let (np, pb, nb) = (c.npairs, QFormat::Q4_1.pair_bytes(), w.k / QK);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 16);
        let per = w.n.div_ceil(threads).max(1);
        let mut sums = vec![vec![0f64; nb]; threads];
        std::thread::scope(|s| {
            let parts = c.qs.chunks_mut(per * np * pb).zip(c.dm.chunks_mut(per * np * 4));
            for (i, ((qs, dm), sum)) in parts.zip(sums.iter_mut()).enumerate() {
                s.spawn(move || {
                    let mut row = vec![0f32; w.k];
                    for rr in 0..qs.len() / (np * pb) {
                        w.row_f32(i * per + rr, &mut row);
                        for (blk, v) in row.chunks_exact(QK).enumerate() {
                            let (p, b) = (blk / 2, blk % 2);
                            let lo = v.iter().fold(f32::INFINITY, |a, &x| a.min(x));
                            let hi = v.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
                            let m = half::f16::from_f32(lo);
                            let d = half::f16::from_f32((hi - lo) / 15.0);
                            let (mf, df) = (m.to_f32(), d.to_f32());
                            dm[(rr * np + p) * 4 + b] = d;
                            dm[(rr * np + p) * 4 + 2 + b] = m;
                            let base = (rr * np + p) * pb;
                            for (j, &x) in v.iter().enumerate() {
                                let q = match df > 0.0 {
                                    true => ((x - mf) / df).round().clamp(0.0, 15.0),
                                    false => 0.0,
                                };
                                sum[blk] += ((mf + df * q - x) as f64).powi(2);
                                let byte = &mut qs[base + q4_pos(b, j % 16)];
                                *byte |= if j < 16 { q as u8 } else { (q as u8) << 4 };
                            }
                        }
                    }
                });
            }
        });
        let per_block = (w.n * QK) as f64;
        let ms = (0..nb).map(|b| (sums.iter().map(|s| s[b]).sum::<f64>() / per_block) as f32);
        CoarseHead { w: c, ms: ms.collect() }
    }

    /// [`COARSE_SIGMAS`] standard deviations of the copy's error on a logit of the activation
    /// row `x`: `√(Σ_blocks ms · ‖x_block‖₂²)` of them.
    pub fn spread(&self, x: &[f32]) -> f32 {
        let var: f32 =
            x.chunks(QK).zip(&self.ms).map(|(v, e)| e * v.iter().map(|a| a * a).sum::<f32>()).sum();
        COARSE_SIGMAS * var.sqrt()
    }
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

/// The second pass: `out` (`a.t × w.n`) holds the first pass's logits of `a`'s rows; every entry
/// that may lie within [`REFINE_MARGIN`] of its row's best is replaced by its value on `w` with
/// both activation levels. `spread[t]` bounds row `t`'s first-pass error ([`CoarseHead::spread`];
/// none or zero for the first activation level alone, whose error the margin covers). With a
/// spread `s`, the entries within `2s` of the first pass's best are recomputed first (the true
/// best is among them), then those within the margin plus `s` of the best they hold. Rows are
/// spread over the CPU pool. Returns how many entries were recomputed.
pub fn refine(kernel: QKernel, w: &QMatrix, a: &QActs, spread: &[f32], out: &mut [f32]) -> usize {
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
        let first_best = row_max(&chunk_max);
        let one = a.token(t);
        let mut done = 0;
        // Recomputes the entries at or above `floor` but `skip` (noting them in `keep`),
        // returning the largest result.
        let mut pass =
            |row: &mut [f32], floor: f32, skip: &[usize], mut keep: Option<&mut Vec<usize>>| {
                let mut best = f32::NEG_INFINITY;
                for (c, _) in chunk_max.iter().enumerate().filter(|(_, &m)| m >= floor) {
                    let (c0, c1) = (c * SCAN_CHUNK, ((c + 1) * SCAN_CHUNK).min(n));
                    for r in c0..c1 {
                        if row[r] >= floor && skip.binary_search(&r).is_err() {
                            // SAFETY: a one-token batch writes entry `r` of the `n` floats at `row`.
                            unsafe { matmul_rows(kernel, w, &one, r..r + 1, row.as_mut_ptr()) };
                            best = best.max(row[r]);
                            done += 1;
                            if let Some(k) = keep.as_deref_mut() {
                                k.push(r);
                            }
                        }
                    }
                }
                best
            };
        match spread.get(t).copied().unwrap_or(0.0) {
            s if s > 0.0 => {
                // The true best is among the entries within `2s` of the first pass's best; the
                // entries within the margin of it lie within the margin plus `s` by the first
                // pass. Those done first are skipped by their index: their values changed.
                let mut top = Vec::new();
                let best = pass(row, first_best - 2.0 * s, &[], Some(&mut top));
                pass(row, best - REFINE_MARGIN - s, &top, None);
            }
            _ => {
                pass(row, first_best - REFINE_MARGIN, &[], None);
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
