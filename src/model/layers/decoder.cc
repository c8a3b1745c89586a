#include "model/layers/decoder.h"

#include <cmath>
#include <numbers>

#include "base/logging.h"

namespace dinfer::layers {

std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int64_t half = c.rotary_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.rotary_dim);
    inv[i] = 1.0f / static_cast<float>(std::pow(c.rope_theta, static_cast<double>(exponent)));
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScalingType::kLinear) {
    for (auto& f : inv) f = static_cast<float>(f / s.factor);
  } else if (s.type == RopeScalingType::kLlama3) {
    const double old_len = static_cast<double>(s.original_max_position);
    const double low_wavelen = old_len / s.low_freq_factor;
    const double high_wavelen = old_len / s.high_freq_factor;
    for (auto& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / s.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = static_cast<float>((1.0 - smooth) * f / s.factor + smooth * f);
      }
    }
  }
  return inv;
}

StatusOr<std::unique_ptr<Model>> DecoderModel::Build(const ModelConfig& c, WeightSource& w,
                                                     const DecoderOptions& options) {
  std::unique_ptr<DecoderModel> m(new DecoderModel(c, options));
  DINFER_ASSIGN_OR_RETURN(m->embed_,
                          w.Get("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
  DINFER_ASSIGN_OR_RETURN(m->final_norm_, w.GetF32("model.norm.weight", {c.hidden_size}));
  if (!c.tie_word_embeddings && w.Has("lm_head.weight")) {
    DINFER_ASSIGN_OR_RETURN(m->lm_head_, w.Get("lm_head.weight", {c.vocab_size, c.hidden_size}));
  } else {
    m->lm_head_ = m->embed_;
  }
  if (!ops::LinearSupports(m->lm_head_.dtype)) {
    return Unimplemented("'{}': LM head dtype {} is not supported", w.where(),
                         DTypeName(m->lm_head_.dtype));
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer layer;
    DINFER_ASSIGN_OR_RETURN(layer.input_norm,
                            w.GetF32(p + "input_layernorm.weight", {c.hidden_size}));
    DINFER_ASSIGN_OR_RETURN(layer.post_norm,
                            w.GetF32(p + "post_attention_layernorm.weight", {c.hidden_size}));
    DINFER_ASSIGN_OR_RETURN(layer.attn, AttentionLayer::Load(w, c, i));
    DINFER_ASSIGN_OR_RETURN(layer.mlp,
                            GatedMlp::Load(w, p + "mlp.", c.hidden_size, c.intermediate_size));
    m->layers_.push_back(std::move(layer));
  }
  m->inv_freq_ = RopeInvFreq(c);
  return std::unique_ptr<Model>(std::move(m));
}

Status DecoderModel::Forward(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                             const TensorView& logits) {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  const int64_t h = c.hidden_size;
  if (n == 0) return OkStatus();
  if (logits.rows() != static_cast<int64_t>(in.logits_rows.size()) ||
      logits.cols() != c.vocab_size) {
    return InvalidArgument("forward: logits buffer {} does not fit {} rows of {}",
                           logits.ShapeString(), in.logits_rows.size(), c.vocab_size);
  }
  scratch_.Reserve(n, c.num_heads * c.head_dim, kv_dim(), c.intermediate_size);
  if (hidden_.empty() || hidden_.view().rows() < n) {
    hidden_ = Tensor::Empty(DType::kF32, {n, h});
    normed_ = Tensor::Empty(DType::kF32, {n, h});
    branch_ = Tensor::Empty(DType::kF32, {n, h});
  }
  auto rows = [](const Tensor& t, int64_t r) {
    return TensorView::Make(t.view().data, DType::kF32, {r, t.view().cols()});
  };
  TensorView hidden = rows(hidden_, n), normed = rows(normed_, n), branch = rows(branch_, n);
  const float emb_scale = options_.scale_embeddings ? std::sqrt(static_cast<float>(h)) : 1.0f;
  DINFER_RETURN_IF_ERROR(ops::Embedding(ctx, embed_, in.tokens, hidden, emb_scale));
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float off = options_.norm_weight_offset;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const Layer& layer = layers_[i];
    ops::RmsNorm(ctx, hidden, layer.input_norm, eps, normed, off);
    DINFER_RETURN_IF_ERROR(
        layer.attn.Forward(ctx, normed, kv.layer(i), in.meta, inv_freq_, scratch_, branch));
    ops::Add(ctx, hidden, branch);
    ops::RmsNorm(ctx, hidden, layer.post_norm, eps, normed, off);
    DINFER_RETURN_IF_ERROR(layer.mlp.Forward(ctx, normed, scratch_, branch));
    ops::Add(ctx, hidden, branch);
  }
  const int64_t nl = static_cast<int64_t>(in.logits_rows.size());
  if (last_.empty() || last_.view().rows() < nl) last_ = Tensor::Empty(DType::kF32, {nl, h});
  TensorView last = rows(last_, nl);
  for (int64_t r = 0; r < nl; ++r) {
    const int32_t src = in.logits_rows[r];
    if (src < 0 || src >= n) return InvalidArgument("forward: logits row {} out of range", src);
    std::copy_n(hidden.as<float>() + src * h, h, last.as<float>() + r * h);
  }
  ops::RmsNorm(ctx, last, final_norm_, eps, last, off);
  return ops::Linear(ctx, last, lm_head_, nullptr, logits);
}

}  // namespace dinfer::layers
