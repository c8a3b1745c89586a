// ModelConfig: the architecture hyper-parameters of a model, from an HF config.json or from GGUF
// metadata, validated. Plain value type.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace dinfer {

class GgufFile;

enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  std::string arch;             // registry key: "llama", "qwen2", "qwen3", "mistral"
  std::string hf_architecture;  // e.g. "LlamaForCausalLM" (empty for GGUF)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // dims of each head that rotate (partial rotary)
  int64_t max_position_embeddings = 4096;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool rope_interleaved = false;  // GGUF llama checkpoints store Q/K permuted for pairwise rope
  bool tie_word_embeddings = false;
  bool attention_bias = false;      // q/k/v projections carry biases (Qwen2)
  bool qk_norm = false;             // per-head RMSNorm on q and k (Qwen3)
  int64_t sliding_window = 0;       // 0: none
  std::vector<bool> layer_sliding;  // per layer: whether the window applies
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;

  Status Validate() const;
};

// Reads config.json text (HF format). `path` only names the file in errors.
StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, const std::string& path);
StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& gguf);

// Archs dinfer knows, for error messages.
std::string SupportedArchitectures();

}  // namespace dinfer
