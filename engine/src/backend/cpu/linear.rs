//! Linear layers of the CPU backend. `ExactLinear` keeps f32 weights and accumulates in f32;
//! it is the oracle for the quantised kernels that sit behind the same [`Linear`] trait.

use std::sync::Arc;

use rayon::prelude::*;

/// `y = x · Wᵀ` for a batch of rows.
pub trait Linear: Send + Sync {
    /// Input width.
    fn in_features(&self) -> usize;
    /// Output width.
    fn out_features(&self) -> usize;
    /// `x` is `t × in_features`, `out` is `t × out_features`.
    fn forward(&self, x: &[f32], t: usize, out: &mut [f32]);
    /// [`Linear::forward`] from activations already quantised for this layer's input width
    /// (so layers that share an input quantise it once); `false`, with nothing written, for a
    /// layer whose weights are not quantised.
    fn forward_from_acts(&self, a: &super::quant::QActs, out: &mut [f32]) -> bool {
        let _ = (a, out);
        false
    }
    /// [`Linear::forward`] for logits: rows not marked in `exact` (one flag per row) may have
    /// their entries far below the row's best approximate (the two-pass LM head, `head.rs`).
    fn forward_logits(&self, x: &[f32], t: usize, exact: &[bool], out: &mut [f32]) {
        let _ = exact;
        self.forward(x, t, out)
    }
    /// This layer as a model's LM head: the same layer, or one that also keeps what makes a
    /// large head cheaper ([`super::head::CoarseHead`]).
    fn into_lm_head(self: Arc<Self>) -> Arc<dyn Linear>;
}

/// A linear layer with f32 weights, row-major `[out_features, in_features]`.
pub struct ExactLinear {
    w: Arc<[f32]>,
    n: usize,
    k: usize,
}

/// Output rows computed together so a tile of weights stays in cache across the batch.
const ROW_TILE: usize = 16;

impl ExactLinear {
    /// Wraps f32 weights of shape `[n, k]`.
    pub fn new(w: Arc<[f32]>, n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "ExactLinear weight size");
        ExactLinear { w, n, k }
    }
}

/// f32 dot product with eight independent partial sums (vectorisable, deterministic order);
/// `b` may hold any KV element type, widened to f32 as it is read.
#[inline(always)]
pub fn dot<E: super::kv_cache::KvElem>(a: &[f32], b: &[E]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for j in 0..8 {
            acc[j] += x[j] * y[j].to_f32();
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..a.len() {
        s += a[i] * b[i].to_f32();
    }
    s
}

impl Linear for ExactLinear {
    fn into_lm_head(self: Arc<Self>) -> Arc<dyn Linear> {
        self
    }
    fn in_features(&self) -> usize {
        self.k
    }
    fn out_features(&self) -> usize {
        self.n
    }
    fn forward(&self, x: &[f32], t: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        debug_assert_eq!(x.len(), t * k);
        debug_assert_eq!(out.len(), t * n);
        let tiles: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(ROW_TILE))
            .into_par_iter()
            .map(|tile| {
                let r0 = tile * ROW_TILE;
                let r1 = (r0 + ROW_TILE).min(n);
                let mut buf = vec![0f32; t * (r1 - r0)];
                for ti in 0..t {
                    let xr = &x[ti * k..(ti + 1) * k];
                    for r in r0..r1 {
                        buf[ti * (r1 - r0) + (r - r0)] = dot(xr, &self.w[r * k..(r + 1) * k]);
                    }
                }
                (r0, buf)
            })
            .collect();
        for (r0, buf) in tiles {
            let w = buf.len() / t.max(1);
            for ti in 0..t {
                out[ti * n + r0..ti * n + r0 + w].copy_from_slice(&buf[ti * w..(ti + 1) * w]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_matmul() {
        let (n, k, t) = (37, 45, 3);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect();
        let x: Vec<f32> = (0..t * k).map(|i| ((i * 104729) % 11) as f32 * 0.5 - 2.0).collect();
        let lin = ExactLinear::new(w.clone().into(), n, k);
        let mut out = vec![0f32; t * n];
        lin.forward(&x, t, &mut out);
        for ti in 0..t {
            for r in 0..n {
                let want: f32 = (0..k).map(|i| x[ti * k + i] * w[r * k + i]).sum();
                assert!((out[ti * n + r] - want).abs() < 1e-3, "{ti},{r}");
            }
        }
    }
}

/// A linear layer with quantised weights (Q4_1 / Q4_0 / Q8_0 kept as loaded) and 8-bit
/// activations: the CPU fast path.
pub struct QuantLinear {
    w: Arc<super::quant::QMatrix>,
    kernel: super::quant::QKernel,
    /// An LM head's 4-bit copy, for steps of few rows.
    coarse: Option<Arc<super::head::CoarseHead>>,
}

thread_local! {
    static ACTS: std::cell::RefCell<super::quant::QActs> = std::cell::RefCell::new(super::quant::QActs::default());
}

/// Rows per parallel task: enough work to amortise the hand-off, enough tasks to balance.
fn row_chunk(n: usize, k: usize, t: usize, threads: usize) -> usize {
    if n * k * t < 32 * 1024 {
        return n; // too small to split
    }
    let tasks = threads * 4;
    // A multiple of four rows: decode kernels take rows four at a time.
    n.div_ceil(tasks).clamp(8, 1024).next_multiple_of(4)
}

/// Computes rows `rows` of `out = a · wᵀ` (`out` is `t × n`, row-major) with `kernel`: the
/// x86 SIMD kernels of `quant_x86.rs`, or the portable kernel `quant::portable` (whose results
/// are the oracle `quant::scalar`'s).
///
/// # Safety
/// `out` must point to `a.t × w.n` floats, and no other thread may write the same rows.
pub(super) unsafe fn matmul_rows(
    kernel: super::quant::QKernel,
    w: &super::quant::QMatrix,
    a: &super::quant::QActs,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        super::quant::QKernel::Avx512Vnni
        | super::quant::QKernel::AvxVnni
        | super::quant::QKernel::Avx2 => super::quant_x86::matmul_rows(kernel, w, a, rows, out),
        _ => super::quant::portable::rows(w, a, rows, out),
    }
}

impl QuantLinear {
    /// Wraps a repacked matrix; `kernel` is usually [`super::quant::QKernel::detect`].
    pub fn new(w: Arc<super::quant::QMatrix>, kernel: super::quant::QKernel) -> Self {
        QuantLinear { w, kernel, coarse: None }
    }

    /// `out = a · wᵀ` for already quantised activations.
    pub fn forward_quantized(&self, a: &super::quant::QActs, out: &mut [f32]) {
        matmul(self.kernel, &self.w, a, out);
    }
}

/// `out = a · wᵀ` on `kernel`, rows of `w` spread over the CPU pool.
fn matmul(
    kernel: super::quant::QKernel,
    w: &super::quant::QMatrix,
    a: &super::quant::QActs,
    out: &mut [f32],
) {
    let (n, t) = (w.n, a.t);
    debug_assert_eq!(out.len(), t * n);
    let ptr = super::pool::OutPtr(out.as_mut_ptr());
    let pool = super::pool::ThreadPool::global();
    let chunk = row_chunk(n, w.k, t, pool.num_threads());
    pool.run(n.div_ceil(chunk), &|c| {
        let rows = c * chunk..((c + 1) * chunk).min(n);
        // SAFETY: tasks cover disjoint row ranges of a buffer of t × n floats.
        unsafe { matmul_rows(kernel, w, a, rows, ptr.get()) };
    });
}

/// Fused projections whose parts have different weight formats (e.g. a Q5_1 query next to a
/// Q8_0 value projection): each part runs its own kernel and its rows are placed side by side
/// in the output, as one stacked matrix would put them.
pub struct StackedLinear {
    parts: Vec<Arc<dyn Linear>>,
    n: usize,
}

impl StackedLinear {
    /// Stacks layers with the same input width.
    pub fn new(parts: Vec<Arc<dyn Linear>>) -> Self {
        assert!(
            parts.iter().all(|p| p.in_features() == parts[0].in_features()),
            "StackedLinear needs one input width"
        );
        let n = parts.iter().map(|p| p.out_features()).sum();
        StackedLinear { parts, n }
    }
}

thread_local! {
    static STACK_OUT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    static STACK_ACTS: std::cell::RefCell<super::quant::QActs> = std::cell::RefCell::new(super::quant::QActs::default());
}

impl Linear for StackedLinear {
    fn into_lm_head(self: Arc<Self>) -> Arc<dyn Linear> {
        self
    }
    fn in_features(&self) -> usize {
        self.parts[0].in_features()
    }
    fn out_features(&self) -> usize {
        self.n
    }
    fn forward(&self, x: &[f32], t: usize, out: &mut [f32]) {
        if t == 0 {
            return;
        }
        // The parts share their input: it is quantised once, for every quantised part.
        STACK_ACTS.with(|acts| {
            STACK_OUT.with(|cell| {
                let (mut a, mut y) = (acts.borrow_mut(), cell.borrow_mut());
                a.quantize(x, t, self.in_features());
                let mut col = 0;
                for p in &self.parts {
                    let np = p.out_features();
                    y.clear();
                    y.resize(t * np, 0.0);
                    if !p.forward_from_acts(&a, &mut y) {
                        p.forward(x, t, &mut y);
                    }
                    for (o, row) in out.chunks_exact_mut(self.n).zip(y.chunks_exact(np)) {
                        o[col..col + np].copy_from_slice(row);
                    }
                    col += np;
                }
            })
        });
    }
}

impl Linear for QuantLinear {
    fn in_features(&self) -> usize {
        self.w.k
    }
    fn out_features(&self) -> usize {
        self.w.n
    }
    fn forward(&self, x: &[f32], t: usize, out: &mut [f32]) {
        if t == 0 {
            // A step can ask for no rows (e.g. logits of a prefill chunk that ends mid-prompt).
            return;
        }
        ACTS.with(|cell| {
            let mut a = cell.borrow_mut();
            a.quantize_for(x, t, self.w.k, self.kernel);
            self.forward_quantized(&a, out);
        });
    }
    fn forward_from_acts(&self, a: &super::quant::QActs, out: &mut [f32]) -> bool {
        if a.t > 0 {
            self.forward_quantized(a, out);
        }
        true
    }
    fn forward_logits(&self, x: &[f32], t: usize, exact: &[bool], out: &mut [f32]) {
        let approximate = t > 0 && exact.len() == t && !exact.iter().any(|&e| e);
        let k = self.w.k;
        if let Some(c) = self.coarse.as_ref().filter(|_| approximate) {
            if t <= super::head::COARSE_MAX_ROWS {
                return ACTS.with(|cell| {
                    let mut a = cell.borrow_mut();
                    a.quantize_for(x, t, k, self.kernel);
                    matmul(self.kernel, &c.w, &a, out);
                    let spread: Vec<f32> = x.chunks_exact(k).map(|row| c.spread(row)).collect();
                    super::head::refine(self.kernel, &self.w, &a, &spread, out);
                });
            }
        }
        if !(approximate && super::head::two_pass(self.kernel, self.w.n, t)) {
            return self.forward(x, t, out);
        }
        ACTS.with(|cell| {
            let mut a = cell.borrow_mut();
            a.quantize_for(x, t, k, self.kernel);
            self.forward_quantized(&a.coarse(), out);
            super::head::refine(self.kernel, &self.w, &a, &[], out);
        });
    }
    fn into_lm_head(self: Arc<Self>) -> Arc<dyn Linear> {
        match super::head::CoarseHead::for_head(&self.w) {
            Some(c) => Arc::new(QuantLinear {
                w: self.w.clone(),
                kernel: self.kernel,
                coarse: Some(Arc::new(c)),
            }),
            None => self,
        }
    }
}

/// Weights whose groups of 16 each have a minimum (Q2_K: `w = d·s·q − dmin·m`). The scaled
/// values are a [`super::quant::QFormat::Q8G16`] matrix on the integer kernels; the minimum is
/// constant over its group, so its share of `x · wᵀ` is the `[n, k / 16]` matrix of minimums
/// times the activations' f32 sums over each group of 16 (a sixteenth of the work). Each
/// parallel task adds the minimums' share to the rows it has just computed.
pub struct GroupMinLinear {
    values: QuantLinear,
    mins: Arc<[f32]>,
}

thread_local! {
    static GROUP_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl GroupMinLinear {
    /// Wraps the values' matrix `[n, k]` and the groups' minimums (`n × k / 16`, row-major).
    pub fn new(
        values: Arc<super::quant::QMatrix>,
        mins: Vec<f32>,
        kernel: super::quant::QKernel,
    ) -> Self {
        let (n, k) = (values.n, values.k);
        assert!(k.is_multiple_of(16) && mins.len() == n * k / 16, "GroupMinLinear shapes");
        GroupMinLinear { values: QuantLinear::new(values, kernel), mins: mins.into() }
    }
}

/// `out[t][r] += mins[r] · sums[t]` for rows `rows` (`g` groups per row, `n` outputs per token).
#[inline(always)]
fn add_group_mins_body(
    mins: &[f32],
    sums: &[f32],
    g: usize,
    n: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    for r in rows {
        let m = &mins[r * g..(r + 1) * g];
        for (t, s) in sums.chunks_exact(g).enumerate() {
            // SAFETY (caller): `out` holds t × n floats and this task owns row r.
            unsafe { *out.add(t * n + r) += dot(m, s) };
        }
    }
}

/// [`add_group_mins_body`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA; as [`add_group_mins_body`] for `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_group_mins_avx2(
    mins: &[f32],
    sums: &[f32],
    g: usize,
    n: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
) {
    add_group_mins_body(mins, sums, g, n, rows, out)
}

impl Linear for GroupMinLinear {
    fn into_lm_head(self: Arc<Self>) -> Arc<dyn Linear> {
        self
    }
    fn in_features(&self) -> usize {
        self.values.in_features()
    }
    fn out_features(&self) -> usize {
        self.values.out_features()
    }
    fn forward(&self, x: &[f32], t: usize, out: &mut [f32]) {
        if t == 0 {
            return;
        }
        let (w, kernel) = (&*self.values.w, self.values.kernel);
        let (n, g) = (w.n, w.k / 16);
        debug_assert_eq!(out.len(), t * n);
        ACTS.with(|acts| {
            GROUP_SUMS.with(|cell| {
                let (mut a, mut sums) = (acts.borrow_mut(), cell.borrow_mut());
                a.quantize_for(x, t, w.k, kernel);
                sums.clear();
                sums.extend(x.chunks_exact(16).map(|v| v.iter().sum::<f32>()));
                let (a, sums, mins) = (&*a, &sums[..], &self.mins[..]);
                let ptr = super::pool::OutPtr(out.as_mut_ptr());
                let pool = super::pool::ThreadPool::global();
                let chunk = row_chunk(n, w.k, t, pool.num_threads());
                pool.run(n.div_ceil(chunk), &|c| {
                    let rows = c * chunk..((c + 1) * chunk).min(n);
                    // SAFETY: tasks cover disjoint row ranges of a buffer of t × n floats; the
                    // SIMD body runs only where the kernel's detection found AVX2 and FMA.
                    unsafe {
                        matmul_rows(kernel, w, a, rows.clone(), ptr.get());
                        #[cfg(target_arch = "x86_64")]
                        if kernel != super::quant::QKernel::Scalar {
                            add_group_mins_avx2(mins, sums, g, n, rows, ptr.get());
                            return;
                        }
                        add_group_mins_body(mins, sums, g, n, rows, ptr.get());
                    }
                });
            })
        });
    }
}

#[cfg(test)]
mod quant_tests {
    use super::super::quant::{scalar, QActs, QKernel, QMatrix};
    use super::*;
    use crate::model_files::dtype::GgmlType;

    #[test]
    fn every_kernel_matches_the_scalar_oracle() {
        let kernels = QKernel::available();
        eprintln!("kernels on this CPU: {kernels:?}");
        use super::super::quant::tests_support::{random_gguf, random_k};
        // Token counts reach every tile: 8-token tiles, a quad, and leftovers of 1-3.
        let legacy = [
            (37, 96, 1),
            (64, 576, 5),
            (200, 1536, 9),
            (3, 32, 4),
            (70, 160, 7),
            (9, 96, 6),
            (12, 576, 13),
            (40, 576, 20),
        ];
        let k_quant = [(37, 256, 1), (64, 512, 5), (9, 768, 6), (5, 256, 4)];
        let cases =
            [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1]
                .into_iter()
                .flat_map(|ty| legacy.iter().map(move |&s| (ty, s)))
                .chain(
                    [GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
                        .into_iter()
                        .flat_map(|ty| k_quant.iter().map(move |&s| (ty, s))),
                );
        for (ty, (n, k, t)) in cases {
            // Legacy types in 32-blocks; K-quants repacked.
            let seed = (n * k + t) as u64;
            let data = if ty.block_size() == 32 {
                random_gguf(ty, n, k, seed)
            } else {
                random_k(ty, n, k, seed)
            };
            let w = QMatrix::from_gguf(ty, &data, n, k).unwrap();
            let n = w.n;
            let mut rng = crate::sampling::sampler::Rng::new(7);
            let x: Vec<f32> = (0..t * k).map(|_| rng.next_f64() as f32 * 4.0 - 2.0).collect();
            let mut a = QActs::default();
            for &kernel in &kernels {
                // Each kernel's layouts (the two i8 levels, and the i16 ones of the plain AVX2
                // kernel and of the AVX-512 batch tiles); the oracle reads the i8 levels.
                a.quantize_for(&x, t, k, kernel);
                let mut out = vec![0f32; t * n];
                QuantLinear::new(Arc::new(w.clone()), kernel).forward_quantized(&a, &mut out);
                let mut outs = vec![(kernel, out)];
                // The AVX-512 i8 tiles, which decode takes only when asked for by name.
                #[cfg(target_arch = "x86_64")]
                if kernel == QKernel::Avx512Vnni {
                    let mut out = vec![0f32; t * n];
                    // SAFETY: the CPU has AVX-512 VNNI; `out` holds t × n floats.
                    unsafe {
                        super::super::quant_x86::rows_i8_avx512(&w, &a, 0..n, out.as_mut_ptr())
                    };
                    outs.push((kernel, out));
                }
                for (kernel, out) in outs {
                    for r in 0..n {
                        for ti in 0..t {
                            let want = scalar::dot(&w, r, &a, ti);
                            let got = out[ti * n + r];
                            // Kernels with signed 8-bit weights skip the minimum term that
                            // cancels the oracle's +128 bias: rounding relative to that term.
                            let min_mass: f32 = (0..w.npairs * 2)
                                .map(|j| {
                                    let s = a.s[(ti * w.npairs + j / 2) * 2 + j % 2];
                                    (w.min(r, j / 2, j % 2) * s).abs()
                                })
                                .sum();
                            assert!(
                                (got - want).abs() <= 1e-4 * (1.0 + want.abs().max(min_mass)),
                                "{kernel:?} {ty:?} {n}x{k} t{t} [{ti},{r}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
    /// Q6_K's largest products (every value −32, every sub-scale −128, every activation at
    /// the top of its range) on every kernel: the i16 batch kernels widen such a pair to
    /// 4096 and sum sixteen products of it per lane, just below 2³¹.
    #[test]
    fn q6_k_extremes_stay_within_the_integer_sums() {
        let (n, k) = (7, 512);
        let block = |d: f32| {
            let mut b = vec![0u8; 192]; // low and high bits of every value zero: q = −32
            b.extend([0x80u8; 16]); // sub-scales −128
            b.extend(half::f16::from_f32(d).to_le_bytes());
            b
        };
        let data: Vec<u8> =
            (0..n * k / 256).flat_map(|i| block(0.001 * (1 + i % 3) as f32)).collect();
        let w = QMatrix::from_gguf(GgmlType::Q6_K, &data, n, k).unwrap();
        for t in [1, 2, 5, 9] {
            let x = vec![1.5f32; t * k];
            let mut a = QActs::default();
            for &kernel in &QKernel::available() {
                a.quantize_for(&x, t, k, kernel);
                let mut out = vec![0f32; t * n];
                QuantLinear::new(Arc::new(w.clone()), kernel).forward_quantized(&a, &mut out);
                let mut row = vec![0f32; k];
                for r in 0..n {
                    w.row_f32(r, &mut row);
                    let want: f32 = row.iter().map(|v| v * 1.5).sum();
                    for ti in 0..t {
                        let got = out[ti * n + r];
                        assert!(
                            (got - want).abs() <= 1e-4 * want.abs(),
                            "{kernel:?} t{t}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Q2_K on every kernel against the f32 product with the dequantised weights: the values
    /// on the integer kernels plus the minimums on the activations' group sums.
    #[test]
    fn q2_k_group_minimums_match_the_dequantised_product() {
        use super::super::quant::tests_support::random_k;
        for (n, k, t) in [(37, 256, 1), (20, 512, 5), (9, 768, 11)] {
            let data = random_k(GgmlType::Q2_K, n, k, (n + t) as u64);
            let mut w = vec![0f32; n * k];
            crate::model_files::dtype::dequantize(GgmlType::Q2_K, &data, &mut w);
            let mut rng = crate::sampling::sampler::Rng::new(3);
            let x: Vec<f32> = (0..t * k).map(|_| rng.next_f64() as f32 * 2.0 - 0.7).collect();
            for &kernel in &QKernel::available() {
                let (m, mins) = QMatrix::from_q2_k(&data, n, k).unwrap();
                let lin = GroupMinLinear::new(Arc::new(m), mins, kernel);
                assert_eq!((lin.in_features(), lin.out_features()), (k, n));
                let mut out = vec![0f32; t * n];
                lin.forward(&x, t, &mut out);
                for ti in 0..t {
                    for r in 0..n {
                        let (xr, wr) = (&x[ti * k..(ti + 1) * k], &w[r * k..(r + 1) * k]);
                        let want: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                        let mass: f32 = xr.iter().zip(wr).map(|(a, b)| (a * b).abs()).sum();
                        let got = out[ti * n + r];
                        assert!(
                            (got - want).abs() <= 1e-3 * mass,
                            "{kernel:?} {n}x{k} t{t} [{ti},{r}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn stacked_parts_of_different_formats_equal_each_part_alone() {
        use super::super::quant::tests_support::{random_gguf, random_k};
        let (k, t) = (512, 3);
        let kernel = QKernel::detect();
        let quant = |ty: GgmlType, n: usize| -> Arc<dyn Linear> {
            let w = QMatrix::from_gguf(ty, &random_gguf(ty, n, k, n as u64), n, k).unwrap();
            Arc::new(QuantLinear::new(Arc::new(w), kernel))
        };
        let q6 = QMatrix::from_gguf(GgmlType::Q6_K, &random_k(GgmlType::Q6_K, 5, k, 3), 5, k);
        let parts: Vec<Arc<dyn Linear>> = vec![
            quant(GgmlType::Q5_1, 7),
            quant(GgmlType::Q8_0, 4),
            Arc::new(QuantLinear::new(Arc::new(q6.unwrap()), kernel)),
            // An f32 part takes the unquantised input.
            Arc::new(ExactLinear::new((0..3 * k).map(|i| (i % 7) as f32 - 3.0).collect(), 3, k)),
        ];
        let mut rng = crate::sampling::sampler::Rng::new(11);
        let x: Vec<f32> = (0..t * k).map(|_| rng.next_f64() as f32 - 0.5).collect();
        let stacked = StackedLinear::new(parts.clone());
        assert_eq!((stacked.in_features(), stacked.out_features()), (k, 19));
        let mut out = vec![0f32; t * 19];
        stacked.forward(&x, t, &mut out);
        let mut col = 0;
        for p in &parts {
            let n = p.out_features();
            let mut y = vec![0f32; t * n];
            p.forward(&x, t, &mut y);
            for ti in 0..t {
                assert_eq!(&out[ti * 19 + col..ti * 19 + col + n], &y[ti * n..(ti + 1) * n]);
            }
            col += n;
        }
    }
}
