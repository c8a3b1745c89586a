#include "bench/gpu/trace_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "backend/cuda/memory.h"
#include "kernels/cuda/trace.h"

namespace dinfer::bench {
namespace {

namespace json = boost::json;
namespace kc = kernels::cuda;

// One launch's CTAs (consecutive records of one kernel id by start time: a dependent launch's
// CTAs start only after every CTA of the launch before it has started).
struct Launch {
  uint32_t kernel = 0, grid = 0;
  std::vector<const kc::TraceRecord*> ctas;
};

double Us(uint64_t ns, uint64_t origin) { return (static_cast<double>(ns) - origin) / 1e3; }

template <typename F>
double Quantile(const std::vector<const kc::TraceRecord*>& v, double q, F&& key) {
  std::vector<uint64_t> x;
  x.reserve(v.size());
  for (const auto* r : v) x.push_back(key(*r));
  std::sort(x.begin(), x.end());
  return static_cast<double>(x[std::min(x.size() - 1, static_cast<size_t>(q * x.size()))]);
}

}  // namespace

StatusOr<json::object> TraceSteps(const cuda::Stream& stream, const std::function<Status()>& step,
                                  const std::string& csv_path) {
  if (!kc::TraceBuilt()) {
    return InvalidArgument("kernel traces need a build with -DDINFER_KERNEL_TRACE=ON");
  }
  constexpr uint32_t kCapacity = 1u << 20;
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer records,
                          cuda::DeviceBuffer::Allocate(kCapacity * sizeof(kc::TraceRecord)));
  DINFER_ASSIGN_OR_RETURN(cuda::DeviceBuffer count, cuda::DeviceBuffer::Allocate(4));
  const kc::TraceSink sink{static_cast<kc::TraceRecord*>(records.data()),
                           static_cast<uint32_t*>(count.data()), kCapacity};
  constexpr int kSteps = 3;  // the last one is reported (the ones before warm the caches alike)
  uint32_t n = 0;
  for (int i = 0; i < kSteps; ++i) {
    const uint32_t zero = 0;
    DINFER_RETURN_IF_ERROR(stream.Synchronize());
    DINFER_RETURN_IF_ERROR(count.CopyFromHost(&zero, 4));
    if (const int err = kc::TraceAttach(sink); err != 0) {
      return Internal("TraceAttach failed: error {}", err);
    }
    DINFER_RETURN_IF_ERROR(step());
    DINFER_RETURN_IF_ERROR(stream.Synchronize());
    if (const int err = kc::TraceAttach(kc::TraceSink{}); err != 0) {
      return Internal("TraceAttach failed: error {}", err);
    }
    DINFER_RETURN_IF_ERROR(count.CopyToHost(&n, 4));
  }
  if (n > kCapacity) return Internal("the trace buffer is too small for one step");
  std::vector<kc::TraceRecord> recs(n);
  DINFER_RETURN_IF_ERROR(records.CopyToHost(recs.data(), n * sizeof(kc::TraceRecord)));
  std::sort(recs.begin(), recs.end(), [](const auto& a, const auto& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.block < b.block;
  });
  if (recs.empty()) return Internal("no kernel recorded a trace");
  const uint64_t origin = recs.front().start_ns;

  if (FILE* f = std::fopen(csv_path.c_str(), "w")) {
    std::fprintf(f, "kernel,block,grid,sm,start_us,waited_us,mark_us,mark2_us,end_us\n");
    for (const auto& r : recs) {
      std::fprintf(f, "%s,%u,%u,%u,%.3f,%.3f,%.3f,%.3f,%.3f\n", kc::TraceKernelName(r.kernel),
                   r.block, r.grid, r.sm, Us(r.start_ns, origin), Us(r.waited_ns, origin),
                   Us(r.mark_ns, origin), Us(r.mark2_ns, origin), Us(r.end_ns, origin));
    }
    std::fclose(f);
  } else {
    return IoError("cannot write {}", csv_path);
  }

  std::vector<Launch> launches;
  for (const auto& r : recs) {
    if (launches.empty() || launches.back().kernel != r.kernel ||
        launches.back().ctas.size() >= launches.back().grid) {
      launches.push_back(Launch{r.kernel, r.grid, {}});
    }
    launches.back().ctas.push_back(&r);
  }
  // Per launch: its first CTA's start, the median and last wait return, the median and last end
  // (µs from the step's first record); `held` is how far it moved the step's last end forward,
  // `gap` the time from the launch before's last end to this one's first wait return.
  struct Agg {
    int launches = 0;
    double held = 0, active = 0, to_mark = 0, to_mark2 = 0, gap = 0, tail = 0, wait_spread = 0;
  };
  std::map<std::string, Agg> by_kernel;
  json::array rows;
  double prev_end = 0;
  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    auto start = [](const kc::TraceRecord& r) { return r.start_ns; };
    auto waited = [](const kc::TraceRecord& r) { return r.waited_ns; };
    auto end = [](const kc::TraceRecord& r) { return r.end_ns; };
    auto mark = [](const kc::TraceRecord& r) { return r.mark_ns; };
    auto mark2 = [](const kc::TraceRecord& r) { return r.mark2_ns; };
    const double o = static_cast<double>(origin);
    const double first_start = (Quantile(l.ctas, 0, start) - o) / 1e3;
    const double wait_min = (Quantile(l.ctas, 0, waited) - o) / 1e3;
    const double wait_med = (Quantile(l.ctas, 0.5, waited) - o) / 1e3;
    const double wait_max = (Quantile(l.ctas, 1, waited) - o) / 1e3;
    const double mark_med = (Quantile(l.ctas, 0.5, mark) - o) / 1e3;
    const double mark2_med = (Quantile(l.ctas, 0.5, mark2) - o) / 1e3;
    const double end_med = (Quantile(l.ctas, 0.5, end) - o) / 1e3;
    const double end_max = (Quantile(l.ctas, 1, end) - o) / 1e3;
    const double held = std::max(0.0, end_max - prev_end);
    const double gap = i == 0 ? 0.0 : wait_min - prev_end;
    rows.push_back(json::object{{"kernel", kc::TraceKernelName(l.kernel)},
                                {"ctas", static_cast<int64_t>(l.ctas.size())},
                                {"first_start_us", first_start},
                                {"wait_min_us", wait_min},
                                {"wait_median_us", wait_med},
                                {"wait_max_us", wait_max},
                                {"mark_median_us", mark_med},
                                {"mark2_median_us", mark2_med},
                                {"end_median_us", end_med},
                                {"end_max_us", end_max}});
    Agg& a = by_kernel[kc::TraceKernelName(l.kernel)];
    ++a.launches;
    a.held += held;
    a.active += end_med - wait_med;
    a.to_mark += mark_med - wait_med;
    a.to_mark2 += mark2_med - wait_med;
    a.gap += gap;
    a.tail += end_max - end_med;
    a.wait_spread += wait_max - wait_min;
    prev_end = std::max(prev_end, end_max);
  }
  json::object kernels;
  for (const auto& [name, a] : by_kernel) {
    kernels[name] = json::object{{"launches", a.launches},
                                 {"held_us_total", a.held},
                                 {"held_us_mean", a.held / a.launches},
                                 {"active_us_mean", a.active / a.launches},
                                 {"wait_to_mark_us_mean", a.to_mark / a.launches},
                                 {"wait_to_mark2_us_mean", a.to_mark2 / a.launches},
                                 {"gap_us_mean", a.gap / a.launches},
                                 {"tail_us_mean", a.tail / a.launches},
                                 {"wait_spread_us_mean", a.wait_spread / a.launches}};
    std::printf(
        "trace %-22s %3d launches: held %7.1f us (%5.2f each), active %5.2f (marks at "
        "%5.2f, %5.2f), gap %5.2f, tail %5.2f, wait spread %5.2f\n",
        name.c_str(), a.launches, a.held, a.held / a.launches, a.active / a.launches,
        a.to_mark / a.launches, a.to_mark2 / a.launches, a.gap / a.launches, a.tail / a.launches,
        a.wait_spread / a.launches);
  }
  std::printf("trace: %zu launches, %u CTAs, first start to last end %.1f us (%s)\n",
              launches.size(), n, prev_end, csv_path.c_str());
  return json::object{{"span_us", prev_end},
                      {"records", static_cast<int64_t>(n)},
                      {"csv", csv_path},
                      {"kernels", std::move(kernels)},
                      {"launches", std::move(rows)}};
}

}  // namespace dinfer::bench
