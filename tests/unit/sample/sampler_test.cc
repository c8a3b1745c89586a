#include "sample/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace dinfer::sample {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f}; }

TEST(Sampler, GreedyTakesFirstMaximum) {
  Sampler s(SamplingParams{0.0});
  EXPECT_EQ(s.Sample(Logits()), 1);
  EXPECT_EQ(Argmax(Logits()), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 1.5;
  p.top_k = 1;
  Sampler s(p);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.Sample(Logits()), 1);
}

TEST(Sampler, SeededStreamIsAFunctionOfSeedAndStep) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 42;
  Sampler a(p), b(p);
  std::vector<int32_t> xs, ys;
  for (int i = 0; i < 50; ++i) xs.push_back(a.Sample(Logits()));
  for (int i = 0; i < 50; ++i) ys.push_back(b.Sample(Logits()));
  EXPECT_EQ(xs, ys);
  EXPECT_EQ(UniformDraw(42, 7), UniformDraw(42, 7));
  EXPECT_NE(UniformDraw(42, 7), UniformDraw(43, 7));
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 1;
  Sampler s(p);
  const auto logits = Logits();
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[s.Sample(logits)]++;
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double want = std::exp(logits[i]) / z;
    EXPECT_NEAR(counts[static_cast<int32_t>(i)] / double(n), want, 0.015) << "token " << i;
  }
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.5;  // the two tokens with logit 3 hold 0.73 of the mass; the first alone 0.37
  p.seed = 3;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.Sample(Logits());
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0;
  p.min_p = 0.5;  // keeps tokens with p >= 0.5 * p_max: logits 3, 3 (and not 2: e^-1 < 0.5)
  p.seed = 5;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.Sample(Logits());
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, MaskedTokensAreNeverChosen) {
  std::vector<float> l = {-INFINITY, 0.0f, -INFINITY, 0.0f};
  SamplingParams p;
  p.temperature = 2.0;
  p.seed = 9;
  Sampler s(p);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.Sample(l);
    EXPECT_TRUE(t == 1 || t == 3);
  }
}

std::vector<float> WideLogits() {
  std::vector<float> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>((i * 37) % 11) * 0.3f;
  return l;
}

SamplingParams PenalizedParams(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_p = 0.95;
  p.repetition_penalty = 1.2;
  p.presence_penalty = 0.3;
  p.frequency_penalty = 0.2;
  p.logit_bias = {{5, 1.0f}};
  p.min_tokens = 3;
  p.stop_token_ids = {0};
  p.seed = seed;
  return p;
}

// Generates n tokens the way the engine does: sample, then accept.
std::vector<int32_t> Generate(Sampler& s, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(s.Sample(WideLogits()));
    s.Accept(out.back());
  }
  return out;
}

TEST(Sampler, SeededSequenceWithPenaltiesIsReproducible) {
  const std::vector<int32_t> prompt = {1, 2, 3, 5, 8};
  Sampler a(PenalizedParams(42)), b(PenalizedParams(42)), c(PenalizedParams(43));
  a.SetPrompt(prompt);
  b.SetPrompt(prompt);
  c.SetPrompt(prompt);
  const auto xs = Generate(a, 40);
  EXPECT_EQ(xs, Generate(b, 40));
  EXPECT_NE(xs, Generate(c, 40));
}

TEST(Sampler, InterleavingSamplersDoesNotAffectThem) {
  const std::vector<int32_t> prompt = {4, 4, 9};
  Sampler alone_a(PenalizedParams(7)), alone_b(PenalizedParams(8));
  alone_a.SetPrompt(prompt);
  const auto want_a = Generate(alone_a, 30);
  const auto want_b = Generate(alone_b, 30);

  // The same two requests in a "batch", stepped in an irregular order.
  Sampler a(PenalizedParams(7)), b(PenalizedParams(8));
  a.SetPrompt(prompt);
  std::vector<int32_t> got_a, got_b;
  for (int round = 0; got_a.size() < 30 || got_b.size() < 30; ++round) {
    if (got_b.size() < 30) {
      got_b.push_back(b.Sample(WideLogits()));
      b.Accept(got_b.back());
    }
    if (round % 3 != 0 && got_a.size() < 30) {
      got_a.push_back(a.Sample(WideLogits()));
      a.Accept(got_a.back());
    }
  }
  EXPECT_EQ(got_a, want_a);
  EXPECT_EQ(got_b, want_b);
}

TEST(Sampler, NeutralProcessingMatchesTheFastPath) {
  // A zero bias forces the copy-and-process path; it must draw exactly what the fast path draws.
  SamplingParams p;
  p.temperature = 0.8;
  p.top_k = 20;
  p.seed = 99;
  Sampler fast(p);
  p.logit_bias = {{0, 0.0f}};
  Sampler processed(p);
  EXPECT_EQ(Generate(fast, 50), Generate(processed, 50));
}

TEST(Sampler, MinTokensNeverEndsEarly) {
  Sampler s(PenalizedParams(3));
  const auto tokens = Generate(s, 40);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(tokens[i], 0) << i;
}

}  // namespace
}  // namespace dinfer::sample
