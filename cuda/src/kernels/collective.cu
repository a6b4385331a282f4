// KV pages in and out of the pool, and a tensor-parallel group's all-reduce over peer memory.

// Pages (block ids in `blocks`) from the pool into `out`, `parts` pieces of `chunk` uint4s per
// page, page-major; sums[page] accumulates each page's checksum (zeroed by the caller).
extern "C" __global__ void gather_pages(const uint4* __restrict__ pool, const int* __restrict__ blocks, uint4* __restrict__ out,
                                        int pieces, int parts, long long part_stride, int chunk, unsigned* __restrict__ sums) {
  KERNEL_ENTRY();
  for (int w = blockIdx.x; w < pieces; w += gridDim.x) {
    const int page = w / parts, part = w % parts;
    copy_piece(pool + part * part_stride + (long long)blocks[page] * chunk, out + (long long)w * chunk, chunk, (unsigned)(part * chunk), sums + page);
  }
}

// The inverse of gather_pages; a page whose block id is negative is checksummed, not stored.
extern "C" __global__ void scatter_pages(const uint4* __restrict__ in, const int* __restrict__ blocks, uint4* __restrict__ pool,
                                         int pieces, int parts, long long part_stride, int chunk, unsigned* __restrict__ sums) {
  KERNEL_ENTRY();
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
// Pieces i and j (= i + blockDim.x; `two` when j is in the row) of the sum of every rank's
// partial at float4 offset `off`, in rank order (every rank gets the same bits); each rank's two
// loads are issued before its adds, so a row costs one round trip across NVLink, not one per
// piece.
__device__ __forceinline__ void sum_pieces(const unsigned long long* __restrict__ partials, int world, size_t off,
                                           long long i, long long j, bool two, float4& s, float4& t) {
  const float4* p0 = reinterpret_cast<const float4*>(partials[0]) + off;
  s = __ldcg(p0 + i);
  t = two ? __ldcg(p0 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
  for (int k = 1; k < world; ++k) {
    const float4* pk = reinterpret_cast<const float4*>(partials[k]) + off;
    float4 v = __ldcg(pk + i), u = two ? __ldcg(pk + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    t.x += u.x; t.y += u.y; t.z += u.z; t.w += u.w;
  }
}

// x4[i] += s and, when `two`, x4[j] += t; the new values' sum of squares.
__device__ __forceinline__ float add_pieces(float4* __restrict__ x4, long long i, long long j, bool two, float4 s, float4 t) {
  float4 a = x4[i];
  a.x += s.x; a.y += s.y; a.z += s.z; a.w += s.w;
  x4[i] = a;
  float ss = a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
  if (two) {
    float4 b = x4[j];
    b.x += t.x; b.y += t.y; b.z += t.z; b.w += t.w;
    x4[j] = b;
    ss += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
  }
  return ss;
}

// y4 = x4 · inv · w over a row of n4 float4s (this thread's pieces), as `rmsnorm` writes it.
__device__ __forceinline__ void store_normed(const float4* __restrict__ x4, const float4* __restrict__ w4, h16* __restrict__ y,
                                             int n4, float inv) {
  uint2* y4 = reinterpret_cast<uint2*>(y);
  for (int i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 v = x4[i], g = w4[i];
    uint2 o;
    o.x = (unsigned)f2h(v.x * inv * g.x) | ((unsigned)f2h(v.y * inv * g.y) << 16);
    o.y = (unsigned)f2h(v.z * inv * g.z) | ((unsigned)f2h(v.w * inv * g.w) << 16);
    y4[i] = o;
  }
}

extern "C" __global__ void tp_all_reduce(float* __restrict__ x, const unsigned long long* __restrict__ partials,
                                         const unsigned long long* __restrict__ flags, unsigned int* __restrict__ counter,
                                         int rank, int world, long long n) {
  KERNEL_ENTRY();
  tp_barrier(flags, counter, rank, world);
  __syncthreads();
  float4* x4 = (float4*)x;
  long long n4 = n >> 2, stride = (long long)gridDim.x * blockDim.x;
  // Two float4 per thread per round: more loads across NVLink in flight.
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += 2 * stride) {
    const long long j = i + stride;
    float4 s, t;
    sum_pieces(partials, world, 0, i, j, j < n4, s, t);
    add_pieces(x4, i, j, j < n4, s, t);
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
extern "C" __global__ void tp_all_reduce_norm(float* __restrict__ x, const unsigned long long* __restrict__ partials,
                                              const unsigned long long* __restrict__ flags, unsigned int* __restrict__ counter,
                                              int rank, int world, int rows, int H, const float* __restrict__ w,
                                              h16* __restrict__ y, float eps) {
  KERNEL_ENTRY();
  tp_barrier(flags, counter, rank, world);
  __syncthreads();
  const int n4 = H / 4, bd = blockDim.x;
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    float4* x4 = reinterpret_cast<float4*>(x + (size_t)r * H);
    float ss = 0.f;
    for (int i = threadIdx.x; i < n4; i += 2 * bd) {
      float4 s, t;
      sum_pieces(partials, world, (size_t)r * n4, i, i + bd, i + bd < n4, s, t);
      ss += add_pieces(x4, i, i + bd, i + bd < n4, s, t);
    }
    float inv = rsqrtf(block_sum(ss) / (float)H + eps);
    store_normed(x4, reinterpret_cast<const float4*>(w), y + (size_t)r * H, n4, inv);
  }
}

// The two-shot form of tp_all_reduce(_norm), for groups of more than two ranks: each rank reads
// (world - 1) / world of every partial twice instead of world - 1 whole partials once. Block b
// takes rows b, b + gridDim.x, .. in both phases, as tp_all_reduce_norm does. Columns go to
// owners: rank k owns the k-th of `world` slices of a row (`per` float4s each). After the first
// barrier, block b of rank k sums its rows' slice k across every rank's partial in rank order
// into its own partial buffer (in place: no peer reads slice k of rank k's buffer); after a
// second barrier, block b of every rank adds to x each row's slices from their owners' buffers
// (which block b of each owner wrote, so both barriers stay per block) — the same bits on every
// rank, and the same as the one-shot form's — and, given w, writes the RMSNorm of the new rows
// to y. The partial buffer is rewritten two calls later, after every peer has passed this
// rank's next first barrier, so no end barrier is needed here either.
extern "C" __global__ void tp_all_reduce_two_shot(float* __restrict__ x, const unsigned long long* __restrict__ partials,
                                                  const unsigned long long* __restrict__ flags, unsigned int* __restrict__ counter,
                                                  int rank, int world, int rows, int H, const float* __restrict__ w,
                                                  h16* __restrict__ y, float eps) {
  KERNEL_ENTRY();
  tp_barrier(flags, counter, rank, world);
  __syncthreads();
  const int n4 = H / 4, bd = blockDim.x;
  const int per = (n4 + world - 1) / world;
  const int c0 = min(rank * per, n4), c1 = min(c0 + per, n4);
  float4* mine = reinterpret_cast<float4*>(partials[rank]);
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    for (int i = c0 + threadIdx.x; i < c1; i += 2 * bd) {
      const int i2 = i + bd;
      float4 s, t;
      sum_pieces(partials, world, (size_t)r * n4, i, i2, i2 < c1, s, t);
      __stcg(mine + (size_t)r * n4 + i, s);
      if (i2 < c1) __stcg(mine + (size_t)r * n4 + i2, t);
    }
  }
  __syncthreads();
  tp_barrier(flags, counter, rank, world);
  __syncthreads();
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    float4* x4 = reinterpret_cast<float4*>(x + (size_t)r * H);
    float ss = 0.f;
    for (int i = threadIdx.x; i < n4; i += 2 * bd) {
      const int i2 = i + bd;
      const bool two = i2 < n4;
      const float4* pi = reinterpret_cast<const float4*>(partials[i / per]) + (size_t)r * n4;
      float4 s = __ldcg(pi + i), t = make_float4(0.f, 0.f, 0.f, 0.f);
      if (two) t = __ldcg(reinterpret_cast<const float4*>(partials[i2 / per]) + (size_t)r * n4 + i2);
      ss += add_pieces(x4, i, i2, two, s, t);
    }
    if (w == nullptr) continue;
    float inv = rsqrtf(block_sum(ss) / (float)H + eps);
    store_normed(x4, reinterpret_cast<const float4*>(w), y + (size_t)r * H, n4, inv);
  }
}

// The LM head's logits gathered from the ranks that computed them: rank k wrote the columns
// [k·per, k·per + n_k) of `rows` rows (n_k = min(per, cols − k·per)) to its buffer parts[k]
// (row-major, n_k wide); every rank copies all of them into `out` (rows × cols). Pieces of
// 4 × 1024 floats of one rank's slice of one row go to blocks in turn; block b's barriers pair
// with block b of every peer. The closing barrier keeps a rank from rewriting its buffer (the
// next chunk's head) while a peer still reads it.
extern "C" __global__ void tp_gather_columns(float* __restrict__ out, const unsigned long long* __restrict__ parts,
                                             const unsigned long long* __restrict__ flags, unsigned int* __restrict__ counter,
                                             int rank, int world, int rows, int cols, int per) {
  KERNEL_ENTRY();
  tp_barrier(flags, counter, rank, world);
  __syncthreads();
  const int piece = 4096;
  const int chunks = (per + piece - 1) / piece;
  const long long total = (long long)rows * world * chunks;
  const bool vec = (per % 4 == 0) && (cols % 4 == 0);
  for (long long p = blockIdx.x; p < total; p += gridDim.x) {
    const int c = (int)(p % chunks);
    const int k = (int)((p / chunks) % world);
    const int r = (int)(p / ((long long)chunks * world));
    const int c0 = min(k * per, cols);
    const int nk = min(per, cols - c0);
    const int from = c * piece, to = min(from + piece, nk);
    if (from >= to) continue;
    const float* src = reinterpret_cast<const float*>(parts[k]) + (size_t)r * nk;
    float* dst = out + (size_t)r * cols + c0;
    if (vec) {
      for (int i = from + 4 * threadIdx.x; i < to; i += 4 * blockDim.x)
        *reinterpret_cast<float4*>(dst + i) = __ldcg(reinterpret_cast<const float4*>(src + i));
    } else {
      for (int i = from + threadIdx.x; i < to; i += blockDim.x) dst[i] = __ldcg(src + i);
    }
  }
  __syncthreads();
  tp_barrier(flags, counter, rank, world);
}
