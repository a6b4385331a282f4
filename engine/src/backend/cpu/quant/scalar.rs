//! Portable reference kernels: what the SIMD kernels in `quant_x86.rs` are tested against.

use super::*;

/// Dot product of weight row `r` with activation row `t`.
pub fn dot(w: &QMatrix, r: usize, a: &QActs, t: usize) -> f32 {
    if w.format == QFormat::Q8G16 {
        return dot_g16(w, r, a, t);
    }
    let pb = w.format.pair_bytes();
    let mut acc = 0f32;
    for p in 0..w.npairs {
        let wq = &w.qs[(r * w.npairs + p) * pb..(r * w.npairs + p + 1) * pb];
        let range = (t * a.npairs + p) * 64..(t * a.npairs + p + 1) * 64;
        let mut isum = [0i32; 2];
        for (level, aq) in [&a.qs[range.clone()], &a.qs2[range.clone()]].into_iter().enumerate() {
            let mut part = [0i32; 2];
            match w.format {
                QFormat::Q4_1 => {
                    for i in 0..32 {
                        let b = (i / 4) % 2;
                        part[b] += (wq[i] & 0x0F) as i32 * aq[i] as i32
                            + (wq[i] >> 4) as i32 * aq[32 + i] as i32;
                    }
                }
                QFormat::Q5 => {
                    // Byte `i` of the unpacked pair is nibble byte `i % 32`'s low (i < 32)
                    // or high nibble, plus 16 where mask bit `i` is set.
                    let mask = u64::from_le_bytes(wq[32..40].try_into().unwrap());
                    for i in 0..32 {
                        let b = (i / 4) % 2;
                        let lo = (wq[i] & 0x0F) as i32 | ((mask >> i) as i32 & 1) << 4;
                        let hi = (wq[i] >> 4) as i32 | ((mask >> (32 + i)) as i32 & 1) << 4;
                        part[b] += lo * aq[i] as i32 + hi * aq[32 + i] as i32;
                    }
                }
                QFormat::Q8G16 => unreachable!("dot_g16 takes Q8G16"),
                QFormat::Q8_0 => {
                    for i in 0..64 {
                        part[(i / 4) % 2] += wq[i] as i32 * aq[i] as i32;
                    }
                }
            }
            for (s, &q) in isum.iter_mut().zip(&part) {
                *s = if level == 0 { q << 8 } else { *s + q };
            }
        }
        for (b, &s) in isum.iter().enumerate() {
            let ai = (t * a.npairs + p) * 2 + b;
            acc += w.scale(r, p, b) * a.d[ai] * s as f32 + w.min(r, p, b) * a.s[ai];
        }
    }
    acc
}

/// [`dot`] for [`QFormat::Q8G16`]: each group of 16's signed integer sum, on both levels,
/// times its scale.
fn dot_g16(w: &QMatrix, r: usize, a: &QActs, t: usize) -> f32 {
    let mut acc = 0f32;
    for p in 0..w.npairs {
        let wq = &w.qs[(r * w.npairs + p) * 64..(r * w.npairs + p + 1) * 64];
        let at = (t * a.npairs + p) * 64;
        // Group (b, h) at index 2h + b: byte i is block (i / 4) % 2, half i / 32.
        let mut isum = [0i32; 4];
        for i in 0..64 {
            let q = wq[i] as i32 - 128;
            let x = 256 * a.qs[at + i] as i32 + a.qs2[at + i] as i32;
            isum[2 * (i / 32) + (i / 4) % 2] += q * x;
        }
        for (g, &s) in isum.iter().enumerate() {
            let (b, h) = (g % 2, g / 2);
            acc += w.group_scale(r, p, b, h) * a.d[(t * a.npairs + p) * 2 + b] * s as f32;
        }
    }
    acc
}
