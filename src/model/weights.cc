#include "model/weights.h"

#include <regex>

#include "kernels/cpu/quant.h"
#include "ops/ops.h"

namespace dinfer {

std::unique_ptr<WeightSource> WeightSource::FromSafetensors(
    std::unique_ptr<SafetensorsCheckpoint> ckpt, std::string where) {
  std::unique_ptr<WeightSource> w(new WeightSource());
  w->ckpt_ = std::move(ckpt);
  w->where_ = std::move(where);
  return w;
}

std::unique_ptr<WeightSource> WeightSource::FromGguf(std::shared_ptr<const GgufFile> gguf) {
  std::unique_ptr<WeightSource> w(new WeightSource());
  w->where_ = gguf->path();
  w->gguf_ = std::move(gguf);
  return w;
}

std::string WeightSource::Translate(const std::string& hf_name) const {
  if (!gguf_) {
    if (fallback_ && ckpt_->Find(hf_name) == nullptr) {
      std::string other = fallback_(hf_name);
      if (ckpt_->Find(other) != nullptr) return other;
    }
    return hf_name;
  }
  static const std::pair<std::string, std::string> kGlobal[] = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  for (const auto& [hf, gg] : kGlobal) {
    if (hf_name == hf) return gg;
  }
  static const std::pair<std::string, std::string> kLayer[] = {
      {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"},
      {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"},
      {"mlp.gate_proj", "ffn_gate"},
      {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},
      {"input_layernorm", "attn_norm"},
      {"post_attention_layernorm", "ffn_norm"},
  };
  static const std::regex kLayerRe(R"(model\.layers\.(\d+)\.(.+)\.(weight|bias))");
  std::smatch m;
  if (std::regex_match(hf_name, m, kLayerRe)) {
    for (const auto& [hf, gg] : kLayer) {
      if (m[2] == hf) return "blk." + m[1].str() + "." + gg + "." + m[3].str();
    }
  }
  return hf_name;
}

bool WeightSource::Has(const std::string& hf_name) const {
  const std::string name = Translate(hf_name);
  return gguf_ ? gguf_->FindTensor(name) != nullptr : ckpt_->Find(name) != nullptr;
}

StatusOr<TensorView> WeightSource::Get(const std::string& hf_name) const {
  const std::string name = Translate(hf_name);
  if (gguf_) {
    const GgufTensorInfo* info = gguf_->FindTensor(name);
    if (info == nullptr) return NotFound("'{}' has no tensor '{}'", where_, name);
    return gguf_->TensorData(*info);
  }
  const SafetensorsEntry* e = ckpt_->Find(name);
  if (e == nullptr) return NotFound("'{}' has no tensor '{}'", where_, name);
  if (e->view.data == nullptr) {
    return Unimplemented("'{}': tensor '{}' has dtype {} which dinfer cannot load yet", e->file,
                         name, e->dtype_name);
  }
  return e->view;
}

StatusOr<TensorView> WeightSource::Get(const std::string& hf_name,
                                       std::initializer_list<int64_t> shape) const {
  DINFER_ASSIGN_OR_RETURN(TensorView v, Get(hf_name));
  bool ok = v.ndim == static_cast<int>(shape.size());
  int i = 0;
  for (int64_t d : shape) ok = ok && v.shape[i++] == d;
  if (!ok) {
    std::vector<int64_t> want(shape);
    return DataLoss("'{}': tensor '{}' has shape {}, expected {}", where_, Translate(hf_name),
                    v.ShapeString(), TensorView::Make(nullptr, v.dtype, want).ShapeString());
  }
  return v;
}

StatusOr<TensorView> WeightSource::GetF32(const std::string& hf_name,
                                          std::initializer_list<int64_t> shape) {
  DINFER_ASSIGN_OR_RETURN(TensorView v, Get(hf_name, shape));
  if (v.dtype == DType::kF32) return v;
  Tensor t = Tensor::Empty(DType::kF32, std::vector<int64_t>(shape));
  for (int64_t r = 0; r < v.rows(); ++r) {
    kernels::cpu::DequantizeRow(v.dtype, v.row_ptr(r), t.data<float>() + r * v.cols(), v.cols());
  }
  owned_.push_back(std::move(t));
  return owned_.back().view();
}

}  // namespace dinfer

namespace dinfer {
namespace {

// A scale tensor as f32 values.
std::vector<float> ScalesF32(const TensorView& s) {
  std::vector<float> out(static_cast<size_t>(s.numel()));
  kernels::cpu::DequantizeRow(s.dtype, s.data, out.data(), s.numel());
  return out;
}

}  // namespace

StatusOr<TensorView> WeightSource::GetLinear(const std::string& name, int64_t out, int64_t in,
                                             int64_t block_rows, int64_t block_cols) {
  DINFER_ASSIGN_OR_RETURN(TensorView w, Get(name));
  if (w.dtype != DType::kF8E4M3 && w.dtype != DType::kI8) {
    DINFER_ASSIGN_OR_RETURN(w, Get(name, {out, in}));
    if (!ops::LinearSupports(w.dtype)) {
      return Unimplemented("'{}': weight '{}' has dtype {}, which linear layers cannot use", where_,
                           name, DTypeName(w.dtype));
    }
    return w;
  }
  const std::string base = name.substr(0, name.rfind(".weight"));
  std::string scale_name = base + ".scale";
  if (!Has(scale_name)) scale_name = name + "_scale_inv";
  if (!Has(scale_name)) {
    return NotFound("'{}': {} weight '{}' has no scales ('{}.scale')", where_, DTypeName(w.dtype),
                    name, base);
  }
  DINFER_ASSIGN_OR_RETURN(TensorView scale, Get(scale_name));
  if (scale.dtype != DType::kF8E8M0 && scale.dtype != DType::kF32 && scale.dtype != DType::kBF16) {
    return DataLoss("'{}': scales '{}' have dtype {}", where_, scale_name, DTypeName(scale.dtype));
  }
  if (in % 32 != 0) {
    return Unimplemented("'{}': quantized weight '{}' has {} inputs, not a multiple of 32", where_,
                         name, in);
  }
  const std::vector<float> scales = ScalesF32(scale);
  if (w.dtype == DType::kF8E4M3) {
    DINFER_RETURN_IF_ERROR(Get(name, {out, in}).status());
    const int64_t sr = (out + block_rows - 1) / block_rows, sc = (in + block_cols - 1) / block_cols;
    DINFER_RETURN_IF_ERROR(Get(scale_name, {sr, sc}).status());
    if (block_cols % 32 != 0) {
      return Unimplemented("'{}': FP8 scale blocks of {} columns are not whole 32-column blocks",
                           where_, block_cols);
    }
    Tensor t = Tensor::Empty(DType::kF8E4M3B32, {out, in});
    kernels::cpu::RepackF8E4M3(static_cast<const uint8_t*>(w.data), scales.data(), out, in,
                               block_rows, block_cols, t.data<kernels::cpu::BlockF8E4M3B32>());
    owned_.push_back(std::move(t));
    return owned_.back().view();
  }
  DINFER_RETURN_IF_ERROR(Get(name, {out, in / 2}).status());
  DINFER_RETURN_IF_ERROR(Get(scale_name, {out, in / 32}).status());
  Tensor t = Tensor::Empty(DType::kMxfp4, {out, in});
  if (!kernels::cpu::RepackMxfp4(static_cast<const uint8_t*>(w.data), scales.data(), out, in,
                                 t.data<kernels::cpu::BlockMxfp4>())) {
    return DataLoss("'{}': FP4 scales '{}' are not all powers of two (UE8M0)", where_, scale_name);
  }
  owned_.push_back(std::move(t));
  return owned_.back().view();
}

}  // namespace dinfer
