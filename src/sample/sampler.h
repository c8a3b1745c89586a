// Token sampling from a logits row: greedy, temperature, top-k, top-p, min-p, with a per-request
// random stream that depends only on the seed and the number of tokens drawn so far, so a seeded
// request gives the same tokens wherever and whenever it runs. A Sampler is owned by one request;
// not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dinfer::sample {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: off
  double top_p = 1.0;        // 1: off
  double min_p = 0.0;        // 0: off
  uint64_t seed = 0;
};

// Counter-based generator (SplitMix64 over (seed, step)): the draw for step i is a pure function
// of (seed, i).
double UniformDraw(uint64_t seed, uint64_t step);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params) {}
  // Picks the next token from logits (one row of vocab_size floats).
  int32_t Sample(std::span<const float> logits);
  uint64_t steps() const { return steps_; }

 private:
  SamplingParams params_;
  uint64_t steps_ = 0;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest logit; the lowest index wins ties.
int32_t Argmax(std::span<const float> logits);

}  // namespace dinfer::sample
