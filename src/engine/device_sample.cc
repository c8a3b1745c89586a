#include "engine/device_sample.h"

#include <algorithm>
#include <unordered_map>

namespace dinfer {

void AppendDeviceSampleRow(sample::Sampler& s, DeviceSampleBatch& b) {
  const sample::SamplingParams& p = s.params();
  DeviceSampleRow r;
  r.temperature = p.temperature;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.repetition_penalty = p.repetition_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.seed = p.seed;
  r.step = s.AdvanceStep();
  r.top_k = p.top_k;
  r.logprobs = p.logprobs;
  r.adjust_begin = static_cast<int32_t>(b.adjustments.size());
  // One entry per token: its biases (in the order given, as the CPU adds them), its ban, its
  // penalties.
  std::unordered_map<int32_t, size_t> index;
  auto entry = [&](int32_t token) -> DeviceTokenAdjust& {
    auto [it, added] = index.emplace(token, b.adjustments.size());
    if (added) {
      b.adjustments.emplace_back();
      b.adjustments.back().token = token;
    }
    return b.adjustments[it->second];
  };
  if (!p.logit_bias.empty()) {
    // Biases of one token are contiguous: group them, keeping their order.
    std::vector<std::pair<int32_t, float>> bias = p.logit_bias;
    std::stable_sort(bias.begin(), bias.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    for (const auto& [token, value] : bias) {
      DeviceTokenAdjust& a = entry(token);
      if (a.bias_begin == a.bias_end) {
        a.bias_begin = a.bias_end = static_cast<uint32_t>(b.biases.size());
      }
      b.biases.push_back(value);
      ++a.bias_end;
    }
  }
  if (s.BansStopTokens()) {
    for (int32_t token : p.stop_token_ids) entry(token).ban = true;
  }
  for (const auto& [token, seen] : s.seen()) {
    DeviceTokenAdjust& a = entry(token);
    a.seen = true;
    a.count = seen.count;
  }
  r.adjust_end = static_cast<int32_t>(b.adjustments.size());
  b.rows.push_back(r);
}

}  // namespace dinfer
