// The staged decode GEMV (GemvFused) with e4m3 weights and one f32 scale per output row: what
// GemvFusedSupports asks of them, and, with DINFER_GEMV_PERF=1, its bandwidth against bf16
// weights. (Its results for each input kind and CTA count: GemvFusedTest and GemvFusedLaunchTest
// in gemm_test.cc; the q/k/v epilogue on e4m3 weights: gemv_qkv_test.cc.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpu_test_util.h"
#include "kernels/cuda/gemm.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;
using In = kc::GemvInput;

TEST(GemvFp8SupportsTest, NeedsScalesAndAKnownWeightType) {
  SKIP_WITHOUT_GPU();
  alignas(16) static float dummy[16];
  kc::GemvFusedParams p;
  p.gemm.x = dummy;
  p.gemm.ldx = 2048;
  p.gemm.w = dummy;
  p.gemm.y = dummy;
  p.gemm.ldw = 2048;
  p.gemm.ldy = 64;
  p.gemm.m = 1;
  p.gemm.n = 64;
  p.gemm.k = 2048;
  p.w_dtype = DType::kF8E4M3;
  p.w_scale = dummy;
  EXPECT_TRUE(kc::GemvFusedSupports(p));
  kc::GemvFusedParams q = p;
  q.w_scale = nullptr;
  EXPECT_FALSE(kc::GemvFusedSupports(q));
  q = p;
  q.w_dtype = DType::kF32;
  EXPECT_FALSE(kc::GemvFusedSupports(q));
  q = p;
  q.gemm.k = q.gemm.ldw = 3072;  // not a multiple of 2,048
  EXPECT_FALSE(kc::GemvFusedSupports(q));
  q = p;
  q.gemm.w = reinterpret_cast<const char*>(dummy) + 8;
  EXPECT_FALSE(kc::GemvFusedSupports(q));
}

// Bandwidth of the staged GEMV on Llama-3.1-8B's decode shapes, e4m3 against bf16 weights
// (DINFER_GEMV_PERF=1): 20 programmatic dependent launches in a row, weights rotating over
// copies of 256 MB or more (cold in the L2); GB/s of weight bytes and microseconds a launch.
TEST(GemvFp8Perf, DecodeShapes) {
  SKIP_WITHOUT_GPU();
  if (std::getenv("DINFER_GEMV_PERF") == nullptr) GTEST_SKIP() << "DINFER_GEMV_PERF=1 times it";
  struct Shape {
    const char* name;
    int64_t n, k;
    In input;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096, In::kRmsNorm},
                          {"o", 4096, 4096, In::kPlain},
                          {"gate_up", 28672, 4096, In::kRmsNorm},
                          {"down", 4096, 14336, In::kPlain}};
  cudaStream_t st = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (const Shape& sh : shapes) {
    for (int64_t m : {1, 2}) {
      std::printf("%-8s m %lld", sh.name, static_cast<long long>(m));
      for (DType wt : {DType::kBF16, DType::kF8E4M3}) {
        for (int per_sm : {0, 2}) {
          const int64_t elem = wt == DType::kBF16 ? 2 : 1, w_bytes = sh.n * sh.k * elem;
          const int64_t copies =
              std::max<int64_t>(2, ((int64_t{256} << 20) + w_bytes - 1) / w_bytes);
          void *w = nullptr, *x = nullptr, *y = nullptr, *res = nullptr, *scale = nullptr;
          ASSERT_CUDA_OK(cudaMalloc(&w, copies * w_bytes));
          ASSERT_CUDA_OK(cudaMalloc(&x, 2 * 2 * sh.k * 2));
          ASSERT_CUDA_OK(cudaMalloc(&res, 2 * sh.k * 4 + 4 * sh.k));
          ASSERT_CUDA_OK(cudaMalloc(&y, 2 * sh.n * 2));
          ASSERT_CUDA_OK(cudaMalloc(&scale, sh.n * 4));
          ASSERT_CUDA_OK(cudaMemset(w, 0x3c, copies * w_bytes));
          ASSERT_CUDA_OK(cudaMemset(x, 0x3c, 2 * 2 * sh.k * 2));
          ASSERT_CUDA_OK(cudaMemset(res, 0x3c, 2 * sh.k * 4 + 4 * sh.k));
          ASSERT_CUDA_OK(cudaMemset(scale, 0x3c, sh.n * 4));
          kc::GemvFusedParams f;
          f.gemm.x = x;
          f.gemm.ldx = 2 * sh.k;
          f.gemm.ldw = sh.k;
          f.gemm.y = y;
          f.gemm.ldy = sh.n;
          f.gemm.m = m;
          f.gemm.n = sh.n;
          f.gemm.k = sh.k;
          f.gemm.out_dtype = DType::kBF16;
          f.input = sh.input;
          f.residual = static_cast<const float*>(res);
          f.norm_weight = static_cast<const float*>(res) + 2 * sh.k;
          f.blocks_per_sm = per_sm;
          f.w_dtype = wt;
          f.w_scale = static_cast<const float*>(scale);
          f.gemm.w = w;
          ASSERT_TRUE(kc::GemvFusedSupports(f));
          int64_t i = 0;
          auto launch = [&] {
            f.gemm.w = static_cast<char*>(w) + (i++ % copies) * w_bytes;
            return kc::GemvFused(f, st);
          };
          const LaunchTimes times = TimeLaunches(st, launch);
          ASSERT_GT(times.chained_ms, 0.0);
          const double ms = times.chained_ms;
          std::printf("  %s/%d %5.0f GB/s %6.1f us", wt == DType::kBF16 ? "bf16" : "e4m3", per_sm,
                      w_bytes / ms / 1e6, ms * 1e3);
          ASSERT_CUDA_OK(cudaFree(w));
          ASSERT_CUDA_OK(cudaFree(x));
          ASSERT_CUDA_OK(cudaFree(res));
          ASSERT_CUDA_OK(cudaFree(y));
          ASSERT_CUDA_OK(cudaFree(scale));
        }
      }
      std::printf("\n");
    }
  }
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace dinfer
