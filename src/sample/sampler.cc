#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dinfer::sample {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
// Top-p first looks at the tokens with weight (probability relative to the most likely token)
// >= e^-8, then e^-16, e^-32, ..., and at every token with a positive weight once the threshold
// falls below e^-256.
constexpr double kFirstThreshold = 3.3546262790251185e-4;  // e^-8
constexpr double kLastThreshold = 6.616261056709485e-112;  // e^-256

// Logit descending, index ascending: a total order, so results are reproducible.
bool ByLogit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

bool InVocab(int32_t token, size_t vocab_size) {
  return token >= 0 && static_cast<size_t>(token) < vocab_size;
}

// exp((logit - max_logit) / temperature): the unnormalized probability, 1 for the maximum.
double Weight(float logit, float max_logit, double inv_t) {
  return std::exp(static_cast<double>(logit - max_logit) * inv_t);
}

// The largest logit, NaN ignored (-inf when there is none). Independent lanes let the compiler
// vectorize the reduction.
float MaxLogit(std::span<const float> logits) {
  constexpr size_t kLanes = 16;
  float lane_max[kLanes];
  std::fill(lane_max, lane_max + kLanes, kNegInf);
  const size_t n = logits.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      lane_max[l] = logits[i + l] > lane_max[l] ? logits[i + l] : lane_max[l];
    }
  }
  float max_logit = kNegInf;
  for (float m : lane_max) max_logit = m > max_logit ? m : max_logit;
  for (; i < n; ++i) max_logit = logits[i] > max_logit ? logits[i] : max_logit;
  return max_logit;
}

}  // namespace

Status ValidateSamplingParams(const SamplingParams& p, int64_t vocab_size) {
  // Comparisons are written so that NaN fails them.
  if (!(p.temperature >= 0)) {
    return InvalidArgument("temperature must be >= 0 (0 is greedy), got {}", p.temperature);
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return InvalidArgument("top_p must be in (0, 1] (1 disables it), got {}", p.top_p);
  }
  if (p.top_k < 0) {
    return InvalidArgument("top_k must be >= 0 (0 disables it), got {}", p.top_k);
  }
  if (!(p.min_p >= 0 && p.min_p <= 1)) {
    return InvalidArgument("min_p must be in [0, 1] (0 disables it), got {}", p.min_p);
  }
  if (!(p.repetition_penalty > 0) || std::isinf(p.repetition_penalty)) {
    return InvalidArgument("repetition_penalty must be finite and > 0 (1 disables it), got {}",
                           p.repetition_penalty);
  }
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2)) {
    return InvalidArgument("presence_penalty must be in [-2, 2], got {}", p.presence_penalty);
  }
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2], got {}", p.frequency_penalty);
  }
  if (p.logprobs < -1 || p.logprobs > kMaxLogprobs) {
    return InvalidArgument("logprobs must be in [0, {}] (or -1 for none), got {}", kMaxLogprobs,
                           p.logprobs);
  }
  if (p.min_tokens < 0) {
    return InvalidArgument("min_tokens must be >= 0, got {}", p.min_tokens);
  }
  for (const auto& [token, bias] : p.logit_bias) {
    if (token < 0 || token >= vocab_size) {
      return InvalidArgument("logit_bias token id {} is outside the vocabulary [0, {})", token,
                             vocab_size);
    }
    if (!(bias >= -100 && bias <= 100)) {
      return InvalidArgument("logit_bias for token {} must be in [-100, 100], got {}", token, bias);
    }
  }
  return OkStatus();
}

double UniformDraw(uint64_t seed, uint64_t step) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (step + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z = z ^ (z >> 31);
  return static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
}

int32_t Argmax(std::span<const float> logits) {
  // Two passes, the maximum and then its first index, beat one running (value, index) pair,
  // whose compare chain is latency-bound.
  const float max_logit = MaxLogit(logits);
  if (max_logit == kNegInf) return 0;  // everything masked
  size_t i = 0;
  while (i < logits.size() && logits[i] != max_logit) ++i;
  return static_cast<int32_t>(i);
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params),
      track_prompt_(params.repetition_penalty != 1.0),
      track_counts_(track_prompt_ || params.presence_penalty != 0.0 ||
                    params.frequency_penalty != 0.0) {}

void Sampler::SetPrompt(std::span<const int32_t> prompt) {
  if (!track_prompt_) return;
  for (auto it = seen_.begin(); it != seen_.end();) {
    it->second.in_prompt = false;
    it = it->second.count == 0 ? seen_.erase(it) : std::next(it);
  }
  for (int32_t t : prompt) seen_[t].in_prompt = true;
}

void Sampler::Accept(int32_t token) {
  ++num_generated_;
  if (track_counts_) ++seen_[token].count;
}

bool Sampler::NeedsProcessing() const {
  return !params_.logit_bias.empty() || !seen_.empty() ||
         (num_generated_ < params_.min_tokens && !params_.stop_token_ids.empty());
}

void Sampler::ProcessLogits(std::span<float> logits) const {
  const size_t vocab = logits.size();
  for (const auto& [token, bias] : params_.logit_bias) {
    if (InVocab(token, vocab)) logits[static_cast<size_t>(token)] += bias;
  }
  if (num_generated_ < params_.min_tokens) {
    for (int32_t token : params_.stop_token_ids) {
      if (InVocab(token, vocab)) logits[static_cast<size_t>(token)] = kNegInf;
    }
  }
  const double rep = params_.repetition_penalty;
  const double presence = params_.presence_penalty;
  const double frequency = params_.frequency_penalty;
  // Each seen token is adjusted once and independently, so the map's order does not matter.
  for (const auto& [token, seen] : seen_) {
    if (!InVocab(token, vocab)) continue;
    float& logit = logits[static_cast<size_t>(token)];
    double l = logit;
    if (rep != 1.0) l = l > 0 ? l / rep : l * rep;
    if (seen.count > 0) l -= presence + frequency * seen.count;
    logit = static_cast<float>(l);
  }
}

int32_t Sampler::Sample(std::span<const float> logits) { return Draw(logits); }

SampleResult Sampler::SampleWithLogprobs(std::span<const float> logits) {
  SampleResult result;
  result.token = Draw(logits);
  if (params_.logprobs >= 0) FillLogprobs(logits, result);
  return result;
}

int32_t Sampler::Draw(std::span<const float> logits) {
  const uint64_t step = steps_++;
  std::span<const float> row = logits;
  if (NeedsProcessing()) {
    work_.assign(logits.begin(), logits.end());  // keeps its capacity across calls
    ProcessLogits(work_);
    row = work_;
  }
  if (params_.temperature <= 0.0 || params_.top_k == 1) return Argmax(row);
  return DrawFromDistribution(row, step);
}

int32_t Sampler::DrawFromDistribution(std::span<const float> logits, uint64_t step) {
  const double u = UniformDraw(params_.seed, step);
  const double inv_t = 1.0 / params_.temperature;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < logits.size()) {
    candidates_.clear();
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] == kPosInf) return static_cast<int32_t>(i);  // certain
      if (std::isfinite(logits[i])) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
    }
    if (candidates_.empty()) return Argmax(logits);
    const size_t keep = std::min(static_cast<size_t>(params_.top_k), candidates_.size());
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), ByLogit);
    candidates_.resize(keep);
    double z = 0;
    for (const auto& c : candidates_) z += Weight(c.first, candidates_[0].first, inv_t);
    return DrawSorted(candidates_[0].first, z, u);
  }

  // No top-k: avoid sorting the vocabulary. Weights relative to the maximum (which has weight 1)
  // give min-p as a plain threshold, and top-p only needs the sorted head of the distribution.
  const float max_logit = MaxLogit(logits);
  if (max_logit == kNegInf || max_logit == kPosInf) return Argmax(logits);  // masked / certain
  probs_.resize(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double w = logits[i] > kNegInf ? Weight(logits[i], max_logit, inv_t) : 0;  // NaN: 0
    probs_[i] = w;
    z += w;
  }
  const double min_weight = params_.min_p;  // p >= min_p * p_max  <=>  w >= min_p
  if (params_.top_p >= 1.0) {
    double total = z;
    if (min_weight > 0) {
      total = 0;
      for (double w : probs_) total += w >= min_weight ? w : 0;
    }
    const double r = u * total;
    double acc = 0;
    int32_t last = 0;  // always set: the maximum has weight 1 >= min_p
    for (size_t i = 0; i < probs_.size(); ++i) {
      const double w = probs_[i];
      if (w <= 0 || w < min_weight) continue;
      acc += w;
      last = static_cast<int32_t>(i);
      if (r < acc) return last;
    }
    return last;  // rounding left r at the very end
  }
  // Top-p: the nucleus lies within the tokens above some weight. Try thresholds from high to
  // low until the tokens above one hold enough mass; each try is one pass, and only the tokens
  // found are sorted.
  const double target = params_.top_p * z;
  for (double threshold = kFirstThreshold;; threshold *= threshold) {
    const bool last_try = threshold <= std::max(min_weight, kLastThreshold);
    const double floor = last_try ? std::max(min_weight, std::numeric_limits<double>::min())
                                  : std::max(min_weight, threshold);
    candidates_.clear();
    double mass = 0;
    for (size_t i = 0; i < probs_.size(); ++i) {
      if (probs_[i] >= floor) {
        candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
        mass += probs_[i];
      }
    }
    if (mass >= target || last_try) break;
  }
  std::sort(candidates_.begin(), candidates_.end(), ByLogit);
  return DrawSorted(max_logit, z, u);
}

int32_t Sampler::DrawSorted(float max_logit, double z, double u) {
  // candidates_ is sorted by ByLogit and holds the head of a distribution whose weights sum to z.
  const double inv_t = 1.0 / params_.temperature;
  const size_t count = candidates_.size();
  probs_.resize(count);
  for (size_t i = 0; i < count; ++i) probs_[i] = Weight(candidates_[i].first, max_logit, inv_t) / z;
  size_t cut = count;
  if (params_.min_p > 0.0) {
    const double floor = params_.min_p * probs_[0];
    cut = 1;
    while (cut < count && probs_[cut] >= floor) ++cut;
  }
  if (params_.top_p < 1.0) {
    double cum = 0;
    size_t n = 0;
    while (n < cut) {
      cum += probs_[n++];
      if (cum >= params_.top_p) break;
    }
    cut = std::max<size_t>(1, n);
  }
  double total = 0;
  for (size_t i = 0; i < cut; ++i) total += probs_[i];
  const double r = u * total;
  double acc = 0;
  for (size_t i = 0; i < cut; ++i) {
    acc += probs_[i];
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[cut - 1].second;
}

void Sampler::FillLogprobs(std::span<const float> logits, SampleResult& result) {
  // The top-n lives in a small sorted array (n <= kMaxLogprobs); most tokens fail the one
  // comparison against its last entry.
  const size_t n = std::min(static_cast<size_t>(params_.logprobs), logits.size());
  const float max_logit = MaxLogit(logits);
  top_.clear();
  for (size_t i = 0; n > 0 && i < logits.size(); ++i) {
    const float x = logits[i];
    if (top_.size() == n ? !(x > top_.back().first) : std::isnan(x)) continue;
    const std::pair<float, int32_t> entry(x, static_cast<int32_t>(i));
    top_.insert(std::upper_bound(top_.begin(), top_.end(), entry, ByLogit), entry);
    if (top_.size() > n) top_.pop_back();
  }
  double sum = 0;
  for (float x : logits) {
    if (!std::isnan(x)) sum += std::exp(x - max_logit);
  }
  const double log_sum = std::log(sum);
  auto logprob = [&](float x) {
    if (max_logit == kNegInf) return kNegInf;  // everything masked
    return static_cast<float>((static_cast<double>(x) - max_logit) - log_sum);
  };
  result.logprob = logprob(logits[static_cast<size_t>(result.token)]);
  result.top.clear();
  result.top.reserve(top_.size());
  for (const auto& [x, token] : top_) result.top.emplace_back(token, logprob(x));
  // Distinct logits can round to one float logprob; the documented order is on logprobs.
  std::sort(result.top.begin(), result.top.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
}

}  // namespace dinfer::sample
