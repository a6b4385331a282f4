// Per-layer kernels: embedding, RMSNorm, q/k norm with RoPE and the KV store (after common.cu
// in device.rs's KERNEL_SOURCE).

// x[t, :] = embedding row of tok[t] (16-bit table), as f32. Grid: tokens.
extern "C" __global__ void embed(const int* __restrict__ tok, const h16* __restrict__ table,
                                 float* __restrict__ x, int H, float scale) {
  KERNEL_ENTRY();
  const h16* row = table + (size_t)tok[blockIdx.x] * H;
  float* xr = x + (size_t)blockIdx.x * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] = h2f(row[i]) * scale;
}

// y[r, :] = x[src, :] * rsqrt(mean(x[src]^2) + eps) * w, src = rows ? rows[r] : r. f32 in, 16-bit out.
// Grid: output rows.
// Rows whose width is a multiple of 4 travel 16 bytes (4 floats in, 4 outputs) at a time; rows of
// at most VECS such vectors per thread stay in registers between the sum and the scaling. Each
// VECS is a kernel of its own (`rmsnorm_v1` .. `_v8`; the host takes the smallest that holds the
// row): the registers of 8 vectors a thread would hold 2 CTAs per SM where a 1,024-wide row
// needs one, and a prefill's thousands of rows are then bound by latency, not bytes.
//
// PARTS (`rmsnorm_parts*`): first x[r] += parts[0][r] + … + parts[nparts-1][r] (the slices of a
// product cut along k, `pstride` floats apart), written back to x, then normed; rows is null.
template <int VECS, bool PARTS>
__device__ __forceinline__ void rmsnorm_impl(float* __restrict__ x, const int* __restrict__ rows,
                                             const float* __restrict__ w, h16* __restrict__ y, int H, float eps,
                                             const float* __restrict__ parts, int nparts, size_t pstride) {
  int src = rows ? rows[blockIdx.x] : blockIdx.x;
  float* xr = x + (size_t)src * H;
  const float* pr = PARTS ? parts + (size_t)src * H : nullptr;
  h16* yr = y + (size_t)blockIdx.x * H;
  float ss = 0.f;
  if ((H & 3) == 0 && H / 4 <= VECS * (int)blockDim.x) {
    // The row and the weights held in registers from one round of loads.
    float4* x4 = reinterpret_cast<float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    uint2* y4 = reinterpret_cast<uint2*>(yr);
    float4 v[VECS], g[VECS];
#pragma unroll
    for (int j = 0; j < VECS; j++) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < H / 4) {
        v[j] = x4[i];
        g[j] = w4[i];
        if (PARTS) {
          for (int p = 0; p < nparts; p++) {
            const float4 d = reinterpret_cast<const float4*>(pr + p * pstride)[i];
            v[j].x += d.x, v[j].y += d.y, v[j].z += d.z, v[j].w += d.w;
          }
          x4[i] = v[j];
        }
        ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
      }
    }
    float inv = rsqrtf(block_sum(ss) / (float)H + eps);
#pragma unroll
    for (int j = 0; j < VECS; j++) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < H / 4) {
        uint2 o;
        o.x = (unsigned)f2h(v[j].x * inv * g[j].x) | ((unsigned)f2h(v[j].y * inv * g[j].y) << 16);
        o.y = (unsigned)f2h(v[j].z * inv * g[j].z) | ((unsigned)f2h(v[j].w * inv * g[j].w) << 16);
        y4[i] = o;
      }
    }
    return;
  }
  if ((H & 3) == 0) {
    float4* x4 = reinterpret_cast<float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    uint2* y4 = reinterpret_cast<uint2*>(yr);
    for (int i = threadIdx.x; i < H / 4; i += blockDim.x) {
      float4 v = x4[i];
      if (PARTS) {
        for (int p = 0; p < nparts; p++) {
          const float4 d = reinterpret_cast<const float4*>(pr + p * pstride)[i];
          v.x += d.x, v.y += d.y, v.z += d.z, v.w += d.w;
        }
        x4[i] = v;  // read back below by this same thread
      }
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    float inv = rsqrtf(block_sum(ss) / (float)H + eps);
    for (int i = threadIdx.x; i < H / 4; i += blockDim.x) {
      float4 v = x4[i], g = w4[i];
      uint2 o;
      o.x = (unsigned)f2h(v.x * inv * g.x) | ((unsigned)f2h(v.y * inv * g.y) << 16);
      o.y = (unsigned)f2h(v.z * inv * g.z) | ((unsigned)f2h(v.w * inv * g.w) << 16);
      y4[i] = o;
    }
    return;
  }
  for (int i = threadIdx.x; i < H; i += blockDim.x) {
    if (PARTS) {
      float v = xr[i];
      for (int p = 0; p < nparts; p++) v += pr[p * pstride + i];
      xr[i] = v;
    }
    ss += xr[i] * xr[i];
  }
  float inv = rsqrtf(block_sum(ss) / (float)H + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) yr[i] = f2h(xr[i] * inv * w[i]);
}

#define RMSNORM_KERNEL(NAME, VECS)                                                                     \
  extern "C" __global__ void NAME(const float* __restrict__ x, const int* __restrict__ rows,          \
                                  const float* __restrict__ w, h16* __restrict__ y, int H, float eps) { \
    KERNEL_ENTRY();                                                                                    \
    rmsnorm_impl<VECS, false>(const_cast<float*>(x), rows, w, y, H, eps, nullptr, 0, 0);               \
  }
RMSNORM_KERNEL(rmsnorm_v1, 1)
RMSNORM_KERNEL(rmsnorm_v2, 2)
RMSNORM_KERNEL(rmsnorm_v4, 4)
RMSNORM_KERNEL(rmsnorm, 8)

// The residual's rows plus a split-k product's slices, then RMSNorm (rmsnorm_impl's PARTS).
#define RMSNORM_PARTS_KERNEL(NAME, VECS)                                                               \
  extern "C" __global__ void NAME(float* __restrict__ x, const float* __restrict__ parts, int nparts,  \
                                  long long pstride, const float* __restrict__ w, h16* __restrict__ y,  \
                                  int H, float eps) {                                                  \
    KERNEL_ENTRY();                                                                                    \
    rmsnorm_impl<VECS, true>(x, nullptr, w, y, H, eps, parts, nparts, (size_t)pstride);                \
  }
RMSNORM_PARTS_KERNEL(rmsnorm_parts_v1, 1)
RMSNORM_PARTS_KERNEL(rmsnorm_parts_v2, 2)
RMSNORM_PARTS_KERNEL(rmsnorm_parts_v4, 4)
RMSNORM_PARTS_KERNEL(rmsnorm_parts, 8)

// One token's heads from the fused q|k|v projection (f32): optional bias (Qwen2, [q|k|v]),
// optional per-head RMSNorm (Qwen3), rotary embedding, then q to `q_out` (f32, [T, nh, hd]) and, for
// the GEMM attention path, to `q16` (IEEE half, same layout; null: not wanted), and k, v into the
// paged cache at the token's slot (16-bit, blocks of [nkv][block_size][hd]; slot < 0 skips the
// store). One warp per head, every head of every token at once: the kernel's time is one
// round trip to memory, not one per head. A lane holds the rotation pairs (a, b) of indices
// i = lane, lane + 32, … < hd/2 in registers (hd at most 64 · ROPE_PAIRS, the backend's 1024)
// and computes their angles itself: every head of a token computes the same angles, a few
// instructions in place of a shared-memory exchange and a barrier. A norm's sum of squares
// adds the pairs' first elements, then their second (for hd/2 a multiple of 32 that is the
// order i = lane, lane + 32, … over the whole head).
// Grid: (T, ⌈(nh + 2·nkv) / warps⌉); block: warps · 32 threads.
#define ROPE_PAIRS 16
template <int PAIRS>
__device__ __forceinline__ void qkv_rope_store_impl(const float* __restrict__ qkv, const int* __restrict__ pos,
                                                    const int* __restrict__ slot, const float* __restrict__ inv_freq,
                                                    const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                                    float* __restrict__ q_out, h16* __restrict__ q16, h16* __restrict__ k_cache,
                                                    h16* __restrict__ v_cache, int nh, int nkv, int hd,
                                                    int interleaved, float eps, int block_size,
                                                    const float* __restrict__ qkv_bias) {
  const int half = hd / 2, t = blockIdx.x, lane = threadIdx.x & 31;
  const int h = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int heads = nh + 2 * nkv;
  if (h >= heads) return;
  // Every load is issued before any result is needed (one round trip to memory): the token's
  // slot only decides what is stored.
  const int s = slot[t];
  const float p = (float)pos[t];
  const float* src = qkv + ((size_t)t * heads + h) * hd;
  const float* bias = qkv_bias ? qkv_bias + h * hd : nullptr;
  if (h >= nh + nkv) {  // a value head: stored as is
    if (s < 0) return;
    h16* dst = v_cache + kv_index(s, h - nh - nkv, nkv, hd, block_size);
#pragma unroll 4
    for (int i = lane; i < hd; i += 32) dst[i] = f2h(bias ? src[i] + bias[i] : src[i]);
    return;
  }
  const bool is_q = h < nh;
  const float* norm = is_q ? q_norm : k_norm;
  float x0[PAIRS], x1[PAIRS], g0[PAIRS], g1[PAIRS], fr[PAIRS];
#pragma unroll
  for (int j = 0; j < PAIRS; j++) {
    const int i = lane + 32 * j;
    x0[j] = x1[j] = 0.f;
    g0[j] = g1[j] = fr[j] = 0.f;
    if (i < half) {
      const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
      x0[j] = bias ? src[a] + bias[a] : src[a];
      x1[j] = bias ? src[b] + bias[b] : src[b];
      fr[j] = inv_freq[i];
      if (norm) {
        g0[j] = norm[a];
        g1[j] = norm[b];
      }
    }
  }
  if (!is_q && s < 0) return;  // a key without a slot: nothing to store
  float inv = 1.f;
  if (norm) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < PAIRS; j++) ss += x0[j] * x0[j];
#pragma unroll
    for (int j = 0; j < PAIRS; j++) ss += x1[j] * x1[j];
    inv = rsqrtf(warp_sum(ss) / (float)hd + eps);
  }
  float* qo = is_q ? q_out + ((size_t)t * nh + h) * hd : nullptr;
  h16* ko = is_q ? nullptr : k_cache + kv_index(s, h - nh, nkv, hd, block_size);
#pragma unroll
  for (int j = 0; j < PAIRS; j++) {
    const int i = lane + 32 * j;
    if (i >= half) break;
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    float c, sn, u0 = x0[j], u1 = x1[j];
    sincosf(p * fr[j], &sn, &c);
    if (norm) {
      u0 = u0 * inv * g0[j];
      u1 = u1 * inv * g1[j];
    }
    const float r0 = u0 * c - u1 * sn, r1 = u0 * sn + u1 * c;
    if (is_q) {
      qo[a] = r0;
      qo[b] = r1;
      if (q16) {
        size_t o = ((size_t)t * nh + h) * hd;
        q16[o + a] = to_f16(r0);
        q16[o + b] = to_f16(r1);
      }
    } else {
      ko[a] = f2h(r0);
      ko[b] = f2h(r1);
    }
  }
}

// The same for `per_warp` consecutive tokens a warp (at most TOKS; grid (⌈T / per_warp⌉,
// ⌈(nh + 2·nkv) / warps⌉)): every load of all of them is issued before any result is needed, so
// a warp has per_warp round trips' bytes in flight at once — for a prefill's thousands of tokens,
// where one token a warp left the kernel waiting on memory with the SMs half full. Its rotate-and-
// store lines repeat the one-token kernel's on purpose: a shared helper changed what NVRTC 13.0
// makes of the one-token kernels the decode graphs run (sm_90: qkv_rope_store_p2 spilled 32
// bytes instead of 16, the general kernel 116 registers instead of 114).
template <int PAIRS, int TOKS>
__device__ __forceinline__ void qkv_rope_store_tokens_impl(const float* __restrict__ qkv, const int* __restrict__ pos,
                                                           const int* __restrict__ slot, const float* __restrict__ inv_freq,
                                                           const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                                           float* __restrict__ q_out, h16* __restrict__ q16, h16* __restrict__ k_cache,
                                                           h16* __restrict__ v_cache, int nh, int nkv, int hd,
                                                           int interleaved, float eps, int block_size,
                                                           const float* __restrict__ qkv_bias, int num_tokens, int per_warp) {
  const int half = hd / 2, lane = threadIdx.x & 31;
  const int h = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int heads = nh + 2 * nkv;
  if (h >= heads) return;
  const int t0 = blockIdx.x * per_warp;
  // Tokens of this warp (n ≤ TOKS): their slots only decide what is stored.
  const int n = min(min(per_warp, TOKS), num_tokens - t0);
  int s[TOKS];
  float p[TOKS];
#pragma unroll
  for (int k = 0; k < TOKS; k++) {
    s[k] = k < n ? slot[t0 + k] : -1;
    p[k] = k < n ? (float)pos[t0 + k] : 0.f;
  }
  const float* bias = qkv_bias ? qkv_bias + h * hd : nullptr;
  if (h >= nh + nkv) {  // a value head: stored as is
    float v[TOKS][2 * PAIRS];
#pragma unroll
    for (int k = 0; k < TOKS; k++) {
      const float* src = qkv + ((size_t)(t0 + k) * heads + h) * hd;
#pragma unroll
      for (int j = 0; j < 2 * PAIRS; j++) {
        const int i = lane + 32 * j;
        v[k][j] = (k < n && i < hd) ? (bias ? src[i] + bias[i] : src[i]) : 0.f;
      }
    }
#pragma unroll
    for (int k = 0; k < TOKS; k++) {
      if (k >= n || s[k] < 0) continue;
      h16* dst = v_cache + kv_index(s[k], h - nh - nkv, nkv, hd, block_size);
#pragma unroll
      for (int j = 0; j < 2 * PAIRS; j++) {
        const int i = lane + 32 * j;
        if (i < hd) dst[i] = f2h(v[k][j]);
      }
    }
    return;
  }
  const bool is_q = h < nh;
  const float* norm = is_q ? q_norm : k_norm;
  float x0[TOKS][PAIRS], x1[TOKS][PAIRS], g0[PAIRS], g1[PAIRS], fr[PAIRS];
#pragma unroll
  for (int j = 0; j < PAIRS; j++) {
    const int i = lane + 32 * j;
    g0[j] = g1[j] = fr[j] = 0.f;
    if (i < half) {
      const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
      fr[j] = inv_freq[i];
      if (norm) {
        g0[j] = norm[a];
        g1[j] = norm[b];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < TOKS; k++) {
    const float* src = qkv + ((size_t)(t0 + k) * heads + h) * hd;
#pragma unroll
    for (int j = 0; j < PAIRS; j++) {
      const int i = lane + 32 * j;
      x0[k][j] = x1[k][j] = 0.f;
      if (k < n && i < half) {
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        x0[k][j] = bias ? src[a] + bias[a] : src[a];
        x1[k][j] = bias ? src[b] + bias[b] : src[b];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < TOKS; k++) {
    if (k >= n) break;
    if (!is_q && s[k] < 0) continue;  // a key without a slot: nothing to store
    const int t = t0 + k;
    float inv = 1.f;
    if (norm) {
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < PAIRS; j++) ss += x0[k][j] * x0[k][j];
#pragma unroll
      for (int j = 0; j < PAIRS; j++) ss += x1[k][j] * x1[k][j];
      inv = rsqrtf(warp_sum(ss) / (float)hd + eps);
    }
    float* qo = is_q ? q_out + ((size_t)t * nh + h) * hd : nullptr;
    h16* ko = is_q ? nullptr : k_cache + kv_index(s[k], h - nh, nkv, hd, block_size);
#pragma unroll
    for (int j = 0; j < PAIRS; j++) {
      const int i = lane + 32 * j;
      if (i >= half) break;
      const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
      float c, sn, u0 = x0[k][j], u1 = x1[k][j];
      sincosf(p[k] * fr[j], &sn, &c);
      if (norm) {
        u0 = u0 * inv * g0[j];
        u1 = u1 * inv * g1[j];
      }
      const float r0 = u0 * c - u1 * sn, r1 = u0 * sn + u1 * c;
      if (is_q) {
        qo[a] = r0;
        qo[b] = r1;
        if (q16) {
          size_t o = ((size_t)t * nh + h) * hd;
          q16[o + a] = to_f16(r0);
          q16[o + b] = to_f16(r1);
        }
      } else {
        ko[a] = f2h(r0);
        ko[b] = f2h(r1);
      }
    }
  }
}

// One kernel per most rotation pairs a lane holds (hd ≤ 64 · PAIRS) and most tokens a warp
// takes (TOKS): sized for 1,024-wide heads, a 128-wide head's warp held 114 registers for 2
// pairs and 4 CTAs fitted an SM. MIN_BLOCKS: CTAs of 4 warps (the host's ROPE_WARPS) the
// registers leave room for. Warps per SM times the tokens each has in flight set the
// bandwidth: one token a warp, heads up to 128 wide at 16 CTAs (32 registers, a few bytes
// spilled) took the q/k norm + RoPE + KV store stage of a 16 × 1,024-token Qwen3-0.6B prefill
// from 6.96 to 5.75 ms and of a 4 × 2,048 Llama-3-8B one from 6.19 to 5.42 ms on an H200
// (docs/gpu-runs/h200-2026-11-28d-small-batch/4-prefill-knobs/). For heads up to 64 wide a
// prefill's warps take four tokens each (`qkv_rope_store_p1x4`, 8 CTAs): on one H200 (bf16
// random weights, Nsight Compute over `tandem-gpu bench-prefill CFG 76 108`, the kernel timed
// alone) the kernel went from 41.8 to 34.8 µs a layer in a 76 × 108-token prefill of the
// SmolLM2-135M shape; eight tokens a warp
// took 37.9 µs, and four tokens at 8 CTAs for 128-wide heads 141 µs against 102 µs for one at
// 16 (Qwen3-0.6B; docs/gpu-runs/h200-2026-11-28g-prefill-rope/). ROPE_MIN_BLOCKS (a define)
// overrides MIN_BLOCKS for comparison.
#ifdef ROPE_MIN_BLOCKS
#define ROPE_BOUNDS(MIN_BLOCKS) __launch_bounds__(128, ROPE_MIN_BLOCKS)
#else
#define ROPE_BOUNDS(MIN_BLOCKS) __launch_bounds__(128, MIN_BLOCKS)
#endif
// Every variant takes the same arguments; the one-token kernels (TOKS 1) leave num_tokens and
// per_warp unread (their grid has a block row per token).
#define ROPE_KERNEL(NAME, PAIRS, TOKS, MIN_BLOCKS)                                                     \
  extern "C" __global__ void ROPE_BOUNDS(MIN_BLOCKS) NAME(                                            \
      const float* __restrict__ qkv, const int* __restrict__ pos, const int* __restrict__ slot,        \
      const float* __restrict__ inv_freq, const float* __restrict__ q_norm,                            \
      const float* __restrict__ k_norm, float* __restrict__ q_out, h16* __restrict__ q16,              \
      h16* __restrict__ k_cache, h16* __restrict__ v_cache, int nh, int nkv, int hd, int interleaved,  \
      float eps, int block_size, const float* __restrict__ qkv_bias, int num_tokens, int per_warp) {   \
    KERNEL_ENTRY();                                                                                    \
    if (TOKS == 1)                                                                                     \
      qkv_rope_store_impl<PAIRS>(qkv, pos, slot, inv_freq, q_norm, k_norm, q_out, q16, k_cache,       \
                                 v_cache, nh, nkv, hd, interleaved, eps, block_size, qkv_bias);        \
    else                                                                                               \
      qkv_rope_store_tokens_impl<PAIRS, TOKS>(qkv, pos, slot, inv_freq, q_norm, k_norm, q_out, q16,   \
                                              k_cache, v_cache, nh, nkv, hd, interleaved, eps,         \
                                              block_size, qkv_bias, num_tokens, per_warp);             \
  }
// TOKS: what `rope_tokens` and `Gpu::rope_for` in cuda/src/device.rs say of each kernel (a test
// reads these lines).
ROPE_KERNEL(qkv_rope_store_p1, 1, 1, 16)
ROPE_KERNEL(qkv_rope_store_p1x4, 1, 4, 8)
ROPE_KERNEL(qkv_rope_store_p2, 2, 1, 16)
ROPE_KERNEL(qkv_rope_store_p4, 4, 1, 1)
ROPE_KERNEL(qkv_rope_store, ROPE_PAIRS, 1, 1)
