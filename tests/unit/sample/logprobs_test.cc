#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "sample/sampler.h"

namespace dinfer::sample {
namespace {

// log-softmax in double precision, masked tokens -inf.
std::vector<double> ReferenceLogprobs(const std::vector<float>& logits) {
  double max = -INFINITY;
  for (float x : logits) max = std::max(max, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  std::vector<double> out;
  for (float x : logits) out.push_back(static_cast<double>(x) - max - std::log(sum));
  return out;
}

std::vector<float> RandomLogits(size_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (auto& x : logits) x = normal(rng);
  for (size_t i = 0; i < vocab; i += 97) logits[i] = -INFINITY;  // a grammar mask
  return logits;
}

TEST(Logprobs, MatchADoublePrecisionLogSoftmaxOfTheRawLogits) {
  const auto logits = RandomLogits(1000, 7);
  const auto ref = ReferenceLogprobs(logits);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return ref[a] != ref[b] ? ref[a] > ref[b] : a < b; });

  SamplingParams p;
  p.temperature = 0.7;  // none of these change the reported logprobs
  p.top_p = 0.9;
  p.repetition_penalty = 1.3;
  p.presence_penalty = 0.5;
  p.logit_bias = {{3, 5.0f}};
  p.seed = 5;
  p.logprobs = 5;
  Sampler s(p);
  const std::vector<int32_t> prompt = {order[0], order[1]};
  s.SetPrompt(prompt);
  for (int step = 0; step < 20; ++step) {
    const SampleResult r = s.SampleWithLogprobs(logits);
    ASSERT_TRUE(std::isfinite(logits[r.token]));
    EXPECT_NEAR(r.logprob, ref[r.token], 1e-5) << "step " << step;
    ASSERT_EQ(r.top.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(r.top[i].first, order[i]);
      EXPECT_NEAR(r.top[i].second, ref[order[i]], 1e-5);
    }
    s.Accept(r.token);
  }
}

TEST(Logprobs, GreedyWithLargeVocabulary) {
  const auto logits = RandomLogits(150000, 8);
  const auto ref = ReferenceLogprobs(logits);
  SamplingParams p;
  p.temperature = 0.0;
  p.logprobs = 20;
  Sampler s(p);
  const SampleResult r = s.SampleWithLogprobs(logits);
  EXPECT_EQ(r.token, Argmax(logits));
  EXPECT_NEAR(r.logprob, ref[r.token], 1e-5);
  ASSERT_EQ(r.top.size(), 20u);
  EXPECT_EQ(r.top[0].first, r.token);
  EXPECT_FLOAT_EQ(r.top[0].second, r.logprob);
  for (size_t i = 1; i < r.top.size(); ++i) EXPECT_GE(r.top[i - 1].second, r.top[i].second);
}

TEST(Logprobs, TopIsSortedByLogprobThenTokenId) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -INFINITY, 3.0f};
  SamplingParams p;
  p.temperature = 0.0;
  p.logprobs = 4;
  Sampler s(p);
  const SampleResult r = s.SampleWithLogprobs(logits);
  ASSERT_EQ(r.top.size(), 4u);
  EXPECT_EQ(r.top[0].first, 1);
  EXPECT_EQ(r.top[1].first, 3);
  EXPECT_EQ(r.top[2].first, 5);
  EXPECT_EQ(r.top[3].first, 2);
  EXPECT_EQ(r.top[0].second, r.top[1].second);
  EXPECT_EQ(r.top[1].second, r.top[2].second);
  EXPECT_LT(r.top[3].second, r.top[2].second);
}

TEST(Logprobs, TopNeverExceedsTheVocabularyAndShowsMaskedTokens) {
  const std::vector<float> logits = {0.0f, -INFINITY, 0.0f};
  SamplingParams p;
  p.temperature = 0.0;
  p.logprobs = 10;
  Sampler s(p);
  const SampleResult r = s.SampleWithLogprobs(logits);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].first, 0);
  EXPECT_FLOAT_EQ(r.top[0].second, std::log(0.5f));
  EXPECT_EQ(r.top[1].first, 2);
  EXPECT_FLOAT_EQ(r.top[1].second, std::log(0.5f));
  EXPECT_EQ(r.top[2].first, 1);
  EXPECT_EQ(r.top[2].second, -INFINITY);
}

TEST(Logprobs, ZeroGivesTheChosenTokenOnlyAndMinusOneNothing) {
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f, 0.0f};
  SamplingParams p;
  p.temperature = 0.0;
  p.logprobs = 0;
  Sampler zero(p);
  const SampleResult r0 = zero.SampleWithLogprobs(logits);
  EXPECT_EQ(r0.token, 0);
  EXPECT_FLOAT_EQ(r0.logprob, std::log(0.25f));
  EXPECT_TRUE(r0.top.empty());

  p.logprobs = -1;
  Sampler none(p);
  const SampleResult r1 = none.SampleWithLogprobs(logits);
  EXPECT_EQ(r1.token, 0);
  EXPECT_EQ(r1.logprob, 0.0f);
  EXPECT_TRUE(r1.top.empty());
}

TEST(Logprobs, ChosenTokenCanBeUnlikelyUnderTheRawDistribution) {
  // The bias forces token 0; its logprob still reports the model's view.
  SamplingParams p;
  p.temperature = 0.0;
  p.logit_bias = {{0, 100.0f}};
  p.logprobs = 1;
  Sampler s(p);
  const SampleResult r = s.SampleWithLogprobs(std::vector<float>{0.0f, 10.0f});
  EXPECT_EQ(r.token, 0);
  EXPECT_NEAR(r.logprob, -10.0 - std::log1p(std::exp(-10.0)), 1e-6);
  ASSERT_EQ(r.top.size(), 1u);
  EXPECT_EQ(r.top[0].first, 1);
}

TEST(Logprobs, EverythingMaskedIsMinusInfinityNotNan) {
  SamplingParams p;
  p.temperature = 0.0;
  p.logprobs = 2;
  Sampler s(p);
  const SampleResult r = s.SampleWithLogprobs(std::vector<float>{-INFINITY, -INFINITY});
  EXPECT_EQ(r.logprob, -INFINITY);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].second, -INFINITY);
}

TEST(Logprobs, DoNotChangeTheDrawnTokens) {
  const auto logits = RandomLogits(500, 9);
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 77;
  p.frequency_penalty = 0.4;
  Sampler plain(p);
  p.logprobs = 3;
  Sampler with(p);
  for (int i = 0; i < 50; ++i) {
    const int32_t a = plain.Sample(logits);
    const int32_t b = with.SampleWithLogprobs(logits).token;
    ASSERT_EQ(a, b) << "step " << i;
    plain.Accept(a);
    with.Accept(b);
  }
}

}  // namespace
}  // namespace dinfer::sample
