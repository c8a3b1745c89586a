#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dinfer::sample {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Logit descending, index ascending: a total order, so results are reproducible.
bool ByLogit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

bool InVocab(int32_t token, size_t vocab_size) {
  return token >= 0 && static_cast<size_t>(token) < vocab_size;
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
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
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
  candidates_.clear();
  candidates_.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i]) || logits[i] > 0) {
      candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
    }
  }
  if (candidates_.empty()) return Argmax(logits);
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), ByLogit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), ByLogit);
  }
  candidates_.resize(keep);
  const double inv_t = 1.0 / params_.temperature;
  const double max_logit = candidates_[0].first;
  probs_.resize(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs_[i] = std::exp((candidates_[i].first - max_logit) * inv_t);
    sum += probs_[i];
  }
  for (size_t i = 0; i < keep; ++i) probs_[i] /= sum;
  size_t cut = keep;
  if (params_.min_p > 0.0) {
    const double floor = params_.min_p * probs_[0];
    cut = 1;
    while (cut < keep && probs_[cut] >= floor) ++cut;
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
  const double r = UniformDraw(params_.seed, step) * total;
  double acc = 0;
  for (size_t i = 0; i < cut; ++i) {
    acc += probs_[i];
    if (r < acc) return candidates_[i].second;
  }
  return candidates_[cut - 1].second;
}

void Sampler::FillLogprobs(std::span<const float> logits, SampleResult& result) {
  // One pass for the maximum and the top-n (a small sorted array: n <= kMaxLogprobs, and most
  // tokens lose against its last entry), one for the normalizer.
  const size_t n = std::min(static_cast<size_t>(params_.logprobs), logits.size());
  top_.clear();
  float max_logit = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (std::isnan(x)) continue;
    max_logit = std::max(max_logit, x);
    const std::pair<float, int32_t> entry(x, static_cast<int32_t>(i));
    if (n == 0 || (top_.size() == n && !ByLogit(entry, top_.back()))) continue;
    if (top_.size() == n) top_.pop_back();
    top_.insert(std::upper_bound(top_.begin(), top_.end(), entry, ByLogit), entry);
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
