// Scheduler: decides each step which requests run and with how many tokens. Scheduling is by
// token counts only — a prompt chunk, one decode token, or a draft to verify are the same thing
// with different counts. Memory admission (does the request's KV fit in the cache?) is separate
// from the per-step token budget, which comes from a token cap and, optionally, a time budget
// solved from a fitted cost model. Running requests go first (decodes always run), then waiting
// ones by priority and arrival. When KV blocks run out, the lowest-priority running request is
// preempted (its KV dropped, recomputed later). A request that can never fit fails alone. A
// prefix hit that rebuilds its sliding-window KV by bounded replay computes from the replay start,
// budgeted like prompt tokens; its chunks say where the replay ends (ScheduledChunk::replay_end).
// No tensors, no devices: single-threaded, called by the engine's step loop.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/cost_model.h"
#include "sched/request.h"

namespace dinfer::sched {

struct SchedulerConfig {
  int64_t max_num_seqs = 64;              // running requests at most
  int64_t max_num_batched_tokens = 2048;  // tokens per step at most (capped at 32,768)
  int64_t max_model_len = 4096;           // prompt + output tokens of one request at most
  // Time budget per step in seconds (0: off). With a cost model, prompt chunks are cut so the
  // step's predicted time fits; decodes always run.
  double step_time_budget_s = 0.0;
  int64_t min_chunk_tokens = 16;  // never cut a prompt chunk below this (progress)
};

struct ScheduledChunk {
  RequestId id = 0;
  int64_t start_pos = 0;  // position of the first token of the chunk
  int64_t num_tokens = 0;
  bool sample = false;  // the chunk ends at the request's last known token: sample next
  // Bounded replay (KvCacheSpec::replay_tokens): the chunk's positions below replay_end rebuild
  // sliding-window KV for a prefix hit of replay_end tokens; they produce no logits and write
  // no rows of the other KV groups (those are the hit's shared cached blocks). 0: none.
  int64_t replay_end = 0;
  // Draft tokens computed after the chunk's tokens (at start_pos + num_tokens, ...) to be verified:
  // not counted in num_tokens nor in the request's computed tokens until ResolveDraft.
  std::vector<int32_t> draft;
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<RequestId> preempted;  // dropped back to waiting this step
  std::vector<RequestId> failed;     // finished with an error this step (see request's error)
  int64_t num_tokens = 0;
  double predicted_time_s = 0.0;  // by the cost model, 0 without one
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv);

  void SetCostModel(std::optional<CostModel> model) { cost_model_ = std::move(model); }

  // Adds a request in the waiting queue; fails if its id is taken or its sizes are invalid.
  Status Add(SchedRequest request);
  // Plans the next step and commits its KV allocations.
  StepPlan Schedule();
  // Schedule() appends a placeholder token for every chunk that samples, so the next step can be
  // planned before this one finishes. Once a step ran, ResolveSamples writes its sampled tokens
  // (one per sampling chunk, in plan order) over those placeholders, and OnStepDone publishes
  // the computed blocks in the prefix cache, releases blocks a sliding window left behind, and
  // finishes requests that reached max_new_tokens.
  void ResolveSamples(const StepPlan& plan, std::span<const int32_t> sampled);
  void OnStepDone(const StepPlan& plan);
  // Speculative decoding. SetDraft proposes tokens to follow the request's last token; the next
  // step computes them after it (in a chunk that reaches the last token, of a request that may
  // generate them all; else they are dropped). Once that step ran and ResolveSamples wrote its
  // first token, ResolveDraft appends the `extra` tokens the verification emitted after it and sets
  // the computed count to `num_computed` (at most the accepted tokens: rejected drafts' KV is
  // overwritten later).
  void SetDraft(RequestId id, std::vector<int32_t> draft);
  void ResolveDraft(const ScheduledChunk& chunk, std::span<const int32_t> extra,
                    int64_t num_computed);
  // Ends a request (stop condition, abort, error): frees its blocks.
  void Finish(RequestId id, FinishReason reason, std::string error = {});

  const SchedRequest* Find(RequestId id) const;
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  // Finished requests are kept until Release so the engine can read their state.
  void Release(RequestId id);

 private:
  bool Before(const SchedRequest& a, const SchedRequest& b) const;
  void Preempt(RequestId id, StepPlan& plan);
  int64_t ChunkLimit(int64_t budget, int64_t context, const StepPlan& plan) const;
  void Fail(SchedRequest& r, std::string error, StepPlan& plan);

  SchedulerConfig config_;
  kv::KvCacheManager& kv_;
  std::optional<CostModel> cost_model_;
  std::map<RequestId, SchedRequest> requests_;
  std::vector<RequestId> running_;  // in priority order
  std::vector<RequestId> waiting_;  // in priority order
  int64_t next_arrival_ = 0;
};

}  // namespace dinfer::sched
