#include <cuda_runtime.h>

#include "kernels/cuda/rmsnorm.h"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void RmsNormKernel(RmsNormParams p) {
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.dim;
  float* out = p.out + row * p.dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) ss += x[i] * x[i];
  // Warp reduction, then across warps through shared memory.
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float partial[kThreads / 32];
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x == 0) partial[0] = ss;
  }
  __syncthreads();
  const float inv = rsqrtf(partial[0] / static_cast<float>(p.dim) + p.eps);
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    out[i] = x[i] * inv * (p.weight[i] + p.weight_offset);
  }
}

}  // namespace

int RmsNorm(const RmsNormParams& p, void* stream) {
  if (p.rows == 0) return 0;
  RmsNormKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dinfer::kernels::cuda
