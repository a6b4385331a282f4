//! Element types of model tensors (GGML block-quantised and plain floats) and their scalar
//! dequantisation to f32.
//!
//! These scalar routines are the exact path and the oracle that every faster kernel is tested
//! against. They know nothing about files or models.

use half::{bf16, f16};

/// A tensor element type that the engine can load (named as GGML names them).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32 weights: f16 scale, 4-bit values centred on 8.
    Q4_0,
    /// 32 weights: f16 scale and min, 4-bit values.
    Q4_1,
    /// 32 weights: f16 scale, 5-bit values centred on 16.
    Q5_0,
    /// 32 weights: f16 scale and min, 5-bit values.
    Q5_1,
    /// 32 weights: f16 scale, 8-bit signed values.
    Q8_0,
    /// 256 weights in 16 groups: 2-bit values, 4-bit group scales and mins, f16 super-scales.
    Q2_K,
    /// 256 weights in 16 groups: 3-bit values (2 low bits + a high-bit mask), 6-bit group
    /// scales, an f16 super-scale.
    Q3_K,
    /// 256 weights in 8 groups: 4-bit values, 6-bit group scales and mins, f16 super-scales.
    Q4_K,
    /// 256 weights in 8 groups: 5-bit values, 6-bit group scales and mins, f16 super-scales.
    Q5_K,
    /// 256 weights in 16 groups: 6-bit values, 8-bit signed group scales, an f16 super-scale.
    Q6_K,
}

impl GgmlType {
    /// The type for a GGML type id, when supported.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    /// A readable name for any GGML type id, supported or not.
    pub fn name_of_id(id: u32) -> String {
        const NAMES: [&str; 40] = [
            "F32",
            "F16",
            "Q4_0",
            "Q4_1",
            "Q4_2",
            "Q4_3",
            "Q5_0",
            "Q5_1",
            "Q8_0",
            "Q8_1",
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "Q8_K",
            "IQ2_XXS",
            "IQ2_XS",
            "IQ3_XXS",
            "IQ1_S",
            "IQ4_NL",
            "IQ3_S",
            "IQ2_S",
            "IQ4_XS",
            "I8",
            "I16",
            "I32",
            "I64",
            "F64",
            "IQ1_M",
            "BF16",
            "Q4_0_4_4",
            "Q4_0_4_8",
            "Q4_0_8_8",
            "TQ1_0",
            "TQ2_0",
            "IQ4_NL_4_4",
            "IQ4_NL_4_8",
            "IQ4_NL_8_8",
            "MXFP4",
        ];
        NAMES.get(id as usize).map(|s| s.to_string()).unwrap_or_else(|| format!("unknown({id})"))
    }

    /// Canonical name.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
        }
    }

    /// Every type the engine loads.
    pub const ALL: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                QK_K
            }
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
        }
    }

    /// Bytes needed for `n` elements (`n` must be a multiple of the block size).
    pub fn bytes_for(self, n: usize) -> usize {
        n / self.block_size() * self.block_bytes()
    }
}

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantises `src` (exactly `out.len()` elements of type `ty`) into `out`.
///
/// Panics if the lengths disagree; callers validate sizes when they load a tensor.
pub fn dequantize(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    assert_eq!(
        src.len(),
        ty.bytes_for(out.len()),
        "dequantize: {} bytes for {} {} elements",
        src.len(),
        out.len(),
        ty.name()
    );
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    o[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
                    o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(20)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                for j in 0..16 {
                    let q = b[4 + j];
                    o[j] = (q & 0x0F) as f32 * d + m;
                    o[j + 16] = (q >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(22)) {
                let d = f16_at(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                for j in 0..16 {
                    let q = b[6 + j];
                    let h0 = ((qh >> j) & 1) << 4;
                    let h1 = ((qh >> (j + 16)) & 1) << 4;
                    o[j] = (((q & 0x0F) as u32 | h0) as i32 - 16) as f32 * d;
                    o[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
                }
            }
        }
        GgmlType::Q5_1 => {
            for (o, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(24)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                for j in 0..16 {
                    let q = b[8 + j];
                    let h0 = ((qh >> j) & 1) << 4;
                    let h1 = ((qh >> (j + 16)) & 1) << 4;
                    o[j] = ((q & 0x0F) as u32 | h0) as f32 * d + m;
                    o[j + 16] = ((q >> 4) as u32 | h1) as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for j in 0..32 {
                    o[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            let bb = ty.block_bytes();
            for (o, b) in out.chunks_exact_mut(QK_K).zip(src.chunks_exact(bb)) {
                match ty {
                    GgmlType::Q2_K => kquant::q2_k(b, o),
                    GgmlType::Q3_K => kquant::q3_k(b, o),
                    GgmlType::Q4_K => kquant::q4_k(b, o),
                    GgmlType::Q5_K => kquant::q5_k(b, o),
                    _ => kquant::q6_k(b, o),
                }
            }
        }
    }
}

/// One super-block of each K-quant type to 256 floats. Values are laid out as llama.cpp's
/// `dequantize_row_q*_K` writes them (the GGUF format's definition).
pub(crate) mod kquant {
    use super::f16_at;

    /// The 256 two-bit values (0..3) of a Q2_K block in element order (element `e` is in
    /// group `e / 16`). Block layout: 16 group bytes (scale in the low nibble, minimum in the
    /// high), 64 bytes of 2-bit values, then `d` and `dmin`. Each 32-byte run of values holds
    /// four 32-weight slices, two bits each; a slice's first and second 16 weights have their
    /// own group. A weight is `d · scale · value − dmin · minimum`.
    pub(crate) fn q2_k_values(b: &[u8]) -> [u8; 256] {
        let qs = &b[16..80];
        let mut v = [0u8; 256];
        for half in 0..2 {
            let q = &qs[32 * half..32 * half + 32];
            for j in 0..4 {
                for (i, &byte) in q.iter().enumerate() {
                    v[half * 128 + j * 32 + i] = (byte >> (2 * j)) & 3;
                }
            }
        }
        v
    }

    /// `d · scale · value − dmin · minimum` per element ([`q2_k_values`]).
    pub fn q2_k(b: &[u8], o: &mut [f32]) {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        for (e, (y, q)) in o.iter_mut().zip(q2_k_values(b)).enumerate() {
            let sc = b[e / 16];
            *y = d * (sc & 0xF) as f32 * q as f32 - dmin * (sc >> 4) as f32;
        }
    }

    /// The 16 six-bit group scales of Q3_K, packed into 12 bytes: low nibbles of bytes 0..8
    /// (groups 0..8), their high nibbles (groups 8..16), and two high bits each in bytes 8..12.
    fn q3_scale(s: &[u8], j: usize) -> i32 {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | (high << 4)) as i32 - 32
    }

    /// The 256 signed 3-bit values (−4..3) of a Q3_K block in element order, and the signed
    /// scales of its 16 groups (element `e` is in group `e / 16`).
    /// Block layout: a 32-byte high-bit mask, 64 bytes of 2-bit values, 12 bytes of scales,
    /// then `d`. A weight is `d · scale · (low2 − (high bit clear ? 4 : 0))`.
    pub(crate) fn q3_k_values(b: &[u8]) -> ([i8; 256], [i32; 16]) {
        let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
        let (mut v, mut sc) = ([0i8; 256], [0i32; 16]);
        for (g, s) in sc.iter_mut().enumerate() {
            *s = q3_scale(scales, g);
        }
        let mut m = 1u8;
        for half in 0..2 {
            let q = &qs[32 * half..32 * half + 32];
            for j in 0..4 {
                let shift = 2 * j;
                for part in 0..2 {
                    let base = half * 128 + j * 32 + part * 16;
                    for l in 0..16 {
                        let i = part * 16 + l;
                        let low = ((q[i] >> shift) & 3) as i8;
                        v[base + l] = low - if hmask[i] & m != 0 { 0 } else { 4 };
                    }
                }
                m = m.wrapping_shl(1);
            }
        }
        (v, sc)
    }

    /// `d · scale · value` per element ([`q3_k_values`]).
    pub fn q3_k(b: &[u8], o: &mut [f32]) {
        let d = f16_at(b, 108);
        let (v, sc) = q3_k_values(b);
        for (e, (y, q)) in o.iter_mut().zip(v).enumerate() {
            *y = d * sc[e / 16] as f32 * q as f32;
        }
    }

    /// Scale and min of group `j` (0..8) of Q4_K / Q5_K, six bits each, packed in 12 bytes.
    pub(crate) fn scale_min(s: &[u8], j: usize) -> (f32, f32) {
        if j < 4 {
            ((s[j] & 63) as f32, (s[j + 4] & 63) as f32)
        } else {
            let sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
            let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            (sc as f32, m as f32)
        }
    }

    /// Block layout: `d`, `dmin`, 12 bytes of scales and mins, 128 bytes of 4-bit values; each
    /// 32-byte run holds two groups (low nibbles, then high nibbles).
    pub fn q4_k(b: &[u8], o: &mut [f32]) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let (scales, qs) = (&b[4..16], &b[16..144]);
        for run in 0..4 {
            let q = &qs[32 * run..32 * run + 32];
            for (nib, shift) in [(0, 0), (1, 4)] {
                let (sc, m) = scale_min(scales, 2 * run + nib);
                let (dl, ml) = (d * sc, dmin * m);
                let base = run * 64 + nib * 32;
                for l in 0..32 {
                    o[base + l] = dl * ((q[l] >> shift) & 0xF) as f32 - ml;
                }
            }
        }
    }

    /// The 256 five-bit values (0..32) of a Q5_K block in element order (element `e` is in
    /// group `e / 32`).
    /// Block layout: `d`, `dmin`, 12 bytes of scales and mins, a 32-byte fifth-bit array, 128
    /// bytes of 4-bit values (as Q4_K); group `g`'s fifth bits are bit `g` of the array's bytes.
    pub(crate) fn q5_k_values(b: &[u8]) -> [u8; 256] {
        let (qh, qs) = (&b[16..48], &b[48..176]);
        let mut v = [0u8; 256];
        for run in 0..4 {
            let q = &qs[32 * run..32 * run + 32];
            for (nib, shift) in [(0, 0), (1, 4)] {
                let g = 2 * run + nib;
                for l in 0..32 {
                    v[run * 64 + nib * 32 + l] =
                        ((q[l] >> shift) & 0xF) | (((qh[l] >> g) & 1) << 4);
                }
            }
        }
        v
    }

    /// `d · sc · q − dmin · m` per element ([`q5_k_values`], [`scale_min`]).
    pub fn q5_k(b: &[u8], o: &mut [f32]) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let q = q5_k_values(b);
        for (g, (ys, qs)) in o.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
            let (sc, m) = scale_min(&b[4..16], g);
            for (y, &q) in ys.iter_mut().zip(qs) {
                *y = d * sc * q as f32 - dmin * m;
            }
        }
    }

    /// The 256 signed 6-bit values (`q − 32`) of a Q6_K block in element order; element `e`
    /// belongs to group `e / 16`, whose signed scale is byte `192 + e / 16`.
    /// Block layout: 128 bytes of low 4 bits, 64 bytes of high 2 bits, 16 signed group scales,
    /// then `d`. Each half of 128 weights takes 64 low bytes and 32 high bytes.
    pub(crate) fn q6_k_values(b: &[u8]) -> [i8; 256] {
        let (ql, qh) = (&b[0..128], &b[128..192]);
        let mut q = [0i8; 256];
        for half in 0..2 {
            let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
            for l in 0..32 {
                let quads = [
                    (ql[l] & 0xF) | (qh[l] & 3) << 4,
                    (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4,
                    (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
                    (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4,
                ];
                for (k, v) in quads.into_iter().enumerate() {
                    q[128 * half + l + 32 * k] = v as i8 - 32;
                }
            }
        }
        q
    }

    /// `d · scale · (q − 32)` per element ([`q6_k_values`]).
    pub fn q6_k(b: &[u8], o: &mut [f32]) {
        let d = f16_at(b, 208);
        for (e, (y, q)) in o.iter_mut().zip(q6_k_values(b)).enumerate() {
            let s = b[192 + e / 16] as i8 as f32;
            *y = d * s * q as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_1_block() {
        let mut b = Vec::new();
        b.extend(h(0.5));
        b.extend(h(-1.0));
        // element j = j % 16 in low nibble, high nibble = 15 - j
        for j in 0..16u8 {
            b.push(j | ((15 - j) << 4));
        }
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q4_1, &b, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.5 - 1.0);
            assert_eq!(out[16 + j], (15 - j) as f32 * 0.5 - 1.0);
        }
    }

    #[test]
    fn q4_0_and_q8_0_blocks() {
        let mut b = h(2.0).to_vec();
        b.extend([0x80u8; 16]); // low = 0 -> -8, high = 8 -> 0
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut out);
        assert!(out[..16].iter().all(|&x| x == -16.0));
        assert!(out[16..].iter().all(|&x| x == 0.0));

        let mut b = h(0.25).to_vec();
        b.extend((0..32).map(|j| (j as i8 - 16) as u8));
        dequantize(GgmlType::Q8_0, &b, &mut out);
        for (j, x) in out.iter().enumerate() {
            assert_eq!(*x, (j as f32 - 16.0) * 0.25);
        }
    }

    #[test]
    fn q5_blocks_use_the_high_bits() {
        // qh bit j set for j in 0..32 -> all fifth bits set.
        let mut b = h(1.0).to_vec();
        b.extend(u32::MAX.to_le_bytes());
        b.extend([0x00u8; 16]);
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q5_0, &b, &mut out);
        assert!(out.iter().all(|&x| x == 0.0)); // (0 | 16) - 16
        let mut b = h(1.0).to_vec();
        b.extend(h(0.5));
        b.extend(0x0000_0001u32.to_le_bytes());
        b.extend([0x21u8; 16]);
        dequantize(GgmlType::Q5_1, &b, &mut out);
        assert_eq!(out[0], 17.5); // (1 | 16) + 0.5
        assert_eq!(out[1], 1.5);
        assert_eq!(out[16], 2.5);
    }

    #[test]
    fn float_types() {
        let mut out = [0f32; 2];
        let src: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        dequantize(GgmlType::F32, &src, &mut out);
        assert_eq!(out, [1.5, -2.0]);
        let src: Vec<u8> = [h(1.5), h(-2.0)].concat();
        dequantize(GgmlType::F16, &src, &mut out);
        assert_eq!(out, [1.5, -2.0]);
        let src: Vec<u8> =
            [bf16::from_f32(1.5).to_le_bytes(), bf16::from_f32(-2.0).to_le_bytes()].concat();
        dequantize(GgmlType::BF16, &src, &mut out);
        assert_eq!(out, [1.5, -2.0]);
    }
}
