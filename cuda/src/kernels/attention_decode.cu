// Tensor-core paged attention for tiles of at most 8 query rows (decode steps: one token of a
// sequence × the query heads of one KV head), compiled after attention_mma.cu, whose helpers it uses.
//
// The products run transposed: Sᵀ = K·Qᵀ puts a page's 16 positions on the mma's M and the
// tile's query rows on its N (8), and Oᵀ += Vᵀ·Pᵀ puts 16 head dims on M, again the query rows
// on N. `attention_mma_impl` puts the query rows on M (16), so a decode tile of 2 to 8 rows
// leaves most of each product idle: this kernel issues a quarter of its tensor-core
// instructions per page (head width 128: 8 for S and 8 for O, 16 each with the remainders of Q
// and P), and a warp's output accumulators are 32 registers instead of 64.
//
// Grid (nkv, tile entries) and split outputs as `attention`; WARPS warps per CTA (DEC_WARPS64
// for heads 64 wide, DEC_WARPS128 for 128), each walking every WARPS-th 16-position page of the split with MMA_STAGES - 1 pages copied
// ahead by cp.async (K and V to shared memory, rows padded for conflict-free ldmatrix). The
// weights P pass from the Sᵀ accumulators (a lane holds positions g, g + 8 of rows 2t, 2t + 1)
// to the B operand (positions 2t.., 2t + 8.. of row g) through 256 bytes of shared memory per
// warp and one transposing ldmatrix. Scores are in base-2 units (scale · log₂e folded into Q).
// With several warps, their (max, sum, accumulator) per row meet in shared memory at the end
// and the CTA's threads combine them, writing whole rows.
#ifndef DEC_WARPS64
#define DEC_WARPS64 2
#endif
#ifndef DEC_WARPS128
#define DEC_WARPS128 4
#endif
// TANDEM_DEC_COPY_ONLY measures the page copies alone (no arithmetic, wrong results).
// Q and P as 16-bit high parts plus remainders (as `attention_mma_impl`); TANDEM_DEC_ROUND
// rounds them once to the model's type instead (for comparison).
#ifdef TANDEM_DEC_ROUND
#define DEC_SPLIT_Q false
#define DEC_SPLIT_P false
#else
#define DEC_SPLIT_Q true
#define DEC_SPLIT_P MMA_SPLIT_P
#endif

#if __CUDA_ARCH__ >= 800
// The fused variant (`attention_dec_rope64/128`) also does what `qkv_rope_store` does for the
// tile's rows, so a decode step launches one kernel a layer fewer: every CTA norms and rotates
// its query heads' rows straight from the q|k|v GEMM's output, and the CTA whose context split
// holds a new position rotates that token's key and stores it and the value in the cache before
// its page copies read the page. The arithmetic repeats `qkv_rope_store_impl`'s statement by
// statement (same lanes, same sums), so queries and stored keys and values are bit for bit the
// unfused kernels'. Only for steps whose every row is in one small tile (no long chunks): a
// sequence's tokens are then in a single tile, and no CTA reads a position another CTA stores.
// The q/k/v rows come from L2 (the GEMM just wrote them), and the page copies that need no new
// position go out before this work, so the CTA's prologue hides most of it. On one H200
// (`attention_dec_rope128` against `qkv_rope_store_p2` + `attention_dec128`; bf16 random
// weights, decode graphs, cuBLAS GEMMs; `tandem-gpu bench-decode qwen3-0.6b.json
// 1,16,64,256 100-2048` against the tree before in the same run) Qwen3-0.6B's step went from
// 0.979 / 1.866 / 3.362 / 9.303 to 0.828 / 1.675 / 3.209 / 8.955 ms at batch 1 / 16 / 64 / 256
// (docs/gpu-runs/h200-2026-12-01-fused-rope/).
#define ROPE_FUSED_ARGS                                                                                      \
  const float* __restrict__ qkv, const int* __restrict__ pos, const int* __restrict__ slot,                 \
      const float* __restrict__ inv_freq, const float* __restrict__ q_norm,                                \
      const float* __restrict__ k_norm, const float* __restrict__ qkv_bias, int interleaved, float eps
#define ROPE_FUSED_NAMES qkv, pos, slot, inv_freq, q_norm, k_norm, qkv_bias, interleaved, eps

// One head `h` of token row `tok` normed (when `norm`) and rotated, as `qkv_rope_store_impl`
// computes it: lane `lane` holds pairs (a, b) of indices lane + 32·j < hd / 2 in r0[j], r1[j].
template <int PAIRS>
__device__ __forceinline__ void rope_head(const float* __restrict__ qkv, const float* __restrict__ inv_freq,
                                          const float* __restrict__ norm, const float* __restrict__ qkv_bias,
                                          int tok, int h, int heads, float p, int hd, int interleaved, float eps,
                                          int lane, float (&r0)[PAIRS], float (&r1)[PAIRS]) {
  const int half = hd / 2;
  const float* src = qkv + ((size_t)tok * heads + h) * hd;
  const float* bias = qkv_bias ? qkv_bias + h * hd : nullptr;
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
  float inv = 1.f;
  if (norm) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < PAIRS; j++) ss += x0[j] * x0[j];
#pragma unroll
    for (int j = 0; j < PAIRS; j++) ss += x1[j] * x1[j];
    inv = rsqrtf(warp_sum(ss) / (float)hd + eps);
  }
#pragma unroll
  for (int j = 0; j < PAIRS; j++) {
    r0[j] = r1[j] = 0.f;
    const int i = lane + 32 * j;
    if (i >= half) break;
    float c, sn, u0 = x0[j], u1 = x1[j];
    sincosf(p * fr[j], &sn, &c);
    if (norm) {
      u0 = u0 * inv * g0[j];
      u1 = u1 * inv * g1[j];
    }
    r0[j] = u0 * c - u1 * sn;
    r1[j] = u0 * sn + u1 * c;
  }
}

// The fused variant's prologue: the tile's query rows (normed, rotated) into `qst` ([row][HD]
// f32), and the keys and values of its new positions in [s0, s1) (the ones this CTA's split
// holds) into the cache; then every thread of the CTA sees both.
template <int HD, int WARPS>
__device__ __forceinline__ void dec_rope_prologue(ROPE_FUSED_ARGS, float* qst, h16* __restrict__ k_cache,
                                                  h16* __restrict__ v_cache, int row0, int pos0, int s0, int s1,
                                                  int nrows, int group, int kvh, int nh, int nkv, int block_size) {
  constexpr int PAIRS = HD / 64;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, heads = nh + 2 * nkv, half = HD / 2;
  // Work items, one a warp in turn: the query rows, then the new keys, then their values.
  const int stored = max(0, s1 - s0);  // none where the split ends before the tile's first token
  for (int it = warp; it < nrows + 2 * stored; it += WARPS) {
    if (it < nrows) {
      const int tok = row0 + it / group;
      float r0[PAIRS], r1[PAIRS];
      rope_head<PAIRS>(qkv, inv_freq, q_norm, qkv_bias, tok, kvh * group + it % group, heads, (float)pos[tok], HD,
                       interleaved, eps, lane, r0, r1);
#pragma unroll
      for (int j = 0; j < PAIRS; j++) {
        const int i = lane + 32 * j;
        if (i >= half) break;
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        qst[it * HD + a] = r0[j];
        qst[it * HD + b] = r1[j];
      }
      continue;
    }
    const bool key = it < nrows + stored;
    const int tok = row0 + s0 - pos0 + (it - nrows) % stored, sl = slot[tok];
    if (sl < 0) continue;  // a token without a slot: nothing to store
    if (key) {
      float r0[PAIRS], r1[PAIRS];
      rope_head<PAIRS>(qkv, inv_freq, k_norm, qkv_bias, tok, nh + kvh, heads, (float)pos[tok], HD, interleaved, eps,
                       lane, r0, r1);
      h16* ko = k_cache + kv_index(sl, kvh, nkv, HD, block_size);
#pragma unroll
      for (int j = 0; j < PAIRS; j++) {
        const int i = lane + 32 * j;
        if (i >= half) break;
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        ko[a] = f2h(r0[j]);
        ko[b] = f2h(r1[j]);
      }
    } else {
      const int hv = nh + nkv + kvh;
      const float* src = qkv + ((size_t)tok * heads + hv) * HD;
      const float* bias = qkv_bias ? qkv_bias + hv * HD : nullptr;
      h16* dst = v_cache + kv_index(sl, kvh, nkv, HD, block_size);
#pragma unroll 4
      for (int i = lane; i < HD; i += 32) dst[i] = f2h(bias ? src[i] + bias[i] : src[i]);
    }
  }
  // Another warp's page copy reads these slots through L2 (cp.async.cg): the stores are fenced
  // at GPU scope before the barrier, which only the CTAs that stored pay for (no step moved by
  // more than the runs' spread: docs/gpu-runs/h200-2026-12-01-fused-rope/3-k77).
  if (stored > 0) __threadfence();
  __syncthreads();
}

template <int HD, int WARPS, bool ROPE>
__device__ __forceinline__ void attention_dec_impl(ATTENTION_ARGS, ROPE_FUSED_ARGS) {
  constexpr int LD = HD + 8;
  constexpr int PAGE = MMA_PAGE * LD;
  constexpr int KS = HD / 16;  // k-steps of Sᵀ, m-tiles of Oᵀ
  // Dynamic shared memory (`plan::dec_smem_bytes`): each warp's stages of K and V.
  extern __shared__ __align__(16) unsigned char mma_smem[];
  auto stage = reinterpret_cast<h16 (*)[MMA_STAGES][2][PAGE]>(mma_smem);
  // Pᵀ per warp: [high part, remainder][position][8 rows as 4 words].
  __shared__ __align__(16) unsigned pbuf[WARPS][2][MMA_PAGE][4];
  const int* tile = tiles + blockIdx.y * 5;
  const int row0 = tile[0], ntok = tile[1], pos0 = tile[2];
  const int* bt = block_tables + tile[3];
  if (ntok == 0) return;
  const int kvh = blockIdx.x, group = nh / nkv, nrows = ntok * group;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  int c0, c1, split, splits;
  tile_range(tile, pos0 + ntok, c0, c1, split, splits);
  // Q as the B operand: row g, dims 16s + 2t.. (b0) and 16s + 8 + 2t.. (b1) of each k-step;
  // from `q`, or (fused) from the rotated rows in `qst` once the prologue below wrote them.
  const float qscale = scale * 1.4426950408889634f;
  unsigned qh[KS][2], ql[KS][2];
  float* qst = reinterpret_cast<float*>(stage[0][MMA_STAGES - 1]);
#define DEC_LOAD_Q(ROW_SRC)                                        \
  _Pragma("unroll") for (int s = 0; s < KS; s++) {                 \
    _Pragma("unroll") for (int half = 0; half < 2; half++) {       \
      float x = 0.f, y = 0.f;                                      \
      if (g < nrows) {                                             \
        const float* src = (ROW_SRC) + s * 16 + half * 8 + 2 * t;  \
        x = src[0] * qscale;                                       \
        y = src[1] * qscale;                                       \
      }                                                            \
      split2(x, y, qh[s][half], ql[s][half]);                      \
    }                                                              \
  }
  if (!ROPE) {
    DEC_LOAD_Q(q + ((size_t)(row0 + g / group) * nh + kvh * group + g % group) * hd)
  }
  // The lane's two columns: query rows 2t and 2t + 1, and the last position each may see.
  int qpos[2];
#pragma unroll
  for (int c = 0; c < 2; c++) qpos[c] = 2 * t + c < nrows ? pos0 + (2 * t + c) / group : -1;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[KS][4];
#pragma unroll
  for (int mt = 0; mt < KS; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;

  const int npages = (c1 - c0 + MMA_PAGE - 1) / MMA_PAGE;
  // Copies the warp's j-th page (warp + j·WARPS of the split: K and V of this KV head)
  // into buffer b.
  auto issue = [&](int j, int b) {
    const int p0 = c0 + (warp + j * WARPS) * MMA_PAGE;
    const int blk = bt[p0 / block_size], off = p0 % block_size;
    const size_t base = ((size_t)(blk * nkv + kvh) * block_size + off) * hd;
    copy_page_async<HD, LD>(stage[warp][b][0], stage[warp][b][1], k_cache, v_cache, base, lane);
  };
  // Fused: the new positions this split holds, [s0, s1), are stored before any page copy that
  // reads them (the copies of pages before them go out first); the query rows wait in warp 0's
  // last stage, which no copy fills before the loop below.
  const int s0 = max(c0, pos0), s1 = min(c1, pos0 + ntok);
  auto early = [&](int j) { return !ROPE || s0 >= s1 || c0 + (warp + j * WARPS + 1) * MMA_PAGE <= s0; };
  int buf = 0, deferred = MMA_STAGES - 1;
#pragma unroll
  for (int j = 0; j < MMA_STAGES - 1; j++) {
    if (!early(j)) {
      deferred = j;
      break;
    }
    if (warp + j * WARPS < npages) issue(j, j);
    else asm volatile("cp.async.commit_group;");
  }
#ifdef TANDEM_DEC_EARLY_COPIES
  // The fused kernel waits for its predecessor only here (`DEC_ROPE_ENTRY`): the pages copied
  // above hold no position this step stores (those are deferred past the prologue), and the
  // tiles and block tables were uploaded before the pass; the q|k|v rows are read after it.
  if (ROPE) KERNEL_ENTRY();
#endif
  if (ROPE) {
    // The caches are read only by the page copies, after the prologue's barrier.
    dec_rope_prologue<HD, WARPS>(ROPE_FUSED_NAMES, qst, const_cast<h16*>(k_cache), const_cast<h16*>(v_cache), row0,
                                 pos0, s0, s1, nrows, group, kvh, nh, nkv, block_size);
#pragma unroll
    for (int j = 0; j < MMA_STAGES - 1; j++) {
      if (j < deferred) continue;
      if (warp + j * WARPS < npages) issue(j, j);
      else asm volatile("cp.async.commit_group;");
    }
    DEC_LOAD_Q(qst + g * HD)
  }
#undef DEC_LOAD_Q
  // Warp 0's last stage is free again once every warp holds its queries.
  if (ROPE) __syncthreads();
  // This lane's ldmatrix rows: K as A (positions lane & 15, dims + 8 for lanes 16..31), Vᵀ as A
  // (positions lane & 7 (+ 8 for lanes 16..31), dims + 8 for lanes 8..15 and 24..31), Pᵀ as B
  // (position lane & 15 of the high parts, or of the remainders for lanes 16..31).
  const unsigned krow = (unsigned)(((lane & 15) * LD + (lane >> 4) * 8) * 2);
  const unsigned vrow = (unsigned)((((lane & 7) + ((lane >> 4) & 1) * 8) * LD + ((lane >> 3) & 1) * 8) * 2);
  const unsigned prow = smem_addr(&pbuf[warp][(lane >> 4) & 1][lane & 15][0]);
  for (int i = warp, j = 0; i < npages; i += WARPS, j++) {
    if (i + (MMA_STAGES - 1) * WARPS < npages) issue(j + MMA_STAGES - 1, (buf + MMA_STAGES - 1) % MMA_STAGES);
    else asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group %0;" ::"n"(MMA_STAGES - 1));
    __syncwarp();
#ifdef TANDEM_DEC_COPY_ONLY  // the copies alone, no arithmetic (a measurement; wrong results)
    buf = (buf + 1) % MMA_STAGES;
    continue;
#endif
    const unsigned ks = smem_addr(stage[warp][buf][0]) + krow;
    const unsigned vs = smem_addr(stage[warp][buf][1]) + vrow;
    // Sᵀ = K·Qᵀ: even and odd k-steps into accumulators of their own (two chains of mma).
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int k = 0; k < KS; k++) {
      unsigned a[4];
      ldsm_x4(a, ks + (unsigned)(k * 16 * 2));
      mma16816(s[k & 1], a[0], a[1], a[2], a[3], qh[k][0], qh[k][1]);
      if (DEC_SPLIT_Q) mma16816(s[k & 1], a[0], a[1], a[2], a[3], ql[k][0], ql[k][1]);
    }
    // Online softmax per column: s[.][c] at position g, s[.][2 + c] at g + 8.
    const int p0 = c0 + i * MMA_PAGE;
    float corr[2], w[4];
#pragma unroll
    for (int c = 0; c < 2; c++) {
      float v0 = s[0][c] + s[1][c], v1 = s[0][2 + c] + s[1][2 + c];
      const int pa = p0 + g, pb = pa + 8;
      v0 = (pa < c1 && pa <= qpos[c] && pa > qpos[c] - window) ? v0 : -INFINITY;
      v1 = (pb < c1 && pb <= qpos[c] && pb > qpos[c] - window) ? v1 : -INFINITY;
      float mx = fmaxf(v0, v1);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float mn = fmaxf(m[c], mx);
      corr[c] = mn == -INFINITY ? 1.f : exp2f(m[c] - mn);
      w[c] = v0 == -INFINITY ? 0.f : exp2f(v0 - mn);
      w[2 + c] = v1 == -INFINITY ? 0.f : exp2f(v1 - mn);
      l[c] = l[c] * corr[c] + w[c] + w[2 + c];
      m[c] = mn;
    }
#pragma unroll
    for (int mt = 0; mt < KS; mt++) {
      o[mt][0] *= corr[0]; o[mt][1] *= corr[1];
      o[mt][2] *= corr[0]; o[mt][3] *= corr[1];
    }
    // Pᵀ through shared memory into the B operand's layout.
    unsigned hi0, lo0, hi1, lo1;
    split2(w[0], w[1], hi0, lo0);
    split2(w[2], w[3], hi1, lo1);
    pbuf[warp][0][g][t] = hi0;
    pbuf[warp][0][g + 8][t] = hi1;
    if (DEC_SPLIT_P) {
      pbuf[warp][1][g][t] = lo0;
      pbuf[warp][1][g + 8][t] = lo1;
    }
    __syncwarp();
    unsigned pb[4];
    ldsm_x4_t(pb, prow);
    // Oᵀ += Vᵀ·Pᵀ, 16 head dims per mma.
#pragma unroll
    for (int mt = 0; mt < KS; mt++) {
      unsigned a[4];
      ldsm_x4_t(a, vs + (unsigned)(mt * 16 * 2));
      mma16816(o[mt], a[0], a[1], a[2], a[3], pb[0], pb[1]);
      if (DEC_SPLIT_P) mma16816(o[mt], a[0], a[1], a[2], a[3], pb[2], pb[3]);
    }
    __syncwarp();
    buf = (buf + 1) % MMA_STAGES;
  }
  // Each column's sum over the warp's positions (lanes of one t hold a column).
#pragma unroll
  for (int c = 0; c < 2; c++) {
    l[c] += __shfl_xor_sync(0xffffffffu, l[c], 4);
    l[c] += __shfl_xor_sync(0xffffffffu, l[c], 8);
    l[c] += __shfl_xor_sync(0xffffffffu, l[c], 16);
  }
  // Every warp's state to shared memory (the stages are free once all warps are past them).
  asm volatile("cp.async.wait_group 0;");
  __syncthreads();
  float* xo = reinterpret_cast<float*>(mma_smem);  // [WARPS][8][HD]
  float* xml = xo + WARPS * 8 * HD;            // [WARPS][8][2]
#pragma unroll
  for (int c = 0; c < 2; c++) {
    float* row = xo + (warp * 8 + 2 * t + c) * HD;
#pragma unroll
    for (int mt = 0; mt < KS; mt++) {
      row[mt * 16 + g] = o[mt][c];
      row[mt * 16 + g + 8] = o[mt][2 + c];
    }
    if (g == 0) {
      xml[(warp * 8 + 2 * t + c) * 2] = m[c];
      xml[(warp * 8 + 2 * t + c) * 2 + 1] = l[c];
    }
  }
  __syncthreads();
  // The CTA's threads combine the warps, a row's dims at a time: normalised rows to `out`, or
  // this split's accumulator and (max in natural-log units, sum) for `merge_splits`.
  for (int e = threadIdx.x; e < nrows * HD; e += WARPS * 32) {
    const int r = e / HD, d = e % HD;
    float mm = -INFINITY;
#pragma unroll
    for (int wi = 0; wi < WARPS; wi++) mm = fmaxf(mm, xml[(wi * 8 + r) * 2]);
    float acc = 0.f, lt = 0.f;
#pragma unroll
    for (int wi = 0; wi < WARPS; wi++) {
      const float mw = xml[(wi * 8 + r) * 2];
      const float a = mw == -INFINITY ? 0.f : exp2f(mw - mm);
      acc += a * xo[(wi * 8 + r) * HD + d];
      lt += a * xml[(wi * 8 + r) * 2 + 1];
    }
    const int tok = row0 + r / group, h = kvh * group + r % group;
    if (splits == 1) {
      out[((size_t)tok * nh + h) * hd + d] = f2h(lt > 0.f ? acc / lt : 0.f);
    } else {
      const size_t base = ((size_t)split * num_tokens + tok) * nh + h;
      part_acc[base * hd + d] = acc;
      if (d == 0) {
        part_ml[base * 2] = mm * 0.6931471805599453f;
        part_ml[base * 2 + 1] = lt;
      }
    }
  }
  if (splits > 1)
    merge_splits(split_count + row0 * nkv + kvh, splits, part_acc, part_ml, out, row0, nrows, group, kvh, num_tokens, nh, hd);
}
#endif

// The fused kernels wait for their predecessor (the q|k|v GEMM) at entry, or, with early copies
// (the default: `plan::dec_early_copies`), inside `attention_dec_impl` once their first page
// copies are out — launched as programmatic dependents, those copies then overlap the GEMM's end.
// On one H100 (docs/gpu-runs/h100-2026-12-06-steps/3-k99/; bf16 random weights, decode graphs,
// products of up to 32 rows on the stream kernels) Qwen3-0.6B's step at 16 sequences, context
// 1,024, went from 1.794 / 1.787 to 1.729 / 1.722 ms, the Llama-3-8B shape's from 6.914 to 6.851;
// at 64 to 256 sequences (cuBLAS GEMMs, which release their dependents only as they end) within
// 0.2 %.
#ifdef TANDEM_DEC_EARLY_COPIES
#define DEC_ROPE_ENTRY() \
  do {                   \
  } while (0)
#else
#define DEC_ROPE_ENTRY() KERNEL_ENTRY()
#endif

#define ROPE_UNUSED nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0.f
#define ATTENTION_NAMES q, k_cache, v_cache, tiles, block_tables, out, part_acc, part_ml, split_count, num_tokens, nh, nkv, hd, block_size, scale, window

extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS64) attention_dec64(ATTENTION_ARGS) {
  KERNEL_ENTRY();
#if __CUDA_ARCH__ >= 800
  attention_dec_impl<64, DEC_WARPS64, false>(ATTENTION_NAMES, ROPE_UNUSED);
#endif
}

extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS128) attention_dec128(ATTENTION_ARGS) {
  KERNEL_ENTRY();
#if __CUDA_ARCH__ >= 800
  attention_dec_impl<128, DEC_WARPS128, false>(ATTENTION_NAMES, ROPE_UNUSED);
#endif
}

// The same with the q/k norm + RoPE + KV store of the tile's rows fused in (`q` is not read).
extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS64) attention_dec_rope64(ATTENTION_ARGS, ROPE_FUSED_ARGS) {
  DEC_ROPE_ENTRY();
#if __CUDA_ARCH__ >= 800
  attention_dec_impl<64, DEC_WARPS64, true>(ATTENTION_NAMES, ROPE_FUSED_NAMES);
#endif
}

extern "C" __global__ void __launch_bounds__(32 * DEC_WARPS128) attention_dec_rope128(ATTENTION_ARGS, ROPE_FUSED_ARGS) {
  DEC_ROPE_ENTRY();
#if __CUDA_ARCH__ >= 800
  attention_dec_impl<128, DEC_WARPS128, true>(ATTENTION_NAMES, ROPE_FUSED_NAMES);
#endif
}
