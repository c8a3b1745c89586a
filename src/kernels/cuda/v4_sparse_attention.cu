// DeepSeek-V4 sparse attention (v4_sparse_attention.h): the window-key write, the tensor-core
// kernels for bf16 planes (wgmma at head_dim 512, mma.sync otherwise), the f32 kernel for the
// rest, and the merge of key splits.
//
// A token's key list is virtual: key k < nw is window position lo + k (lo = max(0, pos - window +
// 1), nw = pos - lo + 1), key nw + c is candidate c of the compressed entries (selected[t, c], or
// entry c itself without a selection); a -1 selection is a masked key. A split takes a contiguous
// range of that list (ranges rounded to whole tiles in the tensor-core kernel).
//
// Tensor-core kernel, warp (m, d) of 16: Q's rows 16m..16m+15 (64 heads of the CTA, staged in
// shared memory as bf16) by the key tile's dims [d·D/4, (d+1)·D/4) give a partial S (16 × 32); the
// four partials of a head tile are summed in a fixed order through shared memory, so the four
// warps of a head tile hold bit-identical scores and softmax states. P (bf16) times the tile's
// rows, in the warp's dim quarter, accumulates into its O (16 × D/4 f32 in registers). The mma
// fragment layout gives each thread adjacent dims (2i, 2i + 1): the rotary pairs.
//
// A CTA's critical path at decode: the first round's row lookup (one key a thread), its first
// tiles' cp.async, then Q and (fused write) the token's key while those are in flight. Split
// CTAs of one (token, head group) launched as a cluster end by storing their normalised partial
// O and (max, sum) in their own shared memory; after a cluster barrier CTA `rank` merges heads
// rank, rank + S, ... reading every split's partials through distributed shared memory in split
// order, then a second barrier keeps the shared memory alive until all have read it.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/v4_sparse_attention.h"

namespace dinfer::kernels::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxSplits = 64;
constexpr int kMaxHeadDim = 1024;
// Splits of the tensor-core kernel merged inside a thread-block cluster: up to 16 (a non-portable
// cluster size, which Hopper allows: one CTA an SM, 16 SMs of a GPC); fewer where they do not fit.
constexpr int kMaxClusterSplits = 16;
// Key codes besides rows: a masked key, and (fused write) the token's own key, read from kv.
constexpr int64_t kMasked = -1, kOwnKey = -2;

// What the launcher derives from the params (passed with them).
struct Derived {
  const int32_t* ctable = nullptr;  // the compressed entries' tables (or the window's)
  int64_t cmax = 0, cbs = 0;
  int splits = 1;
  bool q_vec = false;  // q rows may be read 16 bytes at a time
  // One token a sequence: the tensor-core kernel writes the window keys itself (split 0 of head
  // group 0) and reads each token's own key from kv, so no separate write kernel runs.
  bool fuse_write = false;
};

// A token's key list (see the header comment).
struct KeyList {
  const int32_t* table;
  const int32_t* ctable;
  const int32_t* sel;  // this token's selection, or null
  int lo, nw, total;

  __device__ __forceinline__ KeyList(const V4SparseAttentionParams& p, const Derived& dv, int64_t t,
                                     int pos) {
    const int64_t seq = p.token_seq[t];
    table = p.block_tables + seq * p.max_blocks_per_seq;
    ctable = dv.ctable + seq * dv.cmax;
    sel = p.selected != nullptr ? p.selected + t * p.num_selected : nullptr;
    lo = max(0, pos - static_cast<int>(p.window) + 1);
    nw = pos >= lo ? pos - lo + 1 : 0;
    int ncand = 0;
    if (p.compressed != nullptr) {
      ncand =
          sel != nullptr ? static_cast<int>(p.num_selected) : static_cast<int>((pos + 1) / p.rate);
    }
    total = nw + ncand;
  }

  // Row of key k: (row << 1) | plane (0 window, 1 compressed), or -1 when masked.
  __device__ __forceinline__ int64_t Code(const V4SparseAttentionParams& p, const Derived& dv,
                                          int k) const {
    if (k < nw) {
      const int j = lo + k, bs = static_cast<int>(p.block_size);  // positions are int32
      return (static_cast<int64_t>(table[j / bs]) * bs + j % bs) << 1;
    }
    const int c = k - nw;
    const int64_t w = sel != nullptr ? sel[c] : c;
    if (w < 0) return -1;
    const int64_t last = (w + 1) * p.rate - 1;
    const int64_t row =
        static_cast<int64_t>(ctable[last / dv.cbs]) * p.rows_per_block + (last % dv.cbs) / p.rate;
    return (row << 1) | 1;
  }
};

// The split's range [s_lo, s_hi) of a list of `total` keys, spans rounded up to `align`.
__device__ __forceinline__ void SplitRange(int total, int splits, int split, int align, int* s_lo,
                                           int* s_hi) {
  int span = (total + splits - 1) / splits;
  span = (span + align - 1) / align * align;
  *s_lo = min(total, split * span);
  *s_hi = min(total, *s_lo + span);
}

// Rotates the pair (x0, x1) at dims (dim0, dim0 + 1) backwards by the token's angle when it lies
// in the rotary part (the last rotary_dim dims).
__device__ __forceinline__ void InverseRope(const V4SparseAttentionParams& p, int pos, int dim0,
                                            float& x0, float& x1) {
  const int off = static_cast<int>(p.head_dim - p.rotary_dim);
  if (p.rotary_dim == 0 || dim0 < off) return;
  const float angle = static_cast<float>(pos) * p.inv_freq[(dim0 - off) >> 1];
  float sn, cs;
  sincosf(angle, &sn, &cs);
  sn = -sn;
  const float a = x0 * cs - x1 * sn, b = x1 * cs + x0 * sn;
  x0 = a;
  x1 = b;
}

// Stores dims (dim0, dim0 + 1) of head `head` of token t (the second when `two`).
__device__ __forceinline__ void StorePair(const V4SparseAttentionParams& p, int64_t t, int64_t head,
                                          int dim0, float v0, float v1, bool two) {
  const int64_t i = t * p.out_stride + head * p.head_dim + dim0;
  if (p.out_dtype == DType::kF32) {
    float* o = static_cast<float*>(p.out) + i;
    o[0] = v0;
    if (two) o[1] = v1;
  } else {
    bf16* o = static_cast<bf16*>(p.out) + i;
    o[0] = __float2bfloat16_rn(v0);
    if (two) o[1] = __float2bfloat16_rn(v1);
  }
}

// Where split `split` of (token t, head) keeps its partial output and (max, sum) stats.
__device__ __forceinline__ float* SplitOut(const V4SparseAttentionParams& p, int splits, int64_t t,
                                           int64_t head, int split) {
  return p.workspace + ((t * p.num_heads + head) * splits + split) * p.head_dim;
}
__device__ __forceinline__ float* SplitStats(const V4SparseAttentionParams& p, int splits,
                                             int64_t t, int64_t head, int split) {
  return p.workspace + p.num_tokens * p.num_heads * splits * p.head_dim +
         ((t * p.num_heads + head) * splits + split) * 2;
}

// The factor that turns an unnormalized output with (natural-log) max m and sum l into the final
// one: e^{m - M} / (l e^{m - M} + e^{sink - M}), M = max(m, sink); without sink 1 / l.
__device__ __forceinline__ float FinalFactor(const V4SparseAttentionParams& p, int64_t head,
                                             float m, float l) {
  if (p.sinks == nullptr) return l > 0.0f ? 1.0f / l : 0.0f;
  const float sink = p.sinks[head];
  const float mx = fmaxf(m, sink);
  const float e = m == -INFINITY ? 0.0f : expf(m - mx);
  return e / (l * e + expf(sink - mx));
}

__device__ __forceinline__ float LoadElem(const void* base, DType dtype, int64_t i) {
  return dtype == DType::kF32 ? static_cast<const float*>(base)[i]
                              : __bfloat162float(static_cast<const bf16*>(base)[i]);
}

// ---- 1. The step's keys into the window plane. ----
// Token t's key into its window slot, by the CTA's threads.
__device__ __forceinline__ void StoreWindowKey(const V4SparseAttentionParams& p, int64_t t,
                                               int64_t pos) {
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq;
  const int64_t slot =
      static_cast<int64_t>(table[pos / p.block_size]) * p.block_size + pos % p.block_size;
  const float* src = p.kv + t * p.kv_stride;
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    if (p.window_dtype == DType::kF32) {
      static_cast<float*>(p.window_kv)[slot * p.head_dim + d] = src[d];
    } else {
      static_cast<bf16*>(p.window_kv)[slot * p.head_dim + d] = __float2bfloat16_rn(src[d]);
    }
  }
}

__global__ void WriteWindowKernel(V4SparseAttentionParams p) {
  WaitForPrerequisites();
  AllowDependents();  // the next kernel may launch (it waits for this one to finish)
  const int64_t t = blockIdx.x;
  StoreWindowKey(p, t, p.positions[t]);
}

// ---- 2. The tensor-core kernels (2a mma.sync, 2b wgmma): what they share. ----
// A CTA's work: token t (grid x), key split `split` (grid y), heads [h_base, h_base + nh) (head
// group grid z of `heads`), the split's keys [s_lo, s_hi) in spans rounded to `tile`.
struct CtaWork {
  int64_t t;
  int split;
  int64_t h_base;
  int nh;
  int pos;
  KeyList keys;
  int s_lo, s_hi;
  // Fused write: split 0 of head group 0 stores the token's key (no CTA of this launch reads it
  // from the plane), once its first tiles are in flight.
  bool writer;

  __device__ __forceinline__ CtaWork(const V4SparseAttentionParams& p, const Derived& dv, int heads,
                                     int tile)
      : t(blockIdx.x),
        split(blockIdx.y),
        h_base(static_cast<int64_t>(blockIdx.z) * heads),
        nh(static_cast<int>(p.num_heads - h_base < heads ? p.num_heads - h_base : heads)),
        pos(p.positions[t]),
        keys(p, dv, t, pos) {
    SplitRange(keys.total, dv.splits, split, tile, &s_lo, &s_hi);
    writer = dv.fuse_write && split == 0 && blockIdx.z == 0;
  }
};

// A tile of kTile keys (codes[0 .. kTile)) into shared memory by the CTA's kThreads threads, 16
// bytes (8 dims) a step: chunk cc of row r to dst(r, cc). A plane's row by cp.async (zeros for a
// masked key), the token's own key from kv, rounded as the plane stores it. kAddrFirst only
// steers code generation: dst(r, cc) evaluated before the key's branch (the wgmma kernel: its
// swizzled offsets stay on the uniform datapath) or in each branch (the mma.sync kernel: fewer
// live registers, no more spills at head_dim 512).
template <int D, int kTile, int kThreads, bool kAddrFirst, typename Dst>
__device__ __forceinline__ void GatherTile(const V4SparseAttentionParams& p, int64_t t,
                                           const int64_t* codes, int tid, Dst dst) {
  for (int c = tid; c < kTile * (D / 8); c += kThreads) {
    const int r = c / (D / 8), cc = c % (D / 8);
    const int64_t code = codes[r];
    void* const first = kAddrFirst ? dst(r, cc) : nullptr;
    if (code == kOwnKey) {  // the token's own key, rounded as the plane stores it
      const float* src = p.kv + t * p.kv_stride + cc * 8;
      uint4 w;
      w.x = PackBf16(src[0], src[1]);
      w.y = PackBf16(src[2], src[3]);
      w.z = PackBf16(src[4], src[5]);
      w.w = PackBf16(src[6], src[7]);
      *reinterpret_cast<uint4*>(kAddrFirst ? first : dst(r, cc)) = w;
      continue;
    }
    const bool fill = code >= 0;
    const bf16* src = static_cast<const bf16*>(p.window_kv);
    if (fill) {
      const bf16* plane = (code & 1) ? static_cast<const bf16*>(p.compressed)
                                     : static_cast<const bf16*>(p.window_kv);
      src = plane + (code >> 1) * D + cc * 8;
    }
    CpAsync16(kAddrFirst ? first : dst(r, cc), src, fill);
  }
}

// Chunk c (8 dims) of Q's rows of the CTA's heads, as packed bf16 (zero past the heads).
template <int D>
__device__ __forceinline__ uint4 LoadQChunk(const V4SparseAttentionParams& p, const Derived& dv,
                                            const CtaWork& cta, int c) {
  const int r = c / (D / 8), cc = c % (D / 8);
  float v[8] = {};
  if (r < cta.nh) {
    const int64_t e = cta.t * p.q_stride + (cta.h_base + r) * D + cc * 8;
    if (p.q_dtype == DType::kF32) {
      const float* src = static_cast<const float*>(p.q) + e;
      if (dv.q_vec) {
        const float4 a = *reinterpret_cast<const float4*>(src);
        const float4 b = *reinterpret_cast<const float4*>(src + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = src[j];
      }
    } else {
      const bf16* src = static_cast<const bf16*>(p.q) + e;
      if (dv.q_vec) return *reinterpret_cast<const uint4*>(src);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = __bfloat162float(src[j]);
    }
  }
  uint4 w;
  w.x = PackBf16(v[0], v[1]);
  w.y = PackBf16(v[2], v[3]);
  w.z = PackBf16(v[4], v[5]);
  w.w = PackBf16(v[6], v[7]);
  return w;
}

// All of Q (kHeads rows of D dims) as bf16 into shared memory, chunk cc of row r to dst(r, cc):
// kBatch chunks a thread at a time, whose loads are in flight together (no shared store between
// them).
template <int D, int kHeads, int kThreads, int kBatch, typename Dst>
__device__ __forceinline__ void StageQ(const V4SparseAttentionParams& p, const Derived& dv,
                                       const CtaWork& cta, int tid, Dst dst) {
  constexpr int kPer = kHeads * (D / 8) / kThreads;
  static_assert(kPer * kThreads == kHeads * (D / 8) && kPer % kBatch == 0);
#pragma unroll
  for (int j0 = 0; j0 < kPer; j0 += kBatch) {
    uint4 w[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) w[j] = LoadQChunk<D>(p, dv, cta, tid + (j0 + j) * kThreads);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int c = tid + (j0 + j) * kThreads;
      *reinterpret_cast<uint4*>(dst(c / (D / 8), c % (D / 8))) = w[j];
    }
  }
}

// A round of up to kRound keys from r0: their rows are looked up (selection, block tables) by all
// threads at once into codes, so that the tiles' gathers need no global reads of their own; then
// the gathers of the first kStages - 1 tiles, load_tile(i, buffer), are issued (a commit group
// each).
template <int kRound, int kThreads, int kTile, int kStages, typename LoadTile>
__device__ __forceinline__ void BeginRound(const V4SparseAttentionParams& p, const Derived& dv,
                                           const CtaWork& cta, int r0, int64_t* codes, int tid,
                                           LoadTile load_tile) {
  const int r_hi = min(cta.s_hi, r0 + kRound);
  const int num_tiles = (r_hi - r0 + kTile - 1) / kTile;
  __syncthreads();  // the previous round's tiles, codes (and partial S) are consumed
  for (int k = tid; k < kRound; k += kThreads) {
    const int key = r0 + k;
    int64_t code = kMasked;
    if (key < r_hi) {
      code = dv.fuse_write && key == cta.keys.nw - 1 ? kOwnKey : cta.keys.Code(p, dv, key);
    }
    codes[k] = code;
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_tile(s, s);
    CpAsyncCommit();
  }
}

// kVec floats from shared memory in one load (float2 or float4).
template <int kVec>
__device__ __forceinline__ void LoadFloats(const float* src, float (&x)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 a = *reinterpret_cast<const float4*>(src);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
  } else {
    static_assert(kVec == 2);
    const float2 a = *reinterpret_cast<const float2*>(src);
    x[0] = a.x, x[1] = a.y;
  }
}

// The end of a tensor-core CTA for the thread's heads row0 and row0 + 8 of the CTA: their running
// maxima m (log2 units) and the thread's parts of the sums l; pairs(e, fn) calls fn(dim, x0, x1)
// for each pair of dims (dim, dim + 1) of head row0 + 8e that the thread holds (unnormalised);
// `stats`: the thread writes its heads' (max, sum). Without a cluster: with one split the output
// (sink, inverse rotary), else the normalised partial and its stats into the workspace for
// MergeKernel. With kCluster: the partial and stats into this CTA's shared memory (so [kHeads,
// kOLd] over Q and the tiles, sstat [kHeads, 2]); after a cluster barrier CTA `rank` merges heads
// rank, rank + S, ... as MergeKernel does (same order, same weights; wt [its heads,
// kMaxClusterSplits]), kVec dims an item.
template <int D, int kThreads, int kOLd, int kVec, bool kCluster, typename Pairs>
__device__ __forceinline__ void FinishSplit(const V4SparseAttentionParams& p, const Derived& dv,
                                            const CtaWork& cta, int tid, int row0, bool stats,
                                            float m0, float m1, float l0, float l1, float* so,
                                            float* sstat, float* wt, Pairs pairs) {
  l0 = QuadSum(l0);
  l1 = QuadSum(l1);
  const float mr[2] = {m0 == -INFINITY ? -INFINITY : m0 * kLn2,
                       m1 == -INFINITY ? -INFINITY : m1 * kLn2};
  const float lr[2] = {l0, l1};
  if constexpr (kCluster) {
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    __syncthreads();  // every warp is done with Q, the tiles (and the partial S)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = row0 + 8 * e;
      const float f = lr[e] > 0.0f ? 1.0f / lr[e] : 0.0f;
      pairs(e, [&](int dim, float x0, float x1) {
        *reinterpret_cast<float2*>(so + r * kOLd + dim) = make_float2(x0 * f, x1 * f);
      });
      if (stats) {
        sstat[2 * r] = mr[e];
        sstat[2 * r + 1] = lr[e];
      }
    }
    cluster.sync();  // every split's output and stats are in its shared memory
    const int S = dv.splits, rank = static_cast<int>(cluster.block_rank());
    const int mine = rank < cta.nh ? (cta.nh - rank + S - 1) / S : 0;
    // (The loops over splits are unrolled to kMaxClusterSplits so that the remote reads of all
    // splits are in flight together.)
    if (tid < mine) {
      const int r = rank + tid * S;
      float2 st[kMaxClusterSplits];
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < S)
          st[s] = *reinterpret_cast<const float2*>(cluster.map_shared_rank(sstat, s) + 2 * r);
      }
      float mx = -INFINITY;
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < S) mx = fmaxf(mx, st[s].x);
      }
      float sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < S) {
          const float w = st[s].x == -INFINITY ? 0.0f : st[s].y * expf(st[s].x - mx);
          wt[tid * kMaxClusterSplits + s] = w;
          sum += w;
        }
      }
      const float f = FinalFactor(p, cta.h_base + r, mx, sum);
      for (int s = 0; s < S; ++s) wt[tid * kMaxClusterSplits + s] *= f;
    }
    __syncthreads();
    for (int item = tid; item < mine * (D / kVec); item += kThreads) {
      const int lh = item / (D / kVec), d0 = (item % (D / kVec)) * kVec;
      const int r = rank + lh * S;
      float x[kMaxClusterSplits][kVec];
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < S) LoadFloats(cluster.map_shared_rank(so, s) + r * kOLd + d0, x[s]);
      }
      float v[kVec] = {};
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < S) {
          const float w = wt[lh * kMaxClusterSplits + s];
#pragma unroll
          for (int k = 0; k < kVec; ++k) v[k] += w * x[s][k];
        }
      }
#pragma unroll
      for (int k = 0; k < kVec; k += 2) InverseRope(p, cta.pos, d0 + k, v[k], v[k + 1]);
#pragma unroll
      for (int k = 0; k < kVec; k += 2) {
        StorePair(p, cta.t, cta.h_base + r, d0 + k, v[k], v[k + 1], true);
      }
    }
    cluster.sync();  // the peers' shared memory stays until every CTA has read it
  } else {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = row0 + 8 * e;
      if (r >= cta.nh) continue;
      const int64_t head = cta.h_base + r;
      if (dv.splits == 1) {
        const float f = FinalFactor(p, head, mr[e], lr[e]);
        pairs(e, [&](int dim, float x0, float x1) {
          float v0 = x0 * f, v1 = x1 * f;
          InverseRope(p, cta.pos, dim, v0, v1);
          StorePair(p, cta.t, head, dim, v0, v1, true);
        });
      } else {
        const float f = lr[e] > 0.0f ? 1.0f / lr[e] : 0.0f;
        float* dst = SplitOut(p, dv.splits, cta.t, head, cta.split);
        pairs(e, [&](int dim, float x0, float x1) {
          *reinterpret_cast<float2*>(dst + dim) = make_float2(x0 * f, x1 * f);
        });
        if (stats) {
          float* st = SplitStats(p, dv.splits, cta.t, head, cta.split);
          st[0] = mr[e];
          st[1] = lr[e];
        }
      }
    }
  }
}

// ---- 2a. Tensor cores: bf16 planes, head_dim 64, 128, 256 or 512. ----
template <int D>
struct TcConfig {
  static constexpr int kWarps = 16, kThreads = 32 * kWarps;
  static constexpr int kHeads = 64;     // 4 head tiles of 16
  static constexpr int kW = D / 4;      // a warp's dims
  static constexpr int kLd = D + 8;     // bf16 elements a shared row (conflict-free ldmatrix)
  static constexpr int kTileKeys = 32;  // keys a stage
  static constexpr int kStages = 3;
  static constexpr int kSxLd = 40;  // floats a row of a partial S
  static constexpr int kQBytes = kHeads * kLd * 2;
  static constexpr int kTileBytes = kTileKeys * kLd * 2;
  static constexpr int kSxBytes = kWarps * 16 * kSxLd * 4;
  // Rows of a round of keys, resolved before its tiles are gathered.
  static constexpr int kRound = 512;
  static constexpr int kSmem = kQBytes + kStages * kTileBytes + kSxBytes + kRound * 8;
  // Cluster merge: the split's normalised output [kHeads, kOLd] f32 over Q and the tiles, its
  // (max, sum) per head over the partial S, the merge weights over the codes.
  static constexpr int kOLd = D + 8;
  static_assert(kHeads * kOLd * 4 <= kQBytes + kStages * kTileBytes);
  static_assert(kHeads * 2 * 4 <= kSxBytes);
  static_assert(kHeads * kMaxClusterSplits * 4 <= kRound * 8);
};

// kCluster: the grid's splits of a (token, head group) form one cluster (dv.splits CTAs) and are
// merged through distributed shared memory at the end (no workspace, no merge kernel).
template <int D, bool kCluster>
__global__ void __launch_bounds__(TcConfig<D>::kThreads, 1)
    TcKernel(V4SparseAttentionParams p, Derived dv) {
  using C = TcConfig<D>;
  constexpr int kLd = C::kLd, kW = C::kW, kStages = C::kStages, kTile = C::kTileKeys;
  extern __shared__ uint4 smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* tiles = reinterpret_cast<bf16*>(reinterpret_cast<uint8_t*>(smem_raw) + C::kQBytes);
  float* sx = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(tiles) + kStages * C::kTileBytes);
  int64_t* codes = reinterpret_cast<int64_t*>(reinterpret_cast<uint8_t*>(sx) + C::kSxBytes);
  WaitForPrerequisites();
  AllowDependents();  // the next kernel may launch (it waits for this one to finish)

  const CtaWork cta(p, dv, C::kHeads, kTile);
  const int s_lo = cta.s_lo, s_hi = cta.s_hi;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c2 = (lane & 3) * 2, mat = lane >> 3;
  const int mt = warp >> 2, ds = warp & 3;

  // Tile i of the round: rows codes[i * kTile ...].
  auto load_tile = [&](int i, int buf) {
    bf16* dst_tile = tiles + buf * (kTile * kLd);
    GatherTile<D, kTile, C::kThreads, false>(p, cta.t, codes + i * kTile, tid, [&](int r, int cc) {
      return dst_tile + r * kLd + cc * 8;
    });
  };
  // Rounds of up to kRound keys (BeginRound).
  auto begin_round = [&](int r0) {
    BeginRound<C::kRound, C::kThreads, kTile, kStages>(p, dv, cta, r0, codes, tid, load_tile);
  };
  // The first round starts before anything else; Q (visible after the first tile's barrier) and
  // the fused write while its tiles are in flight.
  if (s_lo < s_hi) {
    begin_round(s_lo);
    // Q of the CTA's heads as bf16 (rows past the heads are zero), staged once the first tiles'
    // gathers are in flight.
    constexpr int kPer = C::kHeads * (D / 8) / C::kThreads;
    StageQ<D, C::kHeads, C::kThreads, (kPer < 4 ? kPer : 4)>(
        p, dv, cta, tid, [&](int r, int cc) { return sq + r * kLd + cc * 8; });
  }
  if (cta.writer) StoreWindowKey(p, cta.t, cta.pos);

  float o[kW / 8][4];
#pragma unroll
  for (int i = 0; i < kW / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const float qk_scale = p.scale * kLog2e;
  const bf16* qrow = sq + (mt * 16 + (lane & 15)) * kLd + ds * kW + (lane >> 4) * 8;
  float* sx_own = sx + warp * 16 * C::kSxLd;

  for (int r0 = s_lo; r0 < s_hi; r0 += C::kRound) {
    const int r_hi = min(s_hi, r0 + C::kRound);
    const int num_tiles = (r_hi - r0 + kTile - 1) / kTile;
    if (r0 != s_lo) begin_round(r0);
    for (int i = 0; i < num_tiles; ++i) {
      CpAsyncWait<kStages - 2>();
      __syncthreads();  // tile i landed; tile i - 1's buffer and the partial S are free
      if (i + kStages - 1 < num_tiles) load_tile(i + kStages - 1, (i + kStages - 1) % kStages);
      CpAsyncCommit();
      const int buf = i % kStages;
      const bf16* tile = tiles + buf * (kTile * kLd);

      // Partial S over the warp's dims.
      float s[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      const bf16* krow = tile + ((lane & 7) + (mat >> 1) * 8) * kLd + ds * kW + (mat & 1) * 8;
#pragma unroll
      for (int kk = 0; kk < kW / 16; ++kk) {
        uint32_t a[4];
        LdMatrixX4(a, qrow + kk * 16);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t b[4];
          LdMatrixX4(b, krow + np * 16 * kLd + kk * 16);
          Mma(s[2 * np], a, b[0], b[1]);
          Mma(s[2 * np + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        *reinterpret_cast<float2*>(sx_own + g * C::kSxLd + nt * 8 + c2) =
            make_float2(s[nt][0], s[nt][1]);
        *reinterpret_cast<float2*>(sx_own + (g + 8) * C::kSxLd + nt * 8 + c2) =
            make_float2(s[nt][2], s[nt][3]);
      }
      __syncthreads();
      // Full S: the head tile's four partials in a fixed order.
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float* part = sx + (mt * 4 + q) * 16 * C::kSxLd;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const float2 x0 = *reinterpret_cast<const float2*>(part + g * C::kSxLd + nt * 8 + c2);
          const float2 x1 =
              *reinterpret_cast<const float2*>(part + (g + 8) * C::kSxLd + nt * 8 + c2);
          s[nt][0] += x0.x;
          s[nt][1] += x0.y;
          s[nt][2] += x1.x;
          s[nt][3] += x1.y;
        }
      }

      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = nt * 8 + c2 + (e & 1);
          const bool ok = codes[i * kTile + r] != kMasked;
          s[nt][e] = ok ? s[nt][e] * qk_scale : -INFINITY;
        }
        mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
      }
      OnlineSoftmaxStep(s, o, mx0, mx1, m0, m1, l0, l1);
      // O += P·V over the warp's dims, 16 keys a k-step.
      const bf16* vrow = tile + ((mat & 1) * 8 + (lane & 7)) * kLd + (mat >> 1) * 8 + ds * kW;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const uint32_t a[4] = {PackBf16(s[2 * ks][0], s[2 * ks][1]),
                               PackBf16(s[2 * ks][2], s[2 * ks][3]),
                               PackBf16(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                               PackBf16(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
        for (int dp = 0; dp < kW / 16; ++dp) {
          uint32_t b[4];
          LdMatrixX4Trans(b, vrow + ks * 16 * kLd + dp * 16);
          Mma(o[2 * dp], a, b[0], b[1]);
          Mma(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    CpAsyncWait<0>();
  }
  // Output accumulator d: head mt * 16 + g (+ 8 for the second pair), dims ds * kW + d * 8 + c2,
  // +1.
  auto pairs = [&](int e, auto&& fn) {
#pragma unroll
    for (int d = 0; d < kW / 8; ++d) fn(ds * kW + d * 8 + c2, o[d][2 * e], o[d][2 * e + 1]);
  };
  FinishSplit<D, C::kThreads, C::kOLd, 2, kCluster>(
      p, dv, cta, tid, mt * 16 + g, ds == 0 && (lane & 3) == 0, m0, m1, l0, l1,
      reinterpret_cast<float*>(smem_raw), sx, reinterpret_cast<float*>(codes), pairs);
}

// ---- 2b. wgmma (sm_90a): bf16 planes, head_dim 512, 64 heads a CTA. ----
// Two warpgroups; a tile of 64 keys at a time through a 2-stage cp.async ring. Each warpgroup
// computes the whole S = Q·Kᵀ (64 heads × 64 keys, wgmma m64n64k16 over the 512 dims, Q and the
// tile read by the tensor cores from shared memory), so that both hold the same scores and
// softmax state with no exchange; then O[:, 256·wg .. 256·wg + 255] += P·V with P (bf16) in
// registers and V the same tile read transposed (wgmma m64n128k16, B MN-major). Shared tiles
// are stored as column blocks of 64 dims: block b of row r is 128 bytes at b·rows·128 + r·128,
// its 16-byte chunks XOR-swizzled by r % 8 (the 128-byte swizzle of the wgmma descriptors).
struct WgConfig {
  static constexpr int kD = 512;
  static constexpr int kThreads = 256;  // two warpgroups
  static constexpr int kHeads = 64;
  static constexpr int kTileKeys = 64;
  static constexpr int kStages = 2;
  static constexpr int kQBlock = kHeads * 128;           // bytes of one 64-dim column block of Q
  static constexpr int kTBlock = kTileKeys * 128;        // ... of a key tile
  static constexpr int kQBytes = kHeads * kD * 2;        // 64 KB
  static constexpr int kTileBytes = kTileKeys * kD * 2;  // 64 KB
  static constexpr int kRound = 512;
  static constexpr int kOLd = kD + 8;
  static constexpr int kStatOffset = kQBytes + kStages * kTileBytes;
  static constexpr int kWtOffset = kStatOffset + kHeads * 2 * 4;
  static constexpr int kCodesOffset = kWtOffset + kHeads * kMaxClusterSplits * 4;
  // + 1,024: the base is aligned to the swizzle's period.
  static constexpr int kSmem = 1024 + kCodesOffset + kRound * 8;
  static_assert(kHeads * kOLd * 4 <= kQBytes + kStages * kTileBytes);
  static_assert(kCodesOffset % 8 == 0);
};

// Byte offset of 16-byte chunk c (dims 8c .. 8c + 7) of row r in a tile of `rows` rows.
__device__ __forceinline__ int WgOffset(int r, int c, int rows) {
  return (c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// Matrix descriptors (sm_90): 128-byte swizzle, 8-row groups 1,024 bytes apart. K-major (rows of
// the operand along the 128-byte lines; the leading offset unused), and MN-major with column
// blocks of 64 elements `lbo` bytes apart.
__device__ __forceinline__ uint64_t WgDescK(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
__device__ __forceinline__ uint64_t WgDescMn(uint32_t addr, uint32_t lbo) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// S (64 × 64, f32) += A · Bᵀ, A and B bf16 K-major in shared memory (scale-d off: S = A · Bᵀ).
__device__ __forceinline__ void WgmmaQk(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void WgmmaPv(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

__device__ __forceinline__ void WgFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgWait() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from reading accumulators before the wait above them.
template <int N>
__device__ __forceinline__ void WgFenceRegs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

template <bool kCluster>
__global__ void __launch_bounds__(WgConfig::kThreads, 1)
    WgKernel(V4SparseAttentionParams p, Derived dv) {
  using C = WgConfig;
  constexpr int D = C::kD, kTile = C::kTileKeys;
  extern __shared__ uint4 smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw) + ((1024 - (raw & 1023)) & 1023);
  const uint32_t q_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t tiles_addr = q_addr + C::kQBytes;
  uint8_t* tiles = smem + C::kQBytes;
  float* sstat = reinterpret_cast<float*>(smem + C::kStatOffset);
  float* wt = reinterpret_cast<float*>(smem + C::kWtOffset);
  int64_t* codes = reinterpret_cast<int64_t*>(smem + C::kCodesOffset);
  WaitForPrerequisites();
  AllowDependents();  // the next kernel may launch (it waits for this one to finish)

  const CtaWork cta(p, dv, C::kHeads, kTile);
  const int s_lo = cta.s_lo, s_hi = cta.s_hi;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  const int wg = warp >> 2, row0 = (warp & 3) * 16 + g;  // this thread's heads: row0, row0 + 8

  auto load_tile = [&](int i, int buf) {
    uint8_t* dst_tile = tiles + buf * C::kTileBytes;
    GatherTile<D, kTile, C::kThreads, true>(p, cta.t, codes + i * kTile, tid, [&](int r, int cc) {
      return dst_tile + WgOffset(r, cc, kTile);
    });
  };
  auto begin_round = [&](int r0) {
    BeginRound<C::kRound, C::kThreads, kTile, C::kStages>(p, dv, cta, r0, codes, tid, load_tile);
  };
  if (s_lo < s_hi) {
    begin_round(s_lo);
    // All 16 chunks of a thread in flight at once (one L2 round trip; O is not live yet).
    StageQ<D, C::kHeads, C::kThreads, 16>(
        p, dv, cta, tid, [&](int r, int cc) { return smem + WgOffset(r, cc, C::kHeads); });
  }
  if (cta.writer) StoreWindowKey(p, cta.t, cta.pos);

  float o[2][64];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < 64; ++i) o[h][i] = 0.0f;
  }
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const float qk_scale = p.scale * kLog2e;

  for (int r0 = s_lo; r0 < s_hi; r0 += C::kRound) {
    const int r_hi = min(s_hi, r0 + C::kRound);
    const int num_tiles = (r_hi - r0 + kTile - 1) / kTile;
    if (r0 != s_lo) begin_round(r0);
    for (int i = 0; i < num_tiles; ++i) {
      CpAsyncWait<0>();
      // This thread's cp.async and shared stores (Q, own key) visible to the tensor cores, then
      // everyone's; tile i - 1's buffer is free (every warpgroup waited for its wgmma).
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
      if (i + 1 < num_tiles) load_tile(i + 1, (i + 1) % C::kStages);
      CpAsyncCommit();
      const uint32_t tile_addr = tiles_addr + (i % C::kStages) * C::kTileBytes;

      float s[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) s[j] = 0.0f;
      WgFence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off = (kk & 3) * 32;  // 16 dims within the 128-byte line
        WgmmaQk(s, WgDescK(q_addr + (kk >> 2) * C::kQBlock + off),
                WgDescK(tile_addr + (kk >> 2) * C::kTBlock + off), kk > 0);
      }
      WgCommit();
      WgWait();
      WgFenceRegs(s);

      // Accumulator j (n tile j / 4): head row0 + 8 ((j >> 1) & 1), key 8 (j / 4) + c2 + (j & 1).
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int key = (j >> 2) * 8 + c2 + (j & 1);
        const bool ok = codes[i * kTile + key] != kMasked;
        s[j] = ok ? s[j] * qk_scale : -INFINITY;
        if (j & 2) {
          mx1 = fmaxf(mx1, s[j]);
        } else {
          mx0 = fmaxf(mx0, s[j]);
        }
      }
      const RowPairStep st = OnlineMaxStep(mx0, mx1, m0, m1, l0, l1);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 64; ++j) o[h][j] *= (j & 2) ? st.corr1 : st.corr0;
      }
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        if (j & 2) {
          s[j] = exp2f(s[j] - st.b1);
          l1 += s[j];
        } else {
          s[j] = exp2f(s[j] - st.b0);
          l0 += s[j];
        }
      }
      // P as the A fragments of four k steps of 16 keys.
      uint32_t a[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        a[ks][0] = PackBf16(s[8 * ks], s[8 * ks + 1]);
        a[ks][1] = PackBf16(s[8 * ks + 2], s[8 * ks + 3]);
        a[ks][2] = PackBf16(s[8 * ks + 4], s[8 * ks + 5]);
        a[ks][3] = PackBf16(s[8 * ks + 6], s[8 * ks + 7]);
      }
      WgFence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // Keys 16 ks .. 16 ks + 15 (two 8-row groups), dims 256 wg + 128 h .. + 127.
          WgmmaPv(o[h], a[ks],
                  WgDescMn(tile_addr + (wg * 4 + h * 2) * C::kTBlock + ks * 2048, C::kTBlock));
        }
      }
      WgCommit();
      WgWait();
      WgFenceRegs(o[0]);
      WgFenceRegs(o[1]);
    }
    CpAsyncWait<0>();
  }
  // Output accumulator j of half h: head row0 + 8 ((j >> 1) & 1), dims wg * 256 + h * 128 +
  // (j >> 2) * 8 + c2, +1.
  auto pairs = [&](int e, auto&& fn) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 2 * e; j < 64; j += 4) {
        fn(wg * 256 + h * 128 + (j >> 2) * 8 + c2, o[h][j], o[h][j + 1]);
      }
    }
  };
  // Four dims a merge item (two rotary pairs).
  FinishSplit<D, C::kThreads, C::kOLd, 4, kCluster>(
      p, dv, cta, tid, row0, wg == 0 && (lane & 3) == 0, m0, m1, l0, l1,
      reinterpret_cast<float*>(smem), sstat, wt, pairs);
}

// ---- 2c. f32: one CTA per (token, head, split), any plane dtypes, head_dim ≤ 1024. ----
constexpr int kF32Threads = 128;
constexpr int kF32Chunk = 64;

__global__ void __launch_bounds__(kF32Threads) F32Kernel(V4SparseAttentionParams p, Derived dv) {
  constexpr int kPer = kMaxHeadDim / kF32Threads;
  __shared__ float sq[kMaxHeadDim];
  __shared__ float sc[kF32Chunk];
  __shared__ int64_t codes[kF32Chunk];
  WaitForPrerequisites();
  AllowDependents();  // the next kernel may launch (it waits for this one to finish)
  const int64_t t = blockIdx.x / p.num_heads, head = blockIdx.x % p.num_heads;
  const int split = blockIdx.y;
  const int D = static_cast<int>(p.head_dim);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int pos = p.positions[t];
  const KeyList keys(p, dv, t, pos);
  int s_lo, s_hi;
  SplitRange(keys.total, dv.splits, split, 1, &s_lo, &s_hi);
  for (int d = tid; d < D; d += kF32Threads) {
    sq[d] = LoadElem(p.q, p.q_dtype, t * p.q_stride + head * D + d);
  }
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  auto row_ptr = [&](int64_t code) -> const void* {
    const void* plane = (code & 1) ? p.compressed : p.window_kv;
    const DType dt = (code & 1) ? p.compressed_dtype : p.window_dtype;
    return static_cast<const uint8_t*>(plane) + (code >> 1) * D * (dt == DType::kF32 ? 4 : 2);
  };
  auto plane_dtype = [&](int64_t code) { return (code & 1) ? p.compressed_dtype : p.window_dtype; };
  for (int c0 = s_lo; c0 < s_hi; c0 += kF32Chunk) {
    const int n = min(kF32Chunk, s_hi - c0);
    __syncthreads();  // the previous chunk's scores and rows are consumed (and sq is written)
    if (tid < kF32Chunk) codes[tid] = tid < n ? keys.Code(p, dv, c0 + tid) : -1;
    __syncthreads();
    for (int r = warp; r < kF32Chunk; r += kF32Threads / 32) {
      const int64_t code = codes[r];
      if (code < 0) {
        if (lane == 0) sc[r] = -INFINITY;
        continue;
      }
      const void* row = row_ptr(code);
      const DType dt = plane_dtype(code);
      float dot = 0.0f;
      for (int d = lane; d < D; d += 32) dot += sq[d] * LoadElem(row, dt, d);
      dot = WarpSum(dot);
      if (lane == 0) sc[r] = dot * p.scale;
    }
    __syncthreads();
    float cmax = -INFINITY;
    for (int r = 0; r < kF32Chunk; ++r) cmax = fmaxf(cmax, sc[r]);
    const float mn = fmaxf(m, cmax);
    if (mn == -INFINITY) continue;
    const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
    l *= corr;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= corr;
    m = mn;
    for (int r = 0; r < kF32Chunk; ++r) {
      if (sc[r] == -INFINITY) continue;
      const float e = expf(sc[r] - mn);
      l += e;
      const void* row = row_ptr(codes[r]);
      const DType dt = plane_dtype(codes[r]);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int d = tid + i * kF32Threads;
        if (d < D) acc[i] += e * LoadElem(row, dt, d);
      }
    }
  }
  __syncthreads();
  if (dv.splits == 1) {
    const float f = FinalFactor(p, head, m, l);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int d = tid + i * kF32Threads;
      if (d < D) sq[d] = acc[i] * f;  // the staged output row (q is no longer needed)
    }
    __syncthreads();
    for (int d0 = 2 * tid; d0 < D; d0 += 2 * kF32Threads) {
      const bool two = d0 + 1 < D;
      float v0 = sq[d0], v1 = two ? sq[d0 + 1] : 0.0f;
      if (two) InverseRope(p, pos, d0, v0, v1);
      StorePair(p, t, head, d0, v0, v1, two);
    }
  } else {
    const float f = l > 0.0f ? 1.0f / l : 0.0f;
    float* dst = SplitOut(p, dv.splits, t, head, split);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int d = tid + i * kF32Threads;
      if (d < D) dst[d] = acc[i] * f;
    }
    if (tid == 0) {
      float* st = SplitStats(p, dv.splits, t, head, split);
      st[0] = m;
      st[1] = l;
    }
  }
}

// ---- 3. Merge of the splits: the sink, the inverse rotary, the store. ----
constexpr int kMergeThreads = 128;

__global__ void __launch_bounds__(kMergeThreads)
    MergeKernel(V4SparseAttentionParams p, Derived dv) {
  __shared__ float weight[kMaxSplits];
  WaitForPrerequisites();
  AllowDependents();  // the next kernel may launch (it waits for this one to finish)
  const int64_t t = blockIdx.x / p.num_heads, head = blockIdx.x % p.num_heads;
  const int splits = dv.splits, D = static_cast<int>(p.head_dim);
  if (threadIdx.x == 0) {
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, SplitStats(p, splits, t, head, s)[0]);
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* st = SplitStats(p, splits, t, head, s);
      weight[s] = st[0] == -INFINITY ? 0.0f : st[1] * expf(st[0] - mx);
      sum += weight[s];
    }
    // Σ_s w_s o_s / (Σ_s w_s + e^{sink - mx}), w_s = l_s e^{m_s - mx}: FinalFactor with (mx, sum).
    const float f = FinalFactor(p, head, mx, sum);
    for (int s = 0; s < splits; ++s) weight[s] *= f;
  }
  __syncthreads();
  const int pos = p.positions[t];
  const float* base = SplitOut(p, splits, t, head, 0);
  for (int d0 = 2 * threadIdx.x; d0 < D; d0 += 2 * kMergeThreads) {
    const bool two = d0 + 1 < D;
    float v0 = 0.0f, v1 = 0.0f;
    for (int s = 0; s < splits; ++s) {
      v0 += weight[s] * base[s * D + d0];
      if (two) v1 += weight[s] * base[s * D + d0 + 1];
    }
    if (two) InverseRope(p, pos, d0, v0, v1);
    StorePair(p, t, head, d0, v0, v1, two);
  }
}

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kBF16; }

int Multiprocessors() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
    return 132;
  }
  return n;
}

// CTAs that key splits aim at: the tensor-core kernel fits one CTA an SM, the f32 kernel four. A
// step splits only into splits ≤ SplitTarget / CTAs a split (tokens × head groups, or tokens ×
// heads), so tokens × splits ≤ SplitTarget(false) whenever there are two or more.
int64_t SplitTarget(bool tc) { return (tc ? 1 : 4) * static_cast<int64_t>(Multiprocessors()); }

using TcKernelFn = void (*)(V4SparseAttentionParams, Derived);

// A tensor-core kernel's shared memory (C::kSmem; for clusters, sizes past the portable 8 too)
// allowed, once.
template <typename C, TcKernelFn kKernel, bool kCluster>
cudaError_t SetTcAttributes() {
  static const cudaError_t attr = [] {
    cudaError_t e =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
    if (e == cudaSuccess && kCluster) {
      e = cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    }
    return e;
  }();
  return attr;
}

// A tensor-core kernel (C::kThreads threads, C::kSmem bytes) as a programmatic dependent; with
// kCluster, clusters of (1, grid.y, 1).
template <typename C, TcKernelFn kKernel, bool kCluster>
cudaError_t LaunchTc(const V4SparseAttentionParams& p, const Derived& dv, dim3 grid,
                     cudaStream_t stream) {
  const cudaError_t attr = SetTcAttributes<C, kKernel, kCluster>();
  if (attr != cudaSuccess) return attr;
  if constexpr (kCluster) {
    return LaunchDependentCluster(kKernel, grid, dim3(C::kThreads), C::kSmem, dim3(1, grid.y, 1),
                                  stream, p, dv);
  }
  return LaunchDependent(kKernel, grid, dim3(C::kThreads), C::kSmem, stream, p, dv);
}

// Whether clusters of `splits` CTAs of a tensor-core kernel (kKernel: its cluster variant) can be
// resident (asked once for each size; no stream work).
template <typename C, TcKernelFn kKernel>
bool TcClusterFits(int splits) {
  static std::atomic<int> known[kMaxClusterSplits + 1];  // 0 unknown, 1 fits, 2 does not
  if (splits < 2 || splits > kMaxClusterSplits) return false;
  int k = known[splits].load(std::memory_order_relaxed);
  if (k == 0) {
    const bool ok = SetTcAttributes<C, kKernel, true>() == cudaSuccess &&
                    ClusterFits(reinterpret_cast<const void*>(kKernel), C::kThreads, C::kSmem,
                                dim3(1, static_cast<unsigned>(splits), 1));
    k = ok ? 1 : 2;
    known[splits].store(k, std::memory_order_relaxed);
  }
  return k == 1;
}

// The wgmma kernel, launched and asked as the mma.sync kernel is.
template <bool kCluster>
cudaError_t LaunchWg(const V4SparseAttentionParams& p, const Derived& dv, dim3 grid,
                     cudaStream_t stream) {
  return LaunchTc<WgConfig, WgKernel<kCluster>, kCluster>(p, dv, grid, stream);
}

bool WgClusterFits(int splits) { return TcClusterFits<WgConfig, WgKernel<true>>(splits); }

template <bool kCluster>
cudaError_t LaunchTcDim(const V4SparseAttentionParams& p, const Derived& dv, dim3 grid,
                        cudaStream_t stream) {
  switch (p.head_dim) {
    case 64:
      return LaunchTc<TcConfig<64>, TcKernel<64, kCluster>, kCluster>(p, dv, grid, stream);
    case 128:
      return LaunchTc<TcConfig<128>, TcKernel<128, kCluster>, kCluster>(p, dv, grid, stream);
    case 256:
      return LaunchTc<TcConfig<256>, TcKernel<256, kCluster>, kCluster>(p, dv, grid, stream);
    default:
      return LaunchTc<TcConfig<512>, TcKernel<512, kCluster>, kCluster>(p, dv, grid, stream);
  }
}

bool ClusterFitsDim(int64_t head_dim, int splits) {
  switch (head_dim) {
    case 64:
      return TcClusterFits<TcConfig<64>, TcKernel<64, true>>(splits);
    case 128:
      return TcClusterFits<TcConfig<128>, TcKernel<128, true>>(splits);
    case 256:
      return TcClusterFits<TcConfig<256>, TcKernel<256, true>>(splits);
    default:
      return TcClusterFits<TcConfig<512>, TcKernel<512, true>>(splits);
  }
}

}  // namespace

int64_t V4SparseAttentionWorkspaceFloats(int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                                         int64_t max_splits) {
  const int64_t splits = std::clamp<int64_t>(max_splits, 1, kMaxSplits);
  // Rows (token, split) of each head: the launcher splits only while tokens × splits ≤
  // SplitTarget(f32) (see SplitTarget), so no more rows than that are ever used.
  const int64_t rows = std::min(num_tokens * splits, SplitTarget(false));
  return std::max<int64_t>(rows, 0) * num_heads * (head_dim + 2);
}

int V4SparseAttention(const V4SparseAttentionParams& p, void* stream_ptr) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t D = p.head_dim;
  if (p.num_tokens < 0 || p.num_heads <= 0 || D <= 0 || D > kMaxHeadDim)
    return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.q == nullptr || p.kv == nullptr || p.out == nullptr || p.token_seq == nullptr ||
      p.positions == nullptr || p.block_tables == nullptr || p.window_kv == nullptr ||
      p.block_size <= 0 || p.max_blocks_per_seq <= 0 || p.window < 0 || !IsFloat(p.q_dtype) ||
      !IsFloat(p.out_dtype) || !IsFloat(p.window_dtype)) {
    return cudaErrorInvalidValue;
  }
  if (p.q_stride < p.num_heads * D || p.out_stride < p.num_heads * D || p.kv_stride < D) {
    return cudaErrorInvalidValue;
  }
  if (p.rotary_dim < 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > D ||
      (D - p.rotary_dim) % 2 != 0 || (p.rotary_dim > 0 && p.inv_freq == nullptr)) {
    return cudaErrorInvalidValue;
  }
  Derived dv;
  dv.ctable = p.block_tables;
  dv.cmax = p.max_blocks_per_seq;
  dv.cbs = p.block_size;
  int64_t max_keys = p.window;
  if (p.compressed != nullptr) {
    if (p.rate <= 0 || p.rows_per_block <= 0 || !IsFloat(p.compressed_dtype)) {
      return cudaErrorInvalidValue;
    }
    if (p.compressed_tables != nullptr) {
      if (p.compressed_max_blocks_per_seq <= 0 || p.compressed_block_size <= 0) {
        return cudaErrorInvalidValue;
      }
      dv.ctable = p.compressed_tables;
      dv.cmax = p.compressed_max_blocks_per_seq;
      dv.cbs = p.compressed_block_size;
    }
    if (p.selected != nullptr) {
      if (p.num_selected < 0) return cudaErrorInvalidValue;
      max_keys += p.num_selected;
    } else {
      max_keys += dv.cmax * dv.cbs / p.rate;
    }
  }
  const bool tc = p.window_dtype == DType::kBF16 &&
                  (p.compressed == nullptr || p.compressed_dtype == DType::kBF16) &&
                  (D == 64 || D == 128 || D == 256 || D == 512) && Aligned16(p.window_kv) &&
                  (p.compressed == nullptr || Aligned16(p.compressed));
  // The wgmma kernel: the tensor-core case at head_dim 512 (V4), unless the caller asks for the
  // mma.sync kernel.
  const bool wgk = tc && D == WgConfig::kD && p.kernel == 0;
  const int64_t elem = p.q_dtype == DType::kF32 ? 4 : 2;
  dv.q_vec = Aligned16(p.q) && (p.q_stride * elem) % 16 == 0;

  // Splits: as many as keep the CTAs within one wave (the tensor-core kernel fits one CTA an SM;
  // a second, partial wave would double the time), each with at least a couple of tiles of keys.
  // The tensor-core kernel merges up to kMaxClusterSplits splits inside a cluster.
  const int64_t head_groups = (p.num_heads + TcConfig<64>::kHeads - 1) / TcConfig<64>::kHeads;
  const int64_t ctas = p.num_tokens * (tc ? head_groups : p.num_heads);
  if (p.workspace != nullptr && p.max_splits > 1) {
    const int64_t target = SplitTarget(tc);
    const int64_t min_keys = tc ? 64 : 128;
    int64_t splits = target / ctas;
    splits = std::min({splits, std::min<int64_t>(p.max_splits, kMaxSplits),
                       std::max<int64_t>(1, (max_keys + min_keys - 1) / min_keys)});
    dv.splits = static_cast<int>(std::max<int64_t>(splits, 1));
  }
  bool cluster = false;
  if (tc && dv.splits > 1) {
    // The most splits up to kMaxClusterSplits whose clusters fit (all of them on an H200).
    for (int s = std::min(dv.splits, kMaxClusterSplits); s >= 2 && !cluster; --s) {
      if (wgk ? WgClusterFits(s) : ClusterFitsDim(D, s)) {
        dv.splits = s;
        cluster = true;
      }
    }
  }
  // One token a sequence (decode): the tensor-core kernel writes the window keys itself.
  dv.fuse_write = tc && p.num_tokens == p.num_seqs;

  cudaError_t err = cudaSuccess;
  if (!dv.fuse_write) {
    err = LaunchDependent(WriteWindowKernel, dim3(static_cast<unsigned>(p.num_tokens)), dim3(128),
                          0, stream, p);
    if (err != cudaSuccess) return err;
  }
  if (tc) {
    const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(dv.splits),
                    static_cast<unsigned>(head_groups));
    if (cluster) {
      err = wgk ? LaunchWg<true>(p, dv, grid, stream) : LaunchTcDim<true>(p, dv, grid, stream);
      if (err == cudaSuccess) return err;
      (void)cudaGetLastError();  // not launched: the workspace and the merge kernel instead
    }
    err = wgk ? LaunchWg<false>(p, dv, grid, stream) : LaunchTcDim<false>(p, dv, grid, stream);
  } else {
    const dim3 grid(static_cast<unsigned>(p.num_tokens * p.num_heads),
                    static_cast<unsigned>(dv.splits));
    err = LaunchDependent(F32Kernel, grid, dim3(kF32Threads), 0, stream, p, dv);
  }
  if (err != cudaSuccess || dv.splits == 1) return err;
  return LaunchDependent(MergeKernel, dim3(static_cast<unsigned>(p.num_tokens * p.num_heads)),
                         dim3(kMergeThreads), 0, stream, p, dv);
}

}  // namespace dinfer::kernels::cuda
