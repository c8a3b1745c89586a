// Llama 2 / 3.x (llama3 rope scaling via the config) and SmolLM2, which is the Llama architecture.
#include "model/layers/decoder.h"
#include "model/registry.h"

namespace dinfer {

StatusOr<std::unique_ptr<Model>> BuildLlama(const ModelConfig& c, WeightSource& w) {
  return layers::DecoderModel::Build(c, w, layers::DecoderOptions{});
}

}  // namespace dinfer
