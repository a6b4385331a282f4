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

/// f32 dot product with eight independent partial sums (vectorisable, deterministic order).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

impl Linear for ExactLinear {
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
