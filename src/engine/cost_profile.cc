#include "engine/cost_profile.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>
#include <random>

#include <time.h>

#include <boost/json.hpp>

#include "base/logging.h"
#include "base/mapped_file.h"

namespace dinfer {

StatusOr<std::vector<sched::StepSample>> MeasureSteps(ModelRunner& runner,
                                                      const ProfileOptions& o) {
  const int64_t vocab = runner.model().config().vocab_size;
  // Every block of every KV group, in order; the sequence fits in the smallest group.
  const std::vector<KvGroup>& groups = runner.kv_groups();
  std::vector<std::vector<int32_t>> tables(groups.size());
  int64_t capacity = runner.num_blocks() * runner.block_size();
  for (size_t g = 0; g < groups.size(); ++g) {
    const int64_t blocks = runner.group_num_blocks(static_cast<int64_t>(g));
    tables[g].resize(static_cast<size_t>(blocks));
    std::iota(tables[g].begin(), tables[g].end(), 0);
    capacity = std::min(capacity, blocks * groups[g].block_size);
  }
  const std::vector<int32_t>& table = tables[0];
  std::vector<std::span<const int32_t>> other_tables(tables.begin() + 1, tables.end());
  std::mt19937 rng(1);
  std::vector<sched::StepSample> samples;
  auto now = [&o] {
    if (o.thread_cpu_time) {
      timespec ts;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  // Each pass walks the whole grid, so a point's runs are spread over the profile's duration
  // rather than bunched into one moment a neighbour may have slowed down.
  std::vector<std::pair<int64_t, int64_t>> points;  // (q, c)
  for (int64_t c : o.context) {
    for (int64_t q : o.new_tokens) {
      if (c + q <= capacity) points.emplace_back(q, c);
    }
  }
  for (const auto& [q, c] : o.extra_points) {
    if (c + q <= capacity) points.emplace_back(q, c);
  }
  std::vector<std::vector<double>> times(points.size());
  for (int pass = 0; pass < std::max(1, o.passes); ++pass) {
    for (size_t i = 0; i < points.size(); ++i) {
      const auto [q, c] = points[i];
      std::vector<int32_t> tokens(static_cast<size_t>(c + q));
      for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
      if (c > 0) {  // the cached context, written once a pass
        SeqChunk ctx{std::span<const int32_t>(tokens).first(c), 0, table, SeqChunk::Logits::kNone,
                     other_tables};
        DINFER_RETURN_IF_ERROR(runner.Execute(std::span(&ctx, 1)).status());
      }
      SeqChunk chunk{std::span<const int32_t>(tokens).subspan(c), c, table, SeqChunk::Logits::kLast,
                     other_tables};
      DINFER_RETURN_IF_ERROR(runner.Execute(std::span(&chunk, 1)).status());  // warm-up
      for (int r = 0; r < std::max(1, o.repetitions); ++r) {
        const double t0 = now();
        DINFER_RETURN_IF_ERROR(runner.Execute(std::span(&chunk, 1)).status());
        times[i].push_back(now() - t0);
      }
    }
  }
  for (size_t i = 0; i < points.size(); ++i) {
    std::vector<double>& t = times[i];
    const size_t keep = o.fastest ? 0 : t.size() / 2;
    std::nth_element(t.begin(), t.begin() + static_cast<int64_t>(keep), t.end());
    samples.push_back(
        {static_cast<double>(points[i].first), static_cast<double>(points[i].second), t[keep]});
  }
  return samples;
}

StatusOr<sched::CostModel> ProfileCostModel(ModelRunner& runner, const ProfileOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  DINFER_ASSIGN_OR_RETURN(auto samples, MeasureSteps(runner, o));
  DINFER_ASSIGN_OR_RETURN(sched::CostModel model, sched::CostModel::Fit(samples));
  const auto& k = model.coefficients();
  log::Info(
      "step cost model from {} timings in {:.1f} s: t = {:.3g} + {:.3g}·q + {:.3g}·q·c + {:.3g}·q² "
      "s",
      samples.size(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), k[0], k[1],
      k[2], k[3]);
  return model;
}

Status SaveCostModel(const sched::CostModel& model, const std::string& path) {
  const auto& k = model.coefficients();
  const auto& s = model.small_step_coefficients();
  boost::json::object o{{"model", "t = a + b*q + d*q*c + e*q^2 (seconds); small_* for q <= 8"},
                        {"a", k[0]},
                        {"b", k[1]},
                        {"d", k[2]},
                        {"e", k[3]},
                        {"small_a", s[0]},
                        {"small_b", s[1]},
                        {"small_d", s[2]},
                        {"small_e", s[3]}};
  std::ofstream f(path);
  f << boost::json::serialize(o) << "\n";
  if (!f) return IoError("cannot write the cost profile '{}'", path);
  return OkStatus();
}

StatusOr<sched::CostModel> LoadCostModel(const std::string& path) {
  DINFER_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  boost::json::error_code ec;
  const boost::json::value v = boost::json::parse(text, ec);
  if (ec || !v.is_object()) return DataLoss("'{}' is not a cost profile (JSON object)", path);
  std::array<double, 4> k{};
  const char* keys[] = {"a", "b", "d", "e"};
  for (int i = 0; i < 4; ++i) {
    const auto* x = v.as_object().if_contains(keys[i]);
    if (x == nullptr || !x->is_number()) {
      return DataLoss("cost profile '{}' lacks the number '{}'", path, keys[i]);
    }
    k[i] = x->to_number<double>();
  }
  std::array<double, 4> small = k;
  const char* small_keys[] = {"small_a", "small_b", "small_d", "small_e"};
  for (int i = 0; i < 4; ++i) {
    const auto* x = v.as_object().if_contains(small_keys[i]);
    if (x != nullptr && x->is_number()) small[i] = x->to_number<double>();
  }
  return sched::CostModel(k, small);
}

}  // namespace dinfer
