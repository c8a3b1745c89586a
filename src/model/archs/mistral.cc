// Mistral: the Llama decoder with sliding-window attention on every layer (ModelConfig).
#include "model/layers/decoder.h"
#include "model/registry.h"

namespace dinfer {

StatusOr<std::unique_ptr<Model>> BuildMistral(const ModelConfig& c, WeightSource& w) {
  return layers::DecoderModel::Build(c, w, layers::DecoderOptions{});
}

}  // namespace dinfer
