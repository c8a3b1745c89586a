// AttentionRows: one query token at a time (decode, and every token of f32 models). bf16 with
// head_dim 64 or 128 goes to the tensor-core kernel (attention_decode.cu); this one serves the
// rest (f32, other head sizes) on the CUDA cores. A CTA takes
// one token, one group of up to kGq query heads that share a KV head, and one split of the keys.
// Groups of kLanes lanes read one key row each with 16-byte loads (kLanes * kVec elements cover
// head_dim); each group keeps its own online-softmax state, merged through shared memory at the
// end, and splits are merged by a second kernel.
#include <algorithm>
#include <cfloat>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxSplits = kMaxAttentionSplits;

template <typename T, int kLanes, int kGq>
__global__ void __launch_bounds__(kThreads) RowsKernel(AttentionParams p) {
  constexpr int V = kVec<T>;
  constexpr int kGroups = kThreads / kLanes;
  constexpr int kDimMax = kLanes * V;
  constexpr int kUnroll = kGq >= 4 ? 2 : 4;
  __shared__ float sm_m[kGroups][kGq], sm_l[kGroups][kGq];
  __shared__ float sm_acc[kGroups][kGq][kDimMax];
  WaitForPrerequisites();
  AllowDependents();

  const int64_t row = blockIdx.x;
  const int64_t t = p.row_tokens != nullptr ? p.row_tokens[row] : row;
  const int64_t group_heads = p.num_heads / p.num_kv_heads;
  const int64_t chunks = (group_heads + kGq - 1) / kGq;
  const int64_t kvh = blockIdx.y / chunks;
  const int64_t h0 = kvh * group_heads + (blockIdx.y % chunks) * kGq;
  const int nh =
      static_cast<int>(min(static_cast<int64_t>(kGq), kvh * group_heads + group_heads - h0));
  const int split = blockIdx.z;
  const int D = static_cast<int>(p.head_dim);
  const int g = threadIdx.x / kLanes, gl = threadIdx.x % kLanes;
  const int d0 = gl * V;
  const bool active = d0 < D;

  const int64_t pos = p.positions[t];
  const PagedRows paged(
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq,
      static_cast<int>(p.block_size));
  const int64_t lo = p.sliding_window > 0 ? max(int64_t{0}, pos - p.sliding_window + 1) : 0;
  const int64_t hi = pos + 1;
  const int64_t chunk = (hi - lo + p.num_splits - 1) / p.num_splits;
  const int64_t s_lo = lo + split * chunk;
  const int64_t s_hi = min(hi, s_lo + chunk);
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;

  float q[kGq][V];
#pragma unroll
  for (int h = 0; h < kGq; ++h) {
    if (h < nh && active) {
      LoadVec(static_cast<const T*>(p.q) + t * p.q_stride + (h0 + h) * D + d0, q[h]);
#pragma unroll
      for (int i = 0; i < V; ++i) q[h][i] *= p.scale;
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) q[h][i] = 0.0f;
    }
  }
  float m[kGq], l[kGq], acc[kGq][V];
#pragma unroll
  for (int h = 0; h < kGq; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) acc[h][i] = 0.0f;
  }

  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);
  // The loop bounds are uniform across the CTA so that every lane reaches the shuffles.
  for (int64_t base = s_lo; base < s_hi; base += kGroups * kUnroll) {
    float kf[kUnroll][V], vf[kUnroll][V];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + u * kGroups + g;
      valid[u] = j < s_hi;
      if (valid[u] && active) {
        const int64_t off = paged.Slot(static_cast<int>(j)) * kv_dim + kvh * D + d0;
        LoadVec(k_cache + off, kf[u]);
        LoadVec(v_cache + off, vf[u]);
      } else {
#pragma unroll
        for (int i = 0; i < V; ++i) kf[u][i] = vf[u][i] = 0.0f;
      }
    }
#pragma unroll
    for (int h = 0; h < kGq; ++h) {
      float s[kUnroll];
      float mx = -INFINITY;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < V; ++i) dot += q[h][i] * kf[u][i];
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (p.softcap > 0.0f) dot = p.softcap * tanhf(dot / p.softcap);
        s[u] = valid[u] ? dot : -INFINITY;
        mx = fmaxf(mx, s[u]);
      }
      const float m_new = fmaxf(m[h], mx);
      if (m_new == -INFINITY) continue;
      const float corr = __expf(m[h] - m_new);
      l[h] *= corr;
#pragma unroll
      for (int i = 0; i < V; ++i) acc[h][i] *= corr;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float e = __expf(s[u] - m_new);
        l[h] += e;
#pragma unroll
        for (int i = 0; i < V; ++i) acc[h][i] += e * vf[u][i];
      }
      m[h] = m_new;
    }
  }

#pragma unroll
  for (int h = 0; h < kGq; ++h) {
    if (gl == 0) {
      sm_m[g][h] = m[h];
      sm_l[g][h] = l[h];
    }
#pragma unroll
    for (int i = 0; i < V; ++i) sm_acc[g][h][d0 + i] = acc[h][i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kGq * kDimMax; idx += kThreads) {
    const int h = idx / kDimMax, d = idx % kDimMax;
    if (h >= nh || d >= D) continue;
    float mx = -INFINITY;
    for (int gg = 0; gg < kGroups; ++gg) mx = fmaxf(mx, sm_m[gg][h]);
    float sum = 0.0f, o = 0.0f;
    if (mx != -INFINITY) {
      for (int gg = 0; gg < kGroups; ++gg) {
        const float w = __expf(sm_m[gg][h] - mx);
        sum += sm_l[gg][h] * w;
        o += sm_acc[gg][h][d] * w;
      }
    }
    const float val = sum > 0.0f ? o / sum : 0.0f;
    const int64_t head = h0 + h;
    if (p.num_splits == 1) {
      static_cast<T*>(p.out)[t * p.out_stride + head * D + d] = FromFloat<T>(val);
    } else {
      const int64_t cell = (row * p.num_heads + head) * p.num_splits + split;
      p.split_out[cell * D + d] = val;
      if (d == 0) {
        p.split_stats[cell * 2] = mx;
        p.split_stats[cell * 2 + 1] = sum;
      }
    }
  }
}

// Merges the splits of one (row, head): weights L_s * exp(M_s - M), the stats read by the first
// warp's lanes side by side.
template <typename T>
__global__ void MergeKernel(AttentionParams p) {
  WaitForPrerequisites();
  AllowDependents();
  const int64_t row = blockIdx.x, head = blockIdx.y;
  const int64_t t = p.row_tokens != nullptr ? p.row_tokens[row] : row;
  const int64_t base = (row * p.num_heads + head) * p.num_splits;
  __shared__ float w[kMaxSplits];
  __shared__ float total;
  if (threadIdx.x < 32) {
    const int n = static_cast<int>(p.num_splits);
    float m[kMaxSplits / 32], l[kMaxSplits / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      const int s = i * 32 + static_cast<int>(threadIdx.x);
      m[i] = s < n ? p.split_stats[(base + s) * 2] : -INFINITY;
      l[i] = s < n ? p.split_stats[(base + s) * 2 + 1] : 0.0f;
      mx = fmaxf(mx, m[i]);
    }
    mx = WarpMax(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      const int s = i * 32 + static_cast<int>(threadIdx.x);
      const float ws = m[i] == -INFINITY ? 0.0f : l[i] * __expf(m[i] - mx);
      if (s < n) w[s] = ws;
      sum += ws;
    }
    sum = WarpSum(sum);
    if (threadIdx.x == 0) total = sum;
  }
  __syncthreads();
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < p.num_splits; ++s) o += w[s] * p.split_out[(base + s) * p.head_dim + d];
    static_cast<T*>(p.out)[t * p.out_stride + head * p.head_dim + d] = FromFloat<T>(o * inv);
  }
}

template <typename T, int kLanes>
cudaError_t LaunchLanes(const AttentionParams& p, cudaStream_t stream) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  auto launch = [&](auto kernel, int gq) {
    const int64_t chunks = (group + gq - 1) / gq;
    const dim3 grid(static_cast<unsigned>(p.num_rows),
                    static_cast<unsigned>(p.num_kv_heads * chunks),
                    static_cast<unsigned>(p.num_splits));
    return LaunchDependent(kernel, grid, kThreads, 0, stream, p);
  };
  if (group == 1) return launch(RowsKernel<T, kLanes, 1>, 1);
  if (group == 2) return launch(RowsKernel<T, kLanes, 2>, 2);
  if (group <= 4) return launch(RowsKernel<T, kLanes, 4>, 4);
  return launch(RowsKernel<T, kLanes, 8>, 8);
}

}  // namespace

AttentionRowsShape AttentionRowsCtas(int64_t num_rows, DType dtype, int64_t head_dim, bool kv_fp8,
                                     int64_t num_heads, int64_t num_kv_heads) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return {};
  if (PrefillSupports(dtype, head_dim)) {
    return AttentionDecodeMmaShape(num_rows, head_dim, kv_fp8, num_heads, num_kv_heads);
  }
  // One CTA per KV head and group of up to 8 query heads (LaunchLanes).
  const int64_t group = num_heads / num_kv_heads;
  const int64_t gq = group <= 2 ? group : (group <= 4 ? 4 : 8);
  return {num_kv_heads * ((group + gq - 1) / gq), 2};
}

int64_t ChooseAttentionSplits(int64_t num_rows, const AttentionRowsShape& shape, int64_t max_keys,
                              int multiprocessors) {
  const int64_t ctas = std::max<int64_t>(1, num_rows * shape.ctas_per_row);
  // At most two CTAs an SM counted: the runner's split workspace holds 4 × SMs cells a head, and
  // rounding up below can add half again.
  const int64_t slots = std::clamp<int64_t>(shape.ctas_per_sm, 1, 2) * multiprocessors;
  // The nearest whole number of splits: a last wave that is mostly empty costs as much as a full
  // one.
  const int64_t want = (2 * slots + ctas) / (2 * ctas);
  // Short contexts are not split for a merge kernel: it costs more than the keys it would
  // spread. Merged in a cluster, a split is worth one tile of 64 keys.
  const int64_t merged = std::clamp<int64_t>(std::min(want, max_keys / 512), 1, kMaxSplits);
  const int64_t clustered = std::min({want, max_keys / 64, shape.cluster_splits});
  return clustered >= 2 && clustered >= merged ? clustered : merged;
}

int AttentionRows(const AttentionParams& p, void* stream) {
  if (p.num_rows == 0) return 0;
  if (p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.num_splits < 1 ||
      p.num_splits > kMaxSplits || (p.num_splits > 1 && p.split_out == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  return DispatchFloat(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec<T>;
    if (p.head_dim % V != 0 || p.head_dim > 32 * V) return cudaErrorInvalidValue;
    cudaError_t e;
    bool merged = false;
    if (p.kv_fp8 && !PrefillSupports(p.dtype, p.head_dim)) return cudaErrorInvalidValue;
    if (PrefillSupports(p.dtype, p.head_dim)) {
      e = AttentionDecodeMma(p, s, &merged);
    } else if (p.head_dim <= 4 * V) {
      e = LaunchLanes<T, 4>(p, s);
    } else if (p.head_dim <= 8 * V) {
      e = LaunchLanes<T, 8>(p, s);
    } else if (p.head_dim <= 16 * V) {
      e = LaunchLanes<T, 16>(p, s);
    } else {
      e = LaunchLanes<T, 32>(p, s);
    }
    if (e != cudaSuccess || p.num_splits == 1 || merged) return e;
    const dim3 grid(static_cast<unsigned>(p.num_rows), static_cast<unsigned>(p.num_heads));
    return LaunchDependent(MergeKernel<T>, grid, 128, 0, s, p);
  });
}

}  // namespace dinfer::kernels::cuda
