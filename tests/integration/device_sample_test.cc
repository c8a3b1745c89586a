// The rows the engine hands to sampling on the device (AppendDeviceSampleRow): their sparse
// adjustments, applied as DeviceTokenAdjust documents, give bit for bit the logits the CPU
// sampler's ProcessLogits gives, and each row claims the sampler's next random step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/device_sample.h"

namespace dinfer {
namespace {

// DeviceTokenAdjust's definition, as the kernel applies it.
void Apply(const DeviceSampleBatch& b, const DeviceSampleRow& r, std::vector<float>& logits) {
  for (int32_t j = r.adjust_begin; j < r.adjust_end; ++j) {
    const DeviceTokenAdjust& a = b.adjustments[j];
    float l = logits[a.token];
    for (uint32_t k = a.bias_begin; k < a.bias_end; ++k) l += b.biases[k];
    if (a.ban) l = -INFINITY;
    if (a.seen) {
      double d = l;
      if (r.repetition_penalty != 1.0) {
        d = d > 0 ? d / r.repetition_penalty : d * r.repetition_penalty;
      }
      if (a.count > 0) d -= r.presence_penalty + r.frequency_penalty * a.count;
      l = static_cast<float>(d);
    }
    logits[a.token] = l;
  }
}

TEST(DeviceSample, AdjustmentsEqualProcessLogits) {
  constexpr int kVocab = 300;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  DeviceSampleBatch batch;
  for (int trial = 0; trial < 200; ++trial) {
    sample::SamplingParams p;
    p.temperature = trial % 3 == 0 ? 0.0 : 0.9;
    p.seed = rng();
    p.repetition_penalty = trial % 4 == 0 ? 1.0 : 1.0 + (rng() % 10) * 0.05;
    p.presence_penalty = (static_cast<int>(rng() % 9) - 4) * 0.5;
    p.frequency_penalty = (static_cast<int>(rng() % 9) - 4) * 0.25;
    for (int i = 0, n = static_cast<int>(rng() % 6); i < n; ++i) {
      p.logit_bias.emplace_back(static_cast<int32_t>(rng() % kVocab), nd(rng));
    }
    if (!p.logit_bias.empty() && trial % 2 == 0) p.logit_bias.push_back(p.logit_bias[0]);
    p.min_tokens = static_cast<int32_t>(rng() % 4);
    p.stop_token_ids = {static_cast<int32_t>(rng() % kVocab), 2};
    sample::Sampler s(p);
    std::vector<int32_t> prompt(rng() % 40);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % kVocab);
    s.SetPrompt(prompt);
    for (int i = 0, n = static_cast<int>(rng() % 6); i < n; ++i) {
      s.Accept(static_cast<int32_t>(rng() % 20));
    }
    const uint64_t step = s.steps();

    std::vector<float> logits(kVocab);
    for (auto& x : logits) x = nd(rng);
    std::vector<float> want = logits;
    s.ProcessLogits(want);
    AppendDeviceSampleRow(s, batch);
    const DeviceSampleRow& r = batch.rows.back();
    EXPECT_EQ(r.step, step);
    EXPECT_EQ(s.steps(), step + 1);
    EXPECT_EQ(r.seed, p.seed);
    EXPECT_EQ(r.mask_offset, -1);
    std::vector<float> got = logits;
    Apply(batch, r, got);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * kVocab)) << trial;
  }
}

}  // namespace
}  // namespace dinfer
