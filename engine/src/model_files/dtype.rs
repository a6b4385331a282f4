//! Element types of model tensors (GGML block-quantised and plain floats) and their scalar
//! dequantisation to f32.
//!
//! These scalar routines are the exact path and the oracle that every faster kernel is tested
//! against. They know nothing about files or models.

use half::{bf16, f16};

/// A tensor element type that the engine can load.
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
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
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
        }
    }

    /// Bytes needed for `n` elements (`n` must be a multiple of the block size).
    pub fn bytes_for(self, n: usize) -> usize {
        n / self.block_size() * self.block_bytes()
    }
}

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
