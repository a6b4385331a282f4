// Tandem's CUDA kernels, compiled at run time with NVRTC for the device's architecture.
// Header-free: bf16 values travel as `unsigned short` with explicit conversions, so no CUDA
// toolkit headers are needed on the machine that runs them.

typedef unsigned short bf16_t;

__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float(((unsigned int)h) << 16); }

// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ bf16_t f2bf(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float block_sum(float v) {
  __shared__ float red[32];
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[wid] = v;
  __syncthreads();
  int nw = (blockDim.x + 31) >> 5;
  v = lane < nw ? red[lane] : 0.f;
  return warp_sum(v);
}

// x[t, :] = embedding row of tok[t] (bf16 table), as f32. Grid: tokens.
extern "C" __global__ void embed(const int* __restrict__ tok, const bf16_t* __restrict__ table,
                                 float* __restrict__ x, int H) {
  const bf16_t* row = table + (size_t)tok[blockIdx.x] * H;
  float* xr = x + (size_t)blockIdx.x * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] = bf2f(row[i]);
}

// y[r, :] = x[src, :] * rsqrt(mean(x[src]^2) + eps) * w, src = rows ? rows[r] : r. f32 in, bf16 out.
// Grid: output rows.
extern "C" __global__ void rmsnorm(const float* __restrict__ x, const int* __restrict__ rows,
                                   const float* __restrict__ w, bf16_t* __restrict__ y, int H, float eps) {
  int src = rows ? rows[blockIdx.x] : blockIdx.x;
  const float* xr = x + (size_t)src * H;
  bf16_t* yr = y + (size_t)blockIdx.x * H;
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
  float inv = rsqrtf(block_sum(ss) / (float)H + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) yr[i] = f2bf(xr[i] * inv * w[i]);
}

// One head of one token from the fused q|k|v projection (f32): optional per-head RMSNorm (Qwen3),
// rotary embedding, then q to `q_out` (f32, [T, nh, hd]) and k, v into the paged cache at the
// token's slot (bf16, [slots, nkv, hd]; slot < 0 skips the store). Grid: (T, nh + 2 * nkv);
// block: hd threads.
extern "C" __global__ void qkv_rope_store(const float* __restrict__ qkv, const int* __restrict__ pos,
                                          const int* __restrict__ slot, const float* __restrict__ inv_freq,
                                          const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                          float* __restrict__ q_out, bf16_t* __restrict__ k_cache,
                                          bf16_t* __restrict__ v_cache, int nh, int nkv, int hd,
                                          int interleaved, float eps) {
  extern __shared__ float head[];
  int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  int width = (nh + 2 * nkv) * hd;
  float v = qkv[(size_t)t * width + (size_t)h * hd + i];
  int s = slot[t];
  if (h >= nh + nkv) {  // a value head: stored as is
    if (s >= 0) v_cache[((size_t)s * nkv + (h - nh - nkv)) * hd + i] = f2bf(v);
    return;
  }
  bool is_q = h < nh;
  const float* norm = is_q ? q_norm : k_norm;
  if (norm) {
    float inv = rsqrtf(block_sum(v * v) / (float)hd + eps);
    v = v * inv * norm[i];
  }
  head[i] = v;
  __syncthreads();
  int half = hd / 2;
  if (i < half) {
    int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    float ang = (float)pos[t] * inv_freq[i];
    float sn, cs;
    sincosf(ang, &sn, &cs);
    float x0 = head[a], x1 = head[b];
    float r0 = x0 * cs - x1 * sn, r1 = x0 * sn + x1 * cs;
    if (is_q) {
      float* qo = q_out + ((size_t)t * nh + h) * hd;
      qo[a] = r0;
      qo[b] = r1;
    } else if (s >= 0) {
      bf16_t* ko = k_cache + ((size_t)s * nkv + (h - nh)) * hd;
      ko[a] = f2bf(r0);
      ko[b] = f2bf(r1);
    }
  }
}

// Paged attention over a flattened batch, for prefill chunks and decode steps alike.
//
// Work is split into query tiles: each tile is up to `rows / group` consecutive tokens of one
// sequence, described by five ints: first batch row, number of tokens, position of the first
// token, offset of the sequence's block table in `block_tables`, and unused. A CTA takes one tile,
// one KV head (the `group` query heads sharing it) and one split of the context; keys and values
// are staged in shared memory 32 positions at a time, each warp owns some (token, head) rows and
// keeps an online softmax (flash-attention style), lane j scoring position j of the tile.
//
// With one split the result is written to `out` (bf16, [T, nh * hd]); with several, each split
// writes its unnormalised accumulator and (max, sum) to `part_acc`/`part_ml` for
// `attention_reduce`. Grid: (tiles, nkv, splits); block: 128 threads.
#define ATT_BK 32
#define ATT_WARPS 4
#define ATT_MAX_ROWS 32
#define ATT_MAX_HD 128
extern "C" __global__ void __launch_bounds__(128) attention(
    const float* __restrict__ q, const bf16_t* __restrict__ k_cache, const bf16_t* __restrict__ v_cache,
    const int* __restrict__ tiles, const int* __restrict__ block_tables, bf16_t* __restrict__ out,
    float* __restrict__ part_acc, float* __restrict__ part_ml, int num_tokens, int nh, int nkv, int hd,
    int block_size, float scale) {
  __shared__ float ks[ATT_BK][ATT_MAX_HD + 1];
  __shared__ bf16_t vs[ATT_BK][ATT_MAX_HD];
  __shared__ float qs[ATT_MAX_ROWS][ATT_MAX_HD];
  const int* tile = tiles + blockIdx.x * 5;
  int row0 = tile[0], ntok = tile[1], pos0 = tile[2];
  const int* bt = block_tables + tile[3];
  if (ntok == 0) return;
  int kvh = blockIdx.y, group = nh / nkv;
  int nrows = ntok * group;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int ctx = pos0 + ntok;  // positions attended by the tile's last token
  int splits = gridDim.z;
  int chunk = ((ctx + splits - 1) / splits + ATT_BK - 1) / ATT_BK * ATT_BK;
  int c0 = blockIdx.z * chunk, c1 = min(ctx, c0 + chunk);
  // Rows: r = token * group + g, query head kvh * group + g.
  for (int e = threadIdx.x; e < nrows * hd; e += blockDim.x) {
    int r = e / hd, d = e % hd;
    int tok = row0 + r / group, h = kvh * group + r % group;
    qs[r][d] = q[((size_t)tok * nh + h) * hd + d] * scale;
  }
  const int per_lane = ATT_MAX_HD / 32;
  float m[ATT_MAX_ROWS / ATT_WARPS], l[ATT_MAX_ROWS / ATT_WARPS];
  float acc[ATT_MAX_ROWS / ATT_WARPS][per_lane];
#pragma unroll
  for (int j = 0; j < ATT_MAX_ROWS / ATT_WARPS; j++) {
    m[j] = -INFINITY;
    l[j] = 0.f;
#pragma unroll
    for (int d = 0; d < per_lane; d++) acc[j][d] = 0.f;
  }
  for (int kt = c0; kt < c1; kt += ATT_BK) {
    __syncthreads();
    for (int e = threadIdx.x; e < ATT_BK * hd; e += blockDim.x) {
      int j = e / hd, d = e % hd, p = kt + j;
      float kv = 0.f;
      bf16_t vv = 0;
      if (p < c1) {
        size_t slot = (size_t)bt[p / block_size] * block_size + p % block_size;
        size_t off = (slot * nkv + kvh) * hd + d;
        kv = bf2f(k_cache[off]);
        vv = v_cache[off];
      }
      ks[j][d] = kv;
      vs[j][d] = vv;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < ATT_MAX_ROWS / ATT_WARPS; j++) {
      int r = warp + j * ATT_WARPS;
      if (r >= nrows) break;
      int qpos = pos0 + r / group;
      int p = kt + lane;
      bool valid = p < c1 && p <= qpos;
      float s = 0.f;
      for (int d = 0; d < hd; d++) s += qs[r][d] * ks[lane][d];
      s = valid ? s : -INFINITY;
      float mt = warp_max(s);
      if (mt == -INFINITY) continue;  // nothing visible to this row in the tile
      float mn = fmaxf(m[j], mt);
      float pr = valid ? __expf(s - mn) : 0.f;
      float corr = __expf(m[j] - mn);
      l[j] = l[j] * corr + warp_sum(pr);
      m[j] = mn;
#pragma unroll
      for (int d = 0; d < per_lane; d++) acc[j][d] *= corr;
      for (int jj = 0; jj < ATT_BK; jj++) {
        float pj = __shfl_sync(0xffffffffu, pr, jj);
#pragma unroll
        for (int d = 0; d < per_lane; d++) {
          int dd = lane + 32 * d;
          if (dd < hd) acc[j][d] += pj * bf2f(vs[jj][dd]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < ATT_MAX_ROWS / ATT_WARPS; j++) {
    int r = warp + j * ATT_WARPS;
    if (r >= nrows) break;
    int tok = row0 + r / group, h = kvh * group + r % group;
    if (splits == 1) {
      float inv = l[j] > 0.f ? 1.f / l[j] : 0.f;
      for (int d = 0; d < per_lane; d++) {
        int dd = lane + 32 * d;
        if (dd < hd) out[((size_t)tok * nh + h) * hd + dd] = f2bf(acc[j][d] * inv);
      }
    } else {
      size_t base = ((size_t)blockIdx.z * num_tokens + tok) * nh + h;
      for (int d = 0; d < per_lane; d++) {
        int dd = lane + 32 * d;
        if (dd < hd) part_acc[base * hd + dd] = acc[j][d];
      }
      if (lane == 0) {
        part_ml[base * 2] = m[j];
        part_ml[base * 2 + 1] = l[j];
      }
    }
  }
}

// Combines the splits of `attention`: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
// Grid: (T, nh); block: hd threads. Rows of tokens no tile covered are left alone.
extern "C" __global__ void attention_reduce(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                            const int* __restrict__ row_valid, bf16_t* __restrict__ out,
                                            int num_tokens, int nh, int hd, int splits) {
  int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  if (!row_valid[t]) return;
  float mx = -INFINITY;
  for (int s = 0; s < splits; s++) mx = fmaxf(mx, part_ml[(((size_t)s * num_tokens + t) * nh + h) * 2]);
  float num = 0.f, den = 0.f;
  for (int s = 0; s < splits; s++) {
    size_t base = ((size_t)s * num_tokens + t) * nh + h;
    float ms = part_ml[base * 2];
    if (ms == -INFINITY) continue;
    float w = __expf(ms - mx);
    num += w * part_acc[base * hd + d];
    den += w * part_ml[base * 2 + 1];
  }
  out[((size_t)t * nh + h) * hd + d] = f2bf(den > 0.f ? num / den : 0.f);
}

// out[t, i] = silu(gu[t, i]) * gu[t, F + i] for the fused gate|up projection (bf16).
extern "C" __global__ void silu_mul(const bf16_t* __restrict__ gu, bf16_t* __restrict__ out, int F, long long n) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += stride) {
    long long t = e / F, i = e % F;
    float g = bf2f(gu[t * 2 * F + i]), u = bf2f(gu[t * 2 * F + F + i]);
    out[e] = f2bf(g / (1.f + __expf(-g)) * u);
  }
}

__device__ __forceinline__ unsigned int hash32(unsigned int x) {
  x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16; return x;
}

// Pseudo-random bf16 uniform in [-scale, scale) (dummy weights), or the constant `scale` when
// `constant` is set (norm weights).
extern "C" __global__ void fill_random(bf16_t* __restrict__ p, unsigned long long n, unsigned int seed, float scale, int constant) {
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += stride) {
    if (constant) { p[i] = f2bf(scale); continue; }
    unsigned int h = hash32(hash32((unsigned int)i ^ seed) ^ (unsigned int)(i >> 32) * 0x9e3779b9u);
    p[i] = f2bf(((float)(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
  }
}

// Greedy sampling: the index of each row's largest logit (lowest index on ties). Grid: rows.
extern "C" __global__ void argmax_rows(const float* __restrict__ logits, int* __restrict__ out, int vocab) {
  const float* row = logits + (size_t)blockIdx.x * vocab;
  float best = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = row[i];
    if (v > best || (v == best && i < bi)) { best = v; bi = i; }
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, best, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
  }
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  if (lane == 0) { sv[wid] = best; si[wid] = bi; }
  __syncthreads();
  if (wid == 0) {
    int nw = (blockDim.x + 31) >> 5;
    best = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, best, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    if (lane == 0) out[blockIdx.x] = bi;
  }
}
