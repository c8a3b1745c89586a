#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.h"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kThreads = 1024;

// (value, index) pairs ordered by value, then by the lower index.
__device__ __forceinline__ bool Better(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* logits, int64_t vocab, int64_t stride, int32_t* tokens) {
  WaitForPrerequisites();
  AllowDependents();
  const float* row = logits + blockIdx.x * stride;
  float best = -INFINITY;
  int32_t best_i = INT32_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (Better(v, static_cast<int32_t>(i), best, best_i)) {
      best = v;
      best_i = static_cast<int32_t>(i);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t i = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (Better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  __shared__ float sv[kThreads / 32];
  __shared__ int32_t si[kThreads / 32];
  if ((threadIdx.x & 31) == 0) {
    sv[threadIdx.x >> 5] = best;
    si[threadIdx.x >> 5] = best_i;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    best = sv[threadIdx.x];
    best_i = si[threadIdx.x];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best, o);
      const int32_t i = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (Better(v, i, best, best_i)) {
        best = v;
        best_i = i;
      }
    }
    // A row of NaN or -inf only still names a token.
    if (threadIdx.x == 0) tokens[blockIdx.x] = best_i == INT32_MAX ? 0 : best_i;
  }
}

}  // namespace

int ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int64_t stride, int32_t* tokens,
               void* stream) {
  if (rows == 0) return 0;
  return LaunchDependent(ArgmaxKernel, static_cast<unsigned>(rows), kThreads, 0,
                         static_cast<cudaStream_t>(stream), logits, vocab, stride, tokens);
}

}  // namespace dinfer::kernels::cuda
