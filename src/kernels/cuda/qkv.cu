#include "kernels/cuda/common.cuh"
#include "kernels/cuda/qkv.h"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// V elements of T at p (V·sizeof(T) bytes, aligned to that) as floats.
template <typename T, int V>
__device__ __forceinline__ void LoadChunk(const T* p, float (&out)[V]) {
  if constexpr (V == kVec<T>) {
    LoadVec(p, out);
  } else {
    static_assert(V == 1);
    out[0] = ToFloat(*p);
  }
}

template <typename T, int V>
__device__ __forceinline__ void StoreChunk(T* p, const float (&v)[V]) {
  if constexpr (V == kVec<T>) {
    StoreVec(p, v);
  } else {
    static_assert(V == 1);
    *p = FromFloat<T>(v[0]);
  }
}

// Elements i .. i + V of a K or V cache: the activations' dtype, or e4m3 of v · inv_scale (V
// bytes in one store).
template <typename T, int V>
__device__ __forceinline__ void StoreKvChunk(const QkvParams& p, void* cache, int64_t i,
                                             const float (&v)[V], float inv_scale) {
  if (!p.kv_fp8) {
    StoreChunk<T, V>(static_cast<T*>(cache) + i, v);
    return;
  }
  uint8_t* dst = static_cast<uint8_t*>(cache) + i;
  if constexpr (V == 8 || V == 4) {
    uint8_t b[V];
#pragma unroll
    for (int j = 0; j < V; ++j) b[j] = ToE4M3(v[j] * inv_scale);
    if constexpr (V == 8) {
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(b);
    } else {
      *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(b);
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) dst[j] = ToE4M3(v[j] * inv_scale);
  }
}

// One token a CTA. Its whole q/k/v row is staged in shared memory as floats (bias added) with
// V-element loads (16 bytes where the shapes allow), beside its rotation angles, computed once
// for all heads, and with per-head norms each head's 1 / rms. Then the CTA's threads write every
// output chunk of V elements: q rotated in place, k rotated and v into the cache. A rotated
// element's partner is read from the staged row, so any pair layout and partial rotary work.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) QkvKernel(QkvParams p) {
  extern __shared__ float smem[];
  const int64_t d_len = p.head_dim, half = p.rotary_dim / 2;
  const int64_t q_dim = p.num_heads * d_len, kv_dim = p.num_kv_heads * d_len;
  const int64_t width = q_dim + 2 * kv_dim;
  float* x = smem;                // [width]
  float* cos_t = x + width;       // [half]
  float* sin_t = cos_t + half;    // [half]
  float* inv_rms = sin_t + half;  // [num_heads + num_kv_heads], with a per-head norm
  WaitForPrerequisites();
  AllowDependents();
  const int64_t t = blockIdx.x;
  T* row = static_cast<T*>(p.qkv) + t * p.qkv_stride;
  for (int64_t c = threadIdx.x; c < width / V; c += kThreads) {
    float v[V];
    LoadChunk<T, V>(row + c * V, v);
#pragma unroll
    for (int j = 0; j < V; ++j) x[c * V + j] = p.bias ? v[j] + p.bias[c * V + j] : v[j];
  }
  const float pos = static_cast<float>(p.positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    float sn, cs;
    sincosf(pos * p.inv_freq[i], &sn, &cs);
    cos_t[i] = cs * p.attention_scaling;
    sin_t[i] = sn * p.attention_scaling;
  }
  __syncthreads();  // every read of the row is done: q may be written back in place
  if (p.q_norm != nullptr || p.k_norm != nullptr) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int64_t h = warp; h < p.num_heads + p.num_kv_heads; h += kThreads / 32) {
      float ss = 0.0f;
      for (int64_t d = lane; d < d_len; d += 32) ss += x[h * d_len + d] * x[h * d_len + d];
      ss = WarpSum(ss);
      if (lane == 0) inv_rms[h] = rsqrtf(ss / static_cast<float>(d_len) + p.norm_eps);
    }
    __syncthreads();
  }
  const int64_t slot = p.slot_mapping[t];
  const int64_t qk_chunks = (q_dim + kv_dim) / V, chunks = qk_chunks + kv_dim / V;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    const int64_t e = c * V;  // the chunk's first column in the row
    float out[V];
    if (c >= qk_chunks) {  // v
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = x[e + j];
      StoreKvChunk<T, V>(p, p.v_cache, slot * kv_dim + (e - q_dim - kv_dim), out, 1.0f / p.v_scale);
      continue;
    }
    const int64_t head = e / d_len, base = head * d_len;
    const bool is_q = head < p.num_heads;
    const float* norm = is_q ? p.q_norm : p.k_norm;
    const float inv = norm != nullptr ? inv_rms[head] : 1.0f;
    // Element d of this head, normed where the model has a per-head norm.
    auto at = [&](int64_t d) {
      return norm != nullptr ? x[base + d] * inv * norm[d] : x[base + d];
    };
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t d = e - base + j;
      float v = at(d);
      if (d < p.rotary_dim) {
        // Pair (a, b) with a the first element: interleaved (2i, 2i+1), else (i, i + half).
        const int64_t i = p.interleaved ? d / 2 : (d < half ? d : d - half);
        const bool first = p.interleaved ? (d % 2 == 0) : (d < half);
        const int64_t partner =
            p.interleaved ? (first ? d + 1 : d - 1) : (first ? d + half : d - half);
        const float cs = cos_t[i], sn = sin_t[i];
        v = first ? v * cs - at(partner) * sn : v * cs + at(partner) * sn;
      }
      out[j] = v;
    }
    if (is_q) {
      StoreChunk<T, V>(row + e, out);
    } else {
      StoreKvChunk<T, V>(p, p.k_cache, slot * kv_dim + (e - q_dim), out, 1.0f / p.k_scale);
    }
  }
}

template <typename T, int V>
cudaError_t Launch(const QkvParams& p, cudaStream_t stream) {
  const int64_t heads = p.num_heads + p.num_kv_heads;
  const size_t smem = sizeof(float) * static_cast<size_t>((heads + p.num_kv_heads) * p.head_dim +
                                                          p.rotary_dim + heads);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        QkvKernel<T, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  return LaunchDependent(QkvKernel<T, V>, dim3(static_cast<unsigned>(p.num_tokens)), kThreads, smem,
                         stream, p);
}

// A cache's chunks of kV elements are aligned stores: 16 bytes, or kV e4m3 bytes.
template <int kV>
bool CacheAligned(const QkvParams& p, const void* cache) {
  return p.kv_fp8 ? reinterpret_cast<uintptr_t>(cache) % kV == 0 : Aligned16(cache);
}

}  // namespace

int QkvRopeKvWrite(const QkvParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  if (p.head_dim <= 0 || p.rotary_dim > p.head_dim || p.rotary_dim % 2 != 0 ||
      (p.kv_fp8 && !(p.k_scale > 0.0f && p.v_scale > 0.0f))) {
    return cudaErrorInvalidValue;
  }
  return DispatchFloat(p.dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kV = kVec<T>;
    const bool vec = p.head_dim % kV == 0 && p.qkv_stride % kV == 0 && Aligned16(p.qkv) &&
                     CacheAligned<kV>(p, p.k_cache) && CacheAligned<kV>(p, p.v_cache);
    const auto s = static_cast<cudaStream_t>(stream);
    return vec ? Launch<T, kV>(p, s) : Launch<T, 1>(p, s);
  });
}

}  // namespace dinfer::kernels::cuda
