#include "server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace dinfer::server {

void Histogram::Observe(double v) {
  const size_t b =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[b];
  sum_ += v;
  ++count_;
}

void Histogram::Render(std::string_view name, std::string& out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
      tpot_({0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
             0.4, 0.5, 0.75, 1.0, 2.5}),
      e2e_({0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0}) {}

void Metrics::RecordRequest(std::string_view endpoint, unsigned status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{std::string(endpoint), status}];
}

void Metrics::AddTokens(int64_t prompt, int64_t cached, int64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  cached_tokens_ += cached;
  generation_tokens_ += generated;
}

void Metrics::ObserveTimeToFirstToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void Metrics::ObserveTimePerOutputToken(double seconds, int64_t tokens) {
  if (tokens <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  // Tokens that arrive together shared the gap.
  const double per_token = seconds / static_cast<double>(tokens);
  for (int64_t i = 0; i < tokens; ++i) tpot_.Observe(per_token);
}

void Metrics::ObserveRequestLatency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  e2e_.Observe(seconds);
}

std::string Metrics::Render(const EngineStatsSnapshot* stats, int64_t http_in_flight) const {
  std::string out;
  auto header = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  std::lock_guard<std::mutex> lock(mu_);
  header("dinfer_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [key, n] : requests_) {
    out += fmt::format("dinfer_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                       key.second, n);
  }
  header("dinfer_http_requests_in_flight", "gauge",
         "HTTP requests whose response is not complete.");
  out += fmt::format("dinfer_http_requests_in_flight {}\n", http_in_flight);
  header("dinfer_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  out += fmt::format("dinfer_prompt_tokens_total {}\n", prompt_tokens_);
  header("dinfer_cached_prompt_tokens_total", "counter",
         "Prompt tokens of finished requests found in the prefix cache.");
  out += fmt::format("dinfer_cached_prompt_tokens_total {}\n", cached_tokens_);
  header("dinfer_generation_tokens_total", "counter", "Generated tokens.");
  out += fmt::format("dinfer_generation_tokens_total {}\n", generation_tokens_);
  header("dinfer_time_to_first_token_seconds", "histogram",
         "From request arrival to its first generated token.");
  ttft_.Render("dinfer_time_to_first_token_seconds", out);
  header("dinfer_time_per_output_token_seconds", "histogram",
         "Time between consecutive generated tokens of a request.");
  tpot_.Render("dinfer_time_per_output_token_seconds", out);
  header("dinfer_e2e_request_latency_seconds", "histogram",
         "From request arrival to its last generated token.");
  e2e_.Render("dinfer_e2e_request_latency_seconds", out);
  header("dinfer_model_loaded", "gauge", "1 once the model is loaded and requests are served.");
  out += fmt::format("dinfer_model_loaded {}\n", stats != nullptr ? 1 : 0);
  if (stats == nullptr) return out;
  header("dinfer_requests_running", "gauge", "Requests the engine is running.");
  out += fmt::format("dinfer_requests_running {}\n", stats->running);
  header("dinfer_requests_waiting", "gauge", "Requests waiting for the engine to admit them.");
  out += fmt::format("dinfer_requests_waiting {}\n", stats->waiting);
  header("dinfer_kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks in use.");
  out += fmt::format("dinfer_kv_cache_usage_ratio {}\n", stats->kv_usage);
  header("dinfer_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.");
  out += fmt::format("dinfer_prefix_cache_queries_total {}\n", stats->prefix_queries);
  header("dinfer_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.");
  out += fmt::format("dinfer_prefix_cache_hits_total {}\n", stats->prefix_hits);
  header("dinfer_prefix_replay_tokens_total", "counter",
         "Of the prefix cache hits, tokens recomputed to rebuild sliding-window KV (bounded "
         "replay).");
  out += fmt::format("dinfer_prefix_replay_tokens_total {}\n", stats->prefix_replay_tokens);
  header("dinfer_prefix_cache_hit_rate", "gauge", "Prefix cache hits over queries since start.");
  out += fmt::format("dinfer_prefix_cache_hit_rate {}\n",
                     stats->prefix_queries > 0 ? static_cast<double>(stats->prefix_hits) /
                                                     static_cast<double>(stats->prefix_queries)
                                               : 0.0);
  header("dinfer_preemptions_total", "counter", "Requests preempted for lack of KV blocks.");
  out += fmt::format("dinfer_preemptions_total {}\n", stats->preemptions);
  header("dinfer_spec_draft_tokens_total", "counter",
         "Speculative decoding: draft tokens verified.");
  out += fmt::format("dinfer_spec_draft_tokens_total {}\n", stats->draft_tokens);
  header("dinfer_spec_accepted_tokens_total", "counter",
         "Speculative decoding: draft tokens accepted.");
  out += fmt::format("dinfer_spec_accepted_tokens_total {}\n", stats->accepted_draft_tokens);
  header("dinfer_spec_skipped_drafts_total", "counter",
         "Speculative decoding: drafts not proposed, by reason (low_confidence: below "
         "--speculative-min-confidence; low_acceptance: the request's acceptance rate is below "
         "--speculative-min-acceptance).");
  out += fmt::format("dinfer_spec_skipped_drafts_total{{reason=\"low_confidence\"}} {}\n",
                     stats->low_confidence_drafts);
  out += fmt::format("dinfer_spec_skipped_drafts_total{{reason=\"low_acceptance\"}} {}\n",
                     stats->paused_drafts);
  header("dinfer_engine_steps_total", "counter", "Engine steps run.");
  out += fmt::format("dinfer_engine_steps_total {}\n", stats->steps);
  return out;
}

}  // namespace dinfer::server
