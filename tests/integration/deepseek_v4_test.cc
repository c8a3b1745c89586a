// Tiny random-weight DeepSeek-V4 models (float32, bfloat16, and FP8 / FP4 as V4-Flash ships them)
// in the published checkpoint layout: dinfer's logits against HF transformers' (float32) over a
// 64-token prompt and 16 greedy decode steps, and the MTP layer's logits against DeepSeek's MTP
// block built from transformers' modules. The layers mix sliding-window, compressed sparse and
// heavily compressed attention, hash-routed and score-routed MoE; compression rates 4 and 8 and a
// 16-token window all matter over 80 tokens. Logits are compared with an f32 KV cache, and with
// the bf16 one V4 uses by default (a looser bound, below); the engine tests run the default.
// Fixtures: scripts/fixtures/make_deepseek_v4_fixture.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <boost/json.hpp>

#include "base/mapped_file.h"
#include "dinfer/engine.h"
#include "engine/cost_profile.h"
#include "engine/engine_core.h"
#include "model/loader.h"
#include "row_error.h"
#include "runner/model_runner.h"

namespace dinfer {
namespace {

// With an f32 KV cache, as for the dense architectures: float32 throughout, only summation order
// differs.
constexpr double kRelTol = 1e-4;
// With the bf16 KV cache DeepSeek-V4 uses by default, every window key, compressed entry and
// indexer key is rounded to bf16 (8 significant bits: relative error up to 2^-9 each) and the
// errors pass through every later layer; the rows' errors are then about 2^-8 (median 0.004 with
// the f32 and bf16 fixtures, 0.008 with the FP8 one). A few rows move much more (up to 0.14, and
// 0.48 in the FP8 fixture): a discrete choice near a tie (top-k routing or selection) can flip in
// these tiny random models. So the bound is on the median row error, 4 * 2^-8: it passes rounding
// and catches a wrong row or slot, which moves every row by O(1).
constexpr double kBf16KvMedianRelTol = 4.0 / 256;
// With the FP8 KV cache (--kv-cache-dtype fp8: e4m3 rows, a power-of-two scale per 32) each
// stored value carries up to 2^-4 relative error (3 mantissa bits) instead of bf16's 2^-9, and
// these tiny random models pass it on as they pass bf16's: the median row error is 0.08-0.13 in
// the four fixtures (20-30 times bf16's). The bound, 2^-2, passes that and still catches a wrong
// row or slot, which moves every row by O(1).
constexpr double kFp8KvMedianRelTol = 0.25;

struct Fixture {
  std::vector<int32_t> prompt, decode;
  int64_t chunk_split = 0;
  std::string logits, mtp_logits;
};

std::vector<int32_t> Ints(const boost::json::value& v) {
  std::vector<int32_t> out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<int32_t>(x.to_number<int64_t>()));
  return out;
}

std::string Dir(const std::string& variant) {
  return std::string(DINFER_SOURCE_DIR) + "/tests/data/models/" + variant;
}

Fixture ReadFixture(const std::string& dir) {
  Fixture f;
  auto text = ReadFileToString(dir + "/fixture.json");
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  const auto o = boost::json::parse(*text).as_object();
  f.prompt = Ints(o.at("prompt_ids"));
  f.decode = Ints(o.at("decode_ids"));
  f.chunk_split = o.at("chunk_split").to_number<int64_t>();
  f.logits = ReadFileToString(dir + "/logits.f32").value();
  f.mtp_logits = ReadFileToString(dir + "/mtp_logits.f32").value();
  return f;
}

struct Case {
  std::string variant;
  int64_t block_size;
  bool chunked;  // prefill in two chunks, the first ending inside a window
  KvCacheDType kv = KvCacheDType::kF32;
};

std::string CaseName(const Case& c) {
  return c.variant + "_block" + std::to_string(c.block_size) + (c.chunked ? "_chunked" : "") +
         (c.kv == KvCacheDType::kBF16  ? "_bf16kv"
          : c.kv == KvCacheDType::kFp8 ? "_fp8kv"
                                       : "");
}
std::string Name(const ::testing::TestParamInfo<Case>& info) { return CaseName(info.param); }
void PrintTo(const Case& c, std::ostream* os) { *os << CaseName(c); }

class DeepseekV4Test : public ::testing::TestWithParam<Case> {};

TEST_P(DeepseekV4Test, MatchesTransformers) {
  const Case& c = GetParam();
  const std::string dir = Dir(c.variant);
  const Fixture f = ReadFixture(dir);
  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  ASSERT_TRUE(lm->model->has_draft_layer());
  const int64_t vocab = lm->config.vocab_size;
  const auto* ref = reinterpret_cast<const float*>(f.logits.data());
  const auto* mtp_ref = reinterpret_cast<const float*>(f.mtp_logits.data());
  const size_t total = f.prompt.size() + f.decode.size();
  ASSERT_EQ(f.logits.size(), total * vocab * sizeof(float));
  ASSERT_EQ(f.mtp_logits.size(), (total - 1) * vocab * sizeof(float));

  // The blocks in scrambled order, so that the paged layout is exercised.
  RunnerOptions ro;
  ro.block_size = c.block_size;
  ro.num_blocks = (static_cast<int64_t>(total) + c.block_size - 1) / c.block_size + 1;
  ro.threads = 2;
  ro.kv_cache_dtype = c.kv;
  ModelRunner runner(*lm->model, ro);
  const bool bf16_kv = c.kv == KvCacheDType::kBF16 || c.kv == KvCacheDType::kFp8;
  std::vector<double> errors;
  std::vector<int32_t> table(static_cast<size_t>(ro.num_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());

  // The token after each position, for the MTP rows.
  std::vector<int32_t> all = f.prompt;
  all.insert(all.end(), f.decode.begin(), f.decode.end());
  double worst = 0, worst_mtp = 0;
  auto check = [&](const TensorView& got, const float* want, size_t rows, const std::string& what,
                   double* w) {
    ASSERT_EQ(got.rows(), static_cast<int64_t>(rows));
    for (size_t r = 0; r < rows; ++r) {
      const double e = RowRelError(got.as<float>() + r * vocab, want + r * vocab, vocab);
      *w = std::max(*w, e);
      errors.push_back(e);
      if (!bf16_kv) EXPECT_LE(e, kRelTol) << what << " row " << r;
    }
  };

  const std::vector<int64_t> cuts =
      c.chunked ? std::vector<int64_t>{0, f.chunk_split, static_cast<int64_t>(f.prompt.size())}
                : std::vector<int64_t>{0, static_cast<int64_t>(f.prompt.size())};
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const auto begin = f.prompt.begin() + cuts[i], end = f.prompt.begin() + cuts[i + 1];
    const std::vector<int32_t> chunk(begin, end);
    SeqChunk prefill{chunk, cuts[i], table, SeqChunk::Logits::kAll};
    auto logits = runner.Execute(std::span(&prefill, 1));
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    check(*logits, ref + cuts[i] * vocab, chunk.size(), "prompt chunk " + std::to_string(i),
          &worst);
    const std::vector<int32_t> next(all.begin() + cuts[i] + 1, all.begin() + cuts[i + 1] + 1);
    SeqChunk draft{next, cuts[i], table, SeqChunk::Logits::kAll};
    auto mtp = runner.ExecuteDraft(std::span(&draft, 1));
    ASSERT_TRUE(mtp.ok()) << mtp.status().ToString();
    check(*mtp, mtp_ref + cuts[i] * vocab, chunk.size(), "MTP prompt chunk " + std::to_string(i),
          &worst_mtp);
  }
  int64_t pos = static_cast<int64_t>(f.prompt.size());
  for (size_t i = 0; i < f.decode.size(); ++i, ++pos) {
    SeqChunk step{std::span(&f.decode[i], 1), pos, table, SeqChunk::Logits::kLast};
    auto l = runner.Execute(std::span(&step, 1));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    check(*l, ref + pos * vocab, 1, "decode step " + std::to_string(i), &worst);
    if (i + 1 == f.decode.size()) break;
    SeqChunk draft{std::span(&f.decode[i + 1], 1), pos, table, SeqChunk::Logits::kLast};
    auto mtp = runner.ExecuteDraft(std::span(&draft, 1));
    ASSERT_TRUE(mtp.ok()) << mtp.status().ToString();
    check(*mtp, mtp_ref + pos * vocab, 1, "MTP decode step " + std::to_string(i), &worst_mtp);
  }
  std::sort(errors.begin(), errors.end());
  const double median = errors[errors.size() / 2];
  if (c.kv == KvCacheDType::kBF16) EXPECT_LE(median, kBf16KvMedianRelTol);
  if (c.kv == KvCacheDType::kFp8) EXPECT_LE(median, kFp8KvMedianRelTol);
  std::printf(
      "%s: worst relative logit error %.3g (main, %zu rows), %.3g (MTP, %zu rows), median %.3g\n",
      CaseName(c).c_str(), worst, total, worst_mtp, total - 1, median);
}

INSTANTIATE_TEST_SUITE_P(Variants, DeepseekV4Test,
                         ::testing::Values(Case{"deepseek_v4", 16, false},
                                           Case{"deepseek_v4", 4, true},
                                           Case{"deepseek_v4_bf16", 16, false},
                                           Case{"deepseek_v4_fp8", 16, true},
                                           Case{"deepseek_v4", 16, false, KvCacheDType::kBF16},
                                           Case{"deepseek_v4", 4, true, KvCacheDType::kBF16},
                                           Case{"deepseek_v4_bf16", 16, false, KvCacheDType::kBF16},
                                           Case{"deepseek_v4_fp8", 16, true, KvCacheDType::kBF16},
                                           Case{"deepseek_v4", 16, false, KvCacheDType::kFp8},
                                           Case{"deepseek_v4", 4, true, KvCacheDType::kFp8},
                                           Case{"deepseek_v4_bf16", 16, false, KvCacheDType::kFp8},
                                           Case{"deepseek_v4_fp8", 16, true, KvCacheDType::kFp8}),
                         Name);

// Two sequences in one batch (one mid-prompt, one from the start) agree with the reference rows.
TEST(DeepseekV4BatchTest, SequencesInOneBatchMatchTransformers) {
  const std::string dir = Dir("deepseek_v4");
  const Fixture f = ReadFixture(dir);
  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  const int64_t vocab = lm->config.vocab_size;
  const auto* ref = reinterpret_cast<const float*>(f.logits.data());
  RunnerOptions ro;
  ro.block_size = 8;
  ro.num_blocks = 24;
  ro.threads = 2;
  ro.kv_cache_dtype = KvCacheDType::kF32;
  ModelRunner runner(*lm->model, ro);
  std::vector<int32_t> a(8), b(8);
  for (int32_t i = 0; i < 8; ++i) {
    a[i] = 2 * i;
    b[i] = 2 * i + 1;
  }
  const int64_t split = f.chunk_split, n = static_cast<int64_t>(f.prompt.size());
  const std::vector<int32_t> head(f.prompt.begin(), f.prompt.begin() + split);
  SeqChunk first{head, 0, a, SeqChunk::Logits::kNone};
  ASSERT_TRUE(runner.Execute(std::span(&first, 1)).ok());
  const std::vector<int32_t> tail(f.prompt.begin() + split, f.prompt.end());
  const SeqChunk batch[] = {{tail, split, a, SeqChunk::Logits::kAll},
                            {f.prompt, 0, b, SeqChunk::Logits::kAll}};
  auto logits = runner.Execute(batch);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  ASSERT_EQ(logits->rows(), (n - split) + n);
  for (int64_t r = 0; r < n - split; ++r) {
    EXPECT_LE(RowRelError(logits->as<float>() + r * vocab, ref + (split + r) * vocab, vocab),
              kRelTol)
        << "first sequence row " << split + r;
  }
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_LE(RowRelError(logits->as<float>() + (n - split + r) * vocab, ref + r * vocab, vocab),
              kRelTol)
        << "second sequence row " << r;
  }
}

// The same model as transformers' save_pretrained writes it (its config keys and tensor names, no
// MTP layer) gives the same logits.
TEST(DeepseekV4SavedTest, CheckpointSavedByTransformersMatches) {
  const Fixture f = ReadFixture(Dir("deepseek_v4"));
  auto lm = LoadModel(Dir("deepseek_v4_hf"), LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  EXPECT_FALSE(lm->model->has_draft_layer());
  const int64_t vocab = lm->config.vocab_size;
  const auto* ref = reinterpret_cast<const float*>(f.logits.data());
  RunnerOptions ro;
  ro.block_size = 16;
  ro.num_blocks = 6;
  ro.threads = 2;
  ro.kv_cache_dtype = KvCacheDType::kF32;
  ModelRunner runner(*lm->model, ro);
  const std::vector<int32_t> table = {5, 3, 1, 0, 2, 4};
  SeqChunk prefill{f.prompt, 0, table, SeqChunk::Logits::kAll};
  auto logits = runner.Execute(std::span(&prefill, 1));
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  for (size_t r = 0; r < f.prompt.size(); ++r) {
    EXPECT_LE(RowRelError(logits->as<float>() + r * vocab, ref + r * vocab, vocab), kRelTol) << r;
  }
  int64_t pos = static_cast<int64_t>(f.prompt.size());
  for (size_t i = 0; i < f.decode.size(); ++i, ++pos) {
    SeqChunk step{std::span(&f.decode[i], 1), pos, table, SeqChunk::Logits::kLast};
    auto l = runner.Execute(std::span(&step, 1));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_LE(RowRelError(l->as<float>(), ref + pos * vocab, vocab), kRelTol) << "decode " << i;
  }
}

// Through the engine: greedy decoding gives transformers' tokens with chunked prefill (chunks that
// end inside compression windows), and again for a second request whose prompt comes mostly from
// the prefix cache, which continues from the compressor state kept in the cached blocks.
TEST(DeepseekV4EngineTest, GreedyTokensWithChunkedPrefillAndPrefixCache) {
  const std::string dir = Dir("deepseek_v4");
  const Fixture f = ReadFixture(dir);
  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  EngineConfig cfg;
  cfg.threads = 2;
  cfg.num_kv_blocks = 32;
  cfg.scheduler.max_num_batched_tokens = 27;
  EngineCore core(*lm->model, cfg);
  RequestOptions greedy;
  greedy.sampling.temperature = 0.0;
  greedy.max_tokens = static_cast<int64_t>(f.decode.size());
  greedy.ignore_eos = true;
  for (int64_t id : {1, 2}) {
    ASSERT_TRUE(core.AddRequest(id, f.prompt, greedy).ok());
    std::vector<int32_t> tokens;
    while (core.HasWork()) {
      for (const TokenDelta& d : core.Step()) {
        tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
      }
    }
    EXPECT_EQ(tokens, f.decode) << "request " << id;
  }
  // 48 of the second request's 64 prompt tokens came from the cache (whole blocks, one token left).
  EXPECT_EQ(core.Stats().kv.prefix_hits, 48);
}

// The KV groups: the window keys and compressor states, then one group per compression rate
// (4 and 8 in the fixture), each paged with its own blocks.
TEST(DeepseekV4EngineTest, KvGroups) {
  auto lm = LoadModel(Dir("deepseek_v4"), LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  const std::vector<KvGroup> groups = lm->model->KvGroupsFor(4);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].name, "window");
  EXPECT_EQ(groups[0].sliding_window, lm->config.sliding_window);
  EXPECT_EQ(groups[1].name, "compressed/4");
  EXPECT_EQ(groups[1].block_size, 4);
  EXPECT_EQ(groups[2].name, "compressed/8");
  EXPECT_EQ(groups[2].block_size, 8);  // one entry per block
  EXPECT_EQ(groups[2].entry_rate, 8);
}

// Several requests at once in a cache too small for all of them: requests are preempted and
// recomputed (partly from the prefix cache), and each still gives transformers' tokens. The
// window group's blocks stay bounded by the window while the compressed groups grow with the
// sequences.
TEST(DeepseekV4EngineTest, GreedyTokensWithPreemptionAndBoundedWindowBlocks) {
  const std::string dir = Dir("deepseek_v4");
  const Fixture f = ReadFixture(dir);
  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  for (int variant = 0; variant < 4; ++variant) {
    const bool async = variant % 2 == 0, caching = variant < 2;
    SCOPED_TRACE(fmt::format("async {} prefix caching {}", async, caching));
    EngineConfig cfg;
    cfg.threads = 2;
    cfg.block_size = 4;
    // Every group holds 120 tokens (96 with the prefix cache, where the requests share the
    // prompt's 64): one request (80 tokens) fits, all three do not.
    cfg.num_kv_blocks = caching ? 25 : 31;
    cfg.enable_prefix_caching = caching;
    cfg.async_scheduling = async;
    cfg.scheduler.max_num_batched_tokens = 19;
    EngineCore core(*lm->model, cfg);
    ASSERT_EQ(core.kv().num_groups(), 3);
    RequestOptions greedy;
    greedy.sampling.temperature = 0.0;
    greedy.max_tokens = static_cast<int64_t>(f.decode.size());
    greedy.ignore_eos = true;
    std::map<int64_t, std::vector<int32_t>> tokens;
    for (int64_t id : {1, 2, 3}) ASSERT_TRUE(core.AddRequest(id, f.prompt, greedy).ok());
    int64_t most_window = 0;
    while (core.HasWork()) {
      for (const TokenDelta& d : core.Step()) {
        tokens[d.request_id].insert(tokens[d.request_id].end(), d.tokens.begin(), d.tokens.end());
      }
      ASSERT_TRUE(core.kv().CheckInvariants().ok());
      most_window = std::max(most_window, core.kv().GroupStats(0).in_use);
    }
    for (int64_t id : {1, 2, 3}) EXPECT_EQ(tokens[id], f.decode) << "request " << id;
    EXPECT_GT(core.Stats().preemptions, 0);
    if (caching) {
      EXPECT_GT(core.Stats().kv.prefix_hits, 0);
    }
    // Per running request at most window + a chunk + a block either side: far below the 20 blocks
    // of 4 tokens an 80-token sequence would hold without release.
    EXPECT_LE(most_window, 3 * ((16 + 19) / 4 + 3));
  }
}

// The KV manager and the runner together, with a window group too small to keep the prompt's
// early window blocks cached: a second request with the same prompt still hits 60 of its 64
// tokens (the compressed groups' blocks from the start, the window group's only for positions
// the window still reads, plus the compressor state in its last block) and its logits are
// transformers'.
TEST(DeepseekV4EngineTest, PrefixHitNeedsOnlyTheWindowsBlocks) {
  const std::string dir = Dir("deepseek_v4");
  const Fixture f = ReadFixture(dir);
  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  const int64_t vocab = lm->config.vocab_size, bs = 4;
  const std::vector<KvGroup> groups = lm->model->KvGroupsFor(bs);
  ASSERT_EQ(groups.size(), 3u);
  kv::KvCacheSpec spec;
  spec.num_blocks = 12;  // 11 window blocks: 44 of the prompt's 64 tokens
  spec.block_size = bs;
  spec.sliding_window = groups[0].sliding_window;
  for (size_t g = 1; g < groups.size(); ++g) {
    spec.extra_groups.push_back({40, groups[g].block_size, 0, groups[g].entry_rate});
  }
  kv::KvCacheManager kv(spec);
  RunnerOptions ro;
  ro.block_size = bs;
  ro.threads = 2;
  ro.group_num_blocks = {12, 40, 40};
  ro.kv_cache_dtype = KvCacheDType::kF32;
  ModelRunner runner(*lm->model, ro);
  const int64_t n = static_cast<int64_t>(f.prompt.size());
  // Computes the prompt from `start` in chunks of 8, as the scheduler would; returns the last
  // chunk's logits (every row).
  auto compute = [&](kv::RequestId id, int64_t start) -> StatusOr<TensorView> {
    StatusOr<TensorView> logits = Internal("nothing computed");
    for (int64_t pos = start; pos < n;) {
      const int64_t end = std::min(n, pos + 8);
      if (!kv.Allocate(id, end)) return Internal("out of KV blocks at {}", end);
      std::vector<std::vector<int32_t>> tables;
      for (int64_t g = 0; g < kv.num_groups(); ++g) {
        const auto t = kv.BlockTable(id, g);
        tables.emplace_back(t.begin(), t.end());
      }
      const std::vector<std::span<const int32_t>> others(tables.begin() + 1, tables.end());
      const std::span<const int32_t> tokens(f.prompt.data() + pos, static_cast<size_t>(end - pos));
      const SeqChunk chunk{tokens, pos, tables[0], SeqChunk::Logits::kAll, others};
      logits = runner.Execute(std::span(&chunk, 1));
      DINFER_RETURN_IF_ERROR(logits.status());
      kv.CommitComputed(id, f.prompt, end);
      kv.ReleaseOutsideWindow(id, end);
      DINFER_RETURN_IF_ERROR(kv.CheckInvariants());
      pos = end;
    }
    return logits;
  };
  ASSERT_TRUE(kv.Allocate(1, 8, f.prompt, 0, 0));
  ASSERT_TRUE(compute(1, 0).ok());
  kv.Free(1);
  // The first window blocks were evicted to make room for the later ones.
  EXPECT_EQ(kv.GroupStats(0).cached, 11);
  const int64_t hit = kv.Match(f.prompt, 0).num_cached_tokens;
  EXPECT_EQ(hit, 60);
  ASSERT_TRUE(kv.Allocate(2, hit + 1, f.prompt, 0, hit));
  ASSERT_EQ(kv.NumCachedTokens(2), hit);
  EXPECT_EQ(kv.BlockTable(2, 0)[0], kv::kNullBlock);
  auto logits = compute(2, hit);
  ASSERT_TRUE(logits.ok()) << logits.status().ToString();
  ASSERT_EQ(logits->rows(), n - hit);
  const auto* ref = reinterpret_cast<const float*>(f.logits.data());
  for (int64_t r = 0; r < n - hit; ++r) {
    EXPECT_LE(RowRelError(logits->as<float>() + r * vocab, ref + (hit + r) * vocab, vocab), kRelTol)
        << "row " << hit + r;
  }
}

// The step-cost profile runs V4 over every KV group's blocks (groups of different sizes).
TEST(DeepseekV4EngineTest, CostProfileUsesEveryGroup) {
  auto lm = LoadModel(Dir("deepseek_v4"), LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  RunnerOptions ro;
  ro.block_size = 4;
  ro.threads = 2;
  ro.group_num_blocks = {40, 20, 10};  // 160 tokens of window keys, 80 of each compressed group
  ModelRunner runner(*lm->model, ro);
  ProfileOptions po;
  po.new_tokens = {1, 8};
  po.context = {0, 64, 80};
  po.repetitions = 1;
  auto samples = MeasureSteps(runner, po);
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  EXPECT_EQ(samples->size(), 4u);  // nothing past 80 tokens fits
}

// A long generation: the window group's blocks in use stay constant while the sequence grows.
TEST(DeepseekV4EngineTest, WindowBlocksAreReleasedAsASequenceGrows) {
  const std::string dir = Dir("deepseek_v4");
  const Fixture f = ReadFixture(dir);
  auto lm = LoadModel(dir, LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  EngineConfig cfg;
  cfg.threads = 2;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 64;
  cfg.enable_prefix_caching = false;
  EngineCore core(*lm->model, cfg);
  RequestOptions opt;
  opt.sampling.temperature = 0.0;
  opt.max_tokens = 120;
  opt.ignore_eos = true;
  ASSERT_TRUE(core.AddRequest(1, f.prompt, opt).ok());
  int64_t most_window = 0, most_compressed = 0;
  while (core.HasWork()) {
    core.Step();
    // While decoding (the prompt's step holds its whole chunk).
    if (core.Stats().generated_tokens > 1) {
      most_window = std::max(most_window, core.kv().GroupStats(0).in_use);
    }
    most_compressed = std::max(most_compressed, core.kv().GroupStats(1).in_use);
  }
  // Window 16 in blocks of 4: 5 blocks hold positions n - 15 .. n, one more for the step in
  // flight; the rate-4 group keeps an entry per 4 tokens of the 183 computed, one per block.
  EXPECT_LE(most_window, 6);
  EXPECT_GE(most_compressed, 183 / 4);
}

// The engine's kv_cache_dtype option: auto, f32, bf16 and fp8 for V4; bf16 and fp8 refused for a
// dense model on the CPU, which keeps K and V in f32 there; an unknown name refused.
TEST(DeepseekV4EngineTest, KvCacheDTypeOption) {
  auto create = [](const std::string& variant, const std::string& dtype) {
    EngineOptions o;
    o.model = Dir(variant);
    o.threads = 1;
    o.kv_cache_mib = 16;
    o.show_progress = false;
    o.device = "cpu";
    o.kv_cache_dtype = dtype;
    return Engine::Create(o).status();
  };
  for (const char* dtype : {"auto", "f32", "bf16", "fp8"}) {
    EXPECT_TRUE(create("deepseek_v4", dtype).ok()) << dtype;
  }
  EXPECT_TRUE(create("llama", "f32").ok());
  const Status dense_bf16 = create("llama", "bf16");
  EXPECT_EQ(dense_bf16.code(), StatusCode::kInvalidArgument) << dense_bf16.ToString();
  const Status dense_fp8 = create("llama", "fp8");  // the CUDA runner's, for dense models
  EXPECT_EQ(dense_fp8.code(), StatusCode::kInvalidArgument) << dense_fp8.ToString();
  EXPECT_EQ(create("deepseek_v4", "f16").code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dinfer
