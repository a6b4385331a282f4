// Per-layer kernels: embedding, RMSNorm, q/k norm with RoPE and the KV store (after common.cu
// in device.rs's KERNEL_SOURCE).

// x[t, :] = embedding row of tok[t] (16-bit table), as f32. Grid: tokens.
extern "C" __global__ void embed(const int* __restrict__ tok, const h16* __restrict__ table,
                                 float* __restrict__ x, int H, float scale) {
  const h16* row = table + (size_t)tok[blockIdx.x] * H;
  float* xr = x + (size_t)blockIdx.x * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] = h2f(row[i]) * scale;
}

// y[r, :] = x[src, :] * rsqrt(mean(x[src]^2) + eps) * w, src = rows ? rows[r] : r. f32 in, 16-bit out.
// Grid: output rows.
// Rows whose width is a multiple of 4 travel 16 bytes (4 floats in, 4 outputs) at a time.
extern "C" __global__ void rmsnorm(const float* __restrict__ x, const int* __restrict__ rows,
                                   const float* __restrict__ w, h16* __restrict__ y, int H, float eps) {
  int src = rows ? rows[blockIdx.x] : blockIdx.x;
  const float* xr = x + (size_t)src * H;
  h16* yr = y + (size_t)blockIdx.x * H;
  float ss = 0.f;
  if ((H & 3) == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    uint2* y4 = reinterpret_cast<uint2*>(yr);
    for (int i = threadIdx.x; i < H / 4; i += blockDim.x) {
      float4 v = x4[i];
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
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
  float inv = rsqrtf(block_sum(ss) / (float)H + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) yr[i] = f2h(xr[i] * inv * w[i]);
}

// One token's heads from the fused q|k|v projection (f32): optional bias (Qwen2, [q|k|v]),
// optional per-head RMSNorm (Qwen3), rotary embedding, then q to `q_out` (f32, [T, nh, hd]) and, for
// the GEMM attention path, to `q16` (IEEE half, same layout; null: not wanted), and k, v into the
// paged cache at the token's slot (16-bit, blocks of [nkv][block_size][hd]; slot < 0 skips the
// store). A block takes one token: the cosines and sines of its rotation angles are computed once
// into shared memory for all its heads, and each warp takes every (blockDim.x / 32)-th of the
// nh + 2·nkv heads, staging it in a shared row of its own. Grid: T; block: a multiple of 32
// threads; shared: hd · (1 + warps) floats.
extern "C" __global__ void qkv_rope_store(const float* __restrict__ qkv, const int* __restrict__ pos,
                                          const int* __restrict__ slot, const float* __restrict__ inv_freq,
                                          const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                          float* __restrict__ q_out, h16* __restrict__ q16, h16* __restrict__ k_cache,
                                          h16* __restrict__ v_cache, int nh, int nkv, int hd,
                                          int interleaved, float eps, int block_size,
                                          const float* __restrict__ qkv_bias) {
  extern __shared__ float rope_smem[];
  const int half = hd / 2, t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  float* cs = rope_smem;         // cos, [half]
  float* sn = rope_smem + half;  // sin, [half]
  float* head = rope_smem + hd + warp * hd;
  const float p = (float)pos[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) sincosf(p * inv_freq[i], &sn[i], &cs[i]);
  __syncthreads();
  const int s = slot[t], heads = nh + 2 * nkv;
  const float* row = qkv + (size_t)t * heads * hd;
  for (int h = warp; h < heads; h += warps) {
    if (h >= nh && s < 0) continue;  // k or v without a slot: nothing to store
    const float* src = row + (size_t)h * hd;
    const float* bias = qkv_bias ? qkv_bias + h * hd : nullptr;
    if (h >= nh + nkv) {  // a value head: stored as is
      h16* dst = v_cache + kv_index(s, h - nh - nkv, nkv, hd, block_size);
#pragma unroll 4
      for (int i = lane; i < hd; i += 32) dst[i] = f2h(bias ? src[i] + bias[i] : src[i]);
      continue;
    }
    const bool is_q = h < nh;
    const float* norm = is_q ? q_norm : k_norm;
    float ss = 0.f;
#pragma unroll 4
    for (int i = lane; i < hd; i += 32) {
      float v = bias ? src[i] + bias[i] : src[i];
      head[i] = v;
      ss += v * v;
    }
    const float inv = norm ? rsqrtf(warp_sum(ss) / (float)hd + eps) : 1.f;
    __syncwarp();
    float* qo = is_q ? q_out + ((size_t)t * nh + h) * hd : nullptr;
    h16* ko = is_q ? nullptr : k_cache + kv_index(s, h - nh, nkv, hd, block_size);
    for (int i = lane; i < half; i += 32) {
      const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
      float x0 = head[a], x1 = head[b];
      if (norm) {
        x0 = x0 * inv * norm[a];
        x1 = x1 * inv * norm[b];
      }
      const float r0 = x0 * cs[i] - x1 * sn[i], r1 = x0 * sn[i] + x1 * cs[i];
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
    __syncwarp();  // the row is rewritten by the warp's next head
  }
}

