// DraftPolicy: which speculative drafts are worth verifying. A draft costs the next step one more
// token of compute and one of KV, and gains a token only when accepted, so a draft is proposed
// only when (a) the draft layer's confidence in it (its softmax probability, an estimate of the
// chance of acceptance) reaches min_confidence, and, with min_acceptance > 0, (b) the request's
// recent acceptance rate (an exponential moving average over its verified drafts) reaches
// min_acceptance. A request below (b) is paused: it proposes nothing except a probe every
// probe_interval steps; an accepted probe resumes drafting (its average is raised to the
// threshold, so the next failure pauses it again).
// Host-side state only; one instance per engine, one State per request; single-threaded.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace dinfer::sched {

struct DraftPolicyConfig {
  // Break-even acceptance probability: 0 proposes every draft. A draft gains p tokens for the cost
  // of one extra token, so set it near the cost of one verified token relative to the gain of
  // one emitted token (low while decode is bound by memory, higher as steps become compute bound).
  double min_confidence = 0.0;
  double min_acceptance = 0.0;  // 0: no per-request pausing
  int64_t probe_interval = 8;   // paused requests propose once in this many steps (>= 1)
  // Weight of the newest verified draft in the acceptance average (1 - this: the history's).
  double acceptance_weight = 0.25;
};

class DraftPolicy {
 public:
  // Per request. The average starts optimistic (1): a new request drafts until drafts fail.
  struct State {
    double acceptance = 1.0;
    int64_t since_probe = 0;  // steps proposing nothing while paused
  };
  enum class Decision { kPropose, kLowConfidence, kPaused };

  explicit DraftPolicy(const DraftPolicyConfig& config) : config_(config) {}
  // Whether the knobs are within range (probabilities in [0, 1], an interval of at least 1).
  static Status Validate(const DraftPolicyConfig& config);

  // The outcome of a request's verified draft: `accepted` of `proposed` tokens (a probe if the
  // request is paused).
  void OnVerified(State& state, int64_t proposed, int64_t accepted) const;
  // Whether to propose a draft of this confidence for the request's next step. A paused request
  // keeps its probe pending while its drafts lack confidence, so the next confident one probes.
  Decision Decide(State& state, double confidence) const;
  bool Paused(const State& state) const {
    return config_.min_acceptance > 0 && state.acceptance < config_.min_acceptance;
  }
  const DraftPolicyConfig& config() const { return config_; }

 private:
  DraftPolicyConfig config_;
};

}  // namespace dinfer::sched
