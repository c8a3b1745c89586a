#include "sched/draft_policy.h"

#include <gtest/gtest.h>

namespace dinfer::sched {
namespace {

using Decision = DraftPolicy::Decision;

TEST(DraftPolicy, DefaultsProposeEveryDraft) {
  const DraftPolicy policy(DraftPolicyConfig{});
  DraftPolicy::State s;
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(policy.Decide(s, 0.0), Decision::kPropose);
    policy.OnVerified(s, 1, 0);
  }
  EXPECT_FALSE(policy.Paused(s));
}

TEST(DraftPolicy, ConfidenceThreshold) {
  DraftPolicyConfig c;
  c.min_confidence = 0.5;
  const DraftPolicy policy(c);
  DraftPolicy::State s;
  EXPECT_EQ(policy.Decide(s, 0.49), Decision::kLowConfidence);
  EXPECT_EQ(policy.Decide(s, 0.5), Decision::kPropose);
  EXPECT_EQ(policy.Decide(s, 0.99), Decision::kPropose);
}

TEST(DraftPolicy, AcceptanceIsAMovingAverage) {
  DraftPolicyConfig c;
  c.acceptance_weight = 0.5;
  const DraftPolicy policy(c);
  DraftPolicy::State s;
  EXPECT_DOUBLE_EQ(s.acceptance, 1.0);
  policy.OnVerified(s, 1, 0);
  EXPECT_DOUBLE_EQ(s.acceptance, 0.5);
  policy.OnVerified(s, 1, 0);
  EXPECT_DOUBLE_EQ(s.acceptance, 0.25);
  policy.OnVerified(s, 1, 1);
  EXPECT_DOUBLE_EQ(s.acceptance, 0.625);
  policy.OnVerified(s, 2, 1);
  EXPECT_DOUBLE_EQ(s.acceptance, 0.5625);
  policy.OnVerified(s, 0, 0);  // nothing verified: no change
  EXPECT_DOUBLE_EQ(s.acceptance, 0.5625);
}

// Failing drafts pause the request; it probes once per interval and resumes after an accepted
// probe.
TEST(DraftPolicy, PausesOnFailuresAndProbesToRecover) {
  DraftPolicyConfig c;
  c.min_acceptance = 0.5;
  c.probe_interval = 4;
  const DraftPolicy policy(c);
  DraftPolicy::State s;
  int proposed = 0;
  while (!policy.Paused(s)) {
    ASSERT_EQ(policy.Decide(s, 1.0), Decision::kPropose);
    policy.OnVerified(s, 1, 0);
    ++proposed;
  }
  EXPECT_EQ(proposed, 3);  // 1 -> 0.75 -> 0.5625 -> 0.421875
  // Paused: three steps without a draft, then a probe, which fails.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(policy.Decide(s, 1.0), Decision::kPaused);
  EXPECT_EQ(policy.Decide(s, 1.0), Decision::kPropose);
  policy.OnVerified(s, 1, 0);
  EXPECT_TRUE(policy.Paused(s));
  // The next probe's draft lacks confidence under a threshold: the probe waits for a confident one.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(policy.Decide(s, 1.0), Decision::kPaused);
  DraftPolicyConfig strict = c;
  strict.min_confidence = 0.9;
  const DraftPolicy strict_policy(strict);
  EXPECT_EQ(strict_policy.Decide(s, 0.5), Decision::kLowConfidence);
  EXPECT_EQ(strict_policy.Decide(s, 0.5), Decision::kLowConfidence);
  EXPECT_EQ(strict_policy.Decide(s, 0.95), Decision::kPropose);
  // An accepted probe resumes drafting every step ...
  policy.OnVerified(s, 1, 1);
  EXPECT_FALSE(policy.Paused(s));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(policy.Decide(s, 1.0), Decision::kPropose);
    policy.OnVerified(s, 1, 1);
  }
  EXPECT_GT(s.acceptance, 0.8);
  // ... until drafts fail again.
  while (!policy.Paused(s)) {
    ASSERT_EQ(policy.Decide(s, 1.0), Decision::kPropose);
    policy.OnVerified(s, 1, 0);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(policy.Decide(s, 1.0), Decision::kPaused);
  EXPECT_EQ(policy.Decide(s, 1.0), Decision::kPropose);
}

// An accepted probe lifts the average to the threshold, however far below it was.
TEST(DraftPolicy, AnAcceptedProbeResumesAtTheThreshold) {
  DraftPolicyConfig c;
  c.min_acceptance = 0.9;
  const DraftPolicy policy(c);
  DraftPolicy::State s;
  policy.OnVerified(s, 1, 0);
  ASSERT_TRUE(policy.Paused(s));
  policy.OnVerified(s, 1, 1);
  EXPECT_DOUBLE_EQ(s.acceptance, 0.9);
  EXPECT_FALSE(policy.Paused(s));
}

TEST(DraftPolicy, ValidatesItsKnobs) {
  EXPECT_TRUE(DraftPolicy::Validate(DraftPolicyConfig{}).ok());
  DraftPolicyConfig c;
  c.min_confidence = 1.0;
  c.min_acceptance = 1.0;
  EXPECT_TRUE(DraftPolicy::Validate(c).ok());
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    DraftPolicyConfig b;
    b.min_confidence = bad;
    const Status s = DraftPolicy::Validate(b);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("speculative_min_confidence"), std::string::npos) << s.message();
    b = DraftPolicyConfig{};
    b.min_acceptance = bad;
    EXPECT_NE(DraftPolicy::Validate(b).message().find("speculative_min_acceptance"),
              std::string::npos);
  }
  c = DraftPolicyConfig{};
  c.probe_interval = 0;
  EXPECT_FALSE(DraftPolicy::Validate(c).ok());
  c = DraftPolicyConfig{};
  c.acceptance_weight = 0;
  EXPECT_FALSE(DraftPolicy::Validate(c).ok());
}

}  // namespace
}  // namespace dinfer::sched
