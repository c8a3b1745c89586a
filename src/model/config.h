// ModelConfig: the architecture hyper-parameters of a model, from an HF config.json or from GGUF
// metadata, validated. Plain value type.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace dinfer {

class GgufFile;

enum class RopeScalingType { kNone, kLinear, kLlama3, kYarn };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
  double beta_fast = 32.0, beta_slow = 1.0;  // YaRN's correction range
};

// DeepSeek-V4's attention per layer: a sliding window only, or the window plus compressed entries
// (compressed sparse attention with its lightning indexer, or heavily compressed attention).
enum class V4Attention { kSliding, kCompressedSparse, kHeavilyCompressed };

// The hyper-parameters of DeepSeek-V4 beyond the common ones (ModelConfig::deepseek_v4).
struct DeepseekV4Config {
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0, o_groups = 0;  // grouped low-rank output projection
  // num_layers + num_mtp_layers entries (the MTP layers follow the main ones).
  std::vector<V4Attention> layer_attention;
  std::vector<bool> layer_hash_moe;  // experts chosen by token id (tid2eid) instead of scores
  int64_t csa_rate = 4, hca_rate = 128;
  double compress_rope_theta = 160000.0;
  RopeScaling compress_rope;  // the compressed layers' rotary scaling (YaRN in V4-Flash)
  int64_t index_heads = 0, index_head_dim = 0, index_topk = 0;
  int64_t hc_mult = 1, hc_sinkhorn_iters = 0;
  double hc_eps = 1e-6;
  int64_t num_experts = 0, num_shared_experts = 0, experts_per_token = 0;
  enum class Scoring { kSqrtSoftplus, kSoftmax, kSigmoid } scoring = Scoring::kSqrtSoftplus;
  bool norm_topk_prob = true;
  double routed_scaling = 1.0;
  double swiglu_limit = 0.0;  // 0: no clamp
  int64_t num_mtp_layers = 0;
  int64_t fp8_block_rows = 128, fp8_block_cols = 128;  // FP8 weights' scale blocks

  int64_t Rate(V4Attention kind) const {
    return kind == V4Attention::kCompressedSparse    ? csa_rate
           : kind == V4Attention::kHeavilyCompressed ? hca_rate
                                                     : 0;
  }
};

struct ModelConfig {
  std::string arch;             // registry key: "llama", "qwen2", "qwen3", "mistral", "deepseek_v4"
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
  std::optional<DeepseekV4Config> deepseek_v4;  // arch "deepseek_v4" only

  Status Validate() const;
};

// Reads config.json text (HF format). `path` only names the file in errors.
StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, const std::string& path);
StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& gguf);

// The DeepSeek-V4 checks of ModelConfig::Validate.
Status ValidateDeepseekV4(const ModelConfig& c);

// Archs dinfer knows, for error messages.
std::string SupportedArchitectures();

}  // namespace dinfer
