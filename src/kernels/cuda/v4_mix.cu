#include <cooperative_groups.h>

#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/v4_mix.h"

namespace dinfer::kernels::cuda {
namespace {

namespace cg = cooperative_groups;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float4 Load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

__device__ __forceinline__ float Dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

template <typename T>
__device__ __forceinline__ void Store4(T* p, float4 v) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = v;
  } else {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 raw;
    raw.x = *reinterpret_cast<const uint32_t*>(&lo);
    raw.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = raw;
  }
}

template <typename T>
__device__ __forceinline__ void Store2(T* p, float a, float b) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  }
}

// ---------------------------------------------------------------------------------------------
// Hyper-connection mixes (HcPre and HcHead share one kernel).
//
// A cluster of kCluster CTAs owns a group of kG tokens; CTA `rank` owns the float4 columns
// [v0, v1) of every stream (a dim / kCluster slice), so it reads exactly the stream values it
// later collapses. Its threads form kT token tiles of kL k-lanes; a thread accumulates the kM
// mixes and the sum of squares of kGt tokens over its k-lane's columns. The partials are summed
// over the warps of a tile, then over the cluster's CTAs through distributed shared memory (in
// rank order, so every CTA gets bit-identical totals). Every CTA then derives pre for all the
// group's tokens; token g's post and comb (Sinkhorn, one lane per comb cell) are written by CTA
// g % kCluster. Each CTA collapses its slice (kept in shared memory), and the sum of squares of
// the collapsed rows meets in the cluster again for the output RMSNorm.

constexpr int kCluster = 8;
constexpr int kMixThreads = 256;
constexpr int kMixWarps = kMixThreads / 32;
constexpr size_t kMaxStashBytes = 160 * 1024;

struct MixArgs {
  const float* streams;
  const int32_t* rows_index;
  const float* fn;
  const float* base;
  const float* scale;
  int64_t tokens, dim, iters;
  float hc_eps, norm_eps;
  float* post;
  float* comb;
  float* collapsed;
  const float* norm_weight;
  void* normed;
};

// Sum of e[0..n) as a pairwise tree, ((e0 + e1) + (e2 + e3)) + ...: the bits of a butterfly of
// shuffles over the same values (each addition is commutative), n a power of 2.
template <int kN>
__device__ __forceinline__ float TreeSum(float (&e)[kN]) {
#pragma unroll
  for (int w = kN / 2; w >= 1; w /= 2) {
#pragma unroll
    for (int j = 0; j < w; ++j) e[j] = e[2 * j] + e[2 * j + 1];
  }
  return e[0];
}

// The comb cell a lane holds (lanes in groups of kHc * kHc, cells row-major) from its logit
// (mix * scale[2] + base): the row softmax plus eps, then Sinkhorn's normalisations, columns
// first, `iters` of them in all (kernels/cpu HcPre). Every lane gathers the kHc values of its row
// (or column) with independent shuffles and sums them as a tree: one shuffle latency per
// normalisation instead of log2(kHc) chained ones, the same bits as a butterfly.
template <int kHc>
__device__ __forceinline__ float SinkhornCell(float v, float eps, int64_t iters) {
  constexpr int kCells = kHc * kHc;
  const int lane = static_cast<int>(threadIdx.x % 32), g0 = lane & ~(kCells - 1);
  const int cell = lane - g0, r = cell / kHc, c = cell % kHc;
  auto row_sum = [&](float x) {
    float e[kHc];
#pragma unroll
    for (int j = 0; j < kHc; ++j) e[j] = __shfl_sync(0xffffffffu, x, g0 + r * kHc + j);
    return TreeSum(e);
  };
  auto col_sum = [&](float x) {
    float e[kHc];
#pragma unroll
    for (int i = 0; i < kHc; ++i) e[i] = __shfl_sync(0xffffffffu, x, g0 + i * kHc + c);
    return TreeSum(e);
  };
  float mx = v;
#pragma unroll
  for (int j = 0; j < kHc; ++j) mx = fmaxf(mx, __shfl_sync(0xffffffffu, v, g0 + r * kHc + j));
  const float e = expf(v - mx);
  v = e / row_sum(e) + eps;
  v = v / (col_sum(v) + eps);
  for (int64_t it = 1; it < iters; ++it) {
    v = v / (row_sum(v) + eps);
    v = v / (col_sum(v) + eps);
  }
  return v;
}

template <int kHc, bool kHead, int kT, int kGt, typename OutT>
__global__ void __launch_bounds__(kMixThreads) HcMixKernel(MixArgs a) {
  constexpr int kM = kHead ? kHc : (2 + kHc) * kHc;  // mixes per token
  constexpr int kP = kM + 1;                         // partials per token: mixes, sum of squares
  constexpr int kG = kT * kGt;                       // tokens per cluster
  constexpr int kL = kMixThreads / kT;               // k-lanes per token tile
  constexpr int kTileWarps = kL / 32;
  static_assert(kL % 32 == 0, "a token tile is whole warps");
  constexpr int kCells = kHc * kHc;
  static_assert(32 % kCells == 0, "comb cells of a token fit in a warp");

  __shared__ float red[kMixWarps][kGt * kP];
  __shared__ float part[kG * kP];  // this CTA's partial sums, read by the whole cluster
  __shared__ float total[kG * kP];
  __shared__ float pre[kG][kHc];
  __shared__ float sq_part[kG];      // this CTA's share of each collapsed row's sum of squares
  extern __shared__ float4 stash[];  // [kG][ns]: this CTA's slice of the collapsed rows

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t t0 = static_cast<int64_t>(blockIdx.x / kCluster) * kG;
  const int64_t dim = a.dim, width = kHc * dim, nvec = dim / 4;
  const int64_t v0 = nvec * rank / kCluster, v1 = nvec * (rank + 1) / kCluster;
  const int ns = static_cast<int>(v1 - v0);
  const int tile = threadIdx.x / kL, lane = threadIdx.x % kL;
  const int warp = threadIdx.x / 32, wlane = threadIdx.x % 32;

  // fn does not depend on the kernel before: pull this CTA's slice towards L2 meanwhile.
  {
    const int lines = (ns + 7) / 8;  // 128-byte lines per (mix, stream) row of the slice
    for (int j = threadIdx.x; j < kM * kHc * lines; j += kMixThreads) {
      const int q = j / lines, c = (j % lines) * 8;
      const float* addr = a.fn + (q / kHc) * width + (q % kHc) * dim + 4 * (v0 + c);
      asm volatile("prefetch.global.L2 [%0];" ::"l"(addr));
    }
  }
  WaitForPrerequisites();
  AllowDependents();

  auto row_of = [&](int64_t t) -> int64_t {
    return a.rows_index != nullptr ? static_cast<int64_t>(a.rows_index[t]) : t;
  };

  // 1. Partial dot products with fn and sums of squares over this CTA's slice.
  const float* xrow[kGt];
#pragma unroll
  for (int g = 0; g < kGt; ++g) {
    const int64_t t = t0 + tile * kGt + g;
    xrow[g] = a.streams + row_of(t < a.tokens ? t : a.tokens - 1) * width;  // tail: discarded
  }
  float acc[kGt][kM], ss[kGt];
#pragma unroll
  for (int g = 0; g < kGt; ++g) {
    ss[g] = 0.0f;
#pragma unroll
    for (int m = 0; m < kM; ++m) acc[g][m] = 0.0f;
  }
  // The slice's kHc * ns float4 columns, flattened so that every k-lane has work.
  for (int j = lane; j < kHc * ns; j += kL) {
    const int i = j / ns;
    const int64_t off = i * dim + 4 * (v0 + j - i * ns);
    float4 xv[kGt];
#pragma unroll
    for (int g = 0; g < kGt; ++g) {
      xv[g] = Load4(xrow[g] + off);
      ss[g] = Dot4(xv[g], xv[g], ss[g]);
    }
    const float* f = a.fn + off;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const float4 w = __ldg(reinterpret_cast<const float4*>(f + m * width));
#pragma unroll
      for (int g = 0; g < kGt; ++g) acc[g][m] = Dot4(w, xv[g], acc[g][m]);
    }
  }
#pragma unroll
  for (int g = 0; g < kGt; ++g) {
#pragma unroll
    for (int q = 0; q < kP; ++q) {
      const float v = WarpSum(q < kM ? acc[g][q] : ss[g]);
      if (wlane == 0) red[warp][g * kP + q] = v;
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < kG * kP; j += kMixThreads) {
    const int gg = j / kP, q = j % kP, tl = gg / kGt, g = gg % kGt;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kTileWarps; ++w) s += red[tl * kTileWarps + w][g * kP + q];
    part[j] = s;
  }
  cluster.sync();
  for (int j = threadIdx.x; j < kG * kP; j += kMixThreads) {
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) s += cluster.map_shared_rank(part, r)[j];
    total[j] = s;
  }
  __syncthreads();

  // 2. pre for every token of the group; post and comb for the tokens this CTA owns.
  const float inv_width = 1.0f / static_cast<float>(width);
  auto inv_rms = [&](int g) { return 1.0f / sqrtf(total[g * kP + kM] * inv_width + a.norm_eps); };
  for (int j = threadIdx.x; j < kG * kHc; j += kMixThreads) {
    const int g = j / kHc, i = j % kHc;
    const float mix = total[g * kP + i] * inv_rms(g);
    pre[g][i] = Sigmoid(mix * a.scale[0] + a.base[i]) + a.hc_eps;
  }
  if constexpr (!kHead) {
    constexpr int kPerWarp = 32 / kCells;
    const int owned = kG > rank ? (kG - rank + kCluster - 1) / kCluster : 0;
    const int cell = wlane % kCells, r = cell / kHc, c = cell % kHc;
    const float eps = a.hc_eps;
    for (int first = warp * kPerWarp; first < owned; first += kMixWarps * kPerWarp) {
      const int q = first + wlane / kCells;
      const int g = rank + kCluster * (q < owned ? q : owned - 1);
      const int64_t t = t0 + g;
      const bool valid = q < owned && t < a.tokens;
      const float inv = inv_rms(g);
      const float* tot = total + g * kP;
      const float v = SinkhornCell<kHc>(
          tot[2 * kHc + cell] * inv * a.scale[2] + a.base[2 * kHc + cell], eps, a.iters);
      if (valid) {
        a.comb[t * kCells + r * kHc + c] = v;
        if (cell < kHc) {
          const float m = tot[kHc + cell] * inv;
          a.post[t * kHc + cell] = 2.0f * Sigmoid(m * a.scale[1] + a.base[kHc + cell]);
        }
      }
    }
  }
  __syncthreads();

  // 3. Collapse this CTA's slice: Σ_i pre_i streams_i (one warp per token).
  for (int g = warp; g < kG; g += kMixWarps) {
    const int64_t t = t0 + g;
    float s = 0.0f;
    if (t < a.tokens) {
      const float* x = a.streams + row_of(t) * width;
      for (int v = wlane; v < ns; v += 32) {
        const int64_t col = 4 * (v0 + v);
        float4 cv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < kHc; ++i) {
          const float4 xi = Load4(x + i * dim + col);
          const float w = pre[g][i];
          cv.x = fmaf(w, xi.x, cv.x);
          cv.y = fmaf(w, xi.y, cv.y);
          cv.z = fmaf(w, xi.z, cv.z);
          cv.w = fmaf(w, xi.w, cv.w);
        }
        stash[g * ns + v] = cv;
        if (!kHead && a.collapsed != nullptr) Store4(a.collapsed + t * dim + col, cv);
        s = Dot4(cv, cv, s);
      }
    }
    s = WarpSum(s);
    if (wlane == 0) sq_part[g] = s;
  }
  cluster.sync();  // sq_part is complete; every CTA is done with the others' `part`

  // 4. normed = collapsed / rms(collapsed) * norm_weight.
  if (a.normed != nullptr) {
    const float inv_dim = 1.0f / static_cast<float>(dim);
    for (int g = warp; g < kG; g += kMixWarps) {
      const int64_t t = t0 + g;
      if (t >= a.tokens) continue;
      float s = 0.0f;
#pragma unroll
      for (int r = 0; r < kCluster; ++r) s += cluster.map_shared_rank(sq_part, r)[g];
      const float inv = 1.0f / sqrtf(s * inv_dim + a.norm_eps);
      OutT* out = static_cast<OutT*>(a.normed) + t * dim;
      for (int v = wlane; v < ns; v += 32) {
        const int64_t col = 4 * (v0 + v);
        const float4 cv = stash[g * ns + v];
        const float4 w = Load4(a.norm_weight + col);
        Store4(out + col, make_float4((cv.x * inv) * w.x, (cv.y * inv) * w.y, (cv.z * inv) * w.z,
                                      (cv.w * inv) * w.w));
      }
    }
    cluster.sync();  // the others' sq_part stays alive until every CTA has read it
  }
}

template <int kHc, bool kHead, int kT, int kGt, typename OutT>
cudaError_t LaunchMixConfig(const MixArgs& a, cudaStream_t stream) {
  constexpr int kG = kT * kGt;
  auto* kernel = HcMixKernel<kHc, kHead, kT, kGt, OutT>;
  static const cudaError_t attr = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxStashBytes));
  if (attr != cudaSuccess) return attr;
  const int64_t ns_max = (a.dim / 4 + kCluster - 1) / kCluster;
  const size_t smem = static_cast<size_t>(kG * ns_max) * sizeof(float4);
  if (smem > kMaxStashBytes) return cudaErrorInvalidValue;
  const int64_t clusters = (a.tokens + kG - 1) / kG;
  return LaunchDependentCluster(kernel, dim3(static_cast<unsigned>(clusters * kCluster)),
                                dim3(kMixThreads), smem, dim3(kCluster), stream, a);
}

// ---------------------------------------------------------------------------------------------
// Decode path of HcPre / HcHead (a workspace, few tokens): two kernels.
//
// HcPartialKernel: CTA (s, group) owns the float4 columns [s * kSliceVec, (s + 1) * kSliceVec)
// of the hc * dim values of a token (a slice of every fn row, read before the wait for the kernel
// before, and of every stream row of the group's kTok tokens), stages both in shared memory and
// writes, for each token t and partial q (the kM mixes, then the sum of squares), the slice's
// dot product (columns in order) to ws[(t * kP + q) * slices + s].
// HcFinishKernel: no cluster, nothing shared between CTAs. CTA (t, 0) owns token t's sublayer
// input: it sums the partials of pre and of the sum of squares (a warp per partial, lane-strided
// then a butterfly: the same fixed order everywhere), derives pre, collapses the whole row (its
// stream loads issued together with the partials' loads), and the collapsed row's sum of squares
// is a block reduction for the output RMSNorm. CTA (t, 1) (HcPre only) sums the partials of post
// and comb and runs Sinkhorn, in parallel on another SM. The weights (base, scale, the norm
// weight) are read before the wait for the partial kernel.

constexpr int kSliceVec = 32;  // float4 columns per partial CTA
constexpr int kPartThreads = 256;
constexpr int kFinThreads = 512;
constexpr int kFinU = 2;  // float4 columns of a thread whose loads are in flight together
constexpr int kFinWarps = kFinThreads / 32;

int64_t HcSlices(int64_t hc, int64_t dim) { return (hc * dim / 4 + kSliceVec - 1) / kSliceVec; }

struct PartArgs {
  const float* streams;
  const int32_t* rows_index;
  const float* fn;
  int64_t tokens, dim, slices;
  float* ws;
};

// A partial CTA's slice of fn: kM rows of nc float4 columns from column c0 (a weight: read before
// the wait for the kernel before).
template <int kM>
__device__ __forceinline__ void LoadFnSlice(float4 (*fsl)[kSliceVec + 1], const float* fn,
                                            int64_t width, int64_t c0, int nc) {
  for (int j = threadIdx.x; j < kM * kSliceVec; j += kPartThreads) {
    const int m = j / kSliceVec, c = j % kSliceVec;
    if (c < nc) fsl[m][c] = __ldg(reinterpret_cast<const float4*>(fn + m * width) + c0 + c);
  }
}

// The slice's partials from the staged fn and stream slices: for token t0 + g and partial q (the
// kM mixes, then the sum of squares), kPartSplit adjacent lanes share the pair: lane `part` takes
// columns part, part + kPartSplit, ... in order, then the kPartSplit sums meet in a fixed
// butterfly; the result goes to ws[(t * kP + q) * slices + s]. The order does not depend on kTok,
// so any grouping of the tokens gives the same bits.
constexpr int kPartSplit = 8;
template <int kM, int kTok>
__device__ __forceinline__ void SlicePartials(const float4 (*fsl)[kSliceVec + 1],
                                              const float4 (*xsl)[kSliceVec + 1], int nc,
                                              int64_t t0, int64_t tokens, int64_t s, int64_t slices,
                                              float* ws) {
  constexpr int kP = kM + 1;
  constexpr int kPairs = kTok * kP;
  static_assert(32 % kPartSplit == 0 && kPartThreads % 32 == 0, "a pair's lanes share a warp");
  const int part = threadIdx.x % kPartSplit;
  for (int first = 0; first < kPairs * kPartSplit; first += kPartThreads) {  // uniform bounds
    const int j = (first + threadIdx.x) / kPartSplit, g = j / kP, q = j % kP;
    const int64_t t = t0 + g;
    const bool active = j < kPairs && t < tokens;
    float acc = 0.0f;
    if (active) {
      const float4* w = q < kM ? fsl[q] : xsl[g];
      const float4* x = xsl[g];
#pragma unroll 4
      for (int c = part; c < nc; c += kPartSplit) acc = Dot4(w[c], x[c], acc);
    }
#pragma unroll
    for (int o = 1; o < kPartSplit; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (active && part == 0) ws[(t * kP + q) * slices + s] = acc;
  }
}

template <int kHc, bool kHead, int kTok>
__global__ void __launch_bounds__(kPartThreads) HcPartialKernel(PartArgs a) {
  constexpr int kM = kHead ? kHc : (2 + kHc) * kHc;
  __shared__ float4 fsl[kM][kSliceVec + 1];  // padded rows: lanes on different rows, other banks
  __shared__ float4 xsl[kTok][kSliceVec + 1];
  const int64_t width = kHc * a.dim, nvec = width / 4;
  const int64_t s = blockIdx.x, c0 = s * kSliceVec;
  const int nc = static_cast<int>(nvec - c0 < kSliceVec ? nvec - c0 : kSliceVec);
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;

  LoadFnSlice<kM>(fsl, a.fn, width, c0, nc);
  WaitForPrerequisites();
  AllowDependents();
  for (int j = threadIdx.x; j < kTok * kSliceVec; j += kPartThreads) {
    const int g = j / kSliceVec, c = j % kSliceVec;
    const int64_t t = t0 + g;
    if (c < nc && t < a.tokens) {
      const int64_t row = a.rows_index != nullptr ? static_cast<int64_t>(a.rows_index[t]) : t;
      xsl[g][c] = Load4(a.streams + row * width + 4 * (c0 + c));
    }
  }
  __syncthreads();
  SlicePartials<kM, kTok>(fsl, xsl, nc, t0, a.tokens, s, a.slices, a.ws);
}

// One output float4 of HcPost: stream k at the float4 whose stream values are xs:
// post_k * y + Σ_j comb[j][k] * xs_j (HcPost's kernels share it, so both give the same bits).
template <int kHc>
__device__ __forceinline__ float4 PostOut(const float4 (&xs)[kHc], float4 y, const float* comb,
                                          float pk, int k) {
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < kHc; ++j) {
    const float w = comb[j * kHc + k];
    acc.x = fmaf(w, xs[j].x, acc.x);
    acc.y = fmaf(w, xs[j].y, acc.y);
    acc.z = fmaf(w, xs[j].z, acc.z);
    acc.w = fmaf(w, xs[j].w, acc.w);
  }
  return make_float4(fmaf(pk, y.x, acc.x), fmaf(pk, y.y, acc.y), fmaf(pk, y.z, acc.z),
                     fmaf(pk, y.w, acc.w));
}

// HcPost with the next op's partials: CTA (s, group) is HcPartialKernel's CTA (s, group), but
// computes the slice of the new streams (all of `out` is covered: every float4 of a token's
// hc * dim values lies in one slice) instead of loading it, writes it to out and keeps it staged.
struct PostPartArgs {
  HcPostParams p;
  int64_t slices;
};

template <int kHc, bool kHead, int kTok>
__global__ void __launch_bounds__(kPartThreads) HcPostPartialKernel(PostPartArgs a) {
  constexpr int kM = kHead ? kHc : (2 + kHc) * kHc;
  __shared__ float4 fsl[kM][kSliceVec + 1];
  __shared__ float4 xsl[kTok][kSliceVec + 1];
  const HcPostParams& p = a.p;
  const int64_t dim = p.dim, dvec = dim / 4, width = kHc * dim, nvec = width / 4;
  const int64_t s = blockIdx.x, c0 = s * kSliceVec;
  const int nc = static_cast<int>(nvec - c0 < kSliceVec ? nvec - c0 : kSliceVec);
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;

  LoadFnSlice<kM>(fsl, p.next_fn, width, c0, nc);
  WaitForPrerequisites();
  AllowDependents();
  for (int j = threadIdx.x; j < kTok * kSliceVec; j += kPartThreads) {
    const int g = j / kSliceVec, c = j % kSliceVec;
    const int64_t t = t0 + g;
    if (c < nc && t < p.num_tokens) {
      const int64_t v = c0 + c, k = v / dvec, col = 4 * (v - k * dvec);
      const float* x = p.streams + t * width + col;
      float4 xs[kHc];
#pragma unroll
      for (int i = 0; i < kHc; ++i) xs[i] = Load4(x + i * dim);
      const float4 y = Load4(p.y + t * dim + col);
      const float4 o =
          PostOut<kHc>(xs, y, p.comb + t * kHc * kHc, p.post[t * kHc + k], static_cast<int>(k));
      Store4(p.out + t * width + 4 * v, o);
      xsl[g][c] = o;
    }
  }
  __syncthreads();
  SlicePartials<kM, kTok>(fsl, xsl, nc, t0, p.num_tokens, s, a.slices, p.next_workspace);
}

// Partial row `row` ([slices] floats) summed by a warp: lane-strided, then a butterfly.
__device__ __forceinline__ float SumPartials(const float* row, int64_t slices, int lane) {
  float s = 0.0f;
#pragma unroll 4
  for (int64_t i = lane; i < slices; i += 32) s += row[i];
  return WarpSum(s);
}

template <int kHc, bool kHead, typename OutT>
__global__ void __launch_bounds__(kFinThreads)
    HcFinishKernel(MixArgs a, const float* ws, int64_t slices, bool ws_by_stream_row) {
  constexpr int kM = kHead ? kHc : (2 + kHc) * kHc;
  constexpr int kP = kM + 1;
  constexpr int kCells = kHc * kHc;
  static_assert(32 % kCells == 0, "comb cells of a token fit in a warp");
  static_assert(kFinWarps > kHc, "a warp per pre partial and one for the sum of squares");
  __shared__ float total[kP];
  __shared__ float red[kFinWarps];
  extern __shared__ float4 stash[];  // role 1: the token's partials; role 0: the collapsed row

  const int64_t t = blockIdx.x;
  const int64_t dim = a.dim, width = kHc * dim, nvec = dim / 4;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, wlane = tid % 32;
  const float* part = ws + t * kP * slices;  // HcPre: stream row t
  const float inv_width = 1.0f / static_cast<float>(width);

  if constexpr (!kHead) {
    if (blockIdx.y == 1) {
      // post and comb: the partials of mixes kHc .. kM - 1 and the sum of squares, staged in
      // shared memory (all loads in flight at once), summed, then Sinkhorn in warp 0.
      const int cell = wlane % kCells;
      float comb_base = 0.0f, post_base = 0.0f, scale1 = 0.0f, scale2 = 0.0f;
      if (warp == 0) {
        comb_base = a.base[2 * kHc + cell];
        post_base = a.base[kHc + cell % kHc];
        scale1 = a.scale[1];
        scale2 = a.scale[2];
      }
      WaitForPrerequisites();
      AllowDependents();
      float* buf = reinterpret_cast<float*>(stash);
      const int n = static_cast<int>((kP - kHc) * slices);
      const float* src = part + kHc * slices;
      constexpr int kU = 8;
      for (int first = tid; first < n; first += kFinThreads * kU) {
        float v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int i = first + u * kFinThreads;
          v[u] = i < n ? src[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int i = first + u * kFinThreads;
          if (i < n) buf[i] = v[u];
        }
      }
      __syncthreads();
      for (int q = kHc + warp; q < kP; q += kFinWarps) {
        float s = 0.0f;
        for (int64_t i = wlane; i < slices; i += 32) s += buf[(q - kHc) * slices + i];
        s = WarpSum(s);
        if (wlane == 0) total[q] = s;
      }
      __syncthreads();
      if (warp == 0) {
        const float inv = 1.0f / sqrtf(total[kM] * inv_width + a.norm_eps);
        const float v =
            SinkhornCell<kHc>(total[2 * kHc + cell] * inv * scale2 + comb_base, a.hc_eps, a.iters);
        if (wlane < kCells) {
          a.comb[t * kCells + cell] = v;
          if (cell < kHc) {
            const float m = total[kHc + cell] * inv;
            a.post[t * kHc + cell] = 2.0f * Sigmoid(m * scale1 + post_base);
          }
        }
      }
      return;
    }
  }

  // The sublayer input. Weights first: pre's base and scale, this thread's first norm weights.
  float pre_base[kHc];
#pragma unroll
  for (int i = 0; i < kHc; ++i) pre_base[i] = a.base[i];
  const float scale0 = a.scale[0];
  float4 w0[kFinU];
#pragma unroll
  for (int u = 0; u < kFinU; ++u) {
    const int64_t v = tid + u * kFinThreads;
    w0[u] = a.normed != nullptr && v < nvec ? Load4(a.norm_weight + 4 * v)
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  WaitForPrerequisites();
  AllowDependents();

  const int64_t row = a.rows_index != nullptr ? static_cast<int64_t>(a.rows_index[t]) : t;
  const float* x = a.streams + row * width;
  if (ws_by_stream_row) part = ws + row * kP * slices;  // partials written by HcPost
  float4 xs[kFinU][kHc];
  auto load_chunk = [&](int64_t first) {
#pragma unroll
    for (int u = 0; u < kFinU; ++u) {
      const int64_t v = first + u * kFinThreads;
#pragma unroll
      for (int i = 0; i < kHc; ++i) {
        xs[u][i] = v < nvec ? Load4(x + i * dim + 4 * v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  };
  load_chunk(tid);  // in flight with the partials' loads
  if (warp < kHc || warp == kHc) {
    const int q = warp < kHc ? warp : kM;
    const float s = SumPartials(part + q * slices, slices, wlane);
    if (wlane == 0) total[q] = s;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(total[kM] * inv_width + a.norm_eps);
  float pre[kHc];
#pragma unroll
  for (int i = 0; i < kHc; ++i) pre[i] = Sigmoid(total[i] * inv * scale0 + pre_base[i]) + a.hc_eps;

  // Collapse (kept in shared memory) and its sum of squares.
  float ssq = 0.0f;
  for (int64_t first = tid; first < nvec; first += kFinThreads * kFinU) {
    if (first != tid) load_chunk(first);
#pragma unroll
    for (int u = 0; u < kFinU; ++u) {
      const int64_t v = first + u * kFinThreads;
      if (v >= nvec) break;
      float4 cv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < kHc; ++i) {
        const float4 xi = xs[u][i];
        const float w = pre[i];
        cv.x = fmaf(w, xi.x, cv.x);
        cv.y = fmaf(w, xi.y, cv.y);
        cv.z = fmaf(w, xi.z, cv.z);
        cv.w = fmaf(w, xi.w, cv.w);
      }
      stash[v] = cv;
      if (!kHead && a.collapsed != nullptr) Store4(a.collapsed + t * dim + 4 * v, cv);
      ssq = Dot4(cv, cv, ssq);
    }
  }
  if (a.normed == nullptr) return;
  ssq = WarpSum(ssq);
  if (wlane == 0) red[warp] = ssq;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kFinWarps; ++w) s += red[w];
  const float inv_out = 1.0f / sqrtf(s * (1.0f / static_cast<float>(dim)) + a.norm_eps);

  // normed = collapsed / rms(collapsed) * norm_weight (a thread reads back its own columns).
  OutT* out = static_cast<OutT*>(a.normed) + t * dim;
  for (int64_t first = tid; first < nvec; first += kFinThreads * kFinU) {
#pragma unroll
    for (int u = 0; u < kFinU; ++u) {
      const int64_t v = first + u * kFinThreads;
      if (v >= nvec) break;
      const float4 cv = stash[v];
      const float4 w = first == tid ? w0[u] : Load4(a.norm_weight + 4 * v);
      Store4(out + 4 * v, make_float4((cv.x * inv_out) * w.x, (cv.y * inv_out) * w.y,
                                      (cv.z * inv_out) * w.z, (cv.w * inv_out) * w.w));
    }
  }
}

// Shared memory of HcFinishKernel: the collapsed row (role 0) or the partials of post and comb
// (role 1), whichever is larger.
size_t FinishSmem(int64_t num_partials, int64_t hc, int64_t dim) {
  const size_t partials = static_cast<size_t>(num_partials * HcSlices(hc, dim)) * sizeof(float);
  const size_t row = static_cast<size_t>(dim) * sizeof(float);
  return partials > row ? partials : row;
}

// The finishing kernel's shared memory fits at every dim of the workspace path (hc 4).
static_assert(kHcWorkspaceMaxDim * sizeof(float) <= kMaxStashBytes && (2 + 4) * 4 + 1 == 25 &&
                  25 * (4 * kHcWorkspaceMaxDim / 4 / kSliceVec) * sizeof(float) <= kMaxStashBytes,
              "HcFinishKernel's shared memory at kHcWorkspaceMaxDim");

// The token grouping of the partial kernels (HcPartialKernel, HcPostPartialKernel) by the token
// count: 1, 4 or 16 tokens per CTA (the bits do not depend on it).
template <typename F>
cudaError_t DispatchPartTokens(int64_t tokens, F&& f) {
  if (tokens == 1) return f(std::integral_constant<int, 1>{});
  if (tokens <= 4) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 16>{});
}

// partials_ready: the workspace holds the partials by stream row (HcPost wrote them).
template <bool kHead, typename OutT>
cudaError_t LaunchMixWorkspace(const MixArgs& a, float* ws, bool partials_ready,
                               cudaStream_t stream) {
  constexpr int kM = kHead ? 4 : (2 + 4) * 4;
  const int64_t slices = HcSlices(4, a.dim);
  const PartArgs pa{a.streams, a.rows_index, a.fn, a.tokens, a.dim, slices, ws};
  cudaError_t e = cudaSuccess;
  const auto sx = static_cast<unsigned>(slices);
  if (partials_ready) {
    // nothing to compute
  } else if (a.tokens == 1) {
    e = LaunchDependent(HcPartialKernel<4, kHead, 1>, dim3(sx, 1), kPartThreads, 0, stream, pa);
  } else if (a.tokens <= 4) {
    e = LaunchDependent(HcPartialKernel<4, kHead, 4>, dim3(sx, 1), kPartThreads, 0, stream, pa);
  } else {
    const auto groups = static_cast<unsigned>((a.tokens + 15) / 16);
    e = LaunchDependent(HcPartialKernel<4, kHead, 16>, dim3(sx, groups), kPartThreads, 0, stream,
                        pa);
  }
  if (e != cudaSuccess) return e;

  auto* kernel = HcFinishKernel<4, kHead, OutT>;
  static const cudaError_t attr = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMaxStashBytes));
  if (attr != cudaSuccess) return attr;
  const float* cws = ws;
  const dim3 grid(static_cast<unsigned>(a.tokens), kHead ? 1 : 2);
  return LaunchDependent(kernel, grid, kFinThreads, FinishSmem(kM + 1, 4, a.dim), stream, a, cws,
                         slices, partials_ready);
}

// Tokens per cluster by the token count: 1 (decode: up to 16 clusters read fn), 4, or 32
// (prefill: fn is reused across 32 tokens per CTA) when the collapsed slices fit in shared memory.
// With a workspace, up to kHcWorkspaceMaxTokens tokens take the two-kernel decode path.
template <bool kHead>
cudaError_t LaunchMix(const MixArgs& a, DType normed_dtype, float* ws, bool partials_ready,
                      cudaStream_t stream) {
  const bool use_ws = ws != nullptr && HcWorkspacePath(a.tokens, a.dim);
  return DispatchFloat(a.normed != nullptr ? normed_dtype : DType::kF32, [&](auto o) {
    using OutT = decltype(o);
    if (use_ws) return LaunchMixWorkspace<kHead, OutT>(a, ws, partials_ready, stream);
    const int64_t ns_max = (a.dim / 4 + kCluster - 1) / kCluster;
    if (a.tokens <= 16) return LaunchMixConfig<4, kHead, 1, 1, OutT>(a, stream);
    if (a.tokens <= 512 || static_cast<size_t>(32 * ns_max) * sizeof(float4) > kMaxStashBytes) {
      return LaunchMixConfig<4, kHead, 1, 4, OutT>(a, stream);
    }
    return LaunchMixConfig<4, kHead, 8, 4, OutT>(a, stream);
  });
}

bool NormedOk(const void* normed, DType dtype, const float* weight) {
  if (normed == nullptr) return true;
  if (weight == nullptr || !Aligned16(weight)) return false;
  if (dtype == DType::kF32) return Aligned16(normed);
  return dtype == DType::kBF16 && (reinterpret_cast<uintptr_t>(normed) & 7) == 0;
}

// ---------------------------------------------------------------------------------------------
// HcPost: one thread per (token, 4 columns), all hc output streams.

template <int kHc>
__global__ void __launch_bounds__(256) HcPostKernel(HcPostParams p) {
  WaitForPrerequisites();
  AllowDependents();
  const int64_t dim = p.dim, nvec = dim / 4, total = p.num_tokens * nvec;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / nvec, col = 4 * (idx % nvec);
    const float* x = p.streams + t * kHc * dim + col;
    float4 xs[kHc];
#pragma unroll
    for (int j = 0; j < kHc; ++j) xs[j] = Load4(x + j * dim);
    const float4 y = Load4(p.y + t * dim + col);
    const float* comb = p.comb + t * kHc * kHc;
    const float* post = p.post + t * kHc;
#pragma unroll
    for (int k = 0; k < kHc; ++k) {
      Store4(p.out + (t * kHc + k) * dim + col, PostOut<kHc>(xs, y, comb, post[k], k));
    }
  }
}

int GridFor(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<int>(blocks < 132 * 16 ? (blocks > 0 ? blocks : 1) : 132 * 16);
}

// ---------------------------------------------------------------------------------------------
// Route: one warp per token; lane l holds experts l, l + 32, ... (kPer of them).

constexpr int kRouteWarps = 4;

template <int kPer>
__global__ void __launch_bounds__(kRouteWarps * 32) RouteKernel(RouteParams p) {
  __shared__ float scores[kRouteWarps][kPer * 32];
  WaitForPrerequisites();
  AllowDependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= p.num_tokens) return;
  const int ne = static_cast<int>(p.num_experts), k = static_cast<int>(p.top_k);
  const float* logits = p.logits + t * p.ld;
  float s[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    s[j] = e < ne ? logits[e] : 0.0f;
  }
  switch (p.scoring) {
    case RouterScoring::kSqrtSoftplus:
#pragma unroll
      for (int j = 0; j < kPer; ++j) s[j] = sqrtf(s[j] > 20.0f ? s[j] : log1pf(expf(s[j])));
      break;
    case RouterScoring::kSigmoid:
#pragma unroll
      for (int j = 0; j < kPer; ++j) s[j] = Sigmoid(s[j]);
      break;
    case RouterScoring::kSoftmax: {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (lane + 32 * j < ne) mx = fmaxf(mx, s[j]);
      }
      mx = WarpMax(mx);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        s[j] = lane + 32 * j < ne ? expf(s[j] - mx) : 0.0f;
        sum += s[j];
      }
      sum = WarpSum(sum);
#pragma unroll
      for (int j = 0; j < kPer; ++j) s[j] /= sum;
      break;
    }
  }
  float* sc = scores[warp];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (lane + 32 * j < ne) sc[lane + 32 * j] = s[j];
  }
  __syncwarp();
  int32_t* experts = p.experts + t * k;
  float* weights = p.weights + t * k;
  float sum = 0.0f, mine = 0.0f;
  int32_t my_expert = -1;
  if (p.tid2eid != nullptr) {
    const int32_t tok = p.token_ids[t];
    if (tok < 0 || tok >= p.vocab) {
      if (lane < k) {
        experts[lane] = -1;
        weights[lane] = 0.0f;
      }
      return;
    }
    const int32_t* row = p.tid2eid + static_cast<int64_t>(tok) * k;
    for (int i = 0; i < k; ++i) {
      const int32_t e = row[i];
      const float w = e >= 0 && e < ne ? sc[e] : 0.0f;
      sum += w;
      if (i == lane) {
        mine = w;
        my_expert = e;
      }
    }
  } else {
    float b[kPer];
    uint32_t taken = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = lane + 32 * j;
      if (e < ne) {
        b[j] = s[j] + (p.bias != nullptr ? p.bias[e] : 0.0f);
      } else {
        b[j] = 0.0f;
        taken |= 1u << j;
      }
    }
    for (int i = 0; i < k; ++i) {
      float bv = -INFINITY;
      int be = INT_MAX;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (!((taken >> j) & 1u) && (b[j] > bv || (b[j] == bv && lane + 32 * j < be))) {
          bv = b[j];
          be = lane + 32 * j;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (ov > bv || (ov == bv && oe < be)) {
          bv = ov;
          be = oe;
        }
      }
      if (be < ne && (be & 31) == lane) taken |= 1u << (be >> 5);
      const float w = be < ne ? sc[be] : 0.0f;
      sum += w;
      if (i == lane) {
        mine = w;
        my_expert = be < ne ? be : -1;
      }
    }
  }
  if (lane < k) {
    experts[lane] = my_expert;
    weights[lane] = (p.normalize ? mine / (sum + 1e-20f) : mine) * p.scaling;
  }
}

// ---------------------------------------------------------------------------------------------
// NormRope (a batch of up to kNormRopeMaxJobs jobs in one grid): CTAs [cta_end[j - 1],
// cta_end[j]) take job j's rows, kRopeWarps of them per CTA, one warp per (token, head) row; lane l
// owns the pairs l, l + 32, ... Rows of up to 32 * kPer pairs (kPer <= 16: head_dim <= 1024) are
// held in registers: the lane's norm weights and rotary frequencies are read before the wait for
// the kernel before, then all its pairs are loaded at once. Longer rows stream twice
// (NormRopeLoop). The per-lane sum of squares and every product are those of the one-job kernel it
// replaces.

constexpr int kRopeWarps = 8;

struct NormRopeBatchArgs {
  NormRopeParams jobs[kNormRopeMaxJobs];
  int64_t cta_end[kNormRopeMaxJobs];
  int per[kNormRopeMaxJobs];  // pairs per lane held in registers (1, 2, 4, 8, 16); 0: streamed
  int count;
};

__device__ __forceinline__ void StorePair(const NormRopeParams& p, int64_t off, float a, float b) {
  if (p.out_dtype == DType::kBF16) {
    Store2(static_cast<bf16*>(p.out) + off, a, b);
  } else {
    Store2(static_cast<float*>(p.out) + off, a, b);
  }
}

__device__ __forceinline__ float2 Rotate(float2 v, float pos, float freq, bool inverse) {
  const float angle = pos * freq;
  float sn, cs;
  sincosf(angle, &sn, &cs);
  if (inverse) sn = -sn;
  const float a = v.x * cs - v.y * sn, b = v.y * cs + v.x * sn;
  return make_float2(a, b);
}

template <int kPer>
__device__ __forceinline__ void NormRopeRow(const NormRopeParams& p, int64_t row, int lane) {
  const int64_t t = row / p.num_heads, h = row % p.num_heads;
  const int hd = static_cast<int>(p.head_dim), pairs = hd / 2;
  const int rd = static_cast<int>(p.rotary_dim), first_rot = (hd - rd) / 2;
  const bool norm = p.norm;
  // Weights (never written by the kernels before): norm weights (1 without) and frequencies,
  // ahead of the wait up to 8 pairs a lane (longer rows read them with their pairs: registers).
  constexpr bool kEarly = kPer <= 8;
  auto weight = [&](int q) {
    return norm && p.norm_weight != nullptr && q < pairs
               ? make_float2(p.norm_weight[2 * q], p.norm_weight[2 * q + 1])
               : make_float2(1.0f, 1.0f);
  };
  auto frequency = [&](int q) {
    return rd > 0 && q >= first_rot && q < pairs ? p.inv_freq[q - first_rot] : 0.0f;
  };
  float2 w[kEarly ? kPer : 1];
  float freq[kEarly ? kPer : 1];
  if constexpr (kEarly) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      w[k] = weight(lane + 32 * k);
      freq[k] = frequency(lane + 32 * k);
    }
  }
  WaitForPrerequisites();
  AllowDependents();
  const float2* x = reinterpret_cast<const float2*>(p.x + t * p.x_stride + h * hd);
  float2 v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int q = lane + 32 * k;
    v[k] = q < pairs ? x[q] : make_float2(0.0f, 0.0f);
  }
  const float pos = rd > 0 ? static_cast<float>(p.positions[t] + p.position_offset) : 0.0f;
  float inv = 1.0f;
  if (norm) {
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (lane + 32 * k < pairs) {
        ss = fmaf(v[k].x, v[k].x, ss);
        ss = fmaf(v[k].y, v[k].y, ss);
      }
    }
    ss = WarpSum(ss);
    inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + p.eps);
  }
  // Every pair normed and rotated before the first store: no store sits between the weight loads
  // of rows past 8 pairs a lane (a store may alias them), so they are all in flight together.
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int q = lane + 32 * k;
    if (q >= pairs) break;
    float2 y = v[k];
    if (norm) {  // x * inv * weight: a weight of 1 leaves the product's bits
      const float2 wk = kEarly ? w[kEarly ? k : 0] : weight(q);
      y.x = (y.x * inv) * wk.x;
      y.y = (y.y * inv) * wk.y;
    }
    if (rd > 0 && q >= first_rot) {
      y = Rotate(y, pos, kEarly ? freq[kEarly ? k : 0] : frequency(q), p.inverse);
    }
    v[k] = y;
  }
  const int64_t out = t * p.out_stride + h * hd;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int q = lane + 32 * k;
    if (q >= pairs) break;
    StorePair(p, out + 2 * q, v[k].x, v[k].y);
  }
}

// Rows longer than 32 * 16 pairs: the sum of squares, then a second pass over the row.
__device__ __noinline__ void NormRopeLoop(const NormRopeParams& p, int64_t row, int lane) {
  WaitForPrerequisites();
  AllowDependents();
  const int64_t t = row / p.num_heads, h = row % p.num_heads;
  const int hd = static_cast<int>(p.head_dim), pairs = hd / 2;
  const float2* x = reinterpret_cast<const float2*>(p.x + t * p.x_stride + h * hd);
  float inv = 1.0f;
  if (p.norm) {
    float ss = 0.0f;
    for (int q = lane; q < pairs; q += 32) {
      const float2 v = x[q];
      ss = fmaf(v.x, v.x, ss);
      ss = fmaf(v.y, v.y, ss);
    }
    ss = WarpSum(ss);
    inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + p.eps);
  }
  const int first_rot = (hd - static_cast<int>(p.rotary_dim)) / 2;
  const float pos =
      p.rotary_dim > 0 ? static_cast<float>(p.positions[t] + p.position_offset) : 0.0f;
  const int64_t out = t * p.out_stride + h * hd;
  for (int q = lane; q < pairs; q += 32) {
    float2 v = x[q];
    if (p.norm) {
      v.x *= inv;
      v.y *= inv;
      if (p.norm_weight != nullptr) {
        v.x *= p.norm_weight[2 * q];
        v.y *= p.norm_weight[2 * q + 1];
      }
    }
    if (p.rotary_dim > 0 && q >= first_rot) {
      v = Rotate(v, pos, p.inv_freq[q - first_rot], p.inverse);
    }
    StorePair(p, out + 2 * q, v.x, v.y);
  }
}

__global__ void __launch_bounds__(kRopeWarps * 32, 3)
    NormRopeBatchKernel(const __grid_constant__ NormRopeBatchArgs a) {
  int j = 0;
  while (j + 1 < a.count && static_cast<int64_t>(blockIdx.x) >= a.cta_end[j]) ++j;
  const NormRopeParams& p = a.jobs[j];
  const int64_t first_cta = j == 0 ? 0 : a.cta_end[j - 1];
  const int64_t row =
      (static_cast<int64_t>(blockIdx.x) - first_cta) * kRopeWarps + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= p.num_tokens * p.num_heads) return;
  switch (a.per[j]) {
    case 1:
      return NormRopeRow<1>(p, row, lane);
    case 2:
      return NormRopeRow<2>(p, row, lane);
    case 4:
      return NormRopeRow<4>(p, row, lane);
    case 8:
      return NormRopeRow<8>(p, row, lane);
    case 16:
      return NormRopeRow<16>(p, row, lane);
    default:
      return NormRopeLoop(p, row, lane);
  }
}

bool NormRopeOk(const NormRopeParams& p) {
  if (p.num_tokens == 0 || p.num_heads == 0) return true;  // nothing to do
  const auto aligned8 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 7) == 0; };
  return p.num_tokens > 0 && p.num_heads > 0 && p.head_dim > 0 && p.head_dim % 2 == 0 &&
         p.rotary_dim >= 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= p.head_dim &&
         p.x != nullptr && p.out != nullptr && p.x_stride % 2 == 0 && p.out_stride % 2 == 0 &&
         p.x_stride >= p.num_heads * p.head_dim && p.out_stride >= p.num_heads * p.head_dim &&
         aligned8(p.x) && aligned8(p.out) &&
         (p.out_dtype == DType::kF32 || p.out_dtype == DType::kBF16) &&
         (p.rotary_dim == 0 || (p.inv_freq != nullptr && p.positions != nullptr));
}

}  // namespace

int HcPre(const HcPreParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  if (p.hc != 4 || p.dim <= 0 || p.dim % 4 != 0 || p.num_tokens < 0 || p.iters < 0 ||
      p.streams == nullptr || p.fn == nullptr || p.base == nullptr || p.scale == nullptr ||
      p.post == nullptr || p.comb == nullptr || !Aligned16(p.streams) || !Aligned16(p.fn) ||
      (p.collapsed != nullptr && !Aligned16(p.collapsed)) ||
      !NormedOk(p.normed, p.normed_dtype, p.norm_weight)) {
    return cudaErrorInvalidValue;
  }
  const MixArgs a{p.streams,    nullptr, p.fn,        p.base,        p.scale,
                  p.num_tokens, p.dim,   p.iters,     p.hc_eps,      p.norm_eps,
                  p.post,       p.comb,  p.collapsed, p.norm_weight, p.normed};
  return LaunchMix<false>(a, p.normed_dtype, p.workspace, p.partials_ready,
                          static_cast<cudaStream_t>(stream));
}

int64_t HcWorkspaceFloats(int64_t num_tokens, int64_t hc, int64_t dim) {
  if (num_tokens <= 0 || hc <= 0 || dim <= 0) return 0;
  const int64_t n = num_tokens < kHcWorkspaceMaxTokens ? num_tokens : kHcWorkspaceMaxTokens;
  return n * ((2 + hc) * hc + 1) * HcSlices(hc, dim);
}

int HcPost(const HcPostParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  if (p.hc != 4 || p.dim <= 0 || p.dim % 4 != 0 || p.num_tokens < 0 || p.streams == nullptr ||
      p.y == nullptr || p.post == nullptr || p.comb == nullptr || p.out == nullptr ||
      !Aligned16(p.streams) || !Aligned16(p.y) || !Aligned16(p.out) ||
      (p.next_fn != nullptr && !Aligned16(p.next_fn))) {
    return cudaErrorInvalidValue;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.next_fn != nullptr && p.next_workspace != nullptr && HcWorkspacePath(p.num_tokens, p.dim)) {
    const int64_t slices = HcSlices(4, p.dim);
    const dim3 grid(static_cast<unsigned>(slices),
                    static_cast<unsigned>(p.num_tokens <= 4 ? 1 : (p.num_tokens + 15) / 16));
    const PostPartArgs a{p, slices};
    return DispatchPartTokens(p.num_tokens, [&](auto tok) {
      constexpr int kTok = decltype(tok)::value;
      return p.next_head
                 ? LaunchDependent(HcPostPartialKernel<4, true, kTok>, grid, kPartThreads, 0, s, a)
                 : LaunchDependent(HcPostPartialKernel<4, false, kTok>, grid, kPartThreads, 0, s,
                                   a);
    });
  }
  const int threads = 256;
  return LaunchDependent(HcPostKernel<4>, GridFor(p.num_tokens * p.dim / 4, threads), threads, 0,
                         static_cast<cudaStream_t>(stream), p);
}

int HcHead(const HcHeadParams& p, void* stream) {
  if (p.rows == 0) return 0;
  if (p.hc != 4 || p.dim <= 0 || p.dim % 4 != 0 || p.rows < 0 || p.streams == nullptr ||
      p.fn == nullptr || p.base == nullptr || p.scale == nullptr || p.normed == nullptr ||
      !Aligned16(p.streams) || !Aligned16(p.fn) ||
      !NormedOk(p.normed, p.normed_dtype, p.norm_weight)) {
    return cudaErrorInvalidValue;
  }
  const MixArgs a{p.streams, p.rows_index, p.fn,    p.base,  p.scale, p.rows,        p.dim,   0,
                  p.hc_eps,  p.norm_eps,   nullptr, nullptr, nullptr, p.norm_weight, p.normed};
  return LaunchMix<true>(a, p.normed_dtype, p.workspace, p.partials_ready,
                         static_cast<cudaStream_t>(stream));
}

int Route(const RouteParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  if (p.num_tokens < 0 || p.num_experts < 1 || p.num_experts > 1024 || p.top_k < 1 ||
      p.top_k > 16 || p.top_k > p.num_experts || p.ld < p.num_experts || p.logits == nullptr ||
      p.experts == nullptr || p.weights == nullptr ||
      (p.tid2eid != nullptr && (p.token_ids == nullptr || p.vocab <= 0))) {
    return cudaErrorInvalidValue;
  }
  const auto blocks = static_cast<unsigned>((p.num_tokens + kRouteWarps - 1) / kRouteWarps);
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.num_experts <= 64)
    return LaunchDependent(RouteKernel<2>, blocks, kRouteWarps * 32, 0, s, p);
  if (p.num_experts <= 256) {
    return LaunchDependent(RouteKernel<8>, blocks, kRouteWarps * 32, 0, s, p);
  }
  return LaunchDependent(RouteKernel<32>, blocks, kRouteWarps * 32, 0, s, p);
}

int NormRope(const NormRopeParams& p, void* stream) { return NormRopeBatch(&p, 1, stream); }

int NormRopeBatch(const NormRopeParams* jobs, int count, void* stream) {
  if (count < 0 || count > kNormRopeMaxJobs || (count > 0 && jobs == nullptr)) {
    return cudaErrorInvalidValue;
  }
  NormRopeBatchArgs a = {};
  int64_t ctas = 0;
  for (int i = 0; i < count; ++i) {
    const NormRopeParams& p = jobs[i];
    if (!NormRopeOk(p)) return cudaErrorInvalidValue;
    a.jobs[a.count] = p;
    const int64_t rows = p.num_tokens * p.num_heads;
    if (rows == 0) continue;
    const int64_t per = (p.head_dim / 2 + 31) / 32;
    a.per[a.count] = per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : per <= 8 ? 8 : per <= 16 ? 16 : 0;
    ctas += (rows + kRopeWarps - 1) / kRopeWarps;
    a.cta_end[a.count] = ctas;
    ++a.count;
  }
  if (ctas == 0) return 0;
  if (ctas > INT_MAX) return cudaErrorInvalidValue;
  return LaunchDependent(NormRopeBatchKernel, dim3(static_cast<unsigned>(ctas)), kRopeWarps * 32, 0,
                         static_cast<cudaStream_t>(stream), a);
}

}  // namespace dinfer::kernels::cuda
