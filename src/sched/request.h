// The scheduler's view of a request: token counts and state, no tensors. Owned by the Scheduler;
// read by the engine between steps on the same thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace dinfer::sched {

using RequestId = kv::RequestId;

// Stands for a token that an in-flight step will sample: the scheduler plans the next step with
// it (asynchronous scheduling) and ResolveSamples replaces it with the real token.
inline constexpr int32_t kPlaceholderToken = -1;

enum class RequestState {
  kWaiting,   // not admitted yet, or preempted (KV dropped; recomputed on readmission)
  kRunning,   // holds KV blocks and is scheduled every step
  kFinished,  // stopped, hit a limit, aborted or failed; its blocks are freed
};

enum class FinishReason { kNone, kStop, kLength, kAborted, kError };

struct SchedRequest {
  RequestId id = 0;
  int priority = 0;             // lower value runs first (then arrival order)
  int64_t arrival = 0;          // admission order among equal priorities
  std::vector<int32_t> tokens;  // prompt followed by the generated tokens
  int64_t num_prompt_tokens = 0;
  int64_t max_new_tokens = 0;
  uint64_t cache_salt = 0;
  RequestId follows = 0;  // a sibling (n > 1) that computes the shared prompt first; 0: none
  int64_t num_computed_tokens = 0;  // tokens whose KV is written or being written this step
  int64_t num_cached_tokens = 0;    // prompt tokens served from the prefix cache at admission
  int64_t num_done_tokens = 0;      // computed by finished steps (their blocks are published)
  int64_t num_preemptions = 0;
  // Speculative decoding: tokens a draft model proposed after the last token, verified with it by
  // the next step (Scheduler::SetDraft); not part of `tokens` until accepted.
  std::vector<int32_t> draft;
  RequestState state = RequestState::kWaiting;
  FinishReason finish = FinishReason::kNone;
  std::string error;  // for kError

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_generated() const { return num_tokens() - num_prompt_tokens; }
  bool has_placeholder() const { return !tokens.empty() && tokens.back() == kPlaceholderToken; }
  // Tokens whose KV is not computed yet (the rest of the prompt, or the last sampled token).
  int64_t num_pending() const { return num_tokens() - num_computed_tokens; }
};

}  // namespace dinfer::sched
