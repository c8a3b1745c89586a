// How sure a distribution is of its most likely token: the argmax of a logits row and its softmax
// probability, which speculative decoding takes as a draft's confidence (the chance that
// verification accepts it, for a calibrated draft). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>

namespace dinfer::sample {

struct TopToken {
  int32_t token = -1;        // the first of the largest logits (-1 for an empty row)
  float probability = 0.0f;  // its softmax probability, in (0, 1]
};

// Two passes over the row: one for the largest logit, one for the sum of exp(l - max), whose
// inverse is the argmax's probability. -inf logits count as probability 0; a row of -inf only
// gives its first token with probability 1.
TopToken ArgmaxProbability(std::span<const float> logits);

}  // namespace dinfer::sample
