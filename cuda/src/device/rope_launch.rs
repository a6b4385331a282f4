//! How `qkv_rope_store` is launched: how many tokens each warp takes, and the grid for a pass.

use cudarc::driver::LaunchConfig;

/// Warps of a `qkv_rope_store` block (one head per warp; the kernels' `__launch_bounds__(128, …)`
/// in kernels/layers.cu assume four).
const ROPE_WARPS: u32 = 4;

/// Most tokens one warp of a `qkv_rope_store` kernel for heads `hd` wide takes (the `TOKS` of
/// the kernel [`Gpu::rope_for`](super::Gpu::rope_for) picks for a prefill, in kernels/layers.cu): four for heads up to
/// 64 wide, one for wider heads (whose one-token kernels at 16 CTAs an SM measured faster).
pub fn rope_tokens(hd: usize) -> usize {
    match hd.div_ceil(64) {
        0..=1 => 4,
        _ => 1,
    }
}

/// Tokens a `qkv_rope_store` pass needs before each warp takes [`rope_tokens`] of them: below,
/// one token a warp already fills the GPU (decode steps); above, one token a warp left the
/// kernel bound by its round trips to memory for heads 64 wide (a prefill of 76 prompts of 108
/// tokens of the SmolLM2-135M shape on an NVIDIA H200, bf16 random weights, the one-token
/// `qkv_rope_store_p1`: 41.8 µs a layer, 21 % of the DRAM peak; Nsight Compute over
/// `tandem-gpu bench-prefill smollm2-135m-shape.json 76 108`,
/// `docs/gpu-runs/h200-2026-11-28g-prefill-rope/2-k53/`).
pub const ROPE_MANY_TOKENS: usize = 1024;

/// The launch of `qkv_rope_store` over `tokens` tokens of `heads` heads (q, k and v together)
/// `hd` wide, and the tokens each warp takes (its `per_warp` argument).
/// `TANDEM_ROPE_MANY` overrides [`ROPE_MANY_TOKENS`] for comparison (a number too large for any
/// pass keeps one token a warp everywhere).
pub fn rope_config(tokens: usize, heads: usize, hd: usize) -> (LaunchConfig, i32) {
    static MANY: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let many = *MANY.get_or_init(|| {
        std::env::var("TANDEM_ROPE_MANY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(ROPE_MANY_TOKENS)
    });
    let per_warp = if tokens >= many { rope_tokens(hd) } else { 1 };
    (rope_config_with(tokens, heads, hd, per_warp), per_warp as i32)
}

/// The launch of `qkv_rope_store` with each warp taking `per_warp` tokens.
///
/// # Panics
/// If `per_warp` is 0 or more than the kernel for heads `hd` wide holds ([`rope_tokens`]): the
/// grid would leave tokens without a warp.
pub fn rope_config_with(tokens: usize, heads: usize, hd: usize, per_warp: usize) -> LaunchConfig {
    assert!(
        (1..=rope_tokens(hd)).contains(&per_warp),
        "{per_warp} tokens a warp for heads {hd} wide"
    );
    LaunchConfig {
        grid_dim: (tokens.div_ceil(per_warp) as u32, (heads as u32).div_ceil(ROPE_WARPS), 1),
        block_dim: (32 * ROPE_WARPS, 1, 1),
        shared_mem_bytes: 0,
    }
}
