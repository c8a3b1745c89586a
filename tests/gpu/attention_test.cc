// CUDA paged attention (one-token kernel with key splits merged in a cluster or by the merge
// kernel, tensor-core prefill kernel) against the CPU reference: several sequences, each with
// context already in the cache and new tokens, blocks in scrambled order, GQA, sliding windows and
// softcap; and an FP8 (e4m3) cache against the reference on the values its bytes stand for.
#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;

struct AttnCase {
  DType dtype;
  int64_t head_dim, heads, kv_heads;
  int64_t window = 0;
  float softcap = 0.0f;
  int64_t splits = 1;    // 0: ChooseAttentionSplits
  bool prefill = false;  // long chunks through AttentionPrefill
  bool fp8 = false;      // e4m3 cache holding K / kv_scale and V / kv_scale
  float kv_scale = 1.0f;
  int64_t block_size = 16;
};

std::ostream& operator<<(std::ostream& os, const AttnCase& c) {
  return os << DTypeName(c.dtype) << " d" << c.head_dim << " h" << c.heads << "/" << c.kv_heads
            << " window " << c.window << " softcap " << c.softcap << " splits " << c.splits
            << (c.prefill ? " prefill" : " rows") << (c.fp8 ? " fp8 scale " : "")
            << (c.fp8 ? std::to_string(c.kv_scale) : "") << " block " << c.block_size;
}

// (cached context, new tokens) per sequence.
const std::vector<std::pair<int64_t, int64_t>> kSeqs = {{0, 1},  {0, 70},    {37, 1},  {130, 64},
                                                        {5, 17}, {300, 129}, {0, 200}, {1000, 3}};

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const AttnCase tc = GetParam();
  const int64_t d = tc.head_dim, q_dim = tc.heads * d, kv_dim = tc.kv_heads * d;
  const int64_t q_stride = q_dim + 2 * kv_dim;  // q inside a fused qkv row
  const int64_t block_size = tc.block_size;
  std::mt19937 rng(static_cast<uint32_t>(d + 7 * tc.heads + 13 * tc.kv_heads + tc.window));

  int64_t max_blocks = 0, total_blocks = 0, tokens = 0;
  for (auto [ctx, n] : kSeqs) {
    const int64_t b = (ctx + n + block_size - 1) / block_size;
    max_blocks = std::max(max_blocks, b);
    total_blocks += b;
    tokens += n;
  }
  std::vector<int32_t> perm(total_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t seqs = static_cast<int64_t>(kSeqs.size());
  std::vector<int32_t> tables(seqs * max_blocks, 0), token_seq, positions, seq_end;
  std::vector<int32_t> rows, tile_seq, tile_token;
  int64_t next_block = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    const auto [ctx, n] = kSeqs[s];
    const int64_t b = (ctx + n + block_size - 1) / block_size;
    for (int64_t i = 0; i < b; ++i) tables[s * max_blocks + i] = perm[next_block++];
    const int64_t first = static_cast<int64_t>(token_seq.size());
    for (int64_t i = 0; i < n; ++i) {
      token_seq.push_back(static_cast<int32_t>(s));
      positions.push_back(static_cast<int32_t>(ctx + i));
    }
    seq_end.push_back(static_cast<int32_t>(token_seq.size()));
    if (tc.prefill && n >= 16) {
      for (int64_t i = 0; i < n; i += kc::kPrefillTileTokens) {
        tile_seq.push_back(static_cast<int32_t>(s));
        tile_token.push_back(static_cast<int32_t>(first + i));
      }
    } else {
      for (int64_t i = 0; i < n; ++i) rows.push_back(static_cast<int32_t>(first + i));
    }
  }
  const int64_t cache_elems = total_blocks * block_size * kv_dim;
  auto k_cache = RoundTo(tc.dtype, Random(cache_elems, rng));
  auto v_cache = RoundTo(tc.dtype, Random(cache_elems, rng));
  std::vector<uint8_t> k8, v8;
  if (tc.fp8) {
    k8 = QuantizeE4M3(k_cache, tc.kv_scale);
    v8 = QuantizeE4M3(v_cache, tc.kv_scale);
    k_cache = DequantizeE4M3(k8, tc.kv_scale);
    v_cache = DequantizeE4M3(v8, tc.kv_scale);
  }
  auto q = RoundTo(tc.dtype, Random(tokens * q_stride, rng));

  std::vector<float> want(tokens * q_dim);
  kernels::cpu::AttentionParams ref;
  ref.q = q.data();
  ref.q_stride = q_stride;
  ref.out = want.data();
  ref.k_cache = k_cache.data();
  ref.v_cache = v_cache.data();
  ref.block_size = block_size;
  ref.num_heads = tc.heads;
  ref.num_kv_heads = tc.kv_heads;
  ref.head_dim = d;
  ref.token_seq = token_seq.data();
  ref.q_pos = positions.data();
  ref.num_tokens = tokens;
  ref.block_tables = tables.data();
  ref.max_blocks_per_seq = max_blocks;
  ref.scale = 1.0f / std::sqrt(static_cast<float>(d));
  ref.sliding_window = tc.window;
  ref.softcap = tc.softcap;
  kernels::cpu::AttentionReference(ref);

  auto d_q = Upload(q, tc.dtype);
  auto d_k = tc.fp8 ? UploadRaw(k8) : Upload(k_cache, tc.dtype);
  auto d_v = tc.fp8 ? UploadRaw(v8) : Upload(v_cache, tc.dtype);
  auto d_seq = UploadRaw(token_seq), d_pos = UploadRaw(positions), d_tables = UploadRaw(tables);
  auto d_end = UploadRaw(seq_end), d_rows = UploadRaw(rows);
  auto d_tile_seq = UploadRaw(tile_seq), d_tile_token = UploadRaw(tile_token);
  auto d_out = Poisoned(tokens * q_dim, tc.dtype);
  kc::AttentionParams p;
  p.q = d_q.data();
  p.q_stride = q_stride;
  p.out = d_out.data();
  p.out_stride = q_dim;
  p.dtype = tc.dtype;
  p.k_cache = d_k.data();
  p.v_cache = d_v.data();
  p.kv_fp8 = tc.fp8;
  p.k_scale = p.v_scale = tc.kv_scale;
  p.block_size = block_size;
  p.num_heads = tc.heads;
  p.num_kv_heads = tc.kv_heads;
  p.head_dim = d;
  p.token_seq = static_cast<const int32_t*>(d_seq.data());
  p.positions = static_cast<const int32_t*>(d_pos.data());
  p.block_tables = static_cast<const int32_t*>(d_tables.data());
  p.max_blocks_per_seq = max_blocks;
  p.scale = ref.scale;
  p.sliding_window = tc.window;
  p.softcap = tc.softcap;
  p.row_tokens = static_cast<const int32_t*>(d_rows.data());
  p.num_rows = static_cast<int64_t>(rows.size());
  p.num_splits =
      tc.splits > 0
          ? tc.splits
          : kc::ChooseAttentionSplits(
                p.num_rows,
                kc::AttentionRowsCtas(p.num_rows, tc.dtype, d, tc.fp8, tc.heads, tc.kv_heads), 1003,
                132);
  auto split_out = Poisoned(p.num_rows * tc.heads * p.num_splits * d, DType::kF32);
  auto split_stats = Poisoned(p.num_rows * tc.heads * p.num_splits * 2, DType::kF32);
  p.split_out = static_cast<float*>(split_out.data());
  p.split_stats = static_cast<float*>(split_stats.data());
  p.tile_seq = static_cast<const int32_t*>(d_tile_seq.data());
  p.tile_token = static_cast<const int32_t*>(d_tile_token.data());
  p.seq_token_end = static_cast<const int32_t*>(d_end.data());
  p.num_tiles = static_cast<int64_t>(tile_seq.size());
  ASSERT_CUDA_OK(kc::AttentionRows(p, nullptr));
  ASSERT_CUDA_OK(kc::AttentionPrefill(p, nullptr));
  const auto got = Download(d_out, tokens * q_dim, tc.dtype);
  // The softmax weights go through bf16 in the prefill kernel's P·V product.
  const double tol = tc.dtype == DType::kF32 ? 2e-5 : Tolerance(tc.dtype);
  EXPECT_LE(RelError(got, RoundTo(tc.dtype, want)), tol);
  // Row by row, so that a wrong row is named.
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> g(got.begin() + t * q_dim, got.begin() + (t + 1) * q_dim);
    std::vector<float> w(want.begin() + t * q_dim, want.begin() + (t + 1) * q_dim);
    ASSERT_LE(RelError(g, RoundTo(tc.dtype, w)), 3 * tol) << "token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rows, AttentionTest,
    ::testing::Values(
        AttnCase{DType::kF32, 16, 4, 2}, AttnCase{DType::kF32, 24, 4, 2, 0, 0, 3},
        AttnCase{DType::kF32, 64, 9, 3, 0, 0, 0}, AttnCase{DType::kF32, 128, 8, 8, 24, 0, 2},
        AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 0}, AttnCase{DType::kBF16, 128, 28, 4, 0, 0, 5},
        AttnCase{DType::kBF16, 64, 16, 1, 100, 0, 4},
        AttnCase{DType::kBF16, 256, 8, 2, 0, 30.0f, 1}, AttnCase{DType::kBF16, 16, 4, 2, 0, 0, 7},
        AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 3, false, false, 1.0f, 32},
        AttnCase{DType::kBF16, 64, 12, 4, 37, 0, 0, false, false, 1.0f, 24},
        AttnCase{DType::kBF16, 128, 16, 2, 0, 0, 3}, AttnCase{DType::kBF16, 128, 12, 3, 60, 0, 2},
        // More splits than a cluster merges: the merge kernel.
        AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 12}, AttnCase{DType::kBF16, 64, 16, 4, 50, 0, 9}));

INSTANTIATE_TEST_SUITE_P(
    Prefill, AttentionTest,
    ::testing::Values(AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 0, true},
                      AttnCase{DType::kBF16, 128, 8, 8, 40, 0, 1, true},
                      AttnCase{DType::kBF16, 64, 12, 4, 0, 0, 2, true},
                      AttnCase{DType::kBF16, 64, 8, 2, 0, 20.0f, 1, true},
                      AttnCase{DType::kBF16, 128, 16, 2, 100, 0, 1, true},
                      AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 1, true, false, 1.0f, 32},
                      // Few rows, one KV head a CTA, merged in a cluster.
                      AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 8, true},
                      AttnCase{DType::kBF16, 64, 12, 3, 30, 0, 5, true},
                      // The prefill kernel packs the query heads of a KV head into its CTAs'
                      // rows: other group sizes, odd ones whose CTAs split a token's heads.
                      AttnCase{DType::kBF16, 128, 4, 2, 0, 0, 1, true},
                      AttnCase{DType::kBF16, 64, 16, 1, 0, 0, 1, true},
                      AttnCase{DType::kBF16, 128, 10, 2, 50, 0, 1, true},
                      AttnCase{DType::kBF16, 128, 4, 4, 0, 10.0f, 1, true},
                      AttnCase{DType::kBF16, 128, 8, 2, 0, 0, 1, true, false, 1.0f, 24}));

// The FP8 cache is widened exactly (to f16, whose Q and softmax weights are then f16 too), so the
// bf16 bounds hold against the dequantized reference.
INSTANTIATE_TEST_SUITE_P(
    Fp8, AttentionTest,
    ::testing::Values(AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 0, false, true, 1.0f},
                      AttnCase{DType::kBF16, 64, 16, 1, 100, 0, 4, false, true, 0.25f},
                      AttnCase{DType::kBF16, 128, 28, 4, 0, 30.0f, 1, false, true, 2.0f},
                      AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 0, true, true, 1.0f},
                      AttnCase{DType::kBF16, 64, 8, 2, 40, 20.0f, 1, true, true, 0.5f},
                      AttnCase{DType::kBF16, 128, 16, 2, 100, 0, 1, true, true, 3.0f},
                      AttnCase{DType::kBF16, 128, 32, 8, 37, 0, 3, false, true, 0.5f, 32},
                      AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 7, false, true, 1.5f, 16},
                      AttnCase{DType::kBF16, 64, 12, 4, 0, 0, 0, false, true, 1.0f, 24},
                      AttnCase{DType::kBF16, 128, 8, 8, 0, 0, 1, false, true, 1.0f, 32},
                      AttnCase{DType::kBF16, 128, 16, 2, 0, 0, 3, false, true, 1.0f, 16},
                      AttnCase{DType::kBF16, 128, 12, 3, 60, 0, 2, false, true, 0.75f, 16},
                      AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 1, true, true, 1.0f, 32},
                      AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 8, true, true, 0.5f},
                      AttnCase{DType::kBF16, 64, 10, 2, 0, 0, 1, true, true, 0.5f, 32},
                      AttnCase{DType::kBF16, 128, 24, 3, 70, 0, 1, true, true, 2.0f, 24},
                      AttnCase{DType::kBF16, 128, 32, 8, 0, 0, 10, false, true, 1.0f}));

}  // namespace
}  // namespace dinfer
