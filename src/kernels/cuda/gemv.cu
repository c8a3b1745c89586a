// GEMV for decode: y[m, n] = x[m, k] · w[n, k]ᵀ with m <= 8 rows of bf16 activations. Each warp
// owns two output columns and streams their weight rows with 16-byte loads, several in flight; the
// activation rows stay in L1. Weights dominate the bytes, so this runs at memory bandwidth.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace dinfer::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;
constexpr int kCols = 2;

template <int M, typename TOut>
__global__ void __launch_bounds__(kWarps * 32)
    GemvKernel(const bf16* __restrict__ x, int64_t ldx, const bf16* __restrict__ w, int64_t ldw,
               TOut* __restrict__ y, int64_t ldy, int64_t n, int64_t k) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Each warp owns kCols adjacent columns, so each activation load serves kCols weight loads.
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kCols;
  if (col0 >= n) return;
  const bf16* wr[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) wr[c] = w + min(col0 + c, n - 1) * ldw;
  float acc[kCols][M];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int r = 0; r < M; ++r) acc[c][r] = 0.0f;
  }
  for (int64_t base = 0; base < k; base += 32 * 8 * kUnroll) {
    uint4 wv[kUnroll][kCols];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + (u * 32 + lane) * 8;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        wv[u][c] =
            i < k ? __ldcs(reinterpret_cast<const uint4*>(wr[c] + i)) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + (u * 32 + lane) * 8;
      if (i >= k) break;
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
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      const float s = WarpSum(acc[c][r]);
      if (lane == 0 && col0 + c < n) y[r * ldy + col0 + c] = FromFloat<TOut>(s);
    }
  }
}

template <int M>
cudaError_t LaunchRows(const GemmParams& p, cudaStream_t stream) {
  const int64_t per_block = kWarps * kCols;
  const unsigned blocks = static_cast<unsigned>((p.n + per_block - 1) / per_block);
  const auto* x = static_cast<const bf16*>(p.x);
  const auto* w = static_cast<const bf16*>(p.w);
  if (p.out_dtype == DType::kF32) {
    GemvKernel<M, float><<<blocks, kWarps * 32, 0, stream>>>(
        x, p.ldx, w, p.ldw, static_cast<float*>(p.y), p.ldy, p.n, p.k);
  } else {
    GemvKernel<M, bf16><<<blocks, kWarps * 32, 0, stream>>>(
        x, p.ldx, w, p.ldw, static_cast<bf16*>(p.y), p.ldy, p.n, p.k);
  }
  return cudaGetLastError();
}

}  // namespace

bool GemvSupports(const GemmParams& p) {
  return p.in_dtype == DType::kBF16 && p.m >= 1 && p.m <= kGemvMaxRows && p.k % 8 == 0 &&
         p.ldx % 8 == 0 && p.ldw % 8 == 0 && Aligned16(p.x) && Aligned16(p.w);
}

int Gemv(const GemmParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
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
