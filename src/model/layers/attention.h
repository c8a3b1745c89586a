// Attention layer builder shared by the decoder architectures: q/k/v/o projections with optional
// biases, optional per-head q/k RMSNorm, rotary embedding, paged causal attention (optionally in a
// sliding window). Weights are views into the checkpoint; immutable after Load.
#pragma once

#include <optional>
#include <vector>

#include "model/config.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace dinfer::layers {

struct AttentionWeights {
  TensorView q, k, v, o;
  std::optional<TensorView> q_bias, k_bias, v_bias, o_bias;
  std::optional<TensorView> q_norm, k_norm;
  // Calibrated FP8 KV-cache scales from the checkpoint (the cache holds k / k_scale and
  // v / v_scale), when it has them: see ReadKvCacheScales.
  std::optional<float> k_scale, v_scale;
};

// Reads a layer's calibrated KV-cache scales into `out`, from the tensors named after `prefix`
// ("model.layers.N.self_attn."): `k_scale` and `v_scale` (vLLM's and llm-compressor's names), or
// one `kv_scale` for both, or `k_proj.output_scale` and `v_proj.output_scale`. A scale is one
// value or one per KV head; the cache kernels take one per tensor, so per-head scales give their
// largest (no head saturates). Absent tensors leave the scales unset; non-positive, non-finite or
// misshapen ones are an error.
Status ReadKvCacheScales(WeightSource& w, const std::string& prefix, int64_t num_kv_heads,
                         AttentionWeights& out);

struct Scratch;

class AttentionLayer {
 public:
  static StatusOr<AttentionLayer> Load(WeightSource& w, const ModelConfig& c, int64_t layer);

  // x: [tokens, hidden] (normed input); out: [tokens, hidden].
  Status Forward(const ops::OpContext& ctx, const TensorView& x, const ops::KvLayerView& kv,
                 const ops::AttentionMetadata& meta, std::span<const float> inv_freq,
                 Scratch& scratch, const TensorView& out) const;

  const AttentionWeights& weights() const { return w_; }
  const ops::AttentionOptions& options() const { return opt_; }

 private:
  AttentionWeights w_;
  ops::AttentionOptions opt_;
  int64_t rotary_dim_ = 0;
  bool rope_interleaved_ = false;
  float norm_eps_ = 1e-6f;
};

}  // namespace dinfer::layers
