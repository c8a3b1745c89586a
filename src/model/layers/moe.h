// Mixture-of-experts layer builder (DeepSeek-V4 style): a router (score-corrected top-k over
// sqrt(softplus) / softmax / sigmoid scores, or a fixed token-id -> experts table for hash-routed
// layers), routed SwiGLU experts with an optional clamp, and shared experts whose output is added.
// Forward permutes tokens by expert, runs each expert's GEMMs on its rows and combines them with
// the routing weights. Weights are views into the checkpoint (or repacked FP8 / FP4 copies owned by
// the WeightSource); immutable after Load.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layers/workspace.h"
#include "model/weights.h"
#include "ops/deepseek_ops.h"

namespace dinfer::layers {

class MoeLayer {
 public:
  // DeepSeek's names under `prefix` ("layers.3.ffn."): gate.weight, gate.bias or gate.tid2eid,
  // experts.E.w1/w2/w3, shared_experts.w1/w2/w3.
  static StatusOr<MoeLayer> Load(WeightSource& w, const std::string& prefix, const ModelConfig& c,
                                 bool hash_routed);

  // x [n, hidden] (normed), token_ids [n] (for hash routing) -> out [n, hidden].
  Status Forward(const ops::OpContext& ctx, const TensorView& x, std::span<const int32_t> token_ids,
                 Workspace& ws, const TensorView& out) const;

  struct Expert {
    TensorView w1, w2, w3;  // gate [inter, hidden], down [hidden, inter], up [inter, hidden]
  };
  int64_t num_experts() const { return static_cast<int64_t>(experts_.size()); }
  const TensorView& gate() const { return gate_; }
  const TensorView& bias() const { return bias_; }                  // data null: none
  const std::vector<int32_t>& tid2eid() const { return tid2eid_; }  // empty: score routing
  const std::vector<Expert>& experts() const { return experts_; }
  const std::vector<Expert>& shared() const { return shared_; }
  int64_t top_k() const { return top_k_; }
  kernels::cpu::RouterScoring scoring() const { return scoring_; }
  bool normalize() const { return normalize_; }
  float scaling() const { return scaling_; }
  float limit() const { return limit_; }

 private:
  // y [m, hidden] = w2(silu(clamp(w1 x)) * clamp(w3 x)) for the rows of x [m, hidden].
  Status RunExpert(const ops::OpContext& ctx, const Expert& e, const TensorView& x, Workspace& ws,
                   const TensorView& y) const;

  TensorView gate_, bias_;
  std::vector<int32_t> tid2eid_;  // [vocab, top_k] for hash-routed layers
  std::vector<Expert> experts_;
  std::vector<Expert> shared_;
  int64_t hidden_ = 0, inter_ = 0, top_k_ = 0, vocab_ = 0;
  kernels::cpu::RouterScoring scoring_ = kernels::cpu::RouterScoring::kSqrtSoftplus;
  bool normalize_ = true;
  float scaling_ = 1.0f, limit_ = 0.0f;
};

}  // namespace dinfer::layers
