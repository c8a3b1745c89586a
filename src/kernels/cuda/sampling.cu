#include <cfloat>

#include <cooperative_groups.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.h"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
// Histogram copies per block (warp w adds to copy w % kCopies): fewer collisions on the hot
// bins of the radix passes.
constexpr int kCopies = 8;
constexpr int kBins = 256;
// Weights in [0, 1] as integers of 2^-44: a vocabulary of kMaxSampleVocab sums below 2^63.
constexpr double kFixedOne = 17592186044416.0;  // 2^44

using u64 = unsigned long long;

// (value, index) pairs ordered by value, then by the lower index.
__device__ __forceinline__ bool Better(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

// The warp's best (value, index) pair in every lane.
__device__ __forceinline__ void WarpArgmax(float& best, int32_t& best_i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(kFull, best, o);
    const int32_t i = __shfl_xor_sync(kFull, best_i, o);
    if (Better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
}

// Monotone map of logits to unsigned keys: larger logit, larger key. NaN counts as -inf and -0 as
// +0, so that keys order tokens as the CPU's comparisons do.
__device__ __forceinline__ uint32_t Key(float l) {
  if (isnan(l)) l = -INFINITY;
  if (l == 0.0f) l = 0.0f;
  const uint32_t b = __float_as_uint(l);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
constexpr uint32_t kNegInfKey = ~0xff800000u;  // Key(-inf)

// Scratch of the block reductions.
struct Reduce {
  float red_v[kWarps];
  int32_t red_i[kWarps];
  int32_t index;
};

struct Shared : Reduce {
  u64 hist[kCopies][kBins];
  u64 warp_sum[kWarps];
  // Results broadcast to the block.
  u64 above, cum, total;
  int32_t bin, found, warp;
};

// The block's argmax over tokens `eligible(i, v)` admits (NaN never); every thread gets it.
// INT32_MAX when nothing is eligible.
template <typename Eligible>
__device__ int32_t BlockArgmax(const float* row, int64_t vocab, Reduce& sh, Eligible eligible) {
  float best = -INFINITY;
  int32_t best_i = INT32_MAX;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    if (eligible(static_cast<int32_t>(i), v) && Better(v, static_cast<int32_t>(i), best, best_i)) {
      best = v;
      best_i = static_cast<int32_t>(i);
    }
  }
  WarpArgmax(best, best_i);
  if ((threadIdx.x & 31) == 0) {
    sh.red_v[threadIdx.x >> 5] = best;
    sh.red_i[threadIdx.x >> 5] = best_i;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    best = sh.red_v[threadIdx.x];
    best_i = sh.red_i[threadIdx.x];
    WarpArgmax(best, best_i);
    if (threadIdx.x == 0) sh.index = best_i;
  }
  __syncthreads();
  const int32_t result = sh.index;
  __syncthreads();
  return result;
}

__device__ int32_t RowArgmax(const float* row, int64_t vocab, Reduce& sh) {
  const int32_t i = BlockArgmax(row, vocab, sh, [](int32_t, float v) { return !isnan(v); });
  return i == INT32_MAX ? 0 : i;  // a row of NaN only still names a token
}

// The largest logit, NaN ignored (-inf when there is none).
__device__ float BlockMax(const float* row, int64_t vocab, Reduce& sh) {
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, row[i]);
  m = WarpMax(m);
  if ((threadIdx.x & 31) == 0) sh.red_v[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = WarpMax(sh.red_v[threadIdx.x]);
    if (threadIdx.x == 0) sh.red_v[0] = m;
  }
  __syncthreads();
  m = sh.red_v[0];
  __syncthreads();
  return m;
}

__device__ __forceinline__ u64 WarpInclusiveScan(u64 v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 n = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

__device__ __forceinline__ bool Crosses(u64 cum, u64 target, bool strict) {
  return strict ? cum > target : cum >= target;
}

// The tokens a walk visits: the whole row (token j is row[j]) or, for the sorted walks, a list
// of candidates in index order (their logits and token ids).
struct RowSource {
  const float* row;
  int64_t n;
  __device__ __forceinline__ float value(int64_t j) const { return row[j]; }
  __device__ __forceinline__ int32_t index(int64_t j) const { return static_cast<int32_t>(j); }
};
struct ListSource {
  const float* values;
  const int32_t* ids;
  int64_t n;
  __device__ __forceinline__ float value(int64_t j) const { return values[j]; }
  __device__ __forceinline__ int32_t index(int64_t j) const { return ids[j]; }
};

// Warp w's contiguous range [begin, end) of n entries, whole multiples of 32 but the last.
struct WarpRange {
  int64_t begin, end;
  __device__ explicit WarpRange(int64_t n) {
    const int64_t span = (n + kWarps * 32 - 1) / (kWarps * 32) * 32;
    begin = (threadIdx.x >> 5) * span;
    end = begin + span < n ? begin + span : n;
  }
};

struct Crossing {
  bool found;
  int32_t index;  // the first token (in the walk's order) at which the cumulative weight crosses
  u64 cum;        // the cumulative weight through that token
  u64 total;      // base + the weight of every token
  uint32_t key;   // SortedCrossing: the crossing token's key
};

// Walks the tokens in index order accumulating weight(i, l, key) from `base` and finds the first
// at which the sum crosses target_of(base + total weight) (> when strict, else >=). Warp w owns
// a contiguous range of the vocabulary, so one pass gives each range's sum and a second pass
// walks only the range that crosses.
template <typename Source, typename Weight, typename Target>
__device__ Crossing IndexCrossing(const Source& src, Shared& sh, Weight weight, u64 base,
                                  Target target_of, bool strict) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const WarpRange range(src.n);
  const int64_t begin = range.begin, end = range.end;
  u64 sum = 0;
  for (int64_t j = begin + lane; j < end; j += 32) {
    const float l = src.value(j);
    sum += weight(src.index(j), l, Key(l));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  if (lane == 0) sh.warp_sum[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    const u64 mine = sh.warp_sum[lane];
    const u64 incl = WarpInclusiveScan(mine);
    const u64 total = base + __shfl_sync(kFull, incl, 31);
    const u64 target = target_of(total);
    const unsigned crossing = __ballot_sync(kFull, Crosses(base + incl, target, strict));
    if (lane == 0) {
      sh.total = total;
      sh.found = crossing != 0;
      sh.warp = crossing != 0 ? __ffs(crossing) - 1 : -1;
      sh.above = target;  // the target, for the walk below
    }
    if (crossing != 0 && lane == __ffs(crossing) - 1) sh.cum = base + incl - mine;
  }
  __syncthreads();
  Crossing c{sh.found != 0, 0, 0, sh.total, 0};
  if (c.found && warp == sh.warp) {
    const u64 target = sh.above;
    u64 acc = sh.cum;  // the weight before this warp's range
    for (int64_t t = begin; t < end; t += 32) {
      const int64_t j = t + lane;
      u64 w = 0;
      int32_t i = 0;
      if (j < end) {
        const float l = src.value(j);
        i = src.index(j);
        w = weight(i, l, Key(l));
      }
      const u64 incl = acc + WarpInclusiveScan(w);
      const unsigned crossing = __ballot_sync(kFull, Crosses(incl, target, strict));
      if (crossing != 0) {
        if (lane == __ffs(crossing) - 1) {
          sh.index = i;
          sh.cum = incl;
        }
        break;
      }
      acc = __shfl_sync(kFull, incl, 31);
    }
  }
  __syncthreads();
  c.index = sh.index;
  c.cum = sh.cum;
  __syncthreads();
  return c;
}

// Walks the tokens in sorted order (logit descending, index ascending) accumulating
// weight(i, l, key) and finds the first at which the sum crosses `target`. Radix selection:
// four passes settle the crossing token's key eight bits at a time (a histogram of weight per
// digit among the tokens whose higher digits match), then tokens with exactly that key are
// walked in index order.
template <typename Source, typename Weight>
__device__ Crossing SortedCrossing(const Source& src, Shared& sh, Weight weight, u64 target,
                                   bool strict) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint32_t prefix = 0, mask = 0;
  u64 above = 0;  // weight of the tokens with larger keys
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kCopies * kBins; i += kThreads) (&sh.hist[0][0])[i] = 0;
    __syncthreads();
    u64* hist = sh.hist[warp % kCopies];
    for (int64_t j = threadIdx.x; j < src.n; j += kThreads) {
      const float l = src.value(j);
      const uint32_t k = Key(l);
      if ((k & mask) != prefix) continue;
      const u64 w = weight(src.index(j), l, k);
      if (w != 0) atomicAdd(&hist[(k >> shift) & (kBins - 1)], w);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane j owns bins 255 - 8j down to 248 - 8j: lanes in descending digit order.
      constexpr int kPer = kBins / 32;
      u64 bins[kPer];
      u64 mine = 0;
#pragma unroll
      for (int b = 0; b < kPer; ++b) {
        const int bin = kBins - 1 - lane * kPer - b;
        u64 s = 0;
#pragma unroll
        for (int c = 0; c < kCopies; ++c) s += sh.hist[c][bin];
        bins[b] = s;
        mine += s;
      }
      const u64 incl = WarpInclusiveScan(mine);
      const unsigned crossing = __ballot_sync(kFull, Crosses(above + incl, target, strict));
      if (lane == 0) sh.found = crossing != 0;
      if (crossing != 0 && lane == __ffs(crossing) - 1) {
        u64 acc = above + incl - mine;
#pragma unroll
        for (int b = 0; b < kPer; ++b) {
          if (Crosses(acc + bins[b], target, strict)) {
            sh.bin = kBins - 1 - lane * kPer - b;
            sh.above = acc;
            break;
          }
          acc += bins[b];
        }
      }
    }
    __syncthreads();
    const bool found = sh.found != 0;
    if (found) {
      prefix |= static_cast<uint32_t>(sh.bin) << shift;
      mask |= static_cast<uint32_t>(kBins - 1) << shift;
      above = sh.above;
    }
    __syncthreads();
    if (!found) return Crossing{false, 0, 0, 0, 0};
  }
  const uint32_t key = prefix;
  Crossing c = IndexCrossing(
      src, sh, [&](int32_t i, float l, uint32_t k) { return k == key ? weight(i, l, k) : u64{0}; },
      above, [&](u64) { return target; }, strict);
  c.key = key;
  return c;
}

// A prefix of the sorted order: the tokens up to and including (key, index).
struct Prefix {
  uint32_t key;
  int32_t index;
  __device__ __forceinline__ bool Holds(uint32_t k, int32_t i) const {
    return k > key || (k == key && i <= index);
  }
};

// Greedy choice of one row per cluster: CTA `rank` takes the rank-th slice of the row (runs of
// kArgmaxSliceAlign tokens, so that slices start 16-byte aligned when rows are), then rank 0
// combines the slices' (value, index) pairs through distributed shared memory. The order of
// Better makes the result independent of how the row is split.
constexpr int kArgmaxCluster = 8, kArgmaxThreads = 512, kArgmaxSliceAlign = 4;

__global__ void __cluster_dims__(kArgmaxCluster, 1, 1) __launch_bounds__(kArgmaxThreads)
    ArgmaxKernel(const float* logits, int64_t rows, int64_t vocab, int64_t stride, bool vec4,
                 int32_t* tokens) {
  namespace cg = cooperative_groups;
  __shared__ float red_v[kArgmaxThreads / 32];
  __shared__ int32_t red_i[kArgmaxThreads / 32];
  __shared__ float slice_v;
  __shared__ int32_t slice_i;
  WaitForPrerequisites();
  AllowDependents();
  cg::cluster_group cluster = cg::this_cluster();
  const auto rank = static_cast<int64_t>(cluster.block_rank());
  const int64_t per = (vocab + kArgmaxCluster * kArgmaxSliceAlign - 1) /
                      (kArgmaxCluster * kArgmaxSliceAlign) * kArgmaxSliceAlign;
  const int64_t begin = rank * per, end = begin + per < vocab ? begin + per : vocab;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* row = logits + r * stride;
    float best = -INFINITY;
    int32_t best_i = INT32_MAX;
    auto consider = [&](float v, int64_t i) {
      if (!isnan(v) && Better(v, static_cast<int32_t>(i), best, best_i)) {
        best = v;
        best_i = static_cast<int32_t>(i);
      }
    };
    int64_t i = begin + static_cast<int64_t>(threadIdx.x) * 4;
    if (vec4) {  // whole float4s of the slice, then its tail
      for (; i + 4 <= end; i += kArgmaxThreads * 4) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(row + i));
        consider(v.x, i);
        consider(v.y, i + 1);
        consider(v.z, i + 2);
        consider(v.w, i + 3);
      }
    }
    for (; i < end; i += kArgmaxThreads * 4) {
      for (int64_t j = i; j < i + 4 && j < end; ++j) consider(row[j], j);
    }
    WarpArgmax(best, best_i);
    if ((threadIdx.x & 31) == 0) {
      red_v[threadIdx.x >> 5] = best;
      red_i[threadIdx.x >> 5] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kArgmaxThreads / 32; ++w) {
        if (Better(red_v[w], red_i[w], best, best_i)) {
          best = red_v[w];
          best_i = red_i[w];
        }
      }
      slice_v = best;
      slice_i = best_i;
    }
    cluster.sync();
    if (rank == 0 && threadIdx.x == 0) {
      for (int c = 1; c < kArgmaxCluster; ++c) {
        const float v = *cluster.map_shared_rank(&slice_v, c);
        const int32_t b = *cluster.map_shared_rank(&slice_i, c);
        if (Better(v, b, best, best_i)) {
          best = v;
          best_i = b;
        }
      }
      tokens[r] = best_i == INT32_MAX ? 0 : best_i;  // a row of NaN only still names a token
    }
    cluster.sync();  // rank 0 has read the slices before they are overwritten or freed
  }
}

// Disallowed tokens of rows with a grammar mask get -inf.
__global__ void MaskKernel(SampleRowsParams p) {
  const SamplingRow& r = p.params[blockIdx.y];
  if (r.mask_offset < 0) return;
  float* row = p.logits + blockIdx.y * p.stride;
  const uint32_t* mask = p.masks + r.mask_offset;
  for (int64_t t = blockIdx.x * blockDim.x + threadIdx.x; t < p.vocab;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool allowed = t < r.mask_vocab && ((mask[t >> 5] >> (t & 31)) & 1u) != 0;
    if (!allowed) row[t] = -INFINITY;
  }
}

// Normalizer and top tokens of the (masked) logits, for rows that ask for logprobs.
__global__ void __launch_bounds__(kThreads) LogprobKernel(SampleRowsParams p) {
  const SamplingRow& r = p.params[blockIdx.x];
  if (r.logprobs < 0) return;
  __shared__ Reduce sh;
  __shared__ double partial[kWarps];
  const float* row = p.logits + blockIdx.x * p.stride;
  const float max_logit = BlockMax(row, p.vocab, sh);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float x = row[i];
    if (!isnan(x)) sum += static_cast<double>(expf(x - max_logit));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    sum = partial[threadIdx.x];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  }
  // Everything masked: every token reports -inf.
  const double norm = max_logit == -INFINITY ? INFINITY : static_cast<double>(max_logit) + log(sum);
  if (threadIdx.x == 0) p.log_norm[blockIdx.x] = norm;
  int n = r.logprobs < p.vocab ? r.logprobs : static_cast<int>(p.vocab);
  int32_t* top = p.top_tokens + blockIdx.x * kMaxSampleLogprobs;
  float* top_lp = p.top_logprobs + blockIdx.x * kMaxSampleLogprobs;
  float prev_v = INFINITY;
  int32_t prev_i = -1;
  for (int j = 0; j < kMaxSampleLogprobs; ++j) {
    int32_t best = INT32_MAX;
    if (j < n) {
      best = BlockArgmax(row, p.vocab, sh, [&](int32_t i, float v) {
        return !isnan(v) && (v < prev_v || (v == prev_v && i > prev_i));
      });
    }
    if (threadIdx.x == 0) {
      top[j] = best == INT32_MAX ? -1 : best;
      top_lp[j] =
          best == INT32_MAX ? -INFINITY : static_cast<float>(static_cast<double>(row[best]) - norm);
    }
    if (best == INT32_MAX) {
      n = j;  // nothing left: the rest stays empty
      prev_i = INT32_MAX;
    } else {
      prev_v = row[best];
      prev_i = best;
    }
  }
}

// Bias, bans and penalties of the listed tokens, one thread per token.
__global__ void AdjustKernel(SampleRowsParams p) {
  const SamplingRow& r = p.params[blockIdx.x];
  float* row = p.logits + blockIdx.x * p.stride;
  for (int32_t j = r.adjust_begin + static_cast<int32_t>(threadIdx.x); j < r.adjust_end;
       j += static_cast<int32_t>(blockDim.x)) {
    const TokenAdjustment a = p.adjustments[j];
    if (a.token < 0 || a.token >= p.vocab) continue;
    float l = row[a.token];
    p.saved[j] = l;
    for (uint32_t b = a.bias_begin; b < a.bias_end; ++b) l += p.biases[b];
    if (a.ban) l = -INFINITY;
    if (a.seen) {
      double d = l;
      if (r.repetition_penalty != 1.0) {
        d = d > 0 ? d / r.repetition_penalty : d * r.repetition_penalty;
      }
      if (a.count > 0) d -= r.presence_penalty + r.frequency_penalty * a.count;
      l = static_cast<float>(d);
    }
    row[a.token] = l;
  }
}

// Up to this many candidates are copied to shared memory for the sorted walks.
constexpr int kMaxCandidates = 3072;
// Candidates: the tokens with weight >= e^-kCandidateSpan (logit >= max - span * temperature),
// a prefix of the sorted order.
constexpr float kCandidateSpan = 12.0f;

struct Candidates {
  float values[kMaxCandidates];
  int32_t ids[kMaxCandidates];
};

// What a row's draw needs besides its logits.
struct Draw {
  float max_logit, inv_t;
  double u, min_p;
  __device__ __forceinline__ float WeightF(float l) const { return expf((l - max_logit) * inv_t); }
  // Fixed-point weight of a finite logit; 0 for -inf and NaN.
  __device__ __forceinline__ u64 Fixed(float l, uint32_t k) const {
    if (k <= kNegInfKey) return 0;
    return static_cast<u64>(__double2ll_rn(static_cast<double>(WeightF(l)) * kFixedOne));
  }
  __device__ __forceinline__ bool PassesMinP(float l) const {
    return min_p <= 0.0 || static_cast<double>(WeightF(l)) >= min_p;
  }
  __device__ __forceinline__ u64 Target(u64 total) const {
    const u64 t = static_cast<u64>(u * static_cast<double>(total));
    return t < total ? t : total - 1;
  }
};

__device__ __forceinline__ u64 TopPTarget(double top_p, u64 z) {
  const double t = ceil(top_p * static_cast<double>(z));
  return t < 1.0 ? 1 : static_cast<u64>(t);
}

// The draw in sorted order: top-k keeps a prefix, min-p a prefix of that, top-p a prefix of
// that; `src` holds every token of the final prefix (and, with top-k, the top-k tokens). z_all
// normalizes top-p without top-k. Returns -1 if nothing crosses (the caller falls back).
template <typename Source>
__device__ int32_t SampleSorted(const Source& src, const SamplingRow& r, int32_t top_k,
                                const Draw& d, u64 z_all, Shared& sh) {
  Prefix keep{kNegInfKey, -1};  // every finite token
  if (top_k > 0) {
    auto count = [](int32_t, float, uint32_t k) -> u64 { return k > kNegInfKey ? 1 : 0; };
    const Crossing c = SortedCrossing(src, sh, count, static_cast<u64>(top_k), false);
    if (c.found) keep = Prefix{c.key, c.index};
  }
  auto kept = [&](int32_t i, float l, uint32_t k) -> u64 {
    return keep.Holds(k, i) ? d.Fixed(l, k) : u64{0};
  };
  auto kept_min_p = [&](int32_t i, float l, uint32_t k) -> u64 {
    return keep.Holds(k, i) && d.PassesMinP(l) ? d.Fixed(l, k) : u64{0};
  };
  auto all = [](u64) { return ~u64{0}; };
  // z normalizes top-p: over the top-k tokens, or over the vocabulary.
  const u64 z = top_k > 0 ? IndexCrossing(src, sh, kept, 0, all, true).total : z_all;
  u64 total = 0;
  if (r.top_p < 1.0) {
    const Crossing c = SortedCrossing(src, sh, kept_min_p, TopPTarget(r.top_p, z), false);
    if (c.found) {
      keep = Prefix{c.key, c.index};
      total = c.cum;
    }
  }
  if (total == 0) total = IndexCrossing(src, sh, kept_min_p, 0, all, true).total;
  if (total == 0) return -1;
  const Crossing c = SortedCrossing(src, sh, kept_min_p, d.Target(total), true);
  return c.found ? c.index : -1;
}

__device__ int32_t SampleRow(const float* row, int64_t vocab, const SamplingRow& r, Shared& sh,
                             Candidates& cand) {
  const int32_t top_k = r.top_k > 0 && r.top_k < vocab ? r.top_k : 0;
  if (r.temperature <= 0.0 || r.top_k == 1) return RowArgmax(row, vocab, sh);
  Draw d;
  d.max_logit = BlockMax(row, vocab, sh);
  if (d.max_logit == -INFINITY || d.max_logit == INFINITY) return RowArgmax(row, vocab, sh);
  d.inv_t = static_cast<float>(1.0 / r.temperature);
  d.u = SamplingUniform(r.seed, r.step);
  d.min_p = r.min_p;
  const RowSource all_tokens{row, vocab};

  if (top_k == 0 && r.top_p >= 1.0) {
    // Index order over the tokens min-p keeps, as the CPU walks them.
    auto weight = [&](int32_t, float l, uint32_t k) -> u64 {
      return d.PassesMinP(l) ? d.Fixed(l, k) : u64{0};
    };
    const Crossing c = IndexCrossing(
        all_tokens, sh, weight, 0, [&](u64 total) { return d.Target(total); }, true);
    return c.found ? c.index : RowArgmax(row, vocab, sh);
  }

  // One pass: per warp range the candidates, and the weights of all tokens and of the
  // candidates min-p keeps.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float cut = d.max_logit - kCandidateSpan / d.inv_t;
  const WarpRange range(vocab);
  u64 z = 0, cand_mass = 0;
  uint32_t count = 0;
  for (int64_t i = range.begin + lane; i < range.end; i += 32) {
    const float l = row[i];
    const u64 w = d.Fixed(l, Key(l));
    z += w;
    if (l >= cut) {
      ++count;
      if (d.PassesMinP(l)) cand_mass += w;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    z += __shfl_xor_sync(kFull, z, o);
    cand_mass += __shfl_xor_sync(kFull, cand_mass, o);
    count += __shfl_xor_sync(kFull, count, o);
  }
  __shared__ uint32_t warp_count[kWarps];
  __shared__ u64 warp_z[kWarps], warp_mass[kWarps];
  if (lane == 0) {
    warp_count[warp] = count;
    warp_z[warp] = z;
    warp_mass[warp] = cand_mass;
  }
  __syncthreads();
  uint32_t offset = 0, candidates = 0;
  z = 0;
  cand_mass = 0;
  for (int w = 0; w < kWarps; ++w) {
    offset += w < warp ? warp_count[w] : 0;
    candidates += warp_count[w];
    z += warp_z[w];
    cand_mass += warp_mass[w];
  }
  // The candidates hold every token the walks need when top-k's tokens are among them, or
  // (without top-k) when the candidates min-p keeps reach top-p's mass.
  const bool fits =
      candidates <= kMaxCandidates && (top_k > 0 ? candidates >= static_cast<uint32_t>(top_k)
                                                 : cand_mass >= TopPTarget(r.top_p, z));
  int32_t token = -1;
  if (fits) {
    for (int64_t t = range.begin; t < range.end; t += 32) {
      const int64_t i = t + lane;
      const float l = i < range.end ? row[i] : -INFINITY;
      const bool take = i < range.end && l >= cut;
      const unsigned taken = __ballot_sync(kFull, take);
      if (take) {
        const uint32_t at = offset + __popc(taken & ((1u << lane) - 1));
        cand.values[at] = l;
        cand.ids[at] = static_cast<int32_t>(i);
      }
      offset += __popc(taken);
    }
    __syncthreads();
    token = SampleSorted(ListSource{cand.values, cand.ids, candidates}, r, top_k, d, z, sh);
  } else {
    token = SampleSorted(all_tokens, r, top_k, d, z, sh);
  }
  return token >= 0 ? token : RowArgmax(row, vocab, sh);
}

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleRowsParams p) {
  __shared__ Shared sh;
  __shared__ Candidates cand;
  const SamplingRow& r = p.params[blockIdx.x];
  const float* row = p.logits + blockIdx.x * p.stride;
  const int32_t token = SampleRow(row, p.vocab, r, sh, cand);
  if (threadIdx.x == 0) p.tokens[blockIdx.x] = token;
  if (r.logprobs < 0) return;
  // The chosen token's logit before bias and penalties.
  if (threadIdx.x == 0) sh.red_v[0] = row[token];
  __syncthreads();
  for (int32_t j = r.adjust_begin + static_cast<int32_t>(threadIdx.x); j < r.adjust_end;
       j += kThreads) {
    if (p.adjustments[j].token == token) sh.red_v[0] = p.saved[j];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    p.logprob[blockIdx.x] =
        static_cast<float>(static_cast<double>(sh.red_v[0]) - p.log_norm[blockIdx.x]);
  }
}

}  // namespace

int ArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int64_t stride, int32_t* tokens,
               void* stream) {
  if (rows == 0) return 0;
  if (rows < 0 || vocab <= 0 || vocab > INT32_MAX || stride < vocab || logits == nullptr ||
      tokens == nullptr) {
    return cudaErrorInvalidValue;
  }
  const bool vec4 = stride % 4 == 0 && (reinterpret_cast<uintptr_t>(logits) & 15) == 0;
  return LaunchDependent(ArgmaxKernel,
                         dim3(kArgmaxCluster, static_cast<unsigned>(rows < 65535 ? rows : 65535)),
                         kArgmaxThreads, 0, static_cast<cudaStream_t>(stream), logits, rows, vocab,
                         stride, vec4, tokens);
}

int SampleRows(const SampleRowsParams& p, void* stream) {
  if (p.rows == 0) return 0;
  if (p.vocab <= 0 || p.vocab > kMaxSampleVocab) return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  const auto rows = static_cast<unsigned>(p.rows);
  if (p.any_mask) {
    const auto blocks = static_cast<unsigned>((p.vocab + 256 * 8 - 1) / (256 * 8));
    MaskKernel<<<dim3(blocks, rows), 256, 0, s>>>(p);
  }
  if (p.any_logprobs) LogprobKernel<<<rows, kThreads, 0, s>>>(p);
  if (p.num_adjustments > 0) AdjustKernel<<<rows, 128, 0, s>>>(p);
  SampleKernel<<<rows, kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace dinfer::kernels::cuda
