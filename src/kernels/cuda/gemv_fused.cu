// The decode GEMV with its input staged in shared memory, and the op that makes that input fused
// in front of it (RMSNorm with the residual add, or SiLU·mul of the gate/up product): one kernel
// launch instead of two, and no round trip of the activations through global memory.
//
// Work split: the grid is a few CTAs per multiprocessor (for grouped products, the same number of
// CTAs per group); CTA j of a group owns rows [j * rows / ctas, (j + 1) * rows / ctas) of it, so
// the CTAs' shares differ by at most one row and there is no second wave. With ldw == k a CTA's
// weights are one contiguous run of bytes, read in chunks of 2,048 elements (256 threads x 8)
// through a ring of kStages chunks in shared memory filled by cp.async (64 KB in flight per CTA
// without holding registers). A row holds whole chunks (k a multiple of 2,048) or a chunk whole
// rows (k = 256, 512 or 1,024): either way each warp's 256 elements of a chunk lie in one row, and
// each warp reduces its share of a row into shared memory, where the CTA adds the shares in a
// fixed order (deterministic, and the same sums whatever the grid).
//
// The weights do not depend on the kernel before, so a CTA requests its first kStages chunks and
// asks L2 for the next l2_ahead ones (cp.async.bulk.prefetch.L2) before WaitForPrerequisites:
// under programmatic dependent launch these bytes stream in while that kernel finishes. In the
// loop, the L2 request runs l2_ahead chunks ahead of the ring, deepening the bytes in flight per
// CTA beyond what shared memory holds (kL2AheadBytes over the grid, well within the 50 MB L2).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mma.cuh"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kChunk = kThreads * 8;
constexpr int kStages = 16;  // chunks in flight per CTA (64 KB)
// Smaller rings, for more CTAs per multiprocessor where 16 chunks do not fit (explicit
// blocks_per_sm only).
constexpr int kSmallerStages[] = {12, 8};
// Measured in batch-1 decode of an 8B model on H200 (bench/gpu, graph replay): 1 CTA per
// multiprocessor 0.55 of the roofline, 2 0.76, 3 0.77.
constexpr int kDefaultBlocksPerSm = 3;
constexpr size_t kMaxSmem = 200 * 1024;
constexpr size_t kRingBytes = kStages * kChunk * 2;
// Bytes of weights requested into L2 ahead of the rings, over the whole grid, by default.
constexpr int64_t kL2AheadBytes = int64_t{24} << 20;
constexpr int kMaxL2AheadChunks = 64;
// RMSNorm inputs of up to this many elements are read once (kept in registers between the sum of
// squares and the scaling).
constexpr int kKeptK = 4 * kChunk;

__device__ __forceinline__ void LoadVec4x2(const float* p, float (&v)[8]) {
  const float4 lo = *reinterpret_cast<const float4*>(p);
  const float4 hi = *reinterpret_cast<const float4*>(p + 4);
  v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
  v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

struct StagedArgs {
  const bf16* x;
  int64_t ldx;
  const bf16* w;
  int64_t ldw;
  void* y;
  int64_t ldy;
  int n, k;
  int group_n;         // > 0: rows of group g (row / group_n) read x + g * k
  int group_rows;      // rows per group (n when not grouped)
  int ctas_per_group;  // the grid is groups x ctas_per_group CTAs
  int l2_ahead;        // chunks requested into L2 ahead of the ring
  int stages;          // chunks in the ring: kStages or one of kSmallerStages
  const float* residual;
  const bf16* add;
  const float* add_bias;
  const int32_t* rows_index;
  float* residual_out;
  const float* norm_weight;
  float eps, weight_offset;
};

// Writes the M input rows (k elements each, bf16 as the unfused ops would store them) to xs.
template <int M, GemvInput kIn>
__device__ __forceinline__ void StageInput(const StagedArgs& a, bf16* xs, int group) {
  const int t = threadIdx.x;
  if constexpr (kIn == GemvInput::kPlain) {
    // A CTA's rows lie in one group: its x columns start there.
    const bf16* x = a.x + (a.group_n > 0 ? static_cast<int64_t>(group) * a.k : 0);
    for (int i = t * 8; i < a.k; i += kChunk) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        *reinterpret_cast<uint4*>(xs + m * a.k + i) =
            *reinterpret_cast<const uint4*>(x + m * a.ldx + i);
      }
    }
  } else if constexpr (kIn == GemvInput::kSiluMul) {
    for (int i = t * 8; i < a.k; i += kChunk) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float g[8], u[8], o[8];
        LoadVec(a.x + m * a.ldx + i, g);
        LoadVec(a.x + m * a.ldx + a.k + i, u);
#pragma unroll
        for (int j = 0; j < 8; ++j) o[j] = g[j] / (1.0f + __expf(-g[j])) * u[j];
        StoreVec(xs + m * a.k + i, o);
      }
    }
  } else {
    __shared__ float warp_ss[kWarps][M];
    const float* rows[M];
    const bf16* adds[M];
    float* outs[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const int64_t i_row = a.rows_index != nullptr ? a.rows_index[m] : m;
      rows[m] = a.residual + i_row * a.k;
      adds[m] = a.add != nullptr ? a.add + i_row * a.k : nullptr;
      outs[m] =
          a.residual_out != nullptr && blockIdx.x == 0 ? a.residual_out + i_row * a.k : nullptr;
    }
    // x = residual (+ add + bias), 8 elements at a time.
    auto sum_at = [&](int m, int i, float(&v)[8]) {
      const float4 lo = *reinterpret_cast<const float4*>(rows[m] + i);
      const float4 hi = *reinterpret_cast<const float4*>(rows[m] + i + 4);
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
      v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
      if (adds[m] != nullptr) {
        float d[8];
        LoadVec(adds[m] + i, d);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] += d[j];
        if (a.add_bias != nullptr) {
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] += a.add_bias[i + j];
        }
      }
    };
    // The sums stay in registers between the two passes where a row fits (k <= kKeptK);
    // longer rows are summed again. Same order of additions either way.
    constexpr int kKept = kKeptK / kChunk;
    const bool keep = a.k <= kKeptK;
    float kept[M][kKept][8];
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      ss[m] = 0.0f;
      for (int i = t * 8, it = 0; i < a.k; i += kChunk, ++it) {
        float v[8];
        sum_at(m, i, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss[m] += v[j] * v[j];
        if (keep) {
#pragma unroll
          for (int q = 0; q < kKept; ++q) {
            if (q == it) {
#pragma unroll
              for (int j = 0; j < 8; ++j) kept[m][q][j] = v[j];
            }
          }
        }
        if (outs[m] != nullptr) {
          *reinterpret_cast<float4*>(outs[m] + i) = make_float4(v[0], v[1], v[2], v[3]);
          *reinterpret_cast<float4*>(outs[m] + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
        }
      }
      ss[m] = WarpSum(ss[m]);
      if ((t & 31) == 0) warp_ss[t >> 5][m] = ss[m];
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float total = 0.0f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) total += warp_ss[q][m];
      const float inv = rsqrtf(total / static_cast<float>(a.k) + a.eps);
      for (int i = t * 8, it = 0; i < a.k; i += kChunk, ++it) {
        float v[8], o[8];
        if (keep) {
#pragma unroll
          for (int q = 0; q < kKept; ++q) {
            if (q == it) {
#pragma unroll
              for (int j = 0; j < 8; ++j) v[j] = kept[m][q][j];
            }
          }
        } else {
          sum_at(m, i, v);
        }
        float wn[8];
        LoadVec4x2(a.norm_weight + i, wn);
#pragma unroll
        for (int j = 0; j < 8; ++j) o[j] = (v[j] * inv) * (wn[j] + a.weight_offset);
        StoreVec(xs + m * a.k + i, o);
      }
    }
  }
}

// Asks L2 for the bytes [begin, end) of w (16-byte aligned, a multiple of 16 bytes long).
__device__ __forceinline__ void PrefetchL2(const bf16* w, int64_t begin, int64_t end) {
  if (end <= begin) return;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(w + begin),
               "r"(static_cast<uint32_t>((end - begin) * 2))
               : "memory");
}

// Waits until at most stages - 1 of this thread's copy groups are pending.
__device__ __forceinline__ void CpAsyncWaitRing(int stages) {
  if (stages == 16) {
    CpAsyncWait<15>();
  } else if (stages == 12) {
    CpAsyncWait<11>();
  } else {
    CpAsyncWait<7>();
  }
}

// Registers for 3 CTAs per multiprocessor with one row (80 a thread); two rows need 2 CTAs' shared
// memory anyway for k >= 4,096.
template <int M, typename TOut, GemvInput kIn>
__global__ void __launch_bounds__(kThreads, M == 1 ? 3 : 2) GemvStagedKernel(StagedArgs a) {
  extern __shared__ uint4 smem[];
  const int stages = a.stages;
  bf16* ring = reinterpret_cast<bf16*>(smem);               // [stages, kChunk]
  bf16* xs = ring + stages * kChunk;                        // [M, k]
  float* partial = reinterpret_cast<float*>(xs + M * a.k);  // [rows of the CTA, shares, M]
  AllowDependents();
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  // This CTA's rows: an even share of its group's.
  const int group = blockIdx.x / a.ctas_per_group, j = blockIdx.x % a.ctas_per_group;
  const int row0 = group * a.group_rows +
                   static_cast<int>(static_cast<int64_t>(j) * a.group_rows / a.ctas_per_group);
  const int row1 = group * a.group_rows +
                   static_cast<int>(static_cast<int64_t>(j + 1) * a.group_rows / a.ctas_per_group);
  const int rows = row1 - row0;
  // Rows are contiguous (ldw == k): the CTA's weights are elems elements from wc, chunk c starts
  // c * kChunk elements in. Each thread copies, and later reads, its own 16 bytes of every chunk,
  // so the ring needs no barrier: waiting for its own copies is enough.
  const int64_t elems = static_cast<int64_t>(rows) * a.k;
  const int chunks = static_cast<int>((elems + kChunk - 1) / kChunk);
  const bf16* wc = a.w + static_cast<int64_t>(row0) * a.k;
  bf16* slot0 = ring + t * 8;
  auto issue = [&](int slot, int c) {  // chunk c into ring slot `slot`
    const int64_t e = static_cast<int64_t>(c) * kChunk + t * 8;
    const bool in = e < elems;  // else zeros, nothing read
    CpAsync16(slot0 + slot * kChunk, in ? wc + e : a.w, in);
    CpAsyncCommit();
  };
  auto prefetch = [&](int c) {  // chunk c into L2
    const int64_t b = static_cast<int64_t>(c) * kChunk;
    PrefetchL2(wc, b, min(elems, b + kChunk));
  };
  for (int c = 0; c < stages; ++c) issue(c, c);
  if (t < a.l2_ahead) prefetch(stages + t);
  WaitForPrerequisites();  // the input comes from the kernel before
  StageInput<M, kIn>(a, xs, group);
  __syncthreads();
  // A row's shares: one per warp for k >= kChunk, else k / 256 (the warps of a chunk on one row).
  const int shares = min(kWarps, a.k / 256), share = warp % shares;
  const int cpr = a.k >= kChunk ? a.k / kChunk : 1;  // chunks per row
  const int small_col = (t * 8) % a.k;               // k < kChunk: this thread's column
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  // Control flow costs no memory parallelism here: the bytes in flight are in the ring and L2.
  for (int c = 0, cc = 0, slot = 0; c < chunks; ++c) {
    CpAsyncWaitRing(stages);  // chunk c has landed
    const uint4 wv = *reinterpret_cast<const uint4*>(slot0 + slot * kChunk);
    issue(slot, c + stages);  // into the slot just read
    slot = slot + 1 == stages ? 0 : slot + 1;
    if (t == 0 && a.l2_ahead > 0 && c + stages + a.l2_ahead < chunks) {
      prefetch(c + stages + a.l2_ahead);
    }
    const int col = a.k >= kChunk ? cc * kChunk + t * 8 : small_col;
    float wf[8];
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 f = __bfloat1622float2(h[q]);
      wf[2 * q] = f.x;
      wf[2 * q + 1] = f.y;
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      LoadVec(xs + m * a.k + col, xf);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[m] += wf[q] * xf[q];
    }
    if (++cc < cpr) continue;
    cc = 0;
    // This warp's share of one row is complete (rows past the CTA's read zeros: dropped).
    const int row = static_cast<int>((static_cast<int64_t>(c) * kChunk + warp * 256) / a.k);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float sum = WarpSum(acc[m]);
      if (lane == 0 && row < rows) partial[(row * shares + share) * M + m] = sum;
      acc[m] = 0.0f;
    }
  }
  CpAsyncWait<0>();
  __syncthreads();
  for (int o = t; o < rows * M; o += kThreads) {
    const int r = o / M, m = o % M;
    float s = 0.0f;
    for (int q = 0; q < shares; ++q) s += partial[(r * shares + q) * M + m];
    static_cast<TOut*>(a.y)[m * a.ldy + row0 + r] = FromFloat<TOut>(s);
  }
}

int MultiprocessorCount() {
  static const int count = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  return count;
}

template <int M, typename TOut, GemvInput kIn>
cudaError_t LaunchStaged(StagedArgs a, int64_t m, int64_t n, int64_t k, int blocks_per_sm,
                         int l2_chunks, cudaStream_t stream) {
  auto kernel = GemvStagedKernel<M, TOut, kIn>;
  const size_t x_bytes = static_cast<size_t>(m * k * 2);
  const size_t row_bytes = static_cast<size_t>(std::min<int64_t>(kWarps, k / 256) * m * 4);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kMaxSmem));
  if (e != cudaSuccess) return e;
  const int64_t groups = a.group_n > 0 ? n / a.group_n : 1;
  const int64_t group_rows = n / groups;
  // CTAs per multiprocessor as asked, fewer where they do not fit at once (one wave, no tail).
  // Asked for explicitly, a smaller ring comes before fewer CTAs.
  int64_t per_group = 1;
  size_t smem = 0;
  int stages = kStages;
  bool done = false;
  for (int per_sm = blocks_per_sm > 0 ? blocks_per_sm : kDefaultBlocksPerSm; per_sm >= 1 && !done;
       --per_sm) {
    for (int st : {kStages, kSmallerStages[0], kSmallerStages[1]}) {
      if (st != kStages && blocks_per_sm <= 0) break;
      const size_t ring_bytes = static_cast<size_t>(st) * kChunk * 2;
      const int64_t max_rows = static_cast<int64_t>((kMaxSmem - ring_bytes - x_bytes) / row_bytes);
      const int64_t target = static_cast<int64_t>(MultiprocessorCount()) * per_sm;
      per_group = std::min(std::max<int64_t>(1, target / groups), group_rows);
      per_group = std::max(per_group, (group_rows + max_rows - 1) / max_rows);
      const int64_t most_rows = (group_rows + per_group - 1) / per_group;
      smem = ring_bytes + x_bytes + static_cast<size_t>(most_rows) * row_bytes;
      stages = st;
      int fits = 0;
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fits, kernel, kThreads, smem);
      if (e != cudaSuccess) return e;
      if (fits >= per_sm) {
        done = true;
        break;
      }
    }
  }
  a.stages = stages;
  const int64_t grid = groups * per_group;
  a.group_rows = static_cast<int>(group_rows);
  a.ctas_per_group = static_cast<int>(per_group);
  const int64_t ahead = l2_chunks >= 0 ? l2_chunks : kL2AheadBytes / (grid * kChunk * 2);
  a.l2_ahead = static_cast<int>(std::min<int64_t>(ahead, kMaxL2AheadChunks));
  return LaunchDependent(kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream,
                         a);
}

template <int M, typename TOut>
cudaError_t DispatchInput(const GemvFusedParams& p, const StagedArgs& a, cudaStream_t s) {
  const GemmParams& g = p.gemm;
  switch (p.input) {
    case GemvInput::kPlain:
      return LaunchStaged<M, TOut, GemvInput::kPlain>(a, g.m, g.n, g.k, p.blocks_per_sm,
                                                      p.l2_prefetch_chunks, s);
    case GemvInput::kRmsNorm:
      return LaunchStaged<M, TOut, GemvInput::kRmsNorm>(a, g.m, g.n, g.k, p.blocks_per_sm,
                                                        p.l2_prefetch_chunks, s);
    case GemvInput::kSiluMul:
      return LaunchStaged<M, TOut, GemvInput::kSiluMul>(a, g.m, g.n, g.k, p.blocks_per_sm,
                                                        p.l2_prefetch_chunks, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

bool GemvFusedSupports(const GemvFusedParams& p) {
  const GemmParams& g = p.gemm;
  if (g.in_dtype != DType::kBF16 || (g.out_dtype != DType::kBF16 && g.out_dtype != DType::kF32))
    return false;
  const bool k_ok = g.k % kChunk == 0 || (g.k >= 256 && kChunk % g.k == 0);
  if (g.m < 1 || g.m > kGemvFusedMaxRows || !k_ok || g.ldw != g.k || !Aligned16(g.w) || g.n < 1 ||
      g.n > (int64_t{1} << 30) || g.k > (int64_t{1} << 20)) {
    return false;
  }
  if (kRingBytes + static_cast<size_t>(g.m * g.k * 2 + kWarps * g.m * 4) > kMaxSmem) return false;
  if (p.l2_prefetch_chunks > kMaxL2AheadChunks) return false;
  if (g.group_n < 0 || (g.group_n > 0 && (p.input != GemvInput::kPlain || g.n % g.group_n != 0 ||
                                          g.ldx < g.n / g.group_n * g.k))) {
    return false;
  }
  switch (p.input) {
    case GemvInput::kPlain:
      return g.x != nullptr && g.ldx % 8 == 0 && Aligned16(g.x);
    case GemvInput::kSiluMul:
      return g.x != nullptr && g.ldx % 8 == 0 && g.ldx >= 2 * g.k && Aligned16(g.x);
    case GemvInput::kRmsNorm:
      return p.residual != nullptr && p.norm_weight != nullptr && Aligned16(p.residual) &&
             Aligned16(p.norm_weight) && (p.add == nullptr || Aligned16(p.add)) &&
             (p.residual_out == nullptr ||
              (p.add != nullptr && p.residual_out != p.residual && Aligned16(p.residual_out)));
  }
  return false;
}

int GemvFused(const GemvFusedParams& p, void* stream) {
  if (!GemvFusedSupports(p)) return cudaErrorInvalidValue;
  const GemmParams& g = p.gemm;
  StagedArgs a;
  a.x = static_cast<const bf16*>(g.x);
  a.ldx = g.ldx;
  a.w = static_cast<const bf16*>(g.w);
  a.ldw = g.ldw;
  a.y = g.y;
  a.ldy = g.ldy;
  a.n = static_cast<int>(g.n);
  a.k = static_cast<int>(g.k);
  a.group_rows = a.ctas_per_group = a.l2_ahead = a.stages = 0;  // set by LaunchStaged
  a.group_n = static_cast<int>(g.group_n);
  a.residual = p.residual;
  a.add = static_cast<const bf16*>(p.add);
  a.add_bias = p.add_bias;
  a.rows_index = p.rows_index;
  a.residual_out = p.residual_out;
  a.norm_weight = p.norm_weight;
  a.eps = p.eps;
  a.weight_offset = p.weight_offset;
  const auto s = static_cast<cudaStream_t>(stream);
  if (g.out_dtype == DType::kF32) {
    return g.m == 1 ? DispatchInput<1, float>(p, a, s) : DispatchInput<2, float>(p, a, s);
  }
  return g.m == 1 ? DispatchInput<1, bf16>(p, a, s) : DispatchInput<2, bf16>(p, a, s);
}

}  // namespace dinfer::kernels::cuda
