// Server metrics in the Prometheus text format (names prefixed dinfer_): requests by endpoint
// and status, token counters, latency histograms (TTFT, time per output token, end to end), and
// the engine's gauges (running/waiting requests, KV usage, prefix-cache hits). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dinfer/engine.h"

namespace dinfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void Observe(double v);
  // The histogram's lines (_bucket, _sum, _count) for metric `name`.
  void Render(std::string_view name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void RecordRequest(std::string_view endpoint, unsigned status);
  void AddTokens(int64_t prompt, int64_t cached, int64_t generated);
  void ObserveTimeToFirstToken(double seconds);
  // Called once per output delta with the gap since the previous one, over its tokens.
  void ObserveTimePerOutputToken(double seconds, int64_t tokens);
  void ObserveRequestLatency(double seconds);
  // `stats` is null while the model is loading.
  std::string Render(const EngineStatsSnapshot* stats, int64_t http_in_flight) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, unsigned>, uint64_t> requests_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace dinfer::server
