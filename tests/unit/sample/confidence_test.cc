#include "sample/confidence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sample/sampler.h"

namespace dinfer::sample {
namespace {

// The softmax the plain way, in double, for comparison.
std::vector<double> Softmax(const std::vector<float>& logits) {
  double max = -std::numeric_limits<double>::infinity();
  for (float l : logits) max = std::max(max, static_cast<double>(l));
  std::vector<double> p;
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  for (float l : logits) p.push_back(std::exp(static_cast<double>(l) - max) / sum);
  return p;
}

TEST(ArgmaxProbability, IsTheSoftmaxOfTheFirstMaximum) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};
  const TopToken top = ArgmaxProbability(logits);
  EXPECT_EQ(top.token, 1);
  EXPECT_EQ(top.token, Argmax(logits));
  EXPECT_NEAR(top.probability, Softmax(logits)[1], 1e-6);
  // Two tokens tie at the top: neither has more than half.
  EXPECT_LT(top.probability, 0.5f);
}

TEST(ArgmaxProbability, AgreesWithTheSoftmaxOnRandomRows) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const float scale = 0.1f * static_cast<float>(trial + 1);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> logits(1 + trial * 37);
    for (float& l : logits) l = d(rng) + 40.0f;  // large logits: no overflow
    const TopToken top = ArgmaxProbability(logits);
    const std::vector<double> p = Softmax(logits);
    ASSERT_EQ(top.token, Argmax(logits));
    EXPECT_NEAR(top.probability, p[static_cast<size_t>(top.token)], 1e-5) << "trial " << trial;
  }
}

TEST(ArgmaxProbability, UniformConfidentAndMaskedRows) {
  EXPECT_NEAR(ArgmaxProbability(std::vector<float>(256, 0.25f)).probability, 1.0 / 256, 1e-7);
  // One logit far above the rest: certain.
  std::vector<float> confident(256, -1.0f);
  confident[17] = 40.0f;
  const TopToken c = ArgmaxProbability(confident);
  EXPECT_EQ(c.token, 17);
  EXPECT_NEAR(c.probability, 1.0f, 1e-6);
  // A margin of 2 over 255 others is far from certain.
  confident[17] = 1.0f;
  EXPECT_NEAR(ArgmaxProbability(confident).probability,
              std::exp(1.0) / (std::exp(1.0) + 255 * std::exp(-1.0)), 1e-6);
  // Masked tokens (-inf) take no probability.
  const float inf = std::numeric_limits<float>::infinity();
  const TopToken m = ArgmaxProbability(std::vector<float>{-inf, 2.0f, -inf, 2.0f});
  EXPECT_EQ(m.token, 1);
  EXPECT_NEAR(m.probability, 0.5f, 1e-7);
  EXPECT_EQ(ArgmaxProbability(std::vector<float>{-inf, -inf}).token, 0);
  EXPECT_EQ(ArgmaxProbability(std::vector<float>{}).token, -1);
}

}  // namespace
}  // namespace dinfer::sample
