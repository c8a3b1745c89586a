#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "sample/sampler.h"

namespace dinfer::sample {
namespace {

// Runs the sampler's logits processing on a copy and returns it.
std::vector<float> Processed(const Sampler& s, std::vector<float> logits) {
  s.ProcessLogits(logits);
  return logits;
}

TEST(Penalties, RepetitionPenaltyCoversPromptAndGeneratedTokens) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  Sampler s(p);
  const std::vector<int32_t> prompt = {0, 4};
  s.SetPrompt(prompt);
  s.Accept(1);
  s.Accept(1);
  // Seen tokens 0, 1, 4: positive logits are divided by 2, the others multiplied by 2.
  EXPECT_EQ(Processed(s, {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, -0.5f}),
            (std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f, 0.0f, -0.5f}));
}

TEST(Penalties, RepetitionPenaltyBelowOneRewardsSeenTokens) {
  SamplingParams p;
  p.repetition_penalty = 0.5;
  Sampler s(p);
  const std::vector<int32_t> prompt = {0};
  s.SetPrompt(prompt);
  s.Accept(1);
  EXPECT_EQ(Processed(s, {2.0f, -1.0f, 0.5f}), (std::vector<float>{4.0f, -0.5f, 0.5f}));
}

TEST(Penalties, SetPromptReplacesTheEarlierPrompt) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  Sampler s(p);
  const std::vector<int32_t> first = {0, 1};
  const std::vector<int32_t> second = {2};
  s.SetPrompt(first);
  s.Accept(1);
  s.SetPrompt(second);
  // 0 was only in the first prompt; 1 stays penalized because it was generated.
  EXPECT_EQ(Processed(s, {2.0f, 2.0f, 2.0f, 2.0f}), (std::vector<float>{2.0f, 1.0f, 1.0f, 2.0f}));
}

TEST(Penalties, PresenceAndFrequencyCountGeneratedTokensOnly) {
  SamplingParams p;
  p.presence_penalty = 0.5;
  p.frequency_penalty = 0.25;
  Sampler s(p);
  const std::vector<int32_t> prompt = {3};
  s.SetPrompt(prompt);
  for (int32_t t : {0, 0, 0, 2}) s.Accept(t);
  // token 0: 1 - 0.5 - 3 * 0.25; token 2: 1 - 0.5 - 0.25; token 3 is only in the prompt.
  EXPECT_EQ(Processed(s, {1.0f, 1.0f, 1.0f, 1.0f}),
            (std::vector<float>{-0.25f, 1.0f, 0.25f, 1.0f}));
}

TEST(Penalties, NegativePresenceAndFrequencyEncourageRepeats) {
  SamplingParams p;
  p.presence_penalty = -1.0;
  p.frequency_penalty = -0.5;
  Sampler s(p);
  s.Accept(1);
  s.Accept(1);
  EXPECT_EQ(Processed(s, {0.0f, 0.0f}), (std::vector<float>{0.0f, 2.0f}));
}

TEST(Penalties, AllPenaltiesTogether) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  p.presence_penalty = 0.5;
  p.frequency_penalty = 0.25;
  Sampler s(p);
  const std::vector<int32_t> prompt = {3};
  s.SetPrompt(prompt);
  for (int32_t t : {0, 0, 2}) s.Accept(t);
  // 0: 4/2 - 0.5 - 2*0.25; 2: 4/2 - 0.5 - 0.25; 3: 4/2 (prompt: repetition only).
  EXPECT_EQ(Processed(s, {4.0f, 4.0f, 4.0f, 4.0f}), (std::vector<float>{1.0f, 4.0f, 1.25f, 2.0f}));
}

TEST(Penalties, MaskedTokensStayMasked) {
  SamplingParams p;
  p.repetition_penalty = 1.5;
  p.presence_penalty = -2.0;
  Sampler s(p);
  s.Accept(0);
  const auto out = Processed(s, {-INFINITY, 1.0f});
  EXPECT_EQ(out[0], -INFINITY);
}

TEST(Penalties, OutOfVocabularyHistoryIsIgnored) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  p.frequency_penalty = 1.0;
  Sampler s(p);
  const std::vector<int32_t> prompt = {-1, 7};
  s.SetPrompt(prompt);
  s.Accept(100);
  EXPECT_EQ(Processed(s, {1.0f, 2.0f}), (std::vector<float>{1.0f, 2.0f}));
}

TEST(Penalties, SampleDoesNotAcceptOnItsOwn) {
  SamplingParams p;
  p.temperature = 0.0;
  p.frequency_penalty = 2.0;
  Sampler s(p);
  const std::vector<float> logits = {0.0f, 1.0f, 0.5f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s.Sample(logits), 1);
  EXPECT_EQ(s.num_generated(), 0);
  s.Accept(1);  // 1 - 2 = -1: now token 2 leads
  EXPECT_EQ(s.Sample(logits), 2);
  EXPECT_EQ(s.num_generated(), 1);
  EXPECT_EQ(s.steps(), 6u);
}

TEST(Penalties, RepetitionPenaltyChangesTheGreedyChoice) {
  SamplingParams p;
  p.temperature = 0.0;
  p.repetition_penalty = 1.5;
  Sampler s(p);
  const std::vector<int32_t> prompt = {1};
  s.SetPrompt(prompt);
  // 3 / 1.5 = 2 < 2.5
  EXPECT_EQ(s.Sample(std::vector<float>{0.0f, 3.0f, 2.5f}), 2);
}

TEST(LogitBias, AppliedBeforeThePenalties) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  p.logit_bias = {{1, 2.0f}};
  Sampler s(p);
  s.Accept(1);
  // (-1 + 2) / 2; penalizing first would give -1 * 2 + 2 = 0.
  EXPECT_EQ(Processed(s, {1.0f, -1.0f}), (std::vector<float>{1.0f, 0.5f}));
}

TEST(LogitBias, ForcesAToken) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 11;
  p.logit_bias = {{4, 100.0f}};
  Sampler s(p);
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.Sample(logits), 4);
}

TEST(LogitBias, BansTokens) {
  SamplingParams p;
  p.temperature = 0.0;
  p.logit_bias = {{1, -100.0f}, {3, -100.0f}};
  Sampler s(p);
  EXPECT_EQ(s.Sample(std::vector<float>{1.0f, 3.0f, 2.0f, 3.0f}), 2);
}

TEST(LogitBias, DuplicatesAddUpAndOutOfRangeIdsAreSkipped) {
  SamplingParams p;
  p.logit_bias = {{0, 1.0f}, {-1, 5.0f}, {0, 0.5f}, {9, 5.0f}};
  Sampler s(p);
  EXPECT_EQ(Processed(s, {0.0f, 0.0f}), (std::vector<float>{1.5f, 0.0f}));
}

TEST(MinTokens, BlocksStopTokensUntilEnoughAreAccepted) {
  SamplingParams p;
  p.temperature = 0.0;
  p.min_tokens = 2;
  p.stop_token_ids = {1, 3};
  Sampler s(p);
  const std::vector<float> logits = {0.0f, 5.0f, 1.0f, 4.0f};
  EXPECT_EQ(s.Sample(logits), 2);
  EXPECT_EQ(s.Sample(logits), 2);  // draws without Accept do not count
  s.Accept(2);
  EXPECT_EQ(s.Sample(logits), 2);
  s.Accept(2);
  EXPECT_EQ(s.Sample(logits), 1);
}

TEST(MinTokens, StopTokensAreNeverDrawnWhileBlocked) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 3;
  p.min_tokens = 1;
  p.stop_token_ids = {1};
  Sampler s(p);
  const std::vector<float> logits = {0.0f, 4.0f, 0.0f};
  for (int i = 0; i < 200; ++i) EXPECT_NE(s.Sample(logits), 1);
  s.Accept(0);
  int stops = 0;
  for (int i = 0; i < 200; ++i) stops += s.Sample(logits) == 1;
  EXPECT_GT(stops, 150);  // p(1) = e^4 / (e^4 + 2) = 0.96
}

TEST(MinTokens, IgnoredWithoutStopTokens) {
  SamplingParams p;
  p.temperature = 0.0;
  p.min_tokens = 5;
  Sampler s(p);
  EXPECT_EQ(s.Sample(std::vector<float>{0.0f, 5.0f}), 1);
}

}  // namespace
}  // namespace dinfer::sample
