// Gated MLP builder (SwiGLU: down(silu(gate(x)) * up(x))) shared by the decoder architectures.
// Weights are views into the checkpoint; immutable after Load.
#pragma once

#include "model/config.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace dinfer::layers {

struct Scratch;

class GatedMlp {
 public:
  static StatusOr<GatedMlp> Load(WeightSource& w, const std::string& prefix, int64_t hidden,
                                 int64_t intermediate);
  Status Forward(const ops::OpContext& ctx, const TensorView& x, Scratch& scratch,
                 const TensorView& out) const;

  const TensorView& gate() const { return gate_; }
  const TensorView& up() const { return up_; }
  const TensorView& down() const { return down_; }

 private:
  TensorView gate_, up_, down_;
  int64_t intermediate_ = 0;
};

}  // namespace dinfer::layers
