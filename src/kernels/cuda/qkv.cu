#include "kernels/cuda/common.cuh"
#include "kernels/cuda/qkv.h"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxHeadDim = 256;

// Loads one head of one token, with its bias, into x (the warp's shared-memory row).
template <typename T>
__device__ void LoadHead(const QkvParams& p, int64_t t, int64_t head, float* x) {
  const int lane = threadIdx.x & 31;
  const int64_t col = head * p.head_dim;  // column of this head in the qkv row (k follows q)
  const T* row = static_cast<const T*>(p.qkv) + t * p.qkv_stride;
  for (int64_t d = lane; d < p.head_dim; d += 32) {
    float v = ToFloat(row[col + d]);
    if (p.bias != nullptr) v += p.bias[col + d];
    x[d] = v;
  }
}

// Element i of a K or V cache: the activations' dtype, or e4m3 of v * inv_scale.
template <typename T>
__device__ __forceinline__ void StoreKv(const QkvParams& p, void* cache, int64_t i, float v,
                                        float inv_scale) {
  if (p.kv_fp8) {
    static_cast<uint8_t*>(cache)[i] = ToE4M3(v * inv_scale);
  } else {
    static_cast<T*>(cache)[i] = FromFloat<T>(v);
  }
}

// Then: optional per-head norm, rotation, and the write to q (in place) or to the K/V cache;
// cos_t/sin_t are the token's angles.
template <typename T>
__device__ void FinishHead(const QkvParams& p, int64_t t, int64_t head, float* x,
                           const float* cos_t, const float* sin_t) {
  const int lane = threadIdx.x & 31;
  const bool is_q = head < p.num_heads;
  const int64_t d_len = p.head_dim, half = p.rotary_dim / 2;
  const int64_t q_dim = p.num_heads * d_len, kv_dim = p.num_kv_heads * d_len;
  const int64_t col = head * d_len;
  T* row = static_cast<T*>(p.qkv) + t * p.qkv_stride;
  const float* norm = is_q ? p.q_norm : p.k_norm;
  if (norm != nullptr) {
    float ss = 0.0f;
    for (int64_t d = lane; d < d_len; d += 32) ss += x[d] * x[d];
    const float inv = rsqrtf(WarpSum(ss) / static_cast<float>(d_len) + p.norm_eps);
    for (int64_t d = lane; d < d_len; d += 32) x[d] = x[d] * inv * norm[d];
  }
  __syncwarp();
  // Reads come from shared memory, so q can be written back in place at once.
  const int64_t slot = p.slot_mapping[t];
  const int64_t kv_at = is_q ? 0 : slot * kv_dim + (col - q_dim);
  for (int64_t d = lane; d < d_len; d += 32) {
    float v = x[d];
    if (d < p.rotary_dim) {
      // Pair (a, b) with a the first element: interleaved (2i, 2i+1), else (i, i + half).
      const int64_t i = p.interleaved ? d / 2 : (d < half ? d : d - half);
      const bool first = p.interleaved ? (d % 2 == 0) : (d < half);
      const int64_t partner =
          p.interleaved ? (first ? d + 1 : d - 1) : (first ? d + half : d - half);
      const float c = cos_t[i], s = sin_t[i];
      v = first ? v * c - x[partner] * s : v * c + x[partner] * s;
    }
    if (is_q) {
      row[col + d] = FromFloat<T>(v);
    } else {
      StoreKv<T>(p, p.k_cache, kv_at + d, v, 1.0f / p.k_scale);
    }
  }
  if (!is_q) {
    const int64_t v_col = q_dim + kv_dim + (col - q_dim);
    for (int64_t d = lane; d < d_len; d += 32) {
      float v = ToFloat(row[v_col + d]);
      if (p.bias != nullptr) v += p.bias[v_col + d];
      StoreKv<T>(p, p.v_cache, kv_at + d, v, 1.0f / p.v_scale);
    }
  }
}

// One token a CTA (measured faster than CTAs looping over tokens), one warp per head: q heads
// first, then k heads, whose warps also copy v; kWarps heads a CTA.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32) QkvKernel(QkvParams p) {
  __shared__ float buf[kWarps][kMaxHeadDim];
  __shared__ float cos_t[kMaxHeadDim / 2], sin_t[kMaxHeadDim / 2];
  WaitForPrerequisites();
  AllowDependents();
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x >> 5;
  const int64_t head = static_cast<int64_t>(blockIdx.y) * kWarps + warp;
  // The token's rotation angles, once for all the heads of the CTA.
  const float pos = static_cast<float>(p.positions[t]);
  for (int64_t i = threadIdx.x; i < p.rotary_dim / 2; i += blockDim.x) {
    float sn, cs;
    sincosf(pos * p.inv_freq[i], &sn, &cs);
    cos_t[i] = cs * p.attention_scaling;
    sin_t[i] = sn * p.attention_scaling;
  }
  const bool valid = head < p.num_heads + p.num_kv_heads;
  if (valid) LoadHead<T>(p, t, head, buf[warp]);  // in flight with the angles
  __syncthreads();
  if (valid) FinishHead<T>(p, t, head, buf[warp], cos_t, sin_t);
}

}  // namespace

int QkvRopeKvWrite(const QkvParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  if (p.head_dim > kMaxHeadDim || p.rotary_dim > p.head_dim || p.rotary_dim % 2 != 0 ||
      (p.kv_fp8 && !(p.k_scale > 0.0f && p.v_scale > 0.0f))) {
    return cudaErrorInvalidValue;
  }
  const unsigned heads = static_cast<unsigned>(p.num_heads + p.num_kv_heads);
  const dim3 grid(static_cast<unsigned>(p.num_tokens), (heads + kWarps - 1) / kWarps);
  return DispatchFloat(p.dtype, [&](auto t) {
    using T = decltype(t);
    return LaunchDependent(QkvKernel<T>, grid, kWarps * 32, 0, static_cast<cudaStream_t>(stream),
                           p);
  });
}

}  // namespace dinfer::kernels::cuda
