#include "model/layers/attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/quant.h"
#include "model/layers/scratch.h"

namespace dinfer::layers {
namespace {

TensorView Head(const Tensor& t, int64_t rows) {
  return TensorView::Make(t.view().data, DType::kF32, {rows, t.view().cols()});
}

StatusOr<std::optional<TensorView>> OptionalF32(WeightSource& w, const std::string& name,
                                                int64_t n) {
  if (!w.Has(name)) return std::optional<TensorView>();
  DINFER_ASSIGN_OR_RETURN(TensorView v, w.GetF32(name, {n}));
  return std::optional<TensorView>(v);
}

}  // namespace

Status ReadKvCacheScales(WeightSource& w, const std::string& prefix, int64_t num_kv_heads,
                         AttentionWeights& out) {
  // The scale in tensor `name`, if the checkpoint has it.
  auto read = [&](const std::string& name) -> StatusOr<std::optional<float>> {
    if (!w.Has(name)) return std::optional<float>();
    DINFER_ASSIGN_OR_RETURN(TensorView t, w.Get(name));
    const int64_t n = t.numel();
    if (n != 1 && n != num_kv_heads) {
      return DataLoss(
          "'{}': tensor '{}' has shape {}: a KV-cache scale is one value or one per KV "
          "head ({})",
          w.where(), name, t.ShapeString(), num_kv_heads);
    }
    std::vector<float> v(static_cast<size_t>(n));
    kernels::cpu::DequantizeRow(t.dtype, t.data, v.data(), n);
    float most = 0.0f;
    for (float x : v) {
      if (!(x > 0.0f) || !std::isfinite(x)) {
        return DataLoss("'{}': tensor '{}' holds the KV-cache scale {}, not a positive number",
                        w.where(), name, x);
      }
      most = std::max(most, x);
    }
    return std::optional<float>(most);
  };
  DINFER_ASSIGN_OR_RETURN(std::optional<float> k, read(prefix + "k_scale"));
  DINFER_ASSIGN_OR_RETURN(std::optional<float> v, read(prefix + "v_scale"));
  if (!k && !v) {
    DINFER_ASSIGN_OR_RETURN(std::optional<float> kv, read(prefix + "kv_scale"));
    k = v = kv;
  }
  if (!k && !v) {
    DINFER_ASSIGN_OR_RETURN(k, read(prefix + "k_proj.output_scale"));
    DINFER_ASSIGN_OR_RETURN(v, read(prefix + "v_proj.output_scale"));
  }
  out.k_scale = k;
  out.v_scale = v;
  return OkStatus();
}

StatusOr<AttentionLayer> AttentionLayer::Load(WeightSource& w, const ModelConfig& c,
                                              int64_t layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  const int64_t q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  AttentionLayer a;
  DINFER_ASSIGN_OR_RETURN(a.w_.q, w.Get(p + "q_proj.weight", {q_dim, c.hidden_size}));
  DINFER_ASSIGN_OR_RETURN(a.w_.k, w.Get(p + "k_proj.weight", {kv_dim, c.hidden_size}));
  DINFER_ASSIGN_OR_RETURN(a.w_.v, w.Get(p + "v_proj.weight", {kv_dim, c.hidden_size}));
  DINFER_ASSIGN_OR_RETURN(a.w_.o, w.Get(p + "o_proj.weight", {c.hidden_size, q_dim}));
  for (const TensorView* t : {&a.w_.q, &a.w_.k, &a.w_.v, &a.w_.o}) {
    if (!ops::LinearSupports(t->dtype)) {
      return Unimplemented("'{}': layer {} attention weights have dtype {}, not supported",
                           w.where(), layer, DTypeName(t->dtype));
    }
  }
  if (c.attention_bias) {
    DINFER_ASSIGN_OR_RETURN(a.w_.q_bias, OptionalF32(w, p + "q_proj.bias", q_dim));
    DINFER_ASSIGN_OR_RETURN(a.w_.k_bias, OptionalF32(w, p + "k_proj.bias", kv_dim));
    DINFER_ASSIGN_OR_RETURN(a.w_.v_bias, OptionalF32(w, p + "v_proj.bias", kv_dim));
    DINFER_ASSIGN_OR_RETURN(a.w_.o_bias, OptionalF32(w, p + "o_proj.bias", c.hidden_size));
  }
  DINFER_RETURN_IF_ERROR(ReadKvCacheScales(w, p, c.num_kv_heads, a.w_));
  if (c.qk_norm) {
    DINFER_ASSIGN_OR_RETURN(TensorView qn, w.GetF32(p + "q_norm.weight", {c.head_dim}));
    DINFER_ASSIGN_OR_RETURN(TensorView kn, w.GetF32(p + "k_norm.weight", {c.head_dim}));
    a.w_.q_norm = qn;
    a.w_.k_norm = kn;
  }
  a.opt_.num_heads = c.num_heads;
  a.opt_.num_kv_heads = c.num_kv_heads;
  a.opt_.head_dim = c.head_dim;
  a.opt_.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.opt_.sliding_window = c.layer_sliding[layer] ? c.sliding_window : 0;
  a.rotary_dim_ = c.rotary_dim;
  a.rope_interleaved_ = c.rope_interleaved;
  a.norm_eps_ = static_cast<float>(c.rms_norm_eps);
  return a;
}

Status AttentionLayer::Forward(const ops::OpContext& ctx, const TensorView& x,
                               const ops::KvLayerView& kv, const ops::AttentionMetadata& meta,
                               std::span<const float> inv_freq, Scratch& s,
                               const TensorView& out) const {
  const int64_t n = x.rows();
  TensorView q = Head(s.q, n), k = Head(s.k, n), v = Head(s.v, n), attn = Head(s.attn, n);
  auto bias = [](const std::optional<TensorView>& b) { return b ? &*b : nullptr; };
  const TensorView ws[] = {w_.q, w_.k, w_.v};
  const TensorView* const biases[] = {bias(w_.q_bias), bias(w_.k_bias), bias(w_.v_bias)};
  const TensorView ys[] = {q, k, v};
  DINFER_RETURN_IF_ERROR(ops::LinearShared(ctx, x, ws, biases, ys));
  if (w_.q_norm) {
    ops::HeadRmsNorm(ctx, q, opt_.num_heads, *w_.q_norm, norm_eps_);
    ops::HeadRmsNorm(ctx, k, opt_.num_kv_heads, *w_.k_norm, norm_eps_);
  }
  ops::Rope(ctx, q, opt_.num_heads, opt_.head_dim, rotary_dim_, meta.positions, inv_freq,
            rope_interleaved_);
  ops::Rope(ctx, k, opt_.num_kv_heads, opt_.head_dim, rotary_dim_, meta.positions, inv_freq,
            rope_interleaved_);
  ops::PagedAttention(ctx, q, k, v, kv, meta, opt_, attn);
  return ops::Linear(ctx, attn, w_.o, bias(w_.o_bias), out);
}

}  // namespace dinfer::layers
