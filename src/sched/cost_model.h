// CostModel: predicted step time as a quadratic function of the new tokens q and the cached
// context c they attend to, fitted by least squares from measured steps:
//   t(q, c) = a + b·q + d·q·c + e·q²
// (linear layers cost ∝ q; attention ∝ q·c for cached keys and ∝ q² among the new tokens).
// Decode-shaped steps (q <= kSmallSteps) run different matrix kernels than prompt chunks, so the
// fit keeps one set of coefficients for each regime when the samples cover both.
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
  static constexpr double kSmallSteps = 8;

  CostModel() = default;
  explicit CostModel(std::array<double, 4> coef) : coef_(coef), small_(coef) {}
  CostModel(std::array<double, 4> large, std::array<double, 4> small)
      : coef_(large), small_(small) {}
  static StatusOr<CostModel> Fit(std::span<const StepSample> samples);

  double Predict(double q, double c) const;
  // What a chunk of q tokens over c cached tokens adds to a step: b·q + d·q·c + e·q².
  double Marginal(double q, double c) const;
  double fixed() const { return coef_[0]; }
  const std::array<double, 4>& small_step_coefficients() const { return small_; }
  // Largest q in [0, max_q] with Marginal(q, c) <= seconds.
  int64_t MaxTokens(double seconds, double c, int64_t max_q) const;
  const std::array<double, 4>& coefficients() const { return coef_; }

 private:
  std::array<double, 4> coef_{};   // a, b, d, e for q > kSmallSteps
  std::array<double, 4> small_{};  // the same for q <= kSmallSteps
};

}  // namespace dinfer::sched
