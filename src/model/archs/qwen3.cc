// Qwen3: per-head RMSNorm on q and k before rotary embedding (ModelConfig::qk_norm), explicit
// head_dim.
#include "model/layers/decoder.h"
#include "model/registry.h"

namespace dinfer {

StatusOr<std::unique_ptr<Model>> BuildQwen3(const ModelConfig& c, WeightSource& w) {
  if (!c.qk_norm) return InvalidArgument("qwen3 checkpoints carry q/k norms");
  return layers::DecoderModel::Build(c, w, layers::DecoderOptions{});
}

}  // namespace dinfer
