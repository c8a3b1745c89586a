#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"

namespace dinfer::kernels::cuda {
namespace {

template <typename T>
__global__ void EmbeddingKernel(EmbeddingParams p) {
  constexpr int V = kVec<T>;
  WaitForPrerequisites();
  AllowDependents();
  const int64_t t = blockIdx.x;
  const T* row = static_cast<const T*>(p.table) + static_cast<int64_t>(p.ids[t]) * p.dim;
  float* out = p.out + t * (p.out_stride > 0 ? p.out_stride : p.dim);
  for (int64_t i = threadIdx.x * V; i < p.dim; i += blockDim.x * V) {
    float v[V];
    LoadVec(row + i, v);
    for (int64_t c = 0; c < p.copies; ++c) {
#pragma unroll
      for (int j = 0; j < V; ++j) out[c * p.dim + i + j] = v[j] * p.scale;
    }
  }
}

constexpr int kNormThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kNormThreads) RmsNormKernel(RmsNormParams p) {
  constexpr int V = kVec<T>;
  // Rows of up to kNormThreads * V * kMaxChunks elements stay in registers between the passes.
  constexpr int kMaxChunks = 4;
  // The norm's weights do not depend on the kernel before: they are read while it finishes.
  float wts[kMaxChunks][V];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * kNormThreads + threadIdx.x) * V;
    if (i < p.dim) {
#pragma unroll
      for (int j = 0; j < V; j += 4) {
        const float4 f = *reinterpret_cast<const float4*>(p.weight + i + j);
        wts[c][j] = f.x + p.weight_offset;
        wts[c][j + 1] = f.y + p.weight_offset;
        wts[c][j + 2] = f.z + p.weight_offset;
        wts[c][j + 3] = f.w + p.weight_offset;
      }
    }
  }
  WaitForPrerequisites();
  AllowDependents();  // the GEMV after a norm streams its weights in meanwhile
  const int64_t r = blockIdx.x;
  const int64_t i_row = p.rows_index != nullptr ? p.rows_index[r] : r;
  float* x = p.residual + i_row * p.dim;
  const T* add = p.add != nullptr ? static_cast<const T*>(p.add) + i_row * p.dim : nullptr;
  T* out = static_cast<T*>(p.out) + r * p.dim;
  float vals[kMaxChunks][V];
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * kNormThreads + threadIdx.x) * V;
    if (i < p.dim) {
#pragma unroll
      for (int j = 0; j < V; j += 4) {
        const float4 f = *reinterpret_cast<const float4*>(x + i + j);
        vals[c][j] = f.x;
        vals[c][j + 1] = f.y;
        vals[c][j + 2] = f.z;
        vals[c][j + 3] = f.w;
      }
      if (add != nullptr) {
        float a[V];
        LoadVec(add + i, a);
#pragma unroll
        for (int j = 0; j < V; ++j) vals[c][j] += a[j];
        if (p.add_bias != nullptr) {
#pragma unroll
          for (int j = 0; j < V; ++j) vals[c][j] += p.add_bias[i + j];
        }
        if (p.write_back) {
#pragma unroll
          for (int j = 0; j < V; j += 4) {
            *reinterpret_cast<float4*>(x + i + j) =
                make_float4(vals[c][j], vals[c][j + 1], vals[c][j + 2], vals[c][j + 3]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) ss += vals[c][j] * vals[c][j];
    }
  }
  const float inv = rsqrtf(BlockSum<kNormThreads>(ss) / static_cast<float>(p.dim) + p.eps);
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = (static_cast<int64_t>(c) * kNormThreads + threadIdx.x) * V;
    if (i < p.dim) {
      float o[V];
#pragma unroll
      for (int j = 0; j < V; ++j) o[j] = (vals[c][j] * inv) * wts[c][j];
      StoreVec(out + i, o);
    }
  }
}

template <typename T>
__global__ void SiluMulKernel(SiluMulParams p) {
  constexpr int V = kVec<T>;
  WaitForPrerequisites();
  AllowDependents();
  const int64_t in_stride = p.in_stride ? p.in_stride : p.dim;
  const int64_t out_stride = p.out_stride ? p.out_stride : p.dim;
  const int64_t per_row = p.dim / V;
  const int64_t total = p.rows * per_row;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / per_row, i = (k % per_row) * V;
    float g[V], u[V], o[V];
    LoadVec(static_cast<const T*>(p.gate) + r * in_stride + i, g);
    LoadVec(static_cast<const T*>(p.up) + r * in_stride + i, u);
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] = Silu(g[j]) * u[j];
    StoreVec(static_cast<T*>(p.out) + r * out_stride + i, o);
  }
}

__device__ __forceinline__ uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

template <typename T>
__global__ void FillRandomKernel(T* data, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = Mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    data[i] = FromFloat<T>((2.0f * u - 1.0f) * scale);
  }
}

int GridFor(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<int>(blocks < 132 * 16 ? (blocks > 0 ? blocks : 1) : 132 * 16);
}

}  // namespace

int Embedding(const EmbeddingParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  return DispatchFloat(p.dtype, [&](auto t) {
    using T = decltype(t);
    if (p.dim % kVec<T> != 0) return cudaErrorInvalidValue;
    return LaunchDependent(EmbeddingKernel<T>, static_cast<unsigned>(p.num_tokens), 128, 0,
                           static_cast<cudaStream_t>(stream), p);
  });
}

int RmsNorm(const RmsNormParams& p, void* stream) {
  if (p.rows == 0) return 0;
  return DispatchFloat(p.dtype, [&](auto t) {
    using T = decltype(t);
    if (p.dim % kVec<T> != 0 || p.dim > 4 * kNormThreads * kVec<T>) return cudaErrorInvalidValue;
    return LaunchDependent(RmsNormKernel<T>, static_cast<unsigned>(p.rows), kNormThreads, 0,
                           static_cast<cudaStream_t>(stream), p);
  });
}

int SiluMul(const SiluMulParams& p, void* stream) {
  if (p.rows == 0) return 0;
  return DispatchFloat(p.dtype, [&](auto t) {
    using T = decltype(t);
    if (p.dim % kVec<T> != 0) return cudaErrorInvalidValue;
    const int threads = 256;
    return LaunchDependent(SiluMulKernel<T>, GridFor(p.rows * p.dim / kVec<T>, threads), threads, 0,
                           static_cast<cudaStream_t>(stream), p);
  });
}

int FillRandom(void* data, DType dtype, int64_t n, uint64_t seed, float scale, void* stream) {
  if (n == 0) return 0;
  return DispatchFloat(dtype, [&](auto t) {
    using T = decltype(t);
    FillRandomKernel<T><<<GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<T*>(data), n, seed, scale);
    return cudaGetLastError();
  });
}

}  // namespace dinfer::kernels::cuda
