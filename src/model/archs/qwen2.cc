// Qwen2 / Qwen2.5: biases on the q/k/v projections (ModelConfig::attention_bias), optional sliding
// window on the upper layers.
#include "model/layers/decoder.h"
#include "model/registry.h"

namespace dinfer {

StatusOr<std::unique_ptr<Model>> BuildQwen2(const ModelConfig& c, WeightSource& w) {
  if (!c.attention_bias) return InvalidArgument("qwen2 checkpoints carry q/k/v biases");
  return layers::DecoderModel::Build(c, w, layers::DecoderOptions{});
}

}  // namespace dinfer
