// Tandem's CUDA kernels, compiled at run time with NVRTC for the device's architecture.
// Header-free: 16-bit floats travel as `unsigned short` with explicit conversions, so no CUDA
// toolkit headers are needed on the machine that runs them. The model's 16-bit type is bf16, or
// IEEE half when compiled with -DTANDEM_F16.

typedef unsigned short h16;
#define INFINITY __int_as_float(0x7f800000)

// IEEE half, whatever the model's type (the GEMM attention path computes in it).
__device__ __forceinline__ float f16tof(h16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ h16 to_f16(float f) { h16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

#ifdef TANDEM_F16
__device__ __forceinline__ float h2f(h16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ h16 f2h(float f) { h16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#else
__device__ __forceinline__ float h2f(h16 h) { return __uint_as_float(((unsigned int)h) << 16); }

// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ h16 f2h(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (h16)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (h16)(u >> 16);
}
#endif

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the whole block (blockDim.x a multiple of 32, at most 1024); every thread
// gets it.
template <bool MAX>
__device__ float block_reduce(float v) {
  __shared__ float red[32];
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  v = MAX ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (lane == 0) red[wid] = v;
  __syncthreads();
  int nw = (blockDim.x + 31) >> 5;
  v = lane < nw ? red[lane] : (MAX ? -INFINITY : 0.f);
  return MAX ? warp_max(v) : warp_sum(v);
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

// Where K (or V) of cache slot `slot`, KV head `kvh` starts: blocks hold [kvh][offset][hd], so
// one head's keys of a block are one contiguous run of block_size · hd values.
__device__ __forceinline__ size_t kv_index(size_t slot, int kvh, int nkv, int hd, int block_size) {
  size_t b = slot / block_size, off = slot % block_size;
  return ((b * nkv + kvh) * block_size + off) * hd;
}

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

// Paged attention over a flattened batch, for prefill chunks and decode steps alike.
//
// Work is split into query tiles: each tile is up to `rows / group` consecutive tokens of one
// sequence, described by five ints: first batch row, number of tokens, position of the first
// token, offset of the sequence's block table in `block_tables`, and which split of the context
// it is (`split << 8 | splits`, 0 for the whole context: `tile_range`); the host lists a tile
// once per split. A CTA takes one tile entry and one KV head (the `group` query heads sharing
// it); keys and values
// are staged in shared memory 32 positions at a time, each warp owns some (token, head) rows and
// keeps an online softmax (flash-attention style), lane j scoring position j of the tile.
//
// With one split the result is written to `out` (16-bit, [T, nh * hd]); with several, each split
// writes its unnormalised accumulator and (max, sum) to `part_acc`/`part_ml`, and the CTA that
// finishes a tile's last split combines them (`merge_splits`). Grid: (nkv, tile entries), so the
// CTAs of a tile's KV heads start together and entries start in the order the host lists them
// (longest context first); block: 128 threads.
#define ATT_BK 32
#define ATT_WARPS 4
#define ATT_MAX_ROWS 16
#define ATT_MAX_HD 128
#define ATT_LOADS (ATT_BK * ATT_MAX_HD / 8 / 128)

// The positions [c0, c1) a tile entry attends (the plan tests' `split_range` mirrors it), its split and
// how many its context was cut into.
__device__ __forceinline__ void tile_range(const int* tile, int ctx, int& c0, int& c1, int& split, int& splits) {
  splits = max(tile[4] & 255, 1);
  split = tile[4] >> 8;
  int chunk = ((ctx + splits - 1) / splits + ATT_BK - 1) / ATT_BK * ATT_BK;
  c0 = min(ctx, split * chunk);
  c1 = min(ctx, c0 + chunk);
}

// This thread's share of the keys and values at positions kt..kt+ATT_BK (zeros past c1).
__device__ __forceinline__ void att_load(uint4 (&kr)[ATT_LOADS], uint4 (&vr)[ATT_LOADS], const h16* __restrict__ k_cache,
                                         const h16* __restrict__ v_cache, const int* __restrict__ bt, int kt, int c1,
                                         int vec, int nkv, int kvh, int hd, int block_size) {
  // vec (hd / 8) is 8 or 16 for the usual head widths: shifts instead of divisions there.
  const bool pow2 = (vec & (vec - 1)) == 0;
  const int vshift = __ffs(vec) - 1;
#pragma unroll
  for (int i = 0; i < ATT_LOADS; i++) {
    int e = threadIdx.x + i * 128;
    kr[i] = make_uint4(0, 0, 0, 0);
    vr[i] = make_uint4(0, 0, 0, 0);
    if (e >= ATT_BK * vec) continue;
    int j = pow2 ? e >> vshift : e / vec;
    int c = e - j * vec, p = kt + j;
    if (p < c1) {
      int blk = bt[p / block_size], off = p - (p / block_size) * block_size;
      size_t at = ((size_t)(blk * nkv + kvh) * block_size + off) * hd + c * 8;
      kr[i] = *reinterpret_cast<const uint4*>(k_cache + at);
      vr[i] = *reinterpret_cast<const uint4*>(v_cache + at);
    }
  }
}

// Most splits of one context (the host's MAX_SPLITS).
#define ATT_MAX_SPLITS 16

// After a split's CTA has written its partial results (every thread calls this): the CTA that
// finishes a tile's last split combines them all into `out`, out = sum_s e^(m_s - M) acc_s /
// sum_s e^(m_s - M) l_s, and re-arms the tile's counter (`count`: one per tile and KV head,
// zero between launches). No reduction kernel follows the attention launch. The splits'
// (max, sum) pairs are read once into shared memory and turned into one weight per row and
// split, then each thread sums 4 output dims at a time over the splits.
__device__ void merge_splits(int* count, int splits, const float* part_acc, const float* part_ml, h16* out,
                             int row0, int nrows, int group, int kvh, int num_tokens, int nh, int hd) {
  __shared__ int last;
  __shared__ float wgt[ATT_MAX_ROWS][ATT_MAX_SPLITS];
  __shared__ float lsum[ATT_MAX_ROWS][ATT_MAX_SPLITS];
  // The CTA's writes, ordered by the barrier, then released at GPU scope by the thread that
  // counts (as CUTLASS's semaphore does).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(count, 1) == splits - 1;
    if (last) *count = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int e = threadIdx.x; e < nrows * splits; e += blockDim.x) {
    int r = e / splits, sp = e - r * splits;
    int tok = row0 + r / group, h = kvh * group + r % group;
    float2 ml = __ldcg(reinterpret_cast<const float2*>(part_ml) + ((size_t)sp * num_tokens + tok) * nh + h);
    wgt[r][sp] = ml.x;
    lsum[r][sp] = ml.y;
  }
  __syncthreads();
  for (int r = threadIdx.x; r < nrows; r += blockDim.x) {
    float mx = -INFINITY, den = 0.f;
    for (int sp = 0; sp < splits; sp++) mx = fmaxf(mx, wgt[r][sp]);
    for (int sp = 0; sp < splits; sp++) {
      float w = wgt[r][sp] == -INFINITY ? 0.f : __expf(wgt[r][sp] - mx);
      wgt[r][sp] = w;
      den += w * lsum[r][sp];
    }
    float inv = den > 0.f ? 1.f / den : 0.f;
    for (int sp = 0; sp < splits; sp++) wgt[r][sp] *= inv;
  }
  __syncthreads();
  const int vec = hd / 4;
  for (int e = threadIdx.x; e < nrows * vec; e += blockDim.x) {
    int r = e / vec, d = (e - r * vec) * 4;
    int tok = row0 + r / group, h = kvh * group + r % group;
    // Every split wrote its rows (zeros where it saw nothing), so the loads need no test and
    // four of them go out together.
    const float4* src = reinterpret_cast<const float4*>(part_acc + ((size_t)tok * nh + h) * hd + d);
    const size_t next = (size_t)num_tokens * nh * hd / 4;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int sp = 0; sp < splits; sp++) {
      float w = wgt[r][sp];
      float4 v = __ldcg(src + sp * next);
      a.x += w * v.x; a.y += w * v.y; a.z += w * v.z; a.w += w * v.w;
    }
    h16* dst = out + ((size_t)tok * nh + h) * hd + d;
    dst[0] = f2h(a.x); dst[1] = f2h(a.y); dst[2] = f2h(a.z); dst[3] = f2h(a.w);
  }
}

// RPW: rows per warp (the CTA holds 4 × RPW query rows). Keys and values sit in shared memory
// as f32 so both products read 16 bytes at a time: lane j scores position j of the tile against
// the row's query (K rows padded to 132 floats: conflict-free), then lane j accumulates output
// dims 4j..4j+3 (all lanes for hd = 128, half of them for hd = 64).
#define ATT_KS (ATT_MAX_HD + 4)
// The parameters every paged-attention kernel takes.
#define ATTENTION_ARGS                                                                                      \
  const float* __restrict__ q, const h16* __restrict__ k_cache, const h16* __restrict__ v_cache,            \
      const int* __restrict__ tiles, const int* __restrict__ block_tables, h16* __restrict__ out,           \
      float* __restrict__ part_acc, float* __restrict__ part_ml, int* __restrict__ split_count,             \
      int num_tokens, int nh, int nkv, int hd,                                                              \
      int block_size, float scale, int window
template <int RPW>
__device__ __forceinline__ void attention_impl(ATTENTION_ARGS) {
  __shared__ __align__(16) float ks[ATT_BK][ATT_KS];
  __shared__ __align__(16) float vs[ATT_BK][ATT_MAX_HD];
  __shared__ __align__(16) float qs[RPW * ATT_WARPS][ATT_MAX_HD];
  const int* tile = tiles + blockIdx.y * 5;
  int row0 = tile[0], ntok = tile[1], pos0 = tile[2];
  const int* bt = block_tables + tile[3];
  if (ntok == 0) return;
  int kvh = blockIdx.x, group = nh / nkv;
  int nrows = ntok * group;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int ctx = pos0 + ntok;  // positions attended by the tile's last token
  int c0, c1, split, splits;
  tile_range(tile, ctx, c0, c1, split, splits);
  // Rows: r = token * group + g, query head kvh * group + g.
  for (int e = threadIdx.x; e < nrows * hd; e += blockDim.x) {
    int r = e / hd, d = e % hd;
    int tok = row0 + r / group, h = kvh * group + r % group;
    qs[r][d] = q[((size_t)tok * nh + h) * hd + d] * scale;
  }
  const bool owns = lane * 4 < hd;  // this lane holds output dims 4·lane..4·lane+3
  float m[RPW], l[RPW];
  float4 acc[RPW];
#pragma unroll
  for (int j = 0; j < RPW; j++) {
    m[j] = -INFINITY;
    l[j] = 0.f;
    acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // Keys and values travel in 16-byte pieces (8 values; hd is a multiple of 8), the next tile's
  // loaded into registers while the current one is computed on.
  const int vec = hd / 8;
  const bool pow2 = (vec & (vec - 1)) == 0;
  const int vshift = __ffs(vec) - 1;
  uint4 kr[ATT_LOADS], vr[ATT_LOADS];
  att_load(kr, vr, k_cache, v_cache, bt, c0, c1, vec, nkv, kvh, hd, block_size);
  for (int kt = c0; kt < c1; kt += ATT_BK) {
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ATT_LOADS; i++) {
      int e = threadIdx.x + i * 128;
      if (e >= ATT_BK * vec) break;
      int j = pow2 ? e >> vshift : e / vec;
      int c = e - j * vec;
      const h16* kh = reinterpret_cast<const h16*>(&kr[i]);
      const h16* vh = reinterpret_cast<const h16*>(&vr[i]);
      float4* kd = reinterpret_cast<float4*>(&ks[j][c * 8]);
      float4* vd = reinterpret_cast<float4*>(&vs[j][c * 8]);
      kd[0] = make_float4(h2f(kh[0]), h2f(kh[1]), h2f(kh[2]), h2f(kh[3]));
      kd[1] = make_float4(h2f(kh[4]), h2f(kh[5]), h2f(kh[6]), h2f(kh[7]));
      vd[0] = make_float4(h2f(vh[0]), h2f(vh[1]), h2f(vh[2]), h2f(vh[3]));
      vd[1] = make_float4(h2f(vh[4]), h2f(vh[5]), h2f(vh[6]), h2f(vh[7]));
    }
    __syncthreads();
    if (kt + ATT_BK < c1) att_load(kr, vr, k_cache, v_cache, bt, kt + ATT_BK, c1, vec, nkv, kvh, hd, block_size);
#pragma unroll
    for (int j = 0; j < RPW; j++) {
      int r = warp + j * ATT_WARPS;
      if (r >= nrows) break;
      int qpos = pos0 + r / group;
      int p = kt + lane;
      bool valid = p < c1 && p <= qpos && p > qpos - window;
      float s = 0.f;
      const float4* qr = reinterpret_cast<const float4*>(qs[r]);
      const float4* kk = reinterpret_cast<const float4*>(ks[lane]);
      for (int d = 0; d < hd / 4; d++) {
        float4 a = qr[d], b = kk[d];
        s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      }
      s = valid ? s : -INFINITY;
      float mt = warp_max(s);
      if (mt == -INFINITY) continue;  // nothing visible to this row in the tile
      float mn = fmaxf(m[j], mt);
      float pr = valid ? __expf(s - mn) : 0.f;
      float corr = __expf(m[j] - mn);
      l[j] = l[j] * corr + warp_sum(pr);
      m[j] = mn;
      float4 a = acc[j];
      a.x *= corr; a.y *= corr; a.z *= corr; a.w *= corr;
#pragma unroll 8
      for (int jj = 0; jj < ATT_BK; jj++) {
        float pj = __shfl_sync(0xffffffffu, pr, jj);
        if (owns) {
          float4 v = reinterpret_cast<const float4*>(vs[jj])[lane];
          a.x += pj * v.x; a.y += pj * v.y; a.z += pj * v.z; a.w += pj * v.w;
        }
      }
      acc[j] = a;
    }
  }
#pragma unroll
  for (int j = 0; j < RPW; j++) {
    int r = warp + j * ATT_WARPS;
    if (r >= nrows) break;
    if (!owns) continue;
    int tok = row0 + r / group, h = kvh * group + r % group;
    float o[4] = {acc[j].x, acc[j].y, acc[j].z, acc[j].w};
    if (splits == 1) {
      float inv = l[j] > 0.f ? 1.f / l[j] : 0.f;
      h16* dst = out + ((size_t)tok * nh + h) * hd + lane * 4;
#pragma unroll
      for (int d = 0; d < 4; d++) dst[d] = f2h(o[d] * inv);
    } else {
      size_t base = ((size_t)split * num_tokens + tok) * nh + h;
      *reinterpret_cast<float4*>(part_acc + base * hd + lane * 4) = acc[j];
      if (lane == 0) {
        part_ml[base * 2] = m[j];
        part_ml[base * 2 + 1] = l[j];
      }
    }
  }
  if (splits > 1)
    merge_splits(split_count + row0 * nkv + kvh, splits, part_acc, part_ml, out, row0, nrows, group, kvh, num_tokens, nh, hd);
}

extern "C" __global__ void __launch_bounds__(128) attention(ATTENTION_ARGS) {
  attention_impl<ATT_MAX_ROWS / ATT_WARPS>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
}

// The same for tiles of at most 8 rows (decode steps): fewer registers and less shared memory,
// so more CTAs per SM keep more loads in flight.
extern "C" __global__ void __launch_bounds__(128) attention_decode(ATTENTION_ARGS) {
  attention_impl<2>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
}

// Tensor-core paged attention (mma.sync m16n8k16, 16-bit in, f32 accumulate) for head widths 64
// and 128 and blocks of a multiple of 16 positions: the same tiles, grid and split outputs as
// `attention`, with 2 warps per CTA. A tile's rows (at most 16: tokens × the group's query heads)
// are the mma's M; each warp walks every other 16-position page of the split, its K and V copied
// to shared memory by cp.async MMA_STAGES - 1 of its pages ahead of use, S = Q·Kᵀ and O += P·V on tensor cores,
// the online softmax on the accumulator fragments. Q and, for bf16, P enter the products as a
// 16-bit high part plus a 16-bit remainder, so neither is rounded to the model's type.
#define MMA_WARPS 2
#define MMA_PAGE 16
// Pages each warp of the decode kernel keeps in shared memory: the one it works on and
// MMA_STAGES - 1 being copied ahead.
#ifndef MMA_STAGES
#define MMA_STAGES 2
#endif
#ifdef TANDEM_F16
#define MMA_TYPE "f16"
#define MMA_SPLIT_P false
#else
#define MMA_TYPE "bf16"
#define MMA_SPLIT_P true
#endif
// The prefill kernel rounds Q and P to the model's type once, as flash attention does: its
// products on tensor cores are compute-bound where the decode kernels' are not, and without the
// remainders' registers three CTAs fit on an SM (on an H100 the Llama-3-8B 4 x 2048 prefill's
// attention took 38 ms against 57 ms with both split; the check's worst error at width 128
// went from 2.0e-3 to 3.2e-3 of its 5.1e-3). TANDEM_PF_SPLIT_P and TANDEM_PF_SPLIT_Q keep the
// remainders, for comparison.
#if defined(TANDEM_PF_SPLIT_P) && !defined(TANDEM_F16)
#define PF_SPLIT_P true
#else
#define PF_SPLIT_P false
#endif
#ifdef TANDEM_PF_SPLIT_Q
#define PF_SPLIT_Q true
#else
#define PF_SPLIT_Q false
#endif

#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

__device__ __forceinline__ void mma16816(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ unsigned pack2(h16 lo, h16 hi) { return (unsigned)lo | ((unsigned)hi << 16); }

// x (low half) and y (high half) rounded to the model's 16-bit type in one conversion
// instruction (round to nearest even, as f2h).
__device__ __forceinline__ unsigned cvt2(float x, float y) {
  unsigned r;
#ifdef TANDEM_F16
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
#else
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
#endif
  return r;
}

// x as a 16-bit pair (high part, remainder) packed with its neighbour y.
__device__ __forceinline__ void split2(float x, float y, unsigned& hi, unsigned& lo) {
  hi = cvt2(x, y);
  lo = cvt2(x - h2f((h16)(hi & 0xffffu)), y - h2f((h16)(hi >> 16)));
}

// A warp's Q fragments (rows g and g + 8 of its 16, columns 2t.. and 2t + 8.. of each k-step),
// scaled, as 16-bit high parts and remainders: rows[ri] of the tile's nrows, row r being query
// head r % group of token row0 + r / group.
template <int KS>
__device__ __forceinline__ void load_q_frags(unsigned (&qh)[KS][4], unsigned (&ql)[KS][4], const float* __restrict__ q,
                                             const int (&rows)[2], int nrows, int row0, int group, int nh, int kvh,
                                             int hd, float scale, int t) {
#pragma unroll
  for (int s = 0; s < KS; s++) {
#pragma unroll
    for (int half = 0; half < 2; half++) {    // columns 2t.. (regs 0, 1) and 2t + 8.. (regs 2, 3)
#pragma unroll
      for (int ri = 0; ri < 2; ri++) {
        int r = rows[ri], d = s * 16 + half * 8 + 2 * t;
        float x = 0.f, y = 0.f;
        if (r < nrows) {
          const float* src = q + ((size_t)(row0 + r / group) * nh + kvh * group + r % group) * hd + d;
          x = src[0] * scale;
          y = src[1] * scale;
        }
        split2(x, y, qh[s][half * 2 + ri], ql[s][half * 2 + ri]);
      }
    }
  }
}

// The online softmax of one block of scores: NJ n-tiles of 8 positions from p0, row ri's in
// sc[j][2ri], sc[j][2ri + 1] (positions 8j + 2t, +1). Positions row ri cannot see (past c1 or
// qpos[ri], or before its window) are masked unless `inside` says none is; m and l (running
// maximum and sum) are updated, sc left holding the weights e^(s - m) (2^(s - m) with BASE2)
// and corr the factor the output accumulators must be scaled by.
template <int NJ, bool BASE2>
__device__ __forceinline__ void online_softmax(float (&sc)[NJ][4], int p0, int c1, const int (&qpos)[2], int window,
                                               bool inside, int t, float (&m)[2], float (&l)[2], float (&corr)[2]) {
#pragma unroll
  for (int ri = 0; ri < 2; ri++) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        int p = p0 + 8 * j + 2 * t + e;
        bool valid = inside || (p < c1 && p <= qpos[ri] && p > qpos[ri] - window);
        float& v = sc[j][2 * ri + e];
        v = valid ? v : -INFINITY;
        mx = fmaxf(mx, v);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    float mn = fmaxf(m[ri], mx);
    corr[ri] = mn == -INFINITY ? 1.f : (BASE2 ? exp2f(m[ri] - mn) : __expf(m[ri] - mn));
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        float& v = sc[j][2 * ri + e];
        v = v == -INFINITY ? 0.f : (BASE2 ? exp2f(v - mn) : __expf(v - mn));
        sum += v;
      }
    }
    l[ri] = l[ri] * corr[ri] + sum;
    m[ri] = mn;
  }
}

// Scores of n-tiles 2h and 2h + 1 as the A operand of a k-step of 16 positions (rows g, g + 8),
// as high parts and remainders.
template <int NJ>
__device__ __forceinline__ void p_frags(const float (&sc)[NJ][4], int h, unsigned (&ph)[4], unsigned (&pl)[4]) {
  split2(sc[2 * h][0], sc[2 * h][1], ph[0], pl[0]);
  split2(sc[2 * h][2], sc[2 * h][3], ph[1], pl[1]);
  split2(sc[2 * h + 1][0], sc[2 * h + 1][1], ph[2], pl[2]);
  split2(sc[2 * h + 1][2], sc[2 * h + 1][3], ph[3], pl[3]);
}

// O's n-tiles n and n + 1 += P·V over one k-step of 16 positions: b holds V's fragments for the
// two n-tiles, P enters as high parts and, with SPLIT, remainders.
template <bool SPLIT>
__device__ __forceinline__ void pv_mma(float (&o0)[4], float (&o1)[4], const unsigned (&ph)[4], const unsigned (&pl)[4],
                                       const unsigned (&b)[4]) {
  mma16816(o0, ph[0], ph[1], ph[2], ph[3], b[0], b[1]);
  mma16816(o1, ph[0], ph[1], ph[2], ph[3], b[2], b[3]);
  if (SPLIT) {
    mma16816(o0, pl[0], pl[1], pl[2], pl[3], b[0], b[1]);
    mma16816(o1, pl[0], pl[1], pl[2], pl[3], b[2], b[3]);
  }
}

template <int HD>
__device__ __forceinline__ void attention_mma_impl(ATTENTION_ARGS) {
  constexpr int LD = HD + 8;           // padded shared row (16-bit elements): conflict-free ldmatrix
  constexpr int PAGE = MMA_PAGE * LD;  // one page of K or V
  constexpr int KS = HD / 16;          // k-steps of Q·Kᵀ
  constexpr int NT = HD / 8;           // n-tiles of the output
  constexpr int CHUNKS = MMA_PAGE * HD / 8 / 32;  // 16-byte copies per lane per page of K (or V)
  // Dynamic shared memory (`plan::decode_smem_bytes`): beyond 48 KiB with three stages.
  extern __shared__ __align__(16) unsigned char mma_smem[];
  auto stage = reinterpret_cast<h16 (*)[MMA_STAGES][2][PAGE]>(mma_smem);
  const int* tile = tiles + blockIdx.y * 5;
  const int row0 = tile[0], ntok = tile[1], pos0 = tile[2];
  const int* bt = block_tables + tile[3];
  if (ntok == 0) return;
  const int kvh = blockIdx.x, group = nh / nkv, nrows = ntok * group;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ctx = pos0 + ntok;
  int c0, c1, split, splits;
  tile_range(tile, ctx, c0, c1, split, splits);
  // Q fragments (rows g and g + 8), scaled, as high parts and remainders.
  unsigned qh[KS][4], ql[KS][4];
  const int rows[2] = {g, g + 8};
  load_q_frags<KS>(qh, ql, q, rows, nrows, row0, group, nh, kvh, hd, scale, t);
  int qpos[2];
#pragma unroll
  for (int ri = 0; ri < 2; ri++) qpos[ri] = rows[ri] < nrows ? pos0 + rows[ri] / group : -1;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  const int npages = (c1 - c0 + MMA_PAGE - 1) / MMA_PAGE;
  // Copies page i of the split (K and V of this KV head) into buffer b with cp.async.
  auto issue = [&](int i, int b) {
    int p0 = c0 + i * MMA_PAGE;
    int blk = bt[p0 / block_size], off = p0 % block_size;
    size_t base = ((size_t)(blk * nkv + kvh) * block_size + off) * hd;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
      int e = lane + c * 32, r = e / (HD / 8), col = (e % (HD / 8)) * 8;
      unsigned ks = smem_addr(&stage[warp][b][0][r * LD + col]), vs = smem_addr(&stage[warp][b][1][r * LD + col]);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ks), "l"(k_cache + base + r * HD + col));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(vs), "l"(v_cache + base + r * HD + col));
    }
    asm volatile("cp.async.commit_group;");
  };
  // The warp's pages are warp, warp + MMA_WARPS, ...: its j-th goes to buffer j % MMA_STAGES,
  // copied MMA_STAGES - 1 pages ahead of use (one commit group per page; an empty group where
  // no page is left keeps the count of groups in flight fixed).
  int buf = 0;
#pragma unroll
  for (int j = 0; j < MMA_STAGES - 1; j++) {
    if (warp + j * MMA_WARPS < npages) issue(warp + j * MMA_WARPS, j);
    else asm volatile("cp.async.commit_group;");
  }
  for (int i = warp; i < npages; i += MMA_WARPS) {
    const int ahead = i + (MMA_STAGES - 1) * MMA_WARPS;
    if (ahead < npages) issue(ahead, (buf + MMA_STAGES - 1) % MMA_STAGES);
    else asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group %0;" ::"n"(MMA_STAGES - 1));
    __syncwarp();
    const h16* ks = stage[warp][buf][0];
    const h16* vs = stage[warp][buf][1];
    // S = Q·Kᵀ over the page's 16 positions: two n-tiles of 8.
    float sc[2][4];
#pragma unroll
    for (int j = 0; j < 2; j++) {
      sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
      for (int s = 0; s < KS; s += 2) {
        // Matrices: keys 8j..8j+7 × dims 16s + {0, 8, 16, 24}.
        unsigned b[4];
        ldsm_x4(b, smem_addr(ks + (8 * j + (lane & 7)) * LD + s * 16 + (lane >> 3) * 8));
        mma16816(sc[j], qh[s][0], qh[s][1], qh[s][2], qh[s][3], b[0], b[1]);
        mma16816(sc[j], ql[s][0], ql[s][1], ql[s][2], ql[s][3], b[0], b[1]);
        mma16816(sc[j], qh[s + 1][0], qh[s + 1][1], qh[s + 1][2], qh[s + 1][3], b[2], b[3]);
        mma16816(sc[j], ql[s + 1][0], ql[s + 1][1], ql[s + 1][2], ql[s + 1][3], b[2], b[3]);
      }
    }
    // Online softmax: row ri's scores sit in sc[j][2ri], sc[j][2ri + 1] (positions 8j + 2t, +1).
    const int p0 = c0 + i * MMA_PAGE;
    float corr[2];
    online_softmax<2, false>(sc, p0, c1, qpos, window, false, t, m, l, corr);
#pragma unroll
    for (int n = 0; n < NT; n++) {
      o[n][0] *= corr[0]; o[n][1] *= corr[0];
      o[n][2] *= corr[1]; o[n][3] *= corr[1];
    }
    // P as the A operand (rows g, g + 8; positions 2t.. and 8 + 2t..).
    unsigned ph[4], pl[4];
    p_frags<2>(sc, 0, ph, pl);
    // O += P·V: V's matrices transposed by ldmatrix, two n-tiles (16 dims) per load.
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      unsigned b[4];
      ldsm_x4_t(b, smem_addr(vs + ((lane >> 3) & 1) * 8 * LD + (lane & 7) * LD + n * 8 + (lane >> 4) * 8));
      pv_mma<MMA_SPLIT_P>(o[n], o[n + 1], ph, pl, b);
    }
    __syncwarp();
    buf = (buf + 1) % MMA_STAGES;
  }
  // Row sums: each lane holds a quarter of its rows' positions.
#pragma unroll
  for (int ri = 0; ri < 2; ri++) {
    l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 1);
    l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 2);
  }
  // Warp 1 hands its state to warp 0 through shared memory (the staging buffers are free now).
  __syncthreads();
  float* xo = reinterpret_cast<float*>(&stage[0][0][0][0]);  // [16][HD]
  float* xml = xo + 16 * HD;                                  // [16][2]
  if (warp == 1) {
#pragma unroll
    for (int ri = 0; ri < 2; ri++) {
      int r = rows[ri];
#pragma unroll
      for (int n = 0; n < NT; n++) {
        xo[r * HD + n * 8 + 2 * t] = o[n][2 * ri];
        xo[r * HD + n * 8 + 2 * t + 1] = o[n][2 * ri + 1];
      }
      if (t == 0) {
        xml[r * 2] = m[ri];
        xml[r * 2 + 1] = l[ri];
      }
    }
  }
  __syncthreads();
  // Warp 0 writes the tile's rows (or this split's partial results); with several splits
  // every thread then takes part in `merge_splits`.
#pragma unroll
  for (int ri = 0; ri < 2; ri++) {
    int r = rows[ri];
    if (warp != 0 || r >= nrows) continue;
    float m1 = xml[r * 2], l1 = xml[r * 2 + 1];
    float mm = fmaxf(m[ri], m1);
    float a0 = mm == -INFINITY ? 0.f : __expf(m[ri] - mm), a1 = mm == -INFINITY ? 0.f : __expf(m1 - mm);
    float lt = l[ri] * a0 + l1 * a1;
    int tok = row0 + r / group, h = kvh * group + r % group;
    if (splits == 1) {
      float inv = lt > 0.f ? 1.f / lt : 0.f;
      h16* dst = out + ((size_t)tok * nh + h) * hd;
#pragma unroll
      for (int n = 0; n < NT; n++) {
        int d = n * 8 + 2 * t;
        dst[d] = f2h((o[n][2 * ri] * a0 + xo[r * HD + d] * a1) * inv);
        dst[d + 1] = f2h((o[n][2 * ri + 1] * a0 + xo[r * HD + d + 1] * a1) * inv);
      }
    } else {
      size_t base = ((size_t)split * num_tokens + tok) * nh + h;
#pragma unroll
      for (int n = 0; n < NT; n++) {
        int d = n * 8 + 2 * t;
        part_acc[base * hd + d] = o[n][2 * ri] * a0 + xo[r * HD + d] * a1;
        part_acc[base * hd + d + 1] = o[n][2 * ri + 1] * a0 + xo[r * HD + d + 1] * a1;
      }
      if (t == 0) {
        part_ml[base * 2] = mm;
        part_ml[base * 2 + 1] = lt;
      }
    }
  }
  if (splits > 1)
    merge_splits(split_count + row0 * nkv + kvh, splits, part_acc, part_ml, out, row0, nrows, group, kvh, num_tokens, nh, hd);
}


// Flash-attention prefill on tensor cores, for long chunks (prefill, prefix-cache hits): the
// tiles (grid (nkv, tiles), as `attention`) are up to PF_ROWS rows (tokens × the group's query
// heads), each of PF_WARPS warps owns 16 of them, and all warps walk the same stages of PF_STAGE
// positions, which the CTA's threads copy into shared memory by cp.async one stage ahead of use.
// A stage's keys and values serve every row of the tile, not 16, and no score leaves registers.
// The arithmetic is `attention_mma_impl`'s with Q and P rounded once (PF_SPLIT_Q, PF_SPLIT_P);
// the even and odd k-steps' products of S go to accumulators of their own, so that eight
// independent chains of mma keep the tensor cores busy. PF_WARPS (the host passes it: 4) and
// PF_MIN_BLOCKS_64/_128 (4, 3) set the CTA's size and how many share an SM: latency, not the
// tensor cores, bounds this kernel, so more warps per SM beat bigger CTAs (the host's
// `TANDEM_PF_WARPS` and `TANDEM_CUDA_DEFINES` change them for comparison). One split (a tile's
// rows see at most their chunk's context); a warp skips the stages none of its rows can see (past
// the causal edge or before the window).
#ifndef PF_WARPS
#define PF_WARPS 4
#endif
// CTAs per SM the register allocation aims at, per head width (H100: 64-wide heads ran 9 %
// faster at four than at three, 128-wide ones need three); PF_MIN_BLOCKS overrides both.
#ifdef PF_MIN_BLOCKS
#define PF_MIN_BLOCKS_64 PF_MIN_BLOCKS
#define PF_MIN_BLOCKS_128 PF_MIN_BLOCKS
#else
#define PF_MIN_BLOCKS_64 4
#define PF_MIN_BLOCKS_128 3
#endif
#define PF_ROWS (16 * PF_WARPS)
#define PF_STAGE 32
template <int HD>
__device__ __forceinline__ void attention_prefill_impl(ATTENTION_ARGS) {
  constexpr int LD = HD + 8;
  constexpr int SPAN = PF_STAGE * LD;  // one stage of K or V
  constexpr int KS = HD / 16;
  constexpr int NT = HD / 8;
  constexpr int COPIES = MMA_PAGE * HD / 8;  // 16-byte copies per page of K (or V)
  constexpr int CHUNKS = (COPIES + 32 * PF_WARPS - 1) / (32 * PF_WARPS);  // per thread
  __shared__ __align__(16) h16 stage[2][2][SPAN];
  const int* tile = tiles + blockIdx.y * 5;
  const int row0 = tile[0], ntok = tile[1], pos0 = tile[2];
  const int* bt = block_tables + tile[3];
  if (ntok == 0) return;
  const int kvh = blockIdx.x, group = nh / nkv, nrows = ntok * group;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rows[2] = {warp * 16 + g, warp * 16 + g + 8};
  // Scores in base-2 units (scale · log₂e folded into Q): the softmax takes exp2 directly.
  const float qscale = scale * 1.4426950408889634f;
  unsigned qh[KS][4], ql[KS][4];
  load_q_frags<KS>(qh, ql, q, rows, nrows, row0, group, nh, kvh, hd, qscale, t);
  int qpos[2];
#pragma unroll
  for (int ri = 0; ri < 2; ri++) qpos[ri] = rows[ri] < nrows ? pos0 + rows[ri] / group : -1;
  // Positions of the warp's first and last rows (-1: the warp has none).
  const bool has_rows = warp * 16 < nrows;
  const int wfirst = has_rows ? pos0 + (warp * 16) / group : -1;
  const int wlast = has_rows ? pos0 + min(nrows - 1, warp * 16 + 15) / group : -1;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // Stages from the first position the tile's first row sees (window), aligned, to the end.
  const int c0 = max(0, pos0 - window + 1) / PF_STAGE * PF_STAGE, c1 = pos0 + ntok;
  const int nstages = (c1 - c0 + PF_STAGE - 1) / PF_STAGE;
  // Copies stage i into buffer b: two 16-position pages (each within one block); a page past the
  // context is zero-filled (its block-table entry may not exist).
  auto issue = [&](int i, int b) {
#pragma unroll
    for (int pg = 0; pg < PF_STAGE / MMA_PAGE; pg++) {
      int p0 = c0 + i * PF_STAGE + pg * MMA_PAGE;
      int bytes = p0 < c1 ? 16 : 0;
      size_t base = 0;
      if (bytes) {
        int blk = bt[p0 / block_size], off = p0 % block_size;
        base = ((size_t)(blk * nkv + kvh) * block_size + off) * hd;
      }
#pragma unroll
      for (int c = 0; c < CHUNKS; c++) {
        int e = threadIdx.x + c * 32 * PF_WARPS, r = pg * MMA_PAGE + e / (HD / 8), col = (e % (HD / 8)) * 8;
        if (COPIES % (32 * PF_WARPS) != 0 && e >= COPIES) continue;
        size_t src = base + (e / (HD / 8)) * HD + col;
        unsigned ks = smem_addr(&stage[b][0][r * LD + col]), vs = smem_addr(&stage[b][1][r * LD + col]);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(ks), "l"(k_cache + src), "r"(bytes));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(vs), "l"(v_cache + src), "r"(bytes));
      }
    }
    asm volatile("cp.async.commit_group;");
  };
  const unsigned sbase = smem_addr(&stage[0][0][0]);
  const unsigned klane = (unsigned)(((lane & 7) * LD + (lane >> 3) * 8) * 2);
  const unsigned vlane = (unsigned)(((((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8) * 2);
  if (nstages > 0) issue(0, 0);
  for (int i = 0; i < nstages; i++) {
    const int buf = i & 1;
    if (i + 1 < nstages) {
      issue(i + 1, buf ^ 1);
      asm volatile("cp.async.wait_group 1;");
    } else {
      asm volatile("cp.async.wait_group 0;");
    }
    __syncthreads();
    const int p0 = c0 + i * PF_STAGE;
    if (p0 <= wlast && p0 + PF_STAGE - 1 > wfirst - window) {
      // Every position of the stage seen by every row of the warp: no masks to apply.
      const bool inside = p0 + PF_STAGE - 1 <= wfirst && p0 > wlast - window;
      // Shared addresses of this lane's ldmatrix rows in the stage's K and V (bytes).
      const unsigned ks = sbase + (unsigned)(buf * 2 * SPAN * 2) + klane;
      const unsigned vs = sbase + (unsigned)((buf * 2 + 1) * SPAN * 2) + vlane;
      // S = Q·Kᵀ over the stage's 32 positions: four n-tiles of 8, high parts and remainders
      // apart.
      float sc[4][4], sl[4][4];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
        sl[j][0] = sl[j][1] = sl[j][2] = sl[j][3] = 0.f;
      }
      // Keys 8j..8j+7 × dims 16s + {0, 8, 16, 24} as four matrices, each step's loaded while
      // the previous step's multiply (the asm keeps program order: the loads run ahead).
      auto kfrag = [&](unsigned (&b)[4], int it) {
        int s = (it / 4) * 2, j = it % 4;
        ldsm_x4(b, ks + (unsigned)((8 * j * LD + s * 16) * 2));
      };
      unsigned bk[2][4];
      kfrag(bk[0], 0);
#pragma unroll
      for (int it = 0; it < KS * 2; it++) {
        const int s = (it / 4) * 2, j = it % 4;
        if (it + 1 < KS * 2) kfrag(bk[(it + 1) & 1], it + 1);
        const unsigned* b = bk[it & 1];
        mma16816(sc[j], qh[s][0], qh[s][1], qh[s][2], qh[s][3], b[0], b[1]);
        if (PF_SPLIT_Q) {
          mma16816(sl[j], ql[s][0], ql[s][1], ql[s][2], ql[s][3], b[0], b[1]);
          mma16816(sc[j], qh[s + 1][0], qh[s + 1][1], qh[s + 1][2], qh[s + 1][3], b[2], b[3]);
          mma16816(sl[j], ql[s + 1][0], ql[s + 1][1], ql[s + 1][2], ql[s + 1][3], b[2], b[3]);
        } else {  // odd k-steps into the second accumulators: still eight chains
          mma16816(sl[j], qh[s + 1][0], qh[s + 1][1], qh[s + 1][2], qh[s + 1][3], b[2], b[3]);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[j][e] += sl[j][e];
      float corr[2];
      online_softmax<4, true>(sc, p0, c1, qpos, window, inside, t, m, l, corr);
      // Once no row's maximum moves (most stages), the accumulators keep their scale.
      if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
        for (int n = 0; n < NT; n++) {
          o[n][0] *= corr[0]; o[n][1] *= corr[0];
          o[n][2] *= corr[1]; o[n][3] *= corr[1];
        }
      }
      // P as the A operand of two k-steps of 16 positions (rows g, g + 8).
      unsigned ph[2][4], pl[2][4];
      p_frags<4>(sc, 0, ph[0], pl[0]);
      p_frags<4>(sc, 1, ph[1], pl[1]);
      // O += P·V: V's matrices transposed by ldmatrix (16 dims × 16 positions per step), each
      // step's loaded during the previous step's multiply.
      auto vfrag = [&](unsigned (&b)[4], int it) {
        int n = (it / 2) * 2, h = it % 2;
        ldsm_x4_t(b, vs + (unsigned)((16 * h * LD + n * 8) * 2));
      };
      unsigned bv[2][4];
      vfrag(bv[0], 0);
#pragma unroll
      for (int it = 0; it < NT; it++) {
        const int n = (it / 2) * 2, h = it % 2;
        if (it + 1 < NT) vfrag(bv[(it + 1) & 1], it + 1);
        pv_mma<PF_SPLIT_P>(o[n], o[n + 1], ph[h], pl[h], bv[it & 1]);
      }
    }
    // Every warp is done with this buffer before the next iteration copies into it.
    __syncthreads();
  }
#pragma unroll
  for (int ri = 0; ri < 2; ri++) {
    l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 1);
    l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 2);
    int r = rows[ri];
    if (r >= nrows) continue;
    int tok = row0 + r / group, h = kvh * group + r % group;
    float inv = l[ri] > 0.f ? 1.f / l[ri] : 0.f;
    h16* dst = out + ((size_t)tok * nh + h) * hd;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      int d = n * 8 + 2 * t;
      dst[d] = f2h(o[n][2 * ri] * inv);
      dst[d + 1] = f2h(o[n][2 * ri + 1] * inv);
    }
  }
}

#endif

// Entry points (empty below sm_80, where the host never launches them).
extern "C" __global__ void __launch_bounds__(64) attention_mma64(ATTENTION_ARGS) {
#if __CUDA_ARCH__ >= 800
  attention_mma_impl<64>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
#endif
}

extern "C" __global__ void __launch_bounds__(64) attention_mma128(ATTENTION_ARGS) {
#if __CUDA_ARCH__ >= 800
  attention_mma_impl<128>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
#endif
}

extern "C" __global__ void __launch_bounds__(32 * PF_WARPS, PF_MIN_BLOCKS_64) attention_prefill64(ATTENTION_ARGS) {
#if __CUDA_ARCH__ >= 800
  attention_prefill_impl<64>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
#endif
}

extern "C" __global__ void __launch_bounds__(32 * PF_WARPS, PF_MIN_BLOCKS_128) attention_prefill128(ATTENTION_ARGS) {
#if __CUDA_ARCH__ >= 800
  attention_prefill_impl<128>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
#endif
}

// Long prompts attend through cuBLAS instead (S = Q·Kᵀ, causal softmax, O = P·V, batched over
// query heads), in IEEE half whatever the model's type: probabilities in [0, 1] keep 11
// significant bits there against bf16's 8. These kernels prepare and normalise for it.

// K and V of positions 0..ctx of one sequence, as IEEE half, copied once per query head into
// contiguous kg, vg ([nh][ctx][hd]). Grid: (ctx, nh); block: hd / 8 threads (16-byte pieces).
extern "C" __global__ void gather_kv(const h16* __restrict__ k_cache, const h16* __restrict__ v_cache,
                                     const int* __restrict__ bt, h16* __restrict__ kg, h16* __restrict__ vg,
                                     int ctx, int nh, int nkv, int hd, int block_size) {
  int p = blockIdx.x, h = blockIdx.y, c = threadIdx.x;
  int kvh = h / (nh / nkv);
  size_t slot = (size_t)bt[p / block_size] * block_size + p % block_size;
  size_t src = kv_index(slot, kvh, nkv, hd, block_size) + c * 8;
  size_t dst = ((size_t)h * ctx + p) * hd + c * 8;
  uint4 kr = *reinterpret_cast<const uint4*>(k_cache + src), vr = *reinterpret_cast<const uint4*>(v_cache + src);
  h16* kh = reinterpret_cast<h16*>(&kr);
  h16* vh = reinterpret_cast<h16*>(&vr);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    kh[i] = to_f16(h2f(kh[i]));
    vh[i] = to_f16(h2f(vh[i]));
  }
  *reinterpret_cast<uint4*>(kg + dst) = kr;
  *reinterpret_cast<uint4*>(vg + dst) = vr;
}

// Causal softmax of scores s ([nh][rows][ctx], f32, already scaled) into p (16-bit): row r is
// the query at position pos0 + r, which sees positions 0..=pos0 + r, and of those only the last
// `window` (a sliding-window layer; INT_MAX otherwise); p in IEEE half. Grid: (rows, nh); block 256.
extern "C" __global__ void softmax_causal(const float* __restrict__ s, h16* __restrict__ p, int rows, int ctx, int pos0,
                                          int window) {
  size_t base = ((size_t)blockIdx.y * rows + blockIdx.x) * ctx;
  int lim = min(ctx, pos0 + (int)blockIdx.x + 1);
  int lo = max(0, lim - window);
  float m = -INFINITY;
  for (int j = lo + threadIdx.x; j < lim; j += blockDim.x) m = fmaxf(m, s[base + j]);
  m = block_max(m);
  float z = 0.f;
  for (int j = lo + threadIdx.x; j < lim; j += blockDim.x) z += __expf(s[base + j] - m);
  float inv = 1.f / block_sum(z);
  for (int j = threadIdx.x; j < ctx; j += blockDim.x)
    p[base + j] = j >= lo && j < lim ? to_f16(__expf(s[base + j] - m) * inv) : (h16)0;
}

// out[i] = in[i] in the model's 16-bit type.
extern "C" __global__ void to_model(const float* __restrict__ in, h16* __restrict__ out, long long n) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) out[i] = f2h(in[i]);
}

// out[t, i] = silu(gu[t, i]) * gu[t, F + i] for the fused gate|up projection (f32 in).
// Grid: (chunks of a row, T).
// act(gate) · up; act is SiLU, or GELU's tanh approximation (Gemma) when `gelu` is set, written
// as x·σ(2·√(2/π)·(x + 0.044715·x³)), the CPU path's form.
__device__ __forceinline__ float gate_act(float x, int gelu) {
  float z = gelu ? 1.5957691f * (x + 0.044715f * x * x * x) : x;
  return x / (1.f + __expf(-z));
}
extern "C" __global__ void silu_mul(const float* __restrict__ gu, h16* __restrict__ out, int F, int gelu) {
  const float* g = gu + (size_t)blockIdx.y * 2 * F;
  h16* o = out + (size_t)blockIdx.y * F;
  if ((F & 3) == 0) {
    // 16 bytes of gate and of up per thread and 8 bytes out (rows stay 16-byte aligned).
    const float4* g4 = reinterpret_cast<const float4*>(g);
    const float4* u4 = reinterpret_cast<const float4*>(g + F);
    uint2* o4 = reinterpret_cast<uint2*>(o);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < F / 4; i += gridDim.x * blockDim.x) {
      float4 a = g4[i], u = u4[i];
      uint2 r;
      r.x = (unsigned)f2h(gate_act(a.x, gelu) * u.x) | ((unsigned)f2h(gate_act(a.y, gelu) * u.y) << 16);
      r.y = (unsigned)f2h(gate_act(a.z, gelu) * u.z) | ((unsigned)f2h(gate_act(a.w, gelu) * u.w) << 16);
      o4[i] = r;
    }
    return;
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < F; i += gridDim.x * blockDim.x) {
    o[i] = f2h(gate_act(g[i], gelu) * g[F + i]);
  }
}

// Gemma's norm after a sub-layer: x[r, :] += y[r, :] * rsqrt(mean(y[r]^2) + eps) * w (f32).
// Grid: rows.
extern "C" __global__ void rmsnorm_add(float* __restrict__ x, const float* __restrict__ y,
                                       const float* __restrict__ w, int H, float eps) {
  const float* yr = y + (size_t)blockIdx.x * H;
  float* xr = x + (size_t)blockIdx.x * H;
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss += yr[i] * yr[i];
  float inv = rsqrtf(block_sum(ss) / (float)H + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] += yr[i] * inv * w[i];
}

__device__ __forceinline__ unsigned int hash32(unsigned int x) {
  x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16; return x;
}

// Pseudo-random values uniform in [-scale, scale) (dummy weights), or the constant `scale` when
// `constant` is set (norm weights).
extern "C" __global__ void fill_random(h16* __restrict__ p, unsigned long long n, unsigned int seed, float scale, int constant) {
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += stride) {
    if (constant) { p[i] = f2h(scale); continue; }
    unsigned int h = hash32(hash32((unsigned int)i ^ seed) ^ (unsigned int)(i >> 32) * 0x9e3779b9u);
    p[i] = f2h(((float)(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
  }
}

// A rows × cols block of a larger random matrix (row stride ld): element (r, c) takes the value
// fill_random gives index first + r·ld + c under the same seed, so a tensor-parallel rank's
// slice of a dummy weight equals the same slice of the whole weight.
extern "C" __global__ void fill_random_block(h16* __restrict__ p, unsigned long long rows, unsigned long long cols, unsigned long long first, unsigned long long ld, unsigned int seed, float scale) {
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x, n = rows * cols;
  for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < n; k += stride) {
    unsigned long long r = k / cols, i = first + r * ld + (k - r * cols);
    unsigned int h = hash32(hash32((unsigned int)i ^ seed) ^ (unsigned int)(i >> 32) * 0x9e3779b9u);
    p[k] = f2h(((float)(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
  }
}

// The uniform draw in (0, 1) of vocabulary entry i under seed: SplitMix64's finaliser of
// seed ^ i·φ, top 24 bits centred (the same bits as the engine's sampler::draw_uniform).
__device__ __forceinline__ float draw_uniform(unsigned long long seed, unsigned int i) {
  unsigned long long z = seed ^ ((unsigned long long)i * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return ((float)(unsigned int)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// Keeps the better of two (score, id) candidates: higher score, then lower id.
__device__ __forceinline__ void better(float& best, int& bi, float s, int i) {
  if (s > best || (s == best && i < bi)) { best = s; bi = i; }
}

// Merges another online-softmax state (max m2, sum of exp(l - m2) s2) into (m, s).
__device__ __forceinline__ void merge_lse(float& m, float& s, float m2, float s2) {
  float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return;
  s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
  m = mm;
}

// Order-preserving map of a float to an unsigned key (larger float, larger key), and back.
__device__ __forceinline__ unsigned fkey(float f) {
  unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float fkey_inv(unsigned k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// Sum of v over the block (every thread gets it); `red` holds 33 floats of shared scratch.
__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) red[wid] = v;
  __syncthreads();
  if (wid == 0) {
    v = lane < nw ? red[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[32] = v;
  }
  __syncthreads();
  return red[32];
}

// The largest key x in [lo, hi] whose tokens at or above it (key(l) >= x) still reach `target`:
// a count (weighted = false) or a sum of exp((l - m) * inv_t). Assumes [lo, ...] reaches it.
__device__ unsigned threshold_search(const float* row, int vocab, unsigned lo, unsigned hi, float target, bool weighted,
                                     float m, float inv_t, float* red) {
  while (lo < hi) {
    unsigned mid = lo + (hi - lo + 1) / 2;
    float acc = 0.f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      float l = row[i];
      if (fkey(l) >= mid) acc += weighted ? __expf((l - m) * inv_t) : 1.f;
    }
    if (block_sum(acc, red) >= target) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Token masks (structured outputs): in logits row rows[r], every token whose bit in mask r (words
// words per mask, bit i % 32 of word i / 32) is clear becomes -infinity, so the sampler and the
// log-probability it reports see only the allowed tokens, as the engine's host sampler does.
extern "C" __global__ void mask_rows(float* __restrict__ logits, const unsigned* __restrict__ rows,
                                     const unsigned* __restrict__ masks, int vocab, int words) {
  const int r = blockIdx.x;
  float* row = logits + (size_t)rows[r] * vocab;
  const unsigned* m = masks + (size_t)r * words;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const unsigned w = (i >> 5) < words ? m[i >> 5] : 0u;
    if (!((w >> (i & 31)) & 1u)) row[i] = -INFINITY;
  }
}

// One token per logits row (block x = row r of rows[]): Gumbel-max over l / temps[r] with the
// row's seed among the tokens surviving min-p, then top-k, then top-p (as the engine's
// sampler::gumbel_max; filters found by bisection on the logit value, ties at a threshold all
// kept); temperature 0: argmax, ties to the lowest id. `args` holds seven arrays of n words:
// logits row, temperature, top-k, top-p, min-p (floats as bits), seed low and high words.
// out[r] is the token, out[n + r] the bits of its log-probability under the raw logits.
extern "C" __global__ void sample_rows(const float* __restrict__ logits, const unsigned* __restrict__ args,
                                       int* __restrict__ out, int n, int vocab) {
  __shared__ float red[33];
  __shared__ float sm[32], ss[32], sb[32];
  __shared__ int si[32];
  const int r = blockIdx.x;
  const float* row = logits + (size_t)args[r] * vocab;
  const float t = __uint_as_float(args[n + r]);
  const unsigned long long seed = (unsigned long long)args[5 * n + r] | ((unsigned long long)args[6 * n + r] << 32);
  const float inv_t = t > 0.f ? 1.0f / t : 0.f;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  // Pass 1: max and sum of exp of the raw logits.
  float m = -INFINITY, s = 0.f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    float l = row[i];
    if (l > m) { s = s * __expf(m - l) + 1.f; m = l; }
    else if (l > -INFINITY) { s += __expf(l - m); }
  }
  for (int o = 16; o > 0; o >>= 1) merge_lse(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if (lane == 0) { sm[wid] = m; ss[wid] = s; }
  __syncthreads();
  m = lane < nw ? sm[lane] : -INFINITY;
  s = lane < nw ? ss[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) merge_lse(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  // The filters, as the lowest surviving key (0: every token).
  unsigned floor_key = 0u;
  if (t > 0.f) {
    const int k = (int)args[2 * n + r];
    const float p = __uint_as_float(args[3 * n + r]), mp = __uint_as_float(args[4 * n + r]);
    if (mp > 0.f) floor_key = fkey(m + t * logf(mp));
    if (k > 0 && k < vocab) {
      unsigned kk = threshold_search(row, vocab, 0u, fkey(m), (float)k, false, m, inv_t, red);
      floor_key = max(floor_key, kk);
    }
    if (p < 1.f) {
      float total = 0.f;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float l = row[i];
        if (fkey(l) >= floor_key) total += __expf((l - m) * inv_t);
      }
      total = block_sum(total, red);
      floor_key = threshold_search(row, vocab, floor_key, fkey(m), p * total, true, m, inv_t, red);
    }
  }
  // Pass 2: the choice among the survivors.
  float best = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    float l = row[i];
    if (fkey(l) < floor_key) continue;
    float sc = t > 0.f ? l * inv_t - logf(-logf(draw_uniform(seed, (unsigned int)i))) : l;
    better(best, bi, sc, i);
  }
  for (int o = 16; o > 0; o >>= 1) better(best, bi, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));
  __syncthreads();
  if (lane == 0) { sb[wid] = best; si[wid] = bi; }
  __syncthreads();
  if (wid == 0) {
    best = lane < nw ? sb[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) better(best, bi, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));
    if (lane == 0) {
      out[r] = bi;
      out[n + r] = __float_as_int(row[bi] - (m + logf(s)));
    }
  }
}

// KV pages between a pool and a contiguous staging buffer (the NCCL transport): the CTAs walk
// the (page, layer-part) pieces, 16 bytes per thread step — a few CTAs, so the copy leaves most
// SMs to NCCL's kernels running beside it. The pool is `parts` layer-parts (K and V of every
// layer) of `part_stride` uint4s each, a block's rows `chunk` uint4s within a part; the staging
// buffer is [page][part][chunk]. Block: 256 threads.
#define PAGE_COPY_ILP 8

// One 32-bit word's share of a page checksum: a bijection of the word keyed by its position in
// the page, so any change of one word changes the sum, and so does moving words around.
__device__ __forceinline__ unsigned page_word_hash(unsigned x, unsigned pos) {
  x = x * 0x9E3779B1u + pos * 0x85EBCA77u + 0x165667B1u;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return x;
}

// Copies n uint4s (dst null: reads only), each thread holding PAGE_COPY_ILP loads in flight
// before its stores, and adds the checksum of what it read (word positions from `pos0`, in
// uint4s) to *sum.
__device__ __forceinline__ void copy_piece(const uint4* __restrict__ src, uint4* __restrict__ dst, int n, unsigned pos0, unsigned* sum) {
  const int step = blockDim.x * PAGE_COPY_ILP;
  unsigned h = 0;
  for (int base = 0; base < n; base += step) {
    uint4 r[PAGE_COPY_ILP];
#pragma unroll
    for (int j = 0; j < PAGE_COPY_ILP; j++) {
      int i = base + j * blockDim.x + threadIdx.x;
      if (i < n) r[j] = src[i];
    }
#pragma unroll
    for (int j = 0; j < PAGE_COPY_ILP; j++) {
      int i = base + j * blockDim.x + threadIdx.x;
      if (i < n) {
        if (dst) dst[i] = r[j];
        const unsigned p = 4u * (pos0 + (unsigned)i);
        h += page_word_hash(r[j].x, p) + page_word_hash(r[j].y, p + 1) + page_word_hash(r[j].z, p + 2) + page_word_hash(r[j].w, p + 3);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) h += __shfl_xor_sync(0xffffffffu, h, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, h);
}

// Pages (block ids in `blocks`) from the pool into `out`, `parts` pieces of `chunk` uint4s per
// page, page-major; sums[page] accumulates each page's checksum (zeroed by the caller).
extern "C" __global__ void gather_pages(const uint4* __restrict__ pool, const int* __restrict__ blocks, uint4* __restrict__ out,
                                        int pieces, int parts, long long part_stride, int chunk, unsigned* __restrict__ sums) {
  for (int w = blockIdx.x; w < pieces; w += gridDim.x) {
    const int page = w / parts, part = w % parts;
    copy_piece(pool + part * part_stride + (long long)blocks[page] * chunk, out + (long long)w * chunk, chunk, (unsigned)(part * chunk), sums + page);
  }
}

// The inverse of gather_pages; a page whose block id is negative is checksummed, not stored.
extern "C" __global__ void scatter_pages(const uint4* __restrict__ in, const int* __restrict__ blocks, uint4* __restrict__ pool,
                                         int pieces, int parts, long long part_stride, int chunk, unsigned* __restrict__ sums) {
  for (int w = blockIdx.x; w < pieces; w += gridDim.x) {
    const int page = w / parts, part = w % parts;
    const int b = blocks[page];
    copy_piece(in + (long long)w * chunk, b < 0 ? nullptr : pool + part * part_stride + (long long)b * chunk, chunk, (unsigned)(part * chunk), sums + page);
  }
}

// ---- Tensor parallelism: the all-reduce of a group's partial products over peer memory ----
// One launch per all-reduce on every rank of a group (GPUs of one process with peer access).
// Block b of each rank first tells every peer that its partial is complete (the release store
// of epoch e into flags[peer][b][rank]) and waits until every peer's block b has told it the
// same; then each rank adds x += P_0 + P_1 + ... (rank order, so every rank gets the same
// bits) over a grid-stride slice, reading the peers' partials across NVLink. Epochs count calls
// per block (counter[b]); a peer's partial is only rewritten two calls later (o and down
// alternate buffers), after this rank's next barrier, so no end barrier is needed.
__device__ __forceinline__ void st_release_sys(unsigned int* p, unsigned int v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int ld_acquire_sys(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
#define TP_MAX_WORLD 8
// Block b's barrier with block b of every peer, for this call's epoch (counter[b] + 1).
__device__ __forceinline__ void tp_barrier(const unsigned long long* __restrict__ flags, unsigned int* __restrict__ counter,
                                           int rank, int world) {
  __shared__ unsigned int epoch;
  if (threadIdx.x == 0) {
    epoch = counter[blockIdx.x] + 1;
    counter[blockIdx.x] = epoch;
  }
  __syncthreads();
  unsigned int e = epoch;
  int peer = threadIdx.x;
  if (peer < world && peer != rank) {
    __threadfence_system();
    unsigned int* theirs = (unsigned int*)flags[peer];
    st_release_sys(theirs + blockIdx.x * TP_MAX_WORLD + rank, e);
    const unsigned int* mine = (const unsigned int*)flags[rank];
    while (ld_acquire_sys(mine + blockIdx.x * TP_MAX_WORLD + peer) < e) {}
  }
}
extern "C" __global__ void tp_all_reduce(float* __restrict__ x, const unsigned long long* __restrict__ partials,
                                         const unsigned long long* __restrict__ flags, unsigned int* __restrict__ counter,
                                         int rank, int world, long long n) {
  tp_barrier(flags, counter, rank, world);
  __syncthreads();
  const float4* p[TP_MAX_WORLD];
  for (int r = 0; r < world; ++r) p[r] = (const float4*)partials[r];
  float4* x4 = (float4*)x;
  long long n4 = n >> 2, stride = (long long)gridDim.x * blockDim.x;
  // Two float4 per thread per round: more loads across NVLink in flight.
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += 2 * stride) {
    long long j = i + stride;
    bool two = j < n4;
    float4 s = __ldcg(p[0] + i), t = two ? __ldcg(p[0] + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    for (int r = 1; r < world; ++r) {
      float4 v = __ldcg(p[r] + i);
      float4 w = two ? __ldcg(p[r] + j) : make_float4(0.f, 0.f, 0.f, 0.f);
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
      t.x += w.x; t.y += w.y; t.z += w.z; t.w += w.w;
    }
    float4 a = x4[i];
    a.x += s.x; a.y += s.y; a.z += s.z; a.w += s.w;
    x4[i] = a;
    if (two) {
      float4 b = x4[j];
      b.x += t.x; b.y += t.y; b.z += t.z; b.w += t.w;
      x4[j] = b;
    }
  }
  for (long long i = (n4 << 2) + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
    float s = __ldcg((const float*)partials[0] + i);
    for (int r = 1; r < world; ++r) s += __ldcg((const float*)partials[r] + i);
    x[i] += s;
  }
}

// tp_all_reduce and then the RMSNorm that reads its sum, in one launch: block b (up to 1024
// threads) takes rows b, b + gridDim.x, .. of x ([rows, H], H a multiple of 4) after the same
// barrier, adds x[r] += P_0[r] + P_1[r] + ... in rank order, and writes y[r] = x[r] ·
// rsqrt(mean(x[r]²) + eps) · w as `rmsnorm` does (its sum of squares taken in another order).
// Each thread loads two 16-byte pieces of every rank's partial before it adds, so that a row
// costs one round trip across NVLink, not one per piece.
extern "C" __global__ void tp_all_reduce_norm(float* __restrict__ x, const unsigned long long* __restrict__ partials,
                                              const unsigned long long* __restrict__ flags, unsigned int* __restrict__ counter,
                                              int rank, int world, int rows, int H, const float* __restrict__ w,
                                              h16* __restrict__ y, float eps) {
  tp_barrier(flags, counter, rank, world);
  __syncthreads();
  const int n4 = H / 4, bd = blockDim.x;
  const float4* w4 = reinterpret_cast<const float4*>(w);
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    float4* x4 = reinterpret_cast<float4*>(x + (size_t)r * H);
    float ss = 0.f;
    for (int i = threadIdx.x; i < n4; i += 2 * bd) {
      const int j = i + bd;
      const bool two = j < n4;
      const float4* p0 = reinterpret_cast<const float4*>(partials[0]) + (size_t)r * n4;
      float4 s = __ldcg(p0 + i), t = two ? __ldcg(p0 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
      for (int k = 1; k < world; ++k) {
        const float4* pk = reinterpret_cast<const float4*>(partials[k]) + (size_t)r * n4;
        float4 v = __ldcg(pk + i), u = two ? __ldcg(pk + j) : make_float4(0.f, 0.f, 0.f, 0.f);
        s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        t.x += u.x; t.y += u.y; t.z += u.z; t.w += u.w;
      }
      float4 a = x4[i];
      a.x += s.x; a.y += s.y; a.z += s.z; a.w += s.w;
      x4[i] = a;
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
      if (two) {
        float4 b = x4[j];
        b.x += t.x; b.y += t.y; b.z += t.z; b.w += t.w;
        x4[j] = b;
        ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
      }
    }
    float inv = rsqrtf(block_sum(ss) / (float)H + eps);
    uint2* y4 = reinterpret_cast<uint2*>(y + (size_t)r * H);
    for (int i = threadIdx.x; i < n4; i += bd) {
      float4 v = x4[i], g = w4[i];
      uint2 o;
      o.x = (unsigned)f2h(v.x * inv * g.x) | ((unsigned)f2h(v.y * inv * g.y) << 16);
      o.y = (unsigned)f2h(v.z * inv * g.z) | ((unsigned)f2h(v.w * inv * g.w) << 16);
      y4[i] = o;
    }
  }
}
