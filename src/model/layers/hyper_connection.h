// Manifold-constrained hyper-connections (DeepSeek-V4): the residual is hc parallel streams per
// token ([tokens, hc * hidden]). HyperConnection mixes them around one sublayer (Pre collapses the
// streams into the sublayer's input, Post writes the sublayer's output back into them); HyperHead
// collapses them once at the end. Weights come from the checkpoint (f32); immutable after Load.
#pragma once

#include <string>

#include "model/layers/workspace.h"
#include "model/weights.h"
#include "ops/deepseek_ops.h"

namespace dinfer::layers {

struct HcSettings {
  int64_t hc = 0, hidden = 0, sinkhorn_iters = 0;
  float hc_eps = 0.0f, norm_eps = 0.0f;
};

class HyperConnection {
 public:
  // `prefix` + "fn" / "base" / "scale" (DeepSeek's names: "layers.3.hc_attn_" ...).
  static StatusOr<HyperConnection> Load(WeightSource& w, const std::string& prefix,
                                        const HcSettings& s);

  // streams [n, hc * hidden] -> collapsed [n, hidden]; keeps the mixing weights in `ws` for Post.
  Status Pre(const ops::OpContext& ctx, const TensorView& streams, Workspace& ws,
             const TensorView& collapsed) const;
  // out [n, hc * hidden] from the sublayer output y [n, hidden] and the streams Pre saw.
  void Post(const ops::OpContext& ctx, const TensorView& streams, const TensorView& y,
            Workspace& ws, const TensorView& out) const;

  const TensorView& fn() const { return fn_; }        // [(2 + hc) * hc, hc * hidden] f32
  const TensorView& base() const { return base_; }    // [(2 + hc) * hc]
  const TensorView& scale() const { return scale_; }  // [3]

 private:
  HcSettings s_;
  TensorView fn_, base_, scale_;
};

class HyperHead {
 public:
  // `prefix` + "fn" / "base" / "scale" ("hc_head_", "mtp.0.hc_head_").
  static StatusOr<HyperHead> Load(WeightSource& w, const std::string& prefix, const HcSettings& s);
  // streams [n, hc * hidden] -> out [n, hidden].
  Status Forward(const ops::OpContext& ctx, const TensorView& streams, Workspace& ws,
                 const TensorView& out) const;

  const TensorView& fn() const { return fn_; }        // [hc, hc * hidden] f32
  const TensorView& base() const { return base_; }    // [hc]
  const TensorView& scale() const { return scale_; }  // [1]

 private:
  HcSettings s_;
  TensorView fn_, base_, scale_;
};

// Workspace slots the hyper-connections use.
enum HcSlot { kHcNormed = 0, kHcMixes, kHcPost, kHcComb, kHcSlotEnd };

}  // namespace dinfer::layers
