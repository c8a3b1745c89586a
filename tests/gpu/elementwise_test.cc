// CUDA element-wise kernels (embedding, RMSNorm with residual add / bias / row gather, SiLU·mul,
// random fill, argmax) against the CPU reference kernels. Skipped without a GPU.
#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/sampling.h"
#include "sample/sampler.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;

class ElementwiseTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(ElementwiseTest, RmsNormWithResidualBiasAndGather) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(dim));
  const int64_t rows = 37;
  auto residual = Random(rows * dim, rng);
  auto add = RoundTo(dtype, Random(rows * dim, rng, 0.5f));
  auto bias = Random(dim, rng, 0.1f);
  auto weight = Random(dim, rng, 0.2f);
  for (auto& w : weight) w += 1.0f;
  // Output rows gather residual rows in a scrambled order, every other row.
  std::vector<int32_t> index;
  for (int32_t r = rows - 1; r >= 0; r -= 2) index.push_back(r);

  std::vector<float> x(rows * dim);
  for (int64_t i = 0; i < rows * dim; ++i) x[i] = residual[i] + add[i] + bias[i % dim];
  const int64_t out_rows = static_cast<int64_t>(index.size());
  std::vector<float> gathered(out_rows * dim), want(out_rows * dim);
  for (int64_t r = 0; r < out_rows; ++r) {
    std::copy_n(x.begin() + index[r] * dim, dim, gathered.begin() + r * dim);
  }
  kernels::cpu::RmsNormParams ref;
  ref.x = gathered.data();
  ref.weight = weight.data();
  ref.out = want.data();
  ref.rows = out_rows;
  ref.dim = dim;
  ref.eps = 1e-5f;
  ref.weight_offset = 0.25f;
  kernels::cpu::RmsNormReference(ref);

  auto d_res = Upload(residual, DType::kF32);
  auto d_add = Upload(add, dtype);
  auto d_bias = Upload(bias, DType::kF32);
  auto d_w = Upload(weight, DType::kF32);
  auto d_index = UploadRaw(index);
  auto d_out = Poisoned(out_rows * dim, dtype);
  kc::RmsNormParams p;
  p.residual = static_cast<float*>(d_res.data());
  p.add = d_add.data();
  p.add_bias = static_cast<const float*>(d_bias.data());
  p.rows_index = static_cast<const int32_t*>(d_index.data());
  p.write_back = true;
  p.weight = static_cast<const float*>(d_w.data());
  p.out = d_out.data();
  p.dtype = dtype;
  p.rows = out_rows;
  p.dim = dim;
  p.eps = 1e-5f;
  p.weight_offset = 0.25f;
  ASSERT_CUDA_OK(kc::RmsNorm(p, nullptr));
  EXPECT_LE(RelError(Download(d_out, out_rows * dim, dtype), RoundTo(dtype, want)),
            Tolerance(dtype));
  // Gathered rows were written back with the add; the others are untouched.
  const auto res_after = Download(d_res, rows * dim, DType::kF32);
  for (int64_t r = 0; r < rows; ++r) {
    const bool gathered_row = std::find(index.begin(), index.end(), r) != index.end();
    for (int64_t i = 0; i < dim; ++i) {
      const float expect = gathered_row ? x[r * dim + i] : residual[r * dim + i];
      ASSERT_EQ(res_after[r * dim + i], expect) << "row " << r << " col " << i;
    }
  }
}

TEST_P(ElementwiseTest, SiluMulOfFusedGateUp) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  std::mt19937 rng(11);
  const int64_t rows = 19;
  auto gate_up = RoundTo(dtype, Random(rows * 2 * dim, rng, 2.0f));
  std::vector<float> want(rows * dim);
  kernels::cpu::SiluMulParams ref;
  ref.gate = gate_up.data();
  ref.up = gate_up.data() + dim;
  ref.out = want.data();
  ref.rows = rows;
  ref.dim = dim;
  ref.gate_stride = ref.up_stride = 2 * dim;
  kernels::cpu::SiluMul(ref);
  auto d_in = Upload(gate_up, dtype);
  auto d_out = Poisoned(rows * dim, dtype);
  kc::SiluMulParams p;
  p.gate = d_in.data();
  p.up = static_cast<char*>(d_in.data()) + dim * ElemSize(dtype);
  p.out = d_out.data();
  p.dtype = dtype;
  p.rows = rows;
  p.dim = dim;
  p.in_stride = 2 * dim;
  ASSERT_CUDA_OK(kc::SiluMul(p, nullptr));
  EXPECT_LE(RelError(Download(d_out, rows * dim, dtype), RoundTo(dtype, want)), Tolerance(dtype));
}

TEST_P(ElementwiseTest, EmbeddingRows) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, dim] = GetParam();
  std::mt19937 rng(5);
  const int64_t vocab = 301;
  auto table = RoundTo(dtype, Random(vocab * dim, rng));
  std::vector<int32_t> ids = {0, 300, 7, 7, 150, 299, 1};
  std::vector<float> want(ids.size() * dim);
  kernels::cpu::EmbeddingParams ref;
  ref.table = table.data();
  ref.dtype = DType::kF32;
  ref.dim = dim;
  ref.row_bytes = dim * 4;
  ref.vocab = vocab;
  ref.ids = ids.data();
  ref.num_tokens = static_cast<int64_t>(ids.size());
  ref.out = want.data();
  ref.scale = 1.5f;
  kernels::cpu::Embedding(ref);
  auto d_table = Upload(table, dtype);
  auto d_ids = UploadRaw(ids);
  auto d_out = Poisoned(ids.size() * dim, DType::kF32);
  kc::EmbeddingParams p;
  p.table = d_table.data();
  p.dtype = dtype;
  p.ids = static_cast<const int32_t*>(d_ids.data());
  p.out = static_cast<float*>(d_out.data());
  p.num_tokens = static_cast<int64_t>(ids.size());
  p.dim = dim;
  p.scale = 1.5f;
  ASSERT_CUDA_OK(kc::Embedding(p, nullptr));
  EXPECT_LE(RelError(Download(d_out, ids.size() * dim, DType::kF32), want), 1e-7);
}

INSTANTIATE_TEST_SUITE_P(DTypesAndWidths, ElementwiseTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(64, 576, 4096)));

TEST(CudaSampling, ArgmaxMatchesSamplerArgmaxWithTies) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  const int64_t rows = 9, vocab = 128256;
  auto logits = Random(rows * vocab, rng, 3.0f);
  // Ties: the row's maximum appears twice; the lower index must win.
  for (int64_t r = 0; r < rows; ++r) {
    float* row = logits.data() + r * vocab;
    const float mx = *std::max_element(row, row + vocab);
    row[(r * 7919) % vocab] = mx + 1.0f;
    row[(r * 7919 + 5000) % vocab] = mx + 1.0f;
  }
  auto d_logits = Upload(logits, DType::kF32);
  auto d_tokens = Poisoned(rows, DType::kF32);
  ASSERT_CUDA_OK(kc::ArgmaxRows(static_cast<const float*>(d_logits.data()), rows, vocab, vocab,
                                static_cast<int32_t*>(d_tokens.data()), nullptr));
  const auto got = DownloadRaw<int32_t>(d_tokens, rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t want = sample::Argmax(std::span<const float>(logits.data() + r * vocab, vocab));
    EXPECT_EQ(got[r], want) << "row " << r;
  }
}

// Odd vocabularies and strides (no 16-byte rows), NaN logits, ties between the slices the
// cluster splits a row into, a row of NaN only, and more rows than a grid dimension holds.
TEST(CudaSampling, ArgmaxOddShapesNaNAndManyRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  struct Shape {
    int64_t rows, vocab, stride;
  };
  for (const Shape s : {Shape{5, 7, 7}, Shape{4, 1001, 1003}, Shape{3, 129280, 129281},
                        Shape{6, 129280, 129280}, Shape{70000, 9, 10}}) {
    auto logits = Random(s.rows * s.stride, rng, 3.0f);
    for (int64_t r = 0; r < s.rows; ++r) {
      float* row = logits.data() + r * s.stride;
      const float mx = *std::max_element(row, row + s.vocab);
      if (r % 3 == 0) {  // a tie between the first and the last token: the first wins
        row[0] = row[s.vocab - 1] = mx + 1.0f;
      }
      if (r % 3 == 1) row[(r * 31) % s.vocab] = std::nanf("");
      if (r == 2) std::fill(row, row + s.vocab, std::nanf(""));
    }
    auto d_logits = Upload(logits, DType::kF32);
    auto d_tokens = Poisoned(s.rows, DType::kF32);
    ASSERT_CUDA_OK(kc::ArgmaxRows(static_cast<const float*>(d_logits.data()), s.rows, s.vocab,
                                  s.stride, static_cast<int32_t*>(d_tokens.data()), nullptr));
    const auto got = DownloadRaw<int32_t>(d_tokens, s.rows);
    int64_t wrong = 0;
    for (int64_t r = 0; r < s.rows; ++r) {
      const int32_t want =
          r == 2 ? 0
                 : sample::Argmax(std::span<const float>(logits.data() + r * s.stride, s.vocab));
      if (got[r] != want && wrong++ < 5) {
        ADD_FAILURE() << "vocab " << s.vocab << " row " << r << ": " << got[r] << " != " << want;
      }
    }
    EXPECT_EQ(wrong, 0) << "vocab " << s.vocab;
  }
}

TEST(CudaRandomFill, DeterministicBoundedAndSpread) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 20;
  auto a = Poisoned(n, DType::kBF16), b = Poisoned(n, DType::kBF16), c = Poisoned(n, DType::kBF16);
  ASSERT_CUDA_OK(kc::FillRandom(a.data(), DType::kBF16, n, 1, 0.5f, nullptr));
  ASSERT_CUDA_OK(kc::FillRandom(b.data(), DType::kBF16, n, 1, 0.5f, nullptr));
  ASSERT_CUDA_OK(kc::FillRandom(c.data(), DType::kBF16, n, 2, 0.5f, nullptr));
  const auto va = Download(a, n, DType::kBF16), vb = Download(b, n, DType::kBF16),
             vc = Download(c, n, DType::kBF16);
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  double sum = 0, sq = 0;
  for (float v : va) {
    ASSERT_TRUE(v >= -0.5f && v <= 0.5f) << v;
    sum += v;
    sq += double{v} * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 0.25 / 3.0, 0.01);  // variance of U(-a, a) is a² / 3
}

}  // namespace
}  // namespace dinfer
