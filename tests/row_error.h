// Comparing a row of logits with its reference: the largest absolute difference relative to the
// reference's largest magnitude (infinite where the row holds a NaN or an infinity). Shared by the
// tests that match logits against transformers, the CPU backend or a full recomputation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dinfer {

inline double RowRelError(const float* got, const float* want, int64_t n) {
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(double{got[i]} - want[i]));
    max_ref = std::max(max_ref, std::fabs(double{want[i]}));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

}  // namespace dinfer
