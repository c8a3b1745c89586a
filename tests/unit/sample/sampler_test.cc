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

}  // namespace
}  // namespace dinfer::sample
