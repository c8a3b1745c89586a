#include "model/layers/hyper_connection.h"

namespace dinfer::layers {
namespace {

// mixes [n, out] = rmsnorm(streams) · fnᵀ, the RMS taken over all hc * hidden values of a token.
Status Mixes(const ops::OpContext& ctx, const TensorView& streams, const TensorView& fn, float eps,
             Workspace& ws, const TensorView& mixes) {
  const int64_t n = streams.rows(), width = streams.cols();
  TensorView normed = ws.Get(kHcNormed, n, width);
  ops::RmsNormPerHead(ctx, streams, width, nullptr, eps, normed);
  return ops::Linear(ctx, normed, fn, nullptr, mixes);
}

}  // namespace

StatusOr<HyperConnection> HyperConnection::Load(WeightSource& w, const std::string& prefix,
                                                const HcSettings& s) {
  HyperConnection h;
  h.s_ = s;
  const int64_t mix = (2 + s.hc) * s.hc;
  DINFER_ASSIGN_OR_RETURN(h.fn_, w.GetF32(prefix + "fn", {mix, s.hc * s.hidden}));
  DINFER_ASSIGN_OR_RETURN(h.base_, w.GetF32(prefix + "base", {mix}));
  DINFER_ASSIGN_OR_RETURN(h.scale_, w.GetF32(prefix + "scale", {3}));
  return h;
}

Status HyperConnection::Pre(const ops::OpContext& ctx, const TensorView& streams, Workspace& ws,
                            const TensorView& collapsed) const {
  const int64_t n = streams.rows(), hc = s_.hc;
  TensorView mixes = ws.Get(kHcMixes, n, (2 + hc) * hc);
  DINFER_RETURN_IF_ERROR(Mixes(ctx, streams, fn_, s_.norm_eps, ws, mixes));
  kernels::cpu::HcPreParams p;
  p.streams = streams.as<float>();
  p.mixes = mixes.as<float>();
  p.base = base_.as<float>();
  p.scale = scale_.as<float>();
  p.num_tokens = n;
  p.hc = hc;
  p.dim = s_.hidden;
  p.iters = s_.sinkhorn_iters;
  p.eps = s_.hc_eps;
  p.collapsed = collapsed.as<float>();
  p.post = ws.Get(kHcPost, n, hc).as<float>();
  p.comb = ws.Get(kHcComb, n, hc * hc).as<float>();
  ops::HcPre(ctx, p);
  return OkStatus();
}

void HyperConnection::Post(const ops::OpContext& ctx, const TensorView& streams,
                           const TensorView& y, Workspace& ws, const TensorView& out) const {
  const int64_t n = streams.rows(), hc = s_.hc;
  kernels::cpu::HcPostParams p;
  p.streams = streams.as<float>();
  p.y = y.as<float>();
  p.post = ws.Get(kHcPost, n, hc).as<float>();
  p.comb = ws.Get(kHcComb, n, hc * hc).as<float>();
  p.num_tokens = n;
  p.hc = hc;
  p.dim = s_.hidden;
  p.out = out.as<float>();
  ops::HcPost(ctx, p);
}

StatusOr<HyperHead> HyperHead::Load(WeightSource& w, const std::string& prefix,
                                    const HcSettings& s) {
  HyperHead h;
  h.s_ = s;
  DINFER_ASSIGN_OR_RETURN(h.fn_, w.GetF32(prefix + "fn", {s.hc, s.hc * s.hidden}));
  DINFER_ASSIGN_OR_RETURN(h.base_, w.GetF32(prefix + "base", {s.hc}));
  DINFER_ASSIGN_OR_RETURN(h.scale_, w.GetF32(prefix + "scale", {1}));
  return h;
}

Status HyperHead::Forward(const ops::OpContext& ctx, const TensorView& streams, Workspace& ws,
                          const TensorView& out) const {
  const int64_t n = streams.rows();
  TensorView mixes = ws.Get(kHcMixes, n, s_.hc);
  DINFER_RETURN_IF_ERROR(Mixes(ctx, streams, fn_, s_.norm_eps, ws, mixes));
  kernels::cpu::HcHeadParams p;
  p.streams = streams.as<float>();
  p.mixes = mixes.as<float>();
  p.base = base_.as<float>();
  p.scale = scale_.as<float>()[0];
  p.num_tokens = n;
  p.hc = s_.hc;
  p.dim = s_.hidden;
  p.eps = s_.hc_eps;
  p.out = out.as<float>();
  ops::HcHead(ctx, p);
  return OkStatus();
}

}  // namespace dinfer::layers
