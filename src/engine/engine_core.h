// EngineCore: the step loop. Each Step() asks the scheduler for a plan (which requests, how many
// tokens), runs it as one batched forward pass, samples the requests that reached their last
// known token, feeds the tokens back, checks stop conditions and reports token deltas. A request
// that fails (bad input, cannot fit) fails alone; the others keep running.
// Not thread-safe: one thread drives it (the Engine's loop, or a caller such as the benchmark).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "runner/model_runner.h"
#include "sample/sampler.h"
#include "sched/scheduler.h"

namespace dinfer {

struct EngineConfig {
  sched::SchedulerConfig scheduler;
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;  // 0: from kv_cache_bytes
  int64_t kv_cache_bytes = 512ll << 20;
  bool enable_prefix_caching = true;
  int threads = 0;  // CPU threads (0: all cores)
  bool f32_activations = false;
  // With scheduler.step_time_budget_s > 0 the step cost model is loaded from this file if it
  // exists, else measured at start-up (and saved here when a path is given).
  std::string cost_profile;
};

struct RequestOptions {
  sample::SamplingParams sampling;  // seed: see has_seed
  bool has_seed = false;            // without a seed, one is drawn per request
  int64_t max_tokens = 128;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int priority = 0;
  uint64_t cache_salt = 0;
};

enum class FinishReason { kNone, kStop, kLength, kAborted, kError };
std::string_view FinishReasonName(FinishReason r);

struct TokenDelta {
  int64_t request_id = 0;
  std::vector<int32_t> tokens;  // new tokens since the last delta
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
  kv::KvCacheStats kv;
};

class EngineCore {
 public:
  EngineCore(Model& model, const EngineConfig& config);

  Status AddRequest(int64_t id, std::vector<int32_t> prompt, const RequestOptions& options);
  // Aborts a waiting or running request; its delta (kAborted) comes with the next Step().
  void Abort(int64_t id);
  bool HasWork() const { return scheduler_.HasWork() || !pending_.empty(); }
  // Runs one step and returns what changed. A failing forward pass fails the step's requests.
  std::vector<TokenDelta> Step();

  EngineStats Stats() const;
  const kv::KvCacheManager& kv() const { return kv_; }
  ModelRunner& runner() { return runner_; }

 private:
  struct Live {
    RequestOptions options;
    sample::Sampler sampler;
    size_t reported = 0;  // generated tokens already reported
  };
  void FinishRequest(int64_t id, FinishReason reason, std::string error,
                     std::vector<TokenDelta>& out);

  EngineConfig config_;
  Model& model_;
  kv::KvCacheManager kv_;
  sched::Scheduler scheduler_;
  ModelRunner runner_;
  std::map<int64_t, Live> live_;
  std::vector<TokenDelta> pending_;  // deltas produced between steps (aborts)
  EngineStats stats_;
  uint64_t seed_counter_;
};

}  // namespace dinfer
