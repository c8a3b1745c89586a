// Conformance of the CPU element-wise and attention kernels against their plain references.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace dinfer::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float rtol) {
  ASSERT_EQ(got.size(), want.size());
  float max_ref = 0;
  for (float w : want) max_ref = std::max(max_ref, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rtol * std::max(1.0f, max_ref)) << "at " << i;
  }
}

TEST(OpsConformance, RmsNorm) {
  for (int64_t dim : {1, 7, 64, 576, 4096}) {
    for (float offset : {0.0f, 1.0f}) {
      const int64_t rows = 5;
      auto x = Random(rows * dim, 1);
      auto w = Random(dim, 2);
      std::vector<float> got(x.size()), want(x.size());
      RmsNormParams p;
      p.x = x.data();
      p.weight = w.data();
      p.rows = rows;
      p.dim = dim;
      p.eps = 1e-5f;
      p.weight_offset = offset;
      p.out = got.data();
      RmsNorm(p);
      p.out = want.data();
      RmsNormReference(p);
      ExpectClose(got, want, 1e-6f);
    }
  }
}

TEST(OpsConformance, RopeBothLayouts) {
  for (bool interleaved : {false, true}) {
    for (int64_t rotary : {32, 64}) {
      const int64_t rows = 9, heads = 3, head_dim = 64;
      auto x = Random(rows * heads * head_dim, 3);
      std::vector<float> inv(rotary / 2);
      for (int64_t i = 0; i < rotary / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / rotary);
      std::vector<int32_t> pos(rows);
      for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int32_t>(r * 37 + 5);
      auto got = x, want = x;
      RopeParams p;
      p.rows = rows;
      p.num_heads = heads;
      p.head_dim = head_dim;
      p.rotary_dim = rotary;
      p.positions = pos.data();
      p.inv_freq = inv.data();
      p.interleaved = interleaved;
      p.x = got.data();
      Rope(p);
      p.x = want.data();
      RopeReference(p);
      ExpectClose(got, want, 2e-6f);
      // Dims past rotary_dim are untouched.
      for (int64_t d = rotary; d < head_dim; ++d) ASSERT_EQ(got[d], x[d]);
    }
  }
}

TEST(OpsConformance, SiluMul) {
  const int64_t rows = 3, dim = 100;
  auto g = Random(rows * dim, 4, 3.0f), u = Random(rows * dim, 5);
  std::vector<float> out(rows * dim);
  SiluMulParams p;
  p.gate = g.data();
  p.up = u.data();
  p.out = out.data();
  p.rows = rows;
  p.dim = dim;
  SiluMul(p);
  for (size_t i = 0; i < out.size(); ++i) {
    const double want = g[i] / (1.0 + std::exp(-double{g[i]})) * u[i];
    ASSERT_NEAR(out[i], want, 1e-5 * (1 + std::fabs(want)));
  }
}

struct AttnCase {
  int64_t heads, kv_heads, head_dim, block_size, window;
  float softcap;
};

class AttentionConformance : public ::testing::TestWithParam<AttnCase> {};

// Two sequences in one batch: one prefilling a chunk after cached context, one decoding,
// over scrambled paged blocks.
TEST_P(AttentionConformance, MatchesReference) {
  const AttnCase c = GetParam();
  const int64_t kv_dim = c.kv_heads * c.head_dim, num_blocks = 64;
  auto k_cache = Random(num_blocks * c.block_size * kv_dim, 6);
  auto v_cache = Random(num_blocks * c.block_size * kv_dim, 7);
  const int64_t max_blocks = 24;
  std::vector<int32_t> tables(2 * max_blocks);
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(8));
  for (int64_t i = 0; i < 2 * max_blocks; ++i) tables[i] = perm[i];
  std::vector<int32_t> token_seq, q_pos;
  for (int32_t p = 40; p < 40 + 23; ++p) {  // sequence 0: chunk of 23 tokens after 40 cached
    token_seq.push_back(0);
    q_pos.push_back(p);
  }
  token_seq.push_back(1);  // sequence 1: one decode token at position 150
  q_pos.push_back(150);
  const int64_t tokens = static_cast<int64_t>(q_pos.size());
  auto q = Random(tokens * c.heads * c.head_dim, 9);
  std::vector<float> got(q.size()), want(q.size());
  ThreadPool pool(2);
  AttentionParams p;
  p.q = q.data();
  p.k_cache = k_cache.data();
  p.v_cache = v_cache.data();
  p.block_size = c.block_size;
  p.num_heads = c.heads;
  p.num_kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.token_seq = token_seq.data();
  p.q_pos = q_pos.data();
  p.num_tokens = tokens;
  p.block_tables = tables.data();
  p.max_blocks_per_seq = max_blocks;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.sliding_window = c.window;
  p.softcap = c.softcap;
  p.pool = &pool;
  p.out = got.data();
  Attention(p);
  p.out = want.data();
  AttentionReference(p);
  ExpectClose(got, want, 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionConformance,
    ::testing::Values(AttnCase{4, 4, 64, 16, 0, 0}, AttnCase{8, 2, 64, 16, 0, 0},
                      AttnCase{9, 3, 64, 8, 0, 0}, AttnCase{4, 1, 128, 16, 24, 0},
                      AttnCase{4, 2, 32, 32, 7, 0}, AttnCase{4, 2, 64, 16, 0, 50.0f}));

}  // namespace
}  // namespace dinfer::kernels::cpu
