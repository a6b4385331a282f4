//! K-quant super-blocks (256 weights) repacked into the fast path's 32-wide block pairs
//! ([`super::quant`]). The quantised values are always the file's; Q4_K's and Q5_K's scales and
//! minimums, which K-quants build from small integers times a super-block `d`, are rounded to
//! f16.
//!
//! - Q4_K: groups of 32 with scale and minimum → [`QFormat::Q4_1`] blocks.
//! - Q5_K: groups of 32 with scale and minimum, five-bit values → [`QFormat::Q5`] blocks.
//! - Q6_K, Q3_K: groups of 16 with a signed integer sub-scale each and a super-block `d`, no
//!   minimum → [`QFormat::Q8G16`] (values in bytes, the sub-scales and `d` kept exactly).
//! - Q2_K: groups of 16 with an unsigned sub-scale and a minimum each → the values and
//!   sub-scales as [`QFormat::Q8G16`], the minimums apart as `[n, k / 16]` f32
//!   (`linear::GroupMinLinear` applies them to the activations' sums per group of 16). Exact.

use super::quant::{f16le, q4_pos, q8_pos, set_q5, QFormat, QMatrix};
use crate::model_files::dtype::{kquant, GgmlType, QK_K};

/// Rows and super-blocks of a K-quant tensor, or `None` when `k` is not whole super-blocks or
/// the data has the wrong size.
fn superblocks(ty: GgmlType, data: &[u8], n: usize, k: usize) -> Option<(usize, usize)> {
    (k.is_multiple_of(QK_K) && data.len() == ty.bytes_for(n * k))
        .then(|| (k / QK_K, ty.block_bytes()))
}

impl QMatrix {
    /// Repacks Q6_K or Q3_K super-blocks as [`QFormat::Q8G16`]: each value as a byte
    /// (`q + 128`), each group of 16's integer sub-scale (exact in f16) and the super-block's
    /// `d` as the file stores them, so the dequantised values are exactly the file's. `None`
    /// for other types.
    pub(super) fn from_g16(ty: GgmlType, data: &[u8], n: usize, k: usize) -> Option<QMatrix> {
        if !matches!(ty, GgmlType::Q6_K | GgmlType::Q3_K) {
            return None;
        }
        let (nsb, bb) = superblocks(ty, data, n, k)?;
        let mut m = QMatrix::zeroed(QFormat::Q8G16, n, k);
        for r in 0..n {
            for sb in 0..nsb {
                let src = &data[(r * nsb + sb) * bb..(r * nsb + sb + 1) * bb];
                if ty == GgmlType::Q6_K {
                    let sub = std::array::from_fn(|g| src[192 + g] as i8);
                    m.set_g16(r, sb, &kquant::q6_k_values(src), f16le(&src[208..210]), &sub);
                } else {
                    let (q, sc) = kquant::q3_k_values(src);
                    let sub = std::array::from_fn(|g| sc[g] as i8);
                    m.set_g16(r, sb, &q, f16le(&src[108..110]), &sub);
                }
            }
        }
        Some(m)
    }

    /// Repacks Q2_K super-blocks as the [`QFormat::Q8G16`] matrix of `d · scale · value` and the
    /// `[n, k / 16]` row-major minimums `−dmin · minimum` of its groups of 16, both exactly the
    /// file's: a weight is the matrix's entry plus its group's minimum.
    pub(super) fn from_q2_k(data: &[u8], n: usize, k: usize) -> Option<(QMatrix, Vec<f32>)> {
        let (nsb, bb) = superblocks(GgmlType::Q2_K, data, n, k)?;
        let mut m = QMatrix::zeroed(QFormat::Q8G16, n, k);
        let mut mins = vec![0f32; n * k / 16];
        for r in 0..n {
            for sb in 0..nsb {
                let src = &data[(r * nsb + sb) * bb..(r * nsb + sb + 1) * bb];
                let (d, dmin) = (f16le(&src[80..82]), f16le(&src[82..84]));
                let q = kquant::q2_k_values(src).map(|v| v as i8);
                m.set_g16(r, sb, &q, d, &std::array::from_fn(|g| (src[g] & 0xF) as i8));
                for g in 0..16 {
                    mins[(r * nsb + sb) * 16 + g] = -dmin * (src[g] >> 4) as f32;
                }
            }
        }
        Some((m, mins))
    }

    /// Sets super-block `sb` of row `r` of a [`QFormat::Q8G16`] matrix: values `q` in element
    /// order, scale `d`, integer sub-scales `sub` of its groups of 16.
    fn set_g16(&mut self, r: usize, sb: usize, q: &[i8; 256], d: f32, sub: &[i8; 16]) {
        let npairs = self.npairs;
        // A super-block is four pairs: group g is half g % 2 of block g / 2.
        for p in sb * 4..sb * 4 + 4 {
            self.dk[r * npairs + p] = half::f16::from_f32(d);
        }
        for (g, &s) in sub.iter().enumerate() {
            let blk = sb * 8 + g / 2;
            let (p, b, h) = (blk / 2, blk % 2, g % 2);
            self.dm[(r * npairs + p) * 4 + 2 * h + b] = half::f16::from_f32(s as f32);
            let base = (r * npairs + p) * 64;
            for e in 0..16 {
                self.qs[base + q8_pos(b, 16 * h + e)] = (q[g * 16 + e] as i16 + 128) as u8;
            }
        }
    }

    /// Repacks Q4_K super-blocks as eight 4-bit blocks of 32 each, with scale `d·sc` and minimum
    /// `−dmin·m` rounded to f16 (relative error at most 2⁻¹¹ on each block's scale and minimum).
    pub(super) fn from_q4_k(data: &[u8], n: usize, k: usize) -> Option<QMatrix> {
        let (nsb, bb) = superblocks(GgmlType::Q4_K, data, n, k)?;
        let mut m = QMatrix::zeroed(QFormat::Q4_1, n, k);
        for r in 0..n {
            for sb in 0..nsb {
                let src = &data[(r * nsb + sb) * bb..(r * nsb + sb + 1) * bb];
                let qs = &src[16..144];
                for g in 0..8 {
                    let (base, b) = m.set_group_scale(r, sb * 8 + g, src);
                    // Group g is the low (even g) or high nibbles of its 32-byte run.
                    let (run, shift) = (&qs[(g / 2) * 32..(g / 2) * 32 + 32], 4 * (g % 2));
                    for j in 0..16 {
                        let lo = (run[j] >> shift) & 0xF;
                        let hi = (run[j + 16] >> shift) & 0xF;
                        m.qs[base + q4_pos(b, j)] = lo | (hi << 4);
                    }
                }
            }
        }
        Some(m)
    }

    /// Repacks Q5_K super-blocks as eight [`QFormat::Q5`] blocks of 32, with scale and minimum
    /// rounded to f16 as for Q4_K.
    pub(super) fn from_q5_k(data: &[u8], n: usize, k: usize) -> Option<QMatrix> {
        let (nsb, bb) = superblocks(GgmlType::Q5_K, data, n, k)?;
        let mut m = QMatrix::zeroed(QFormat::Q5, n, k);
        for r in 0..n {
            for sb in 0..nsb {
                let src = &data[(r * nsb + sb) * bb..(r * nsb + sb + 1) * bb];
                let q = kquant::q5_k_values(src);
                for g in 0..8 {
                    let (base, b) = m.set_group_scale(r, sb * 8 + g, src);
                    for j in 0..32 {
                        set_q5(&mut m.qs, base, b, j, q[g * 32 + j]);
                    }
                }
            }
        }
        Some(m)
    }

    /// Sets block `blk` of row `r` to the scale `d·sc` and minimum `−dmin·m` of group `blk % 8`
    /// of the Q4_K/Q5_K super-block `src` (rounded to f16); returns the byte offset of the
    /// block's pair and the block's place in it.
    fn set_group_scale(&mut self, r: usize, blk: usize, src: &[u8]) -> (usize, usize) {
        let (d, dmin) = (f16le(&src[0..2]), f16le(&src[2..4]));
        let (sc, mn) = kquant::scale_min(&src[4..16], blk % 8);
        let (p, b) = (blk / 2, blk % 2);
        let si = (r * self.npairs + p) * 4 + b;
        self.dm[si] = half::f16::from_f32(d * sc);
        self.dm[si + 2] = half::f16::from_f32(-dmin * mn);
        ((r * self.npairs + p) * self.format.pair_bytes(), b)
    }
}
