// Tandem's CUDA kernels, compiled at run time with NVRTC for the device's architecture.
// Header-free: 16-bit floats travel as `unsigned short` with explicit conversions, so no CUDA
// toolkit headers are needed on the machine that runs them. The model's 16-bit type is bf16, or
// IEEE half when compiled with -DTANDEM_F16.

typedef unsigned short h16;

// The first statement of every kernel. Launched as a programmatic dependent of the kernel before
// it on the stream (`Gpu::launch`, sm_90 and later), a kernel's CTAs may be scheduled while that
// kernel's last CTAs still run: here they wait until it has finished and its writes are visible,
// then let the next kernel's CTAs be scheduled in turn. A kernel launched plainly passes at once.
#if __CUDA_ARCH__ >= 900 && defined(TANDEM_PDL_NO_TRIGGER)
#define KERNEL_ENTRY() asm volatile("griddepcontrol.wait;" ::: "memory")
#elif __CUDA_ARCH__ >= 900
#define KERNEL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define KERNEL_ENTRY() \
  do {               \
  } while (0)
#endif
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

