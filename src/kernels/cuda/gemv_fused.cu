// The decode GEMV with its input staged in shared memory, and the op that makes that input fused
// in front of it (RMSNorm with the residual add) or behind it (SiLU·mul of the gate/up product,
// below): one kernel launch instead of two, and no round trip of the activations through global
// memory.
//
// Work split: the grid is a few CTAs per multiprocessor; CTA b owns a contiguous range of
// ceil(n / grid) weight rows, so every CTA streams the same number of bytes (the last one fewer)
// whatever n is, with no second wave. A row is cut into chunks of 2,048 elements (256 threads ×
// 8); a CTA walks its rows chunk by chunk through a ring of kStages chunks in shared memory
// filled by cp.async (64 KB in flight per CTA without holding registers; an earlier version
// with loads into registers kept too few bytes in flight and read at 0.4-0.7 of the bandwidth).
// Since k is a multiple of the chunk, a chunk lies in one row: each warp reduces its share of a
// row into shared memory and the CTA adds the 8 shares in a fixed order (deterministic). The first
// batch of weights is requested before WaitForPrerequisites, while the kernel before still runs.
//
// e4m3 weights (GemvFusedParams::w_dtype): the ring holds bytes, so with the same 16-byte copies
// a chunk covers 4,096 weights (256 threads × 16) in the same 4 KB slot, and a row is cut into
// k / 4,096 such chunks plus, where k is an odd multiple of 2,048 (14,336), a half chunk that only
// the first 128 threads copy and read. The chunking depends on k alone, so every row's sum has
// the same order whatever the CTA count. The hardware widens e4m3 pairs to f16 (exact), then
// f32; the products with the bf16 inputs are exact in f32. Each row's sum is multiplied by its
// scale (w_scale, copied to shared memory by cp.async with the first chunk) before the output
// or the q/k/v epilogue. Per byte of weights that is about twice bf16's instructions (SASS,
// one-row kernel, rows of 4,096: 142 a thread's 16-byte chunk, bf16 71), and on an H200 the first
// version made an 8B model's batch-1 decode only 13% faster than bf16 weights (250 against 222
// tok/s): instruction issue, not memory, looked like the limit. So where a row is one chunk
// (k = 4,096) and m = 1, each thread keeps its 16 inputs in registers as f32 (no shared-memory
// reads or widening of inputs per row: 71 instructions a chunk, 105 with the q/k/v epilogue;
// the same results).
//
// The q/k/v epilogue (GemvQkvEpilogue): a CTA owns a range of LOGICAL rows, and logical row L
// reads physical weight row P(L), a permutation within each q and k head that makes the two rows
// of every rotary pair logical neighbours (2j, 2j + 1): for i = L % head_dim < rotary_dim in
// the halves layout (pairs (j, j + rotary_dim / 2)), P = head * head_dim + i / 2 + (i % 2) *
// rotary_dim / 2; interleaved pairs, dims past rotary_dim and v rows keep P = L. Ranges have an
// even number of rows, so a pair never straddles two CTAs, and one thread finishes a pair: bias,
// rotation, and the store of q to y or of k / v to the paged caches (physical columns).
//
// The SiLU·mul epilogue (GemvFusedParams::silu_pairs) pairs rows the same way: logical rows 2i
// and 2i + 1 read gate row i and up row inter + i of the [gate; up] matrix, and one thread turns
// the pair into SiLU(gate) · up, so the down projection's GEMV stages a plain copy of inter bf16
// values instead of computing SiLU·mul of 2 · inter values in each of its CTAs (on an H200, 8B
// shape, batch 1: 4.52 -> 4.44 ms a decode step). The RMSNorm's weights (and the add's bias),
// which the kernel before does not write, are requested into L1 before the wait.
//
// Instruction issue also bounds bf16 weights once a CTA's ring has filled (the trace of one 8B
// layer shows each GEMV draining its ring after the wait): with one input row of at most two
// chunks (k <= 4,096: q/k/v, o, gate/up, the head) each thread keeps its 8 or 16 inputs in
// registers as f32, and ring slots are found by mask: 43 instructions a chunk against 58 (same
// values and order of additions). H200, 8B shape, batch 1: 4.45 -> 4.22 ms a decode step. The
// same products on the tensor cores (8-row groups as mma's B operand, a 4-stage ring per warp:
// 26 instructions per 512 B) measured 5.67 ms and were not kept.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/trace.cuh"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kChunk = kThreads * 8;
constexpr int kStages = 16;  // chunks in flight per CTA (64 KB)
// CTAs per multiprocessor by default, measured in batch-1 decode of an 8B model on H200 (bench/gpu,
// graph replay). e4m3 weights: 1 CTA 0.55 of the roofline, 2 0.76, 3 0.77 (with bf16 too before
// the register path). bf16 since the register path: 2 in the q/k/v, o and gate/up GEMVs 4.182 ms
// a step against 4.210 with 3 (three alternating runs each); the head and the down GEMV are
// within noise either way (the down GEMV's staged input leaves room for 2 only).
constexpr int kDefaultBlocksPerSmBf16 = 2, kDefaultBlocksPerSmFp8 = 3;
constexpr size_t kMaxSmem = 200 * 1024;
constexpr size_t kRingBytes = kStages * kChunk * 2;
// RMSNorm inputs of up to this many elements are read once (kept in registers between the sum of
// squares and the scaling).
constexpr int kKeptK = 4 * kChunk;

__device__ __forceinline__ void LoadVec4x2(const float* p, float (&v)[8]) {
  const float4 lo = *reinterpret_cast<const float4*>(p);
  const float4 hi = *reinterpret_cast<const float4*>(p + 4);
  v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
  v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

// 8 bf16 (one 16-byte word) as f32, exactly: the bits shifted up (what LoadVec computes, in
// fewer instructions than its bf16x2 conversions in these loops).
__device__ __forceinline__ void Bf16x8ToFloat(const uint4 u, float (&out)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// The e4m3 pair in the low (kHigh: high) 16 bits of `word` as f32, exactly (e4m3 → f16 → f32).
template <bool kHigh>
__device__ __forceinline__ float2 E4M3PairToFloat2(uint32_t word) {
  const uint32_t h = E4M3x2ToHalf2<kHigh>(word);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

struct StagedArgs {
  const bf16* x;
  int64_t ldx;
  const bf16* w;  // kFp8 kernels: e4m3 bytes
  int64_t ldw;
  void* y;
  int64_t ldy;
  int n, k, rows_per_block;
  int group_n;  // > 0: rows of group g (row / group_n) read x + g * k
  const float* residual;
  const bf16* add;
  const float* add_bias;
  const int32_t* rows_index;
  float* residual_out;
  const float* norm_weight;
  float eps, weight_offset;
  // The q/k/v epilogue (kernels with kQkv only).
  struct Qkv {
    int head_dim, q_dim, kv_dim, rotary_dim;
    bool interleaved, kv_fp8;
    float attention_scaling, k_scale, v_scale;
    const float* bias;
    const int32_t* positions;
    const float* inv_freq;
    void* k_cache;
    void* v_cache;
    const int64_t* slot_mapping;
  } qkv;
  const float* w_scale;  // kFp8 kernels: [n]
};

// The physical weight row of dim `dim` of the head that starts at logical row `head`, under the
// q/k/v epilogue (see the header comment).
__device__ __forceinline__ int QkvRowAt(const StagedArgs::Qkv& q, int head, int dim) {
  if (q.interleaved || dim >= q.rotary_dim || head >= q.q_dim + q.kv_dim) return head + dim;
  return head + (dim >> 1) + (dim & 1) * (q.rotary_dim >> 1);
}

// The physical weight row of logical row l.
__device__ __forceinline__ int QkvRow(const StagedArgs::Qkv& q, int l) {
  const int dim = l % q.head_dim;
  return QkvRowAt(q, l - dim, dim);
}

// The SiLU·mul epilogue's rows: logical rows 2i and 2i + 1 are physical rows i (gate) and
// n / 2 + i (up) of the [gate; up] matrix.
__device__ __forceinline__ int SiluPairRow(int n, int l) { return (l >> 1) + (l & 1) * (n >> 1); }

enum class Epilogue { kNone, kQkv, kSiluPairs };

// What the epilogue of logical rows (l, l + 1) of token m reads from global memory; loaded before
// the product, so that the loads' latency hides behind it instead of adding to the kernel's tail.
struct QkvPairInputs {
  float position, inv_freq, bias0, bias1;
  int64_t slot;
};

__device__ __forceinline__ QkvPairInputs LoadQkvPair(const StagedArgs& a, int m, int l) {
  const StagedArgs::Qkv& q = a.qkv;
  QkvPairInputs in{0.0f, 0.0f, 0.0f, 0.0f, 0};
  if (q.bias != nullptr) {
    in.bias0 = q.bias[QkvRow(q, l)];
    in.bias1 = q.bias[QkvRow(q, l + 1)];
  }
  if (l < q.q_dim + q.kv_dim && l % q.head_dim < q.rotary_dim) {
    in.position = static_cast<float>(q.positions[m]);
    in.inv_freq = q.inv_freq[(l % q.head_dim) >> 1];
  }
  if (l >= q.q_dim) in.slot = q.slot_mapping[m];
  return in;
}

// The epilogue for logical rows (l, l + 1) of token m with f32 sums (s0, s1).
__device__ __forceinline__ void QkvFinishPair(const StagedArgs& a, int m, int l, float s0, float s1,
                                              const QkvPairInputs& in) {
  const StagedArgs::Qkv& q = a.qkv;
  const int p0 = QkvRow(q, l), p1 = QkvRow(q, l + 1);
  if (q.bias != nullptr) {
    s0 += in.bias0;
    s1 += in.bias1;
  }
  const bool is_v = l >= q.q_dim + q.kv_dim;
  const int i = l % q.head_dim;  // even: head_dim is even and l is even
  if (!is_v && i < q.rotary_dim) {
    // Angles and pair convention as QkvKernel (qkv.cu): (a, b) -> (a c - b s, b c + a s).
    float sn, cs;
    sincosf(in.position * in.inv_freq, &sn, &cs);
    const float c = cs * q.attention_scaling, sv = sn * q.attention_scaling;
    const float first = s0 * c - s1 * sv;
    const float second = s1 * c + s0 * sv;
    s0 = first;
    s1 = second;
  }
  if (l < q.q_dim) {
    bf16* y = static_cast<bf16*>(a.y) + static_cast<int64_t>(m) * a.ldy;
    y[p0] = FromFloat<bf16>(s0);
    y[p1] = FromFloat<bf16>(s1);
    return;
  }
  const int col = is_v ? q.q_dim + q.kv_dim : q.q_dim;
  const int64_t at = in.slot * q.kv_dim - col;
  void* cache = is_v ? q.v_cache : q.k_cache;
  if (q.kv_fp8) {
    const float inv_scale = 1.0f / (is_v ? q.v_scale : q.k_scale);
    static_cast<uint8_t*>(cache)[at + p0] = ToE4M3(s0 * inv_scale);
    static_cast<uint8_t*>(cache)[at + p1] = ToE4M3(s1 * inv_scale);
  } else {
    static_cast<bf16*>(cache)[at + p0] = FromFloat<bf16>(s0);
    static_cast<bf16*>(cache)[at + p1] = FromFloat<bf16>(s1);
  }
}

// The RMSNorm input's constants (its weights, and the bias of the add) belong to the model, not
// to the kernel before: each thread asks for its share in L1 before the wait, so that the staging
// after it reads them at L1 latency rather than another trip to L2 behind the reduction.
template <GemvInput kIn>
__device__ __forceinline__ void PrefetchNormConstants(const StagedArgs& a) {
  if constexpr (kIn == GemvInput::kRmsNorm) {
    for (int i = static_cast<int>(threadIdx.x) * 8; i < a.k; i += kChunk) {
      asm volatile("prefetch.global.L1 [%0];" ::"l"(a.norm_weight + i));
      if (a.add_bias != nullptr) asm volatile("prefetch.global.L1 [%0];" ::"l"(a.add_bias + i));
    }
  }
}

// Writes the M input rows (k elements each, bf16 as the unfused ops would store them) to xs.
template <int M, GemvInput kIn>
__device__ __forceinline__ void StageInput(const StagedArgs& a, bf16* xs, int row0) {
  const int t = threadIdx.x;
  if constexpr (kIn == GemvInput::kPlain) {
    // A CTA's rows lie in one group (LaunchStaged): its x columns start there.
    const bf16* x = a.x + (a.group_n > 0 ? static_cast<int64_t>(row0 / a.group_n) * a.k : 0);
    for (int i = t * 8; i < a.k; i += kChunk) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        *reinterpret_cast<uint4*>(xs + m * a.k + i) =
            *reinterpret_cast<const uint4*>(x + m * a.ldx + i);
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

// CTAs per multiprocessor the kernel is compiled to fit at once: 3 for one row (at most 80
// registers a thread; the plain kernel took 88 unbounded, so only 2 fit), 2 for two.
template <int M, typename TOut, GemvInput kIn, Epilogue kEpi, bool kFp8>
__global__ void __launch_bounds__(kThreads, M == 1 ? 3 : 2) GemvStagedKernel(StagedArgs a) {
  constexpr bool kQkv = kEpi == Epilogue::kQkv, kSilu = kEpi == Epilogue::kSiluPairs;
  constexpr bool kPermuted = kQkv || kSilu;  // logical rows read permuted physical rows
  extern __shared__ uint4 smem[];
  bf16* ring = reinterpret_cast<bf16*>(smem);               // [kStages, kChunk]
  bf16* xs = ring + kStages * kChunk;                       // [M, k]
  float* partial = reinterpret_cast<float*>(xs + M * a.k);  // [rows_per_block, kWarps, M]
  // kFp8: the scales of the CTA's (logical) rows, [rows_per_block].
  float* row_scale = partial + a.rows_per_block * kWarps * M;
  CtaTrace trace(kTraceGemv | (M == 2 ? kTraceGemvRows2 : 0u) |
                 (kIn == GemvInput::kRmsNorm ? kTraceGemvNorm : 0u) | (kQkv ? kTraceGemvQkv : 0u) |
                 (kSilu ? kTraceGemvSiluPairs : 0u) | (kFp8 ? kTraceFp8 : 0u) |
                 (std::is_same_v<TOut, float> ? kTraceGemvF32Out : 0u));
  AllowDependents();
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const int row0 = blockIdx.x * a.rows_per_block;
  const int rows = max(0, min(a.n, row0 + a.rows_per_block) - row0);
  // Weights a chunk covers (16 bytes a thread); kFp8 rows may end in a half chunk.
  constexpr int kChunkW = kFp8 ? 2 * kChunk : kChunk;
  const int cpr = kFp8 ? (a.k + kChunkW - 1) / kChunkW : a.k / kChunk;  // chunks per row
  const bool half_tail = kFp8 && a.k % kChunkW != 0;
  const int chunks = rows * cpr;
  // Rows are contiguous (ldw == k): chunk c of this CTA starts c * kChunk elements in. Each
  // thread copies, and later reads, its own 16 bytes of every chunk, so the ring needs no
  // barrier: waiting for its own copies is enough.
  const bf16* wb = a.w + static_cast<int64_t>(row0) * a.k + t * 8;
  bf16* slot0 = ring + t * 8;
  // kPermuted: chunks are issued in order of c, so the logical row of the next one is tracked
  // (kQkv: its dim `dim` within the head starting at logical row `head`; kSilu: the row `lrow`;
  // chunk `in_row` of it) instead of found by divisions, and `src` is the thread's 16 bytes of it
  // in its physical row. Past the last chunk, src stays on the last one (issued with nothing to
  // read).
  // kFp8: chunks are tracked the same way with or without the epilogue (a half chunk ends some
  // rows): src8 is the thread's 16 bytes of the next chunk, chunk `in_row` of its row.
  int head = 0, dim = 0, lrow = 0, in_row = 0;
  const bf16* src = nullptr;
  const uint8_t* w8 = reinterpret_cast<const uint8_t*>(a.w);
  const uint8_t* src8 = nullptr;
  const int next_row_step = a.k - (cpr - 1) * kChunkW;  // last chunk's start to the next row's
  // The thread's 16 bytes of the first chunk of the current logical row (kPermuted), in `base`'s
  // units.
  auto row_start = [&](auto* base, int thread_offset) {
    const int physical = kSilu ? SiluPairRow(a.n, lrow) : QkvRowAt(a.qkv, head, dim);
    return base + static_cast<int64_t>(physical) * a.k + thread_offset;
  };
  // Moves `at` from chunk c to chunk c + 1: `along` elements further in its row, or to the next
  // logical row's first chunk (`to_next_row` further when the rows are not permuted).
  auto advance = [&](auto*& at, auto* base, int thread_offset, int along, int to_next_row) {
    if (++in_row < cpr) {
      at += along;
      return;
    }
    in_row = 0;
    if constexpr (kQkv) {
      if (++dim == a.qkv.head_dim) {
        dim = 0;
        head += a.qkv.head_dim;
      }
      at = row_start(base, thread_offset);
    } else if constexpr (kSilu) {
      ++lrow;
      at = row_start(base, thread_offset);
    } else {
      at += to_next_row;
    }
  };
  if constexpr (kPermuted) {
    dim = kQkv ? row0 % a.qkv.head_dim : 0;
    head = row0 - dim;
    lrow = row0;
    if constexpr (kFp8) {
      src8 = row_start(w8, t * 16);
    } else {
      src = row_start(a.w, t * 8);
    }
  } else if constexpr (kFp8) {
    src8 = w8 + static_cast<int64_t>(row0) * a.k + t * 16;
  }
  if constexpr (kFp8) {
    // The rows' scales travel with the first chunk (its group), 4 bytes a row.
    for (int r = t; r < rows; r += kThreads) {
      const int p = kQkv ? QkvRow(a.qkv, row0 + r) : kSilu ? SiluPairRow(a.n, row0 + r) : row0 + r;
      CpAsync4(row_scale + r, a.w_scale + p);
    }
  }
  auto issue = [&](int c) {
    const bool in = c < chunks;
    if constexpr (kFp8) {
      // In a half chunk the last 128 threads copy nothing; their address (unread) stays in the
      // row.
      const bool idle = half_tail && in_row == cpr - 1 && t >= kThreads / 2;
      CpAsync16(slot0 + (c & (kStages - 1)) * kChunk, idle ? src8 - kChunk : src8, in && !idle);
      if (c + 1 < chunks) advance(src8, w8, t * 16, kChunkW, next_row_step);
    } else if constexpr (kPermuted) {
      CpAsync16(slot0 + (c & (kStages - 1)) * kChunk, src, in);
      if (c + 1 < chunks) advance(src, a.w, t * 8, kChunk, kChunk);
    } else {
      CpAsync16(slot0 + (c & (kStages - 1)) * kChunk,
                wb + static_cast<int64_t>(in ? c : 0) * kChunk, in);
    }
    CpAsyncCommit();
  };
#pragma unroll
  for (int c = 0; c < kStages; ++c) issue(c);
  PrefetchNormConstants<kIn>(a);
  WaitForPrerequisites();  // the input comes from the kernel before
  trace.Waited();
  QkvPairInputs first_pair{};  // kQkv: the epilogue's inputs of this thread's first pair
  if constexpr (kQkv) {
    if (t < rows / 2 * M) first_pair = LoadQkvPair(a, t % M, row0 + t / M * 2);
  }
  StageInput<M, kIn>(a, xs, row0);
  __syncthreads();
  trace.Mark();
  // Control flow costs no memory parallelism here: the bytes in flight are in the ring.
  if constexpr (kFp8) {
    // 16 weights of a chunk (`words`) times the thread's 16 inputs x(j) of one input row, added
    // to acc in order.
    auto dot16 = [&](const uint4& wv, float& acc, auto x) {
      const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float wf[8];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float2 lo = E4M3PairToFloat2<false>(words[2 * h + i]);
          const float2 hi = E4M3PairToFloat2<true>(words[2 * h + i]);
          wf[4 * i] = lo.x;
          wf[4 * i + 1] = lo.y;
          wf[4 * i + 2] = hi.x;
          wf[4 * i + 3] = hi.y;
        }
        float xf[8];
        x(h, xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += wf[j] * xf[j];
      }
    };
    bool done = false;
    if constexpr (M == 1) {
      if (a.k == kChunkW) {
        // One chunk a row (k = 4,096) and one input row: the thread's 16 inputs are the same in
        // every row, so they stay in registers as f32 (the same values and order of additions
        // as reading them from xs for each row), and chunk c is row c.
        float xk[2][8];
        Bf16x8ToFloat(*reinterpret_cast<const uint4*>(xs + t * 16), xk[0]);
        Bf16x8ToFloat(*reinterpret_cast<const uint4*>(xs + t * 16 + 8), xk[1]);
        for (int r = 0; r < rows; ++r) {
          CpAsyncWait<kStages - 1>();  // chunk r has landed
          const uint4 wv = *reinterpret_cast<const uint4*>(slot0 + (r & (kStages - 1)) * kChunk);
          if constexpr (kPermuted) {
            issue(r + kStages);  // into the slot just read
          } else {
            // As issue(), for rows of one whole chunk: the next chunk is the next 4 KB.
            const int c = r + kStages;
            CpAsync16(slot0 + (c & (kStages - 1)) * kChunk, src8, c < chunks);
            if (c + 1 < chunks) src8 += kChunkW;
            CpAsyncCommit();
          }
          float acc = 0.0f;
          dot16(wv, acc, [&](int h, float(&xf)[8]) {
#pragma unroll
            for (int j = 0; j < 8; ++j) xf[j] = xk[h][j];
          });
          const float sum = WarpSum(acc);
          if (lane == 0) partial[r * kWarps + warp] = sum;
        }
        done = true;
      }
    }
    if (!done) {
      for (int r = 0, c = 0; r < rows; ++r) {
        float acc[M];
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m] = 0.0f;
        for (int cc = 0; cc < cpr; ++cc, ++c) {
          CpAsyncWait<kStages - 1>();  // chunk c has landed
          const uint4 wv = *reinterpret_cast<const uint4*>(slot0 + (c & (kStages - 1)) * kChunk);
          issue(c + kStages);  // into the slot just read
          // The half chunk ending a row: the first 128 threads' 2,048 weights.
          if (half_tail && cc == cpr - 1 && t >= kThreads / 2) continue;
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const bf16* xt = xs + m * a.k + cc * kChunkW + t * 16;
            dot16(wv, acc[m], [&](int h, float(&xf)[8]) { LoadVec(xt + 8 * h, xf); });
          }
        }
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float sum = WarpSum(acc[m]);
          if (lane == 0) partial[(r * kWarps + warp) * M + m] = sum;
        }
      }
    }
  } else {
    // One input row of at most two chunks (k <= 4,096): the thread's 8 or 16 inputs are the same
    // in every row, so they stay in registers as f32 (the same values and order of additions as
    // reading them from xs for each row).
    bool in_registers = false;
    if constexpr (M == 1) in_registers = cpr <= 2;
    if (in_registers) {
      float xk[2][8];
      LoadVec(xs + t * 8, xk[0]);
      if (cpr == 2) LoadVec(xs + kChunk + t * 8, xk[1]);
      for (int r = 0, c = 0; r < rows; ++r) {
        float acc = 0.0f;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          if (cc == cpr) break;
          CpAsyncWait<kStages - 1>();  // chunk c has landed
          const uint4 wv = *reinterpret_cast<const uint4*>(slot0 + (c & (kStages - 1)) * kChunk);
          issue(c + kStages);  // into the slot just read
          ++c;
          float wf[8];
          WidenBf16x8(wv, wf);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc += wf[j] * xk[cc][j];
        }
        const float sum = WarpSum(acc);
        if (lane == 0) partial[r * kWarps + warp] = sum;
      }
    }
    for (int r = 0, c = 0; r < rows && !in_registers; ++r) {
      float acc[M];
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] = 0.0f;
      for (int cc = 0; cc < cpr; ++cc, ++c) {
        CpAsyncWait<kStages - 1>();  // chunk c has landed
        const uint4 wv = *reinterpret_cast<const uint4*>(slot0 + (c & (kStages - 1)) * kChunk);
        issue(c + kStages);  // into the slot just read
        float wf[8];
        WidenBf16x8(wv, wf);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float xf[8];
          LoadVec(xs + m * a.k + cc * kChunk + t * 8, xf);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[m] += wf[j] * xf[j];
        }
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float sum = WarpSum(acc[m]);
        if (lane == 0) partial[(r * kWarps + warp) * M + m] = sum;
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();
  trace.Mark2();
  if constexpr (kPermuted) {
    // One thread a pair of logical rows (rows is even) and a token.
    for (int o = t; o < rows / 2 * M; o += kThreads) {
      const int r = o / M * 2, m = o % M;
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) {
        s0 += partial[(r * kWarps + q) * M + m];
        s1 += partial[((r + 1) * kWarps + q) * M + m];
      }
      if constexpr (kFp8) {
        s0 *= row_scale[r];
        s1 *= row_scale[r + 1];
      }
      if constexpr (kSilu) {
        // (gate, up) rounded to bf16 as the plain GEMV would store them, then SiLU(gate) · up as
        // SiluMul computes and rounds it.
        const float g = ToFloat(FromFloat<bf16>(s0)), u = ToFloat(FromFloat<bf16>(s1));
        static_cast<bf16*>(a.y)[m * a.ldy + (row0 + r) / 2] = FromFloat<bf16>(Silu(g) * u);
      } else {
        QkvFinishPair(a, m, row0 + r, s0, s1, o == t ? first_pair : LoadQkvPair(a, m, row0 + r));
      }
    }
  } else {
    for (int o = t; o < rows * M; o += kThreads) {
      const int r = o / M, m = o % M;
      float s = 0.0f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) s += partial[(r * kWarps + q) * M + m];
      if constexpr (kFp8) s *= row_scale[r];
      static_cast<TOut*>(a.y)[m * a.ldy + row0 + r] = FromFloat<TOut>(s);
    }
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

template <int M, typename TOut, GemvInput kIn, Epilogue kEpi, bool kFp8>
cudaError_t LaunchStaged(StagedArgs a, int64_t m, int64_t n, int64_t k, int blocks_per_sm,
                         cudaStream_t stream) {
  auto kernel = GemvStagedKernel<M, TOut, kIn, kEpi, kFp8>;
  const size_t x_bytes = kRingBytes + static_cast<size_t>(m * k * 2);
  // Partial sums of a row (and its scale with e4m3 weights).
  const size_t row_bytes = static_cast<size_t>(kWarps * m * 4 + (kFp8 ? 4 : 0));
  const int64_t max_rows = static_cast<int64_t>((kMaxSmem - x_bytes) / row_bytes);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kMaxSmem));
  if (e != cudaSuccess) return e;
  // CTAs per multiprocessor as asked, fewer where they do not fit at once (one wave, no tail).
  int64_t grid = 0, rows_per_block = 0;
  size_t smem = 0;
  const int default_per_sm = kFp8 ? kDefaultBlocksPerSmFp8 : kDefaultBlocksPerSmBf16;
  for (int per_sm = blocks_per_sm > 0 ? blocks_per_sm : default_per_sm; per_sm >= 1; --per_sm) {
    grid = std::min<int64_t>(n, static_cast<int64_t>(MultiprocessorCount()) * per_sm);
    rows_per_block = std::min((n + grid - 1) / grid, max_rows);
    // Grouped products: a CTA's rows stay in one group (rows_per_block divides group_n).
    while (a.group_n > 0 && a.group_n % rows_per_block != 0) --rows_per_block;
    // The epilogues: an even number of rows, so that rotary (or gate/up) pairs stay in one CTA.
    if (kEpi != Epilogue::kNone && rows_per_block % 2 != 0) {
      rows_per_block += rows_per_block + 1 <= max_rows ? 1 : -1;
    }
    grid = (n + rows_per_block - 1) / rows_per_block;
    smem = x_bytes + static_cast<size_t>(rows_per_block) * row_bytes;
    int fits = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fits, kernel, kThreads, smem);
    if (e != cudaSuccess) return e;
    if (fits >= per_sm) break;
  }
  a.rows_per_block = static_cast<int>(rows_per_block);
  return LaunchDependent(kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream,
                         a);
}

template <int M, typename TOut, Epilogue kEpi, bool kFp8>
cudaError_t DispatchInput(const GemvFusedParams& p, const StagedArgs& a, cudaStream_t s) {
  const GemmParams& g = p.gemm;
  const int per_sm = p.blocks_per_sm;
  switch (p.input) {
    case GemvInput::kPlain:
      return LaunchStaged<M, TOut, GemvInput::kPlain, kEpi, kFp8>(a, g.m, g.n, g.k, per_sm, s);
    case GemvInput::kRmsNorm:
      return LaunchStaged<M, TOut, GemvInput::kRmsNorm, kEpi, kFp8>(a, g.m, g.n, g.k, per_sm, s);
  }
  return cudaErrorInvalidValue;
}

template <int M, typename TOut, Epilogue kEpi = Epilogue::kNone>
cudaError_t DispatchWeights(const GemvFusedParams& p, const StagedArgs& a, cudaStream_t s) {
  return p.w_dtype == DType::kF8E4M3 ? DispatchInput<M, TOut, kEpi, true>(p, a, s)
                                     : DispatchInput<M, TOut, kEpi, false>(p, a, s);
}

bool QkvEpilogueSupported(const GemvFusedParams& p) {
  const GemvQkvEpilogue& q = *p.qkv;
  const GemmParams& g = p.gemm;
  if (g.out_dtype != DType::kBF16 || g.group_n != 0 || g.y == nullptr) return false;
  if (q.num_heads < 1 || q.num_kv_heads < 1 || q.head_dim < 2 || q.head_dim % 2 != 0 ||
      g.n != (q.num_heads + 2 * q.num_kv_heads) * q.head_dim) {
    return false;
  }
  if (g.m > 1 && g.ldy < q.num_heads * q.head_dim) return false;
  if (q.rotary_dim < 0 || q.rotary_dim % 2 != 0 || q.rotary_dim > q.head_dim) return false;
  if (q.rotary_dim > 0 && (q.positions == nullptr || q.inv_freq == nullptr)) return false;
  if (q.k_cache == nullptr || q.v_cache == nullptr || q.slot_mapping == nullptr) return false;
  return !q.kv_fp8 || (q.k_scale > 0.0f && q.v_scale > 0.0f);
}

}  // namespace

bool GemvFusedSupports(const GemvFusedParams& p) {
  const GemmParams& g = p.gemm;
  if (g.in_dtype != DType::kBF16 || (g.out_dtype != DType::kBF16 && g.out_dtype != DType::kF32))
    return false;
  if (g.m < 1 || g.m > kGemvFusedMaxRows || g.k % kChunk != 0 || g.ldw != g.k || !Aligned16(g.w) ||
      g.n < 1 || g.n > (int64_t{1} << 30) || g.k > (int64_t{1} << 20)) {
    return false;
  }
  const bool fp8 = p.w_dtype == DType::kF8E4M3;
  if ((!fp8 && p.w_dtype != DType::kBF16) || (fp8 && p.w_scale == nullptr)) return false;
  // One row of partial sums (and its scale) at least (two rows with an epilogue).
  const int64_t min_rows = p.qkv != nullptr || p.silu_pairs ? 2 : 1;
  if (kRingBytes +
          static_cast<size_t>(g.m * g.k * 2 + min_rows * (kWarps * g.m * 4 + (fp8 ? 4 : 0))) >
      kMaxSmem) {
    return false;
  }
  if (p.qkv != nullptr && !QkvEpilogueSupported(p)) return false;
  if (p.silu_pairs && (p.qkv != nullptr || g.out_dtype != DType::kBF16 || g.group_n != 0 ||
                       g.y == nullptr || g.n % 2 != 0 || (g.m > 1 && g.ldy < g.n / 2))) {
    return false;
  }
  if (g.group_n < 0 || (g.group_n > 0 && (p.input != GemvInput::kPlain || g.n % g.group_n != 0 ||
                                          g.ldx < g.n / g.group_n * g.k))) {
    return false;
  }
  switch (p.input) {
    case GemvInput::kPlain:
      return g.x != nullptr && g.ldx % 8 == 0 && Aligned16(g.x);
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
  a.w_scale = p.w_scale;
  a.y = g.y;
  a.ldy = g.ldy;
  a.n = static_cast<int>(g.n);
  a.k = static_cast<int>(g.k);
  a.rows_per_block = 0;
  a.group_n = static_cast<int>(g.group_n);
  a.residual = p.residual;
  a.add = static_cast<const bf16*>(p.add);
  a.add_bias = p.add_bias;
  a.rows_index = p.rows_index;
  a.residual_out = p.residual_out;
  a.norm_weight = p.norm_weight;
  a.eps = p.eps;
  a.weight_offset = p.weight_offset;
  a.qkv = {};
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.qkv != nullptr) {
    const GemvQkvEpilogue& q = *p.qkv;
    a.qkv.head_dim = static_cast<int>(q.head_dim);
    a.qkv.q_dim = static_cast<int>(q.num_heads * q.head_dim);
    a.qkv.kv_dim = static_cast<int>(q.num_kv_heads * q.head_dim);
    a.qkv.rotary_dim = static_cast<int>(q.rotary_dim);
    a.qkv.interleaved = q.interleaved;
    a.qkv.kv_fp8 = q.kv_fp8;
    a.qkv.attention_scaling = q.attention_scaling;
    a.qkv.k_scale = q.k_scale;
    a.qkv.v_scale = q.v_scale;
    a.qkv.bias = q.bias;
    a.qkv.positions = q.positions;
    a.qkv.inv_freq = q.inv_freq;
    a.qkv.k_cache = q.k_cache;
    a.qkv.v_cache = q.v_cache;
    a.qkv.slot_mapping = q.slot_mapping;
    return g.m == 1 ? DispatchWeights<1, bf16, Epilogue::kQkv>(p, a, s)
                    : DispatchWeights<2, bf16, Epilogue::kQkv>(p, a, s);
  }
  if (p.silu_pairs) {
    return g.m == 1 ? DispatchWeights<1, bf16, Epilogue::kSiluPairs>(p, a, s)
                    : DispatchWeights<2, bf16, Epilogue::kSiluPairs>(p, a, s);
  }
  if (g.out_dtype == DType::kF32) {
    return g.m == 1 ? DispatchWeights<1, float>(p, a, s) : DispatchWeights<2, float>(p, a, s);
  }
  return g.m == 1 ? DispatchWeights<1, bf16>(p, a, s) : DispatchWeights<2, bf16>(p, a, s);
}

}  // namespace dinfer::kernels::cuda
