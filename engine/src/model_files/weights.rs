//! `ModelFiles`: one view over a model's tensors, whatever the file format.
//!
//! Tensors are addressed by their GGUF names (`blk.3.attn_q.weight`); a safetensors model's
//! Hugging Face names are mapped onto them. This module hands out raw bytes with a type and a
//! shape; converting them for a backend is the backend's job.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::model_files::config::ModelConfig;
use crate::model_files::dtype::GgmlType;
use crate::model_files::gguf::GgufFile;
use crate::LoadError;

/// A borrowed tensor: type, shape (outermost first) and raw little-endian bytes.
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    /// Name in the file.
    pub name: String,
    /// Dimensions, outermost first (a linear weight is `[out_features, in_features]`).
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: GgmlType,
    /// Raw data.
    pub bytes: &'a [u8],
}

impl TensorRef<'_> {
    /// Number of elements.
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Dequantises the whole tensor to f32 (the exact path).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.num_elements()];
        crate::model_files::dtype::dequantize(self.dtype, self.bytes, &mut out);
        out
    }
}

/// The opened files of a model.
pub enum ModelFiles {
    /// A single GGUF file.
    Gguf(GgufFile),
    /// A Hugging Face directory: config.json and one or more safetensors files.
    Safetensors(SafetensorsModel),
}

/// Memory-mapped safetensors shards and their tensor directories.
pub struct SafetensorsModel {
    /// Model directory.
    pub dir: PathBuf,
    shards: Vec<memmap2::Mmap>,
    /// HF tensor name -> (shard index, dtype, shape, absolute byte range).
    index: HashMap<String, (usize, GgmlType, Vec<usize>, std::ops::Range<usize>)>,
    /// Gemma's names for norms before and after each sub-layer (its `post_attention_layernorm`
    /// follows attention; Llama's precedes the MLP).
    sandwich_norms: bool,
}

impl ModelFiles {
    /// Opens a `.gguf` file or a safetensors model directory and reads its configuration.
    pub fn open(path: &Path) -> Result<(ModelFiles, ModelConfig), LoadError> {
        if path.is_dir() {
            let cfg_path = path.join("config.json");
            let text = std::fs::read_to_string(&cfg_path)
                .map_err(|source| LoadError::Io { path: cfg_path.display().to_string(), source })?;
            let cfg = ModelConfig::from_hf_json(&text)?;
            let mut st = SafetensorsModel::open(path)?;
            st.sandwich_norms = cfg.post_norms;
            Ok((ModelFiles::Safetensors(st), cfg))
        } else if path.extension().is_some_and(|e| e == "gguf") || sniff_gguf(path) {
            let f = GgufFile::open(path)?;
            let cfg = ModelConfig::from_gguf(&f)?;
            Ok((ModelFiles::Gguf(f), cfg))
        } else if !path.exists() {
            Err(LoadError::Io {
                path: path.display().to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such file or directory",
                ),
            })
        } else {
            Err(LoadError::UnknownFormat(path.display().to_string()))
        }
    }

    /// Looks a tensor up by its GGUF name.
    pub fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        match self {
            ModelFiles::Gguf(f) => {
                let info = f.tensor(name)?;
                Some(TensorRef {
                    name: name.to_string(),
                    shape: info.dims.iter().rev().map(|&d| d as usize).collect(),
                    dtype: info.dtype,
                    bytes: f.tensor_bytes(info),
                })
            }
            ModelFiles::Safetensors(st) => {
                let hf = hf_name(name, st.sandwich_norms)?;
                let (shard, dtype, shape, range) = st.index.get(&hf)?;
                Some(TensorRef {
                    name: hf,
                    shape: shape.clone(),
                    dtype: *dtype,
                    bytes: &st.shards[*shard][range.clone()],
                })
            }
        }
    }

    /// Looks a tensor up and checks its shape; absent or misshapen tensors are errors.
    pub fn require(&self, name: &str, shape: &[usize]) -> Result<TensorRef<'_>, LoadError> {
        let t = self.tensor(name).ok_or_else(|| LoadError::MissingTensor(name.to_string()))?;
        if t.shape != shape {
            return Err(LoadError::BadTensor {
                name: t.name.clone(),
                message: format!("shape {:?}, expected {:?}", t.shape, shape),
            });
        }
        Ok(t)
    }
}

fn sniff_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok()
        && &magic == b"GGUF"
}

/// Maps a GGUF tensor name to the Hugging Face name of the same tensor.
fn hf_name(gguf: &str, sandwich_norms: bool) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let hf = match (part, sandwich_norms) {
        ("ffn_norm.weight", true) => "pre_feedforward_layernorm.weight",
        ("post_attention_norm.weight", true) => "post_attention_layernorm.weight",
        ("post_ffw_norm.weight", true) => "post_feedforward_layernorm.weight",
        (part, _) => match part {
            "attn_norm.weight" => "input_layernorm.weight",
            "attn_q.weight" => "self_attn.q_proj.weight",
            "attn_q.bias" => "self_attn.q_proj.bias",
            "attn_k.bias" => "self_attn.k_proj.bias",
            "attn_v.bias" => "self_attn.v_proj.bias",
            "attn_qkv.weight" => "self_attn.qkv_proj.weight",
            "ffn_gate_up.weight" => "mlp.gate_up_proj.weight",
            "attn_k.weight" => "self_attn.k_proj.weight",
            "attn_v.weight" => "self_attn.v_proj.weight",
            "attn_output.weight" => "self_attn.o_proj.weight",
            "attn_q_norm.weight" => "self_attn.q_norm.weight",
            "attn_k_norm.weight" => "self_attn.k_norm.weight",
            "ffn_norm.weight" => "post_attention_layernorm.weight",
            "ffn_gate.weight" => "mlp.gate_proj.weight",
            "ffn_up.weight" => "mlp.up_proj.weight",
            "ffn_down.weight" => "mlp.down_proj.weight",
            _ => return None,
        },
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

impl SafetensorsModel {
    /// Total number of elements over all tensors.
    pub fn num_elements(&self) -> u64 {
        self.index.values().map(|(_, _, shape, _)| shape.iter().product::<usize>() as u64).sum()
    }

    /// Maps every `*.safetensors` file of `dir` and indexes their tensors.
    pub fn open(dir: &Path) -> Result<SafetensorsModel, LoadError> {
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |source| LoadError::Io { path: p, source }
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(LoadError::UnknownFormat(dir.display().to_string()));
        }
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for (i, path) in files.iter().enumerate() {
            let file = std::fs::File::open(path).map_err(io(path))?;
            // SAFETY: read-only map of a model file that is not modified while loaded.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io(path))?;
            let bad = |message: String| LoadError::Safetensors {
                path: path.display().to_string(),
                message,
            };
            let (header_len, meta) =
                safetensors::SafeTensors::read_metadata(&map).map_err(|e| bad(format!("{e}")))?;
            let base = 8 + header_len;
            for (name, info) in meta.tensors() {
                let dtype = match info.dtype {
                    safetensors::Dtype::F32 => GgmlType::F32,
                    safetensors::Dtype::F16 => GgmlType::F16,
                    safetensors::Dtype::BF16 => GgmlType::BF16,
                    other => return Err(bad(format!("tensor '{name}' has unsupported dtype {other:?} (supported: F32, F16, BF16)"))),
                };
                let (start, end) = info.data_offsets;
                let n: usize = info.shape.iter().product();
                if end < start || base + end > map.len() || end - start != dtype.bytes_for(n) {
                    return Err(bad(format!(
                        "tensor '{name}' data range {start}..{end} is inconsistent with the file"
                    )));
                }
                index
                    .insert(name.clone(), (i, dtype, info.shape.clone(), base + start..base + end));
            }
            shards.push(map);
        }
        Ok(SafetensorsModel { dir: dir.to_path_buf(), shards, index, sandwich_norms: false })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_names_map() {
        assert_eq!(
            hf_name("blk.12.attn_k_norm.weight", false).unwrap(),
            "model.layers.12.self_attn.k_norm.weight"
        );
        assert_eq!(hf_name("output.weight", false).unwrap(), "lm_head.weight");
        assert!(hf_name("blk.1.unknown", false).is_none());
    }
}
