// CostModel: predicted step time as a quadratic function of the new tokens q and the cached
// context c they attend to, fitted by least squares from measured steps:
//   t(q, c) = a + b·q + d·q·c + e·q²
// (linear layers cost ∝ q; attention ∝ q·c for cached keys and ∝ q² among the new tokens).
// Pure value type.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"

namespace dinfer::sched {

struct StepSample {
  double q = 0, c = 0, seconds = 0;
};

class CostModel {
 public:
  CostModel() = default;
  explicit CostModel(std::array<double, 4> coef) : coef_(coef) {}
  static StatusOr<CostModel> Fit(std::span<const StepSample> samples);

  double Predict(double q, double c) const;
  // What a chunk of q tokens over c cached tokens adds to a step: b·q + d·q·c + e·q².
  double Marginal(double q, double c) const;
  double fixed() const { return coef_[0]; }
  // Largest q in [0, max_q] with Marginal(q, c) <= seconds.
  int64_t MaxTokens(double seconds, double c, int64_t max_q) const;
  const std::array<double, 4>& coefficients() const { return coef_; }

 private:
  std::array<double, 4> coef_{};  // a, b, d, e
};

}  // namespace dinfer::sched
