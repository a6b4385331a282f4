//! `KvLayout`: the facts both ends of a transfer must share for a page to mean the same thing.

use crate::TransferError;

/// Element type of KV pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit float.
    F32 = 0,
    /// IEEE half.
    F16 = 1,
    /// bfloat16.
    BF16 = 2,
}

impl KvDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::BF16 => 2,
        }
    }
    /// The type of a wire code (the enum's discriminant), if known.
    pub fn from_u8(v: u8) -> Option<KvDtype> {
        Some(match v {
            0 => KvDtype::F32,
            1 => KvDtype::F16,
            2 => KvDtype::BF16,
            _ => return None,
        })
    }
}

/// The KV cache layout of one side of a transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Model identity (name and a digest of its weights' file, by the caller's choice).
    pub model_id: String,
    /// Element type.
    pub dtype: KvDtype,
    /// Tokens per block.
    pub block_size: u32,
    /// Layers one page holds: every transformer layer, or those of one KV group when
    /// sliding-window layers keep pages of their own.
    pub num_layers: u32,
    /// KV heads per layer.
    pub num_kv_heads: u32,
    /// Width of a head.
    pub head_dim: u32,
    /// Seed of the chained block hash.
    pub hash_seed: u64,
}

impl KvLayout {
    /// Bytes of one page (all layers, K and V).
    pub fn page_bytes(&self) -> usize {
        2 * self.num_layers as usize
            * self.block_size as usize
            * self.num_kv_heads as usize
            * self.head_dim as usize
            * self.dtype.size()
    }

    /// Checks that `remote` matches this layout; the error names the first differing field.
    pub fn check(&self, remote: &KvLayout) -> Result<(), TransferError> {
        let fields: [(&'static str, String, String); 7] = [
            ("model_id", self.model_id.clone(), remote.model_id.clone()),
            ("dtype", format!("{:?}", self.dtype), format!("{:?}", remote.dtype)),
            ("block_size", self.block_size.to_string(), remote.block_size.to_string()),
            ("num_layers", self.num_layers.to_string(), remote.num_layers.to_string()),
            ("num_kv_heads", self.num_kv_heads.to_string(), remote.num_kv_heads.to_string()),
            ("head_dim", self.head_dim.to_string(), remote.head_dim.to_string()),
            ("hash_seed", format!("{:#x}", self.hash_seed), format!("{:#x}", remote.hash_seed)),
        ];
        for (field, local, remote) in fields {
            if local != remote {
                return Err(TransferError::LayoutMismatch { field, local, remote });
            }
        }
        Ok(())
    }

    /// Serialises the layout.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.model_id.len());
        b.extend((self.model_id.len() as u32).to_le_bytes());
        b.extend(self.model_id.as_bytes());
        b.push(self.dtype as u8);
        for v in [self.block_size, self.num_layers, self.num_kv_heads, self.head_dim] {
            b.extend(v.to_le_bytes());
        }
        b.extend(self.hash_seed.to_le_bytes());
        b
    }

    /// Parses [`KvLayout::encode`]'s output.
    pub fn decode(b: &[u8]) -> Result<KvLayout, TransferError> {
        let bad = |m: &str| TransferError::Protocol(format!("layout: {m}"));
        let n = u32::from_le_bytes(
            b.get(0..4).ok_or_else(|| bad("short"))?.try_into().expect("4 bytes"),
        ) as usize;
        if n > 4096 {
            return Err(bad("model id too long"));
        }
        let rest = b.get(4..).ok_or_else(|| bad("short"))?;
        if rest.len() != n + 1 + 16 + 8 {
            return Err(bad("wrong length"));
        }
        let model_id =
            String::from_utf8(rest[..n].to_vec()).map_err(|_| bad("model id is not UTF-8"))?;
        let dtype = KvDtype::from_u8(rest[n]).ok_or_else(|| bad("unknown dtype"))?;
        let u = |i: usize| {
            u32::from_le_bytes(rest[n + 1 + 4 * i..n + 5 + 4 * i].try_into().expect("4 bytes"))
        };
        let hash_seed = u64::from_le_bytes(rest[n + 17..n + 25].try_into().expect("8 bytes"));
        Ok(KvLayout {
            model_id,
            dtype,
            block_size: u(0),
            num_layers: u(1),
            num_kv_heads: u(2),
            head_dim: u(3),
            hash_seed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        KvLayout {
            model_id: "smollm2".into(),
            dtype: KvDtype::F32,
            block_size: 16,
            num_layers: 30,
            num_kv_heads: 3,
            head_dim: 64,
            hash_seed: 7,
        }
    }

    #[test]
    fn round_trip_and_page_size() {
        let l = layout();
        assert_eq!(KvLayout::decode(&l.encode()).unwrap(), l);
        assert_eq!(l.page_bytes(), 2 * 30 * 16 * 3 * 64 * 4);
        for cut in 0..l.encode().len() {
            assert!(KvLayout::decode(&l.encode()[..cut]).is_err());
        }
    }

    #[test]
    fn mismatch_names_the_field() {
        let a = layout();
        for (b, field) in [
            (KvLayout { block_size: 32, ..layout() }, "block_size"),
            (KvLayout { model_id: "other".into(), ..layout() }, "model_id"),
            (KvLayout { dtype: KvDtype::F16, ..layout() }, "dtype"),
            (KvLayout { num_layers: 2, ..layout() }, "num_layers"),
            (KvLayout { num_kv_heads: 8, ..layout() }, "num_kv_heads"),
            (KvLayout { head_dim: 128, ..layout() }, "head_dim"),
            (KvLayout { hash_seed: 8, ..layout() }, "hash_seed"),
        ] {
            let e = a.check(&b).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        assert!(a.check(&layout()).is_ok());
    }
}
