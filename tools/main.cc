// The `dinfer` command: subcommands serve, generate, bench, tokenize and grammar.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "base/logging.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "dinfer: LLM inference and serving (C++20; CPU and NVIDIA Hopper).\n"
      "Models: \"default\" (the embedded SmolLM2-135M-Instruct), an HF model directory, or a .gguf "
      "file."};
  app.set_version_flag("--version", "dinfer 0.1.0");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug, info, warn, error or off")
      ->capture_default_str();
  app.require_subcommand(1);

  dinfer::tools::ServeArgs serve;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve",
      "Serve a model over HTTP: OpenAI (chat completions, completions, responses) and "
      "Anthropic (messages) APIs");
  dinfer::tools::AddServeFlags(*serve_cmd, serve);

  dinfer::tools::GenerateArgs gen;
  CLI::App* generate = app.add_subcommand("generate", "Generate text from a prompt, streaming it");
  dinfer::tools::AddGenerateFlags(*generate, gen);

  dinfer::tools::BenchArgs bench;
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "Measure prefill and decode tokens/s (like llama-bench: pp and tg)");
  dinfer::tools::AddBenchFlags(*bench_cmd, bench);
  bench_cmd->require_subcommand(0, 1);
  dinfer::tools::BenchOfflineArgs offline;
  CLI::App* offline_cmd = bench_cmd->add_subcommand(
      "offline", "Serving throughput and latency (TTFT, TPOT) of many requests through the engine");
  dinfer::tools::AddBenchOfflineFlags(*offline_cmd, offline);

  dinfer::tools::TokenizeArgs tokenize;
  CLI::App* tokenize_cmd = app.add_subcommand(
      "tokenize", "Token ids of a text or of a chat rendered with the chat template (--bench)");
  dinfer::tools::AddTokenizeFlags(*tokenize_cmd, tokenize);

  dinfer::tools::GrammarArgs grammar;
  CLI::App* grammar_cmd = app.add_subcommand(
      "grammar",
      "Structured outputs: compile, match and benchmark JSON Schemas, regexes, grammars");
  dinfer::tools::AddGrammarCommands(*grammar_cmd, grammar);

  CLI11_PARSE(app, argc, argv);
  if (!dinfer::log::SetLevel(log_level)) {
    std::fprintf(stderr, "dinfer: unknown --log-level '%s'\n", log_level.c_str());
    return 2;
  }
  if (serve_cmd->parsed()) return dinfer::tools::RunServe(std::move(serve));
  if (generate->parsed()) return dinfer::tools::RunGenerate(gen);
  if (tokenize_cmd->parsed()) return dinfer::tools::RunTokenize(tokenize);
  if (offline_cmd->parsed()) return dinfer::tools::RunBenchOffline(offline);
  if (bench_cmd->parsed()) return dinfer::tools::RunBench(bench);
  if (grammar_cmd->parsed()) return dinfer::tools::RunGrammar(grammar);
  return 0;
}
