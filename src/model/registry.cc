#include "model/registry.h"

namespace dinfer {

const std::vector<ArchEntry>& Architectures() {
  static const std::vector<ArchEntry> kArchs = {
      {"llama", BuildLlama},  // Llama 2/3.x, SmolLM2
      {"qwen2", BuildQwen2},     {"qwen3", BuildQwen3},
      {"mistral", BuildMistral}, {"deepseek_v4", BuildDeepseekV4},  // DeepSeek-V4-Flash / -Pro
  };
  return kArchs;
}

StatusOr<std::unique_ptr<Model>> BuildModel(const ModelConfig& config, WeightSource& weights) {
  for (const auto& a : Architectures()) {
    if (config.arch == a.name) return a.build(config, weights);
  }
  return Unimplemented("architecture '{}' is not supported; dinfer supports {}", config.arch,
                       SupportedArchitectures());
}

}  // namespace dinfer
