// Subcommands of the `dinfer` tool: their flags and entry points.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dinfer::tools {

struct GenerateArgs {
  std::string model = "default";
  std::string prompt;
  std::string prompt_ids;
  int64_t max_tokens = 128;
  double temperature = 0.0;
  double top_p = 1.0;
  int top_k = 0;
  double min_p = 0.0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool print_ids = false;
  bool no_special = false;
  int threads = 0;
  int64_t context = 4096;
  bool f32_activations = false;
  std::string device = "auto";
};
void AddGenerateFlags(CLI::App& cmd, GenerateArgs& args);
int RunGenerate(const GenerateArgs& args);

struct BenchArgs {
  std::string model = "default";
  std::vector<int> threads = {1, 2};
  int64_t prompt_tokens = 128;
  int64_t gen_tokens = 64;
  int repetitions = 5;
  std::string json;
  bool f32_activations = false;
};
void AddBenchFlags(CLI::App& cmd, BenchArgs& args);
int RunBench(const BenchArgs& args);

struct BenchOfflineArgs {
  std::string model = "default";
  int64_t input_len = 128;
  int64_t output_len = 64;
  int64_t num_prompts = 32;
  int64_t concurrency = 1;
  int64_t prefix_len = 0;
  bool no_prefix_cache = false;
  int threads = 0;
  int64_t max_batched_tokens = 2048;
  int64_t kv_cache_mib = 512;
  uint32_t seed = 0;
  std::string json;
  std::string device = "auto";
};
void AddBenchOfflineFlags(CLI::App& cmd, BenchOfflineArgs& args);
int RunBenchOffline(const BenchOfflineArgs& args);

}  // namespace dinfer::tools
