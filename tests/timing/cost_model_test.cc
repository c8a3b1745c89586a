// The step cost model fitted from timings of the default model predicts held-out step times on
// the CPU backend within 15% (both the fastest of 6 runs in 3 passes over the grid: the step's
// own cost, without what other tenants of a shared machine add).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/cost_profile.h"
#include "model/loader.h"

namespace dinfer {
namespace {

TEST(CostModel, PredictsMeasuredStepTimesWithin15Percent) {
  auto lm = LoadModel("default", LoadOptions{false, false});
  ASSERT_TRUE(lm.ok()) << lm.status().ToString();
  RunnerOptions ro;
  ro.threads = 1;
  ro.max_seq_len = 1536;
  ModelRunner runner(*lm->model, ro);
  ProfileOptions fit;
  fit.new_tokens = {1, 2, 8, 16, 64, 128};
  fit.context = {0, 256, 512};
  fit.repetitions = 2;
  fit.passes = 3;
  fit.thread_cpu_time = true;  // one thread: other processes on the machine do not count
  fit.fastest = true;          // and what they slow down is left out too
  auto model = ProfileCostModel(runner, fit);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ProfileOptions held_out;
  held_out.new_tokens = {4, 32, 96};
  held_out.context = {128, 384};
  held_out.repetitions = 2;
  held_out.passes = 3;
  held_out.thread_cpu_time = true;
  held_out.fastest = true;
  auto samples = MeasureSteps(runner, held_out);
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  for (const auto& s : *samples) {
    const double predicted = model->Predict(s.q, s.c);
    const double err = std::fabs(predicted - s.seconds) / s.seconds;
    std::printf("q=%4.0f c=%5.0f measured %8.2f ms predicted %8.2f ms (%+.1f%%)\n", s.q, s.c,
                1e3 * s.seconds, 1e3 * predicted, 100 * (predicted - s.seconds) / s.seconds);
    EXPECT_LE(err, 0.15) << "q=" << s.q << " c=" << s.c;
  }
}

}  // namespace
}  // namespace dinfer
