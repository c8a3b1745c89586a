// GEMMs y = x · wᵀ through cuBLASLt (f32 without TF32, bf16 with f32 or bf16 output) and the bf16
// GEMV kernel for a few rows, against a double-precision product of the same (rounded) inputs;
// FP8 products (per-tensor, per-channel and 128 x 128 block scales) and the activation
// quantization feeding them, against the product of the values their bytes and scales stand for
// (block-scaled weights dequantized by the CPU's FP8 path, kernels/cpu/quant.h); the
// block-scaled kernel on each of its paths with scales that vary widely from block to block.
#include "kernels/cuda/gemm.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpu_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/elementwise.h"

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
                      GemmCase{4, 512, 1024, DType::kBF16, DType::kBF16, I::kAuto},
                      // The staged GEMV's short rows (k of 1,024, 512, 256: chunks of whole rows).
                      GemmCase{1, 5000, 1024, DType::kBF16, DType::kF32, I::kAuto},
                      GemmCase{2, 333, 512, DType::kBF16, DType::kBF16, I::kAuto},
                      GemmCase{1, 77, 256, DType::kBF16, DType::kF32, I::kAuto}));

// Grouped (block-diagonal) products, GemmParams::group_n: one staged-GEMV launch for one or two
// rows, one product per group beyond; against a double product of each group's inputs.
struct GroupedCase {
  int64_t m, groups, group_n, k;
  DType out;
};

std::ostream& operator<<(std::ostream& os, const GroupedCase& c) {
  return os << c.m << " rows, " << c.groups << " groups of " << c.group_n << " x " << c.k << " -> "
            << DTypeName(c.out);
}

class GroupedGemmTest : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(GroupedGemmTest, MatchesProductPerGroup) {
  SKIP_WITHOUT_GPU();
  const GroupedCase tc = GetParam();
  const int64_t n = tc.groups * tc.group_n, kx = tc.groups * tc.k, ldx = kx + 8;
  std::mt19937 rng(static_cast<uint32_t>(tc.m * 31 + n + tc.k));
  auto x = RoundTo(DType::kBF16, Random(tc.m * ldx, rng));
  auto w = RoundTo(DType::kBF16, Random(n * tc.k, rng, 1.0f / std::sqrt(static_cast<float>(tc.k))));
  std::vector<float> want(tc.m * n);
  for (int64_t i = 0; i < tc.m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t g = j / tc.group_n;
      double s = 0;
      for (int64_t l = 0; l < tc.k; ++l) s += double{x[i * ldx + g * tc.k + l]} * w[j * tc.k + l];
      want[i * n + j] = static_cast<float>(s);
    }
  }
  auto d_x = Upload(x, DType::kBF16), d_w = Upload(w, DType::kBF16);
  auto d_y = Poisoned(tc.m * n, tc.out);
  auto runner = kc::GemmRunner::Create();
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  kc::GemmParams p;
  p.x = d_x.data();
  p.w = d_w.data();
  p.y = d_y.data();
  p.ldx = ldx;
  p.ldw = tc.k;
  p.ldy = n;
  p.m = tc.m;
  p.n = n;
  p.k = tc.k;
  p.out_dtype = tc.out;
  p.group_n = tc.group_n;
  ASSERT_STATUS_OK((*runner)->Run(p, nullptr));
  const double tol = tc.out == DType::kF32 ? 1e-5 : Tolerance(tc.out);
  EXPECT_LE(RelError(Download(d_y, tc.m * n, tc.out), RoundTo(tc.out, want)), tol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupedGemmTest,
                         ::testing::Values(GroupedCase{1, 8, 1024, 4096, DType::kBF16},
                                           GroupedCase{2, 4, 96, 2048, DType::kF32},
                                           GroupedCase{1, 3, 200, 2048, DType::kBF16},
                                           GroupedCase{5, 8, 64, 512, DType::kBF16},
                                           GroupedCase{1, 2, 48, 520, DType::kF32},
                                           GroupedCase{1, 8, 129, 1024, DType::kF32},
                                           GroupedCase{2, 3, 50, 512, DType::kBF16}));

// The staged GEMV with its input made in front of it (RMSNorm of the residual sum, SiLU·mul, or
// the plain input), on bf16 weights or on e4m3 ones with a scale per row, against the CPU
// reference ops and a double-precision product of their output rounded to bf16 as the unfused
// kernels store it (with the values the e4m3 bytes stand for, times the row's scale).
struct FusedCase {
  int64_t m, n, k;
  kc::GemvInput input;
  DType out;
  bool gather;  // RMSNorm rows picked by rows_index (the final norm), no residual written
  bool fp8_weights = false;  // RandomFp8 weights (gpu_test_util.h)
};

std::ostream& operator<<(std::ostream& os, const FusedCase& c) {
  return os << c.m << "x" << c.n << "x" << c.k << " input " << static_cast<int>(c.input) << " -> "
            << DTypeName(c.out) << (c.gather ? " gather" : "")
            << (c.fp8_weights ? " e4m3 weights" : "");
}

class GemvFusedTest : public ::testing::TestWithParam<FusedCase> {};

TEST_P(GemvFusedTest, MatchesUnfusedReference) {
  SKIP_WITHOUT_GPU();
  const FusedCase tc = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(tc.m * 7 + tc.n * 3 + tc.k + static_cast<int>(tc.input)));
  const int64_t res_rows = 3;
  std::vector<float> w;
  Fp8Weights w8;
  if (tc.fp8_weights) {
    w8 = RandomFp8(tc.n, tc.k, rng);
  } else {
    w = RoundTo(DType::kBF16, Random(tc.n * tc.k, rng, 1.0f / std::sqrt(static_cast<float>(tc.k))));
  }
  const std::vector<float>& w_values = tc.fp8_weights ? w8.values : w;
  auto in = RoundTo(DType::kBF16, Random(tc.m * 2 * tc.k, rng, 2.0f));  // plain / gate|up rows
  auto residual = Random(res_rows * tc.k, rng);
  auto add = RoundTo(DType::kBF16, Random(res_rows * tc.k, rng, 0.5f));
  auto bias = Random(tc.k, rng, 0.1f);
  auto norm_w = Random(tc.k, rng, 0.2f);
  for (auto& v : norm_w) v += 1.0f;
  const std::vector<int32_t> index = {2, 0};
  const bool with_bias = !tc.gather;

  // The input rows as the unfused ops would leave them in bf16.
  std::vector<float> x(tc.m * tc.k), sums(res_rows * tc.k);
  for (int64_t i = 0; i < res_rows * tc.k; ++i) {
    sums[i] = residual[i] + add[i] + (with_bias ? bias[i % tc.k] : 0.0f);
  }
  if (tc.input == kc::GemvInput::kPlain) {
    for (int64_t r = 0; r < tc.m; ++r) std::copy_n(&in[r * 2 * tc.k], tc.k, &x[r * tc.k]);
  } else {
    std::vector<float> rows(tc.m * tc.k);
    for (int64_t r = 0; r < tc.m; ++r) {
      std::copy_n(&sums[(tc.gather ? index[r] : r) * tc.k], tc.k, &rows[r * tc.k]);
    }
    kernels::cpu::RmsNormParams ref;
    ref.x = rows.data();
    ref.weight = norm_w.data();
    ref.out = x.data();
    ref.rows = tc.m;
    ref.dim = tc.k;
    ref.eps = 1e-5f;
    ref.weight_offset = 0.25f;
    kernels::cpu::RmsNormReference(ref);
  }
  x = RoundTo(DType::kBF16, x);
  std::vector<float> want(tc.m * tc.n);
  for (int64_t i = 0; i < tc.m; ++i) {
    for (int64_t j = 0; j < tc.n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < tc.k; ++l) s += double{x[i * tc.k + l]} * w_values[j * tc.k + l];
      want[i * tc.n + j] = static_cast<float>(tc.fp8_weights ? s * w8.scale[j] : s);
    }
  }

  auto d_w = tc.fp8_weights ? UploadRaw(w8.bytes) : Upload(w, DType::kBF16);
  auto d_scale = Upload(tc.fp8_weights ? w8.scale : std::vector<float>{1.0f}, DType::kF32);
  auto d_in = Upload(in, DType::kBF16);
  auto d_res = Upload(residual, DType::kF32), d_add = Upload(add, DType::kBF16);
  auto d_bias = Upload(bias, DType::kF32), d_norm = Upload(norm_w, DType::kF32);
  auto d_index = UploadRaw(index);
  auto d_res_out = Poisoned(res_rows * tc.k, DType::kF32);
  auto d_y = Poisoned(tc.m * tc.n, tc.out);
  kc::GemvFusedParams p;
  p.gemm.x = d_in.data();
  p.gemm.ldx = 2 * tc.k;
  p.gemm.w = d_w.data();
  p.gemm.ldw = tc.k;
  p.gemm.y = d_y.data();
  p.gemm.ldy = tc.n;
  p.gemm.m = tc.m;
  p.gemm.n = tc.n;
  p.gemm.k = tc.k;
  p.gemm.out_dtype = tc.out;
  if (tc.fp8_weights) {
    p.w_dtype = DType::kF8E4M3;
    p.w_scale = static_cast<const float*>(d_scale.data());
  }
  p.input = tc.input;
  p.residual = static_cast<const float*>(d_res.data());
  p.add = d_add.data();
  p.add_bias = with_bias ? static_cast<const float*>(d_bias.data()) : nullptr;
  p.rows_index = tc.gather ? static_cast<const int32_t*>(d_index.data()) : nullptr;
  const bool writes = tc.input == kc::GemvInput::kRmsNorm && !tc.gather;
  p.residual_out = writes ? static_cast<float*>(d_res_out.data()) : nullptr;
  p.norm_weight = static_cast<const float*>(d_norm.data());
  p.eps = 1e-5f;
  p.weight_offset = 0.25f;
  ASSERT_TRUE(kc::GemvFusedSupports(p));
  ASSERT_CUDA_OK(kc::GemvFused(p, nullptr));
  // A few inputs may round to the other bf16 neighbour than the CPU's (f32 sums in another order).
  // e4m3 weights: with the plain input to f32 the products are exact in f32 (8 x 4 significant
  // bits) and only the sums round (~1e-6); a bf16 output is the rounded reference, each element
  // at most one ulp (2^-8) off.
  const double tol = !tc.fp8_weights          ? (tc.out == DType::kF32 ? 1e-3 : Tolerance(tc.out))
                     : tc.out == DType::kBF16 ? 1.0 / 256
                     : tc.input == kc::GemvInput::kPlain ? 1e-5
                                                         : 1e-3;
  EXPECT_LE(RelError(Download(d_y, tc.m * tc.n, tc.out), RoundTo(tc.out, want)), tol);
  if (writes) {
    const auto got = Download(d_res_out, res_rows * tc.k, DType::kF32);
    for (int64_t i = 0; i < tc.m * tc.k; ++i) ASSERT_EQ(got[i], sums[i]) << i;
  }
}

using In = kc::GemvInput;
INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvFusedTest,
    ::testing::Values(FusedCase{1, 4096, 4096, In::kPlain, DType::kBF16, false},
                      FusedCase{2, 1000, 2048, In::kPlain, DType::kF32, false},
                      FusedCase{1, 6144, 4096, In::kRmsNorm, DType::kBF16, false},
                      FusedCase{2, 777, 2048, In::kRmsNorm, DType::kBF16, false},
                      FusedCase{2, 20001, 2048, In::kRmsNorm, DType::kF32, true},
                      FusedCase{1, 4096, 14336, In::kPlain, DType::kBF16, false},
                      FusedCase{2, 300, 6144, In::kPlain, DType::kBF16, false},
                      // e4m3 weights. Llama-3.1-8B: q/k/v and gate/up after the RMSNorms, o and
                      // down on plain inputs (rows of 14,336 end in a half chunk).
                      FusedCase{1, 6144, 4096, In::kRmsNorm, DType::kBF16, false, true},
                      FusedCase{2, 6144, 4096, In::kRmsNorm, DType::kF32, false, true},
                      FusedCase{1, 28672, 4096, In::kRmsNorm, DType::kBF16, false, true},
                      FusedCase{2, 28672, 4096, In::kRmsNorm, DType::kBF16, false, true},
                      FusedCase{1, 4096, 4096, In::kPlain, DType::kBF16, false, true},
                      FusedCase{2, 4096, 4096, In::kPlain, DType::kF32, false, true},
                      FusedCase{1, 4096, 14336, In::kPlain, DType::kBF16, false, true},
                      FusedCase{2, 4096, 14336, In::kPlain, DType::kBF16, false, true},
                      FusedCase{1, 4096, 14336, In::kPlain, DType::kF32, false, true},
                      // Few rows, rows of one half chunk, of 1.5 chunks, the gathered final norm.
                      FusedCase{1, 300, 2048, In::kPlain, DType::kF32, false, true},
                      FusedCase{2, 300, 2048, In::kRmsNorm, DType::kBF16, false, true},
                      FusedCase{2, 300, 2048, In::kPlain, DType::kBF16, false, true},
                      FusedCase{1, 777, 6144, In::kPlain, DType::kBF16, false, true},
                      FusedCase{2, 5, 6144, In::kPlain, DType::kF32, false, true},
                      FusedCase{2, 2001, 2048, In::kRmsNorm, DType::kF32, true, true}));

// The staged GEMV's CTAs per multiprocessor move rows between CTAs but not the order of any row's
// sum: every choice gives the same bits as the default, which matches a double product.
struct StagedCase {
  int64_t m, n, k, group_n;
  DType out;
  bool fp8_weights = false;  // RandomFp8 weights with a scale per row
};

TEST(GemvFusedLaunchTest, EveryChoiceGivesTheSameBits) {
  SKIP_WITHOUT_GPU();
  const StagedCase cases[] = {
      {1, 3000, 4096, 0, DType::kF32},
      {2, 777, 8192, 0, DType::kF32},
      {2, 256, 4096, 0, DType::kF32},
      {1, 8 * 130, 4096, 130, DType::kBF16},
      {2, 1001, 14336, 0, DType::kBF16},
      {1, 5, 2048, 0, DType::kF32},
      {2, 4 * 96, 2048, 96, DType::kF32},
      // e4m3 weights: rows of one chunk, of 3.5 chunks, of half a chunk, of 1.5 chunks; groups.
      {1, 3000, 4096, 0, DType::kF32, true},
      {2, 777, 14336, 0, DType::kF32, true},
      {1, 1001, 14336, 0, DType::kBF16, true},
      {1, 5, 2048, 0, DType::kF32, true},
      {2, 257, 6144, 0, DType::kF32, true},
      {1, 8 * 130, 4096, 130, DType::kBF16, true},
      {2, 4 * 96, 2048, 96, DType::kF32, true}};
  for (const StagedCase& tc : cases) {
    SCOPED_TRACE(testing::Message() << tc.m << "x" << tc.n << "x" << tc.k << " group " << tc.group_n
                                    << (tc.fp8_weights ? " e4m3" : ""));
    const int64_t groups = tc.group_n > 0 ? tc.n / tc.group_n : 1, ldx = groups * tc.k;
    std::mt19937 rng(static_cast<uint32_t>(tc.m * 5 + tc.n + tc.k));
    auto x = RoundTo(DType::kBF16, Random(tc.m * ldx, rng));
    std::vector<float> w;
    Fp8Weights w8;
    if (tc.fp8_weights) {
      w8 = RandomFp8(tc.n, tc.k, rng);
    } else {
      w = RoundTo(DType::kBF16,
                  Random(tc.n * tc.k, rng, 1.0f / std::sqrt(static_cast<float>(tc.k))));
    }
    const std::vector<float>& w_values = tc.fp8_weights ? w8.values : w;
    std::vector<float> want(tc.m * tc.n);
    for (int64_t i = 0; i < tc.m; ++i) {
      for (int64_t j = 0; j < tc.n; ++j) {
        const int64_t g = tc.group_n > 0 ? j / tc.group_n : 0;
        double s = 0;
        for (int64_t l = 0; l < tc.k; ++l) {
          s += double{x[i * ldx + g * tc.k + l]} * w_values[j * tc.k + l];
        }
        want[i * tc.n + j] = static_cast<float>(tc.fp8_weights ? s * w8.scale[j] : s);
      }
    }
    auto d_x = Upload(x, DType::kBF16);
    auto d_w = tc.fp8_weights ? UploadRaw(w8.bytes) : Upload(w, DType::kBF16);
    auto d_scale = Upload(tc.fp8_weights ? w8.scale : std::vector<float>{1.0f}, DType::kF32);
    kc::GemvFusedParams p;
    p.gemm.x = d_x.data();
    p.gemm.ldx = ldx;
    p.gemm.w = d_w.data();
    p.gemm.ldw = tc.k;
    p.gemm.ldy = tc.n;
    p.gemm.m = tc.m;
    p.gemm.n = tc.n;
    p.gemm.k = tc.k;
    p.gemm.out_dtype = tc.out;
    p.gemm.group_n = tc.group_n;
    if (tc.fp8_weights) {
      p.w_dtype = DType::kF8E4M3;
      p.w_scale = static_cast<const float*>(d_scale.data());
    }
    auto run = [&](int per_sm) {
      auto d_y = Poisoned(tc.m * tc.n, tc.out);
      kc::GemvFusedParams q = p;
      q.gemm.y = d_y.data();
      q.blocks_per_sm = per_sm;
      EXPECT_TRUE(kc::GemvFusedSupports(q));
      EXPECT_EQ(kc::GemvFused(q, nullptr), 0);
      return Download(d_y, tc.m * tc.n, tc.out);
    };
    const std::vector<float> base = run(0);
    // bf16 outputs: within an ulp of the rounded reference (2^-8; e4m3 rows, whose products are
    // exact, are held to that, bf16 ones to the usual 1e-2).
    EXPECT_LE(RelError(base, RoundTo(tc.out, want)), tc.out == DType::kF32 ? 1e-5
                                                     : tc.fp8_weights      ? 1.0 / 256
                                                                           : 1e-2);
    for (int per_sm : {1, 2, 3, 4}) {
      const std::vector<float> got = run(per_sm);
      ASSERT_EQ(got.size(), base.size());
      EXPECT_EQ(std::memcmp(got.data(), base.data(), got.size() * sizeof(float)), 0)
          << per_sm << " CTAs per multiprocessor";
    }
  }
}

// The SiLU·mul epilogue gives the same bits as the plain GEMV's bf16 output followed by SiluMul:
// RMSNorm and plain inputs, one and two rows, bf16 and e4m3 weights, several CTA counts; the
// columns of y past inter stay untouched.
TEST(GemvFusedSiluPairsTest, SameBitsAsGemvThenSiluMul) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t m, inter, k;
    kc::GemvInput input;
    bool fp8_weights;
  };
  // inter a multiple of 8 (SiluMul's vectors); rows per CTA odd before rounding for some.
  const Case cases[] = {
      {1, 14336, 4096, In::kRmsNorm, false}, {2, 14336, 4096, In::kRmsNorm, false},
      {1, 14336, 4096, In::kRmsNorm, true},  {2, 3000, 2048, In::kPlain, false},
      {1, 776, 6144, In::kRmsNorm, false},   {2, 1000, 2048, In::kRmsNorm, true},
      {1, 8, 4096, In::kPlain, true}};
  for (const Case& tc : cases) {
    SCOPED_TRACE(testing::Message()
                 << tc.m << " x " << tc.inter << " x " << tc.k << " input "
                 << static_cast<int>(tc.input) << (tc.fp8_weights ? " e4m3" : ""));
    const int64_t n = 2 * tc.inter, ldy = tc.inter + 8;
    std::mt19937 rng(static_cast<uint32_t>(tc.m + tc.inter * 3 + tc.k));
    auto x = RoundTo(DType::kBF16, Random(tc.m * tc.k, rng, 2.0f));
    auto residual = Random(tc.m * tc.k, rng);
    auto norm_w = Random(tc.k, rng, 0.2f);
    for (auto& v : norm_w) v += 1.0f;
    std::vector<float> w;
    Fp8Weights w8;
    if (tc.fp8_weights) {
      w8 = RandomFp8(n, tc.k, rng);
    } else {
      w = RoundTo(DType::kBF16, Random(n * tc.k, rng, 2.0f / std::sqrt(static_cast<float>(tc.k))));
    }
    auto d_x = Upload(x, DType::kBF16);
    auto d_res = Upload(residual, DType::kF32), d_norm = Upload(norm_w, DType::kF32);
    auto d_w = tc.fp8_weights ? UploadRaw(w8.bytes) : Upload(w, DType::kBF16);
    auto d_scale = Upload(tc.fp8_weights ? w8.scale : std::vector<float>{1.0f}, DType::kF32);
    kc::GemvFusedParams p;
    p.gemm.x = d_x.data();
    p.gemm.ldx = tc.k;
    p.gemm.w = d_w.data();
    p.gemm.ldw = tc.k;
    p.gemm.m = tc.m;
    p.gemm.n = n;
    p.gemm.k = tc.k;
    p.gemm.out_dtype = DType::kBF16;
    p.input = tc.input;
    p.residual = static_cast<const float*>(d_res.data());
    p.norm_weight = static_cast<const float*>(d_norm.data());
    p.eps = 1e-5f;
    if (tc.fp8_weights) {
      p.w_dtype = DType::kF8E4M3;
      p.w_scale = static_cast<const float*>(d_scale.data());
    }
    // The reference: the plain output [m, n], then SiluMul into [m, ldy].
    auto d_gu = Poisoned(tc.m * n, DType::kBF16);
    auto d_want = Poisoned(tc.m * ldy, DType::kBF16);
    kc::GemvFusedParams plain = p;
    plain.gemm.y = d_gu.data();
    plain.gemm.ldy = n;
    ASSERT_CUDA_OK(kc::GemvFused(plain, nullptr));
    kc::SiluMulParams act;
    act.gate = d_gu.data();
    act.up = static_cast<const uint16_t*>(d_gu.data()) + tc.inter;
    act.out = d_want.data();
    act.rows = tc.m;
    act.dim = tc.inter;
    act.in_stride = n;
    act.out_stride = ldy;
    ASSERT_CUDA_OK(kc::SiluMul(act, nullptr));
    const auto want = DownloadRaw<uint16_t>(d_want, tc.m * ldy);
    for (int per_sm : {0, 1, 2, 4}) {
      SCOPED_TRACE(testing::Message() << per_sm << " CTAs per multiprocessor");
      auto d_y = Poisoned(tc.m * ldy, DType::kBF16);
      kc::GemvFusedParams f = p;
      f.gemm.y = d_y.data();
      f.gemm.ldy = ldy;
      f.silu_pairs = true;
      f.blocks_per_sm = per_sm;
      ASSERT_TRUE(kc::GemvFusedSupports(f));
      ASSERT_CUDA_OK(kc::GemvFused(f, nullptr));
      const auto got = DownloadRaw<uint16_t>(d_y, tc.m * ldy);
      for (int64_t r = 0; r < tc.m; ++r) {
        for (int64_t i = 0; i < ldy; ++i) {
          ASSERT_EQ(got[r * ldy + i], want[r * ldy + i]) << "row " << r << " column " << i;
        }
      }
    }
  }
}

struct Fp8Case {
  int64_t m, n, k;
  kc::Fp8Scaling scaling;
  DType out;
};

std::ostream& operator<<(std::ostream& os, const Fp8Case& c) {
  return os << c.m << "x" << c.n << "x" << c.k << " scaling " << static_cast<int>(c.scaling)
            << " -> " << DTypeName(c.out);
}

class Fp8GemmTest : public ::testing::TestWithParam<Fp8Case> {};

// x [m, k] · w [n, k]ᵀ summed in double: the reference of the FP8 products.
std::vector<float> ProductInDouble(const std::vector<float>& x, const std::vector<float>& w,
                                   int64_t m, int64_t n, int64_t k) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t l = 0; l < k; ++l) acc += double{x[i * k + l]} * w[j * k + l];
      y[i * n + j] = static_cast<float>(acc);
    }
  }
  return y;
}

// Device operands of an FP8 product y [m, n] = x [m, k] · w [n, k]ᵀ with the given scales.
kc::Fp8GemmParams Fp8Params(const cuda::DeviceBuffer& x, const cuda::DeviceBuffer& w,
                            const cuda::DeviceBuffer& y, const cuda::DeviceBuffer& x_scale,
                            const cuda::DeviceBuffer& w_scale, int64_t m, int64_t n, int64_t k,
                            DType out, kc::Fp8Scaling scaling) {
  kc::Fp8GemmParams p;
  p.x = x.data();
  p.w = w.data();
  p.y = y.data();
  p.ldx = p.ldw = k;
  p.ldy = n;
  p.m = m;
  p.n = n;
  p.k = k;
  p.out_dtype = out;
  p.scaling = scaling;
  p.x_scale = static_cast<const float*>(x_scale.data());
  p.w_scale = static_cast<const float*>(w_scale.data());
  return p;
}

float AbsMax(const float* v, int64_t n, int64_t stride = 1) {
  float a = 0.0f;
  for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(v[i * stride]));
  return a;
}

TEST_P(Fp8GemmTest, MatchesDequantizedProduct) {
  SKIP_WITHOUT_GPU();
  const Fp8Case tc = GetParam();
  const int64_t m = tc.m, n = tc.n, k = tc.k, kb = (k + 127) / 128, nb = (n + 127) / 128;
  std::mt19937 rng(static_cast<uint32_t>(m * 7 + n * 3 + k + static_cast<int>(tc.scaling)));
  const auto x = RoundTo(DType::kBF16, Random(m * k, rng));
  auto w = Random(n * k, rng, 1.0f / std::sqrt(static_cast<float>(k)));
  // Rows of different magnitudes, so that per-channel and block scales matter.
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t l = 0; l < k; ++l) w[j * k + l] *= 1.0f + static_cast<float>(j % 7);
  }

  // Weights: e4m3 bytes and scales on the host (amax / 448 per tensor, row or block).
  std::vector<uint8_t> w8(n * k);
  std::vector<float> w_scale, w_deq(n * k);
  auto scale_of = [](float amax) { return amax > 0.0f ? amax / 448.0f : 1.0f; };
  if (tc.scaling == kc::Fp8Scaling::kBlock128) {
    w_scale.assign(nb * kb, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t l = 0; l < k; ++l) {
        float& a = w_scale[(j / 128) * kb + l / 128];
        a = std::max(a, std::fabs(w[j * k + l]));
      }
    }
    for (auto& a : w_scale) a = scale_of(a);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t l = 0; l < k; ++l) {
        w8[j * k + l] = ToE4M3(w[j * k + l] / w_scale[(j / 128) * kb + l / 128]);
      }
    }
    // The reference values through the CPU's DeepSeek FP8 path: repack, then dequantize.
    std::vector<kernels::cpu::BlockF8E4M3B32> blocks(n * k / 32);
    kernels::cpu::RepackF8E4M3(w8.data(), w_scale.data(), n, k, 128, 128, blocks.data());
    for (int64_t j = 0; j < n; ++j) {
      kernels::cpu::DequantizeRow(DType::kF8E4M3B32, blocks.data() + j * (k / 32),
                                  w_deq.data() + j * k, k);
    }
  } else {
    const bool tensor = tc.scaling == kc::Fp8Scaling::kTensor;
    w_scale.resize(tensor ? 1 : n);
    if (tensor) w_scale[0] = scale_of(AbsMax(w.data(), n * k));
    for (int64_t j = 0; j < n && !tensor; ++j) w_scale[j] = scale_of(AbsMax(&w[j * k], k));
    for (int64_t j = 0; j < n; ++j) {
      const float sc = w_scale[tensor ? 0 : j];
      for (int64_t l = 0; l < k; ++l) {
        w8[j * k + l] = ToE4M3(w[j * k + l] / sc);
        w_deq[j * k + l] = kernels::cpu::E4M3ToF32(w8[j * k + l]) * sc;
      }
    }
  }

  // Activations: quantized on the device (a static scale for kTensor).
  const int64_t x_scales = tc.scaling == kc::Fp8Scaling::kTensor
                               ? 1
                               : (tc.scaling == kc::Fp8Scaling::kChannel ? m : kb * m);
  std::vector<float> x_scale_init(x_scales, scale_of(AbsMax(x.data(), m * k)));
  auto d_x = Upload(x, DType::kBF16);
  auto d_x8 = UploadRaw(std::vector<uint8_t>(m * k, 0xff));
  auto d_xs = UploadRaw(x_scale_init);
  kc::Fp8QuantizeParams qp;
  qp.x = d_x.data();
  qp.ldx = k;
  qp.m = m;
  qp.k = k;
  qp.out = d_x8.data();
  qp.scaling = tc.scaling;
  qp.scale = static_cast<float*>(d_xs.data());
  ASSERT_CUDA_OK(kc::QuantizeFp8(qp, nullptr));
  const auto x8 = DownloadRaw<uint8_t>(d_x8, m * k);
  const auto xs = DownloadRaw<float>(d_xs, x_scales);
  std::vector<float> x_deq(m * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t l = 0; l < k; ++l) {
      const float sc = tc.scaling == kc::Fp8Scaling::kTensor    ? xs[0]
                       : tc.scaling == kc::Fp8Scaling::kChannel ? xs[i]
                                                                : xs[(l / 128) * m + i];
      x_deq[i * k + l] = kernels::cpu::E4M3ToF32(x8[i * k + l]) * sc;
    }
  }
  // e4m3 keeps 3 mantissa bits: about 3% relative error in the norm.
  EXPECT_LE(RelError(x_deq, x), 0.05);

  const std::vector<float> want = ProductInDouble(x_deq, w_deq, m, n, k);
  auto d_w8 = UploadRaw(w8);
  auto d_ws = UploadRaw(w_scale);
  auto d_y = Poisoned(m * n, tc.out);
  auto runner = kc::GemmRunner::Create();
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  const kc::Fp8GemmParams p = Fp8Params(d_x8, d_w8, d_y, d_xs, d_ws, m, n, k, tc.out, tc.scaling);
  ASSERT_STATUS_OK((*runner)->RunFp8(p, nullptr));
  // Hopper's FP8 tensor cores accumulate with fewer bits than f32 between promotions to f32.
  const double tol = tc.out == DType::kF32 ? 1e-3 : Tolerance(tc.out);
  EXPECT_LE(RelError(Download(d_y, m * n, tc.out), RoundTo(tc.out, want)), tol);
}

INSTANTIATE_TEST_SUITE_P(
    Scalings, Fp8GemmTest,
    ::testing::Values(Fp8Case{64, 256, 512, kc::Fp8Scaling::kTensor, DType::kBF16},
                      Fp8Case{5, 320, 256, kc::Fp8Scaling::kTensor, DType::kF32},
                      Fp8Case{64, 256, 512, kc::Fp8Scaling::kChannel, DType::kBF16},
                      Fp8Case{200, 384, 1024, kc::Fp8Scaling::kChannel, DType::kF32},
                      Fp8Case{64, 256, 512, kc::Fp8Scaling::kBlock128, DType::kBF16},
                      Fp8Case{130, 320, 768, kc::Fp8Scaling::kBlock128, DType::kF32}));

// The block-scaled kernel (Fp8BlockGemm) on random e4m3 bytes with scales that differ by up to
// 2^8 from block to block, on each of its paths, against the exact products summed in double.
struct Fp8BlockCase {
  int64_t m, n, k;
  DType out;
  kc::Fp8BlockPath path;  // kAuto: through GemmRunner::RunFp8
};

std::ostream& operator<<(std::ostream& os, const Fp8BlockCase& c) {
  return os << c.m << "x" << c.n << "x" << c.k << " -> " << DTypeName(c.out) << " path "
            << static_cast<int>(c.path);
}

class Fp8BlockGemmTest : public ::testing::TestWithParam<Fp8BlockCase> {};

TEST_P(Fp8BlockGemmTest, MatchesExactProduct) {
  SKIP_WITHOUT_GPU();
  const Fp8BlockCase tc = GetParam();
  const int64_t m = tc.m, n = tc.n, k = tc.k, kb = k / 128, nb = (n + 127) / 128;
  std::mt19937 rng(static_cast<uint32_t>(m * 31 + n * 7 + k + static_cast<int>(tc.path)));
  std::uniform_int_distribution<int> exponent(-4, 4);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  auto scales = [&](int64_t count) {
    std::vector<float> v(count);
    for (auto& a : v) a = std::ldexp(mantissa(rng), exponent(rng));
    return v;
  };
  // Bytes of values up to about 100 in magnitude, the range e4m3 codes spread over.
  auto bytes = [&](int64_t count) {
    std::vector<uint8_t> v(count);
    std::normal_distribution<float> nd(0.0f, 30.0f);
    for (auto& b : v) b = ToE4M3(nd(rng));
    return v;
  };
  const auto x8 = bytes(m * k), w8 = bytes(n * k);
  const auto x_scale = scales(kb * m), w_scale = scales(nb * kb);
  std::vector<float> xv(m * k), wv(n * k);
  for (int64_t i = 0; i < m * k; ++i) {
    xv[i] = kernels::cpu::E4M3ToF32(x8[i]) * x_scale[(i % k / 128) * m + i / k];
  }
  for (int64_t i = 0; i < n * k; ++i) {
    wv[i] = kernels::cpu::E4M3ToF32(w8[i]) * w_scale[(i / k / 128) * kb + i % k / 128];
  }
  const std::vector<float> want = ProductInDouble(xv, wv, m, n, k);

  auto d_x = UploadRaw(x8);
  auto d_w = UploadRaw(w8);
  auto d_xs = UploadRaw(x_scale);
  auto d_ws = UploadRaw(w_scale);
  auto d_y = Poisoned(m * n, tc.out);
  const kc::Fp8GemmParams p =
      Fp8Params(d_x, d_w, d_y, d_xs, d_ws, m, n, k, tc.out, kc::Fp8Scaling::kBlock128);
  if (tc.path == kc::Fp8BlockPath::kAuto) {
    auto runner = kc::GemmRunner::Create();
    ASSERT_TRUE(runner.ok()) << runner.status().ToString();
    ASSERT_STATUS_OK((*runner)->RunFp8(p, nullptr));
  } else {
    ASSERT_CUDA_OK(kc::Fp8BlockGemm(p, nullptr, tc.path));
  }
  // Each block's tensor-core sum keeps fewer bits than f32; the blocks add up in f32.
  const double tol = tc.out == DType::kF32 ? 1e-3 : Tolerance(tc.out);
  EXPECT_LE(RelError(Download(d_y, m * n, tc.out), RoundTo(tc.out, want)), tol);
}

// Not a conformance test: with DINFER_GEMV_PERF=1 set, prints the GB/s of the batch-1 decode
// GEMVs of DeepSeek-V4-Flash and Llama-3.1-8B (m = 1 and 2) for the GEMV kernel ("gemv": its
// default tiling; "c/u/s": cols, unroll, split, m = 1 only) and the staged GEMV ("stN": N CTAs
// per multiprocessor, 0 the default), as "alone/chained": alone, one launch between two events
// (launch latency included); chained, 20 programmatic dependent launches in a row (each one's
// weights stream in while the one before finishes, as in a decode step; host launch time
// included, no graph). Weights rotate over copies of 256 MB or more together (cold in the 50 MB
// L2). The fractions are of the LM head's best chained GB/s (1 GB of weights: the bandwidth a
// long read reaches): the staged default's and the best.
TEST(GemvPerf, DecodeShapesBandwidth) {
  SKIP_WITHOUT_GPU();
  if (std::getenv("DINFER_GEMV_PERF") == nullptr) GTEST_SKIP() << "DINFER_GEMV_PERF=1 times it";
  struct Shape {
    const char* name;
    int64_t n, k, group_n;
    DType out;
  };
  const Shape shapes[] = {
      {"lm_head", 129280, 4096, 0, DType::kF32},     {"v4 x_proj", 3072, 4096, 0, DType::kF32},
      {"v4 router", 256, 4096, 0, DType::kF32},      {"v4 wo_a", 8192, 4096, 1024, DType::kBF16},
      {"v4 wo_b", 4096, 8192, 0, DType::kF32},       {"v4 w13", 4096, 4096, 0, DType::kF32},
      {"v4 w2", 4096, 2048, 0, DType::kF32},         {"v4 q_proj", 40960, 1024, 0, DType::kF32},
      {"l8b qkv", 6144, 4096, 0, DType::kBF16},      {"l8b o", 4096, 4096, 0, DType::kBF16},
      {"l8b gate_up", 28672, 4096, 0, DType::kBF16}, {"l8b down", 4096, 14336, 0, DType::kBF16}};
  struct Variant {
    bool gemv;
    kc::GemvTiling tiling;  // gemv: cols 0 = the default
    int per_sm;             // staged
  };
  std::vector<Variant> variants = {{true, {}, 0},
                                   {true, {2, 4, 1}, 0},
                                   {true, {2, 4, 2}, 0},
                                   {true, {2, 4, 4}, 0},
                                   {true, {1, 8, 4}, 0}};
  for (int per_sm : {0, 1, 2, 3, 4}) variants.push_back({false, {}, per_sm});
  std::printf("%-12s m %7s", "shape", "MB");
  for (const Variant& v : variants) {
    char name[24];
    if (!v.gemv) {
      std::snprintf(name, sizeof(name), "st%d", v.per_sm);
    } else if (v.tiling.cols == 0) {
      std::snprintf(name, sizeof(name), "gemv");
    } else {
      std::snprintf(name, sizeof(name), "%d/%d/%d", v.tiling.cols, v.tiling.unroll, v.tiling.split);
    }
    std::printf(" %11s", name);
  }
  std::printf("  | staged default chained, best chained (fractions)\n");
  cudaStream_t st = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  double reference = 0;
  for (const Shape& sh : shapes) {
    const int64_t w_bytes = sh.n * sh.k * 2;
    const int64_t copies = std::max<int64_t>(2, ((int64_t{256} << 20) + w_bytes - 1) / w_bytes);
    const int64_t groups = sh.group_n > 0 ? sh.n / sh.group_n : 1;
    void *w = nullptr, *x = nullptr, *y = nullptr;
    ASSERT_CUDA_OK(cudaMalloc(&w, copies * w_bytes));
    ASSERT_CUDA_OK(cudaMalloc(&x, 2 * groups * sh.k * 2));
    ASSERT_CUDA_OK(cudaMalloc(&y, 2 * sh.n * 4));
    ASSERT_CUDA_OK(cudaMemset(w, 0x3c, copies * w_bytes));  // bf16 0x3c3c, about 0.0115
    ASSERT_CUDA_OK(cudaMemset(x, 0x3c, 2 * groups * sh.k * 2));
    for (int64_t m : {1, 2}) {
      std::printf("%-12s %lld %7.1f", sh.name, static_cast<long long>(m), w_bytes / 1e6);
      double default_chain = 0, best_chain = 0;
      for (const Variant& v : variants) {
        kc::GemvFusedParams f;
        f.gemm.x = x;
        f.gemm.ldx = groups * sh.k;
        f.gemm.ldw = sh.k;
        f.gemm.y = y;
        f.gemm.ldy = sh.n;
        f.gemm.m = m;
        f.gemm.n = sh.n;
        f.gemm.k = sh.k;
        f.gemm.out_dtype = sh.out;
        f.gemm.group_n = sh.group_n;
        f.blocks_per_sm = v.per_sm;
        f.gemm.w = w;
        const bool tiled = v.gemv && v.tiling.cols != 0;
        if (v.gemv ? (sh.group_n > 0 || !kc::GemvSupports(f.gemm) || (tiled && m != 1))
                   : !kc::GemvFusedSupports(f)) {
          std::printf(" %11s", "-");
          continue;
        }
        int64_t i = 0;
        auto launch = [&] {
          f.gemm.w = static_cast<char*>(w) + (i++ % copies) * w_bytes;
          return v.gemv ? kc::Gemv(f.gemm, st, v.tiling) : kc::GemvFused(f, st);
        };
        const LaunchTimes times = TimeLaunches(st, launch);
        ASSERT_GT(times.chained_ms, 0.0);
        const double a = w_bytes / times.alone_ms / 1e6, c = w_bytes / times.chained_ms / 1e6;
        std::printf(" %5.0f/%-5.0f", a, c);
        if (!v.gemv && v.per_sm == 0) default_chain = c;
        best_chain = std::max(best_chain, c);
      }
      if (reference == 0) reference = best_chain;
      std::printf("  | %5.0f %5.0f (%.2f %.2f)\n", default_chain, best_chain,
                  default_chain / reference, best_chain / reference);
    }
    ASSERT_CUDA_OK(cudaFree(w));
    ASSERT_CUDA_OK(cudaFree(x));
    ASSERT_CUDA_OK(cudaFree(y));
  }
  cudaStreamDestroy(st);
}

using Path = kc::Fp8BlockPath;
INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8BlockGemmTest,
    ::testing::Values(Fp8BlockCase{1, 4096, 4096, DType::kBF16, Path::kAuto},
                      Fp8BlockCase{1, 200, 128, DType::kF32, Path::kAuto},
                      Fp8BlockCase{3, 200, 4096, DType::kF32, Path::kAuto},
                      Fp8BlockCase{3, 4096, 128, DType::kBF16, Path::kAuto},
                      Fp8BlockCase{16, 4096, 128, DType::kF32, Path::kAuto},
                      Fp8BlockCase{64, 128, 128, DType::kF32, Path::kAuto},
                      Fp8BlockCase{64, 4096, 4096, DType::kBF16, Path::kAuto},
                      Fp8BlockCase{300, 200, 4096, DType::kF32, Path::kAuto},
                      Fp8BlockCase{300, 4096, 128, DType::kBF16, Path::kAuto},
                      Fp8BlockCase{1500, 200, 256, DType::kF32, Path::kAuto},
                      Fp8BlockCase{5, 203, 256, DType::kBF16, Path::kAuto},
                      Fp8BlockCase{40, 200, 512, DType::kF32, Path::kSkinny},
                      Fp8BlockCase{3, 200, 4096, DType::kF32, Path::kTiled64},
                      Fp8BlockCase{300, 200, 4096, DType::kF32, Path::kTiled128},
                      Fp8BlockCase{130, 131, 384, DType::kBF16, Path::kTiled128},
                      Fp8BlockCase{300, 200, 4096, DType::kF32, Path::kWgmma128},
                      Fp8BlockCase{17, 4096, 256, DType::kF32, Path::kWgmma128},
                      Fp8BlockCase{130, 131, 384, DType::kBF16, Path::kWgmma128},
                      Fp8BlockCase{1500, 200, 256, DType::kF32, Path::kWgmma64},
                      Fp8BlockCase{70, 131, 384, DType::kBF16, Path::kWgmma64}));

}  // namespace
}  // namespace dinfer
