#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>

#include <boost/json.hpp>

#include "base/logging.h"
#include "kernels/cpu/cpu_features.h"
#include "model/loader.h"
#include "runner/model_runner.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace dinfer::tools {

void AddBenchFlags(CLI::App& cmd, BenchArgs& a) {
  AddEngineFlags(cmd, a.engine, kModelFlags);
  cmd.add_option("-t,--threads", a.threads, "thread counts to measure, e.g. 1,2")
      ->delimiter(',')
      ->capture_default_str();
  cmd.add_option("-p,--prompt-tokens", a.prompt_tokens, "prefill test: tokens in one batch")
      ->capture_default_str();
  cmd.add_option("-n,--gen-tokens", a.gen_tokens, "decode test: tokens generated one at a time")
      ->capture_default_str();
  cmd.add_option("-r,--repetitions", a.repetitions, "runs per test (median reported)")
      ->capture_default_str();
  cmd.add_option("--json", a.json, "write the results as JSON to this file");
}

namespace {

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats Summarise(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  return s;
}

boost::json::object ToJson(const Stats& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

}  // namespace

int RunBench(const BenchArgs& a) {
  auto lm = LoadModel(a.engine.model);
  if (!lm.ok()) {
    std::fprintf(stderr, "dinfer bench: %s\n", lm.status().ToString().c_str());
    return 1;
  }
  auto device = ModelRunner::ParseDevice(a.engine.device);
  if (!device.ok()) {
    std::fprintf(stderr, "dinfer bench: %s\n", device.status().ToString().c_str());
    return 2;
  }
  if (Status q = ModelRunner::CheckQuantization(a.engine.quantization, *device); !q.ok()) {
    std::fprintf(stderr, "dinfer bench: %s\n", q.ToString().c_str());
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  const int64_t vocab = lm->config.vocab_size;
  std::mt19937 rng(1234);
  std::vector<int32_t> tokens(static_cast<size_t>(std::max(a.prompt_tokens, a.gen_tokens)));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  boost::json::array results;
  std::printf("%-8s %-6s %8s %12s %12s\n", "test", "thr", "tokens", "tok/s", "spread");
  for (int threads : a.threads) {
    RunnerOptions ro;
    ro.threads = threads;
    ro.f32_activations = a.engine.f32_activations;
    ro.device = *device;
    ro.cuda_fp8_weights = a.engine.quantization == "fp8";
    ro.max_seq_len = std::max(a.prompt_tokens, a.gen_tokens) + 16;
    ModelRunner runner(*lm->model, ro);
    if (!runner.status().ok()) {
      std::fprintf(stderr, "dinfer bench: %s\n", runner.status().ToString().c_str());
      return 1;
    }
    std::vector<int32_t> table(static_cast<size_t>(runner.num_blocks()));
    std::iota(table.begin(), table.end(), 0);
    auto run_prefill = [&] {
      SeqChunk c{std::span<const int32_t>(tokens.data(), a.prompt_tokens), 0, table,
                 SeqChunk::Logits::kLast};
      const auto t0 = Clock::now();
      auto r = runner.Execute(std::span(&c, 1));
      DINFER_CHECK_MSG(r.ok(), "{}", r.status().ToString());
      return static_cast<double>(a.prompt_tokens) /
             std::chrono::duration<double>(Clock::now() - t0).count();
    };
    auto run_decode = [&] {
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < a.gen_tokens; ++i) {
        SeqChunk c{std::span<const int32_t>(&tokens[i], 1), i, table, SeqChunk::Logits::kLast};
        auto r = runner.Execute(std::span(&c, 1));
        DINFER_CHECK_MSG(r.ok(), "{}", r.status().ToString());
      }
      return static_cast<double>(a.gen_tokens) /
             std::chrono::duration<double>(Clock::now() - t0).count();
    };
    for (const char* test : {"prefill", "decode"}) {
      const bool prefill = std::string_view(test) == "prefill";
      if ((prefill ? a.prompt_tokens : a.gen_tokens) <= 0) continue;
      prefill ? run_prefill() : run_decode();  // warm-up
      std::vector<double> runs;
      for (int r = 0; r < a.repetitions; ++r)
        runs.push_back(prefill ? run_prefill() : run_decode());
      const Stats s = Summarise(runs);
      std::printf("%-8s %-6d %8lld %12.2f %5.1f-%-6.1f\n", test, threads,
                  static_cast<long long>(prefill ? a.prompt_tokens : a.gen_tokens), s.median, s.min,
                  s.max);
      results.push_back({{"test", test},
                         {"threads", threads},
                         {"tokens", prefill ? a.prompt_tokens : a.gen_tokens},
                         {"tok_s", ToJson(s)},
                         {"runs", boost::json::value_from(runs)}});
    }
  }
  if (!a.json.empty()) {
    boost::json::object out{{"engine", "dinfer"},
                            {"model", lm->path},
                            {"isa", std::string(kernels::cpu::IsaName(kernels::cpu::ActiveIsa()))},
                            {"prompt_tokens", a.prompt_tokens},
                            {"gen_tokens", a.gen_tokens},
                            {"f32_activations", a.engine.f32_activations},
                            {"repetitions", a.repetitions},
                            {"results", results}};
    std::ofstream f(a.json);
    f << boost::json::serialize(out) << "\n";
    if (!f) {
      std::fprintf(stderr, "dinfer bench: cannot write %s\n", a.json.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace dinfer::tools
