// Kernel timelines of replayed steps (builds with DINFER_KERNEL_TRACE; see
// src/kernels/cuda/trace.h): runs `step` a few times with the instrumented kernels recording,
// writes every CTA's record of the last step as CSV, and summarises that step by launch and by
// kernel: when the launch's first CTA started, when its CTAs' waits for the kernel before
// returned, when they ended, and so how much of the step each kernel held the critical path.
#pragma once

#include <functional>
#include <string>

#include <boost/json.hpp>

#include "backend/cuda/stream.h"
#include "base/status.h"

namespace dinfer::bench {

StatusOr<boost::json::object> TraceSteps(const cuda::Stream& stream,
                                         const std::function<Status()>& step,
                                         const std::string& csv_path);

}  // namespace dinfer::bench
