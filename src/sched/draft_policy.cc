#include "sched/draft_policy.h"

#include <algorithm>

namespace dinfer::sched {

Status DraftPolicy::Validate(const DraftPolicyConfig& c) {
  // Written so that NaN fails too.
  if (!(c.min_confidence >= 0.0 && c.min_confidence <= 1.0)) {
    return InvalidArgument("speculative_min_confidence must be within [0, 1], got {}",
                           c.min_confidence);
  }
  if (!(c.min_acceptance >= 0.0 && c.min_acceptance <= 1.0)) {
    return InvalidArgument("speculative_min_acceptance must be within [0, 1], got {}",
                           c.min_acceptance);
  }
  if (c.probe_interval < 1) {
    return InvalidArgument("the draft probe interval must be at least 1 step, got {}",
                           c.probe_interval);
  }
  if (!(c.acceptance_weight > 0.0 && c.acceptance_weight <= 1.0)) {
    return InvalidArgument("the acceptance average's weight must be within (0, 1], got {}",
                           c.acceptance_weight);
  }
  return OkStatus();
}

void DraftPolicy::OnVerified(State& state, int64_t proposed, int64_t accepted) const {
  if (proposed <= 0) return;
  const double rate = static_cast<double>(std::clamp<int64_t>(accepted, 0, proposed)) /
                      static_cast<double>(proposed);
  const bool paused = Paused(state);
  state.acceptance += config_.acceptance_weight * (rate - state.acceptance);
  // An accepted probe resumes drafting at once (a failure after it pauses again); the average
  // alone would need several probes in a row, the longer the failures before.
  if (paused && accepted > 0) state.acceptance = std::max(state.acceptance, config_.min_acceptance);
}

DraftPolicy::Decision DraftPolicy::Decide(State& state, double confidence) const {
  const bool paused = Paused(state);
  if (paused && state.since_probe + 1 < config_.probe_interval) {
    ++state.since_probe;
    return Decision::kPaused;
  }
  if (confidence < config_.min_confidence) {
    if (paused) state.since_probe = config_.probe_interval;  // the probe waits for a confident one
    return Decision::kLowConfidence;
  }
  state.since_probe = 0;
  return Decision::kPropose;
}

}  // namespace dinfer::sched
