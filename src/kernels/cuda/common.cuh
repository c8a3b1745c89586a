// Device helpers shared by the CUDA kernels (included by .cu files only): 16-byte vector loads
// and stores of f32 / bf16 elements as floats, e4m3 conversions, warp reductions, and dtype
// dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "tensor/dtype.h"

namespace dinfer::kernels::cuda {

using bf16 = __nv_bfloat16;

// Elements of T in one 16-byte access.
template <typename T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ float ToFloat(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return __bfloat162float(v);
  }
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return __float2bfloat16_rn(v);
  }
}

// Eight bf16 values (one 16-byte word) as floats.
__device__ __forceinline__ void WidenBf16x8(const uint4& raw, float (&out)[8]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Loads kVec<T> elements (16 bytes, aligned) as floats.
template <typename T>
__device__ __forceinline__ void LoadVec(const T* p, float (&out)[kVec<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  if constexpr (std::is_same_v<T, float>) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  } else {
    WidenBf16x8(raw, out);
  }
}

template <typename T>
__device__ __forceinline__ void StoreVec(T* p, const float (&v)[kVec<T>]) {
  uint4 raw;
  if constexpr (std::is_same_v<T, float>) {
    raw.x = __float_as_uint(v[0]);
    raw.y = __float_as_uint(v[1]);
    raw.z = __float_as_uint(v[2]);
    raw.w = __float_as_uint(v[3]);
  } else {
    auto* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  }
  *reinterpret_cast<uint4*>(p) = raw;
}

// float8 e4m3fn of v, saturated to ±448 (the FP8 KV cache's element; NaN stays NaN).
__device__ __forceinline__ uint8_t ToE4M3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// SiLU(g) = g · sigmoid(g), as every SiLU·mul kernel computes it (SiluMul, the staged GEMV's
// epilogue, the MoE SwiGLU): the same expression gives them the same bits.
__device__ __forceinline__ float Silu(float g) { return g / (1.0f + __expf(-g)); }

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of kThreads threads (a multiple of 32); every thread gets the result.
template <int kThreads>
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[kThreads / 32];
  __shared__ float total;
  v = WarpSum(v);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
    s = WarpSum(s);
    if (threadIdx.x == 0) total = s;
  }
  __syncthreads();
  return total;
}

// Programmatic dependent launch (sm_90): a kernel launched with the programmatic serialization
// attribute may start before the kernel ahead of it in the stream has finished; it must call
// WaitForPrerequisites before it reads that kernel's outputs or writes what it reads. Without
// the attribute, the wait returns at once. AllowDependents lets such a dependent start launching
// while this kernel still runs (its wait still covers all of this kernel's writes).
__device__ __forceinline__ void WaitForPrerequisites() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void AllowDependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the
// work before it in the stream: its CTAs may be scheduled while that work finishes, so every
// kernel launched this way calls WaitForPrerequisites before it touches global memory. Decode
// steps are chains of short kernels; this hides their launch latency, graphs included.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// LaunchDependent for clusters of `cluster` CTAs (grid a multiple of it). A driver that refuses
// programmatic launch of clusters gets a plain one.
template <typename... Params, typename... Args>
cudaError_t LaunchDependentCluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                   dim3 cluster, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster.x;
  attr[0].val.clusterDim.y = cluster.y;
  attr[0].val.clusterDim.z = cluster.z;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    cfg.numAttrs = 1;
    e = cudaLaunchKernelEx(&cfg, kernel, args...);
  }
  return e;
}

// Whether a cluster of `cluster` CTAs of `kernel` (its attributes already set: shared memory,
// non-portable sizes) with `threads` threads and `smem` bytes each can be resident. Asks the
// occupancy API (no stream work); a failed query is not left as the device's last error.
inline bool ClusterFits(const void* kernel, int threads, size_t smem, dim3 cluster) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = cluster;
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster.x;
  attr[0].val.clusterDim.y = cluster.y;
  attr[0].val.clusterDim.z = cluster.z;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  const bool ok = kernel != nullptr &&
                  cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess &&
                  clusters > 0;
  if (!ok) (void)cudaGetLastError();
  return ok;
}

// Calls f(T{}) with T the element type of `dtype` (f32 or bf16).
template <typename F>
cudaError_t DispatchFloat(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(bf16{});
    default:
      return cudaErrorInvalidValue;
  }
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace dinfer::kernels::cuda
