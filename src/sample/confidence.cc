#include "sample/confidence.h"

#include <cmath>

namespace dinfer::sample {

TopToken ArgmaxProbability(std::span<const float> logits) {
  TopToken top;
  if (logits.empty()) return top;
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  top.token = static_cast<int32_t>(best);
  const float max = logits[best];
  if (std::isinf(max) && max < 0) {
    top.probability = 1.0f;
    return top;
  }
  // exp(l - max) <= 1 never overflows; the argmax itself adds exactly 1.
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max));
  top.probability = static_cast<float>(1.0 / sum);
  return top;
}

}  // namespace dinfer::sample
