#include "sample/sampler.h"

#include <algorithm>
#include <cmath>

namespace dinfer::sample {

double UniformDraw(uint64_t seed, uint64_t step) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (step + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z = z ^ (z >> 31);
  return static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
}

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

int32_t Sampler::Sample(std::span<const float> logits) {
  const uint64_t step = steps_++;
  if (params_.temperature <= 0.0 || params_.top_k == 1) return Argmax(logits);
  candidates_.clear();
  candidates_.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i]) || logits[i] > 0) {
      candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
    }
  }
  if (candidates_.empty()) return Argmax(logits);
  // Sort by logit descending, index ascending: a total order, so the result is reproducible.
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);
  const double inv_t = 1.0 / params_.temperature;
  const double max_logit = candidates_[0].first;
  std::vector<double> probs(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((candidates_[i].first - max_logit) * inv_t);
    sum += probs[i];
  }
  for (auto& p : probs) p /= sum;
  size_t cut = keep;
  if (params_.min_p > 0.0) {
    const double floor = params_.min_p * probs[0];
    cut = 1;
    while (cut < keep && probs[cut] >= floor) ++cut;
  }
  if (params_.top_p < 1.0) {
    double cum = 0;
    size_t n = 0;
    while (n < cut) {
      cum += probs[n++];
      if (cum >= params_.top_p) break;
    }
    cut = std::max<size_t>(1, n);
  }
  double total = 0;
  for (size_t i = 0; i < cut; ++i) total += probs[i];
  const double r = UniformDraw(params_.seed, step) * total;
  double acc = 0;
  for (size_t i = 0; i < cut; ++i) {
    acc += probs[i];
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[cut - 1].second;
}

}  // namespace dinfer::sample
