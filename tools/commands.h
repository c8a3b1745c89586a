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

}  // namespace dinfer::tools
