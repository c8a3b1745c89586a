#include <cstdio>
#include <sstream>

#include <chrono>
#include <optional>
#include "base/logging.h"

#include "engine/engine_core.h"
#include "model/loader.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace dinfer::tools {

void AddGenerateFlags(CLI::App& cmd, GenerateArgs& a) {
  AddEngineFlags(cmd, a.engine, kModelFlags | kThreadFlags);
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
  cmd.add_option("-c,--context", a.context, "KV cache size in tokens")->capture_default_str();
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
  auto lm = LoadModel(a.engine.model, lo);
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
  auto device = ModelRunner::ParseDevice(a.engine.device);
  if (!device.ok()) {
    std::fprintf(stderr, "dinfer generate: %s\n", device.status().ToString().c_str());
    return 2;
  }
  if (Status q = ModelRunner::CheckQuantization(a.engine.quantization, *device); !q.ok()) {
    std::fprintf(stderr, "dinfer generate: %s\n", q.ToString().c_str());
    return 2;
  }
  EngineConfig ec;
  ec.device = *device;
  ec.cuda_fp8_weights = a.engine.quantization == "fp8";
  ec.threads = a.engine.threads;
  ec.f32_activations = a.engine.f32_activations;
  ec.scheduler.max_num_seqs = 1;
  ec.scheduler.max_model_len =
      std::max<int64_t>(a.context, static_cast<int64_t>(prompt.size()) + a.max_tokens);
  ec.num_kv_blocks = (ec.scheduler.max_model_len + ec.block_size - 1) / ec.block_size + 1;
  EngineCore engine(*lm->model, ec);
  if (!engine.runner().status().ok()) {
    std::fprintf(stderr, "dinfer generate: %s\n", engine.runner().status().ToString().c_str());
    return 1;
  }
  RequestOptions ro;
  ro.max_tokens = a.max_tokens;
  ro.sampling.temperature = a.temperature;
  ro.sampling.top_p = a.top_p;
  ro.sampling.top_k = a.top_k;
  ro.sampling.min_p = a.min_p;
  ro.sampling.seed = a.seed;
  ro.has_seed = true;
  ro.ignore_eos = a.ignore_eos;
  ro.stop_token_ids = lm->generation.eos_token_ids;
  if (lm->tokenizer) {
    for (int32_t id : lm->tokenizer->eos_ids()) ro.stop_token_ids.push_back(id);
  }
  const size_t num_prompt = prompt.size();
  if (Status s = engine.AddRequest(0, std::move(prompt), ro); !s.ok()) {
    std::fprintf(stderr, "dinfer generate: %s\n", s.ToString().c_str());
    return 1;
  }
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  if (!a.print_ids) detok = std::make_unique<tokenizer::IncrementalDetokenizer>(*lm->tokenizer);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::optional<Clock::time_point> first_token;
  int64_t generated = 0;
  std::string error;
  bool done = false;
  while (!done && engine.HasWork()) {
    for (const TokenDelta& d : engine.Step()) {
      for (int32_t id : d.tokens) {
        if (a.print_ids) {
          std::printf(generated == 0 ? "%d" : ",%d", id);
        } else {
          const std::string text = detok->Push(id);
          std::fwrite(text.data(), 1, text.size(), stdout);
        }
        if (!first_token) first_token = Clock::now();
        ++generated;
      }
      std::fflush(stdout);
      if (d.finish != FinishReason::kNone) {
        done = true;
        error = d.error;
      }
    }
  }
  if (detok) {
    const std::string rest = detok->Flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);
  if (!error.empty()) {
    std::fprintf(stderr, "dinfer generate: %s\n", error.c_str());
    return 1;
  }
  const auto t1 = Clock::now();
  const double prefill_s = std::chrono::duration<double>(first_token.value_or(t1) - t0).count();
  const double decode_s = std::chrono::duration<double>(t1 - first_token.value_or(t1)).count();
  log::Info(
      "prompt {} tokens in {:.3f} s ({:.1f} tok/s); generated {} tokens, {:.1f} tok/s after the "
      "first",
      num_prompt, prefill_s, static_cast<double>(num_prompt) / std::max(1e-9, prefill_s), generated,
      static_cast<double>(std::max<int64_t>(0, generated - 1)) / std::max(1e-9, decode_s));
  return 0;
}

}  // namespace dinfer::tools
