// GEMMs y = x · wᵀ through cuBLASLt (f32 without TF32, bf16 with f32 or bf16 output) and the bf16
// GEMV kernel for a few rows, against a double-precision product of the same (rounded) inputs.
#include "kernels/cuda/gemm.h"
#include "gpu_test_util.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;

struct GemmCase {
  int64_t m, n, k;
  DType in, out;
  kc::GemmImpl impl;
};

std::ostream& operator<<(std::ostream& os, const GemmCase& c) {
  return os << c.m << "x" << c.n << "x" << c.k << " " << DTypeName(c.in) << "->" << DTypeName(c.out)
            << " impl " << static_cast<int>(c.impl);
}

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesDoubleProduct) {
  SKIP_WITHOUT_GPU();
  const GemmCase tc = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(tc.m * 1009 + tc.n * 13 + tc.k));
  auto x = RoundTo(tc.in, Random(tc.m * tc.k, rng));
  auto w = RoundTo(tc.in, Random(tc.n * tc.k, rng, 1.0f / std::sqrt(static_cast<float>(tc.k))));
  std::vector<float> want(tc.m * tc.n);
  for (int64_t i = 0; i < tc.m; ++i) {
    for (int64_t j = 0; j < tc.n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < tc.k; ++l) s += double{x[i * tc.k + l]} * w[j * tc.k + l];
      want[i * tc.n + j] = static_cast<float>(s);
    }
  }
  auto d_x = Upload(x, tc.in), d_w = Upload(w, tc.in);
  auto d_y = Poisoned(tc.m * tc.n, tc.out);
  auto runner = kc::GemmRunner::Create();
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  kc::GemmParams p;
  p.x = d_x.data();
  p.w = d_w.data();
  p.y = d_y.data();
  p.ldx = tc.k;
  p.ldw = tc.k;
  p.ldy = tc.n;
  p.m = tc.m;
  p.n = tc.n;
  p.k = tc.k;
  p.in_dtype = tc.in;
  p.out_dtype = tc.out;
  ASSERT_STATUS_OK((*runner)->Run(p, nullptr, tc.impl));
  const double tol = tc.out == DType::kF32 ? 1e-5 : Tolerance(tc.out);
  EXPECT_LE(RelError(Download(d_y, tc.m * tc.n, tc.out), RoundTo(tc.out, want)), tol);
}

using I = kc::GemmImpl;
INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Values(GemmCase{33, 300, 576, DType::kF32, DType::kF32, I::kAuto},
                      GemmCase{1, 192, 64, DType::kF32, DType::kF32, I::kAuto},
                      GemmCase{130, 1000, 512, DType::kBF16, DType::kBF16, I::kCublasLt},
                      GemmCase{64, 5000, 1024, DType::kBF16, DType::kF32, I::kCublasLt},
                      GemmCase{1, 4096, 4096, DType::kBF16, DType::kBF16, I::kGemv},
                      GemmCase{3, 1000, 1536, DType::kBF16, DType::kBF16, I::kGemv},
                      GemmCase{8, 999, 2048, DType::kBF16, DType::kF32, I::kGemv},
                      GemmCase{5, 257, 4104, DType::kBF16, DType::kBF16, I::kGemv},
                      GemmCase{4, 512, 1024, DType::kBF16, DType::kBF16, I::kAuto}));

}  // namespace
}  // namespace dinfer
