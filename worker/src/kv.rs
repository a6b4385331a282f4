//! The KV layout a worker's engine speaks on the wire.

use tandem_engine::scheduling::block_hash::DEFAULT_HASH_SEED;
use tandem_engine::LLMEngine;
use tandem_kv_transfer::{KvDtype, KvLayout};

/// The layout of `engine`'s KV pages (the CPU cache holds f32).
pub fn kv_layout(engine: &LLMEngine) -> KvLayout {
    let c = &engine.model_config;
    KvLayout {
        model_id: c.name.clone(),
        dtype: KvDtype::F32,
        block_size: engine.block_manager().block_size() as u32,
        num_layers: engine.kv_groups().layers_per_page as u32,
        num_kv_heads: c.num_kv_heads as u32,
        head_dim: c.head_dim as u32,
        hash_seed: DEFAULT_HASH_SEED,
    }
}

/// A GPU's KV pool as an endpoint of the device transport (`--kv-transport nccl`).
#[derive(Clone)]
pub struct KvDevice(pub std::sync::Arc<dyn tandem_kv_transfer::device::DeviceKv>);

impl std::fmt::Debug for KvDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.0.info();
        write!(f, "KvDevice({} pages of {} bytes)", i.dtype, i.page_bytes)
    }
}

/// `layout` in the control plane's message.
pub fn layout_to_proto(l: &KvLayout) -> tandem_proto::v1::KvLayout {
    tandem_proto::v1::KvLayout {
        model_id: l.model_id.clone(),
        dtype: l.dtype as u32,
        block_size: l.block_size,
        num_layers: l.num_layers,
        num_kv_heads: l.num_kv_heads,
        head_dim: l.head_dim,
        hash_seed: l.hash_seed,
    }
}

/// A layout from the control plane's message.
pub fn layout_from_proto(p: &tandem_proto::v1::KvLayout) -> Result<KvLayout, String> {
    let dtype = u8::try_from(p.dtype)
        .ok()
        .and_then(KvDtype::from_u8)
        .ok_or_else(|| format!("unknown KV dtype {}", p.dtype))?;
    Ok(KvLayout {
        model_id: p.model_id.clone(),
        dtype,
        block_size: p.block_size,
        num_layers: p.num_layers,
        num_kv_heads: p.num_kv_heads,
        head_dim: p.head_dim,
        hash_seed: p.hash_seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_cross_the_control_plane_unchanged() {
        let l = KvLayout {
            model_id: "m".into(),
            dtype: KvDtype::BF16,
            block_size: 16,
            num_layers: 30,
            num_kv_heads: 3,
            head_dim: 64,
            hash_seed: 9,
        };
        assert_eq!(layout_from_proto(&layout_to_proto(&l)).unwrap(), l);
        let mut p = layout_to_proto(&l);
        p.dtype = 7;
        assert!(layout_from_proto(&p).unwrap_err().contains("dtype 7"));
    }
}
