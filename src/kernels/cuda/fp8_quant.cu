// QuantizeFp8 (gemm.h): activations to e4m3 with per-tensor (given), per-row or per-128-column
// group scales, for the FP8 products. One warp per row (kChannel: looping over the row twice,
// the second pass from L2) or per 128-column group (each lane 4 values, held in registers).
// ScaleOuter: the per-row and per-column scales of a channel-scaled product, applied after it.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr float kE4M3Max = 448.0f;

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) QuantizeKernel(Fp8QuantizeParams p) {
  WaitForPrerequisites();
  AllowDependents();
  const int lane = threadIdx.x & 31;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const T* x = static_cast<const T*>(p.x);
  uint8_t* out = static_cast<uint8_t*>(p.out);
  if (p.scaling == Fp8Scaling::kBlock128) {
    const int64_t groups = p.k / 128;
    if (warp >= p.m * groups) return;
    const int64_t row = warp / groups, g = warp % groups;
    const int64_t col = g * 128 + lane * 4;
    float v[4], amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = ToFloat(x[row * p.ldx + col + i]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = WarpMax(amax);
    const float scale = amax > 0.0f ? amax / kE4M3Max : 1.0f;
    const float inv = 1.0f / scale;
    uint32_t packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) packed |= static_cast<uint32_t>(ToE4M3(v[i] * inv)) << (8 * i);
    *reinterpret_cast<uint32_t*>(out + row * p.k + col) = packed;
    if (lane == 0) p.scale[g * p.m + row] = scale;
    return;
  }
  if (warp >= p.m) return;
  const int64_t row = warp;
  float scale;
  if (p.scaling == Fp8Scaling::kTensor) {
    scale = p.scale[0];
  } else {
    float amax = 0.0f;
    for (int64_t c = lane; c < p.k; c += 32) amax = fmaxf(amax, fabsf(ToFloat(x[row * p.ldx + c])));
    amax = WarpMax(amax);
    scale = amax > 0.0f ? amax / kE4M3Max : 1.0f;
    if (lane == 0) p.scale[row] = scale;
  }
  const float inv = 1.0f / scale;
  for (int64_t c = lane; c < p.k; c += 32) {
    out[row * p.k + c] = ToE4M3(ToFloat(x[row * p.ldx + c]) * inv);
  }
}

// Two elements a thread (n even), grid-stride.
template <typename T>
__global__ void ScaleOuterKernel(T* y, int64_t ldy, int64_t m, int64_t n, const float* row_scale,
                                 const float* col_scale) {
  WaitForPrerequisites();
  AllowDependents();
  const int64_t half = n / 2, pairs = m * half;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / half, c = (i % half) * 2;
    const float rs = row_scale[r];
    T* q = y + r * ldy + c;
    q[0] = FromFloat<T>(ToFloat(q[0]) * rs * col_scale[c]);
    q[1] = FromFloat<T>(ToFloat(q[1]) * rs * col_scale[c + 1]);
  }
}

}  // namespace

int ScaleOuter(void* y, int64_t ldy, int64_t m, int64_t n, DType dtype, const float* row_scale,
               const float* col_scale, void* stream) {
  if (m == 0 || n == 0) return 0;
  if (n % 2 != 0) return cudaErrorInvalidValue;
  const int64_t pairs = m * (n / 2);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((pairs + 255) / 256, 4096));
  return DispatchFloat(dtype, [&](auto t) {
    using T = decltype(t);
    return LaunchDependent(ScaleOuterKernel<T>, blocks, 256, 0, static_cast<cudaStream_t>(stream),
                           static_cast<T*>(y), ldy, m, n, row_scale, col_scale);
  });
}

int QuantizeFp8(const Fp8QuantizeParams& p, void* stream) {
  if (p.m == 0) return 0;
  if (p.scale == nullptr || (p.scaling == Fp8Scaling::kBlock128 && p.k % 128 != 0)) {
    return cudaErrorInvalidValue;
  }
  const int64_t warps = p.scaling == Fp8Scaling::kBlock128 ? p.m * (p.k / 128) : p.m;
  const dim3 grid(static_cast<unsigned>((warps + kWarps - 1) / kWarps));
  return DispatchFloat(p.dtype, [&](auto t) {
    using T = decltype(t);
    return LaunchDependent(QuantizeKernel<T>, grid, kWarps * 32, 0,
                           static_cast<cudaStream_t>(stream), p);
  });
}

}  // namespace dinfer::kernels::cuda
