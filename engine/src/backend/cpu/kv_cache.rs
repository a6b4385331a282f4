//! The CPU backend's paged KV cache: one f32 pool for K and one for V, laid out
//! `[layer][block][slot in block][kv head][head_dim]` (seed 000's KV cache pool).

/// K and V storage for every layer and block.
pub struct CpuKvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    num_layers: usize,
    num_blocks: usize,
    block_size: usize,
    /// `kv_heads * head_dim`: floats per token per layer in K (and in V).
    token_width: usize,
}

impl CpuKvCache {
    /// Allocates a zeroed pool.
    pub fn new(num_layers: usize, num_blocks: usize, block_size: usize, token_width: usize) -> Self {
        let n = num_layers * num_blocks * block_size * token_width;
        CpuKvCache { k: vec![0.0; n], v: vec![0.0; n], num_layers, num_blocks, block_size, token_width }
    }

    /// Number of physical blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of one block over all layers, K and V.
    pub fn bytes_per_block(&self) -> usize {
        2 * self.num_layers * self.block_size * self.token_width * std::mem::size_of::<f32>()
    }

    /// Number of slots (`num_blocks * block_size`).
    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    #[inline]
    fn offset(&self, layer: usize, slot: usize) -> usize {
        (layer * self.num_slots() + slot) * self.token_width
    }

    /// Writes one token's K and V for `layer` into `slot`.
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let o = self.offset(layer, slot);
        self.k[o..o + self.token_width].copy_from_slice(k);
        self.v[o..o + self.token_width].copy_from_slice(v);
    }

    /// K of all KV heads of the token in `slot`.
    #[inline]
    pub fn k(&self, layer: usize, slot: usize) -> &[f32] {
        let o = self.offset(layer, slot);
        &self.k[o..o + self.token_width]
    }

    /// V of all KV heads of the token in `slot`.
    #[inline]
    pub fn v(&self, layer: usize, slot: usize) -> &[f32] {
        let o = self.offset(layer, slot);
        &self.v[o..o + self.token_width]
    }
}
