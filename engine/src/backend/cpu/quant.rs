//! Quantised matrix multiply of the CPU fast path: weights stay 4- or 8-bit, activations are
//! quantised to 8 bits once per matmul, dot products run on integer SIMD.
//!
//! Layout. Blocks of 32 weights are handled in pairs. Within a pair, the bytes of the two blocks
//! are interleaved four at a time (`b0[0..4], b1[0..4], b0[4..8], ...`), so in a SIMD register
//! of 32-bit lanes the lane's parity says which block it belongs to and one broadcast of the
//! pair's two scales covers every lane. Q4_1 pairs hold 32 bytes of nibbles (low nibbles are
//! elements 0..16 of each block, high nibbles 16..32); Q8_0 pairs hold 64 bytes stored as
//! `q + 128` (unsigned, for `u8 × i8` dot instructions). Both formats share one epilogue:
//! `Σ_blocks d_w·d_a·dot + m_w·s_a`, with `m_w` the Q4_1 minimum or `-128·d_w` for Q8_0 and
//! `s_a = d_a·Σq_a`. Activations use the Q8 layout of a Q8_0 pair (signed).
//!
//! Activations carry two int8 vectors per block: `x ≈ d·(q₁ + q₂/256)`, the second holding the
//! rounding residual of the first. Kernels combine them in the integer domain,
//! `(Σ w·q₁ << 8) + Σ w·q₂`, which gives the dot products ~15-bit activation precision for one
//! extra multiply-add instruction: a single int8 level alone moves this model's log-probs by
//! 0.06 nats in the median and up to 0.75.
//!
//! [`scalar`] is the reference the SIMD kernels in `quant_x86.rs` are tested against.

use crate::model_files::dtype::GgmlType;

/// Elements per quantisation block.
pub const QK: usize = 32;

/// Rows from which activations quantised for an x86 SIMD kernel carry [`QActs::q16_quad`]
/// (the i16 batch kernels); fewer rows take the per-token tiles.
pub const QUAD_MIN_ROWS: usize = 4;

/// Whether `t` rows quantised for `kernel` carry [`QActs::q16_quad`], so that their matmuls run
/// on an i16 batch kernel (`quant_x86/wide512.rs`, `quant_x86/wide256.rs`) rather than the
/// per-token tiles.
pub fn takes_quad_layout(kernel: QKernel, t: usize) -> bool {
    kernel != QKernel::Scalar && t >= QUAD_MIN_ROWS
}

/// Storage format of a quantised weight matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QFormat {
    /// 4-bit unsigned values with scale and minimum (also holds Q4_0, with `m = -8·d`).
    Q4_1,
    /// 8-bit values with a scale, stored offset by 128.
    Q8_0,
    /// Five-bit unsigned values with scale and minimum (Q5_0 with `m = -16·d`, Q5_1, Q5_K):
    /// Q4_1's 32 bytes of nibbles, then the values' high bits as a 64-bit mask, bit `i` for
    /// byte `i` of the pair unpacked to the Q8 layout ([`set_q5`]). Kernels add 16 where a bit
    /// is set; the arithmetic is Q4_1's (`maddubs` pairs of values below 32 stay within i16).
    /// 40 bytes per 64 weights where a byte each took 64: decode reads weights from memory.
    Q5,
    /// 8-bit values stored offset by 128 as [`QFormat::Q8_0`], with a scale per group of 16
    /// (Q6_K, Q3_K): a pair's four groups are elements 0..16 ("low half") and 16..32 ("high
    /// half") of each block, which the Q8 order puts in the pair's first and last 32 bytes. The
    /// pair's `dm` holds the groups' integer sub-scales `(s₀,lo, s₁,lo, s₀,hi, s₁,hi)` (exact in
    /// f16), [`QMatrix::dk`] the super-block scale `d`; a group's scale is `d·s`. No minimum:
    /// kernels remove the bias of 128 themselves.
    Q8G16,
}

impl QFormat {
    /// Bytes of one pair of blocks.
    pub fn pair_bytes(self) -> usize {
        match self {
            QFormat::Q4_1 => 32,
            QFormat::Q5 => 40,
            QFormat::Q8_0 | QFormat::Q8G16 => 64,
        }
    }
}

/// A repacked quantised weight matrix `[n, k]`.
#[derive(Debug, Clone)]
pub struct QMatrix {
    /// Format.
    pub format: QFormat,
    /// Rows (output features).
    pub n: usize,
    /// Columns (input features), a multiple of 32.
    pub k: usize,
    /// Block pairs per row (`ceil(k / 64)`; an odd last block is padded with zeros).
    pub npairs: usize,
    /// Quantised values, `n × npairs × pair_bytes`.
    pub qs: Vec<u8>,
    /// Per pair `(d₀, d₁, m₀, m₁)` as f16 (as the file stores them; lossless), `n × npairs × 4`:
    /// scales and minimum terms of the two blocks ([`QFormat::Q8G16`]: the four groups'
    /// sub-scales).
    pub dm: Vec<half::f16>,
    /// [`QFormat::Q8G16`] only: each pair's super-block scale `d`, `n × npairs` (else empty).
    pub dk: Vec<half::f16>,
    /// For symmetric types, the offset `z` every stored value carries (the minimum term of each
    /// block is `−z·d`): 8 for Q4_0, 16 for Q5_0, 128 for Q8_0 and [`QFormat::Q8G16`]. `None`
    /// when blocks carry minimums of their own (Q4_1, Q5_1, Q4_K, Q5_K). Kernels that widen
    /// weights to i16 subtract it there and skip the minimum term.
    pub offset: Option<u8>,
}

/// Position of element `j` (0..32) of block `b` (0 or 1) within a 64-byte Q8 pair.
#[inline]
pub(super) fn q8_pos(b: usize, j: usize) -> usize {
    let (half, e) = (j / 16, j % 16);
    half * 32 + (e / 4) * 8 + b * 4 + e % 4
}

/// Position in [`QActs::q16`] of byte `j` (0..64) of the Q8 pair layout: each 32-byte half
/// as its even bytes, then its odd bytes, as masking and shifting 16-bit lanes widens them.
#[inline]
pub fn wide_pos(j: usize) -> usize {
    let (half, jj) = (j / 32, j % 32);
    half * 32 + (jj % 2) * 16 + jj / 2
}

/// Offset in [`QActs::q16_quad`], from a token's first value, of pair `p`'s Q8 position `m`
/// (0..64): its eighth `m / 8` holds the quad's four tokens' eight values side by side.
#[inline]
pub fn quad_pos(p: usize, m: usize) -> usize {
    (p * 8 + m / 8) * 32 + m % 8
}

/// Position of byte `j` (0..16) of block `b`'s nibbles within a 32-byte Q4 pair.
#[inline]
pub(super) fn q4_pos(b: usize, j: usize) -> usize {
    (j / 4) * 8 + b * 4 + j % 4
}

/// Writes the five-bit value `v` of element `j` (0..32) of block `b` into the [`QFormat::Q5`]
/// pair at `base`: its low four bits as Q4_1's nibble, its high bit into the mask at the
/// element's Q8 position.
pub(super) fn set_q5(qs: &mut [u8], base: usize, b: usize, j: usize, v: u8) {
    let nib = &mut qs[base + q4_pos(b, j % 16)];
    *nib = if j < 16 { (*nib & 0xF0) | (v & 0x0F) } else { (*nib & 0x0F) | ((v & 0x0F) << 4) };
    let bit = q8_pos(b, j);
    let m = &mut qs[base + 32 + bit / 8];
    *m = (*m & !(1 << (bit % 8))) | (((v >> 4) & 1) << (bit % 8));
}

/// The five-bit value of element `j` of block `b` of the [`QFormat::Q5`] pair at `base`.
pub(super) fn get_q5(qs: &[u8], base: usize, b: usize, j: usize) -> u8 {
    let byte = qs[base + q4_pos(b, j % 16)];
    let nib = if j < 16 { byte & 0x0F } else { byte >> 4 };
    let bit = q8_pos(b, j);
    nib | (((qs[base + 32 + bit / 8] >> (bit % 8)) & 1) << 4)
}

pub(super) fn f16le(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

impl QMatrix {
    /// Whether GGUF data of this type can be repacked without loss (Q5_0 and Q5_1 into
    /// [`QFormat::Q5`]).
    pub fn supports(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
        )
    }

    /// An `n × k` matrix of zeros in `format` (the 8-bit format stores 0 as 128, so padding
    /// blocks contribute nothing whatever their scale).
    pub(super) fn zeroed(format: QFormat, n: usize, k: usize) -> QMatrix {
        let npairs = (k / QK).div_ceil(2);
        let zero = if matches!(format, QFormat::Q8_0 | QFormat::Q8G16) { 128 } else { 0 };
        QMatrix {
            format,
            n,
            k,
            npairs,
            qs: vec![zero; n * npairs * format.pair_bytes()],
            dm: vec![half::f16::ZERO; n * npairs * 4],
            dk: vec![half::f16::ZERO; if format == QFormat::Q8G16 { n * npairs } else { 0 }],
            offset: (zero == 128).then_some(128),
        }
    }

    /// Repacks GGUF blocks (`n` rows of `k` elements of type `ty`). Exact: the dequantised
    /// values are the file's.
    pub fn from_gguf(ty: GgmlType, data: &[u8], n: usize, k: usize) -> Option<QMatrix> {
        match ty {
            GgmlType::Q4_K => return Self::from_q4_k(data, n, k),
            GgmlType::Q5_K => return Self::from_q5_k(data, n, k),
            GgmlType::Q6_K | GgmlType::Q3_K => return Self::from_g16(ty, data, n, k),
            _ => {}
        }
        if !Self::supports(ty) || !k.is_multiple_of(QK) || data.len() != ty.bytes_for(n * k) {
            return None;
        }
        let format = match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 => QFormat::Q4_1,
            GgmlType::Q5_0 | GgmlType::Q5_1 => QFormat::Q5,
            _ => QFormat::Q8_0,
        };
        let nb = k / QK;
        let mut m = QMatrix::zeroed(format, n, k);
        m.offset = match ty {
            GgmlType::Q4_0 => Some(8),
            GgmlType::Q5_0 => Some(16),
            GgmlType::Q8_0 => Some(128),
            _ => None,
        };
        let (npairs, pb) = (m.npairs, format.pair_bytes());
        let bb = ty.block_bytes();
        for r in 0..n {
            for blk in 0..nb {
                let src = &data[(r * nb + blk) * bb..(r * nb + blk + 1) * bb];
                let (p, b) = (blk / 2, blk % 2);
                let base = (r * npairs + p) * pb;
                let si = (r * npairs + p) * 4 + b;
                let f16 = |x: f32| half::f16::from_f32(x);
                match ty {
                    GgmlType::Q4_1 => {
                        m.dm[si] = f16(f16le(&src[0..2]));
                        m.dm[si + 2] = f16(f16le(&src[2..4]));
                        for j in 0..16 {
                            m.qs[base + q4_pos(b, j)] = src[4 + j];
                        }
                    }
                    GgmlType::Q4_0 => {
                        let d = f16le(&src[0..2]);
                        m.dm[si] = f16(d);
                        m.dm[si + 2] = f16(-8.0 * d); // exact: a power-of-two multiple
                        for j in 0..16 {
                            m.qs[base + q4_pos(b, j)] = src[2 + j];
                        }
                    }
                    GgmlType::Q8_0 => {
                        let d = f16le(&src[0..2]);
                        m.dm[si] = f16(d);
                        m.dm[si + 2] = f16(-128.0 * d); // exact unless |d| > 511 (never in practice)
                        for j in 0..QK {
                            m.qs[base + q8_pos(b, j)] = (src[2 + j] as i8 as i16 + 128) as u8;
                        }
                    }
                    GgmlType::Q5_0 | GgmlType::Q5_1 => {
                        // Q5_0's values are `q − 16`: a minimum of `−16·d` (exact).
                        let d = f16le(&src[0..2]);
                        m.dm[si] = f16(d);
                        let at = if ty == GgmlType::Q5_1 {
                            m.dm[si + 2] = f16(f16le(&src[2..4]));
                            4
                        } else {
                            m.dm[si + 2] = f16(-16.0 * d);
                            2
                        };
                        let qh =
                            u32::from_le_bytes([src[at], src[at + 1], src[at + 2], src[at + 3]]);
                        for j in 0..16 {
                            let q = src[at + 4 + j];
                            let lo = (q & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                            let hi = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                            set_q5(&mut m.qs, base, b, j, lo);
                            set_q5(&mut m.qs, base, b, j + 16, hi);
                        }
                    }
                    _ => unreachable!("checked by supports"),
                }
            }
        }
        Some(m)
    }

    /// Stacks matrices with the same format and `k` (fused projections).
    pub fn concat(parts: &[QMatrix]) -> QMatrix {
        let first = &parts[0];
        assert!(
            parts.iter().all(|p| p.format == first.format && p.k == first.k),
            "concat of unlike matrices"
        );
        let mut out = QMatrix {
            format: first.format,
            n: 0,
            k: first.k,
            npairs: first.npairs,
            qs: Vec::new(),
            dm: Vec::new(),
            dk: Vec::new(),
            offset: first.offset.filter(|&z| parts.iter().all(|p| p.offset == Some(z))),
        };
        for p in parts {
            out.n += p.n;
            out.qs.extend_from_slice(&p.qs);
            out.dm.extend_from_slice(&p.dm);
            out.dk.extend_from_slice(&p.dk);
        }
        out
    }

    /// Dequantised row `r` (for embedding lookups and tests).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        let pb = self.format.pair_bytes();
        for (e, o) in out[..self.k].iter_mut().enumerate() {
            let (blk, j) = (e / QK, e % QK);
            let (p, b) = (blk / 2, blk % 2);
            let base = (r * self.npairs + p) * pb;
            let q = match self.format {
                QFormat::Q4_1 => {
                    let byte = self.qs[base + q4_pos(b, j % 16)];
                    (if j < 16 { byte & 0x0F } else { byte >> 4 }) as f32
                }
                QFormat::Q5 => get_q5(&self.qs, base, b, j) as f32,
                QFormat::Q8_0 => self.qs[base + q8_pos(b, j)] as f32,
                QFormat::Q8G16 => {
                    let q = self.qs[base + q8_pos(b, j)] as f32 - 128.0;
                    *o = q * self.group_scale(r, p, b, j / 16);
                    continue;
                }
            };
            *o = q * self.scale(r, p, b) + self.min(r, p, b);
        }
    }

    /// Scale of block `b` of pair `p` of row `r` (not for [`QFormat::Q8G16`]: see
    /// [`QMatrix::group_scale`]).
    #[inline]
    pub fn scale(&self, r: usize, p: usize, b: usize) -> f32 {
        self.dm[(r * self.npairs + p) * 4 + b].to_f32()
    }

    /// Minimum term of block `b` of pair `p` of row `r` (zero for [`QFormat::Q8G16`], whose
    /// kernels remove the bias of 128 from their integer sums).
    #[inline]
    pub fn min(&self, r: usize, p: usize, b: usize) -> f32 {
        if self.format == QFormat::Q8G16 {
            return 0.0;
        }
        self.dm[(r * self.npairs + p) * 4 + 2 + b].to_f32()
    }

    /// Scale `d·s` of the [`QFormat::Q8G16`] group of elements `16h..16h + 16` of block `b` of
    /// pair `p` of row `r` (exact in f32: an f16 times an integer of at most 8 bits).
    #[inline]
    pub fn group_scale(&self, r: usize, p: usize, b: usize, h: usize) -> f32 {
        let at = r * self.npairs + p;
        self.dk[at].to_f32() * self.dm[at * 4 + 2 * h + b].to_f32()
    }
}

/// Activations of `t` rows quantised to the Q8 pair layout.
#[derive(Debug, Clone, Default)]
pub struct QActs {
    /// Rows.
    pub t: usize,
    /// Block pairs per row.
    pub npairs: usize,
    /// First-level values, `t × npairs × 64`.
    pub qs: Vec<i8>,
    /// Residual values at 1/256 of the scale, same layout.
    pub qs2: Vec<i8>,
    /// The combined `256·q₁ + q₂` as i16, each pair's 64 in the order the plain AVX2 kernel
    /// widens weight bytes to i16 (see [`wide_pos`]); empty unless quantised for that kernel
    /// with fewer than [`QUAD_MIN_ROWS`] rows (more take [`QActs::q16_quad`]).
    pub q16: Vec<i16>,
    /// The combined `256·q₁ + q₂` as i16 for the batch kernels of every SIMD path (512 bits:
    /// one quad per register; 256 bits: two registers), four tokens side by side: per quad of
    /// tokens (the last padded with zeros), pair and eighth of the pair (Q8 positions
    /// `8c..8c+8`), the four tokens' eight values, `⌈t/4⌉ × npairs × 8 × 32` ([`quad_pos`]). Empty unless quantised for that kernel with at least
    /// [`QUAD_MIN_ROWS`] rows.
    pub q16_quad: Vec<i16>,
    /// With [`QActs::q16_quad`]: per quad and pair, each token's `(d₀, d₀, d₁, d₁)` (the lanes
    /// of its products), `⌈t/4⌉ × npairs × 16`.
    pub d_quad: Vec<f32>,
    /// With [`QActs::q16_quad`]: per quad and pair, each token's `(s₀, s₀, s₁, s₁) / 2`,
    /// against a row's minimums `(m₀, m₀, m₁, m₁)`.
    pub s_quad: Vec<f32>,
    /// Scales of the combined integer `256·q₁ + q₂`, i.e. `d/256`, `t × npairs × 2`.
    pub d: Vec<f32>,
    /// `d · Σq` per block, `t × npairs × 2`.
    pub s: Vec<f32>,
    /// `s / 8`, for kernels that spread a pair's minimum term over eight lanes.
    pub s8: Vec<f32>,
    /// `d` of four consecutive tokens side by side: per quad of tokens and pair, eight floats
    /// `(d[t₀,b₀], d[t₀,b₁], d[t₁,b₀], …, d[t₃,b₁])`, `⌈t/4⌉ × npairs × 8` (for kernels that reduce
    /// four tokens' sums into one vector).
    pub d4: Vec<f32>,
    /// `s` in the layout of `d4`.
    pub s4: Vec<f32>,
    /// Only the first level counts (`qs2` is zero; see `head.rs`): kernels may skip the second.
    pub coarse: bool,
}

impl QActs {
    /// Quantises `t` rows of `k` floats (`k` a multiple of 32) for this CPU's kernel
    /// ([`QKernel::detect`]), reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], t: usize, k: usize) {
        self.quantize_for(x, t, k, QKernel::detect());
    }

    /// Quantises for `kernel` (the SIMD kernels also read [`QActs::q16_quad`] from
    /// [`QUAD_MIN_ROWS`] rows, the plain AVX2 one [`QActs::q16`] below). Rows are spread
    /// over the CPU pool when there are many.
    pub fn quantize_for(&mut self, x: &[f32], t: usize, k: usize, kernel: QKernel) {
        let nb = k / QK;
        let npairs = nb.div_ceil(2);
        self.t = t;
        self.npairs = npairs;
        self.coarse = false;
        for v in [&mut self.qs, &mut self.qs2] {
            v.clear();
            v.resize(t * npairs * 64, 0);
        }
        let quads = t.div_ceil(4);
        let quad = takes_quad_layout(kernel, t);
        self.q16.clear();
        if kernel == QKernel::Avx2 && !quad {
            self.q16.resize(t * npairs * 64, 0);
        }
        for (v, len) in [(&mut self.d_quad, 16), (&mut self.s_quad, 16)] {
            v.clear();
            if quad {
                v.resize(quads * npairs * len, 0.0);
            }
        }
        self.q16_quad.clear();
        if quad {
            self.q16_quad.resize(quads * npairs * 256, 0);
        }
        for v in [&mut self.d, &mut self.s, &mut self.s8] {
            v.clear();
            v.resize(t * npairs * 2, 0.0);
        }
        for v in [&mut self.d4, &mut self.s4] {
            v.clear();
            v.resize(quads * npairs * 8, 0.0);
        }
        let (d4, s4) =
            (super::pool::OutPtr(self.d4.as_mut_ptr()), super::pool::OutPtr(self.s4.as_mut_ptr()));
        let (d_quad, s_quad) = (
            super::pool::OutPtr(self.d_quad.as_mut_ptr()),
            super::pool::OutPtr(self.s_quad.as_mut_ptr()),
        );
        let ptrs = RowPtrs {
            qs: self.qs.as_mut_ptr(),
            qs2: self.qs2.as_mut_ptr(),
            q16: if self.q16.is_empty() { std::ptr::null_mut() } else { self.q16.as_mut_ptr() },
            q16_quad: if self.q16_quad.is_empty() {
                std::ptr::null_mut()
            } else {
                self.q16_quad.as_mut_ptr()
            },
            d: self.d.as_mut_ptr(),
            s: self.s.as_mut_ptr(),
            s8: self.s8.as_mut_ptr(),
        };
        let rows_per_task = if t >= 16 { t.div_ceil(8) } else { t };
        super::pool::ThreadPool::global().run(t.div_ceil(rows_per_task), &|task| {
            let p = ptrs;
            for ti in task * rows_per_task..((task + 1) * rows_per_task).min(t) {
                // SAFETY: each row writes only its own region of the buffers (in `d4`/`s4`, its
                // own two floats of every eight).
                unsafe {
                    let row = p.at(ti, npairs);
                    quantize_row(&x[ti * k..(ti + 1) * k], npairs, row);
                    let base = (ti / 4) * npairs * 8 + (ti % 4) * 2;
                    for j in 0..npairs * 2 {
                        let at = base + (j / 2) * 8 + j % 2;
                        *d4.get().add(at) = *row.d.add(j);
                        *s4.get().add(at) = *row.s.add(j);
                        if quad {
                            let at = (((ti / 4) * npairs + j / 2) * 4 + ti % 4) * 4 + 2 * (j % 2);
                            for lane in at..at + 2 {
                                *d_quad.get().add(lane) = *row.d.add(j);
                                *s_quad.get().add(lane) = *row.s.add(j) * 0.5;
                            }
                        }
                    }
                }
            }
        });
    }
}

/// Output pointers of one activation row (or of row 0, offset with [`RowPtrs::at`]).
#[derive(Clone, Copy)]
struct RowPtrs {
    qs: *mut i8,
    qs2: *mut i8,
    /// Null when the i16 layout is not wanted.
    q16: *mut i16,
    /// Null when the AVX-512 batch layout is not wanted; else (after [`RowPtrs::at`]) the
    /// row's first value in [`QActs::q16_quad`], which [`quad_pos`] offsets.
    q16_quad: *mut i16,
    d: *mut f32,
    s: *mut f32,
    s8: *mut f32,
}
// SAFETY: rows are written by one task each.
unsafe impl Send for RowPtrs {}
unsafe impl Sync for RowPtrs {}

impl RowPtrs {
    unsafe fn at(self, row: usize, npairs: usize) -> RowPtrs {
        RowPtrs {
            qs: self.qs.add(row * npairs * 64),
            qs2: self.qs2.add(row * npairs * 64),
            q16: if self.q16.is_null() { self.q16 } else { self.q16.add(row * npairs * 64) },
            q16_quad: if self.q16_quad.is_null() {
                self.q16_quad
            } else {
                self.q16_quad.add((row / 4) * npairs * 256 + (row % 4) * 8)
            },
            d: self.d.add(row * npairs * 2),
            s: self.s.add(row * npairs * 2),
            s8: self.s8.add(row * npairs * 2),
        }
    }
}

#[inline(always)]
unsafe fn quantize_row_body(src: &[f32], npairs: usize, out: RowPtrs) {
    let qs = std::slice::from_raw_parts_mut(out.qs, npairs * 64);
    let qs2 = std::slice::from_raw_parts_mut(out.qs2, npairs * 64);
    let d_out = std::slice::from_raw_parts_mut(out.d, npairs * 2);
    let s_out = std::slice::from_raw_parts_mut(out.s, npairs * 2);
    let s8_out = std::slice::from_raw_parts_mut(out.s8, npairs * 2);
    for (blk, x) in src.chunks_exact(QK).enumerate() {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let id2 = id * 256.0;
        let (p, b) = (blk / 2, blk % 2);
        let mut q1 = [0f32; QK];
        let mut q2 = [0f32; QK];
        for j in 0..QK {
            q1[j] = (x[j] * id).round_ties_even().clamp(-127.0, 127.0);
            q2[j] = ((x[j] - q1[j] * d) * id2).round_ties_even().clamp(-127.0, 127.0);
        }
        let mut sum = 0f32;
        let mut b1 = [0i8; QK];
        let mut b2 = [0i8; QK];
        for j in 0..QK {
            sum += 256.0 * q1[j] + q2[j];
            b1[j] = q1[j] as i8;
            b2[j] = q2[j] as i8;
        }
        // Four consecutive elements occupy four consecutive bytes of the pair layout.
        for g in 0..QK / 4 {
            let at = p * 64 + q8_pos(b, g * 4);
            qs[at..at + 4].copy_from_slice(&b1[g * 4..g * 4 + 4]);
            qs2[at..at + 4].copy_from_slice(&b2[g * 4..g * 4 + 4]);
        }
        if !out.q16.is_null() {
            for j in 0..QK {
                let at = p * 64 + wide_pos(q8_pos(b, j));
                *out.q16.add(at) = (256.0 * q1[j] + q2[j]) as i16;
            }
        }
        if !out.q16_quad.is_null() {
            for j in 0..QK {
                *out.q16_quad.add(quad_pos(p, q8_pos(b, j))) = (256.0 * q1[j] + q2[j]) as i16;
            }
        }
        d_out[p * 2 + b] = d / 256.0;
        s_out[p * 2 + b] = d / 256.0 * sum;
        s8_out[p * 2 + b] = d / 256.0 * sum * 0.125;
    }
}

unsafe fn quantize_row(src: &[f32], npairs: usize, out: RowPtrs) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            return quantize_row_avx2(src, npairs, out);
        }
    }
    quantize_row_body(src, npairs, out)
}

/// [`quantize_row_body`] with explicit AVX2: the same rounding (nearest, ties to even), clamps
/// and layout; checked against it in the tests.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row_avx2(src: &[f32], _npairs: usize, out: RowPtrs) {
    use std::arch::x86_64::*;
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let sign = _mm256_set1_ps(-0.0);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    for (blk, x) in src.chunks_exact(QK).enumerate() {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(i * 8)));
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let (vd, vid, vid2) = (_mm256_set1_ps(d), _mm256_set1_ps(id), _mm256_set1_ps(id * 256.0));
        let (p, b) = (blk / 2, blk % 2);
        let mut sum = _mm256_setzero_ps();
        for (i, xi) in v.iter().enumerate() {
            let q1 = _mm256_min_ps(
                _mm256_max_ps(_mm256_round_ps::<NEAREST>(_mm256_mul_ps(*xi, vid)), lo),
                hi,
            );
            let r = _mm256_sub_ps(*xi, _mm256_mul_ps(q1, vd));
            let q2 = _mm256_min_ps(
                _mm256_max_ps(_mm256_round_ps::<NEAREST>(_mm256_mul_ps(r, vid2)), lo),
                hi,
            );
            let wide = _mm256_fmadd_ps(q1, _mm256_set1_ps(256.0), q2);
            sum = _mm256_add_ps(sum, wide);
            if !out.q16_quad.is_null() {
                // Elements 8i..8i+4 and 8i+4..8i+8 are two groups of four consecutive i16.
                let qi = _mm256_cvtps_epi32(wide);
                let p16 =
                    _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
                let at = out.q16_quad;
                _mm_storel_epi64(at.add(quad_pos(p, q8_pos(b, 8 * i))) as *mut __m128i, p16);
                _mm_storel_epi64(
                    at.add(quad_pos(p, q8_pos(b, 8 * i + 4))) as *mut __m128i,
                    _mm_unpackhi_epi64(p16, p16),
                );
            }
            if !out.q16.is_null() {
                let qi = _mm256_cvtps_epi32(wide);
                let p16 =
                    _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
                // A group's four elements sit at consecutive Q8 bytes: (e₀, e₂) go to the even
                // half, (e₁, e₃) to the odd half, two i16 each.
                let order = _mm_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15);
                let mut words = [0i32; 4];
                _mm_storeu_si128(words.as_mut_ptr() as *mut __m128i, _mm_shuffle_epi8(p16, order));
                for k in 0..2 {
                    let even = p * 64 + wide_pos(q8_pos(b, (2 * i + k) * 4));
                    std::ptr::write_unaligned(out.q16.add(even) as *mut i32, words[2 * k]);
                    std::ptr::write_unaligned(out.q16.add(even + 16) as *mut i32, words[2 * k + 1]);
                }
            }
            for (level, q) in [(out.qs, q1), (out.qs2, q2)] {
                let qi = _mm256_cvtps_epi32(q);
                let p16 =
                    _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
                let p8 = _mm_packs_epi16(p16, p16);
                // Elements 8i..8i+8 are groups 2i and 2i+1 of four bytes.
                for (k, word) in
                    [_mm_cvtsi128_si32(p8), _mm_extract_epi32::<1>(p8)].into_iter().enumerate()
                {
                    let at = p * 64 + q8_pos(b, (2 * i + k) * 4);
                    std::ptr::write_unaligned(level.add(at) as *mut i32, word);
                }
            }
        }
        let s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let total = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
        *out.d.add(p * 2 + b) = d / 256.0;
        *out.s.add(p * 2 + b) = d / 256.0 * total;
        *out.s8.add(p * 2 + b) = d / 256.0 * total * 0.125;
    }
}

/// Portable reference kernels.
pub mod portable;
pub mod scalar;

/// Kernels available on this CPU, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QKernel {
    /// AVX-512 with VNNI (`vpdpbusd` on 512 bits).
    Avx512Vnni,
    /// AVX2 with AVX-VNNI (`vpdpbusd` on 256 bits).
    AvxVnni,
    /// AVX2 and FMA (`vpmaddwd` on weights widened to i16 and [`QActs::q16`]).
    Avx2,
    /// Portable Rust.
    Scalar,
}

impl QKernel {
    /// The kernel to use: the best this CPU runs, or the one `TANDEM_CPU_KERNEL` asks for
    /// (`scalar`, `avx2` — plain AVX2 as on CPUs without VNNI —, `avxvnni`, `avx512`; `auto` or
    /// unset picks). A kernel the CPU lacks falls back to the best it has, with a warning; an
    /// unknown name is refused by the command line
    /// at start-up (see [`QKernel::requested`]) and ignored here. AMX is never selected (the hypervisor may fault on
    /// it).
    pub fn detect() -> QKernel {
        static CHOSEN: std::sync::OnceLock<QKernel> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let best = *Self::available().last().expect("scalar is always available");
            let asked = Self::requested().unwrap_or_else(|name| {
                tracing::warn!("TANDEM_CPU_KERNEL={name}: expected auto, scalar, avx2, avxvnni or avx512; using {best:?}");
                None
            });
            match asked {
                None => best,
                Some(k) if Self::available().contains(&k) => k,
                Some(k) => {
                    tracing::warn!(asked = ?k, using = ?best, "TANDEM_CPU_KERNEL names a kernel this CPU cannot run");
                    best
                }
            }
        })
    }

    /// The kernel `TANDEM_CPU_KERNEL` names (`None` for unset or `auto`), or the unknown name.
    pub fn requested() -> Result<Option<QKernel>, String> {
        match std::env::var("TANDEM_CPU_KERNEL").as_deref() {
            Err(_) | Ok("") | Ok("auto") => Ok(None),
            Ok("scalar") => Ok(Some(QKernel::Scalar)),
            Ok("avx2") => Ok(Some(QKernel::Avx2)),
            Ok("avxvnni") => Ok(Some(QKernel::AvxVnni)),
            Ok("avx512") => Ok(Some(QKernel::Avx512Vnni)),
            Ok(other) => Err(other.to_string()),
        }
    }

    /// Every kernel this CPU can run (for tests).
    pub fn available() -> Vec<QKernel> {
        #[allow(unused_mut)]
        let mut v = vec![QKernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2 {
                v.push(QKernel::Avx2);
                if is_x86_feature_detected!("avxvnni") {
                    v.push(QKernel::AvxVnni);
                }
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    v.push(QKernel::Avx512Vnni);
                }
            }
        }
        v
    }
}

/// Test data shared with the kernel tests of other modules.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// Random GGUF blocks of type `ty`.
    pub(crate) fn random_gguf(ty: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut rng = crate::sampling::sampler::Rng::new(seed);
        let mut out = Vec::new();
        for _ in 0..n * k / QK {
            let d = half::f16::from_f32(0.001 + 0.02 * rng.next_f64() as f32).to_le_bytes();
            out.extend(d);
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                out.extend(half::f16::from_f32(-0.1 * rng.next_f64() as f32).to_le_bytes());
            }
            if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
                out.extend((rng.next_u64() as u32).to_le_bytes());
            }
            let nq = if ty == GgmlType::Q8_0 { 32 } else { 16 };
            for _ in 0..nq {
                out.push(rng.next_u64() as u8);
            }
        }
        out
    }

    /// Random K-quant super-blocks of `ty` (Q3_K, Q4_K, Q5_K, Q6_K) for an `n × k` matrix:
    /// random values, scales and minimums, with `d` (and `dmin`) small positive f16s.
    pub(crate) fn random_k(ty: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
        use crate::model_files::dtype::QK_K;
        let mut rng = crate::sampling::sampler::Rng::new(seed);
        let mut out = Vec::new();
        for _ in 0..n * k / QK_K {
            let mut small = |lo: f32| {
                half::f16::from_f32(lo * (1.0 + 4.0 * rng.next_f64() as f32)).to_le_bytes()
            };
            let (d, dmin) = (small(0.001), small(0.0005));
            let bytes: Vec<u8> = (0..ty.block_bytes()).map(|_| rng.next_u64() as u8).collect();
            match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    out.extend([&d[..], &dmin[..], &bytes[4..]].concat())
                }
                GgmlType::Q2_K => out.extend([&bytes[..80], &d[..], &dmin[..]].concat()),
                _ => out.extend([&bytes[..ty.block_bytes() - 2], &d[..]].concat()),
            }
        }
        out
    }
}

#[cfg(test)]
#[path = "quant_tests.rs"]
mod tests;
