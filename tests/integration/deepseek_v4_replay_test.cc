// SWA bounded replay on the tiny random DeepSeek-V4 (5 layers and the MTP layer, a 16-token
// window, compression rates 4 and 8): a prompt whose compressed blocks are cached but whose window
// blocks were evicted hits anyway, and the request recomputes the bounded stretch before the hit
// to rebuild the window. Its logits and greedy tokens must be those of a run that computes the
// whole prompt; the reference is dinfer itself without the prefix cache (prompts longer than the
// transformers fixture).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "engine/engine_core.h"
#include "model/loader.h"
#include "row_error.h"
#include "runner/model_runner.h"

namespace dinfer {
namespace {

constexpr double kRelTol = 1e-4;  // f32 KV cache: only summation order differs

std::string Dir() { return std::string(DINFER_SOURCE_DIR) + "/tests/data/models/deepseek_v4"; }

std::vector<int32_t> RandomTokens(uint32_t seed, int64_t n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(2, 255);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& t : out) t = token(rng);
  return out;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The bound of DeepseekV4Model::WindowReplayTokens for the fixture: 6 KV layers (5 and the MTP
// layer) of window 16 give 6 * 15 = 90 tokens; the compressors need less (layer 4, rate 8, no
// overlap: 8 + 4 * 15 = 68).
TEST(DeepseekV4ReplayTest, ReplayBound) {
  auto lm = LoadModel(Dir(), LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  ASSERT_TRUE(lm->model->has_draft_layer());
  EXPECT_EQ(lm->model->WindowReplayTokens(), 90);
}

// The KV manager and the runner: request 1 computes P + A, whose window blocks of P's end are
// evicted by the time request 2 (P + B) comes; it hits P's compressed blocks (T = |P|) and replays
// from S = T - 90 rounded down to a block. Every logit row from T on matches a full computation of
// P + B; a replay shorter than the bound does not. Cases: T a multiple of the rate-8 entries
// (blocks of 16) and T in the middle of one (blocks of 4, T = 164), with chunks that cross T.
TEST(DeepseekV4ReplayTest, ReplayedPrefixGivesTheLogitsOfAFullComputation) {
  auto lm = LoadModel(Dir(), LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  Model& model = *lm->model;
  const int64_t vocab = lm->config.vocab_size;
  struct Case {
    int64_t block_size, prefix, chunk, replay_tokens;
    bool exact;
  };
  const int64_t bound = model.WindowReplayTokens();
  for (const Case c : {Case{16, 160, 24, bound, true}, Case{4, 164, 29, bound, true},
                       Case{4, 164, 29, 30, false}}) {
    SCOPED_TRACE(
        fmt::format("block size {} prefix {} replay {}", c.block_size, c.prefix, c.replay_tokens));
    const std::vector<KvGroup> groups = model.KvGroupsFor(c.block_size);
    ASSERT_EQ(groups.size(), 3u);
    const std::vector<int32_t> p = RandomTokens(1, c.prefix);
    const std::vector<int32_t> first = Concat(p, RandomTokens(2, 100));
    const std::vector<int32_t> second = Concat(p, RandomTokens(3, 40));
    const int64_t window_blocks = 96 / c.block_size + 1;  // 96 tokens of window blocks
    kv::KvCacheSpec spec;
    spec.num_blocks = window_blocks;
    spec.block_size = c.block_size;
    spec.sliding_window = groups[0].sliding_window;
    spec.replay_tokens = c.replay_tokens;
    std::vector<int64_t> num_blocks = {window_blocks};
    for (size_t g = 1; g < groups.size(); ++g) {
      const int64_t n = 800 / groups[g].block_size + 1;
      spec.extra_groups.push_back({n, groups[g].block_size, 0, groups[g].entry_rate});
      num_blocks.push_back(n);
    }
    RunnerOptions ro;
    ro.block_size = c.block_size;
    ro.threads = 2;
    ro.group_num_blocks = num_blocks;
    ro.kv_cache_dtype = KvCacheDType::kF32;
    kv::KvCacheManager kv(spec);
    ModelRunner runner(model, ro);
    kv::KvCacheSpec uncached_spec = spec;
    uncached_spec.enable_prefix_caching = false;
    kv::KvCacheManager uncached(uncached_spec);
    ModelRunner reference(model, ro);
    // Computes `tokens` [start, end) in chunks as the scheduler would; returns the logit rows
    // (one per position from max(start, replay_end) on).
    auto compute = [&](kv::KvCacheManager& kv, ModelRunner& runner, kv::RequestId id,
                       const std::vector<int32_t>& tokens, int64_t start,
                       int64_t replay_end) -> StatusOr<std::vector<float>> {
      std::vector<float> rows;
      const int64_t end = static_cast<int64_t>(tokens.size());
      for (int64_t pos = start; pos < end;) {
        const int64_t to = std::min(end, pos + c.chunk);
        if (!kv.Allocate(id, to)) return Internal("out of KV blocks at {}", to);
        std::vector<std::vector<int32_t>> tables;
        for (int64_t g = 0; g < kv.num_groups(); ++g) {
          const auto t = kv.BlockTable(id, g);
          tables.emplace_back(t.begin(), t.end());
        }
        const std::vector<std::span<const int32_t>> others(tables.begin() + 1, tables.end());
        SeqChunk chunk{
            std::span(tokens).subspan(static_cast<size_t>(pos), static_cast<size_t>(to - pos)), pos,
            tables[0], SeqChunk::Logits::kAll, others};
        chunk.replay_end = replay_end;
        DINFER_ASSIGN_OR_RETURN(TensorView logits, runner.Execute(std::span(&chunk, 1)));
        // No logits for replayed positions.
        if (logits.rows() != to - std::clamp(replay_end, pos, to)) {
          return Internal("{} logit rows for positions [{}, {})", logits.rows(), pos, to);
        }
        rows.insert(rows.end(), logits.as<float>(), logits.as<float>() + logits.rows() * vocab);
        kv.CommitComputed(id, tokens, to);
        kv.ReleaseOutsideWindow(id, to);
        DINFER_RETURN_IF_ERROR(kv.CheckInvariants());
        pos = to;
      }
      return rows;
    };
    // The reference: P + B from scratch, without the prefix cache.
    auto want = compute(uncached, reference, 3, second, 0, 0);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    // Request 1 runs P + A: P's compressed blocks are cached, its window blocks evicted by A's.
    ASSERT_TRUE(kv.Allocate(1, 1, first, 0, 0));
    ASSERT_TRUE(compute(kv, runner, 1, first, 0, 0).ok());
    kv.Free(1);
    const kv::PrefixHit hit = kv.Match(second, 0);
    const int64_t t = c.prefix / c.block_size * c.block_size;
    const int64_t s = std::max<int64_t>(0, t - c.replay_tokens) / c.block_size * c.block_size;
    ASSERT_EQ(hit, (kv::PrefixHit{t, s}));
    ASSERT_TRUE(kv.Allocate(2, s + 1, second, 0, hit.num_cached_tokens));
    ASSERT_EQ(kv.ReplayStart(2), s);
    auto got = compute(kv, runner, 2, second, s, t);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const int64_t n = static_cast<int64_t>(second.size());
    ASSERT_EQ(static_cast<int64_t>(got->size()), (n - t) * vocab);
    double worst = 0;
    for (int64_t r = 0; r < n - t; ++r) {
      const double err =
          RowRelError(got->data() + r * vocab, want->data() + (t + r) * vocab, vocab);
      worst = std::max(worst, err);
      if (c.exact) EXPECT_LE(err, kRelTol) << "position " << t + r;
    }
    if (!c.exact) EXPECT_GT(worst, 100 * kRelTol) << "a replay shorter than the bound";
    kv.Free(2);
    EXPECT_TRUE(kv.CheckInvariants().ok());
  }
}

// Through the engine (scheduler, chunked prefill across the hit, stats): the second request's
// greedy tokens equal those of an engine without the prefix cache, and it computes fewer prompt
// tokens than its prompt holds.
TEST(DeepseekV4ReplayTest, EngineGreedyTokensWithReplayMatchNoCache) {
  auto lm = LoadModel(Dir(), LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  // The FP8 KV cache too: replay reads its cached entries, which are the bytes a fresh run writes.
  for (const auto& [block_size, kv_dtype] :
       {std::pair{16, KvCacheDType::kF32}, std::pair{4, KvCacheDType::kF32},
        std::pair{16, KvCacheDType::kFp8}}) {
    SCOPED_TRACE(fmt::format("block size {}{}", block_size,
                             kv_dtype == KvCacheDType::kFp8 ? ", FP8 KV" : ""));
    const std::vector<int32_t> p = RandomTokens(7, 164);
    // Long enough that its window blocks cycle through the window group and evict those of p.
    const std::vector<int32_t> first = Concat(p, RandomTokens(8, 400));
    const std::vector<int32_t> second = Concat(p, RandomTokens(9, 30));
    RequestOptions greedy;
    greedy.sampling.temperature = 0.0;
    greedy.max_tokens = 12;
    greedy.ignore_eos = true;
    auto run = [&](EngineCore& core, int64_t id, const std::vector<int32_t>& prompt) {
      EXPECT_TRUE(core.AddRequest(id, prompt, greedy).ok());
      std::vector<int32_t> tokens;
      int steps = 0;
      while (core.HasWork()) {
        if (++steps > 5000) {
          ADD_FAILURE() << "request " << id << " makes no progress";
          break;
        }
        for (const TokenDelta& d : core.Step()) {
          tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
        }
        EXPECT_TRUE(core.kv().CheckInvariants().ok());
      }
      return tokens;
    };
    EngineConfig cfg;
    cfg.threads = 2;
    cfg.block_size = block_size;
    cfg.kv_cache_dtype = kv_dtype;
    cfg.kv_cache_bytes = 64ll << 20;
    cfg.scheduler.max_num_seqs = 2;
    cfg.scheduler.max_num_batched_tokens = 32;
    EngineConfig no_cache = cfg;
    no_cache.enable_prefix_caching = false;
    EngineCore fresh(*lm->model, no_cache);
    const std::vector<int32_t> want = run(fresh, 1, second);
    ASSERT_EQ(want.size(), 12u);

    EngineCore core(*lm->model, cfg);
    run(core, 1, first);
    const int64_t before = core.Stats().prompt_tokens;
    EXPECT_EQ(run(core, 2, second), want);
    const int64_t computed = core.Stats().prompt_tokens - before;
    const auto kv = core.Stats().kv;
    const int64_t t = 164 / block_size * block_size;
    const int64_t s = (t - 90) / block_size * block_size;
    EXPECT_EQ(kv.prefix_hits, t);
    EXPECT_EQ(kv.prefix_replayed, t - s);
    EXPECT_EQ(computed, static_cast<int64_t>(second.size()) - s);
    EXPECT_LT(computed, static_cast<int64_t>(second.size()));

    // A shorter replay (DeepInfer-style, below the exact bound): fewer tokens recomputed; the
    // output is an approximation, so only its length is checked.
    EngineConfig shorter = cfg;
    shorter.swa_replay_tokens = 40;
    EngineCore core_short(*lm->model, shorter);
    run(core_short, 1, first);
    EXPECT_EQ(run(core_short, 2, second).size(), 12u);
    const int64_t s_short = (t - 40) / block_size * block_size;
    EXPECT_EQ(core_short.Stats().kv.prefix_hits, t);
    EXPECT_EQ(core_short.Stats().kv.prefix_replayed, t - s_short);
  }
}

}  // namespace
}  // namespace dinfer

namespace dinfer {
namespace {

// The window groups' share of the KV memory holds what one step needs even when the next step is
// planned while it runs (asynchronous scheduling keeps the running step's blocks): a single
// sequence with small blocks and full chunks finishes instead of preempting itself forever.
TEST(DeepseekV4ReplayTest, OneSequenceWithSmallBlocksFinishes) {
  auto lm = LoadModel(Dir(), LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  for (const bool async : {true, false}) {
    SCOPED_TRACE(fmt::format("async {}", async));
    EngineConfig cfg;
    cfg.threads = 2;
    cfg.block_size = 4;
    cfg.kv_cache_dtype = KvCacheDType::kF32;
    cfg.kv_cache_bytes = 64ll << 20;
    cfg.async_scheduling = async;
    cfg.scheduler.max_num_seqs = 1;
    cfg.scheduler.max_num_batched_tokens = 32;
    EngineCore core(*lm->model, cfg);
    RequestOptions greedy;
    greedy.sampling.temperature = 0.0;
    greedy.max_tokens = 8;
    greedy.ignore_eos = true;
    ASSERT_TRUE(core.AddRequest(1, RandomTokens(3, 150), greedy).ok());
    size_t tokens = 0;
    for (int steps = 0; core.HasWork(); ++steps) {
      ASSERT_LT(steps, 200) << "no progress";
      for (const TokenDelta& d : core.Step()) tokens += d.tokens.size();
    }
    EXPECT_EQ(tokens, 8u);
    EXPECT_EQ(core.Stats().preemptions, 0);
  }
}

}  // namespace
}  // namespace dinfer
