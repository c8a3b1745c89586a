// GEMV for decode: y[m, n] = x[m, k] · w[n, k]ᵀ with m <= 8 rows of bf16 activations. Weights
// dominate the bytes, so the kernel's job is to keep enough weight loads in flight: a CTA's 8
// warps form groups of kSplit warps; each group owns kCols adjacent columns and each warp of it
// one slice of k, streamed with 16-byte loads (kUnroll per lane and column in flight, and the
// next step's requested before this step's arithmetic); partial sums meet in shared memory.
// Splitting k gives the short projections (32 MB, ~10 µs) enough warps to request all of their
// bytes at once. Activations stay in L1. Launched as a programmatic dependent of the kernel
// before it: weights stream in while that kernel finishes (see WaitForPrerequisites).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kWarps = 8;

template <int M, typename TOut, int kCols, int kUnroll, int kSplit>
__global__ void __launch_bounds__(kWarps * 32)
    GemvKernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t ldw,
               TOut* __restrict__ y, int64_t ldy, int64_t n, int64_t k) {
  constexpr int kGroups = kWarps / kSplit;
  constexpr int64_t kStep = 32 * 8 * kUnroll;
  __shared__ float partial[kSplit][kGroups][kCols][M];
  AllowDependents();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = warp / kSplit, slice = warp % kSplit;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * kGroups + group) * kCols;
  // k slices in whole 8-element vectors.
  const int64_t slice_len = (k / 8 + kSplit - 1) / kSplit * 8;
  const int64_t k_begin = min(k, slice * slice_len), k_end = min(k, k_begin + slice_len);
  const bf16* wr[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) wr[c] = w + min(col0 + c, n - 1) * ldw;
  float acc[kCols][M];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int r = 0; r < M; ++r) acc[c][r] = 0.0f;
  }
  auto load = [&](int64_t base, uint4(&wv)[kUnroll][kCols]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + (u * 32 + lane) * 8;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        wv[u][c] =
            i < k_end ? __ldcs(reinterpret_cast<const uint4*>(wr[c] + i)) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  auto compute = [&](int64_t base, const uint4(&wv)[kUnroll][kCols]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + (u * 32 + lane) * 8;
      if (i >= k_end) break;
      float wf[kCols][8];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const auto* h = reinterpret_cast<const __nv_bfloat162*>(&wv[u][c]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(h[j]);
          wf[c][2 * j] = f.x;
          wf[c][2 * j + 1] = f.y;
        }
      }
#pragma unroll
      for (int r = 0; r < M; ++r) {
        float xf[8];
        LoadVec(x + r * ldx + i, xf);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[c][r] += wf[c][j] * xf[j];
        }
      }
    }
  };
  uint4 a[kUnroll][kCols], b[kUnroll][kCols];
  load(k_begin, a);
  WaitForPrerequisites();  // the activations come from the kernel before
  for (int64_t base = k_begin; base < k_end; base += 2 * kStep) {
    if (base + kStep < k_end) load(base + kStep, b);
    compute(base, a);
    if (base + kStep >= k_end) break;
    if (base + 2 * kStep < k_end) load(base + 2 * kStep, a);
    compute(base + kStep, b);
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      const float s = WarpSum(acc[c][r]);
      if (lane == 0) partial[slice][group][c][r] = s;
    }
  }
  __syncthreads();
  for (int o = threadIdx.x; o < kGroups * kCols * M; o += kWarps * 32) {
    const int g = o / (kCols * M), c = (o / M) % kCols, r = o % M;
    const int64_t col = (static_cast<int64_t>(blockIdx.x) * kGroups + g) * kCols + c;
    if (col >= n) continue;
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < kSplit; ++q) s += partial[q][g][c][r];
    y[r * ldy + col] = FromFloat<TOut>(s);
  }
}

template <int M, int kCols, int kUnroll, int kSplit>
cudaError_t LaunchTiled(const GemmParams& p, cudaStream_t stream) {
  const int64_t per_block = kWarps / kSplit * kCols;
  const dim3 grid(static_cast<unsigned>((p.n + per_block - 1) / per_block));
  const auto* x = static_cast<const bf16*>(p.x);
  const auto* w = static_cast<const bf16*>(p.w);
  if (p.out_dtype == DType::kF32) {
    return LaunchDependent(GemvKernel<M, float, kCols, kUnroll, kSplit>, grid, kWarps * 32, 0,
                           stream, x, p.ldx, w, p.ldw, static_cast<float*>(p.y), p.ldy, p.n, p.k);
  }
  return LaunchDependent(GemvKernel<M, bf16, kCols, kUnroll, kSplit>, grid, kWarps * 32, 0, stream,
                         x, p.ldx, w, p.ldw, static_cast<bf16*>(p.y), p.ldy, p.n, p.k);
}

// Splitting k pays for the short projections; with many columns (gate/up, the LM head) there are
// enough warps anyway and the partial sums only cost (measured on H200, bench/gpu).
constexpr int64_t kSplitMaxColumns = 8192;

template <int M>
cudaError_t LaunchRows(const GemmParams& p, cudaStream_t stream) {
  if (p.n > kSplitMaxColumns) return LaunchTiled<M, 2, 4, 1>(p, stream);
  return LaunchTiled<M, 2, 4, 4>(p, stream);
}

}  // namespace

bool GemvSupports(const GemmParams& p) {
  return p.in_dtype == DType::kBF16 && p.m >= 1 && p.m <= kGemvMaxRows && p.k % 8 == 0 &&
         p.ldx % 8 == 0 && p.ldw % 8 == 0 && Aligned16(p.x) && Aligned16(p.w);
}

int Gemv(const GemmParams& p, void* stream, GemvTiling tiling) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (tiling.cols != 0) {
    if (p.m != 1) return cudaErrorInvalidValue;
    if (tiling.cols == 2 && tiling.unroll == 4 && tiling.split == 1) {
      return LaunchTiled<1, 2, 4, 1>(p, s);
    }
    if (tiling.cols == 2 && tiling.unroll == 4 && tiling.split == 2) {
      return LaunchTiled<1, 2, 4, 2>(p, s);
    }
    if (tiling.cols == 2 && tiling.unroll == 4 && tiling.split == 4) {
      return LaunchTiled<1, 2, 4, 4>(p, s);
    }
    if (tiling.cols == 1 && tiling.unroll == 8 && tiling.split == 4) {
      return LaunchTiled<1, 1, 8, 4>(p, s);
    }
    return cudaErrorInvalidValue;
  }
  switch (p.m) {
    case 1:
      return LaunchRows<1>(p, s);
    case 2:
      return LaunchRows<2>(p, s);
    case 3:
      return LaunchRows<3>(p, s);
    case 4:
      return LaunchRows<4>(p, s);
    case 5:
      return LaunchRows<5>(p, s);
    case 6:
      return LaunchRows<6>(p, s);
    case 7:
      return LaunchRows<7>(p, s);
    default:
      return LaunchRows<8>(p, s);
  }
}

}  // namespace dinfer::kernels::cuda
