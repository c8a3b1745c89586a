// Subcommands of the `dinfer` tool: their flags and entry points.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dinfer/engine.h"
#include "server/api_server.h"

namespace dinfer::tools {

struct GenerateArgs {
  EngineOptions engine;  // model, threads, f32_activations
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
  int64_t context = 4096;
};
void AddGenerateFlags(CLI::App& cmd, GenerateArgs& args);
int RunGenerate(const GenerateArgs& args);

struct BenchArgs {
  EngineOptions engine;  // model, f32_activations
  std::vector<int> threads = {1, 2};
  int64_t prompt_tokens = 128;
  int64_t gen_tokens = 64;
  int repetitions = 5;
  std::string json;
};
void AddBenchFlags(CLI::App& cmd, BenchArgs& args);
int RunBench(const BenchArgs& args);

struct BenchOfflineArgs {
  EngineOptions engine;  // max_num_seqs follows --concurrency
  int64_t input_len = 128;
  int64_t output_len = 64;
  int64_t num_prompts = 32;
  int64_t concurrency = 1;
  int64_t prefix_len = 0;
  uint32_t seed = 0;
  std::string json;
};
void AddBenchOfflineFlags(CLI::App& cmd, BenchOfflineArgs& args);
int RunBenchOffline(const BenchOfflineArgs& args);

struct TokenizeArgs {
  std::string model = "default";
  std::string tokenizer;
  std::string text, file, chat, chat_template;
  bool no_special = false;
  std::string text_out, ids_out;
  bool bench = false;
  std::vector<int> threads = {1, 2};
  int repetitions = 5;
  std::string json;
};
void AddTokenizeFlags(CLI::App& cmd, TokenizeArgs& args);
int RunTokenize(const TokenizeArgs& args);

struct ServeArgs {
  server::ServerOptions options;
  std::string positional_model;
};
void AddServeFlags(CLI::App& cmd, ServeArgs& args);
int RunServe(ServeArgs args);

struct GrammarArgs {
  std::string command;  // compile, match or bench
  std::string json_schema, regex, ebnf;
  bool json_object = false;
  std::vector<std::string> choices;
  int max_whitespace = 16;
  std::string model = "default";
  std::string tokenizer;
  std::string text_file;
  std::string dir, instances, json;
  int limit = 0;
  int per_folder_limit = 0;
  bool print_grammar = false;
};
// Adds the compile, match and bench subcommands to `dinfer grammar`.
void AddGrammarCommands(CLI::App& cmd, GrammarArgs& args);
int RunGrammar(const GrammarArgs& args);

}  // namespace dinfer::tools
