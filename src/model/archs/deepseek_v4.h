// DeepSeek-V4 (V4-Flash, V4-Pro): embedding, hc residual streams through N blocks (hyper-connection
// -> RMSNorm -> compressed / sliding-window attention, hyper-connection -> RMSNorm -> MoE), the
// final HC collapse, RMSNorm and LM head; plus the MTP (next-n) layer, usable as a draft model.
// KV planes per layer: see DeepseekV4LayerPlanes. Immutable after Build; Forward and ForwardDraft
// one thread at a time (they share internal buffers).
#pragma once

#include <memory>
#include <vector>

#include "model/layers/compressed_attention.h"
#include "model/layers/hyper_connection.h"
#include "model/layers/moe.h"
#include "model/layers/workspace.h"
#include "model/model.h"

namespace dinfer {

class DeepseekV4Model final : public Model {
 public:
  static StatusOr<std::unique_ptr<DeepseekV4Model>> Build(const ModelConfig& config,
                                                          WeightSource& weights);

  KvLayout KvLayoutFor(int64_t block_size) const override;
  std::vector<KvGroup> KvGroupsFor(int64_t block_size) const override;
  // The window's receptive field through the KV layers, and the compressors' running state (see
  // the definition).
  int64_t WindowReplayTokens() const override;
  Status Forward(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                 const TensorView& logits) override;

  // The MTP layer (the first, when a checkpoint has several); its KV planes are layer num_layers.
  bool has_draft_layer() const override { return !mtp_.empty(); }
  Status ForwardDraft(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                      const TensorView& logits) override;

  struct Block {
    TensorView attn_norm, ffn_norm;
    layers::HyperConnection attn_hc, ffn_hc;
    layers::CompressedAttention attn;
    layers::MoeLayer moe;
  };
  struct Mtp {
    Block block;
    TensorView e_proj, h_proj, enorm, hnorm, norm;
    layers::HyperHead head;
  };
  // The weights, for backends that copy them (the CUDA runner).
  const std::vector<Block>& layers() const { return layers_; }
  const std::vector<Mtp>& mtp() const { return mtp_; }
  const TensorView& embed() const { return embed_; }
  const TensorView& lm_head() const { return lm_head_; }
  const TensorView& final_norm() const { return norm_; }
  const layers::HyperHead& hc_head() const { return hc_head_; }
  const layers::V4Rope& rope() const { return rope_; }

 private:
  explicit DeepseekV4Model(ModelConfig config) : Model(std::move(config)) {}

  static StatusOr<Block> LoadBlock(WeightSource& w, const std::string& prefix, const ModelConfig& c,
                                   int64_t layer);
  // streams [n, hc * hidden] (Workspace slot kStreamsA) through one block (KV layer `layer`),
  // in place; returns streams.
  StatusOr<TensorView> RunBlock(const ops::OpContext& ctx, const Block& block, int64_t layer,
                                const TensorView& streams, std::span<const int32_t> tokens,
                                const ops::AttentionMetadata& meta, const KvStorage& kv);
  // logits of the requested rows of the final streams.
  Status Head(const ops::OpContext& ctx, const TensorView& streams, std::span<const int32_t> rows,
              const layers::HyperHead& hc_head, const TensorView& norm, const TensorView& logits);

  TensorView embed_, lm_head_, norm_;
  layers::HyperHead hc_head_;
  std::vector<Block> layers_;
  std::vector<Mtp> mtp_;
  layers::V4Rope rope_;
  layers::Workspace ws_;
  Tensor last_streams_;  // the previous Forward's final streams, for ForwardDraft
  int64_t last_rows_ = 0;
};

}  // namespace dinfer
