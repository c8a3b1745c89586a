#include <cstdio>
#include <sstream>

#include "base/logging.h"
#include "engine/generate.h"
#include "model/loader.h"
#include "tools/commands.h"

namespace dinfer::tools {

void AddGenerateFlags(CLI::App& cmd, GenerateArgs& a) {
  cmd.add_option("-m,--model", a.model, "\"default\", an HF model directory or a .gguf file")
      ->capture_default_str();
  cmd.add_option("-p,--prompt", a.prompt,
                 "prompt text (special-token markup such as <|im_start|> is recognised)");
  cmd.add_option("--prompt-ids", a.prompt_ids,
                 "prompt as comma-separated token ids, used as given (no BOS added)");
  cmd.add_option("-n,--max-tokens", a.max_tokens, "tokens to generate at most")
      ->capture_default_str();
  cmd.add_option("--temperature", a.temperature, "sampling temperature; 0 is greedy")
      ->capture_default_str();
  cmd.add_option("--top-p", a.top_p, "nucleus sampling mass (1 = off)")->capture_default_str();
  cmd.add_option("--top-k", a.top_k, "sample among the k most likely tokens (0 = off)")
      ->capture_default_str();
  cmd.add_option("--min-p", a.min_p, "drop tokens below min-p × the top probability (0 = off)")
      ->capture_default_str();
  cmd.add_option("--seed", a.seed, "random seed; same seed, prompt and flags give the same output")
      ->capture_default_str();
  cmd.add_flag("--ignore-eos", a.ignore_eos, "keep generating past end-of-sequence tokens");
  cmd.add_flag("--print-ids", a.print_ids,
               "print the generated token ids, comma-separated, instead of text");
  cmd.add_flag("--no-special", a.no_special,
               "treat special-token markup in --prompt as plain text");
  cmd.add_option("-t,--threads", a.threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd.add_option("-c,--context", a.context, "KV cache size in tokens")->capture_default_str();
  cmd.add_flag("--f32-activations", a.f32_activations,
               "quantized models: multiply dequantized weights with f32 activations (the numerics "
               "of reference implementations; slower) instead of 8-bit activations");
}

namespace {

StatusOr<std::vector<int32_t>> ParseIds(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size() && item.find_first_not_of(" \t", used) != std::string::npos) throw 0;
      ids.push_back(static_cast<int32_t>(v));
    } catch (...) {
      return InvalidArgument("--prompt-ids: '{}' is not a token id", item);
    }
  }
  return ids;
}

}  // namespace

int RunGenerate(const GenerateArgs& a) {
  if (a.prompt.empty() == a.prompt_ids.empty()) {
    std::fprintf(stderr, "dinfer generate: give exactly one of --prompt or --prompt-ids\n");
    return 2;
  }
  LoadOptions lo;
  lo.require_tokenizer = !a.prompt.empty() || !a.print_ids;
  auto lm = LoadModel(a.model, lo);
  if (!lm.ok()) {
    std::fprintf(stderr, "dinfer generate: %s\n", lm.status().ToString().c_str());
    return 1;
  }
  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    auto ids = ParseIds(a.prompt_ids);
    if (!ids.ok()) {
      std::fprintf(stderr, "dinfer generate: %s\n", ids.status().ToString().c_str());
      return 2;
    }
    prompt = std::move(ids).value();
  } else {
    const auto& tok = *lm->tokenizer;
    if (tok.add_bos() && tok.bos_id()) prompt.push_back(*tok.bos_id());
    auto ids = tok.Encode(a.prompt, !a.no_special);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  RunnerOptions ro;
  ro.threads = a.threads;
  ro.f32_activations = a.f32_activations;
  ro.max_seq_len = std::max<int64_t>(a.context, static_cast<int64_t>(prompt.size()) + a.max_tokens);
  ModelRunner runner(*lm->model, ro);
  GenerateOptions go;
  go.max_tokens = a.max_tokens;
  go.sampling.temperature = a.temperature;
  go.sampling.top_p = a.top_p;
  go.sampling.top_k = a.top_k;
  go.sampling.min_p = a.min_p;
  go.sampling.seed = a.seed;
  go.ignore_eos = a.ignore_eos;
  go.stop_token_ids = lm->generation.eos_token_ids;
  if (lm->tokenizer) {
    for (int32_t id : lm->tokenizer->eos_ids()) go.stop_token_ids.push_back(id);
  }
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  if (!a.print_ids) detok = std::make_unique<tokenizer::IncrementalDetokenizer>(*lm->tokenizer);
  bool first = true;
  auto result = Generate(runner, prompt, go, [&](int32_t id) {
    if (a.print_ids) {
      std::printf(first ? "%d" : ",%d", id);
    } else {
      const std::string text = detok->Push(id);
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    first = false;
    std::fflush(stdout);
    return true;
  });
  if (detok) {
    const std::string rest = detok->Flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);
  if (!result.ok()) {
    std::fprintf(stderr, "dinfer generate: %s\n", result.status().ToString().c_str());
    return 1;
  }
  const double n = static_cast<double>(result->tokens.size());
  log::Info(
      "prompt {} tokens in {:.3f} s ({:.1f} tok/s); generated {} tokens in {:.3f} s ({:.1f} tok/s)",
      prompt.size(), result->prefill_seconds,
      static_cast<double>(prompt.size()) / std::max(1e-9, result->prefill_seconds), n,
      result->decode_seconds, n / std::max(1e-9, result->decode_seconds));
  return 0;
}

}  // namespace dinfer::tools
