// `dinfer bench offline`: serving-style throughput and latency through the public Engine API —
// random prompts (optionally sharing a prefix), fixed output lengths (EOS ignored), at most
// `concurrency` requests in flight; reports output tokens/s, TTFT, TPOT and ITL percentiles.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <boost/json.hpp>

#include "dinfer/engine.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace dinfer::tools {

void AddBenchOfflineFlags(CLI::App& cmd, BenchOfflineArgs& a) {
  AddEngineFlags(cmd, a.engine, kModelFlags | kThreadFlags | kCacheFlags | kBatchingFlags);
  cmd.add_option("--input-len", a.input_len, "prompt tokens per request")->capture_default_str();
  cmd.add_option("--output-len", a.output_len, "generated tokens per request (EOS ignored)")
      ->capture_default_str();
  cmd.add_option("--num-prompts", a.num_prompts, "requests in total")->capture_default_str();
  cmd.add_option("--concurrency", a.concurrency, "requests in flight at most")
      ->capture_default_str();
  cmd.add_option("--prefix-len", a.prefix_len,
                 "leading prompt tokens shared by every request (prefix caching)")
      ->capture_default_str();
  cmd.add_option("--seed", a.seed, "seed of the random prompts")->capture_default_str();
  cmd.add_option("--json", a.json, "write the results as JSON to this file");
}

namespace {

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

Percentiles Summarise(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double idx = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(idx);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
  };
  for (double x : v) p.mean += x;
  p.mean /= static_cast<double>(v.size());
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  return p;
}

boost::json::object ToJson(const Percentiles& p) {
  return {{"mean", p.mean}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}};
}

}  // namespace

int RunBenchOffline(const BenchOfflineArgs& a) {
  if (a.input_len < 1 || a.output_len < 1 || a.num_prompts < 1 || a.concurrency < 1 ||
      a.prefix_len < 0 || a.prefix_len >= a.input_len) {
    std::fprintf(stderr,
                 "dinfer bench offline: need input-len, output-len, num-prompts, concurrency >= 1 "
                 "and 0 <= prefix-len < input-len\n");
    return 2;
  }
  EngineOptions eo = a.engine;
  eo.max_num_seqs = a.concurrency;
  auto engine = Engine::Create(eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "dinfer bench offline: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  Engine& e = **engine;
  std::mt19937 rng(a.seed);
  const auto vocab = static_cast<uint32_t>(std::min<int64_t>(e.vocab_size(), 32000));
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(100 + rng() % (vocab - 100));
    return t;
  };
  const std::vector<int32_t> prefix = random_tokens(a.prefix_len);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < a.num_prompts; ++i) {
    auto p = prefix;
    auto rest = random_tokens(a.input_len - a.prefix_len);
    p.insert(p.end(), rest.begin(), rest.end());
    prompts.push_back(std::move(p));
  }

  using Clock = std::chrono::steady_clock;
  std::mutex mu;
  std::vector<double> ttft, tpot, itl;
  std::atomic<int64_t> output_tokens{0}, errors{0}, next{0};
  const auto start = Clock::now();
  auto client = [&] {
    while (true) {
      const int64_t i = next.fetch_add(1);
      if (i >= a.num_prompts) return;
      RequestSpec spec;
      spec.prompt_ids = prompts[static_cast<size_t>(i)];
      spec.sampling.temperature = 0;
      spec.sampling.max_tokens = a.output_len;
      spec.sampling.ignore_eos = true;
      const auto t0 = Clock::now();
      auto stream = e.Submit(spec);
      if (!stream.ok()) {
        ++errors;
        continue;
      }
      std::vector<double> gaps;
      std::optional<Clock::time_point> first, last;
      int64_t n = 0;
      while (auto out = (*stream)->Next()) {
        const auto now = Clock::now();
        if (!out->error.empty()) ++errors;
        if (!out->token_ids.empty()) {
          if (!first)
            first = now;
          else
            gaps.push_back(std::chrono::duration<double>(now - *last).count());
          last = now;
          n += static_cast<int64_t>(out->token_ids.size());
        }
      }
      output_tokens += n;
      std::lock_guard<std::mutex> lock(mu);
      if (first) ttft.push_back(std::chrono::duration<double>(*first - t0).count());
      if (n > 1) tpot.push_back(std::chrono::duration<double>(*last - *first).count() / (n - 1));
      itl.insert(itl.end(), gaps.begin(), gaps.end());
    }
  };
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < a.concurrency; ++c) clients.emplace_back(client);
  for (auto& t : clients) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();
  const auto stats = e.Stats();
  const double throughput = static_cast<double>(output_tokens.load()) / duration;
  const Percentiles t1 = Summarise(ttft), t2 = Summarise(tpot), t3 = Summarise(itl);
  std::printf("requests %lld  concurrency %lld  input %lld  output %lld  prefix %lld  cache %s\n",
              static_cast<long long>(a.num_prompts), static_cast<long long>(a.concurrency),
              static_cast<long long>(a.input_len), static_cast<long long>(a.output_len),
              static_cast<long long>(a.prefix_len), a.engine.enable_prefix_caching ? "on" : "off");
  std::printf("duration %.2f s  output throughput %.1f tok/s  errors %lld\n", duration, throughput,
              static_cast<long long>(errors.load()));
  std::printf("TTFT ms  mean %.1f  p50 %.1f  p90 %.1f  p99 %.1f\n", 1e3 * t1.mean, 1e3 * t1.p50,
              1e3 * t1.p90, 1e3 * t1.p99);
  std::printf("TPOT ms  mean %.1f  p50 %.1f  p90 %.1f  p99 %.1f\n", 1e3 * t2.mean, 1e3 * t2.p50,
              1e3 * t2.p90, 1e3 * t2.p99);
  std::printf(
      "prefix cache hits %lld of %lld prompt tokens looked up (%lld recomputed to rebuild the "
      "window); preemptions %lld\n",
      static_cast<long long>(stats.prefix_hits), static_cast<long long>(stats.prefix_queries),
      static_cast<long long>(stats.prefix_replay_tokens),
      static_cast<long long>(stats.preemptions));
  if (stats.draft_tokens > 0) {
    std::printf("speculative decoding: %lld of %lld draft tokens accepted (%.1f%%)\n",
                static_cast<long long>(stats.accepted_draft_tokens),
                static_cast<long long>(stats.draft_tokens),
                100.0 * static_cast<double>(stats.accepted_draft_tokens) /
                    static_cast<double>(stats.draft_tokens));
  }
  if (stats.low_confidence_drafts + stats.paused_drafts > 0) {
    std::printf(
        "speculative decoding: drafts not proposed: %lld of low confidence, %lld of "
        "requests with low acceptance\n",
        static_cast<long long>(stats.low_confidence_drafts),
        static_cast<long long>(stats.paused_drafts));
  }
  if (!a.json.empty()) {
    boost::json::object out{{"engine", "dinfer"},
                            {"model", a.engine.model},
                            {"input_len", a.input_len},
                            {"output_len", a.output_len},
                            {"num_prompts", a.num_prompts},
                            {"concurrency", a.concurrency},
                            {"prefix_len", a.prefix_len},
                            {"prefix_cache", a.engine.enable_prefix_caching},
                            {"threads", a.engine.threads},
                            {"duration_s", duration},
                            {"output_throughput", throughput},
                            {"errors", errors.load()},
                            {"ttft_s", ToJson(t1)},
                            {"tpot_s", ToJson(t2)},
                            {"itl_s", ToJson(t3)},
                            {"prefix_hit_tokens", stats.prefix_hits},
                            {"prefix_query_tokens", stats.prefix_queries},
                            {"prefix_replay_tokens", stats.prefix_replay_tokens},
                            {"preemptions", stats.preemptions},
                            {"draft_tokens", stats.draft_tokens},
                            {"accepted_draft_tokens", stats.accepted_draft_tokens},
                            {"low_confidence_drafts", stats.low_confidence_drafts},
                            {"paused_drafts", stats.paused_drafts}};
    std::ofstream f(a.json);
    f << boost::json::serialize(out) << "\n";
    if (!f) {
      std::fprintf(stderr, "dinfer bench offline: cannot write %s\n", a.json.c_str());
      return 1;
    }
  }
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace dinfer::tools
