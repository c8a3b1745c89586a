// Fp8BlockGemm (gemm.h): FP8 products with 128 x 128 weight block scales and 1 x 128 activation
// group scales on the tensor cores, f32 accumulators. The tensor cores' FP8 sums keep fewer bits
// than f32, so each 128-wide k block is summed in a fresh register set and then promoted:
// acc += partial * x_scale[kb, row] * w_scale[nb, kb], which also applies the scales exactly
// where they change.
//   Wgmma (sm_90a): a CTA of one or two warpgroups computes a 64 or 128 x 128 tile of y, k blocks
//     of 128 bytes staged through a 4-deep cp.async ring in shared memory, 16-byte chunks
//     XOR-swizzled by row (the 128-byte swizzle wgmma reads, and conflict-free for ldmatrix). The
//     128 columns of a tile are one weight block row, so one w_scale a k block serves the CTA.
//   Tiled: the same ring and tiles (or 64 x 128) on mma.sync m16n8k32, 8 warps (2 x 4).
//   Skinny (decode, a few rows): a CTA of 8 warps owns 8 weight rows and 16 activation rows; its
//     warps split the k blocks and read their weights straight into mma fragments (16-byte loads,
//     the k order permuted identically in x and w), then sum through shared memory. The weights
//     are read once per 16 rows, at close to memory bandwidth.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mma.cuh"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kBk = 128;  // k block: one scale block, one pipeline stage
constexpr int kBn = 128;  // tile columns: one weight scale block
constexpr int kThreads = 256;
constexpr int kStages = 4;
constexpr int kGroupM = 8;  // tiles of rows walked together, so neighbouring CTAs share w in L2

__device__ __forceinline__ void MmaE4M3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 bytes that this kernel reads once (the weights): no L1 allocation.
__device__ __forceinline__ uint4 LoadStream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// y[r, c] and y[r, c + 1] (those inside [m, n]); pairs: y and ldy allow one aligned store.
template <typename T>
__device__ __forceinline__ void StorePair(const Fp8GemmParams& p, int64_t r, int64_t c, float v0,
                                          float v1, bool pairs) {
  if (r >= p.m || c >= p.n) return;
  T* q = static_cast<T*>(p.y) + r * p.ldy + c;
  if (pairs && c + 1 < p.n) {
    if constexpr (std::is_same_v<T, float>) {
      *reinterpret_cast<float2*>(q) = make_float2(v0, v1);
    } else {
      *reinterpret_cast<__nv_bfloat162*>(q) = __floats2bfloat162_rn(v0, v1);
    }
    return;
  }
  q[0] = FromFloat<T>(v0);
  if (c + 1 < p.n) q[1] = FromFloat<T>(v1);
}

// Byte offset of 16-byte chunk c of row r in a stage of 128-byte rows.
__device__ __forceinline__ int Swizzled(int r, int c) { return r * kBk + ((c ^ (r & 7)) << 4); }

// The tile of y a CTA computes: blockIdx.x walks kGroupM tiles down m before it moves along n.
struct TileOrigin {
  int64_t m0, n0;
};
template <int kBm>
__device__ __forceinline__ TileOrigin GroupedTile(const Fp8GemmParams& p) {
  const int tiles_m = static_cast<int>((p.m + kBm - 1) / kBm);
  const int tiles_n = static_cast<int>((p.n + kBn - 1) / kBn);
  const int per_group = kGroupM * tiles_n;
  const int pid = blockIdx.x;
  const int first_m = (pid / per_group) * kGroupM;
  const int group_m = min(tiles_m - first_m, kGroupM);
  const int tm = first_m + (pid % per_group) % group_m;
  const int tn = (pid % per_group) / group_m;
  return {static_cast<int64_t>(tm) * kBm, static_cast<int64_t>(tn) * kBn};
}

// Copies k block kb of the tile's kBm rows of x and kBn rows of w into a stage (x first, 128-byte
// rows, swizzled): each of kCopiers threads takes 16-byte chunk (tid % 8) of rows
// tid / 8 + (kCopiers / 8) j. Rows past the end are zero-filled (from a valid address).
template <int kBm, int kCopiers = kThreads>
struct StageLoader {
  const uint8_t *x, *w, *x_src, *w_src;
  int64_t ldx, ldw;
  int m_left, n_left, row, chunk;
  __device__ __forceinline__ StageLoader(const Fp8GemmParams& p, TileOrigin o, int tid)
      : x(static_cast<const uint8_t*>(p.x)),
        w(static_cast<const uint8_t*>(p.w)),
        ldx(p.ldx),
        ldw(p.ldw),
        m_left(static_cast<int>(min(p.m - o.m0, int64_t{kBm}))),
        n_left(static_cast<int>(min(p.n - o.n0, int64_t{kBn}))),
        row(tid >> 3),
        chunk(tid & 7) {
    x_src = x + (o.m0 + row) * ldx + chunk * 16;
    w_src = w + (o.n0 + row) * ldw + chunk * 16;
  }
  __device__ __forceinline__ void Load(uint8_t* stage, int kb) const {
    uint8_t* sb = stage + kBm * kBk;
    const int64_t k0 = static_cast<int64_t>(kb) * kBk;
    constexpr int kRowStep = kCopiers / 8;
#pragma unroll
    for (int j = 0; j < kBm / kRowStep; ++j) {
      const int r = row + j * kRowStep;
      const bool ok = r < m_left;
      CpAsync16(stage + Swizzled(r, chunk), ok ? x_src + j * kRowStep * ldx + k0 : x, ok);
    }
#pragma unroll
    for (int j = 0; j < kBn / kRowStep; ++j) {
      const int r = row + j * kRowStep;
      const bool ok = r < n_left;
      CpAsync16(sb + Swizzled(r, chunk), ok ? w_src + j * kRowStep * ldw + k0 : w, ok);
    }
  }
};

template <int kBm>
constexpr int TiledSmem() {
  return kStages * (kBm + kBn) * kBk;
}

template <int kBm, typename T>
__global__ void __launch_bounds__(kThreads, kBm == 128 ? 1 : 2)
    TiledKernel(const Fp8GemmParams p, const bool pairs) {
  constexpr int kMt = kBm / 32;  // m16 tiles a warp (2 warps along m, each kBm / 2 rows)
  constexpr int kStageBytes = (kBm + kBn) * kBk;
  extern __shared__ uint4 smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);

  WaitForPrerequisites();
  const TileOrigin o = GroupedTile<kBm>(p);
  const int64_t m0 = o.m0, n0 = o.n0;
  const int kb_count = static_cast<int>(p.k / kBk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  const StageLoader<kBm> loader(p, o, tid);
  const int m_left = loader.m_left;
  auto load_stage = [&](int stage, int kb) { loader.Load(smem + stage * kStageBytes, kb); };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kb_count) load_stage(s, s);
    CpAsyncCommit();
  }

  float acc[kMt][4][4] = {};
  const float* w_scale = p.w_scale + (n0 / kBn) * kb_count;
  // This thread's rows of y, relative to m0: row_base + 16 mt (+ 8).
  const int row_base = wm * (kBm / 2) + g;

  for (int kb = 0; kb < kb_count; ++kb) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    // The stage refilled here was read in the previous iteration, which every thread has left.
    if (kb + kStages - 1 < kb_count) load_stage((kb + kStages - 1) % kStages, kb + kStages - 1);
    CpAsyncCommit();

    const float sw = w_scale[kb];
    const float* x_scale = p.x_scale + kb * p.m + m0;
    float sx[kMt][2];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_base + mt * 16 + h * 8;
        sx[mt][h] = r < m_left ? x_scale[r] * sw : 0.0f;
      }
    }

    const uint8_t* sa = smem + (kb % kStages) * kStageBytes;
    const uint8_t* sb = sa + kBm * kBk;
    float part[kMt][4][4] = {};
#pragma unroll
    for (int s = 0; s < kBk / 32; ++s) {
      uint32_t a[kMt][4], b[4][2];
      LoadSwizzledFragments<kMt>(sa, sb, wm * (kBm / 2), wn * 32, s, lane, a, b);
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          MmaE4M3(part[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[nt][0], b[nt][1]);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        acc[mt][nt][0] += part[mt][nt][0] * sx[mt][0];
        acc[mt][nt][1] += part[mt][nt][1] * sx[mt][0];
        acc[mt][nt][2] += part[mt][nt][2] * sx[mt][1];
        acc[mt][nt][3] += part[mt][nt][3] * sx[mt][1];
      }
    }
  }
  CpAsyncWait<0>();
  AllowDependents();

#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int64_t c = n0 + wn * 32 + nt * 8 + t * 2;
      const int64_t r = m0 + row_base + mt * 16;
      StorePair<T>(p, r, c, acc[mt][nt][0], acc[mt][nt][1], pairs);
      StorePair<T>(p, r + 8, c, acc[mt][nt][2], acc[mt][nt][3], pairs);
    }
  }
}

// One wgmma m64n128k32 e4m3 x e4m3 -> f32 of a warpgroup: d = a · bᵀ (+ d when accumulate),
// a and b K-major in shared memory, described by MatrixDesc.
__device__ __forceinline__ void WgmmaE4M3(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
      "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
      "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
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
      : "l"(a), "l"(b), "r"(accumulate));
}

// The sm_90 matrix descriptor of a K-major operand in a stage: 128-byte rows in the 128-byte
// swizzle (Swizzled above), 8-row groups 1,024 bytes apart; the leading offset is unused there.
__device__ __forceinline__ uint64_t MatrixDesc(const void* smem) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((a & 0x3ffff) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

template <int kWarpgroups>
constexpr int WgmmaSmem() {
  return kStages * (64 * kWarpgroups + kBn) * kBk + 1024;  // + alignment of the stages
}

// The tiled product on wgmma (sm_90a): kWarpgroups warpgroups, each 64 rows of a 64 kWarpgroups
// x 128 tile of y, from the same 4-stage cp.async ring; the four m64n128k32 of a k block sum
// into a fresh register set (scale-d off on the first), promoted once the group completes. One
// warpgroup (two CTAs a multiprocessor) makes more tiles where there are few rows.
template <int kWarpgroups, typename T>
__global__ void __launch_bounds__(128 * kWarpgroups, 2 / kWarpgroups)
    WgmmaKernel(const Fp8GemmParams p, const bool pairs) {
  constexpr int kBm = 64 * kWarpgroups;
  constexpr int kStageBytes = (kBm + kBn) * kBk;
  extern __shared__ uint4 smem_raw[];
  // The swizzle repeats every 1,024 bytes: stages start on such a boundary.
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw) + ((1024 - (raw & 1023)) & 1023);

  WaitForPrerequisites();
  const TileOrigin o = GroupedTile<kBm>(p);
  const int kb_count = static_cast<int>(p.k / kBk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2;
  const int g = lane >> 2, t = lane & 3;
  const StageLoader<kBm, 128 * kWarpgroups> loader(p, o, tid);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kb_count) loader.Load(smem + s * kStageBytes, s);
    CpAsyncCommit();
  }

  float acc[64] = {}, part[2][64] = {};
  const float* w_scale = p.w_scale + (o.n0 / kBn) * kb_count;
  // This thread's rows of y, relative to m0: row_base and row_base + 8.
  const int row_base = wg * 64 + (warp & 3) * 16 + g;

  // Issues the four wgmma of k block kb (its stage complete and visible) into d.
  auto issue = [&](float(&d)[64], int kb) {
    const uint8_t* stage = smem + (kb % kStages) * kStageBytes;
    const uint64_t da = MatrixDesc(stage + wg * 64 * kBk), db = MatrixDesc(stage + kBm * kBk);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < kBk / 32; ++s) WgmmaE4M3(d, da + 2 * s, db + 2 * s, s > 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  };
  // Stages written by this thread's cp.async are made visible to the tensor cores (async proxy)
  // and to the other threads.
  auto publish = [] {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
  };
  auto promote = [&](const float(&cur)[64], int kb) {
    const float sw = w_scale[kb];
    const float* x_scale = p.x_scale + kb * p.m + o.m0;
    const float s0 = row_base < loader.m_left ? x_scale[row_base] * sw : 0.0f;
    const float s1 = row_base + 8 < loader.m_left ? x_scale[row_base + 8] * sw : 0.0f;
#pragma unroll
    for (int i = 0; i < 64; i += 4) {
      acc[i] += cur[i] * s0;
      acc[i + 1] += cur[i + 1] * s0;
      acc[i + 2] += cur[i + 2] * s1;
      acc[i + 3] += cur[i + 3] * s1;
    }
  };
  // Block kb (its wgmma issued into cur) with block kb + 1 after it: kb + 1 goes to the tensor
  // cores before kb is promoted, so they stay busy through the promotion.
  auto step = [&](const float(&cur)[64], float(&next)[64], int kb) {
    CpAsyncWait<kStages - 3>();  // block kb + 1 has landed
    publish();
    // Block kb - 1's stage is free: every warpgroup waited for its wgmma before the barrier.
    if (kb + kStages - 1 < kb_count) {
      loader.Load(smem + ((kb + kStages - 1) % kStages) * kStageBytes, kb + kStages - 1);
    }
    CpAsyncCommit();
    issue(next, kb + 1);
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    promote(cur, kb);
  };

  CpAsyncWait<kStages - 2>();  // block 0 has landed
  publish();
  issue(part[0], 0);
  int kb = 0;
  for (; kb + 2 < kb_count; kb += 2) {
    step(part[0], part[1], kb);
    step(part[1], part[0], kb + 1);
  }
  if (kb + 1 < kb_count) {
    step(part[0], part[1], kb);
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    promote(part[1], kb + 1);
  } else {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    promote(part[0], kb);
  }
  CpAsyncWait<0>();
  AllowDependents();

  const int64_t r = o.m0 + row_base;
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    const int64_t c = o.n0 + nt * 8 + t * 2;
    StorePair<T>(p, r, c, acc[4 * nt], acc[4 * nt + 1], pairs);
    StorePair<T>(p, r + 8, c, acc[4 * nt + 2], acc[4 * nt + 3], pairs);
  }
}

constexpr int kSkinnyRows = 8;       // weight rows a CTA (one n8 tile)
constexpr int kSkinnyThreads = 128;  // small CTAs, many resident: few SMs idle in the last wave
constexpr int kSkinnyUnroll = 4;     // k blocks a warp loads before it multiplies

template <typename T>
__global__ void __launch_bounds__(kSkinnyThreads, 6)
    SkinnyKernel(const Fp8GemmParams p, const bool pairs) {
  constexpr int kWarps = kSkinnyThreads / 32;
  __shared__ float4 partial[kWarps][32];
  WaitForPrerequisites();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kSkinnyRows;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int kb_count = static_cast<int>(p.k / kBk);
  // Rows past the end read a valid row; their sums are never stored.
  const int64_t wr = min(n0 + g, p.n - 1);
  const int64_t r0 = m0 + g, r1 = m0 + g + 8;
  const bool ok0 = r0 < p.m, ok1 = r1 < p.m;
  const auto* w = static_cast<const uint8_t*>(p.w) + wr * p.ldw + t * 16;
  const auto* x0 = static_cast<const uint8_t*>(p.x) + (ok0 ? r0 : 0) * p.ldx + t * 16;
  const auto* x1 = static_cast<const uint8_t*>(p.x) + (ok1 ? r1 : 0) * p.ldx + t * 16;
  const float* w_scale = p.w_scale + (n0 / kBn) * kb_count;

  // Lane (g, t) holds bytes t*16 .. t*16+15 and 64+t*16 .. of its rows' k block: the mma's k
  // order within the block is permuted, the same way in x and w, which leaves the sum alone.
  float acc[4] = {};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int kb_base = warp; kb_base < kb_count; kb_base += kWarps * kSkinnyUnroll) {
    uint4 wv[kSkinnyUnroll][2];
#pragma unroll
    for (int u = 0; u < kSkinnyUnroll; ++u) {
      const int kb = kb_base + u * kWarps;
      if (kb < kb_count) {
        wv[u][0] = LoadStream(w + static_cast<int64_t>(kb) * kBk);
        wv[u][1] = LoadStream(w + static_cast<int64_t>(kb) * kBk + 64);
      }
    }
#pragma unroll
    for (int u = 0; u < kSkinnyUnroll; ++u) {
      const int kb = kb_base + u * kWarps;
      if (kb >= kb_count) break;
      const int64_t k0 = static_cast<int64_t>(kb) * kBk;
      uint4 xa[2], xb[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        xa[h] = ok0 ? *reinterpret_cast<const uint4*>(x0 + k0 + 64 * h) : zero;
        xb[h] = ok1 ? *reinterpret_cast<const uint4*>(x1 + k0 + 64 * h) : zero;
      }
      float d[4] = {};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        MmaE4M3(d, xa[h].x, xb[h].x, xa[h].y, xb[h].y, wv[u][h].x, wv[u][h].y);
        MmaE4M3(d, xa[h].z, xb[h].z, xa[h].w, xb[h].w, wv[u][h].z, wv[u][h].w);
      }
      const float sw = w_scale[kb];
      const float s0 = ok0 ? p.x_scale[kb * p.m + r0] * sw : 0.0f;
      const float s1 = ok1 ? p.x_scale[kb * p.m + r1] * sw : 0.0f;
      acc[0] += d[0] * s0;
      acc[1] += d[1] * s0;
      acc[2] += d[2] * s1;
      acc[3] += d[3] * s1;
    }
  }
  partial[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  AllowDependents();
  if (warp != 0) return;
  float4 s = partial[0][lane];
#pragma unroll
  for (int i = 1; i < kWarps; ++i) {
    const float4 v = partial[i][lane];
    s.x += v.x;
    s.y += v.y;
    s.z += v.z;
    s.w += v.w;
  }
  const int64_t c = n0 + t * 2;
  StorePair<T>(p, r0, c, s.x, s.y, pairs);
  StorePair<T>(p, r1, c, s.z, s.w, pairs);
}

template <int kBm, typename T>
cudaError_t LaunchTiled(const Fp8GemmParams& p, bool pairs, cudaStream_t stream) {
  static const cudaError_t configured = cudaFuncSetAttribute(
      TiledKernel<kBm, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, TiledSmem<kBm>());
  if (configured != cudaSuccess) return configured;
  const int64_t tiles = ((p.m + kBm - 1) / kBm) * ((p.n + kBn - 1) / kBn);
  return LaunchDependent(TiledKernel<kBm, T>, dim3(static_cast<unsigned>(tiles)), kThreads,
                         TiledSmem<kBm>(), stream, p, pairs);
}

template <int kWarpgroups, typename T>
cudaError_t LaunchWgmma(const Fp8GemmParams& p, bool pairs, cudaStream_t stream) {
  constexpr int kBm = 64 * kWarpgroups;
  static const cudaError_t configured =
      cudaFuncSetAttribute(WgmmaKernel<kWarpgroups, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           WgmmaSmem<kWarpgroups>());
  if (configured != cudaSuccess) return configured;
  const int64_t tiles = ((p.m + kBm - 1) / kBm) * ((p.n + kBn - 1) / kBn);
  return LaunchDependent(WgmmaKernel<kWarpgroups, T>, dim3(static_cast<unsigned>(tiles)),
                         128 * kWarpgroups, WgmmaSmem<kWarpgroups>(), stream, p, pairs);
}

}  // namespace

bool Fp8BlockGemmSupports(const Fp8GemmParams& p) {
  return p.scaling == Fp8Scaling::kBlock128 && p.k > 0 && p.k % kBk == 0 && p.ldx % 16 == 0 &&
         p.ldw % 16 == 0 && Aligned16(p.x) && Aligned16(p.w) && p.x_scale != nullptr &&
         p.w_scale != nullptr && (p.out_dtype == DType::kF32 || p.out_dtype == DType::kBF16) &&
         p.m < (int64_t{1} << 31) / kBk;
}

int Fp8BlockGemm(const Fp8GemmParams& p, void* stream, Fp8BlockPath path) {
  if (p.m == 0 || p.n == 0) return 0;
  if (!Fp8BlockGemmSupports(p)) return cudaErrorInvalidValue;
  const auto s = static_cast<cudaStream_t>(stream);
  const int64_t elem = p.out_dtype == DType::kF32 ? 4 : 2;
  const bool pairs =
      p.ldy % 2 == 0 && reinterpret_cast<uintptr_t>(p.y) % static_cast<uintptr_t>(2 * elem) == 0;
  if (path == Fp8BlockPath::kAuto) {
    path = p.m <= kFp8BlockSkinnyMaxRows    ? Fp8BlockPath::kSkinny
           : p.m <= kFp8BlockWgmma64MaxRows ? Fp8BlockPath::kWgmma64
                                            : Fp8BlockPath::kWgmma128;
  }
  return DispatchFloat(p.out_dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (path) {
      case Fp8BlockPath::kSkinny: {
        const dim3 grid(static_cast<unsigned>((p.m + 15) / 16),
                        static_cast<unsigned>((p.n + kSkinnyRows - 1) / kSkinnyRows));
        if (grid.y > 65535u) return cudaErrorInvalidValue;
        return LaunchDependent(SkinnyKernel<T>, grid, kSkinnyThreads, 0, s, p, pairs);
      }
      case Fp8BlockPath::kTiled64:
        return LaunchTiled<64, T>(p, pairs, s);
      case Fp8BlockPath::kWgmma64:
        return LaunchWgmma<1, T>(p, pairs, s);
      case Fp8BlockPath::kWgmma128:
        return LaunchWgmma<2, T>(p, pairs, s);
      default:
        return LaunchTiled<128, T>(p, pairs, s);
    }
  });
}

}  // namespace dinfer::kernels::cuda
