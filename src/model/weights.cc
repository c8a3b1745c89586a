#include "model/weights.h"

#include <regex>

#include "kernels/cpu/quant.h"

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
  if (!gguf_) return hf_name;
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
