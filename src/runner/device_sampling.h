// What a step's sampling on the device needs from the host and gives back: per logits row the
// sampling parameters (sample::SamplingParams semantics), an optional grammar bitmask and the
// sparse logit adjustments (bias, stop-token bans, penalties of seen tokens), filled by the engine
// while the forward pass runs; the sampled tokens and logprobs come back. Plain data, no devices;
// a batch is filled by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dinfer {

// Vocabularies up to this size can be sampled on the device.
inline constexpr int64_t kMaxDeviceSampleVocab = int64_t{1} << 19;

struct DeviceSampleRow {
  double temperature = 1.0;  // <= 0: greedy
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  uint64_t seed = 0;
  uint64_t step = 0;  // the draw's random step (sample::UniformDraw(seed, step))
  int32_t top_k = 0;
  int32_t logprobs = -1;
  // Offset of the row's bitmask in DeviceSampleBatch::masks (words), or -1; tokens at or past
  // mask_vocab are not allowed.
  int64_t mask_offset = -1;
  int32_t mask_vocab = 0;
  int32_t adjust_begin = 0, adjust_end = 0;  // the row's entries of DeviceSampleBatch::adjustments
};

// One token's logit change: biases[bias_begin, bias_end) added in order, -inf if `ban`, then if
// `seen` the repetition penalty and, with count > 0, the presence and frequency penalties.
struct DeviceTokenAdjust {
  int32_t token = 0;
  int32_t count = 0;
  uint32_t bias_begin = 0, bias_end = 0;
  bool seen = false;
  bool ban = false;
};

struct DeviceSampleBatch {
  std::vector<DeviceSampleRow> rows;  // one per logits row, in order
  std::vector<uint32_t> masks;
  std::vector<DeviceTokenAdjust> adjustments;
  std::vector<float> biases;
  void Clear() {
    rows.clear();
    masks.clear();
    adjustments.clear();
    biases.clear();
  }
};

struct DeviceSampleOutput {
  static constexpr int kTopStride = 20;  // top entries per row
  std::span<const int32_t> tokens;       // one per row
  // Rows with logprobs >= 0 only: the chosen token's logprob, and per row kTopStride entries,
  // the most likely tokens (by logit, descending; -1 past the row's count).
  std::span<const float> logprobs;
  std::span<const int32_t> top_tokens;
  std::span<const float> top_logprobs;
};

}  // namespace dinfer
