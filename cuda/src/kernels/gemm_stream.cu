// Products of a few rows (decode steps of 2-64 sequences) with the weights streamed through
// shared memory: C[m, n] (+)= sum_k A[m, k] * W[n, k], A and W 16-bit row-major, C f32 or (out16)
// the model's 16-bit type. Such a product reads each weight once and little else, so what bounds it
// is how many bytes each SM keeps in flight, and cuBLAS's tiles at these sizes leave SMs idle.
//
// A CTA of GS_WARPS warps takes GS_COLS rows of W (16 a warp, on the mma's M: the operands are
// swapped, C^T = W A^T, so 8 tokens fill its N) against every row of A (MT: m rounded up to 8,
// 16, 32 or 64; missing rows read as zeros), over one slice of k. The slice goes through
// GS_STAGES stages of GS_KSTEP values copied by cp.async, GS_STAGES - 1 of them in flight while one
// is multiplied; the weights of the first stages are requested before the kernel waits for the
// one before it (they do not depend on it: with programmatic launches the copies overlap that
// kernel's tail). A product cut along k runs its slices as one thread-block cluster (sm_90):
// each CTA leaves its f32 partial tile in shared memory, and after a cluster barrier each adds
// its share of the tile's rows over every CTA of the cluster in slice order through distributed
// shared memory, so the sum does not depend on scheduling and no partial sum goes to global
// memory. Grid: (n / GS_COLS, slices); cluster (1, slices, 1); block 32 * GS_WARPS; dynamic
// shared memory GS_STAGES * (GS_COLS + MT) * 128 bytes. n a multiple of GS_COLS, k of
// GS_KSTEP * slices, at most 8 slices.
//
// With `glu` set (1: SwiGLU, 2: GeGLU) W is the fused gate|up matrix (2N rows: gate, then up)
// and each CTA takes 32 gate rows and the 32 up rows of the same features; its epilogue writes
// act(gate) * up in the 16-bit type, N columns, rounding gate and up to that type first, so the
// values are bit for bit the plain product's followed by `silu_mul`, and the silu_mul kernel and
// the round trip of gate|up through memory are gone. Grid x: N / 32.

#define GS_WARPS 4
#define GS_COLS (16 * GS_WARPS)
#define GS_KSTEP 64
#ifndef GS_STAGES
#define GS_STAGES 4
#endif
// f32 row stride of the partial tile: 4 past GS_COLS, so a warp's fragment stores hit 32 banks.
#define GS_LDC (GS_COLS + 4)

#if __CUDA_ARCH__ >= 900
// Byte offset of 16-byte chunk `ch` (of 8) in row `r` of a stage of 128-byte rows, the chunks
// of each row rotated by its index mod 8 so the 8 rows one ldmatrix reads fall in distinct banks.
__device__ __forceinline__ unsigned gs_off(int r, int ch) { return (unsigned)(r * 128 + ((ch ^ (r & 7)) << 4)); }

__device__ __forceinline__ void ldsm_x2(unsigned& r0, unsigned& r1, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Four floats at shared address `addr` of the cluster's CTA `rank` (the same offset as here).
__device__ __forceinline__ float4 ld_cluster4(unsigned addr, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
  return v;
}

// Four floats of the partial tile summed over the cluster's `slices` CTAs in slice order (one
// CTA: its own).
__device__ __forceinline__ float4 gs_sum(const float* src, int slices) {
  if (slices == 1) return *reinterpret_cast<const float4*>(src);
  const unsigned addr = smem_addr(src);
  float4 s = ld_cluster4(addr, 0);
  for (int r = 1; r < slices; r++) {
    const float4 p = ld_cluster4(addr, r);
    s.x += p.x; s.y += p.y; s.z += p.z; s.w += p.w;
  }
  return s;
}

// Hopper's warpgroup MMA (sm_90a): the CTA's four warps are one warpgroup, and each stage's
// product is four wgmma m64nMTk16 reading W and A straight from the stages in shared memory
// (their layout is the 128-byte swizzle wgmma reads: 128-byte rows, chunks rotated by row mod
// 8, 8-row groups 1,024 bytes apart, stages 1,024-byte aligned), instead of every warp loading
// every fragment of A with ldmatrix for eight mma.sync a stage (at 64 rows of A those loads and
// mma.sync bound the kernel, not its weights' bytes). The accumulators hold the same elements
// in the same registers as the mma.sync path's (warp w: W rows 16w.., token pairs 2t, 2t + 1 of
// each group of 8). TANDEM_GS_MMA_SYNC keeps mma.sync (for comparison).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(TANDEM_GS_MMA_SYNC)
#define GS_WGMMA 1
// Shared-memory matrix descriptor: start address, 128-byte swizzle, 1,024 bytes between groups
// of 8 rows (the leading-dimension offset is unused with this swizzle; 16 bytes by convention).
__device__ __forceinline__ unsigned long long gs_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void gs_wgmma(float (&d)[1][4], unsigned long long wd, unsigned long long ad) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n8k16.f32." MMA_TYPE "." MMA_TYPE " {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0; }"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
               : "l"(wd), "l"(ad));
}
__device__ __forceinline__ void gs_wgmma(float (&d)[2][4], unsigned long long wd, unsigned long long ad) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32." MMA_TYPE "." MMA_TYPE " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0; }"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
               : "l"(wd), "l"(ad));
}
__device__ __forceinline__ void gs_wgmma(float (&d)[4][4], unsigned long long wd, unsigned long long ad) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." MMA_TYPE "." MMA_TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0; }"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
               : "l"(wd), "l"(ad));
}
__device__ __forceinline__ void gs_wgmma(float (&d)[8][4], unsigned long long wd, unsigned long long ad) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n\t"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." MMA_TYPE "." MMA_TYPE " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0; }"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
               : "l"(wd), "l"(ad));
}
#else
#define GS_WGMMA 0
#endif

// Stage `s` of this CTA's W rows into buffer `buf`: GS_COLS rows of 8 chunks, evicted first
// from L2 (read once a step). Rows from GS_COLS / 2 on lie `skip` rows further (the up rows of
// a gated product).
__device__ __forceinline__ void gs_load_w(unsigned sw, const h16* __restrict__ wt, int K, int skip, int s, unsigned long long policy) {
#pragma unroll
  for (int i = 0; i < GS_COLS * 8 / (32 * GS_WARPS); i++) {
    const int q = threadIdx.x + i * 32 * GS_WARPS, r = q >> 3, ch = q & 7;
    const h16* src = wt + (size_t)(r + (r >= GS_COLS / 2 ? skip : 0)) * K + s * GS_KSTEP + ch * 8;
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(sw + gs_off(r, ch)), "l"(src), "l"(policy));
  }
}

// Stage `s` of A's rows (MT of them; rows from M on zero-filled) at shared address `sa`.
template <int MT>
__device__ __forceinline__ void gs_load_a(unsigned sa, const h16* __restrict__ at, int M, int K, int s) {
#pragma unroll
  for (int i = 0; i < (MT * 8 + 32 * GS_WARPS - 1) / (32 * GS_WARPS); i++) {
    const int q = threadIdx.x + i * 32 * GS_WARPS, r = q >> 3, ch = q & 7;
    if (q < MT * 8) {
      const bool in = r < M;
      const h16* src = at + (size_t)(in ? r : 0) * K + s * GS_KSTEP + ch * 8;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa + gs_off(r, ch)), "l"(src), "r"(in ? 16 : 0));
    }
  }
}

template <int MT>
__device__ __forceinline__ void gemm_stream_impl(const h16* __restrict__ a, const h16* __restrict__ w, void* __restrict__ c,
                                                 int M, int N, int K, int KS, int accumulate, int out16, int glu) {
  extern __shared__ __align__(128) unsigned char gs_smem[];
  constexpr int WB = GS_COLS * 128, SB = WB + MT * 128, NF = MT / 8;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Plain: W rows col0.. are output columns col0..; gated: gate rows col0.., up rows N + col0...
  const int col0 = blockIdx.x * (glu ? GS_COLS / 2 : GS_COLS), slice = blockIdx.y, slices = gridDim.y;
  const int skip = glu ? N - GS_COLS / 2 : 0;
  const int steps = KS / GS_KSTEP;
  // Stages from the first 1,024-byte boundary (the host asks for 1,024 bytes more).
  const unsigned base = (smem_addr(gs_smem) + 1023u) & ~1023u;
  const h16* wt = w + (size_t)col0 * K + (size_t)slice * KS;
  const h16* at = a + (size_t)slice * KS;
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));

#pragma unroll
  for (int s = 0; s < GS_STAGES - 1; s++)
    if (s < steps) gs_load_w(base + s * SB, wt, K, skip, s, policy);
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
#pragma unroll
  for (int s = 0; s < GS_STAGES - 1; s++) {
    if (s < steps) gs_load_a<MT>(base + s * SB + WB, at, M, K, s);
    asm volatile("cp.async.commit_group;");
  }

  float acc[NF][4];
#pragma unroll
  for (int f = 0; f < NF; f++) acc[f][0] = acc[f][1] = acc[f][2] = acc[f][3] = 0.f;
  // ldmatrix rows: W's x4 (rows 0-7 | 8-15 of the warp's 16, k 0-7 | 8-15), A's x4 (tokens
  // 0-7 | 8-15 of a pair of fragments, k 0-7 | 8-15).
#if !GS_WGMMA
  const int w_row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, w_ch = lane >> 4;
  const int a_row = (lane & 7) + (lane >> 4) * 8, a_ch = (lane >> 3) & 1;
#endif
  for (int step = 0; step < steps; step++) {
#if GS_WGMMA
    // This warp's products of the last stage done (its buffer is refilled below), this
    // thread's copies of this stage landed and ordered before the async proxy's reads.
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    asm volatile("cp.async.wait_group %0;" ::"n"(GS_STAGES - 2));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    asm volatile("cp.async.wait_group %0;" ::"n"(GS_STAGES - 2));
#endif
    __syncthreads();
    const int next = step + GS_STAGES - 1;
    if (next < steps) {
      const unsigned sb = base + (next % GS_STAGES) * SB;
      gs_load_w(sb, wt, K, skip, next, policy);
      gs_load_a<MT>(sb + WB, at, M, K, next);
    }
    asm volatile("cp.async.commit_group;");
    const unsigned sw = base + (step % GS_STAGES) * SB, sa = sw + WB;
#if GS_WGMMA
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    const unsigned long long wd = gs_desc(sw), ad = gs_desc(sa);
    // k 16 at a time: 32 bytes further along the rows (2 in the descriptor's 16-byte units).
#pragma unroll
    for (int kk = 0; kk < GS_KSTEP / 16; kk++) gs_wgmma(acc, wd + 2 * kk, ad + 2 * kk);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#else
#pragma unroll
    for (int kk = 0; kk < GS_KSTEP / 16; kk++) {
      unsigned wf[4];
      ldsm_x4(wf, sw + gs_off(w_row, kk * 2 + w_ch));
      if constexpr (NF == 1) {
        unsigned b0, b1;
        ldsm_x2(b0, b1, sa + gs_off(lane & 7, kk * 2 + ((lane >> 3) & 1)));
        mma16816(acc[0], wf[0], wf[1], wf[2], wf[3], b0, b1);
      } else {
#pragma unroll
        for (int p = 0; p < NF / 2; p++) {
          unsigned b[4];
          ldsm_x4(b, sa + gs_off(p * 16 + a_row, kk * 2 + a_ch));
          mma16816(acc[2 * p], wf[0], wf[1], wf[2], wf[3], b[0], b[1]);
          mma16816(acc[2 * p + 1], wf[0], wf[1], wf[2], wf[3], b[2], b[3]);
        }
      }
    }
#endif
  }
#if GS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#endif
  asm volatile("cp.async.wait_group 0;");
  __syncthreads();

  // The partial tile, [token][column] f32, over the stages' memory.
  float* cs = reinterpret_cast<float*>(gs_smem);
  const int g = lane >> 2, t = lane & 3, fc = warp * 16 + g;
#pragma unroll
  for (int f = 0; f < NF; f++) {
    const int tok = f * 8 + 2 * t;
    cs[tok * GS_LDC + fc] = acc[f][0];
    cs[(tok + 1) * GS_LDC + fc] = acc[f][1];
    cs[tok * GS_LDC + fc + 8] = acc[f][2];
    cs[(tok + 1) * GS_LDC + fc + 8] = acc[f][3];
  }
  if (slices > 1) cluster_sync();
  else __syncthreads();
  // This CTA's rows: tokens slice, slice + slices, ...; 4 columns a thread (gated: 4 gate
  // columns and their 4 up columns).
  const int rows = M > slice ? (M - slice + slices - 1) / slices : 0;
  const int per_row = glu ? GS_COLS / 8 : GS_COLS / 4;
  for (int q = tid; q < rows * per_row; q += 32 * GS_WARPS) {
    const int tok = slice + (q / per_row) * slices, v = (q % per_row) * 4;
    float4 s = gs_sum(cs + tok * GS_LDC + v, slices);
    const size_t o = (size_t)tok * N + col0 + v;
    if (glu) {
      const float4 u = gs_sum(cs + tok * GS_LDC + v + GS_COLS / 2, slices);
      const unsigned g01 = (unsigned)f2h(s.x) | ((unsigned)f2h(s.y) << 16), g23 = (unsigned)f2h(s.z) | ((unsigned)f2h(s.w) << 16);
      const unsigned u01 = (unsigned)f2h(u.x) | ((unsigned)f2h(u.y) << 16), u23 = (unsigned)f2h(u.z) | ((unsigned)f2h(u.w) << 16);
      *reinterpret_cast<uint2*>(reinterpret_cast<h16*>(c) + o) = make_uint2(act_pair(g01, u01, glu == 2), act_pair(g23, u23, glu == 2));
    } else if (out16) {
      h16* y = reinterpret_cast<h16*>(c) + o;
      if (accumulate) {
        const uint2 old = *reinterpret_cast<const uint2*>(y);
        s.x += h2f((h16)(old.x & 0xffffu)); s.y += h2f((h16)(old.x >> 16));
        s.z += h2f((h16)(old.y & 0xffffu)); s.w += h2f((h16)(old.y >> 16));
      }
      uint2 out;
      out.x = (unsigned)f2h(s.x) | ((unsigned)f2h(s.y) << 16);
      out.y = (unsigned)f2h(s.z) | ((unsigned)f2h(s.w) << 16);
      *reinterpret_cast<uint2*>(y) = out;
    } else {
      float4* y = reinterpret_cast<float4*>(reinterpret_cast<float*>(c) + o);
      if (accumulate) {
        const float4 old = *y;
        s.x += old.x; s.y += old.y; s.z += old.z; s.w += old.w;
      }
      *y = s;
    }
  }
  // No CTA leaves while others may still read its partial tile.
  if (slices > 1) cluster_sync();
}
#endif

#if __CUDA_ARCH__ >= 900
#define GEMM_STREAM_BODY(MT) gemm_stream_impl<MT>(a, w, c, M, N, K, KS, accumulate, out16, glu)
#else
#define GEMM_STREAM_BODY(MT) \
  do {                       \
  } while (0)
#endif
#define GEMM_STREAM_KERNEL(MT)                                                                              \
  extern "C" __global__ void __launch_bounds__(32 * GS_WARPS)                                               \
      gemm_stream##MT(const h16* __restrict__ a, const h16* __restrict__ w, void* __restrict__ c, int M, int N, \
                      int K, int KS, int accumulate, int out16, int glu) {                                  \
    GEMM_STREAM_BODY(MT);                                                                                   \
  }
GEMM_STREAM_KERNEL(8)
GEMM_STREAM_KERNEL(16)
GEMM_STREAM_KERNEL(32)
GEMM_STREAM_KERNEL(64)
