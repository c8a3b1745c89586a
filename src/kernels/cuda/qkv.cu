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

// V floats of the staged row at x (aligned to V floats): 16-byte accesses where V allows, which
// keep a warp's accesses to consecutive chunks free of bank conflicts.
template <int V>
__device__ __forceinline__ void LoadStaged(const float* x, float (&v)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const float4 f = *reinterpret_cast<const float4*>(x + j);
      v[j] = f.x, v[j + 1] = f.y, v[j + 2] = f.z, v[j + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = x[j];
  }
}

template <int V>
__device__ __forceinline__ void StoreStaged(float* x, const float (&v)[V]) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4)
      *reinterpret_cast<float4*>(x + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) x[j] = v[j];
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
// for all heads, and with per-head norms each head's 1 / rms. Then each thread writes one chunk
// of V elements of every head it takes (head_dim / V threads a head, the CTA's heads a pass):
// q rotated in place, k rotated and v into the cache. A rotated element's partner is read from
// the staged row, so any pair layout and partial rotary work; a thread's chunk is the same in
// every head, so it works out its elements' pairs and angles once.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, 4) QkvKernel(QkvParams p) {
  extern __shared__ float smem[];
  const int d_len = static_cast<int>(p.head_dim), half = static_cast<int>(p.rotary_dim / 2);
  const int num_heads = static_cast<int>(p.num_heads), kv_heads = static_cast<int>(p.num_kv_heads);
  const int kv_dim = kv_heads * d_len, width = (num_heads + 2 * kv_heads) * d_len;
  float* x = smem;                // [width]
  float* cos_t = x + width;       // [half]
  float* sin_t = cos_t + half;    // [half]
  float* inv_rms = sin_t + half;  // [num_heads + num_kv_heads], with a per-head norm
  WaitForPrerequisites();
  AllowDependents();
  const int64_t t = blockIdx.x;
  T* row = static_cast<T*>(p.qkv) + t * p.qkv_stride;
#pragma unroll 4
  for (int c = threadIdx.x; c < width / V; c += kThreads) {
    float v[V];
    LoadChunk<T, V>(row + c * V, v);
    if (p.bias != nullptr) {
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] += p.bias[c * V + j];
    }
    StoreStaged(x + c * V, v);
  }
  const float pos = static_cast<float>(p.positions[t]);
  for (int i = threadIdx.x; i < half; i += kThreads) {
    float sn, cs;
    sincosf(pos * p.inv_freq[i], &sn, &cs);
    cos_t[i] = cs * p.attention_scaling;
    sin_t[i] = sn * p.attention_scaling;
  }
  __syncthreads();  // every read of the row is done: q may be written back in place
  const int rotated_heads = num_heads + kv_heads;
  if (p.q_norm != nullptr || p.k_norm != nullptr) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int h = warp; h < rotated_heads; h += kThreads / 32) {
      float ss = 0.0f;
      for (int d = lane; d < d_len; d += 32) ss += x[h * d_len + d] * x[h * d_len + d];
      ss = WarpSum(ss);
      if (lane == 0) inv_rms[h] = rsqrtf(ss / static_cast<float>(d_len) + p.norm_eps);
    }
    __syncthreads();
  }
  const int per_head = d_len / V, heads_a_pass = kThreads / per_head;
  const int h0 = threadIdx.x / per_head, d0 = threadIdx.x % per_head * V;
  if (h0 >= heads_a_pass) return;
  // Element d is the first of its pair, interleaved (2i, 2i+1) or halves (i, i + half), with
  // angle i. Interleaved pairs lie in a thread's chunk (V even); pairs of halves in the chunk half
  // a rotation away when half is a multiple of V; otherwise each element reads its partner alone.
  const bool pairs_in_chunk = V % 2 == 0 && p.interleaved;
  const bool pair_chunks = !p.interleaved && half % V == 0 && d0 < p.rotary_dim;
  const int partner0 = d0 < half ? d0 + half : d0 - half;  // with pair_chunks
  const int64_t slot = p.slot_mapping[t];
  // The q and k heads, then the v heads (v head j is row head rotated_heads + j).
  for (int h = h0; h < rotated_heads + kv_heads; h += heads_a_pass) {
    const int base = h * d_len;
    float own[V];
    LoadStaged(x + base + d0, own);
    if (h >= rotated_heads) {
      StoreKvChunk<T, V>(p, p.v_cache, slot * kv_dim + (h - rotated_heads) * d_len + d0, own,
                         1.0f / p.v_scale);
      continue;
    }
    const bool is_q = h < num_heads;
    const float* norm = is_q ? p.q_norm : p.k_norm;
    const float inv = norm != nullptr ? inv_rms[h] : 1.0f;
    // Element d of this head, normed where the model has a per-head norm.
    auto at = [&](int d) { return norm != nullptr ? x[base + d] * inv * norm[d] : x[base + d]; };
    float pv[V];
    if (pair_chunks) LoadStaged(x + base + partner0, pv);
    if (norm != nullptr) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        own[j] = own[j] * inv * norm[d0 + j];
        if (pair_chunks) pv[j] = pv[j] * inv * norm[partner0 + j];
      }
    }
    float out[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int d = d0 + j;
      float v = own[j];
      if (d < p.rotary_dim) {
        const bool first = p.interleaved ? d % 2 == 0 : d < half;
        const int angle = p.interleaved ? d / 2 : (first ? d : d - half);
        float other;
        if constexpr (V % 2 == 0) {
          other = pairs_in_chunk ? own[j ^ 1]
                  : pair_chunks  ? pv[j]
                                 : at(first ? d + half : d - half);
        } else {
          other = at(p.interleaved ? (first ? d + 1 : d - 1) : (first ? d + half : d - half));
        }
        const float cs = cos_t[angle], sn = sin_t[angle];
        v = first ? v * cs - other * sn : v * cs + other * sn;
      }
      out[j] = v;
    }
    if (is_q) {
      StoreChunk<T, V>(row + base + d0, out);
    } else {
      StoreKvChunk<T, V>(p, p.k_cache, slot * kv_dim + (h - num_heads) * d_len + d0, out,
                         1.0f / p.k_scale);
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
  if (p.head_dim <= 0 || p.head_dim > kThreads || p.rotary_dim > p.head_dim ||
      p.rotary_dim % 2 != 0 || (p.kv_fp8 && !(p.k_scale > 0.0f && p.v_scale > 0.0f))) {
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
