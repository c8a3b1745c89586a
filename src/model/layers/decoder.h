// DecoderModel: the pre-norm decoder-only transformer that Llama, Qwen2/3, Mistral and SmolLM2
// share — embedding, N × (RMSNorm → attention → residual, RMSNorm → gated MLP → residual),
// final RMSNorm, LM head (tied to the embedding or not). Architectures differ only in
// DecoderOptions and ModelConfig flags (archs/*.cc). Forward: one thread at a time.
#pragma once

#include <memory>
#include <vector>

#include "model/layers/attention.h"
#include "model/layers/mlp.h"
#include "model/layers/scratch.h"
#include "model/model.h"

namespace dinfer::layers {

struct DecoderOptions {
  float norm_weight_offset = 0.0f;  // Gemma stores norm weights as (w - 1)
  bool scale_embeddings = false;    // Gemma multiplies embeddings by sqrt(hidden)
};

class DecoderModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Build(const ModelConfig& config, WeightSource& weights,
                                                const DecoderOptions& options);

  Status Forward(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                 const TensorView& logits) override;

  // Read-only access to the weights, for backends that copy them to a device.
  struct Layer {
    TensorView input_norm, post_norm;
    AttentionLayer attn;
    GatedMlp mlp;
  };
  const std::vector<Layer>& layers() const { return layers_; }
  const TensorView& embed() const { return embed_; }
  const TensorView& final_norm() const { return final_norm_; }
  const TensorView& lm_head() const { return lm_head_; }
  const DecoderOptions& options() const { return options_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  DecoderModel(ModelConfig config, DecoderOptions options)
      : Model(std::move(config)), options_(options) {}

  DecoderOptions options_;
  TensorView embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  Scratch scratch_;
  Tensor hidden_, normed_, branch_, last_;
};

// Rotary inverse frequencies for a config, scaling included (rotary_dim / 2 entries).
std::vector<float> RopeInvFreq(const ModelConfig& c);

}  // namespace dinfer::layers
