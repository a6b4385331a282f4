// Paged attention on CUDA cores, and the merge of a context's splits that every paged
// attention kernel ends with.

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
  KERNEL_ENTRY();
  attention_impl<ATT_MAX_ROWS / ATT_WARPS>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
}

// The same for tiles of at most 8 rows (decode steps): fewer registers and less shared memory,
// so more CTAs per SM keep more loads in flight.
extern "C" __global__ void __launch_bounds__(128) attention_decode(ATTENTION_ARGS) {
  KERNEL_ENTRY();
  attention_impl<2>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
}

