// Paged attention on tensor cores (sm_80 and later): the 16-row kernel for any tile and the
// flash-attention prefill kernel for long chunks.

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

// A decode step reads each KV page once: its copies are marked evict-first, so the stream of
// pages leaves the rest of the L2 cache alone (TANDEM_KV_EVICT_NORMAL drops the hint, for
// comparison; docs/gpu-runs/h200-2026-11-29-l2-hints/ has what it gains).
#ifdef TANDEM_KV_EVICT_NORMAL
#define KV_COPY "cp.async.cg.shared.global [%0], [%1], 16;"
#else
#define KV_COPY "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
#endif

// One 16-position page of a KV head's K and V (`base`: its first element in either cache) into
// a warp's shared rows of LD elements (`ks`, `vs`), by cp.async, 16 bytes per copy, then one
// commit group: the decode kernels' page copy.
template <int HD, int LD>
__device__ __forceinline__ void copy_page_async(h16* ks, h16* vs, const h16* __restrict__ k_cache,
                                                const h16* __restrict__ v_cache, size_t base, int lane) {
  unsigned long long policy = 0;
#ifndef TANDEM_KV_EVICT_NORMAL
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
#pragma unroll
  for (int c = 0; c < MMA_PAGE * HD / 8 / 32; c++) {
    int e = lane + c * 32, r = e / (HD / 8), col = (e % (HD / 8)) * 8;
    asm volatile(KV_COPY ::"r"(smem_addr(ks + r * LD + col)), "l"(k_cache + base + r * HD + col), "l"(policy));
    asm volatile(KV_COPY ::"r"(smem_addr(vs + r * LD + col)), "l"(v_cache + base + r * HD + col), "l"(policy));
  }
  asm volatile("cp.async.commit_group;");
}

template <int HD>
__device__ __forceinline__ void attention_mma_impl(ATTENTION_ARGS) {
  constexpr int LD = HD + 8;           // padded shared row (16-bit elements): conflict-free ldmatrix
  constexpr int PAGE = MMA_PAGE * LD;  // one page of K or V
  constexpr int KS = HD / 16;          // k-steps of Q·Kᵀ
  constexpr int NT = HD / 8;           // n-tiles of the output
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
    copy_page_async<HD, LD>(stage[warp][b][0], stage[warp][b][1], k_cache, v_cache, base, lane);
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
  KERNEL_ENTRY();
#if __CUDA_ARCH__ >= 800
  attention_mma_impl<64>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
#endif
}

extern "C" __global__ void __launch_bounds__(64) attention_mma128(ATTENTION_ARGS) {
  KERNEL_ENTRY();
#if __CUDA_ARCH__ >= 800
  attention_mma_impl<128>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
#endif
}

extern "C" __global__ void __launch_bounds__(32 * PF_WARPS, PF_MIN_BLOCKS_64) attention_prefill64(ATTENTION_ARGS) {
  KERNEL_ENTRY();
#if __CUDA_ARCH__ >= 800
  attention_prefill_impl<64>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
#endif
}

extern "C" __global__ void __launch_bounds__(32 * PF_WARPS, PF_MIN_BLOCKS_128) attention_prefill128(ATTENTION_ARGS) {
  KERNEL_ENTRY();
#if __CUDA_ARCH__ >= 800
  attention_prefill_impl<128>(q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window);
#endif
}

