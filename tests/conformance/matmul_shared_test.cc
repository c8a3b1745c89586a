// MatmulShared (one activation quantization and one parallel loop for several products) gives the
// same bits as separate Matmul calls, for every ISA, mixed weight types and both activation modes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant.h"

namespace dinfer::kernels::cpu {
namespace {

std::vector<uint8_t> RandomWeights(DType t, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> row(k);
  std::vector<uint8_t> w(RowBytes(t, k) * n);
  for (int64_t j = 0; j < n; ++j) {
    for (auto& v : row) v = nd(rng);
    QuantizeRowReference(t, row.data(), w.data() + j * RowBytes(t, k), k);
  }
  return w;
}

TEST(MatmulShared, EqualsSeparateCalls) {
  const int64_t k = 576;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ThreadPool pool(2);
  const std::vector<std::vector<DType>> groups = {
      {DType::kQ4_1, DType::kQ4_1, DType::kQ4_1},
      {DType::kQ8_0, DType::kQ4_0},
      {DType::kQ4_1, DType::kQ8_0},  // different activation formats: run one by one
      {DType::kF32, DType::kBF16, DType::kF16},
      {DType::kQ4_K, DType::kQ6_K}};
  const int64_t ns[] = {576, 192, 64};
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) continue;
    SetIsaForTesting(isa);
    for (const auto& group : groups) {
      for (int64_t m : {1, 3, 40}) {
        for (bool f32_acts : {false, true}) {
          std::vector<float> x(m * k);
          for (auto& v : x) v = nd(rng);
          std::vector<std::vector<uint8_t>> ws;
          std::vector<std::vector<float>> shared, separate;
          std::vector<MatmulParams> ps;
          for (size_t i = 0; i < group.size(); ++i) {
            const int64_t n = ns[i];
            ws.push_back(RandomWeights(group[i], n, k, static_cast<uint32_t>(i + 10)));
            shared.emplace_back(m * n);
            separate.emplace_back(m * n);
          }
          for (size_t i = 0; i < group.size(); ++i) {
            MatmulParams p;
            p.x = x.data();
            p.w = ws[i].data();
            p.w_dtype = group[i];
            p.m = m;
            p.n = ns[i];
            p.k = k;
            p.pool = &pool;
            p.f32_activations = f32_acts;
            p.y = separate[i].data();
            Matmul(p);
            p.y = shared[i].data();
            ps.push_back(p);
          }
          MatmulShared(ps);
          for (size_t i = 0; i < group.size(); ++i) {
            ASSERT_EQ(0, std::memcmp(shared[i].data(), separate[i].data(), shared[i].size() * 4))
                << IsaName(isa) << " " << DTypeName(group[i]) << " m=" << m << " f32=" << f32_acts;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dinfer::kernels::cpu
