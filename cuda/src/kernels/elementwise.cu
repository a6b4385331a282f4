// The GEMM attention path's gather and softmax, SwiGLU/GeGLU, the post-norm add, random fill.

// Long prompts attend through cuBLAS instead (S = Q·Kᵀ, causal softmax, O = P·V, batched over
// query heads), in IEEE half whatever the model's type: probabilities in [0, 1] keep 11
// significant bits there against bf16's 8. These kernels prepare and normalise for it.

// K and V of positions 0..ctx of one sequence, as IEEE half, copied once per query head into
// contiguous kg, vg ([nh][ctx][hd]). Grid: (ctx, nh); block: hd / 8 threads (16-byte pieces).
extern "C" __global__ void gather_kv(const h16* __restrict__ k_cache, const h16* __restrict__ v_cache,
                                     const int* __restrict__ bt, h16* __restrict__ kg, h16* __restrict__ vg,
                                     int ctx, int nh, int nkv, int hd, int block_size) {
  KERNEL_ENTRY();
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
  KERNEL_ENTRY();
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
  KERNEL_ENTRY();
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
// act[t, :] = gate_act(gate) · up over gate|up in the model's 16-bit type (the GEMM writes them
// rounded: half the bytes of f32 both ways; Llama-3-8B's 4 × 2048 prefill 224.7 → 217.9 ms on an
// H100 against an f32 gate|up). Rows of a multiple of 8 travel 16 bytes (8 values) at a time.
// Grid: (⌈F / 1024⌉, tokens); block: 256.
__device__ __forceinline__ unsigned act_pair(unsigned g2, unsigned u2, int gelu) {
  const float a0 = h2f((h16)(g2 & 0xffffu)), a1 = h2f((h16)(g2 >> 16));
  const float b0 = h2f((h16)(u2 & 0xffffu)), b1 = h2f((h16)(u2 >> 16));
  return (unsigned)f2h(gate_act(a0, gelu) * b0) | ((unsigned)f2h(gate_act(a1, gelu) * b1) << 16);
}
extern "C" __global__ void silu_mul(const h16* __restrict__ gu, h16* __restrict__ out, int F, int gelu) {
  KERNEL_ENTRY();
  const h16* g = gu + (size_t)blockIdx.y * 2 * F;
  h16* o = out + (size_t)blockIdx.y * F;
  if ((F & 7) == 0) {
    const uint4* g4 = reinterpret_cast<const uint4*>(g);
    const uint4* u4 = reinterpret_cast<const uint4*>(g + F);
    uint4* o4 = reinterpret_cast<uint4*>(o);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < F / 8; i += gridDim.x * blockDim.x) {
      const uint4 a = g4[i], u = u4[i];
      o4[i] = make_uint4(act_pair(a.x, u.x, gelu), act_pair(a.y, u.y, gelu), act_pair(a.z, u.z, gelu),
                         act_pair(a.w, u.w, gelu));
    }
    return;
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < F; i += gridDim.x * blockDim.x) {
    o[i] = f2h(gate_act(h2f(g[i]), gelu) * h2f(g[F + i]));
  }
}

// Gemma's norm after a sub-layer: x[r, :] += y[r, :] * rsqrt(mean(y[r]^2) + eps) * w (f32).
// Grid: rows.
extern "C" __global__ void rmsnorm_add(float* __restrict__ x, const float* __restrict__ y,
                                       const float* __restrict__ w, int H, float eps) {
  KERNEL_ENTRY();
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
  KERNEL_ENTRY();
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
  KERNEL_ENTRY();
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x, n = rows * cols;
  for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < n; k += stride) {
    unsigned long long r = k / cols, i = first + r * ld + (k - r * cols);
    unsigned int h = hash32(hash32((unsigned int)i ^ seed) ^ (unsigned int)(i >> 32) * 0x9e3779b9u);
    p[k] = f2h(((float)(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
  }
}


// Does nothing: `tandem-gpu bench-nodes` times a graph of these (what a kernel node costs).
extern "C" __global__ void noop(int x) { KERNEL_ENTRY(); }
