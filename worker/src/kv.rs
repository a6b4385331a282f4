//! The KV layout a worker's engine speaks on the wire.

use tandem_engine::block_hash::DEFAULT_HASH_SEED;
use tandem_engine::LLMEngine;
use tandem_kv_transfer::{KvDtype, KvLayout};

/// The layout of `engine`'s KV pages (the CPU cache holds f32).
pub fn kv_layout(engine: &LLMEngine) -> KvLayout {
    let c = &engine.model_config;
    KvLayout {
        model_id: c.name.clone(),
        dtype: KvDtype::F32,
        block_size: engine.block_manager().block_size() as u32,
        num_layers: c.num_layers as u32,
        num_kv_heads: c.num_kv_heads as u32,
        head_dim: c.head_dim as u32,
        hash_seed: DEFAULT_HASH_SEED,
    }
}
