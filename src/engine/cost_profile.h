// Fitting the scheduler's step cost model cost(q, c) from timings of the real model: forward
// passes of q new tokens over c cached tokens on the engine's runner, at start-up, before any
// request holds KV blocks. Profiles save to and load from JSON so later starts can skip it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runner/model_runner.h"
#include "sched/cost_model.h"

namespace dinfer {

struct ProfileOptions {
  std::vector<int64_t> new_tokens = {1, 8, 32, 128, 256};
  std::vector<int64_t> context = {0, 256, 1024};
  // More (q, c) points, measured after the grid's in every pass (held-out points of a test, say,
  // timed under the same conditions as the grid).
  std::vector<std::pair<int64_t, int64_t>> extra_points;
  int repetitions = 3;  // per pass; the median of all is kept (the fastest with `fastest`)
  int passes = 1;       // walks over the whole grid
  // Keep the fastest repetition instead of the median: on a shared machine other tenants only
  // ever add time (memory bandwidth, caches, a sibling hyper-thread), even to a thread's CPU
  // clock, so the fastest run is the best estimate of the step's own cost.
  bool fastest = false;
  // Time with the calling thread's CPU clock instead of the wall clock. Only for single-threaded
  // runners (all work runs on the calling thread): it leaves out time other processes take the
  // core, so profiles measured on a shared machine stay comparable.
  bool thread_cpu_time = false;
};

// Measures every (q, c) of the grid that fits the runner's KV cache; returns the samples.
StatusOr<std::vector<sched::StepSample>> MeasureSteps(ModelRunner& runner,
                                                      const ProfileOptions& options);
StatusOr<sched::CostModel> ProfileCostModel(ModelRunner& runner, const ProfileOptions& options);

Status SaveCostModel(const sched::CostModel& model, const std::string& path);
StatusOr<sched::CostModel> LoadCostModel(const std::string& path);

}  // namespace dinfer
