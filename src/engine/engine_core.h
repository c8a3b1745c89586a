// EngineCore: the step loop. Each Step() asks the scheduler for a plan (which requests, how many
// tokens), runs it as one batched forward pass, samples the requests that reached their last
// known token, feeds the tokens back, checks stop conditions and reports token deltas. A request
// that fails (bad input, cannot fit) fails alone; the others keep running.
// Asynchronous scheduling: the forward pass and sampling of step N run on an executor thread
// while the caller's Step() plans step N+1 (with placeholders for the tokens step N samples) and
// post-processes step N-1. Steps execute in order, so a block freed or reused by a later plan is
// never read by an earlier step after it is rewritten, and in-flight steps only write positions
// past the committed (prefix-cached) blocks.
// Not thread-safe: one thread drives it (the Engine's loop, or a caller such as the benchmark).
#pragma once

#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "runner/model_runner.h"
#include "sample/sampler.h"
#include "sched/draft_policy.h"
#include "sched/scheduler.h"
#include "structured/matcher.h"

namespace dinfer {

struct EngineConfig {
  sched::SchedulerConfig scheduler;
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;  // 0: from kv_cache_bytes
  int64_t kv_cache_bytes = 512ll << 20;
  bool enable_prefix_caching = true;
  // Tokens SWA bounded replay recomputes (0: Model::WindowReplayTokens, the exact bound).
  int64_t swa_replay_tokens = 0;
  int threads = 0;  // CPU threads (0: all cores)
  bool f32_activations = false;
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;  // KV storage (RunnerOptions)
  // With scheduler.step_time_budget_s > 0 the step cost model is loaded from this file if it
  // exists, else measured at start-up (and saved here when a path is given).
  std::string cost_profile;
  // Plan step N+1 and post-process step N-1 while step N computes (on by default). The
  // synchronous mode runs the three one after the other; both give the same outputs.
  bool async_scheduling = true;
  // Where the forward pass runs (ModelRunner).
  Device device = Device::kCpu;
  DType cuda_dtype = DType::kBF16;
  float kv_scale = 1.0f;          // RunnerOptions::kv_scale (CUDA, kv_cache_dtype fp8)
  bool cuda_fp8_weights = false;  // RunnerOptions::cuda_fp8_weights
  // On CUDA: masks, penalties and sampling run on the device and only tokens (and logprobs)
  // come back (ModelRunner::ExecuteAndSample); false copies logits to the host and samples there.
  bool device_sampling = true;
  // Speculative decoding with the model's draft (MTP) layer: draft tokens per decode step (0: off,
  // 1: the MTP layer's one). CheckSpeculation says whether the model and options allow it; the
  // step loop then runs synchronously.
  int num_speculative_tokens = 0;
  // Which drafts are proposed (by the draft layer's confidence and the request's recent
  // acceptance); the defaults propose every one.
  sched::DraftPolicyConfig draft_policy;
};

struct RequestOptions {
  sample::SamplingParams sampling;  // seed: see has_seed
  bool has_seed = false;            // without a seed, one is drawn per request
  int64_t max_tokens = 128;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int priority = 0;
  uint64_t cache_salt = 0;
  int64_t follows = 0;  // n > 1: a sibling request whose prompt blocks this one reuses
  // Structured output: every sampled token must be allowed by this grammar (null: none).
  std::shared_ptr<const structured::CompiledGrammar> grammar;
};

enum class FinishReason { kNone, kStop, kLength, kAborted, kError };
std::string_view FinishReasonName(FinishReason r);

struct TokenDelta {
  int64_t request_id = 0;
  std::vector<int32_t> tokens;  // new tokens since the last delta
  // With RequestOptions::sampling.logprobs >= 0: one entry per token of `tokens`.
  std::vector<sample::SampleResult> logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string error;  // when finish == kError
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t running = 0, waiting = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t draft_tokens = 0, accepted_draft_tokens = 0;  // speculative decoding: verified drafts
  // Drafts the draft layer proposed that DraftPolicy withheld: below min_confidence, or of a
  // request paused for low acceptance.
  int64_t low_confidence_drafts = 0, paused_drafts = 0;
  int64_t computed_tokens = 0;  // tokens of every step's forward pass, drafts included
  kv::KvCacheStats kv;
};

class EngineCore {
 public:
  // A config that CheckSpeculation refuses runs without speculation (and logs why).
  EngineCore(Model& model, const EngineConfig& config);
  // Whether config.num_speculative_tokens can be served with this model: it needs a draft layer
  // (which proposes one token per step); the draft policy's knobs must be in
  // range (with or without speculation).
  static Status CheckSpeculation(const Model& model, const EngineConfig& config);

  Status AddRequest(int64_t id, std::vector<int32_t> prompt, const RequestOptions& options);
  // Aborts a waiting or running request; its delta (kAborted) comes with the next Step().
  void Abort(int64_t id);
  bool HasWork() const {
    return scheduler_.HasWork() || !pending_.empty() || inflight_.has_value();
  }
  ~EngineCore();
  // Runs one step and returns what changed. A failing forward pass fails the step's requests.
  std::vector<TokenDelta> Step();

  EngineStats Stats() const;
  const kv::KvCacheManager& kv() const { return kv_; }
  ModelRunner& runner() { return runner_; }

 private:
  struct Live {
    RequestOptions options;
    std::shared_ptr<sample::Sampler> sampler;      // shared with an in-flight step
    std::shared_ptr<structured::Matcher> matcher;  // with a grammar; shared like the sampler
    bool grammar_done = false;  // the matcher is terminated: nothing but a stop could follow
    std::string grammar_error;  // the matcher refused a sampled token
    size_t reported = 0;        // generated tokens already reported
    std::vector<sample::SampleResult> logprobs;  // of generated tokens not yet reported
    // Gets draft tokens: no grammar (its masks for the rows after a draft are not made) and no
    // per-token logprobs (not reported for the drafts' successors).
    bool speculate = false;
    sched::DraftPolicy::State drafting;  // its acceptance average and probe count
  };
  // What one step computes, copied out of the scheduler so that it can plan the next one.
  struct StepJob {
    std::vector<std::vector<int32_t>> tokens, tables;
    // Per chunk, the spans of its KV groups 1, 2, ... tables (in `tables`).
    std::vector<std::vector<std::span<const int32_t>>> group_tables;
    std::vector<SeqChunk> chunks;
    std::vector<std::shared_ptr<sample::Sampler>> samplers;      // one per sampling chunk
    std::vector<std::shared_ptr<structured::Matcher>> matchers;  // per sampling chunk, or null
    std::vector<int64_t> remaining;  // per sampling chunk: tokens it may still generate
    // Speculative decoding: per chunk, the tokens that follow its tokens (the draft layer's
    // input; a sampled one is filled in after sampling); per sampling chunk, its draft tokens
    // (verified this step; its logits are then every row's).
    std::vector<std::vector<int32_t>> next, drafts;
    std::vector<bool> speculate;  // per sampling chunk: propose a draft for the next step
    // Per sampling chunk: its tokens before the drafts (with drafts, every row has logits).
    std::vector<int64_t> num_tokens;
  };
  struct StepResult {
    Status status;
    std::vector<int32_t> sampled;
    std::vector<sample::SampleResult> logprobs;  // per sampled token, when its request asks
    std::vector<std::string> errors;  // per sampled token: why its request failed alone, or ""
    // Speculative decoding, per sampling chunk: the accepted draft tokens' successors emitted
    // after `sampled` (the accepted count is extra.size()), and the next draft (empty: none).
    std::vector<std::vector<int32_t>> extra, proposals;
    std::vector<float> confidences;  // per proposal: the draft layer's probability of it
  };
  // Makes a finished step's samples final: writes them over the placeholders and feeds them to
  // the samplers' penalty state, before the next step samples.
  void Resolve(const sched::StepPlan& plan, const StepResult& result);
  class Executor;

  void FinishRequest(int64_t id, FinishReason reason, std::string error,
                     std::vector<TokenDelta>& out);
  StepJob BuildJob(const sched::StepPlan& plan);
  StepResult RunJob(const StepJob& job);
  // RunJob with sampling on the device.
  StepResult RunJobOnDevice(const StepJob& job, std::vector<std::vector<uint32_t>>& masks,
                            std::future<void>& masking);
  void PostProcess(const sched::StepPlan& plan, const StepResult& result,
                   std::vector<TokenDelta>& out);
  // Verifies the drafts of a finished forward pass and runs the draft layer over its rows.
  Status VerifyAndDraft(const StepJob& job, const TensorView& logits, StepResult& result);

  EngineConfig config_;
  Model& model_;
  kv::KvCacheManager kv_;
  sched::Scheduler scheduler_;
  ModelRunner runner_;
  std::map<int64_t, Live> live_;
  std::vector<TokenDelta> pending_;  // deltas produced between steps (aborts)
  EngineStats stats_;
  uint64_t seed_counter_;
  std::unique_ptr<Executor> executor_;
  std::optional<sched::StepPlan> inflight_;
  bool device_sampling_ = false;
  bool speculative_ = false;
  sched::DraftPolicy draft_policy_;
};

}  // namespace dinfer
