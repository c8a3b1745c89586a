#include "model/layers/mlp.h"

#include "model/layers/scratch.h"

namespace dinfer::layers {

StatusOr<GatedMlp> GatedMlp::Load(WeightSource& w, const std::string& prefix, int64_t hidden,
                                  int64_t intermediate) {
  GatedMlp m;
  DINFER_ASSIGN_OR_RETURN(m.gate_, w.Get(prefix + "gate_proj.weight", {intermediate, hidden}));
  DINFER_ASSIGN_OR_RETURN(m.up_, w.Get(prefix + "up_proj.weight", {intermediate, hidden}));
  DINFER_ASSIGN_OR_RETURN(m.down_, w.Get(prefix + "down_proj.weight", {hidden, intermediate}));
  for (const TensorView* t : {&m.gate_, &m.up_, &m.down_}) {
    if (!ops::LinearSupports(t->dtype)) {
      return Unimplemented("'{}': {} weights have dtype {}, not supported", w.where(), prefix,
                           DTypeName(t->dtype));
    }
  }
  m.intermediate_ = intermediate;
  return m;
}

Status GatedMlp::Forward(const ops::OpContext& ctx, const TensorView& x, Scratch& s,
                         const TensorView& out) const {
  const int64_t n = x.rows();
  auto rows = [n](const Tensor& t) {
    return TensorView::Make(t.view().data, DType::kF32, {n, t.view().cols()});
  };
  TensorView gate = rows(s.gate), up = rows(s.up), act = rows(s.act);
  const TensorView ws[] = {gate_, up_};
  const TensorView* const biases[] = {nullptr, nullptr};
  const TensorView ys[] = {gate, up};
  DINFER_RETURN_IF_ERROR(ops::LinearShared(ctx, x, ws, biases, ys));
  ops::SiluMul(ctx, gate, up, act);
  return ops::Linear(ctx, act, down_, nullptr, out);
}

}  // namespace dinfer::layers
