// AttentionRows for bf16 with head_dim 64 or 128, on the tensor cores. A CTA of 4 warps takes
// one token, kHeads consecutive KV heads and one split of the keys; the query heads that share a
// KV head (up to 16) are the 16 rows of one mma tile, so one pass over the keys serves them all.
// With many tokens a CTA takes 4 KV heads, one a warp: the cache holds a token's KV heads side
// by side, so the CTA reads each key's row in one contiguous run (1 KB of bf16 for head_dim 128,
// 512 bytes of e4m3), where one head's 256 or 128 bytes of many rows leave much of the memory
// bandwidth unused (an FP8 cache read 128 bytes at a time ran at under half of it). With few
// tokens (a single long sequence) a CTA takes one KV head and its 4 warps split each tile's keys,
// so that the keys spread over more CTAs. Tiles of 16 keys per warp are gathered from the paged
// cache with cp.async, as many stages deep as fit the shared memory of two CTAs an SM. Each warp
// keeps an online-softmax state; warps that share a head merge theirs at the end through shared
// memory. Splits of the keys are merged inside a thread-block cluster when there are at most
// kMaxClusterSplits of them (the CTAs of one (token, heads) launched as a cluster leave their
// normalised partial rows and (max, sum) in shared memory; after a cluster barrier CTA `rank`
// merges every S-th slice of the output, reading the others' shared memory), else by the rows
// kernel's merge kernel (natural-log stats either way).
//
// The keys of positions before the sequence's chunk of this step (seq_token_end) were written by
// earlier steps: their first stages are requested before the wait for the kernel before (the one
// that writes this step's keys), so the gather overlaps it; the step's own keys follow the wait.
//
// An FP8 cache is staged as e4m3 bytes and widened in registers straight into f16 mma fragments
// (e4m3 → f16 is exact), with no widened copy in shared memory. The order of the head dimensions
// within a product and of the keys within a 16-key step is free, so each thread reads whole
// words:
//  - S = Q·Kᵀ: the 16-byte word of dims [16c, 16c + 16) of a 64-dim group of one key gives the
//    thread (lane c of its quad) the B fragments of 4 k-steps; Q's fragments follow that order.
//  - O += P·V: the thread takes keys 4c..4c+3 of the 16 (k indices 2c, 2c+1, 2c+8, 2c+9, which
//    is where S's columns put them) and dims [g·D/8, (g+1)·D/8), one per n-tile; byte permutes
//    turn the 4 key rows into key pairs per dim.
// The e4m3 tiles are XOR-swizzled by 16-byte chunk so that both read patterns avoid bank
// conflicts; bf16 tiles are padded for ldmatrix.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/trace.cuh"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kRows = 16;  // query heads of one KV head per warp
constexpr int kKeys = 16;  // keys per stage
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

constexpr int kWarps = 4;
// Splits merged in a cluster at most (portable cluster size).
constexpr int kMaxClusterSplits = kMaxAttentionClusterSplits;

// KV heads per CTA (the rest of its 4 warps split each head's keys): 4 when that gives at least
// kManyCtas CTAs, else as few as the rows need to spread over the device (1 for a single long
// sequence: its keys are split across CTAs as well).
constexpr int64_t kManyCtas = 64;
int HeadsPerCta(int64_t num_rows, int64_t num_kv_heads) {
  for (int h = kWarps; h > 1; h /= 2) {
    if (num_kv_heads % h == 0 && num_rows * (num_kv_heads / h) >= kManyCtas) return h;
  }
  return 1;
}

template <int D, bool kFp8, int kHeads>
struct Config {
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpsPerHead = kWarps / kHeads;
  static constexpr int kTileKeys = kKeys * kWarpsPerHead;  // each warp takes 16 of them
  static constexpr int kElem = kFp8 ? 1 : 2;
  static constexpr int kRowBytes = kHeads * D * kElem;  // the CTA's run of a key's cache row
  static constexpr int kLdBytes = kFp8 ? kRowBytes : kRowBytes + 16;
  static constexpr int kTileBytes = kTileKeys * kLdBytes;  // one K or V stage
  // Two CTAs an SM: up to 110 KB of stages each.
  static constexpr int kStages = std::clamp(112640 / (2 * kTileBytes), 2, 8);
  static constexpr int kSmem = 2 * kStages * kTileBytes;
  // Warps that share a head merge their states through the tile memory; after them (from
  // kClusterOffset floats) a cluster's split keeps its partial rows [kHeads * kRows, D] and
  // their (max, sum).
  static constexpr int kClusterOffset = kWarpsPerHead > 1 ? kWarps* kRows*(D + 2) : 0;
  static_assert((kClusterOffset + kHeads * kRows * (D + 2)) * 4 <= kSmem);
};

// Position of 16-byte chunk c of row r within a head's D bytes of an e4m3 tile. S's reads take
// chunks 0-3 (or 4-7) of rows r and r + 1 (r even) together, P·V's reads one chunk of rows r,
// r + 4, r + 8 and r + 12: the XOR sends each of them to its own banks.
template <int D>
__device__ __forceinline__ int SwizzledChunk(int r, int c) {
  return c ^ ((((r & 1) << 2) ^ (((r >> 2) & 3) << 1)) & (D / 16 - 1));
}

// Which rows of a tile load_tile requests: all (kAll); before the wait, those written by earlier
// steps and the zero rows past the split (kEarly); after it, the rest, synchronously (kLate).
enum TilePart { kAll, kEarly, kLate };

template <int D, bool kFp8, int kHeads, bool kCluster>
__global__ void __launch_bounds__(Config<D, kFp8, kHeads>::kThreads)
    DecodeKernel(AttentionParams p) {
  using C = Config<D, kFp8, kHeads>;
  constexpr int kStages = C::kStages;
  constexpr int kLdBytes = C::kLdBytes;
  extern __shared__ uint4 smem_raw[];
  uint8_t* tiles = reinterpret_cast<uint8_t*>(smem_raw);  // kStages K tiles, then kStages V
  CtaTrace trace(kTraceDecodeAttention | (kFp8 ? kTraceFp8 : 0u) |
                 (kCluster ? kTraceAttentionCluster : 0u));
  AllowDependents();  // the output projection's GEMV streams its weights in meanwhile

  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int chunks = (group + kRows - 1) / kRows;
  const int head_groups = static_cast<int>(p.num_kv_heads) / kHeads;
  const int chunk_id = static_cast<int>(blockIdx.x % chunks);
  const int hg = static_cast<int>(blockIdx.x / chunks % head_groups);
  const int64_t row = blockIdx.x / (chunks * head_groups);
  const int64_t t = p.row_tokens != nullptr ? p.row_tokens[row] : row;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c4 = lane & 3, c2 = c4 * 2, mat = lane >> 3;
  const int wh = warp / C::kWarpsPerHead, wk = warp % C::kWarpsPerHead;  // head, key quarter
  const int h0 = (hg * kHeads + wh) * group + chunk_id * kRows;
  const int nh = min(kRows, group - chunk_id * kRows);
  const int split = blockIdx.y;
  const int pos = p.positions[t];
  const PagedRows paged(
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.max_blocks_per_seq,
      static_cast<int>(p.block_size));
  const int window = static_cast<int>(p.sliding_window);
  const int lo = window > 0 ? max(0, pos - window + 1) : 0, hi = pos + 1;
  const int splits = static_cast<int>(p.num_splits);
  const int span = (hi - lo + splits - 1) / splits;
  const int s_lo = lo + split * span, s_hi = min(hi, s_lo + span);
  const int num_tiles = s_hi > s_lo ? (s_hi - s_lo + C::kTileKeys - 1) / C::kTileKeys : 0;
  const int64_t row_bytes = p.num_kv_heads * p.head_dim * C::kElem;
  const uint8_t* k_cache = static_cast<const uint8_t*>(p.k_cache) + hg * C::kRowBytes;
  const uint8_t* v_cache = static_cast<const uint8_t*>(p.v_cache) + hg * C::kRowBytes;
  // Keys before the first position of the sequence's tokens in this step were written by earlier
  // steps (none is known to be without seq_token_end).
  int written = INT_MIN;
  if (p.seq_token_end != nullptr) {
    const int seq = p.token_seq[t];
    written = p.positions[seq == 0 ? 0 : p.seq_token_end[seq - 1]];
  }

  // The cache slots of a tile's keys: lane k of every warp looks up key k (and k + 32), and the
  // threads that copy a key's row take its slot from that lane, so that each key costs one table
  // lookup a warp rather than one a 16-byte chunk.
  constexpr int kSlotWords = (C::kTileKeys + 31) / 32;
  auto load_tile = [&](int i, int buf, TilePart part) {
    uint8_t* sk = tiles + buf * C::kTileBytes;
    uint8_t* sv = sk + kStages * C::kTileBytes;
    constexpr int kRowChunks = C::kRowBytes / 16;
    constexpr int kRowsPerIt = C::kThreads / kRowChunks;  // rows an iteration covers
    static_assert(kRowsPerIt <= 32 && 32 % kRowsPerIt == 0);
    const int j0 = s_lo + i * C::kTileKeys;
    int slot[kSlotWords];
#pragma unroll
    for (int w = 0; w < kSlotWords; ++w) {
      const int j = j0 + w * 32 + lane;
      slot[w] = w * 32 + lane < C::kTileKeys && j < s_hi ? static_cast<int>(paged.Slot(j)) : 0;
    }
#pragma unroll
    for (int it = 0; it < C::kTileKeys * kRowChunks / C::kThreads; ++it) {
      const int c = it * C::kThreads + static_cast<int>(threadIdx.x);
      const int r = c / kRowChunks, cc = c % kRowChunks;
      // Rows it·kRowsPerIt .. + kRowsPerIt - 1 all lie in slot word it·kRowsPerIt / 32.
      const int row_slot = __shfl_sync(0xffffffffu, slot[it * kRowsPerIt / 32], r % 32);
      const int j = j0 + r;
      const bool fill = j < s_hi;
      const bool late = fill && j >= written;
      if ((part == kEarly && late) || (part == kLate && !late)) continue;
      const int64_t off = fill ? static_cast<int64_t>(row_slot) * row_bytes + cc * 16 : 0;
      const int dst =
          kFp8 ? r * kLdBytes + cc / (D / 16) * D + SwizzledChunk<D>(r, cc % (D / 16)) * 16
               : r * kLdBytes + cc * 16;
      if (part == kLate) {
        *reinterpret_cast<uint4*>(sk + dst) = __ldcg(reinterpret_cast<const uint4*>(k_cache + off));
        *reinterpret_cast<uint4*>(sv + dst) = __ldcg(reinterpret_cast<const uint4*>(v_cache + off));
      } else {
        CpAsync16(sk + dst, k_cache + off, fill);
        CpAsync16(sv + dst, v_cache + off, fill);
      }
    }
  };
  // Commit a group per stage even when empty, so that wait counts stay uniform. The late rows of
  // these stages are stored directly; the loop's first barrier publishes them.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_tile(s, s, kEarly);
    CpAsyncCommit();
  }
  WaitForPrerequisites();  // this step's keys and the queries come from the kernels before
  trace.Waited();
  // Q's fragments, straight from memory (rows past the warp's heads are zero); requested before
  // the step's own keys below, so that both trips to L2 overlap.
  uint32_t qf[D / 16][4];
  {
    const bf16* qh = static_cast<const bf16*>(p.q) + t * p.q_stride + static_cast<int64_t>(h0) * D;
    auto ld = [&](int r, int d) -> uint32_t {
      return r < nh ? *reinterpret_cast<const uint32_t*>(qh + r * D + d) : 0u;
    };
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      // bf16: dims kk·16 + {c2, c2 + 1} and + 8; FP8: the order of its K words (header).
      const int d0 = kFp8 ? (kk / 4) * 64 + c4 * 16 + (kk % 4) * 4 : kk * 16 + c2;
      const int d1 = kFp8 ? d0 + 2 : d0 + 8;
      qf[kk][0] = ld(g, d0);
      qf[kk][1] = ld(g + 8, d0);
      qf[kk][2] = ld(g, d1);
      qf[kk][3] = ld(g + 8, d1);
    }
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) load_tile(s, s, kLate);
  }
  if constexpr (kFp8) {  // the FP8 products take Q as f16
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int e = 0; e < 4; ++e) qf[kk][e] = Bf16x2ToHalf2(qf[kk][e]);
    }
  }

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const float qk_scale = kFp8 ? p.scale * p.k_scale : p.scale;

  for (int i = 0; i < num_tiles; ++i) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (i + kStages - 1 < num_tiles) load_tile(i + kStages - 1, (i + kStages - 1) % kStages, kAll);
    CpAsyncCommit();
    const uint8_t* tk =
        tiles + (i % kStages) * C::kTileBytes + wk * kKeys * kLdBytes + wh * D * C::kElem;
    const uint8_t* tv = tk + kStages * C::kTileBytes;
    // Two accumulators per n-tile (even and odd k-steps): two shorter mma chains.
    float s[2][4], s2[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = s2[nt][e] = 0.0f;
    }
    if constexpr (kFp8) {
      // Column g of n-tile nt holds key 4·(g / 2) + 2·nt + g % 2.
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int r = 4 * (g >> 1) + 2 * nt + (g & 1);
#pragma unroll
        for (int grp = 0; grp < D / 64; ++grp) {
          const uint4 w = *reinterpret_cast<const uint4*>(tk + r * kLdBytes +
                                                          SwizzledChunk<D>(r, grp * 4 + c4) * 16);
          const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            MmaF16(e % 2 == 0 ? s[nt] : s2[nt], qf[grp * 4 + e], E4M3x2ToHalf2(ws[e]),
                   E4M3x2ToHalf2<true>(ws[e]));
          }
        }
      }
    } else {
      constexpr int kLd = kLdBytes / 2;
      const bf16* krow =
          reinterpret_cast<const bf16*>(tk) + (lane & 7) * kLd + (mat >> 1) * 16 + (mat & 1) * 8;
#pragma unroll
      for (int kk2 = 0; kk2 < D / 32; ++kk2) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          uint32_t b[4];
          LdMatrixX4(b, krow + nt * 8 * kLd + kk2 * 32);
          Mma(s[nt], qf[2 * kk2], b[0], b[1]);
          Mma(s2[nt], qf[2 * kk2 + 1], b[2], b[3]);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] += s2[nt][e];
    }
    const int key0 = s_lo + i * C::kTileKeys + wk * kKeys;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= qk_scale;
    }
    if (p.softcap > 0.0f) {  // one branch a tile, not one a score
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = p.softcap * tanhf(s[nt][e] / p.softcap);
      }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + (kFp8 ? 4 * c4 + 2 * nt : nt * 8 + c2) + (e & 1);
        s[nt][e] = key < s_hi ? s[nt][e] * kLog2e : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    OnlineSoftmaxStep(s, o, mx0, mx1, m0, m1, l0, l1);
    if constexpr (kFp8) {
      const uint32_t a[4] = {PackHalf(s[0][0], s[0][1]), PackHalf(s[0][2], s[0][3]),
                             PackHalf(s[1][0], s[1][1]), PackHalf(s[1][2], s[1][3])};
      // Rows 4·c4 .. 4·c4 + 3, bytes [g·D/8, (g+1)·D/8) of each.
      constexpr int kWords = D / 32;
      uint32_t x[4][kWords];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int r = 4 * c4 + k;
        if constexpr (D == 128) {
          const uint4 w =
              *reinterpret_cast<const uint4*>(tv + r * kLdBytes + SwizzledChunk<D>(r, g) * 16);
          x[k][0] = w.x;
          x[k][1] = w.y;
          x[k][2] = w.z;
          x[k][3] = w.w;
        } else {
          const uint2 w = *reinterpret_cast<const uint2*>(
              tv + r * kLdBytes + SwizzledChunk<D>(r, g >> 1) * 16 + (g & 1) * 8);
          x[k][0] = w.x;
          x[k][1] = w.y;
        }
      }
#pragma unroll
      for (int j = 0; j < kWords; ++j) {
        // Keys (k0, k1) and (k2, k3) of dims 4j .. 4j + 3 of the thread's slice.
        const uint32_t t0 = Prmt(x[0][j], x[1][j], 0x5140), t1 = Prmt(x[2][j], x[3][j], 0x5140);
        const uint32_t t2 = Prmt(x[0][j], x[1][j], 0x7362), t3 = Prmt(x[2][j], x[3][j], 0x7362);
        MmaF16(o[4 * j], a, E4M3x2ToHalf2(t0), E4M3x2ToHalf2(t1));
        MmaF16(o[4 * j + 1], a, E4M3x2ToHalf2<true>(t0), E4M3x2ToHalf2<true>(t1));
        MmaF16(o[4 * j + 2], a, E4M3x2ToHalf2(t2), E4M3x2ToHalf2(t3));
        MmaF16(o[4 * j + 3], a, E4M3x2ToHalf2<true>(t2), E4M3x2ToHalf2<true>(t3));
      }
    } else {
      constexpr int kLd = kLdBytes / 2;
      const uint32_t a[4] = {PackBf16(s[0][0], s[0][1]), PackBf16(s[0][2], s[0][3]),
                             PackBf16(s[1][0], s[1][1]), PackBf16(s[1][2], s[1][3])};
      const bf16* vrow =
          reinterpret_cast<const bf16*>(tv) + ((mat & 1) * 8 + (lane & 7)) * kLd + (mat >> 1) * 8;
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        LdMatrixX4Trans(b, vrow + dp * 16);
        Mma(o[2 * dp], a, b[0], b[1]);
        Mma(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }
  CpAsyncWait<0>();
  trace.Mark();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float vs = kFp8 ? p.v_scale : 1.0f;
  // Where the split's normalised partial row r of the CTA's head hh goes, and its (max, sum):
  // the workspace of the merge kernel, or with kCluster this CTA's shared memory.
  float* cs_o = reinterpret_cast<float*>(tiles) + C::kClusterOffset;  // [kHeads * kRows, D]
  float* cs_stat = cs_o + kHeads * kRows * D;                         // [kHeads * kRows, 2]
  // The query head of row r of the CTA's KV head hh.
  auto head_of = [&](int hh, int r) -> int64_t {
    return (hg * kHeads + hh) * group + chunk_id * kRows + r;
  };
  auto part_row = [&](int hh, int r) -> float* {
    if constexpr (kCluster) return cs_o + (hh * kRows + r) * D;
    const int64_t head = head_of(hh, r);
    return p.split_out + ((row * p.num_heads + head) * splits + split) * D;
  };
  auto part_stat = [&](int hh, int r) -> float* {
    if constexpr (kCluster) return cs_stat + (hh * kRows + r) * 2;
    const int64_t head = head_of(hh, r);
    return p.split_stats + ((row * p.num_heads + head) * splits + split) * 2;
  };
  if constexpr (C::kWarpsPerHead > 1) {
    // Merge the states of the warps that share a head through the (now free) tile memory.
    __syncthreads();
    float* sm_o = reinterpret_cast<float*>(tiles);  // [kWarps][kRows][D]
    float* sm_m = sm_o + kWarps * kRows * D;        // [kWarps][kRows]
    float* sm_l = sm_m + kWarps * kRows;
#pragma unroll
    for (int d = 0; d < D / 8; ++d) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        // n-tile d, column c2 + e: dim d·8 + c2 + e, or with an FP8 cache (c2 + e)·D/8 + d.
        const int dim = kFp8 ? (c2 + e) * (D / 8) + d : d * 8 + c2 + e;
        sm_o[(warp * kRows + g) * D + dim] = o[d][e];
        sm_o[(warp * kRows + g + 8) * D + dim] = o[d][e + 2];
      }
    }
    if (c4 == 0) {
      sm_m[warp * kRows + g] = m0;
      sm_m[warp * kRows + g + 8] = m1;
      sm_l[warp * kRows + g] = l0;
      sm_l[warp * kRows + g + 8] = l1;
    }
    __syncthreads();
    // Only the nh rows that are query heads (a group of 4 fills a quarter of the 16).
    for (int idx = threadIdx.x; idx < kHeads * nh * D; idx += C::kThreads) {
      const int hh = idx / (nh * D), r = idx / D % nh, d = idx % D;
      const int w0 = hh * C::kWarpsPerHead;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < C::kWarpsPerHead; ++w) mx = fmaxf(mx, sm_m[(w0 + w) * kRows + r]);
      float sum = 0.0f, acc = 0.0f;
      if (mx != -INFINITY) {
#pragma unroll
        for (int w = 0; w < C::kWarpsPerHead; ++w) {
          const float wt = exp2f(sm_m[(w0 + w) * kRows + r] - mx);
          sum += sm_l[(w0 + w) * kRows + r] * wt;
          acc += sm_o[((w0 + w) * kRows + r) * D + d] * wt;
        }
      }
      const float val = sum > 0.0f ? acc / sum * vs : 0.0f;
      if (!kCluster && splits == 1) {
        const int64_t head = head_of(hh, r);
        static_cast<bf16*>(p.out)[t * p.out_stride + head * D + d] = __float2bfloat16_rn(val);
      } else {
        part_row(hh, r)[d] = val;
        if (d == 0) {
          float* st = part_stat(hh, r);
          st[0] = mx == -INFINITY ? -INFINITY : mx * kLn2;
          st[1] = sum;
        }
      }
    }
  } else {
    // One warp a head: its state is final; normalize and write rows g and g + 8.
    if constexpr (kCluster) __syncthreads();  // every warp is done with the tiles
    const float s0 = l0 > 0.0f ? vs / l0 : 0.0f, s1 = l1 > 0.0f ? vs / l1 : 0.0f;
    // Dims dim and dim + 1 of head row r.
    auto store = [&](int r, int dim, float v0, float v1) {
      if (r >= nh) return;
      if (!kCluster && splits == 1) {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.out) + t * p.out_stride +
                                           (h0 + r) * D + dim) = __floats2bfloat162_rn(v0, v1);
      } else {
        *reinterpret_cast<float2*>(part_row(wh, r) + dim) = make_float2(v0, v1);
      }
    };
    if constexpr (kFp8) {
      // n-tile d, column c2 + e is dim (c2 + e)·D/8 + d: pair n-tiles d and d + 1.
#pragma unroll
      for (int d = 0; d < D / 8; d += 2) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int dim = (c2 + e) * (D / 8) + d;
          store(g, dim, o[d][e] * s0, o[d + 1][e] * s0);
          store(g + 8, dim, o[d][e + 2] * s1, o[d + 1][e + 2] * s1);
        }
      }
    } else {
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        store(g, d * 8 + c2, o[d][0] * s0, o[d][1] * s0);
        store(g + 8, d * 8 + c2, o[d][2] * s1, o[d][3] * s1);
      }
    }
    if ((kCluster || splits > 1) && c4 == 0) {
      const float m[2] = {m0, m1}, l[2] = {l0, l1};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (g + 8 * e >= nh) continue;
        float* st = part_stat(wh, g + 8 * e);
        st[0] = m[e] == -INFINITY ? -INFINITY : m[e] * kLn2;
        st[1] = l[e];
      }
    }
  }
  trace.Mark2();
  if constexpr (kCluster) {
    // Every split's rows are in its shared memory: CTA `rank` merges every S-th group of four
    // dims of the CTA's heads, with the weights of the merge kernel (same order).
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    const int rank = static_cast<int>(cluster.block_rank());
    constexpr int kQuads = D / 4;
    for (int item = rank * C::kThreads + static_cast<int>(threadIdx.x); item < kHeads * nh * kQuads;
         item += splits * C::kThreads) {
      const int hr = item / kQuads, d0 = (item % kQuads) * 4;
      const int hh = hr / nh, r = hr % nh, lr = hh * kRows + r;
      float2 st[kMaxClusterSplits];
      float4 x[kMaxClusterSplits];
#pragma unroll
      for (int sp = 0; sp < kMaxClusterSplits; ++sp) {
        if (sp < splits) {
          st[sp] = *reinterpret_cast<const float2*>(cluster.map_shared_rank(cs_stat, sp) + 2 * lr);
          x[sp] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(cs_o, sp) + lr * D + d0);
        }
      }
      float mx = -INFINITY;
#pragma unroll
      for (int sp = 0; sp < kMaxClusterSplits; ++sp) {
        if (sp < splits) mx = fmaxf(mx, st[sp].x);
      }
      float sum = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int sp = 0; sp < kMaxClusterSplits; ++sp) {
        if (sp < splits) {
          const float w = st[sp].x == -INFINITY ? 0.0f : st[sp].y * __expf(st[sp].x - mx);
          sum += w;
          acc[0] += w * x[sp].x;
          acc[1] += w * x[sp].y;
          acc[2] += w * x[sp].z;
          acc[3] += w * x[sp].w;
        }
      }
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int64_t head = head_of(hh, r);
      __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.out) +
                                                              t * p.out_stride + head * D + d0);
      dst[0] = __floats2bfloat162_rn(acc[0] * inv, acc[1] * inv);
      dst[1] = __floats2bfloat162_rn(acc[2] * inv, acc[3] * inv);
    }
    cluster.sync();  // the others' shared memory stays until every CTA has read it
  }
}

template <int D, bool kFp8, int kHeads, bool kCluster>
const void* Kernel() {
  using C = Config<D, kFp8, kHeads>;
  constexpr auto kernel = DecodeKernel<D, kFp8, kHeads, kCluster>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
  return attr == cudaSuccess ? reinterpret_cast<const void*>(kernel) : nullptr;
}

// Whether clusters of `splits` CTAs of the kernel can be resident (asked once a size).
template <int D, bool kFp8, int kHeads>
bool ClusterFitsSplits(int splits) {
  using C = Config<D, kFp8, kHeads>;
  static std::atomic<int> known[kMaxClusterSplits + 1];  // 0 unknown, 1 fits, 2 does not
  if (splits < 2 || splits > kMaxClusterSplits) return false;
  int k = known[splits].load(std::memory_order_relaxed);
  if (k == 0) {
    k = ClusterFits(Kernel<D, kFp8, kHeads, true>(), C::kThreads, C::kSmem,
                    dim3(1, static_cast<unsigned>(splits)))
            ? 1
            : 2;
    known[splits].store(k, std::memory_order_relaxed);
  }
  return k == 1;
}

// Calls f(D, fp8, heads) as integral constants for the kernel instance that serves p's shape.
template <typename F>
auto Dispatch(int64_t head_dim, bool kv_fp8, int heads, F&& f) {
  auto with_d = [&](auto d) {
    auto with_fp8 = [&](auto fp8) {
      switch (heads) {
        case 4:
          return f(d, fp8, std::integral_constant<int, 4>{});
        case 2:
          return f(d, fp8, std::integral_constant<int, 2>{});
        default:
          return f(d, fp8, std::integral_constant<int, 1>{});
      }
    };
    return kv_fp8 ? with_fp8(std::true_type{}) : with_fp8(std::false_type{});
  };
  return head_dim == 64 ? with_d(std::integral_constant<int, 64>{})
                        : with_d(std::integral_constant<int, 128>{});
}

}  // namespace

cudaError_t AttentionDecodeMma(const AttentionParams& p, cudaStream_t stream, bool* merged) {
  const int heads = HeadsPerCta(p.num_rows, p.num_kv_heads);
  *merged = false;
  return Dispatch(p.head_dim, p.kv_fp8, heads, [&](auto d, auto fp8, auto h) -> cudaError_t {
    constexpr int kD = decltype(d)::value, kH = decltype(h)::value;
    constexpr bool kF = decltype(fp8)::value;
    using C = Config<kD, kF, kH>;
    const int64_t group = p.num_heads / p.num_kv_heads;
    const int64_t ctas = p.num_kv_heads / kH * ((group + kRows - 1) / kRows);
    const dim3 grid(static_cast<unsigned>(p.num_rows * ctas), static_cast<unsigned>(p.num_splits));
    if (p.num_splits >= 2 && p.num_splits <= kMaxClusterSplits &&
        ClusterFitsSplits<kD, kF, kH>(static_cast<int>(p.num_splits))) {
      *merged = true;
      return LaunchDependentCluster(DecodeKernel<kD, kF, kH, true>, grid, dim3(C::kThreads),
                                    C::kSmem, dim3(1, static_cast<unsigned>(p.num_splits), 1),
                                    stream, p);
    }
    if (Kernel<kD, kF, kH, false>() == nullptr) return cudaErrorInvalidValue;
    return LaunchDependent(DecodeKernel<kD, kF, kH, false>, grid, C::kThreads, C::kSmem, stream, p);
  });
}

AttentionRowsShape AttentionDecodeMmaShape(int64_t num_rows, int64_t head_dim, bool kv_fp8,
                                           int64_t num_heads, int64_t num_kv_heads) {
  const int heads = HeadsPerCta(num_rows, num_kv_heads);
  const int64_t group = num_heads / num_kv_heads;
  AttentionRowsShape shape;
  shape.ctas_per_row = num_kv_heads / heads * ((group + kRows - 1) / kRows);
  shape.cluster_splits = kMaxClusterSplits;
  shape.ctas_per_sm = Dispatch(head_dim, kv_fp8, heads, [](auto d, auto fp8, auto h) -> int64_t {
    using C = Config<decltype(d)::value, decltype(fp8)::value, decltype(h)::value>;
    static const int64_t fit = [] {
      const void* k = Kernel<decltype(d)::value, decltype(fp8)::value, decltype(h)::value, false>();
      int n = 0;
      if (k == nullptr || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, C::kThreads,
                                                                        C::kSmem) != cudaSuccess) {
        return 1;
      }
      return std::max(n, 1);
    }();
    return fit;
  });
  return shape;
}

}  // namespace dinfer::kernels::cuda
