// The sampler's top-k / top-p / min-p draws against a plain reference that sorts the whole
// vocabulary, fed the same uniform draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "sample/sampler.h"

namespace dinfer::sample {
namespace {

int32_t ReferenceDraw(const std::vector<float>& logits, const SamplingParams& p, double u) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) order.push_back(static_cast<int32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(p.top_k);
  std::vector<double> probs;
  double z = 0;
  for (int32_t t : order) {
    probs.push_back(std::exp((logits[t] - logits[order[0]]) / p.temperature));
    z += probs.back();
  }
  for (double& x : probs) x /= z;
  size_t cut = probs.size();
  if (p.min_p > 0) {
    cut = 1;
    while (cut < probs.size() && probs[cut] >= p.min_p * probs[0]) ++cut;
  }
  if (p.top_p < 1) {
    double cum = 0;
    size_t n = 0;
    while (n < cut) {
      cum += probs[n++];
      if (cum >= p.top_p) break;
    }
    cut = n;
  }
  const double total = std::accumulate(probs.begin(), probs.begin() + cut, 0.0);
  double acc = 0;
  for (size_t i = 0; i < cut; ++i) {
    acc += probs[i];
    if (u * total < acc) return order[i];
  }
  return order[cut - 1];
}

std::vector<float> Logits(size_t vocab, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (auto& x : logits) x = normal(rng);
  logits[vocab / 2] = -INFINITY;
  return logits;
}

struct Case {
  double temperature;
  int top_k;
  double top_p;
  double min_p;
  float scale;  // spread of the logits
};

TEST(Truncation, MatchesAFullSortReference) {
  const std::vector<Case> cases = {
      {1.0, 0, 0.9, 0.0, 1.0f},      {0.7, 0, 0.5, 0.0, 3.0f},  {1.3, 0, 0.95, 0.05, 2.0f},
      {1.0, 0, 0.999999, 0.0, 4.0f},  // the nucleus reaches far below the first threshold
      {0.2, 0, 0.99, 0.0, 1.0f},     {1.0, 40, 0.8, 0.0, 2.0f}, {1.0, 40, 1.0, 0.1, 2.0f},
      {2.0, 5, 1.0, 0.0, 1.0f},      {1.0, 0, 0.3, 0.5, 0.5f},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    SamplingParams p;
    p.temperature = cases[c].temperature;
    p.top_k = cases[c].top_k;
    p.top_p = cases[c].top_p;
    p.min_p = cases[c].min_p;
    p.seed = 1000 + c;
    const auto logits = Logits(3000, cases[c].scale, static_cast<uint32_t>(c));
    Sampler s(p);
    for (uint64_t step = 0; step < 300; ++step) {
      ASSERT_EQ(s.Sample(logits), ReferenceDraw(logits, p, UniformDraw(p.seed, step)))
          << "case " << c << " step " << step;
    }
  }
}

TEST(Truncation, NucleusFarBelowTheMaximum) {
  // Weights e^-0.5i: a nucleus of mass 1 - 1e-9 holds about 42 tokens, most far below e^-8.
  std::vector<float> logits(200);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = -0.5f * static_cast<float>(i);
  SamplingParams p;
  p.top_p = 1 - 1e-9;
  p.seed = 4;
  Sampler s(p);
  for (uint64_t step = 0; step < 2000; ++step) {
    ASSERT_EQ(s.Sample(logits), ReferenceDraw(logits, p, UniformDraw(p.seed, step)));
  }
}

TEST(Truncation, MinPAloneFollowsTheRenormalizedDistribution) {
  // Without top-p the draw walks the vocabulary in index order: same distribution as the
  // reference, not the same tokens.
  const std::vector<float> logits = {0.0f, 2.0f, -3.0f, 1.5f, 1.0f, -INFINITY};
  SamplingParams p;
  p.min_p = 0.3;  // keeps weights e^0, e^-0.5, e^-1 (0.37); drops e^-2 and e^-5
  p.seed = 8;
  Sampler s(p);
  std::map<int32_t, int> counts;
  const int n = 30000;
  for (int i = 0; i < n; ++i) counts[s.Sample(logits)]++;
  const double z = 1 + std::exp(-0.5) + std::exp(-1.0);
  EXPECT_NEAR(counts[1] / double(n), 1 / z, 0.01);
  EXPECT_NEAR(counts[3] / double(n), std::exp(-0.5) / z, 0.01);
  EXPECT_NEAR(counts[4] / double(n), std::exp(-1.0) / z, 0.01);
  EXPECT_EQ(counts[0] + counts[2] + counts[5], 0);
}

TEST(Truncation, InfiniteLogitIsCertain) {
  SamplingParams p;
  p.top_p = 0.9;
  Sampler s(p);
  EXPECT_EQ(s.Sample(std::vector<float>{0.0f, INFINITY, 1.0f}), 1);
  p.top_k = 2;
  Sampler k(p);
  EXPECT_EQ(k.Sample(std::vector<float>{0.0f, INFINITY, 1.0f}), 1);
}

TEST(Truncation, EverythingMaskedFallsBackToTokenZero) {
  SamplingParams p;
  Sampler s(p);
  EXPECT_EQ(s.Sample(std::vector<float>{-INFINITY, -INFINITY}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{-INFINITY, -INFINITY}), 0);
}

TEST(Argmax, FirstMaximumAcrossLanesAndTail) {
  std::vector<float> l(100, 0.0f);
  EXPECT_EQ(Argmax(l), 0);
  l[37] = 1.0f;
  l[21] = 1.0f;
  l[99] = 1.0f;
  EXPECT_EQ(Argmax(l), 21);
  l[98] = 2.0f;  // in the tail after the 16-wide blocks
  EXPECT_EQ(Argmax(l), 98);
  l[3] = NAN;
  EXPECT_EQ(Argmax(l), 98);
  l[0] = NAN;
  EXPECT_EQ(Argmax(l), 98);
  EXPECT_EQ(Argmax(std::vector<float>{-INFINITY, NAN, -1.0f}), 2);
}

}  // namespace
}  // namespace dinfer::sample
