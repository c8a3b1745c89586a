#include "sched/cost_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace dinfer::sched {

namespace {

StatusOr<std::array<double, 4>> FitOne(std::span<const StepSample> samples);

}  // namespace

StatusOr<CostModel> CostModel::Fit(std::span<const StepSample> samples) {
  std::vector<StepSample> small, large;
  for (const auto& s : samples) (s.q <= kSmallSteps ? small : large).push_back(s);
  auto all = FitOne(samples);
  if (!all.ok()) return all.status();
  auto fit_small = FitOne(small);
  auto fit_large = FitOne(large);
  return CostModel(fit_large.ok() ? *fit_large : *all, fit_small.ok() ? *fit_small : *all);
}

namespace {

StatusOr<std::array<double, 4>> FitOne(std::span<const StepSample> samples) {
  if (samples.size() < 4) return InvalidArgument("cost model: need at least 4 samples");
  // Normal equations of the least-squares fit over features (1, q, q·c, q²), relative error
  // weighting (1/t²) so short decode steps count as much as long prompts.
  double ata[4][5] = {};
  for (const auto& s : samples) {
    if (s.seconds <= 0) return InvalidArgument("cost model: non-positive step time");
    const double f[4] = {1.0, s.q, s.q * s.c, s.q * s.q};
    const double w = 1.0 / (s.seconds * s.seconds);
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) ata[i][j] += w * f[i] * f[j];
      ata[i][4] += w * f[i] * s.seconds;
    }
  }
  // Gaussian elimination with partial pivoting; a singular system means the samples do not
  // vary enough (e.g. all with the same q).
  for (int col = 0; col < 4; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 4; ++r) {
      if (std::fabs(ata[r][col]) > std::fabs(ata[pivot][col])) pivot = r;
    }
    if (std::fabs(ata[pivot][col]) < 1e-300) {
      return InvalidArgument("cost model: samples do not determine the fit (vary q and c)");
    }
    std::swap(ata[col], ata[pivot]);
    for (int r = 0; r < 4; ++r) {
      if (r == col) continue;
      const double f = ata[r][col] / ata[col][col];
      for (int k = col; k < 5; ++k) ata[r][k] -= f * ata[col][k];
    }
  }
  std::array<double, 4> coef{};
  for (int i = 0; i < 4; ++i) coef[i] = ata[i][4] / ata[i][i];
  return coef;
}

}  // namespace

double CostModel::Predict(double q, double c) const { return coef_[0] + Marginal(q, c); }

double CostModel::Marginal(double q, double c) const {
  const auto& k = q <= kSmallSteps ? small_ : coef_;
  // Measured from the large-step intercept, so that Predict = fixed() + Marginal for every q.
  return k[0] - coef_[0] + k[1] * q + k[2] * q * c + k[3] * q * q;
}

int64_t CostModel::MaxTokens(double seconds, double c, int64_t max_q) const {
  if (max_q <= 0 || Marginal(1, c) > seconds) return 0;
  if (Marginal(static_cast<double>(max_q), c) <= seconds) return max_q;
  // Marginal is increasing in q for the fitted (non-negative slope) region: bisect.
  int64_t lo = 1, hi = max_q;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (Marginal(static_cast<double>(mid), c) <= seconds) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace dinfer::sched
