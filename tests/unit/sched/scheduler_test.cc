// The scheduler step by step: each table row is one Schedule() (and the step completing), with
// the chunks it must plan and the state of every request and of the KV cache after it.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace dinfer::sched {
namespace {

std::vector<int32_t> Tokens(int n, int32_t start = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

SchedRequest Req(RequestId id, int prompt, int max_new, int priority = 0, int32_t start = 100) {
  SchedRequest r;
  r.id = id;
  r.tokens = Tokens(prompt, start);
  r.max_new_tokens = max_new;
  r.priority = priority;
  return r;
}

struct Expect {
  // (id, start_pos, num_tokens, sample) per planned chunk, in order.
  std::vector<std::tuple<RequestId, int64_t, int64_t, bool>> chunks;
  std::vector<RequestId> preempted = {};
  int64_t running = -1, waiting = -1;
};

class Harness {
 public:
  Harness(int64_t num_blocks, int64_t block_size, SchedulerConfig cfg = {})
      : kv_(kv::KvCacheSpec{num_blocks, block_size, 0, true}), sched_(cfg, kv_) {}
  Harness(const kv::KvCacheSpec& spec, SchedulerConfig cfg) : kv_(spec), sched_(cfg, kv_) {}

  // Runs one step: checks the plan against `e`, then completes it, sampling token 7 for every
  // chunk that samples.
  void Step(const Expect& e, int line) {
    SCOPED_TRACE("table row at line " + std::to_string(line));
    StepPlan plan = sched_.Schedule();
    ASSERT_EQ(plan.chunks.size(), e.chunks.size());
    for (size_t i = 0; i < e.chunks.size(); ++i) {
      const auto& [id, start, n, sample] = e.chunks[i];
      EXPECT_EQ(plan.chunks[i].id, id) << "chunk " << i;
      EXPECT_EQ(plan.chunks[i].start_pos, start) << "chunk " << i;
      EXPECT_EQ(plan.chunks[i].num_tokens, n) << "chunk " << i;
      EXPECT_EQ(plan.chunks[i].sample, sample) << "chunk " << i;
    }
    EXPECT_EQ(plan.preempted, e.preempted);
    std::vector<int32_t> sampled;
    for (const auto& c : plan.chunks) {
      if (c.sample) sampled.push_back(7);
    }
    sched_.ResolveSamples(plan, sampled);
    sched_.OnStepDone(plan);
    if (e.running >= 0) EXPECT_EQ(sched_.num_running(), e.running);
    if (e.waiting >= 0) EXPECT_EQ(sched_.num_waiting(), e.waiting);
    const Status inv = kv_.CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv.ToString();
  }

  kv::KvCacheManager kv_;
  Scheduler sched_;
};

#define STEP(h, ...) (h).Step(Expect __VA_ARGS__, __LINE__)

TEST(Scheduler, ChunkedPrefillThenDecodeByTokenCounts) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 8;
  Harness h(32, 4, cfg);
  ASSERT_TRUE(h.sched_.Add(Req(1, 10, 3)).ok());
  ASSERT_TRUE(h.sched_.Add(Req(2, 3, 2)).ok());
  STEP(h, {{{1, 0, 8, false}}, {}, 1, 1});                   // budget 8: first chunk of 1
  STEP(h, {{{1, 8, 2, true}, {2, 0, 3, true}}, {}, 2, 0});   // rest of 1, all of 2
  STEP(h, {{{1, 10, 1, true}, {2, 3, 1, true}}, {}, 1, 0});  // decodes; 2 reaches max_new 2
  STEP(h, {{{1, 11, 1, true}}, {}, 0, 0});                   // 1 reaches max_new 3
  EXPECT_FALSE(h.sched_.HasWork());
  EXPECT_EQ(h.kv_.Stats().in_use, 0);
}

TEST(Scheduler, MaxNumSeqsLimitsAdmission) {
  SchedulerConfig cfg;
  cfg.max_num_seqs = 2;
  Harness h(64, 4, cfg);
  for (RequestId id = 1; id <= 3; ++id) ASSERT_TRUE(h.sched_.Add(Req(id, 4, 2, 0, 100 * id)).ok());
  STEP(h, {{{1, 0, 4, true}, {2, 0, 4, true}}, {}, 2, 1});
  STEP(h, {{{1, 4, 1, true}, {2, 4, 1, true}}, {}, 0, 1});
  STEP(h, {{{3, 0, 4, true}}, {}, 1, 0});
}

TEST(Scheduler, PriorityOrdersAdmission) {
  SchedulerConfig cfg;
  cfg.max_num_seqs = 1;
  Harness h(64, 4, cfg);
  ASSERT_TRUE(h.sched_.Add(Req(1, 4, 1, /*priority=*/5)).ok());
  ASSERT_TRUE(h.sched_.Add(Req(2, 4, 1, /*priority=*/0, 300)).ok());
  STEP(h, {{{2, 0, 4, true}}, {}, 0, 1});
  STEP(h, {{{1, 0, 4, true}}, {}, 0, 0});
}

TEST(Scheduler, PreemptsLowestPriorityWhenBlocksRunOut) {
  // 5 allocatable blocks of 4 tokens. Two requests of 8-token prompts take 2 blocks each; when
  // both need a third block and only one is left, the later (lower priority) one is preempted.
  Harness h(6, 4);
  ASSERT_TRUE(h.sched_.Add(Req(1, 8, 8)).ok());
  ASSERT_TRUE(h.sched_.Add(Req(2, 8, 8, 0, 500)).ok());
  STEP(h, {{{1, 0, 8, true}, {2, 0, 8, true}}, {}, 2, 0});  // 4 blocks in use
  STEP(h, {{{1, 8, 1, true}}, {2}, 1, 1});  // 1 takes the 5th block; 2 cannot grow: preempted
  EXPECT_EQ(h.sched_.Find(2)->num_preemptions, 1);
  EXPECT_EQ(h.sched_.Find(2)->num_computed_tokens, 0);
  STEP(h, {{{1, 9, 1, true}}, {}, 1, 1});
  STEP(h, {{{1, 10, 1, true}}, {}, 1, 1});
  STEP(h, {{{1, 11, 1, true}}, {}, 1, 1});
  // 1 needs a 4th block: none is free, so one of 2's cached blocks is evicted; 2 still waits.
  STEP(h, {{{1, 12, 1, true}}, {}, 1, 1});
}

TEST(Scheduler, RequestThatCanNeverFitIsRejected) {
  Harness h(4, 4);  // 3 blocks = 12 tokens
  const Status s = h.sched_.Add(Req(1, 10, 8));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("KV blocks"), std::string::npos);
  EXPECT_TRUE(h.sched_.Add(Req(2, 4, 4)).ok());
  STEP(h, {{{2, 0, 4, true}}, {}, 1, 0});
}

TEST(Scheduler, RequestThatCannotContinueAloneFailsInsteadOfPreemptingItselfForever) {
  // A sliding window of 4 tokens in blocks of 4 and 2 allocatable blocks: the admission check
  // passes (a window group needs only the blocks the window reads) and the first 8-token chunk
  // fits, but the next 8 tokens need 3 blocks (the one holding positions 5-7, which their window
  // reads, and two new ones). Alone in the cache, the request fails with an error; re-admitted it
  // would come back to this step and preempt itself again, forever.
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 8;
  Harness h(kv::KvCacheSpec{3, 4, 4, true}, cfg);
  ASSERT_TRUE(h.sched_.Add(Req(1, 16, 2)).ok());
  ASSERT_TRUE(h.sched_.Add(Req(2, 4, 2, 1, 900)).ok());
  STEP(h, {{{1, 0, 8, false}}, {}, 1, 1});
  StepPlan plan = h.sched_.Schedule();
  EXPECT_TRUE(plan.chunks.empty());
  EXPECT_EQ(plan.failed, std::vector<RequestId>{1});
  const SchedRequest* r = h.sched_.Find(1);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->state, RequestState::kFinished);
  EXPECT_NE(r->error.find("cannot continue"), std::string::npos) << r->error;
  h.sched_.OnStepDone(plan);
  // The other request still runs.
  STEP(h, {{{2, 0, 4, true}}, {}, 1, 0});
  EXPECT_TRUE(h.kv_.CheckInvariants().ok());
}

TEST(Scheduler, PrefixCacheSkipsCachedBlocks) {
  Harness h(32, 4);
  ASSERT_TRUE(h.sched_.Add(Req(1, 10, 1)).ok());
  STEP(h, {{{1, 0, 10, true}}, {}, 0, 0});        // finished: its 2 full blocks stay cached
  ASSERT_TRUE(h.sched_.Add(Req(2, 10, 1)).ok());  // same prompt
  STEP(h, {{{2, 8, 2, true}}, {}, 0, 0});
  EXPECT_EQ(h.kv_.Stats().prefix_hits, 8);
}

// SWA bounded replay: a window group (window 8, blocks of 4, 6 blocks) next to a compressed one
// (rate 2, blocks of 8), and a replay bound of 10 tokens. Request 2 shares request 1's first 40
// tokens, whose window blocks request 3 evicted: it hits 40 tokens, computes from 28, and its
// chunks say which positions replay; the one that crosses the hit computes the rest normally.
TEST(Scheduler, ReplayHitComputesFromTheReplayStart) {
  kv::KvCacheSpec spec{7, 4, 8, true, {{21, 8, 0, 2}}};
  spec.replay_tokens = 10;
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 8;
  Harness h(spec, cfg);
  auto run = [&](RequestId id) {
    while (h.sched_.HasWork()) {
      StepPlan plan = h.sched_.Schedule();
      for (const ScheduledChunk& c : plan.chunks) EXPECT_EQ(c.replay_end, 0);
      std::vector<int32_t> sampled;
      for (const auto& c : plan.chunks) {
        if (c.sample) sampled.push_back(7);
      }
      h.sched_.ResolveSamples(plan, sampled);
      h.sched_.OnStepDone(plan);
    }
    EXPECT_EQ(h.sched_.Find(id)->state, RequestState::kFinished);
  };
  ASSERT_TRUE(h.sched_.Add(Req(1, 44, 1)).ok());
  run(1);
  ASSERT_TRUE(h.sched_.Add(Req(3, 44, 1, 0, 900)).ok());
  run(3);
  ASSERT_EQ(h.kv_.GroupStats(1).cached, 10);  // 5 blocks of each prompt
  SchedRequest second = Req(2, 40, 1);
  for (int32_t t : Tokens(4, 500)) second.tokens.push_back(t);
  ASSERT_TRUE(h.sched_.Add(std::move(second)).ok());
  StepPlan plan = h.sched_.Schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start_pos, 28);  // 40 - 10, in whole window blocks
  EXPECT_EQ(plan.chunks[0].num_tokens, 8);
  EXPECT_EQ(plan.chunks[0].replay_end, 40);
  EXPECT_FALSE(plan.chunks[0].sample);
  EXPECT_EQ(h.sched_.Find(2)->num_cached_tokens, 40);
  EXPECT_EQ(h.kv_.NumCachedTokens(2) - h.kv_.ReplayStart(2), 12);
  h.sched_.OnStepDone(plan);
  plan = h.sched_.Schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start_pos, 36);
  EXPECT_EQ(plan.chunks[0].num_tokens, 8);
  EXPECT_EQ(plan.chunks[0].replay_end, 40);  // positions 36..39 replay, 40..43 do not
  EXPECT_TRUE(plan.chunks[0].sample);
  h.sched_.ResolveSamples(plan, std::vector<int32_t>{7});
  h.sched_.OnStepDone(plan);
  EXPECT_EQ(h.sched_.Find(2)->state, RequestState::kFinished);
  EXPECT_EQ(h.kv_.Stats().prefix_hits, 40);
  EXPECT_EQ(h.kv_.Stats().prefix_replayed, 12);
  EXPECT_TRUE(h.kv_.CheckInvariants().ok());
}

TEST(Scheduler, AbortFreesEverything) {
  Harness h(32, 4);
  ASSERT_TRUE(h.sched_.Add(Req(1, 10, 5)).ok());
  ASSERT_TRUE(h.sched_.Add(Req(2, 6, 5, 0, 400)).ok());
  STEP(h, {{{1, 0, 10, true}, {2, 0, 6, true}}, {}, 2, 0});
  h.sched_.Finish(1, FinishReason::kAborted);
  h.sched_.Finish(2, FinishReason::kAborted);
  EXPECT_FALSE(h.sched_.HasWork());
  EXPECT_EQ(h.kv_.Stats().in_use, 0);
  EXPECT_TRUE(h.kv_.CheckInvariants().ok());
}

TEST(Scheduler, TimeBudgetCutsPromptChunks) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 1024;
  cfg.step_time_budget_s = 0.01005;
  cfg.min_chunk_tokens = 4;
  Harness h(256, 16, cfg);
  // 1 ms fixed + 0.1 ms per token: 90 tokens fit in 10.05 ms.
  h.sched_.SetCostModel(CostModel({1e-3, 1e-4, 0.0, 0.0}));
  ASSERT_TRUE(h.sched_.Add(Req(1, 200, 1)).ok());
  STEP(h, {{{1, 0, 90, false}}, {}, 1, 0});
  STEP(h, {{{1, 90, 90, false}}, {}, 1, 0});
  STEP(h, {{{1, 180, 20, true}}, {}, 0, 0});
}

TEST(Scheduler, RandomLoadNeverDeadlocksAndKeepsInvariants) {
  std::mt19937 rng(11);
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 64;
  cfg.max_num_seqs = 8;
  kv::KvCacheManager kv(kv::KvCacheSpec{20, 4, 0, true});
  Scheduler sched(cfg, kv);
  RequestId next = 1;
  int finished = 0, steps = 0;
  std::vector<RequestId> live;
  while (finished < 200 && steps < 20000) {
    if (next <= 200 && rng() % 2 == 0) {
      SchedRequest r = Req(next, 1 + static_cast<int>(rng() % 30), 1 + static_cast<int>(rng() % 20),
                           static_cast<int>(rng() % 3), static_cast<int32_t>(rng() % 5) * 1000);
      if (sched.Add(r).ok())
        live.push_back(next);
      else
        ++finished;  // too large for the pool: rejected alone
      ++next;
    }
    if (!live.empty() && rng() % 50 == 0) {  // abort a random live request
      const size_t i = rng() % live.size();
      sched.Finish(live[i], FinishReason::kAborted);
      sched.Release(live[i]);
      live.erase(live.begin() + static_cast<int64_t>(i));
      ++finished;
    }
    StepPlan plan = sched.Schedule();
    ++steps;
    std::vector<int32_t> sampled;
    for (const auto& c : plan.chunks) {
      if (c.sample) sampled.push_back(static_cast<int32_t>(rng() % 50));
    }
    sched.ResolveSamples(plan, sampled);
    sched.OnStepDone(plan);
    ASSERT_TRUE(kv.CheckInvariants().ok()) << kv.CheckInvariants().ToString();
    for (size_t i = 0; i < live.size();) {
      const SchedRequest* r = sched.Find(live[i]);
      if (r->state == RequestState::kFinished) {
        sched.Release(live[i]);
        live.erase(live.begin() + static_cast<int64_t>(i));
        ++finished;
      } else {
        ++i;
      }
    }
    if (next > 200 && live.empty()) break;
  }
  EXPECT_TRUE(live.empty()) << "requests left after " << steps << " steps";
  EXPECT_EQ(kv.Stats().in_use, 0);
}

TEST(CostModel, FitsAQuadratic) {
  std::vector<StepSample> samples;
  for (double q : {1.0, 16.0, 64.0, 256.0, 512.0}) {
    for (double c : {0.0, 256.0, 1024.0}) {
      samples.push_back({q, c, 2e-3 + 5e-5 * q + 1e-8 * q * c + 2e-8 * q * q});
    }
  }
  auto m = CostModel::Fit(samples);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  for (const auto& s : samples) EXPECT_NEAR(m->Predict(s.q, s.c), s.seconds, 1e-3 * s.seconds);
  EXPECT_EQ(m->MaxTokens(m->Marginal(100.5, 0.0), 0.0, 1000), 100);
  EXPECT_EQ(m->MaxTokens(1.0, 0.0, 64), 64);
}

}  // namespace
}  // namespace dinfer::sched

namespace dinfer::sched {
namespace {

// Speculative decoding: a draft rides along a chunk that reaches the last token (KV for it too), is
// dropped when the request may not generate it, and the verified outcome sets tokens and computed
// count.
TEST(SchedulerDraftTest, DraftsRideAlongDecodesAndResolveSetsTheOutcome) {
  kv::KvCacheManager kv(kv::KvCacheSpec{16, 4, 0, true});
  Scheduler sched(SchedulerConfig{}, kv);
  SchedRequest r;
  r.id = 1;
  r.tokens = {10, 11, 12, 13, 14};
  r.max_new_tokens = 4;
  ASSERT_TRUE(sched.Add(r).ok());
  StepPlan plan = sched.Schedule();  // the prompt
  ASSERT_EQ(plan.chunks.size(), 1u);
  const std::vector<int32_t> first = {20};
  sched.ResolveSamples(plan, first);
  sched.OnStepDone(plan);
  sched.SetDraft(1, {21});

  plan = sched.Schedule();  // 20 at 5, draft 21 at 6
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start_pos, 5);
  EXPECT_EQ(plan.chunks[0].num_tokens, 1);
  EXPECT_EQ(plan.chunks[0].draft, std::vector<int32_t>{21});
  EXPECT_EQ(plan.num_tokens, 2);
  EXPECT_EQ(kv.BlockTable(1).size(), 2u);  // 7 tokens in blocks of 4
  // Accepted: 21 then 22; 20 and 21 computed.
  const std::vector<int32_t> accepted = {21};
  sched.ResolveSamples(plan, accepted);
  const std::vector<int32_t> extra = {22};
  sched.ResolveDraft(plan.chunks[0], extra, 7);
  sched.OnStepDone(plan);
  const SchedRequest* s = sched.Find(1);
  EXPECT_EQ(s->tokens, (std::vector<int32_t>{10, 11, 12, 13, 14, 20, 21, 22}));
  EXPECT_EQ(s->num_computed_tokens, 7);
  EXPECT_TRUE(kv.CheckInvariants().ok());

  // Three generated, one allowed: the draft is dropped.
  sched.SetDraft(1, {23});
  plan = sched.Schedule();
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_TRUE(plan.chunks[0].draft.empty());
  EXPECT_EQ(plan.num_tokens, 1);
}

TEST(SchedulerDraftTest, RejectionRollsTheComputedCountBack) {
  kv::KvCacheManager kv(kv::KvCacheSpec{16, 4, 0, true});
  Scheduler sched(SchedulerConfig{}, kv);
  SchedRequest r;
  r.id = 1;
  r.tokens = {10, 11, 12, 13, 14};
  r.max_new_tokens = 8;
  ASSERT_TRUE(sched.Add(r).ok());
  StepPlan plan = sched.Schedule();
  const std::vector<int32_t> first = {20};
  sched.ResolveSamples(plan, first);
  sched.OnStepDone(plan);
  sched.SetDraft(1, {21});
  plan = sched.Schedule();
  ASSERT_EQ(plan.chunks[0].draft.size(), 1u);
  // Rejected: the target gave 30 at 6; the caller recomputes from the block start (4).
  const std::vector<int32_t> rejected = {30};
  sched.ResolveSamples(plan, rejected);
  sched.ResolveDraft(plan.chunks[0], {}, 4);
  sched.OnStepDone(plan);
  const SchedRequest* s = sched.Find(1);
  EXPECT_EQ(s->tokens, (std::vector<int32_t>{10, 11, 12, 13, 14, 20, 30}));
  EXPECT_EQ(s->num_computed_tokens, 4);
  sched.SetDraft(1, {31});
  plan = sched.Schedule();  // 14, 20, 30 again, and the new draft after them
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start_pos, 4);
  EXPECT_EQ(plan.chunks[0].num_tokens, 3);
  EXPECT_TRUE(plan.chunks[0].sample);
  EXPECT_EQ(plan.chunks[0].draft, std::vector<int32_t>{31});
  EXPECT_EQ(plan.num_tokens, 4);
  EXPECT_TRUE(kv.CheckInvariants().ok());
}

}  // namespace
}  // namespace dinfer::sched
