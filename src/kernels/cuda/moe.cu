// Mixture-of-experts kernels (moe.h): the plan (a stable counting sort of the pairs by expert in
// one CTA), the grouped bf16 product in two paths (skinny for decode, tiled on the tensor cores
// for prefill), the clamped SwiGLU and the combine.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe.h"

namespace dinfer::kernels::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Plan: warp w owns the pairs [w S, (w + 1) S); it counts them per expert into its own row of
// shared counters, the CTA turns the counts into the first row of each (warp, expert), and each
// warp then walks its pairs in order, 32 at a time: lanes naming the same expert (match.any)
// take consecutive rows in lane order, so the sort is stable.

constexpr int kPlanThreads = 1024;
constexpr int kPlanWarps = kPlanThreads / 32;

__device__ __forceinline__ int WarpInclusiveScan(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

__global__ void __launch_bounds__(kPlanThreads) PlanKernel(const MoePlanParams p) {
  extern __shared__ int32_t counts[];  // [kPlanWarps][num_experts]
  __shared__ int32_t warp_sums[kPlanWarps];
  __shared__ int32_t warp_active[kPlanWarps];  // active experts a warp of threads, then scanned
  WaitForPrerequisites();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int num_e = static_cast<int>(p.num_experts);
  const int pairs = static_cast<int>(p.num_tokens * p.top_k);
  // Counting warps: one per 32 pairs up to all of them (a decode step: one row of counters).
  const int count_warps = min(kPlanWarps, max(1, (pairs + 31) / 32));
  for (int i = tid; i < count_warps * num_e; i += kPlanThreads) counts[i] = 0;
  __syncthreads();

  const int per_warp = ((pairs + count_warps - 1) / count_warps + 31) / 32 * 32;
  const int begin = warp < count_warps ? min(warp * per_warp, pairs) : pairs;
  const int end = min(begin + per_warp, pairs);
  int32_t* mine = counts + min(warp, count_warps - 1) * num_e;
  for (int i = begin + lane; i < end; i += 32) {
    const int e = p.experts[i];
    if (e >= 0 && e < num_e) atomicAdd(&mine[e], 1);
  }
  __syncthreads();

  // Thread e: the rows of expert e before each warp's, then the experts' totals scanned.
  const int e = tid;
  int total = 0;
  if (e < num_e) {
    for (int w = 0; w < count_warps; ++w) {
      const int c = counts[w * num_e + e];
      counts[w * num_e + e] = total;
      total += c;
    }
  }
  const int incl = WarpInclusiveScan(total, lane);
  const unsigned active = __ballot_sync(0xffffffffu, e < num_e && total > 0);
  if (lane == 31) warp_sums[warp] = incl;
  if (lane == 0) warp_active[warp] = __popc(active);
  __syncthreads();
  if (warp == 0) {
    warp_sums[lane] = WarpInclusiveScan(warp_sums[lane], lane);
    warp_active[lane] = WarpInclusiveScan(warp_active[lane], lane);
  }
  __syncthreads();
  const int first = (warp > 0 ? warp_sums[warp - 1] : 0) + incl - total;
  if (e < num_e) {
    p.expert_offsets[e] = first;
    for (int w = 0; w < count_warps; ++w) counts[w * num_e + e] += first;
  }
  if (tid == 0) p.expert_offsets[num_e] = warp_sums[kPlanWarps - 1];
  if (p.active_experts != nullptr) {
    // Active expert e goes to slot (active experts before it); the slots past the count get -1.
    const int num_active = warp_active[kPlanWarps - 1];
    if ((active >> lane) & 1u) {
      p.active_experts[(warp > 0 ? warp_active[warp - 1] : 0) +
                       __popc(active & ((1u << lane) - 1u))] = e;
    }
    if (e < num_e && e >= num_active) p.active_experts[e] = -1;
    if (tid == 0) p.active_experts[num_e] = num_active;
  }
  __syncthreads();
  AllowDependents();

  for (int base = begin; base < end; base += 32) {
    const int i = base + lane;
    const int ex = i < end ? p.experts[i] : -1;
    const bool ok = ex >= 0 && ex < num_e;
    const unsigned peers = __match_any_sync(0xffffffffu, ok ? ex : -1);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const int row = ok ? mine[ex] + rank : -1;
    __syncwarp();
    if (ok && rank == 0) mine[ex] += __popc(peers);
    __syncwarp();
    if (i < end) {
      p.pair_row[i] = row;
      if (ok) p.row_token[row] = static_cast<int32_t>(i / p.top_k);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Grouped product. The tiles of expert e are its rows in blocks of kTileRows; tile slot s is the
// s-th such block over the experts in order. Each warp finds its CTA's slot from expert_offsets
// (8 experts a lane, a warp scan of their tile counts per 256 experts).

struct Tile {
  int expert, row0, row_end;  // rows [row0, row_end) of the permuted rows
};

template <int kTileRows>
__device__ __forceinline__ bool FindTile(const int32_t* offsets, int num_e, int slot, Tile& tile) {
  const int lane = threadIdx.x & 31;
  int carry = 0;
  for (int e0 = 0; e0 < num_e; e0 += 256) {
    const int mine = e0 + lane * 8;
    int off[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) off[i] = mine + i <= num_e ? offsets[mine + i] : 0;
    int count = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (mine + i < num_e) count += (off[i + 1] - off[i] + kTileRows - 1) / kTileRows;
    }
    const int incl = WarpInclusiveScan(count, lane);
    const int start = carry + incl - count;
    const unsigned hit = __ballot_sync(0xffffffffu, slot >= start && slot < start + count);
    if (hit != 0) {
      const int src = __ffs(hit) - 1;
      int expert = -1, row0 = 0, row_end = 0;
      if (lane == src) {
        int s = start;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int c = (off[i + 1] - off[i] + kTileRows - 1) / kTileRows;
          if (expert < 0 && mine + i < num_e && slot < s + c) {
            expert = mine + i;
            row0 = off[i] + (slot - s) * kTileRows;
            row_end = min(row0 + kTileRows, off[i + 1]);
          }
          s += c;
        }
      }
      tile.expert = __shfl_sync(0xffffffffu, expert, src);
      tile.row0 = __shfl_sync(0xffffffffu, row0, src);
      tile.row_end = __shfl_sync(0xffffffffu, row_end, src);
      return true;
    }
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  return false;
}

// The work of a tile slot: the routed slots (found from expert_offsets) come first, then the
// shared expert's, kTileRows of its rows each (y rows from max_rows on).
struct Work {
  const bf16* w;      // the expert's [n, k] weights
  int row0, row_end;  // its y rows [row0, row_end)
  bool gather;        // x row of y row r: row_token[r], else r + x_shift
  int64_t x_shift;
};

__device__ __forceinline__ int64_t XRow(const GroupedGemmParams& p, const Work& work, int r) {
  return work.gather ? static_cast<int64_t>(p.row_token[r]) : r + work.x_shift;
}

__device__ __forceinline__ bool SharedWork(const GroupedGemmParams& p, int j, int tile_rows,
                                           Work& work) {
  if (p.shared_w == nullptr || static_cast<int64_t>(j) * tile_rows >= p.shared_rows) return false;
  work.w = static_cast<const bf16*>(p.shared_w);
  work.row0 = static_cast<int>(p.max_rows) + j * tile_rows;
  work.row_end =
      static_cast<int>(p.max_rows + min(p.shared_rows, static_cast<int64_t>(j + 1) * tile_rows));
  work.gather = false;
  work.x_shift = p.shared_x_row0 - p.max_rows;
  return true;
}

template <int kTileRows>
__device__ __forceinline__ bool FindWork(const GroupedGemmParams& p, int slot, int routed_slots,
                                         Work& work) {
  if (slot >= routed_slots) return SharedWork(p, slot - routed_slots, kTileRows, work);
  Tile tile;
  if (!FindTile<kTileRows>(p.expert_offsets, static_cast<int>(p.num_experts), slot, tile)) {
    return false;
  }
  work.w = static_cast<const bf16*>(p.w) + static_cast<int64_t>(tile.expert) * p.n * p.k;
  work.row0 = tile.row0;
  work.row_end = tile.row_end;
  work.gather = p.row_token != nullptr;
  work.x_shift = 0;
  return true;
}

// y[r, c] and y[r, c + 1] (c even, c + 1 < n); pairs: y and ldy allow one aligned store.
template <typename T>
__device__ __forceinline__ void StoreY(const GroupedGemmParams& p, int64_t r, int64_t c, float v0,
                                       float v1, bool pairs) {
  T* q = static_cast<T*>(p.y) + r * p.ldy + c;
  if (pairs) {
    if constexpr (std::is_same_v<T, float>) {
      *reinterpret_cast<float2*>(q) = make_float2(v0, v1);
    } else {
      *reinterpret_cast<__nv_bfloat162*>(q) = __floats2bfloat162_rn(v0, v1);
    }
    return;
  }
  q[0] = FromFloat<T>(v0);
  q[1] = FromFloat<T>(v1);
}

// 16 bytes read once (the weights): no L1 allocation.
__device__ __forceinline__ uint4 LoadStream(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// Skinny: CTA (blockIdx.x, blockIdx.y) = weight rows [8 x, 8 x + 8) of the expert of tile slot y
// (up to 16 rows). Warp w takes a contiguous run of 32-wide k chunks. Lane (g, t) holds elements
// 8 t .. 8 t + 7 of a chunk of weight row g and of rows g and g + 8: two m16n8k16 a chunk, with
// the same permutation of k in x and w (which leaves the sum alone).
constexpr int kSkinnyN = 8;
constexpr int kSkinnyM = 16;
constexpr int kSkinnyThreads = 128;
constexpr int kSkinnyWarps = kSkinnyThreads / 32;
constexpr int kSkinnyUnroll = 8;  // 16-byte weight loads in flight a lane

template <typename T>
__global__ void __launch_bounds__(kSkinnyThreads, 4)
    SkinnyKernel(const GroupedGemmParams p, const bool pairs, const int routed_slots) {
  __shared__ float4 partial[kSkinnyWarps][32];
  WaitForPrerequisites();
  Work tile;
  if (!FindWork<kSkinnyM>(p, static_cast<int>(blockIdx.y), routed_slots, tile)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kSkinnyN;
  const int rows = tile.row_end - tile.row0;
  const bool ok0 = g < rows, ok1 = g + 8 < rows;
  const int64_t tok0 = ok0 ? XRow(p, tile, tile.row0 + g) : 0;
  const int64_t tok1 = ok1 ? XRow(p, tile, tile.row0 + g + 8) : 0;
  const bf16* w = tile.w + (n0 + g) * p.k + t * 8;
  const bf16* x0 = static_cast<const bf16*>(p.x) + tok0 * p.ldx + t * 8;
  const bf16* x1 = static_cast<const bf16*>(p.x) + tok1 * p.ldx + t * 8;

  const int chunks = static_cast<int>((p.k + 31) / 32);
  const int per_warp = (chunks + kSkinnyWarps - 1) / kSkinnyWarps;
  const int c_begin = warp * per_warp, c_end = min(c_begin + per_warp, chunks);
  const int lane_k = t * 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float acc[4] = {};
  for (int c0 = c_begin; c0 < c_end; c0 += kSkinnyUnroll) {
    uint4 wv[kSkinnyUnroll];
#pragma unroll
    for (int u = 0; u < kSkinnyUnroll; ++u) {
      const int c = c0 + u;
      const bool in = c < c_end && c * 32 + lane_k < p.k;
      wv[u] = in ? LoadStream(w + c * 32) : zero;
    }
#pragma unroll
    for (int u = 0; u < kSkinnyUnroll; ++u) {
      const int c = c0 + u;
      if (c >= c_end) break;
      const bool in = c * 32 + lane_k < p.k;
      const uint4 xa = ok0 && in ? *reinterpret_cast<const uint4*>(x0 + c * 32) : zero;
      const uint4 xb = ok1 && in ? *reinterpret_cast<const uint4*>(x1 + c * 32) : zero;
      const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y};
      const uint32_t a1[4] = {xa.z, xb.z, xa.w, xb.w};
      Mma(acc, a0, wv[u].x, wv[u].y);
      Mma(acc, a1, wv[u].z, wv[u].w);
    }
  }
  partial[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  AllowDependents();
  if (warp != 0) return;
  float4 s = partial[0][lane];
#pragma unroll
  for (int i = 1; i < kSkinnyWarps; ++i) {
    const float4 v = partial[i][lane];
    s.x += v.x;
    s.y += v.y;
    s.z += v.z;
    s.w += v.w;
  }
  const int64_t c = n0 + t * 2;
  if (ok0) StoreY<T>(p, tile.row0 + g, c, s.x, s.y, pairs);
  if (ok1) StoreY<T>(p, tile.row0 + g + 8, c, s.z, s.w, pairs);
}

// Skinny with the list of active experts: CTA (blockIdx.x, blockIdx.y) = weight rows
// [32 x, 32 x + 32) of expert active_experts[y] and all of its rows, 32 at a time. Warp w owns 8
// of the weight rows and the whole of k, so no reduction: lane (g, t) streams elements
// 8 t .. 8 t + 7 of each 32-wide k chunk of weight row g (the permutation of the skinny kernel),
// 4 chunks a round, the next round's loads issued before this round's products (4 to 8 16-byte
// loads in flight a lane). 72 registers, 7 CTAs an SM (924 on the H200): the 896 CTAs of a
// V4-Flash token (6 routed experts and the shared one x 4096 / 32) are all resident at once, one
// wave with ~7-14 MB of loads in flight.
// x rows come through L1 (the 4 warps read the same ones), 2 chunks of them loaded together; the
// fragment rows past the expert's rows read its first row (valid memory; their sums are not
// stored), so x loads need no predicates but the k tail's.
constexpr int kListN = 32;
constexpr int kListThreads = 128;
constexpr int kListUnroll = 4;  // chunks a round
constexpr int kListXGroup = 2;  // chunks of x loaded together
constexpr int kListM = 32;      // rows a pass: two m16 tiles on the same weight fragments

// LoadStream with a 256-byte L2 fetch: the 4 lanes of a weight row cover 256 contiguous bytes of
// it in a round (4 loads each), so DRAM sees one 256-byte request a row and round, not four.
__device__ __forceinline__ uint4 LoadStream256(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

__device__ __forceinline__ uint4 LoadX(const bf16* ptr) {
  return __ldg(reinterpret_cast<const uint4*>(ptr));
}

// The clamped SwiGLU of one gate/up pair (SiluMulClamp and the list kernel's epilogue alike).
__device__ __forceinline__ float SwiGlu(float g, float u, float limit) {
  if (limit > 0.0f) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  return Silu(g) * u;
}

// kSwiGlu: CTA x takes gate rows [16 x, 16 x + 16) (warps 0, 1) and the matching up rows
// n / 2 + [16 x, 16 x + 16) (warps 2, 3); the up warps hand their sums over through shared memory
// and the gate warps store act = SwiGlu(g, u) as bf16.
template <typename T, bool kSwiGlu>
__global__ void __launch_bounds__(kListThreads, 7)
    ListSkinnyKernel(const GroupedGemmParams p, const bool pairs, const int routed_slots) {
  WaitForPrerequisites();
  const int slot = static_cast<int>(blockIdx.y);
  const bool shared = slot >= routed_slots;  // a pass of the shared expert's rows
  const int expert = shared ? 0 : p.active_experts[slot];
  if (expert < 0 || expert >= p.num_experts) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n0 =
      kSwiGlu ? (warp >> 1) * (p.n / 2) + static_cast<int64_t>(blockIdx.x) * 16 + (warp & 1) * 8
              : static_cast<int64_t>(blockIdx.x) * kListN + warp * 8;
  // n is a multiple of 8 (32 with kSwiGlu): a warp's 8 weight rows are all in or all out.
  if (!kSwiGlu && n0 >= p.n) return;
  const bf16* w = (shared ? static_cast<const bf16*>(p.shared_w)
                          : static_cast<const bf16*>(p.w) + expert * p.n * p.k) +
                  (n0 + g) * p.k + t * 8;
  const bool gather = !shared && p.row_token != nullptr;
  const int x_shift = shared ? static_cast<int>(p.shared_x_row0 - p.max_rows) : 0;
  const bf16* xb = static_cast<const bf16*>(p.x);
  const int chunks = static_cast<int>((p.k + 31) / 32);
  const int lane_k = t * 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const bool whole_chunks = p.k % 32 == 0;
  // Chunk c of this lane is in k (the loads past it give zeros, in x and w alike).
  auto in_k = [&](int c) { return c < chunks && c * 32 + lane_k < p.k; };
  auto load_round = [&](uint4(&wv)[kListUnroll], int c0) {
    if (whole_chunks && c0 + kListUnroll <= chunks) {  // warp-uniform: no per-load predicates
#pragma unroll
      for (int u = 0; u < kListUnroll; ++u) wv[u] = LoadStream256(w + (c0 + u) * 32);
      return;
    }
#pragma unroll
    for (int u = 0; u < kListUnroll; ++u) {
      const int c = c0 + u;
      wv[u] = in_k(c) ? LoadStream256(w + c * 32) : zero;
    }
  };

  // The first round of weights does not depend on the rows: in flight before their offsets.
  uint4 cur[kListUnroll];
  load_round(cur, 0);
  int row_begin, row_end;
  if (shared) {
    const int64_t j = (slot - routed_slots) * int64_t{kListM};
    row_begin = static_cast<int>(p.max_rows + j);
    row_end = static_cast<int>(p.max_rows + min(p.shared_rows, j + kListM));
  } else {
    row_begin = p.expert_offsets[expert];
    row_end = p.expert_offsets[expert + 1];
  }
  for (int r0 = row_begin; r0 < row_end; r0 += kListM) {
    const int rows = min(kListM, row_end - r0);
    // Which fragment rows have rows (warp-uniform): g + 8 i for i = 0 .. 3.
    const bool has1 = rows > 8, two = rows > 16;
    // The x rows of the 4 fragment rows in 16-byte units (32 bits: x up to 64 GiB).
    uint32_t xr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = g + 8 * i;
      const int rr = r0 + (r < rows ? r : 0);
      xr[i] = static_cast<uint32_t>(
          ((gather ? static_cast<int64_t>(p.row_token[rr]) : static_cast<int64_t>(rr + x_shift)) *
               p.ldx +
           lane_k) /
          8);
    }
    auto load_x = [&](int i, int c) {
      return LoadX(xb + static_cast<int64_t>(xr[i]) * 8 + c * 32);
    };
    float acc[2][4] = {};
    for (int c0 = 0; c0 < chunks; c0 += kListUnroll) {
      uint4 nxt[kListUnroll];
      load_round(nxt, c0 + kListUnroll);
      const bool guard = !(whole_chunks && c0 + kListUnroll <= chunks);  // warp-uniform
#pragma unroll
      for (int h = 0; h < kListUnroll; h += kListXGroup) {
        uint4 xa[kListXGroup], xc[kListXGroup];
#pragma unroll
        for (int j = 0; j < kListXGroup; ++j) {
          const int c = c0 + h + j;
          const bool in = !guard || in_k(c);
          xa[j] = in ? load_x(0, c) : zero;
          xc[j] = in && has1 ? load_x(1, c) : zero;
        }
#pragma unroll
        for (int j = 0; j < kListXGroup; ++j) {
          const uint4 wv = cur[h + j];
          const uint32_t a0[4] = {xa[j].x, xc[j].x, xa[j].y, xc[j].y};
          const uint32_t a1[4] = {xa[j].z, xc[j].z, xa[j].w, xc[j].w};
          Mma(acc[0], a0, wv.x, wv.y);
          Mma(acc[0], a1, wv.z, wv.w);
        }
        if (two) {
#pragma unroll
          for (int j = 0; j < kListXGroup; ++j) {
            const int c = c0 + h + j;
            const bool in = !guard || in_k(c);
            const uint4 xe = in ? load_x(2, c) : zero;
            const uint4 xf = in ? load_x(3, c) : zero;
            const uint4 wv = cur[h + j];
            const uint32_t b0[4] = {xe.x, xf.x, xe.y, xf.y};
            const uint32_t b1[4] = {xe.z, xf.z, xe.w, xf.w};
            Mma(acc[1], b0, wv.x, wv.y);
            Mma(acc[1], b1, wv.z, wv.w);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kListUnroll; ++u) cur[u] = nxt[u];
    }
    if (r0 + kListM < row_end) {
      load_round(cur, 0);  // the next pass starts over k
    } else {
      AllowDependents();
    }
    if constexpr (kSwiGlu) {
      __shared__ float4 up_sums[2][2][32];
      if (warp >= 2) {
        up_sums[warp & 1][0][lane] = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
        up_sums[warp & 1][1][lane] = make_float4(acc[1][0], acc[1][1], acc[1][2], acc[1][3]);
      }
      __syncthreads();
      if (warp < 2) {
        const float4 u0 = up_sums[warp][0][lane], u1 = up_sums[warp][1][lane];
        const float up[2][4] = {{u0.x, u0.y, u0.z, u0.w}, {u1.x, u1.y, u1.z, u1.w}};
        const int64_t c = n0 + t * 2;  // a gate column: the act column
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (g + 8 * i < rows) {
            const int m = i >> 1, e = (i & 1) * 2;
            StoreY<bf16>(p, r0 + g + 8 * i, c, SwiGlu(acc[m][e], up[m][e], p.swiglu_limit),
                         SwiGlu(acc[m][e + 1], up[m][e + 1], p.swiglu_limit), pairs);
          }
        }
      }
      __syncthreads();  // up_sums is rewritten by the next pass
    } else {
      const int64_t c = n0 + t * 2;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (g + 8 * i < rows) {
          StoreY<T>(p, r0 + g + 8 * i, c, acc[i >> 1][(i & 1) * 2], acc[i >> 1][(i & 1) * 2 + 1],
                    pairs);
        }
      }
    }
  }
}

// Tiled: CTA = 128 rows of one expert x 128 weight rows (blockIdx.x = slot * n_tiles + n tile,
// so the CTAs of one row block run together and share its activations in L2). 8 warps, 2 x 4,
// each 64 x 32 of the tile. k blocks of 64 elements = 128-byte rows, 16-byte chunks swizzled by
// row (conflict-free cp.async stores and ldmatrix reads).
constexpr int kTileM = 128;
constexpr int kTileN = 128;
constexpr int kTileK = 64;  // elements: 128 bytes a row
constexpr int kTiledThreads = 256;
constexpr int kStages = 4;
constexpr int kStageBytes = (kTileM + kTileN) * kTileK * 2;
constexpr int kTiledSmem = kStages * kStageBytes;

__device__ __forceinline__ int Swizzled(int r, int c) { return Swizzled128(r, c); }

template <typename T>
__global__ void __launch_bounds__(kTiledThreads, 1)
    TiledKernel(const GroupedGemmParams p, const int n_tiles, const bool pairs,
                const int routed_slots) {
  constexpr int kRowStep = kTiledThreads / 8;  // rows a pass of the copiers covers
  constexpr int kMt = kTileM / 32;             // m16 tiles a warp
  extern __shared__ uint4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
  WaitForPrerequisites();
  Work tile;
  const int slot = static_cast<int>(blockIdx.x) / n_tiles;
  if (!FindWork<kTileM>(p, slot, routed_slots, tile)) return;
  const int64_t n0 = static_cast<int64_t>(static_cast<int>(blockIdx.x) % n_tiles) * kTileN;
  const int m_left = tile.row_end - tile.row0;
  const int n_left = static_cast<int>(min(p.n - n0, int64_t{kTileN}));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  const int kb_count = static_cast<int>((p.k + kTileK - 1) / kTileK);

  // This thread copies chunk `chunk` of rows row + kRowStep j of the x and w tiles.
  const int row = tid >> 3, chunk = tid & 7;
  const bf16* xb = static_cast<const bf16*>(p.x);
  const bf16* wb = static_cast<const bf16*>(p.w);
  const bf16* x_src[kTileM / kRowStep];
  const bf16* w_src[kTileN / kRowStep];
#pragma unroll
  for (int j = 0; j < kTileM / kRowStep; ++j) {
    const int r = row + j * kRowStep;
    if (r < m_left) {
      x_src[j] = xb + XRow(p, tile, tile.row0 + r) * p.ldx + chunk * 8;
    } else {
      x_src[j] = nullptr;
    }
  }
#pragma unroll
  for (int j = 0; j < kTileN / kRowStep; ++j) {
    const int r = row + j * kRowStep;
    w_src[j] = r < n_left ? tile.w + (n0 + r) * p.k + chunk * 8 : nullptr;
  }
  auto load_stage = [&](int stage, int kb) {
    uint8_t* sa = smem + stage * kStageBytes;
    uint8_t* sb = sa + kTileM * 128;
    const int64_t k0 = static_cast<int64_t>(kb) * kTileK;
    const bool k_in = k0 + chunk * 8 < p.k;
#pragma unroll
    for (int j = 0; j < kTileM / kRowStep; ++j) {
      const bool ok = k_in && x_src[j] != nullptr;
      CpAsync16(sa + Swizzled(row + j * kRowStep, chunk), ok ? x_src[j] + k0 : xb, ok);
    }
#pragma unroll
    for (int j = 0; j < kTileN / kRowStep; ++j) {
      const bool ok = k_in && w_src[j] != nullptr;
      CpAsync16(sb + Swizzled(row + j * kRowStep, chunk), ok ? w_src[j] + k0 : wb, ok);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kb_count) load_stage(s, s);
    CpAsyncCommit();
  }

  float acc[kMt][4][4] = {};
  for (int kb = 0; kb < kb_count; ++kb) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    // The stage refilled here was read in the previous iteration, which every thread has left.
    if (kb + kStages - 1 < kb_count) load_stage((kb + kStages - 1) % kStages, kb + kStages - 1);
    CpAsyncCommit();

    const uint8_t* sa = smem + (kb % kStages) * kStageBytes;
    const uint8_t* sb = sa + kTileM * 128;
#pragma unroll
    for (int s = 0; s < kTileK / 16; ++s) {
      uint32_t a[kMt][4], b[4][2];
      LoadSwizzledFragments<kMt>(sa, sb, wm * (kTileM / 2), wn * 32, s, lane, a, b);
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) Mma(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
      }
    }
  }
  CpAsyncWait<0>();
  AllowDependents();

  const int row_base = wm * (kTileM / 2) + g;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int cl = wn * 32 + nt * 8 + t * 2;
      if (cl >= n_left) continue;
      const int r = row_base + mt * 16;
      if (r < m_left) StoreY<T>(p, tile.row0 + r, n0 + cl, acc[mt][nt][0], acc[mt][nt][1], pairs);
      if (r + 8 < m_left) {
        StoreY<T>(p, tile.row0 + r + 8, n0 + cl, acc[mt][nt][2], acc[mt][nt][3], pairs);
      }
    }
  }
}

// An upper bound of the number of tiles of kTileRows: each active expert adds at most one partial
// tile, and every tile has a row.
int64_t TileSlots(int64_t max_rows, int64_t num_experts, int64_t tile_rows) {
  return std::min(max_rows,
                  (max_rows + tile_rows - 1) / tile_rows + std::min(num_experts, max_rows));
}

// ---------------------------------------------------------------------------------------------
// SwiGLU and combine: 8 (4) elements a thread, grid-stride over a grid fixed by the bounds.

template <typename T>
__global__ void __launch_bounds__(256) SiluMulClampKernel(const SiluMulClampParams p) {
  WaitForPrerequisites();
  // Rows [0, head) and then the fixed rows [p.rows - p.fixed_rows, p.rows).
  const int64_t fixed_from = p.rows - p.fixed_rows;
  int64_t head = fixed_from;
  if (p.rows_on_device != nullptr) head = min(head, static_cast<int64_t>(*p.rows_on_device));
  const int64_t vecs = p.inter / 8, total = (head + p.fixed_rows) * vecs;
  const T* in = static_cast<const T*>(p.in);
  bf16* out = static_cast<bf16*>(p.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t ri = i / vecs, c = (i % vecs) * 8;
    const int64_t r = ri < head ? ri : ri - head + fixed_from;
    float g[8], u[8];
    const T* src = in + r * p.ld_in + c;
#pragma unroll
    for (int h = 0; h < 8 / kVec<T>; ++h) {
      LoadVec(src + h * kVec<T>, *reinterpret_cast<float(*)[kVec<T>]>(g + h * kVec<T>));
      LoadVec(src + p.inter + h * kVec<T>, *reinterpret_cast<float(*)[kVec<T>]>(u + h * kVec<T>));
    }
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = SwiGlu(g[j], u[j], p.limit);
    StoreVec(out + r * p.ld_out + c, o);
  }
  AllowDependents();
}

// CTA (x, y): columns [512 x, 512 x + 512) of token y (8 a thread), grid-stride over tokens. The
// rows and weights of a token's pairs are read first (4 at a time), so the loads of y are
// independent of each other.
constexpr int kCombineThreads = 64;
constexpr int kCombineCols = kCombineThreads * 8;
constexpr int kCombineBatch = 4;

template <typename T>
__device__ __forceinline__ void LoadY8(const T* src, float (&v)[8]) {
#pragma unroll
  for (int h = 0; h < 8 / kVec<T>; ++h) {
    LoadVec(src + h * kVec<T>, *reinterpret_cast<float(*)[kVec<T>]>(v + h * kVec<T>));
  }
}

template <typename T>
__global__ void __launch_bounds__(kCombineThreads) CombineKernel(const MoeCombineParams p) {
  WaitForPrerequisites();
  const T* y = static_cast<const T*>(p.y);
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCombineCols + threadIdx.x * 8;
  if (c < p.hidden) {
    for (int64_t tok = blockIdx.y; tok < p.num_tokens; tok += gridDim.y) {
      const int32_t* rows = p.pair_row + tok * p.top_k;
      const float* wts = p.weights + tok * p.top_k;
      float acc[8] = {};
      for (int64_t j0 = 0; j0 < p.top_k; j0 += kCombineBatch) {
        int32_t r[kCombineBatch];
        float wt[kCombineBatch];
#pragma unroll
        for (int b = 0; b < kCombineBatch; ++b) {
          const bool in = j0 + b < p.top_k;
          r[b] = in ? rows[j0 + b] : -1;
          wt[b] = in ? wts[j0 + b] : 0.0f;
        }
        float v[kCombineBatch][8];
#pragma unroll
        for (int b = 0; b < kCombineBatch; ++b) {
          if (r[b] >= 0) {
            LoadY8(y + r[b] * p.ldy + c, v[b]);
          } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[b][i] = 0.0f;
          }
        }
#pragma unroll
        for (int b = 0; b < kCombineBatch; ++b) {
          if (r[b] < 0) continue;  // skipped pairs add nothing (not even -0.0 * inf)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[i] += v[b][i] * wt[b];
        }
      }
      if (p.shared != nullptr) {
        float sh[8];
        LoadVec(p.shared + tok * p.hidden + c, *reinterpret_cast<float(*)[4]>(sh));
        LoadVec(p.shared + tok * p.hidden + c + 4, *reinterpret_cast<float(*)[4]>(sh + 4));
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += sh[i];
      }
      if (p.shared_row0 >= 0) {
        float sh[8];
        LoadY8(y + (p.shared_row0 + tok) * p.ldy + c, sh);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += sh[i];
      }
      float* o = p.out + tok * p.hidden + c;
      StoreVec(o, *reinterpret_cast<float(*)[4]>(acc));
      StoreVec(o + 4, *reinterpret_cast<float(*)[4]>(acc + 4));
    }
  }
  AllowDependents();
}

constexpr int64_t kMaxGrid = 132 * 32;  // grid-stride kernels: a few waves of the H200's SMs

}  // namespace

int64_t MoePlanWorkspaceInts(int64_t /*num_tokens*/, int64_t /*top_k*/, int64_t /*num_experts*/) {
  return 0;
}

int MoePlan(const MoePlanParams& p, void* stream) {
  if (p.num_tokens < 0 || p.top_k < 0 || p.num_experts <= 0 || p.num_experts > kMoeMaxExperts ||
      p.num_tokens * p.top_k >= (int64_t{1} << 31) || p.expert_offsets == nullptr ||
      (p.num_tokens * p.top_k > 0 &&
       (p.experts == nullptr || p.row_token == nullptr || p.pair_row == nullptr))) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = sizeof(int32_t) * kPlanWarps * static_cast<size_t>(p.num_experts);
  static const cudaError_t configured =
      cudaFuncSetAttribute(PlanKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(sizeof(int32_t) * kPlanWarps * kMoeMaxExperts));
  if (configured != cudaSuccess) return configured;
  return LaunchDependent(PlanKernel, dim3(1), dim3(kPlanThreads), smem,
                         static_cast<cudaStream_t>(stream), p);
}

bool GroupedGemmTakesListPath(const GroupedGemmParams& p) {
  // The list path addresses x rows in 32-bit 16-byte units.
  const int64_t shared_rows = p.shared_w != nullptr ? p.shared_rows : 0;
  const int64_t x_rows =
      std::max(p.max_rows, shared_rows > 0 ? p.shared_x_row0 + shared_rows : int64_t{0});
  return p.max_rows <= GroupedGemmSkinnyMaxRows(p.num_experts) && p.active_experts != nullptr &&
         x_rows * p.ldx / 8 < (int64_t{1} << 32);
}

int GroupedGemm(const GroupedGemmParams& p, void* stream) {
  const int64_t shared_rows = p.shared_w != nullptr ? p.shared_rows : 0;
  if ((p.max_rows == 0 && shared_rows == 0) || p.n == 0) return 0;
  if (p.shared_w != nullptr &&
      (p.shared_rows <= 0 || p.shared_x_row0 < 0 || !Aligned16(p.shared_w) ||
       p.max_rows + p.shared_rows >= (int64_t{1} << 31))) {
    return cudaErrorInvalidValue;
  }
  if (p.max_rows < 0 || p.max_rows >= (int64_t{1} << 31) || p.num_experts <= 0 || p.n < 0 ||
      p.k <= 0 || p.n % 8 != 0 || p.k % 8 != 0 || p.ldx % 8 != 0 || p.ldx < p.k ||
      p.ldy < (p.swiglu ? p.n / 2 : p.n) || p.x == nullptr || p.w == nullptr || p.y == nullptr ||
      p.expert_offsets == nullptr || !Aligned16(p.x) || !Aligned16(p.w) ||
      (p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16)) {
    return cudaErrorInvalidValue;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t elem = p.out_dtype == DType::kF32 ? 4 : 2;
  const bool pairs =
      p.ldy % 2 == 0 && reinterpret_cast<uintptr_t>(p.y) % static_cast<uintptr_t>(2 * elem) == 0;
  // Tile slots of the shared expert's rows, after the routed ones.
  auto shared_slots = [&](int64_t tile_rows) { return (shared_rows + tile_rows - 1) / tile_rows; };
  if (p.swiglu && (!GroupedGemmTakesListPath(p) || p.n % 32 != 0 || p.out_dtype != DType::kBF16 ||
                   p.ldy < p.n / 2 || !(p.swiglu_limit >= 0.0f))) {
    return cudaErrorInvalidValue;
  }
  if (GroupedGemmTakesListPath(p)) {
    const int64_t routed = std::min(p.num_experts, p.max_rows);
    const int64_t slots = routed + shared_slots(kListM);
    if (slots > 65535 || (p.n + kListN - 1) / kListN >= (int64_t{1} << 31)) {
      return cudaErrorInvalidValue;
    }
    const dim3 grid(static_cast<unsigned>((p.n + kListN - 1) / kListN),
                    static_cast<unsigned>(slots));
    if (p.swiglu) {
      return LaunchDependent(ListSkinnyKernel<bf16, true>, grid, dim3(kListThreads), 0, s, p, pairs,
                             static_cast<int>(routed));
    }
    return DispatchFloat(p.out_dtype, [&](auto tag) {
      using T = decltype(tag);
      return LaunchDependent(ListSkinnyKernel<T, false>, grid, dim3(kListThreads), 0, s, p, pairs,
                             static_cast<int>(routed));
    });
  }
  if (p.max_rows <= GroupedGemmSkinnyMaxRows(p.num_experts)) {
    const int64_t routed = TileSlots(p.max_rows, p.num_experts, kSkinnyM);
    const int64_t slots = routed + shared_slots(kSkinnyM);
    if (slots > 65535 || p.n / kSkinnyN >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(p.n / kSkinnyN), static_cast<unsigned>(slots));
    return DispatchFloat(p.out_dtype, [&](auto tag) {
      using T = decltype(tag);
      return LaunchDependent(SkinnyKernel<T>, grid, dim3(kSkinnyThreads), 0, s, p, pairs,
                             static_cast<int>(routed));
    });
  }
  const int64_t n_tiles = (p.n + kTileN - 1) / kTileN;
  const int64_t routed = TileSlots(p.max_rows, p.num_experts, kTileM);
  const int64_t blocks = (routed + shared_slots(kTileM)) * n_tiles;
  if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  return DispatchFloat(p.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    static const cudaError_t configured = cudaFuncSetAttribute(
        TiledKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kTiledSmem);
    if (configured != cudaSuccess) return configured;
    return LaunchDependent(TiledKernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kTiledThreads),
                           kTiledSmem, s, p, static_cast<int>(n_tiles), pairs,
                           static_cast<int>(routed));
  });
}

int SiluMulClamp(const SiluMulClampParams& p, void* stream) {
  if (p.rows == 0 || p.inter == 0) return 0;
  if (p.rows < 0 || p.inter < 0 || p.fixed_rows < 0 || p.fixed_rows > p.rows || p.inter % 8 != 0 ||
      p.ld_in % 8 != 0 || p.ld_out % 8 != 0 || p.ld_in < 2 * p.inter || p.ld_out < p.inter ||
      p.in == nullptr || p.out == nullptr || !Aligned16(p.in) || !Aligned16(p.out) ||
      !(p.limit >= 0.0f)) {
    return cudaErrorInvalidValue;
  }
  const int64_t blocks = std::min((p.rows * (p.inter / 8) + 255) / 256, kMaxGrid);
  return DispatchFloat(p.in_dtype, [&](auto tag) {
    using T = decltype(tag);
    return LaunchDependent(SiluMulClampKernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0,
                           static_cast<cudaStream_t>(stream), p);
  });
}

int MoeCombine(const MoeCombineParams& p, void* stream) {
  if (p.num_tokens == 0 || p.hidden == 0) return 0;
  if (p.num_tokens < 0 || p.top_k < 0 || p.hidden < 0 || p.hidden % 8 != 0 || p.ldy % 8 != 0 ||
      p.ldy < p.hidden || p.out == nullptr || !Aligned16(p.out) ||
      (p.shared != nullptr && !Aligned16(p.shared)) || (p.shared_row0 >= 0 && p.y == nullptr) ||
      (p.shared_row0 >= 0 && !Aligned16(p.y)) ||
      (p.top_k > 0 &&
       (p.y == nullptr || !Aligned16(p.y) || p.pair_row == nullptr || p.weights == nullptr))) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((p.hidden + kCombineCols - 1) / kCombineCols),
                  static_cast<unsigned>(std::min<int64_t>(p.num_tokens, 65535)));
  return DispatchFloat(p.y_dtype, [&](auto tag) {
    using T = decltype(tag);
    return LaunchDependent(CombineKernel<T>, grid, dim3(kCombineThreads), 0,
                           static_cast<cudaStream_t>(stream), p);
  });
}

}  // namespace dinfer::kernels::cuda
