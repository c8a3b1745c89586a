// EngineCore end to end on tiny real models: batching, preemption under a tiny KV pool, aborts,
// failures that stay local, and deterministic, batch-invariant seeded sampling.
#include "engine/engine_core.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "model/loader.h"

namespace dinfer {
namespace {

LoadedModel Load(const std::string& arch) {
  auto lm = LoadModel(std::string(DINFER_SOURCE_DIR) + "/tests/data/models/" + arch,
                      LoadOptions{false, false});
  EXPECT_TRUE(lm.ok()) << lm.status().ToString();
  return std::move(lm).value();
}

std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = static_cast<int32_t>(rng() % 256);
  return p;
}

struct Job {
  int64_t id;
  std::vector<int32_t> prompt;
  RequestOptions options;
};

// Runs the jobs, submitting job i at step `arrivals[i]`; returns each request's tokens.
std::map<int64_t, std::vector<int32_t>> RunJobs(EngineCore& core, const std::vector<Job>& jobs,
                                                const std::vector<int>& arrivals,
                                                std::map<int64_t, FinishReason>* finish = nullptr) {
  std::map<int64_t, std::vector<int32_t>> out;
  size_t next = 0;
  for (int step = 0; next < jobs.size() || core.HasWork(); ++step) {
    while (next < jobs.size() && arrivals[next] <= step) {
      EXPECT_TRUE(core.AddRequest(jobs[next].id, jobs[next].prompt, jobs[next].options).ok());
      ++next;
    }
    for (const TokenDelta& d : core.Step()) {
      auto& v = out[d.request_id];
      v.insert(v.end(), d.tokens.begin(), d.tokens.end());
      if (finish != nullptr && d.finish != FinishReason::kNone) (*finish)[d.request_id] = d.finish;
    }
    const Status inv = core.kv().CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv.ToString();
    if (step > 100000) break;
  }
  return out;
}

RequestOptions Sampled(uint64_t seed, int64_t max_tokens) {
  RequestOptions o;
  o.sampling.temperature = 0.8;
  o.sampling.top_p = 0.9;
  o.sampling.seed = seed;
  o.has_seed = true;
  o.max_tokens = max_tokens;
  return o;
}

TEST(EngineCore, SeededRequestIsTheSameAloneOrInABatch) {
  LoadedModel lm = Load("qwen2");
  EngineConfig cfg;
  cfg.threads = 2;
  cfg.num_kv_blocks = 256;
  const Job probe{1, Prompt(37, 1), Sampled(1234, 20)};
  EngineCore alone(*lm.model, cfg);
  const auto ref = RunJobs(alone, {probe}, {0})[1];
  ASSERT_EQ(ref.size(), 20u);
  // The same request among others that arrive earlier and later, with chunked prefill.
  for (int64_t budget : {int64_t{16}, int64_t{2048}}) {
    EngineConfig c2 = cfg;
    c2.scheduler.max_num_batched_tokens = budget;
    EngineCore busy(*lm.model, c2);
    std::vector<Job> jobs;
    std::vector<int> arrivals;
    for (int i = 0; i < 6; ++i) {
      jobs.push_back({100 + i, Prompt(5 + 13 * i, 50 + i), Sampled(7 + i, 8 + 3 * i)});
      arrivals.push_back(i);
    }
    jobs.push_back(probe);
    arrivals.push_back(3);
    const auto outs = RunJobs(busy, jobs, arrivals);
    EXPECT_EQ(outs.at(1), ref) << "max_num_batched_tokens " << budget;
  }
}

TEST(EngineCore, TinyKvPoolPreemptsAndStillProducesTheSameTokens) {
  LoadedModel lm = Load("llama");
  EngineConfig big;
  big.threads = 2;
  big.num_kv_blocks = 512;
  big.block_size = 4;
  EngineConfig tiny = big;
  tiny.num_kv_blocks = 24;  // 92 tokens for 8 requests of up to 40 tokens each
  std::vector<Job> jobs;
  for (int i = 0; i < 8; ++i) {
    RequestOptions o;
    o.sampling.temperature = 0;
    o.max_tokens = 10 + i;
    jobs.push_back({i + 1, Prompt(12 + 2 * i, 300 + i), o});
  }
  const std::vector<int> arrivals(jobs.size(), 0);
  EngineCore roomy(*lm.model, big);
  const auto want = RunJobs(roomy, jobs, arrivals);
  EngineCore cramped(*lm.model, tiny);
  std::map<int64_t, FinishReason> finish;
  const auto got = RunJobs(cramped, jobs, arrivals, &finish);
  EXPECT_GT(cramped.Stats().preemptions, 0);
  for (const auto& j : jobs) {
    EXPECT_EQ(got.at(j.id), want.at(j.id)) << "request " << j.id;
    EXPECT_EQ(finish.at(j.id), FinishReason::kLength);
  }
  const auto kv = cramped.kv().Stats();
  EXPECT_EQ(kv.in_use, 0);
  EXPECT_EQ(kv.free + kv.cached, kv.total);
}

TEST(EngineCore, AbortAndBadRequestsFailAlone) {
  LoadedModel lm = Load("mistral");
  EngineConfig cfg;
  cfg.threads = 1;
  cfg.num_kv_blocks = 64;
  EngineCore core(*lm.model, cfg);
  RequestOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 30;
  ASSERT_TRUE(core.AddRequest(1, Prompt(20, 1), o).ok());
  ASSERT_TRUE(core.AddRequest(2, Prompt(20, 2), o).ok());
  EXPECT_EQ(core.AddRequest(3, {1, 2, 999}, o).code(), StatusCode::kInvalidArgument);
  RequestOptions huge = o;
  huge.max_tokens = 5000;
  EXPECT_FALSE(core.AddRequest(4, Prompt(10, 4), huge).ok());
  EXPECT_FALSE(core.AddRequest(1, Prompt(10, 5), o).ok());  // id in use
  std::map<int64_t, FinishReason> finish;
  std::map<int64_t, size_t> counts;
  for (int step = 0; core.HasWork() && step < 1000; ++step) {
    if (step == 5) core.Abort(1);
    for (const auto& d : core.Step()) {
      counts[d.request_id] += d.tokens.size();
      if (d.finish != FinishReason::kNone) finish[d.request_id] = d.finish;
    }
  }
  EXPECT_EQ(finish.at(1), FinishReason::kAborted);
  EXPECT_LT(counts[1], 30u);
  EXPECT_EQ(finish.at(2), FinishReason::kLength);
  EXPECT_EQ(counts[2], 30u);
  EXPECT_EQ(core.kv().Stats().in_use, 0);
}

TEST(EngineCore, StopTokenEndsTheRequest) {
  LoadedModel lm = Load("smollm2");
  EngineConfig cfg;
  cfg.threads = 1;
  cfg.num_kv_blocks = 64;
  RequestOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 16;
  EngineCore first(*lm.model, cfg);
  const auto free_run = RunJobs(first, {{1, Prompt(9, 3), o}}, {0})[1];
  ASSERT_EQ(free_run.size(), 16u);
  o.stop_token_ids = {free_run[4]};
  EngineCore second(*lm.model, cfg);
  std::map<int64_t, FinishReason> finish;
  const auto stopped = RunJobs(second, {{1, Prompt(9, 3), o}}, {0}, &finish)[1];
  const auto first_stop = std::find(free_run.begin(), free_run.end(), free_run[4]);
  EXPECT_EQ(stopped, std::vector<int32_t>(free_run.begin(), first_stop + 1));
  EXPECT_EQ(finish.at(1), FinishReason::kStop);
}

}  // namespace
}  // namespace dinfer

namespace dinfer {
namespace {

// Asynchronous scheduling (plan N+1 and post-process N-1 while N computes) and the synchronous
// mode give identical outputs, finish reasons and token counts on a mixed load: chunked
// prefill, seeded sampling, greedy, stop tokens, a tiny KV pool that forces preemption,
// requests arriving over time.
TEST(EngineCore, AsyncAndSyncSchedulingGiveIdenticalOutputs) {
  LoadedModel lm = Load("qwen3");
  std::vector<Job> jobs;
  std::vector<int> arrivals;
  for (int i = 0; i < 10; ++i) {
    RequestOptions o = i % 2 == 0 ? Sampled(40 + i, 6 + 2 * i) : RequestOptions{};
    if (i % 2 == 1) {
      o.sampling.temperature = 0;
      o.max_tokens = 5 + i;
    }
    if (i % 3 == 0) o.stop_token_ids = {static_cast<int32_t>(i * 17 % 256)};
    jobs.push_back({i + 1, Prompt(6 + 5 * i, 900 + i), o});
    arrivals.push_back(i / 2);
  }
  std::map<int64_t, std::vector<int32_t>> outs[2];
  std::map<int64_t, FinishReason> finish[2];
  int64_t preemptions[2];
  for (int async = 0; async < 2; ++async) {
    EngineConfig cfg;
    cfg.threads = 2;
    cfg.block_size = 4;
    cfg.num_kv_blocks = 40;
    cfg.scheduler.max_num_batched_tokens = 24;
    cfg.async_scheduling = async == 1;
    EngineCore core(*lm.model, cfg);
    outs[async] = RunJobs(core, jobs, arrivals, &finish[async]);
    preemptions[async] = core.Stats().preemptions;
    EXPECT_EQ(core.kv().Stats().in_use, 0);
  }
  EXPECT_GT(preemptions[0] + preemptions[1], 0);
  for (const auto& j : jobs) {
    EXPECT_EQ(outs[1].at(j.id), outs[0].at(j.id)) << "request " << j.id;
    EXPECT_EQ(finish[1].at(j.id), finish[0].at(j.id)) << "request " << j.id;
  }
}

}  // namespace
}  // namespace dinfer
