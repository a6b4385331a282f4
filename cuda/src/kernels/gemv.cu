// A decode step of one sequence: y[n] (+)= Σ_k a[k] · w[n, k], a and w 16-bit (w row-major),
// y f32 or (out16) the model's 16-bit type. A product of one row reads each weight once and is bound by how many bytes are in
// flight: every warp takes R rows of w over the whole of k, each lane 8-wide chunks
// k = 8·(lane + 32·i), GEMV_UNROLL chunks of every row loaded before any is used. The lanes'
// sums meet by shuffles and one lane per row writes: no split of k, so the result does not
// depend on the launch. K a multiple of 8. Grid: ⌈N / (R · GEMV_WARPS)⌉; block: 32 · GEMV_WARPS.
// (Measured against cuBLAS on an H100 for 1–8 rows: faster for one row, slower from two on,
// so the host takes it for one row only.)

#define GEMV_WARPS 4
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 4
#endif

// Σ of the 8 products of two 16-byte chunks of 16-bit values.
__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const h16* wh = reinterpret_cast<const h16*>(&w);
  const h16* xh = reinterpret_cast<const h16*>(&x);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; i++) s = fmaf(h2f(wh[i]), h2f(xh[i]), s);
  return s;
}

template <int R>
__device__ __forceinline__ void gemv_rows(const h16* __restrict__ a, const h16* __restrict__ w,
                                          void* __restrict__ y, int N, int K, int accumulate, int out16) {
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
  if (row0 >= N) return;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.f;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (int k0 = lane * 8; k0 < K; k0 += 256 * GEMV_UNROLL) {
    uint4 wv[GEMV_UNROLL][R];
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
      const int k = k0 + u * 256;
#pragma unroll
      for (int r = 0; r < R; r++) {
        const bool in = k < K && row0 + r < N;
        wv[u][r] = in ? *reinterpret_cast<const uint4*>(w + (size_t)(row0 + r) * K + k) : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; u++) {
      const int k = k0 + u * 256;
      if (k < K) {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(a + k));
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] += dot8(wv[u][r], xv);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    const float s = warp_sum(acc[r]);
    if (lane == r && row0 + r < N) {
      if (out16) {
        h16* y16 = reinterpret_cast<h16*>(y) + row0 + r;
        *y16 = f2h(accumulate ? h2f(*y16) + s : s);
      } else {
        float* y32 = reinterpret_cast<float*>(y) + row0 + r;
        *y32 = accumulate ? *y32 + s : s;
      }
    }
  }
}

// R: rows of w per warp, 1 or 2 (the host takes 1 when 2 would leave too few warps).
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)
    gemv(const h16* __restrict__ a, const h16* __restrict__ w, void* __restrict__ y, int N, int K,
         int R, int accumulate, int out16) {
  KERNEL_ENTRY();
  if (R == 1) gemv_rows<1>(a, w, y, N, K, accumulate, out16);
  else gemv_rows<2>(a, w, y, N, K, accumulate, out16);
}
