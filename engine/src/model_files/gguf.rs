//! GGUF (v2/v3) container parsing: header, metadata key/values and tensor directory.
//!
//! Owns the byte-level format only. It never interprets metadata as model hyper-parameters
//! (that is `config.rs`) and never converts tensor data (that is `dtype.rs`). Every read is
//! bounds-checked: a truncated or corrupt file is a [`GgufError`] naming what is wrong.

use std::collections::BTreeMap;
use std::path::Path;

use crate::model_files::dtype::GgmlType;

/// The four magic bytes every GGUF file starts with.
const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the tensor data section when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// Upper bound on tensor rank accepted from a file.
const MAX_DIMS: u32 = 8;

/// What can go wrong reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The first bytes are not `GGUF`.
    #[error("not a GGUF file: bad magic {0:?}")]
    BadMagic([u8; 4]),
    /// A GGUF version this reader does not implement.
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// The file ends before a structure it announces.
    #[error("truncated GGUF file: needed {needed} bytes at offset {offset} while reading {what}, file has {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Offset of the read.
        offset: u64,
        /// Bytes needed.
        needed: u64,
        /// File length.
        len: u64,
    },
    /// A structurally invalid value.
    #[error("corrupt GGUF file: {0}")]
    Corrupt(String),
    /// A tensor whose element type this engine cannot load.
    #[error(
        "tensor '{tensor}' has unsupported GGML type {type_name} (id {type_id}); supported: {}",
        supported_types()
    )]
    UnsupportedTensorType {
        /// The tensor's name.
        tensor: String,
        /// The numeric type id from the file.
        type_id: u32,
        /// A readable name of the type when known.
        type_name: String,
    },
}

/// The GGML types this engine loads, for error messages.
fn supported_types() -> String {
    GgmlType::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Unsigned integer of any width.
    U64(u64),
    /// Signed integer of any width.
    I64(i64),
    /// Floating point (f32 or f64 in the file).
    F64(f64),
    /// Boolean.
    Bool(bool),
    /// UTF-8 string (lossily decoded).
    Str(String),
    /// Array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, when it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U64(v) => Some(v),
            GgufValue::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    /// The value as a float, when numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F64(v) => Some(v),
            GgufValue::U64(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => None,
        }
    }
    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Directory entry of one tensor.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions, innermost first (GGUF `ne` order).
    pub dims: Vec<u64>,
    /// Element type.
    pub dtype: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn num_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file with its bytes memory-mapped.
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    /// All metadata key/values.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor directory in file order.
    pub tensors: Vec<GgufTensorInfo>,
    data: Bytes,
}

/// Owned or mapped file bytes.
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and parses a GGUF file (memory-mapped, read-only).
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io { path: path.display().to_string(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; the model file is not expected to change while loaded.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Bytes::Mapped(map))
    }

    /// Parses a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::parse(Bytes::Owned(bytes))
    }

    fn parse(data: Bytes) -> Result<GgufFile, GgufError> {
        let (version, metadata, tensors) = {
            let mut r = Reader { buf: data.as_slice(), pos: 0 };
            let magic: [u8; 4] = r.take(4, "magic")?.try_into().expect("4 bytes");
            if &magic != GGUF_MAGIC {
                return Err(GgufError::BadMagic(magic));
            }
            let version = r.u32("version")?;
            if !(2..=3).contains(&version) {
                return Err(GgufError::UnsupportedVersion(version));
            }
            let n_tensors = r.u64("tensor count")?;
            let n_kv = r.u64("metadata count")?;
            // Each entry needs at least 8 bytes; reject absurd counts before allocating.
            r.check_count(n_kv, 12, "metadata entries")?;
            r.check_count(n_tensors, 24, "tensor infos")?;
            let mut metadata = BTreeMap::new();
            for _ in 0..n_kv {
                let key = r.string("metadata key")?;
                let ty = r.u32("metadata type")?;
                let value = r.value(ty, &key, 0)?;
                metadata.insert(key, value);
            }
            let alignment = match metadata.get("general.alignment") {
                None => DEFAULT_ALIGNMENT,
                Some(v) => match v.as_u64() {
                    Some(a) if a > 0 && a.is_power_of_two() => a,
                    _ => {
                        return Err(GgufError::Corrupt(format!(
                            "general.alignment {v:?} is not a power of two"
                        )))
                    }
                },
            };
            let mut raw = Vec::with_capacity(n_tensors as usize);
            for _ in 0..n_tensors {
                let name = r.string("tensor name")?;
                let n_dims = r.u32("tensor rank")?;
                if n_dims == 0 || n_dims > MAX_DIMS {
                    return Err(GgufError::Corrupt(format!("tensor '{name}' has rank {n_dims}")));
                }
                let mut dims = Vec::with_capacity(n_dims as usize);
                for _ in 0..n_dims {
                    dims.push(r.u64("tensor dimension")?);
                }
                let type_id = r.u32("tensor type")?;
                let offset = r.u64("tensor offset")?;
                raw.push((name, dims, type_id, offset));
            }
            let data_start = align_up(r.pos as u64, alignment);
            let file_len = r.buf.len() as u64;
            let mut tensors = Vec::with_capacity(raw.len());
            for (name, dims, type_id, offset) in raw {
                let dtype =
                    GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnsupportedTensorType {
                        tensor: name.clone(),
                        type_id,
                        type_name: GgmlType::name_of_id(type_id),
                    })?;
                let n =
                    dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).ok_or_else(|| {
                        GgufError::Corrupt(format!("tensor '{name}' dimensions {dims:?} overflow"))
                    })?;
                if dims[0] % dtype.block_size() as u64 != 0 {
                    return Err(GgufError::Corrupt(format!(
                        "tensor '{name}' row length {} is not a multiple of the {} block size {}",
                        dims[0],
                        dtype.name(),
                        dtype.block_size()
                    )));
                }
                let size = (n / dtype.block_size() as u64)
                    .checked_mul(dtype.block_bytes() as u64)
                    .ok_or_else(|| {
                        GgufError::Corrupt(format!("tensor '{name}' size overflows ({dims:?})"))
                    })?;
                let abs = data_start.checked_add(offset).ok_or_else(|| {
                    GgufError::Corrupt(format!("tensor '{name}' offset {offset} overflows"))
                })?;
                if abs % alignment != 0 {
                    return Err(GgufError::Corrupt(format!(
                        "tensor '{name}' offset {offset} is not aligned to {alignment}"
                    )));
                }
                if abs.checked_add(size).is_none_or(|end| end > file_len) {
                    return Err(GgufError::Truncated {
                        what: format!("data of tensor '{name}'"),
                        offset: abs,
                        needed: size,
                        len: file_len,
                    });
                }
                tensors.push(GgufTensorInfo { name, dims, dtype, offset: abs, size });
            }
            (version, metadata, tensors)
        };
        Ok(GgufFile { version, metadata, tensors, data })
    }

    /// Metadata value by key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// Directory entry of a tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Raw bytes of a tensor (bounds were checked at parse time).
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        &self.data.as_slice()[info.offset as usize..(info.offset + info.size) as usize]
    }
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Bounds-checked little-endian cursor.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Deepest array nesting accepted.
const MAX_NESTING: u32 = 4;

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if n > remaining {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn check_count(&self, count: u64, min_bytes_each: u64, what: &str) -> Result<(), GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if count.saturating_mul(min_bytes_each) > remaining {
            return Err(GgufError::Corrupt(format!(
                "{count} {what} cannot fit in the remaining {remaining} bytes"
            )));
        }
        Ok(())
    }

    fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<GgufValue, GgufError> {
        let what = key;
        Ok(match ty {
            0 => GgufValue::U64(self.u8(what)? as u64),
            1 => GgufValue::I64(self.u8(what)? as i8 as i64),
            2 => GgufValue::U64(self.u16(what)? as u64),
            3 => GgufValue::I64(self.u16(what)? as i16 as i64),
            4 => GgufValue::U64(self.u32(what)? as u64),
            5 => GgufValue::I64(self.u32(what)? as i32 as i64),
            6 => GgufValue::F64(f32::from_bits(self.u32(what)?) as f64),
            7 => match self.u8(what)? {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(GgufError::Corrupt(format!("metadata '{key}': bool byte {b}"))),
            },
            8 => GgufValue::Str(self.string(what)?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(GgufError::Corrupt(format!(
                        "metadata '{key}': arrays nested too deep"
                    )));
                }
                let elem_ty = self.u32(what)?;
                let n = self.u64(what)?;
                self.check_count(n, 1, &format!("elements of metadata array '{key}'"))?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem_ty, key, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(self.u64(what)? as i64),
            12 => GgufValue::F64(f64::from_bits(self.u64(what)?)),
            t => {
                return Err(GgufError::Corrupt(format!(
                    "metadata '{key}' has unknown value type {t}"
                )))
            }
        })
    }
}

/// Builds GGUF images in memory; used by tests to make valid and broken files.
#[derive(Default)]
pub struct GgufWriter {
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl GgufWriter {
    /// A new empty image.
    pub fn new() -> Self {
        Self::default()
    }
    fn str_bytes(s: &str) -> Vec<u8> {
        let mut b = (s.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(s.as_bytes());
        b
    }
    /// Adds a u32 metadata value.
    pub fn u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.kv.push((key.into(), 4, v.to_le_bytes().to_vec()));
        self
    }
    /// Adds an f32 metadata value.
    pub fn f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.kv.push((key.into(), 6, v.to_le_bytes().to_vec()));
        self
    }
    /// Adds a bool metadata value.
    pub fn bool(&mut self, key: &str, v: bool) -> &mut Self {
        self.kv.push((key.into(), 7, vec![v as u8]));
        self
    }
    /// Adds a string metadata value.
    pub fn str(&mut self, key: &str, v: &str) -> &mut Self {
        self.kv.push((key.into(), 8, Self::str_bytes(v)));
        self
    }
    /// Adds an array-of-strings metadata value.
    pub fn str_array(&mut self, key: &str, v: &[&str]) -> &mut Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            b.extend(Self::str_bytes(s));
        }
        self.kv.push((key.into(), 9, b));
        self
    }
    /// Adds an array-of-i32 metadata value.
    pub fn i32_array(&mut self, key: &str, v: &[i32]) -> &mut Self {
        let mut b = 5u32.to_le_bytes().to_vec();
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            b.extend_from_slice(&x.to_le_bytes());
        }
        self.kv.push((key.into(), 9, b));
        self
    }
    /// Adds a tensor with raw data of GGML type id `type_id`; `dims` innermost first.
    pub fn tensor(&mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.into(), dims.to_vec(), type_id, data));
        self
    }
    /// Adds an f32 tensor.
    pub fn tensor_f32(&mut self, name: &str, dims: &[u64], data: &[f32]) -> &mut Self {
        let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, dims, 0, bytes)
    }
    /// Serialises the image (version 3, 32-byte alignment).
    pub fn build(&self) -> Vec<u8> {
        let mut out = GGUF_MAGIC.to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kv {
            out.extend(Self::str_bytes(k));
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            out.extend(Self::str_bytes(name));
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = align_up(offset + data.len() as u64, DEFAULT_ALIGNMENT);
        }
        let start = align_up(out.len() as u64, DEFAULT_ALIGNMENT) as usize;
        out.resize(start, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(start + off as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        GgufWriter::new()
            .str("general.architecture", "llama")
            .u32("llama.block_count", 2)
            .str_array("tokenizer.ggml.tokens", &["a", "b"])
            .tensor_f32("w", &[32, 2], &[0.5; 64])
            .build()
    }

    #[test]
    fn parses_a_valid_image() {
        let f = GgufFile::from_bytes(sample()).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.get("general.architecture").and_then(|v| v.as_str()), Some("llama"));
        assert_eq!(f.get("llama.block_count").and_then(|v| v.as_u64()), Some(2));
        let t = f.tensor("w").unwrap();
        assert_eq!(t.dims, vec![32, 2]);
        assert_eq!(f.tensor_bytes(t).len(), 256);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let full = sample();
        for cut in 0..full.len() {
            let r = GgufFile::from_bytes(full[..cut].to_vec());
            assert!(r.is_err(), "prefix of {cut} bytes parsed");
        }
    }

    #[test]
    fn bad_magic_and_version_are_named() {
        let mut b = sample();
        b[0] = b'X';
        assert!(matches!(GgufFile::from_bytes(b), Err(GgufError::BadMagic(_))));
        let mut b = sample();
        b[4] = 9;
        let e = GgufFile::from_bytes(b).unwrap_err();
        assert!(e.to_string().contains("unsupported GGUF version 9"), "{e}");
    }

    #[test]
    fn unknown_tensor_type_names_tensor_and_type() {
        // IQ4_XS: 136 bytes per 256 weights, not loaded.
        let b =
            GgufWriter::new().tensor("blk.0.ffn_up.weight", &[256, 1], 23, vec![0; 136]).build();
        let e = GgufFile::from_bytes(b).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("blk.0.ffn_up.weight") && msg.contains("IQ4_XS"), "{msg}");
        let b = GgufWriter::new().tensor("x", &[32], 250, vec![0; 64]).build();
        let msg = GgufFile::from_bytes(b).unwrap_err().to_string();
        assert!(msg.contains("'x'") && msg.contains("250"), "{msg}");
    }

    #[test]
    fn corrupt_counts_and_values_are_rejected() {
        // Tensor count that cannot fit.
        let mut b = sample();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(GgufFile::from_bytes(b).is_err());
        // Unknown metadata value type in the first entry (after key "general.architecture").
        let mut b = sample();
        let ty_pos = 24 + 8 + "general.architecture".len();
        b[ty_pos..ty_pos + 4].copy_from_slice(&77u32.to_le_bytes());
        let msg = GgufFile::from_bytes(b).unwrap_err().to_string();
        assert!(msg.contains("unknown value type 77"), "{msg}");
    }

    #[test]
    fn random_byte_flips_never_panic() {
        let full = sample();
        let mut state = 0x9E3779B97F4A7C15u64;
        for round in 0..20_000 {
            let mut b = full.clone();
            for _ in 0..1 + round % 8 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let i = (state % b.len() as u64) as usize;
                b[i] = (state >> 32) as u8;
            }
            let _ = GgufFile::from_bytes(b);
        }
    }
}
