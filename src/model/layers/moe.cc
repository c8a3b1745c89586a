#include "model/layers/moe.h"

#include <algorithm>
#include <cstring>

namespace dinfer::layers {
namespace {

enum MoeSlot {
  kLogits = 100,
  kExperts,
  kWeights,
  kRows,
  kExpertOut,
  kGate,
  kUp,
  kAct,
  kShared,
};

StatusOr<std::vector<int32_t>> ReadTable(WeightSource& w, const std::string& name, int64_t vocab,
                                         int64_t top_k, int64_t num_experts) {
  DINFER_ASSIGN_OR_RETURN(TensorView t, w.Get(name, {vocab, top_k}));
  std::vector<int32_t> out(static_cast<size_t>(vocab * top_k));
  for (int64_t i = 0; i < vocab * top_k; ++i) {
    if (t.dtype == DType::kI32) {
      out[i] = t.as<int32_t>()[i];
    } else if (t.dtype == DType::kI64) {
      out[i] = static_cast<int32_t>(t.as<int64_t>()[i]);
    } else {
      return DataLoss("'{}': '{}' has dtype {}, expected i32 or i64", w.where(), name,
                      DTypeName(t.dtype));
    }
    if (out[i] < 0 || out[i] >= num_experts) {
      return DataLoss("'{}': '{}' names expert {} of {}", w.where(), name, out[i], num_experts);
    }
  }
  return out;
}

}  // namespace

StatusOr<MoeLayer> MoeLayer::Load(WeightSource& w, const std::string& prefix, const ModelConfig& c,
                                  bool hash_routed) {
  const DeepseekV4Config& v = *c.deepseek_v4;
  MoeLayer m;
  m.hidden_ = c.hidden_size;
  m.inter_ = c.intermediate_size;
  m.top_k_ = v.experts_per_token;
  m.vocab_ = c.vocab_size;
  m.normalize_ = v.norm_topk_prob;
  m.scaling_ = static_cast<float>(v.routed_scaling);
  m.limit_ = static_cast<float>(v.swiglu_limit);
  switch (v.scoring) {
    case DeepseekV4Config::Scoring::kSqrtSoftplus:
      m.scoring_ = kernels::cpu::RouterScoring::kSqrtSoftplus;
      break;
    case DeepseekV4Config::Scoring::kSoftmax:
      m.scoring_ = kernels::cpu::RouterScoring::kSoftmax;
      break;
    case DeepseekV4Config::Scoring::kSigmoid:
      m.scoring_ = kernels::cpu::RouterScoring::kSigmoid;
      break;
  }
  DINFER_ASSIGN_OR_RETURN(m.gate_, w.GetLinear(prefix + "gate.weight", v.num_experts, m.hidden_,
                                               v.fp8_block_rows, v.fp8_block_cols));
  if (hash_routed) {
    DINFER_ASSIGN_OR_RETURN(
        m.tid2eid_, ReadTable(w, prefix + "gate.tid2eid", c.vocab_size, m.top_k_, v.num_experts));
  } else if (w.Has(prefix + "gate.bias")) {
    DINFER_ASSIGN_OR_RETURN(m.bias_, w.GetF32(prefix + "gate.bias", {v.num_experts}));
  }
  auto load = [&](const std::string& p) -> StatusOr<Expert> {
    Expert e;
    const int64_t br = v.fp8_block_rows, bc = v.fp8_block_cols;
    DINFER_ASSIGN_OR_RETURN(e.w1, w.GetLinear(p + "w1.weight", m.inter_, m.hidden_, br, bc));
    DINFER_ASSIGN_OR_RETURN(e.w2, w.GetLinear(p + "w2.weight", m.hidden_, m.inter_, br, bc));
    DINFER_ASSIGN_OR_RETURN(e.w3, w.GetLinear(p + "w3.weight", m.inter_, m.hidden_, br, bc));
    return e;
  };
  for (int64_t e = 0; e < v.num_experts; ++e) {
    DINFER_ASSIGN_OR_RETURN(Expert ex, load(prefix + "experts." + std::to_string(e) + "."));
    m.experts_.push_back(ex);
  }
  if (v.num_shared_experts > 0) {
    // DeepSeek ships the shared experts as one MLP of num_shared_experts * inter rows.
    const int64_t inter = m.inter_ * v.num_shared_experts;
    Expert e;
    const std::string p = prefix + "shared_experts.";
    const int64_t br = v.fp8_block_rows, bc = v.fp8_block_cols;
    DINFER_ASSIGN_OR_RETURN(e.w1, w.GetLinear(p + "w1.weight", inter, m.hidden_, br, bc));
    DINFER_ASSIGN_OR_RETURN(e.w2, w.GetLinear(p + "w2.weight", m.hidden_, inter, br, bc));
    DINFER_ASSIGN_OR_RETURN(e.w3, w.GetLinear(p + "w3.weight", inter, m.hidden_, br, bc));
    m.shared_.push_back(e);
  }
  return m;
}

Status MoeLayer::RunExpert(const ops::OpContext& ctx, const Expert& e, const TensorView& x,
                           Workspace& ws, const TensorView& y) const {
  const int64_t m = x.rows(), inter = e.w1.rows();
  TensorView gate = ws.Get(kGate, m, inter), up = ws.Get(kUp, m, inter);
  TensorView act = ws.Get(kAct, m, inter);
  const TensorView weights[] = {e.w1, e.w3};
  const TensorView* const biases[] = {nullptr, nullptr};
  const TensorView outs[] = {gate, up};
  DINFER_RETURN_IF_ERROR(ops::LinearShared(ctx, x, weights, biases, outs));
  ops::SiluMulClamp(ctx, gate, up, limit_, act);
  return ops::Linear(ctx, act, e.w2, nullptr, y);
}

Status MoeLayer::Forward(const ops::OpContext& ctx, const TensorView& x,
                         std::span<const int32_t> token_ids, Workspace& ws,
                         const TensorView& out) const {
  const int64_t n = x.rows(), h = hidden_, ne = num_experts();
  TensorView logits = ws.Get(kLogits, n, ne);
  DINFER_RETURN_IF_ERROR(ops::Linear(ctx, x, gate_, nullptr, logits));
  TensorView chosen = ws.Get(kExperts, n, top_k_, DType::kI32);
  TensorView weights = ws.Get(kWeights, n, top_k_);
  std::vector<int32_t> hashed;
  kernels::cpu::RouterParams r;
  r.logits = logits.as<float>();
  r.num_tokens = n;
  r.num_experts = ne;
  r.top_k = top_k_;
  r.scoring = scoring_;
  r.bias = bias_.data != nullptr ? bias_.as<float>() : nullptr;
  if (!tid2eid_.empty()) {
    hashed.resize(static_cast<size_t>(n * top_k_));
    for (int64_t t = 0; t < n; ++t) {
      if (token_ids[t] < 0 || token_ids[t] >= vocab_) {
        return InvalidArgument("token id {} is outside the vocabulary [0, {})", token_ids[t],
                               vocab_);
      }
      std::copy_n(tid2eid_.data() + token_ids[t] * top_k_, top_k_, hashed.data() + t * top_k_);
    }
    r.hash_experts = hashed.data();
  }
  r.normalize = normalize_;
  r.scaling = scaling_;
  r.experts = chosen.as<int32_t>();
  r.weights = weights.as<float>();
  ops::Route(ctx, r);

  // Permute: the (token, weight) pairs of each expert, experts in order.
  std::vector<int64_t> count(static_cast<size_t>(ne) + 1, 0);
  for (int64_t i = 0; i < n * top_k_; ++i) ++count[chosen.as<int32_t>()[i] + 1];
  for (int64_t e = 0; e < ne; ++e) count[e + 1] += count[e];
  std::vector<int32_t> token_of(static_cast<size_t>(n * top_k_));
  std::vector<float> weight_of(static_cast<size_t>(n * top_k_));
  std::vector<int64_t> fill(count.begin(), count.end() - 1);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = 0; k < top_k_; ++k) {
      const int32_t e = chosen.as<int32_t>()[t * top_k_ + k];
      token_of[fill[e]] = static_cast<int32_t>(t);
      weight_of[fill[e]++] = weights.as<float>()[t * top_k_ + k];
    }
  }
  float* y = out.as<float>();
  std::fill(y, y + n * h, 0.0f);
  for (int64_t e = 0; e < ne; ++e) {
    const int64_t begin = count[e], m = count[e + 1] - begin;
    if (m == 0) continue;
    TensorView rows = ws.Get(kRows, m, h), expert_out = ws.Get(kExpertOut, m, h);
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(rows.as<float>() + i * h, x.as<float>() + token_of[begin + i] * h,
                  sizeof(float) * static_cast<size_t>(h));
    }
    DINFER_RETURN_IF_ERROR(RunExpert(ctx, experts_[e], rows, ws, expert_out));
    for (int64_t i = 0; i < m; ++i) {
      const float wgt = weight_of[begin + i];
      float* dst = y + token_of[begin + i] * h;
      const float* src = expert_out.as<float>() + i * h;
      for (int64_t d = 0; d < h; ++d) dst[d] += src[d] * wgt;
    }
  }
  for (const Expert& s : shared_) {
    TensorView shared_out = ws.Get(kShared, n, h);
    DINFER_RETURN_IF_ERROR(RunExpert(ctx, s, x, ws, shared_out));
    ops::Add(ctx, out, shared_out);
  }
  return OkStatus();
}

}  // namespace dinfer::layers
