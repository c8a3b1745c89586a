#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "sample/sampler.h"

namespace dinfer::sample {
namespace {

constexpr int64_t kVocab = 1000;

TEST(ValidateSamplingParams, DefaultsAndBoundariesAreValid) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams{}, kVocab).ok());
  SamplingParams p;
  p.temperature = 0.0;
  p.top_p = 1.0;
  p.top_k = 0;
  p.min_p = 1.0;
  p.repetition_penalty = 0.01;
  p.presence_penalty = -2.0;
  p.frequency_penalty = 2.0;
  p.logprobs = 20;
  p.min_tokens = 3;
  p.logit_bias = {{0, -100.0f}, {kVocab - 1, 100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p, kVocab).ok());
  p.logprobs = 0;
  EXPECT_TRUE(ValidateSamplingParams(p, kVocab).ok());
}

struct BadCase {
  std::function<void(SamplingParams&)> set;
  std::string message;
};

TEST(ValidateSamplingParams, RejectsEachBadFieldWithAClearMessage) {
  const std::vector<BadCase> cases = {
      {[](SamplingParams& p) { p.temperature = -0.5; },
       "temperature must be >= 0 (0 is greedy), got -0.5"},
      {[](SamplingParams& p) { p.temperature = NAN; }, "temperature must be >= 0"},
      {[](SamplingParams& p) { p.top_p = 0.0; }, "top_p must be in (0, 1] (1 disables it), got 0"},
      {[](SamplingParams& p) { p.top_p = 1.5; }, "top_p must be in (0, 1]"},
      {[](SamplingParams& p) { p.top_k = -1; }, "top_k must be >= 0 (0 disables it), got -1"},
      {[](SamplingParams& p) { p.min_p = -0.1; }, "min_p must be in [0, 1]"},
      {[](SamplingParams& p) { p.min_p = 1.1; },
       "min_p must be in [0, 1] (0 disables it), got 1.1"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0; },
       "repetition_penalty must be finite and > 0 (1 disables it), got 0"},
      {[](SamplingParams& p) { p.repetition_penalty = -1.0; }, "repetition_penalty must be"},
      {[](SamplingParams& p) { p.repetition_penalty = INFINITY; }, "repetition_penalty must be"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5; },
       "presence_penalty must be in [-2, 2], got 2.5"},
      {[](SamplingParams& p) { p.frequency_penalty = -3.0; },
       "frequency_penalty must be in [-2, 2], got -3"},
      {[](SamplingParams& p) { p.logprobs = 21; },
       "logprobs must be in [0, 20] (or -1 for none), got 21"},
      {[](SamplingParams& p) { p.logprobs = -2; }, "logprobs must be in [0, 20]"},
      {[](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens must be >= 0, got -1"},
      {[](SamplingParams& p) {
         p.logit_bias = {{kVocab, 1.0f}};
       },
       "logit_bias token id 1000 is outside the vocabulary [0, 1000)"},
      {[](SamplingParams& p) {
         p.logit_bias = {{-1, 1.0f}};
       },
       "logit_bias token id -1 is outside the vocabulary"},
      {[](SamplingParams& p) {
         p.logit_bias = {{5, 1.0f}, {6, 100.5f}};
       },
       "logit_bias for token 6 must be in [-100, 100], got 100.5"},
      {[](SamplingParams& p) {
         p.logit_bias = {{5, NAN}};
       },
       "logit_bias for token 5 must be in [-100, 100]"},
  };
  for (const auto& c : cases) {
    SamplingParams p;
    c.set(p);
    const Status s = ValidateSamplingParams(p, kVocab);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(s.message().find(c.message), std::string::npos)
        << "got \"" << s.message() << "\", want it to contain \"" << c.message << "\"";
  }
}

}  // namespace
}  // namespace dinfer::sample
