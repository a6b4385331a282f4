// Token choice on the device: logits masks (structured outputs) and sampling by Gumbel-max.

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
  KERNEL_ENTRY();
  const int r = blockIdx.x;
  float* row = logits + (size_t)rows[r] * vocab;
  const unsigned* m = masks + (size_t)r * words;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const unsigned w = (i >> 5) < words ? m[i >> 5] : 0u;
    if (!((w >> (i & 31)) & 1u)) row[i] = -INFINITY;
  }
}

// Tokens a pass takes from the pass launched before it (steps planned ahead): pairs[2i] is a
// token of the batch, pairs[2i + 1] the row whose token that pass's sample_rows left in
// sampled[] (read before this pass's own sampling overwrites it: both run on one stream).
extern "C" __global__ void take_sampled(int* __restrict__ tokens, const int* __restrict__ sampled,
                                        const unsigned* __restrict__ pairs, int n) {
  KERNEL_ENTRY();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) tokens[pairs[2 * i]] = sampled[pairs[2 * i + 1]];
}

// One token per logits row (block x = row r of rows[]): Gumbel-max over l / temps[r] with the
// row's seed among the tokens surviving min-p, then top-k, then top-p (as the engine's
// sampler::gumbel_max; filters found by bisection on the logit value, ties at a threshold all
// kept); temperature 0: argmax, ties to the lowest id. `args` holds seven arrays of n words:
// logits row, temperature, top-k, top-p, min-p (floats as bits), seed low and high words.
// out[r] is the token, out[n + r] the bits of its log-probability under the raw logits. A row
// without filters is read once (the choice made beside the log-sum-exp), one with them twice
// plus the bisection's reads.
extern "C" __global__ void sample_rows(const float* __restrict__ logits, const unsigned* __restrict__ args,
                                       int* __restrict__ out, int n, int vocab) {
  KERNEL_ENTRY();
  __shared__ float red[33];
  __shared__ float sm[32], ss[32], sb[32];
  __shared__ int si[32];
  const int r = blockIdx.x;
  const float* row = logits + (size_t)args[r] * vocab;
  const float t = __uint_as_float(args[n + r]);
  const unsigned long long seed = (unsigned long long)args[5 * n + r] | ((unsigned long long)args[6 * n + r] << 32);
  const float inv_t = t > 0.f ? 1.0f / t : 0.f;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  const int k = (int)args[2 * n + r];
  const float p = __uint_as_float(args[3 * n + r]), mp = __uint_as_float(args[4 * n + r]);
  // Without a filter (greedy, or no top-k, top-p or min-p) every token takes part, so the choice
  // needs nothing of pass 1 and rides along with it: one read of the row instead of two.
  const bool one_pass = t <= 0.f || ((k <= 0 || k >= vocab) && p >= 1.f && mp <= 0.f);
  float best = -INFINITY;
  int bi = 0x7fffffff;
  // Pass 1: max and sum of exp of the raw logits (with the choice where one_pass).
  float m = -INFINITY, s = 0.f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    float l = row[i];
    if (l > m) { s = s * __expf(m - l) + 1.f; m = l; }
    else if (l > -INFINITY) { s += __expf(l - m); }
    if (one_pass) {
      float sc = t > 0.f ? l * inv_t - logf(-logf(draw_uniform(seed, (unsigned int)i))) : l;
      better(best, bi, sc, i);
    }
  }
  for (int o = 16; o > 0; o >>= 1) merge_lse(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if (lane == 0) { sm[wid] = m; ss[wid] = s; }
  __syncthreads();
  m = lane < nw ? sm[lane] : -INFINITY;
  s = lane < nw ? ss[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) merge_lse(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  // The filters, as the lowest surviving key (0: every token).
  unsigned floor_key = 0u;
  if (!one_pass) {
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
  // Pass 2 (filtered rows): the choice among the survivors.
  if (!one_pass) {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      float l = row[i];
      if (fkey(l) < floor_key) continue;
      float sc = l * inv_t - logf(-logf(draw_uniform(seed, (unsigned int)i)));
      better(best, bi, sc, i);
    }
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

