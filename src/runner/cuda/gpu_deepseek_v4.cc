#include "runner/cuda/gpu_deepseek_v4.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/cuda/device.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/v4_compress.h"
#include "kernels/cuda/v4_mix.h"
#include "kernels/cuda/v4_sparse_attention.h"
#include "model/archs/deepseek_v4.h"
#include "ops/deepseek_ops.h"
#include "runner/cuda/weight_upload.h"

namespace dinfer {
namespace {

namespace kc = kernels::cuda;
using cuda::Bytes;
using cuda::DeviceTensor;

float InvSqrt(int64_t n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); }

StatusOr<DeviceTensor> F32(const TensorView& v) { return DeviceTensor::Upload(v, DType::kF32); }

kc::RouterScoring Scoring(DeepseekV4Config::Scoring s) {
  switch (s) {
    case DeepseekV4Config::Scoring::kSoftmax:
      return kc::RouterScoring::kSoftmax;
    case DeepseekV4Config::Scoring::kSigmoid:
      return kc::RouterScoring::kSigmoid;
    case DeepseekV4Config::Scoring::kSqrtSoftplus:
      break;
  }
  return kc::RouterScoring::kSqrtSoftplus;
}

Status Check(int error, std::string_view what) { return cuda::CudaStatus(error, what); }

// Sparse attention splits its keys over up to kAttnSplits CTAs a token for steps of up to
// kSplitTokens tokens (V4's 640 keys a token at batch 1: 10 splits of 64 keys, one cluster).
constexpr int64_t kSplitTokens = 256, kAttnSplits = 16;

}  // namespace

void GpuDeepseekV4::Finish(Layer& l, bool main) {
  const ModelConfig& c = config_;
  const DeepseekV4Config& v = *c.deepseek_v4;
  int64_t col = v.q_lora_rank + c.head_dim;
  for (auto* comp : {&l.comp, &l.index_comp}) {
    if (!*comp) continue;
    (*comp)->width = (*comp)->dim * ((*comp)->overlap ? 2 : 1);
    (*comp)->col = col;
    col += 2 * (*comp)->width;
  }
  l.index_weights_col = col;
  l.x_cols = l.x_proj.view().dim(0);
  l.q_cols = l.q_proj.view().dim(0);
  x_cols_max_ = std::max(x_cols_max_, l.x_cols);
  q_cols_max_ = std::max(q_cols_max_, l.q_cols);
  int64_t dense = Bytes(l.x_proj) + Bytes(l.q_proj) + Bytes(l.wo_a) + Bytes(l.wo_b) +
                  Bytes(l.gate) + Bytes(l.hc_attn.fn) + Bytes(l.hc_ffn.fn);
  if (l.shared_w13) dense += Bytes(*l.shared_w13) + Bytes(*l.shared_w2);
  const int64_t experts = l.w13.view().dim(0);
  const int64_t per_expert = (Bytes(l.w13) + Bytes(l.w2)) / std::max<int64_t>(experts, 1);
  weight_bytes_ += dense + Bytes(l.w13) + Bytes(l.w2);
  if (main) token_weight_bytes_ += dense + std::min(v.experts_per_token, experts) * per_expert;
}

StatusOr<GpuDeepseekV4::Layer> GpuDeepseekV4::UploadBlock(const DeepseekV4Model& model,
                                                          size_t index, bool mtp) {
  const ModelConfig& c = model.config();
  const DType bf16 = DType::kBF16;
  const DeepseekV4Model::Block& b = mtp ? model.mtp()[index].block : model.layers()[index];
  const layers::CompressedAttentionWeights& a = b.attn.weights();
  Layer l;
  l.kind = b.attn.kind();
  DINFER_ASSIGN_OR_RETURN(l.attn_norm, F32(b.attn_norm));
  DINFER_ASSIGN_OR_RETURN(l.ffn_norm, F32(b.ffn_norm));
  DINFER_ASSIGN_OR_RETURN(l.q_norm, F32(a.q_norm));
  DINFER_ASSIGN_OR_RETURN(l.kv_norm, F32(a.kv_norm));
  DINFER_ASSIGN_OR_RETURN(l.sinks, F32(a.sinks));
  for (auto [dst, src] : {std::pair{&l.hc_attn, &b.attn_hc}, std::pair{&l.hc_ffn, &b.ffn_hc}}) {
    DINFER_ASSIGN_OR_RETURN(dst->fn, F32(src->fn()));
    DINFER_ASSIGN_OR_RETURN(dst->base, F32(src->base()));
    DINFER_ASSIGN_OR_RETURN(dst->scale, F32(src->scale()));
  }
  std::vector<const TensorView*> x_parts = {&a.wq_a, &a.wkv};
  auto compressor = [&](const std::optional<layers::CompressorWeights>& w,
                        std::optional<Compressor>& dst) -> Status {
    if (!w) return OkStatus();
    Compressor comp;
    DINFER_ASSIGN_OR_RETURN(comp.ape, F32(w->ape));
    DINFER_ASSIGN_OR_RETURN(comp.norm, F32(w->norm));
    comp.dim = w->dim;
    comp.rate = w->rate;
    comp.overlap = w->overlap;
    dst = std::move(comp);
    x_parts.push_back(&w->wkv);
    x_parts.push_back(&w->wgate);
    return OkStatus();
  };
  DINFER_RETURN_IF_ERROR(compressor(a.compressor, l.comp));
  DINFER_RETURN_IF_ERROR(compressor(a.index_compressor, l.index_comp));
  if (a.index_compressor) x_parts.push_back(&a.index_weights);
  DINFER_ASSIGN_OR_RETURN(l.x_proj, cuda::UploadRows(x_parts, bf16));
  if (a.index_compressor) {
    DINFER_ASSIGN_OR_RETURN(l.q_proj, cuda::UploadRows({&a.wq_b, &a.index_wq_b}, bf16));
  } else {
    DINFER_ASSIGN_OR_RETURN(l.q_proj, cuda::UploadRows({&a.wq_b}, bf16));
  }
  DINFER_ASSIGN_OR_RETURN(l.wo_a, cuda::UploadRows({&a.wo_a}, bf16));
  DINFER_ASSIGN_OR_RETURN(l.wo_b, cuda::UploadRows({&a.wo_b}, bf16));

  const layers::MoeLayer& m = b.moe;
  DINFER_ASSIGN_OR_RETURN(l.gate, cuda::UploadRows({&m.gate()}, bf16));
  if (m.bias().data != nullptr) {
    DINFER_ASSIGN_OR_RETURN(DeviceTensor bias, F32(m.bias()));
    l.gate_bias = std::move(bias);
  }
  if (!m.tid2eid().empty()) {
    const size_t bytes = m.tid2eid().size() * sizeof(int32_t);
    DINFER_ASSIGN_OR_RETURN(l.tid2eid, cuda::DeviceBuffer::Allocate(bytes));
    DINFER_RETURN_IF_ERROR(l.tid2eid.CopyFromHost(m.tid2eid().data(), bytes));
  }
  const int64_t ne = m.num_experts(), h = c.hidden_size, inter = c.intermediate_size;
  DINFER_ASSIGN_OR_RETURN(l.w13, DeviceTensor::Empty(bf16, {ne, 2 * inter, h}));
  DINFER_ASSIGN_OR_RETURN(l.w2, DeviceTensor::Empty(bf16, {ne, h, inter}));
  for (int64_t e = 0; e < ne; ++e) {
    const layers::MoeLayer::Expert& x = m.experts()[static_cast<size_t>(e)];
    // Rows of expert e in a [E * rows, cols] view of the stacked matrices.
    DINFER_RETURN_IF_ERROR(cuda::CopyWeightRows(x.w1, l.w13, e * 2 * inter));
    DINFER_RETURN_IF_ERROR(cuda::CopyWeightRows(x.w3, l.w13, e * 2 * inter + inter));
    DINFER_RETURN_IF_ERROR(cuda::CopyWeightRows(x.w2, l.w2, e * h));
  }
  if (!m.shared().empty()) {
    const layers::MoeLayer::Expert& s = m.shared()[0];
    DINFER_ASSIGN_OR_RETURN(DeviceTensor w13, cuda::UploadRows({&s.w1, &s.w3}, bf16));
    DINFER_ASSIGN_OR_RETURN(DeviceTensor w2, cuda::UploadRows({&s.w2}, bf16));
    l.shared_w13 = std::move(w13);
    l.shared_w2 = std::move(w2);
  }
  Finish(l, !mtp);
  return l;
}

StatusOr<std::unique_ptr<GpuDeepseekV4>> GpuDeepseekV4::Upload(const DeepseekV4Model& model) {
  std::unique_ptr<GpuDeepseekV4> g(new GpuDeepseekV4(model.config()));
  const DType bf16 = DType::kBF16;
  DINFER_ASSIGN_OR_RETURN(g->embed_, cuda::UploadRows({&model.embed()}, bf16));
  DINFER_ASSIGN_OR_RETURN(g->lm_head_, cuda::UploadRows({&model.lm_head()}, bf16));
  DINFER_ASSIGN_OR_RETURN(g->final_norm_, F32(model.final_norm()));
  DINFER_ASSIGN_OR_RETURN(g->hc_head_.fn, F32(model.hc_head().fn()));
  DINFER_ASSIGN_OR_RETURN(g->hc_head_.base, F32(model.hc_head().base()));
  DINFER_ASSIGN_OR_RETURN(g->hc_head_.scale, F32(model.hc_head().scale()));
  DINFER_ASSIGN_OR_RETURN(g->inv_freq_main_, cuda::UploadF32(model.rope().main));
  DINFER_ASSIGN_OR_RETURN(g->inv_freq_compress_, cuda::UploadF32(model.rope().compress));
  g->weight_bytes_ = g->token_weight_bytes_ = Bytes(g->lm_head_);
  for (size_t i = 0; i < model.layers().size(); ++i) {
    DINFER_ASSIGN_OR_RETURN(Layer l, g->UploadBlock(model, i, false));
    g->layers_.push_back(std::move(l));
  }
  if (!model.mtp().empty()) {
    const DeepseekV4Model::Mtp& src = model.mtp()[0];
    auto mtp = std::make_unique<Mtp>();
    DINFER_ASSIGN_OR_RETURN(mtp->block, g->UploadBlock(model, 0, true));
    DINFER_ASSIGN_OR_RETURN(mtp->e_proj, cuda::UploadRows({&src.e_proj}, bf16));
    DINFER_ASSIGN_OR_RETURN(mtp->h_proj, cuda::UploadRows({&src.h_proj}, bf16));
    DINFER_ASSIGN_OR_RETURN(mtp->enorm, F32(src.enorm));
    DINFER_ASSIGN_OR_RETURN(mtp->hnorm, F32(src.hnorm));
    DINFER_ASSIGN_OR_RETURN(mtp->norm, F32(src.norm));
    DINFER_ASSIGN_OR_RETURN(mtp->head.fn, F32(src.head.fn()));
    DINFER_ASSIGN_OR_RETURN(mtp->head.base, F32(src.head.base()));
    DINFER_ASSIGN_OR_RETURN(mtp->head.scale, F32(src.head.scale()));
    g->weight_bytes_ += Bytes(mtp->e_proj) + Bytes(mtp->h_proj);
    g->mtp_ = std::move(mtp);
  }
  DINFER_ASSIGN_OR_RETURN(g->gemm_, kc::GemmRunner::Create());
  return g;
}

StatusOr<std::unique_ptr<GpuDeepseekV4>> GpuDeepseekV4::Random(const ModelConfig& c,
                                                               uint64_t seed) {
  DINFER_RETURN_IF_ERROR(c.Validate());
  if (!c.deepseek_v4) return InvalidArgument("GpuDeepseekV4: not a DeepSeek-V4 config");
  const DeepseekV4Config& v = *c.deepseek_v4;
  std::unique_ptr<GpuDeepseekV4> g(new GpuDeepseekV4(c));
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t hc = v.hc_mult, mix = (2 + hc) * hc;
  uint64_t stream_id = seed * 1000003;
  auto random = [&](DType dtype, std::vector<int64_t> shape,
                    float scale) -> StatusOr<DeviceTensor> {
    DINFER_ASSIGN_OR_RETURN(DeviceTensor t, DeviceTensor::Empty(dtype, shape));
    DINFER_RETURN_IF_ERROR(Check(
        kc::FillRandom(t.data(), dtype, t.view().numel(), ++stream_id, scale, nullptr), "random"));
    return t;
  };
  auto constant = [&](int64_t n, float value) {
    return cuda::UploadF32(std::vector<float>(static_cast<size_t>(n), value));
  };
  const DType bf16 = DType::kBF16, f32 = DType::kF32;
  DINFER_ASSIGN_OR_RETURN(g->embed_, random(bf16, {c.vocab_size, h}, 1.0f));
  DINFER_ASSIGN_OR_RETURN(g->lm_head_, random(bf16, {c.vocab_size, h}, InvSqrt(h)));
  DINFER_ASSIGN_OR_RETURN(g->final_norm_, constant(h, 1.0f));
  auto hc_weights = [&](HcWeights& w, int64_t rows, int64_t scales) -> Status {
    DINFER_ASSIGN_OR_RETURN(w.fn, random(f32, {rows, hc * h}, InvSqrt(hc * h)));
    DINFER_ASSIGN_OR_RETURN(w.base, random(f32, {rows}, 0.5f));
    DINFER_ASSIGN_OR_RETURN(w.scale, constant(scales, 1.0f));
    return OkStatus();
  };
  DINFER_RETURN_IF_ERROR(hc_weights(g->hc_head_, hc, 1));
  const layers::V4Rope rope = layers::DeepseekV4Rope(c);
  DINFER_ASSIGN_OR_RETURN(g->inv_freq_main_, cuda::UploadF32(rope.main));
  DINFER_ASSIGN_OR_RETURN(g->inv_freq_compress_, cuda::UploadF32(rope.compress));
  g->weight_bytes_ = g->token_weight_bytes_ = Bytes(g->lm_head_);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer l;
    l.kind = v.layer_attention[static_cast<size_t>(i)];
    DINFER_ASSIGN_OR_RETURN(l.attn_norm, constant(h, 1.0f));
    DINFER_ASSIGN_OR_RETURN(l.ffn_norm, constant(h, 1.0f));
    DINFER_ASSIGN_OR_RETURN(l.q_norm, constant(v.q_lora_rank, 1.0f));
    DINFER_ASSIGN_OR_RETURN(l.kv_norm, constant(d, 1.0f));
    DINFER_ASSIGN_OR_RETURN(l.sinks, random(f32, {c.num_heads}, 1.0f));
    DINFER_RETURN_IF_ERROR(hc_weights(l.hc_attn, mix, 3));
    DINFER_RETURN_IF_ERROR(hc_weights(l.hc_ffn, mix, 3));
    int64_t x_rows = v.q_lora_rank + d;
    auto compressor = [&](std::optional<Compressor>& dst, int64_t dim, int64_t rate,
                          bool overlap) -> Status {
      Compressor comp;
      comp.dim = dim;
      comp.rate = rate;
      comp.overlap = overlap;
      const int64_t width = dim * (overlap ? 2 : 1);
      DINFER_ASSIGN_OR_RETURN(comp.ape, random(f32, {rate, width}, 0.5f));
      DINFER_ASSIGN_OR_RETURN(comp.norm, constant(dim, 1.0f));
      x_rows += 2 * width;
      dst = std::move(comp);
      return OkStatus();
    };
    const bool sparse = l.kind == V4Attention::kCompressedSparse;
    if (l.kind != V4Attention::kSliding) {
      DINFER_RETURN_IF_ERROR(compressor(l.comp, d, v.Rate(l.kind), sparse));
    }
    if (sparse) {
      DINFER_RETURN_IF_ERROR(compressor(l.index_comp, v.index_head_dim, v.csa_rate, true));
      x_rows += v.index_heads;
    }
    const int64_t q_dim = c.num_heads * d;
    DINFER_ASSIGN_OR_RETURN(l.x_proj, random(bf16, {x_rows, h}, InvSqrt(h)));
    DINFER_ASSIGN_OR_RETURN(
        l.q_proj,
        random(bf16, {q_dim + (sparse ? v.index_heads * v.index_head_dim : 0), v.q_lora_rank},
               InvSqrt(v.q_lora_rank)));
    DINFER_ASSIGN_OR_RETURN(l.wo_a, random(bf16, {v.o_groups * v.o_lora_rank, q_dim / v.o_groups},
                                           InvSqrt(q_dim / v.o_groups)));
    DINFER_ASSIGN_OR_RETURN(
        l.wo_b, random(bf16, {h, v.o_groups * v.o_lora_rank}, InvSqrt(v.o_groups * v.o_lora_rank)));
    DINFER_ASSIGN_OR_RETURN(l.gate, random(bf16, {v.num_experts, h}, InvSqrt(h)));
    if (v.layer_hash_moe[static_cast<size_t>(i)]) {
      std::vector<int32_t> table(static_cast<size_t>(c.vocab_size * v.experts_per_token));
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(v.num_experts - 1));
      for (auto& e : table) e = pick(rng);
      const size_t bytes = table.size() * sizeof(int32_t);
      DINFER_ASSIGN_OR_RETURN(l.tid2eid, cuda::DeviceBuffer::Allocate(bytes));
      DINFER_RETURN_IF_ERROR(l.tid2eid.CopyFromHost(table.data(), bytes));
    } else {
      DINFER_ASSIGN_OR_RETURN(DeviceTensor bias, constant(v.num_experts, 0.0f));
      l.gate_bias = std::move(bias);
    }
    DINFER_ASSIGN_OR_RETURN(l.w13, random(bf16, {v.num_experts, 2 * inter, h}, InvSqrt(h)));
    DINFER_ASSIGN_OR_RETURN(l.w2, random(bf16, {v.num_experts, h, inter}, InvSqrt(inter)));
    if (v.num_shared_experts > 0) {
      const int64_t si = inter * v.num_shared_experts;
      DINFER_ASSIGN_OR_RETURN(DeviceTensor w13, random(bf16, {2 * si, h}, InvSqrt(h)));
      DINFER_ASSIGN_OR_RETURN(DeviceTensor w2, random(bf16, {h, si}, InvSqrt(si)));
      l.shared_w13 = std::move(w13);
      l.shared_w2 = std::move(w2);
    }
    g->Finish(l, true);
    g->layers_.push_back(std::move(l));
  }
  DINFER_RETURN_IF_ERROR(cuda::Synchronize());
  DINFER_ASSIGN_OR_RETURN(g->gemm_, kc::GemmRunner::Create());
  return g;
}

KvLayout GpuDeepseekV4::KvLayoutFor(int64_t block_size, DType /*kv_dtype*/) const {
  KvLayout layout;
  for (const Layer& l : layers_) {
    layout.push_back(layers::DeepseekV4LayerPlanes(config_, l.kind, block_size, DType::kBF16));
  }
  if (mtp_) {  // the draft layer's planes are layer num_layers (ForwardDraft)
    layout.push_back(
        layers::DeepseekV4LayerPlanes(config_, mtp_->block.kind, block_size, DType::kBF16));
  }
  return layout;
}

std::vector<KvGroup> GpuDeepseekV4::KvGroupsFor(int64_t block_size) const {
  return layers::DeepseekV4KvGroups(config_, block_size);
}

Status GpuDeepseekV4::Reserve(int64_t max_tokens, int64_t max_logits, int64_t /*max_split_cells*/,
                              int64_t max_seq_len) {
  if (max_tokens <= max_tokens_ && max_logits <= max_logits_ && max_seq_len <= max_seq_len_) {
    return OkStatus();
  }
  max_tokens = std::max(max_tokens, max_tokens_);
  max_logits = std::max(max_logits, max_logits_);
  max_seq_len = std::max(max_seq_len, max_seq_len_);
  const ModelConfig& c = config_;
  const DeepseekV4Config& v = *c.deepseek_v4;
  const int64_t n = max_tokens, h = c.hidden_size, hc = v.hc_mult, k = v.experts_per_token;
  const int64_t inter = c.intermediate_size,
                si = inter * std::max<int64_t>(v.num_shared_experts, 1);
  const int64_t q_dim = c.num_heads * c.head_dim;
  max_entries_ = (max_seq_len + v.csa_rate - 1) / v.csa_rate;
  const int64_t sizes[] = {
      n * hc * h * 4,                                     // streams a
      n * hc * h * 4,                                     // streams b
      n * hc * 4,                                         // post
      n * hc * hc * 4,                                    // comb
      n * h * 2,                                          // normed
      n * x_cols_max_ * 4,                                // x projections
      n * v.q_lora_rank * 2,                              // qr
      n * q_cols_max_ * 4,                                // q projections
      n * std::max<int64_t>(v.index_topk, 1) * 4,         // selected
      kc::V4IndexerWorkspaceFloats(n, max_entries_) * 4,  // indexer
      kc::V4SparseAttentionWorkspaceFloats(std::min(n, kSplitTokens), c.num_heads, c.head_dim,
                                           kAttnSplits) *
          4,
      n * q_dim * 2,                                      // attention out
      n * v.o_groups * v.o_lora_rank * 2,                 // grouped
      n * h * 4,                                          // branch
      n * v.num_experts * 4,                              // router logits
      n * k * 4,                                          // experts
      n * k * 4,                                          // weights
      (v.num_experts + 1) * 4,                            // offsets
      (v.num_experts + 1) * 4,                            // active experts
      n * k * 4,                                          // row_token
      n * k * 4,                                          // pair_row
      kc::MoePlanWorkspaceInts(n, k, v.num_experts) * 4,  // plan workspace
      (n * k + n) * 2 * inter * 4,                        // gate/up (routed, then shared rows)
      (n * k + n) * inter * 2,                            // act
      (n * k + n) * h * 4,                                // expert out
      n * 2 * si * 4,                                     // shared gate/up
      n * si * 2,                                         // shared act
      n * h * 4,                                          // shared out
      max_logits * h * 2,                                 // head rows
      mtp_ ? n * h * 4 : 0,                               // MTP e
      mtp_ ? n * hc * h * 2 : 0,                          // MTP rows
      kc::HcWorkspaceFloats(n, hc, h) * 4,                // hyper-connections at decode
  };
  size_t total = 0;
  for (int64_t s : sizes) total += static_cast<size_t>(s) + cuda::DeviceArena::kAlignment;
  arena_ = cuda::DeviceArena();
  DINFER_ASSIGN_OR_RETURN(arena_, cuda::DeviceArena::Create(total));
  void* p[std::size(sizes)];
  for (size_t i = 0; i < std::size(sizes); ++i)
    p[i] = arena_.Allocate(static_cast<size_t>(sizes[i]));
  size_t i = 0;
  streams_a_ = static_cast<float*>(p[i++]);
  streams_b_ = static_cast<float*>(p[i++]);
  post_ = static_cast<float*>(p[i++]);
  comb_ = static_cast<float*>(p[i++]);
  normed_ = p[i++];
  x_out_ = static_cast<float*>(p[i++]);
  qr_ = p[i++];
  q_out_ = static_cast<float*>(p[i++]);
  selected_ = static_cast<int32_t*>(p[i++]);
  index_ws_ = static_cast<float*>(p[i++]);
  attn_ws_ = static_cast<float*>(p[i++]);
  attn_ = p[i++];
  grouped_ = p[i++];
  branch_ = static_cast<float*>(p[i++]);
  router_ = static_cast<float*>(p[i++]);
  experts_ = static_cast<int32_t*>(p[i++]);
  expert_weights_ = static_cast<float*>(p[i++]);
  offsets_ = static_cast<int32_t*>(p[i++]);
  active_ = static_cast<int32_t*>(p[i++]);
  row_token_ = static_cast<int32_t*>(p[i++]);
  pair_row_ = static_cast<int32_t*>(p[i++]);
  plan_ws_ = static_cast<int32_t*>(p[i++]);
  gate_up_ = static_cast<float*>(p[i++]);
  act_ = p[i++];
  expert_out_ = static_cast<float*>(p[i++]);
  shared_gate_up_ = static_cast<float*>(p[i++]);
  shared_act_ = p[i++];
  shared_out_ = static_cast<float*>(p[i++]);
  head_rows_ = p[i++];
  mtp_e_ = static_cast<float*>(p[i++]);
  mtp_rows_ = p[i++];
  hc_ws_ = static_cast<float*>(p[i++]);
  if (mtp_) {
    std::vector<float> ones(static_cast<size_t>(n * hc), 1.0f),
        eye(static_cast<size_t>(n * hc * hc));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < hc; ++j) eye[static_cast<size_t>((t * hc + j) * hc + j)] = 1.0f;
    }
    DINFER_ASSIGN_OR_RETURN(ones_, cuda::UploadF32(ones));
    DINFER_ASSIGN_OR_RETURN(eye_, cuda::UploadF32(eye));
  }
  max_tokens_ = max_tokens;
  max_logits_ = max_logits;
  max_seq_len_ = max_seq_len;
  return OkStatus();
}

Status GpuDeepseekV4::Gemm(const void* x, int64_t ldx, const void* w, int64_t n, int64_t k, void* y,
                           int64_t ldy, int64_t m, DType out, void* stream) {
  kc::GemmParams p;
  p.x = x;
  p.w = w;
  p.y = y;
  p.ldx = ldx;
  p.ldw = k;
  p.ldy = ldy;
  p.m = m;
  p.n = n;
  p.k = k;
  p.in_dtype = DType::kBF16;
  p.out_dtype = out;
  return gemm_->Run(p, stream);
}

Status GpuDeepseekV4::CheckStep(const GpuStep& step) const {
  if (step.num_tokens > max_tokens_ || step.num_logits > max_logits_) {
    return InvalidArgument("a step of {} tokens and {} logits rows exceeds the reserved {} / {}",
                           step.num_tokens, step.num_logits, max_tokens_, max_logits_);
  }
  return OkStatus();
}

Status GpuDeepseekV4::Embed(const GpuStep& step, float* out, int64_t copies, void* stream) {
  const int64_t h = config_.hidden_size;
  kc::EmbeddingParams e;
  e.table = embed_.data();
  e.dtype = DType::kBF16;
  e.ids = step.tokens;
  e.out = out;
  e.num_tokens = step.num_tokens;
  e.dim = h;
  e.out_stride = copies * h;
  e.copies = copies;
  return Check(kc::Embedding(e, stream), "embedding");
}

Status GpuDeepseekV4::Forward(const GpuStep& step, const GpuKvCache& kv, float* logits,
                              void* stream) {
  if (step.num_tokens == 0) return OkStatus();
  DINFER_RETURN_IF_ERROR(CheckStep(step));
  // Every stream starts as the token's embedding.
  DINFER_RETURN_IF_ERROR(Embed(step, streams_a_, config_.deepseek_v4->hc_mult, stream));
  for (size_t i = 0; i < layers_.size(); ++i) {
    DINFER_RETURN_IF_ERROR(RunLayer(layers_[i], static_cast<int64_t>(i), step, kv, stream));
  }
  return Head(hc_head_, final_norm_, step, logits, stream);
}

Status GpuDeepseekV4::ForwardDraft(const GpuStep& step, const GpuKvCache& kv, float* logits,
                                   void* stream) {
  if (!mtp_) return MakeError(StatusCode::kFailedPrecondition, "the checkpoint has no MTP layer");
  const ModelConfig& c = config_;
  const DeepseekV4Config& v = *c.deepseek_v4;
  const int64_t n = step.num_tokens, h = c.hidden_size, hc = v.hc_mult;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (n == 0) return OkStatus();
  DINFER_RETURN_IF_ERROR(CheckStep(step));
  // The last Forward's final streams (streams_a_), each normed on its own, through h_proj.
  kc::RmsNormParams hn;
  hn.residual = streams_a_;
  hn.write_back = false;
  hn.weight = mtp_->hnorm.as<float>();
  hn.out = mtp_rows_;
  hn.dtype = DType::kBF16;
  hn.rows = n * hc;
  hn.dim = h;
  hn.eps = eps;
  DINFER_RETURN_IF_ERROR(Check(kc::RmsNorm(hn, stream), "MTP hnorm"));
  DINFER_RETURN_IF_ERROR(
      Gemm(mtp_rows_, h, mtp_->h_proj.data(), h, h, streams_b_, h, n * hc, DType::kF32, stream));
  // The next tokens' embeddings, normed, through e_proj.
  DINFER_RETURN_IF_ERROR(Embed(step, branch_, 1, stream));
  kc::RmsNormParams en = hn;
  en.residual = branch_;
  en.weight = mtp_->enorm.as<float>();
  en.out = normed_;
  en.rows = n;
  DINFER_RETURN_IF_ERROR(Check(kc::RmsNorm(en, stream), "MTP enorm"));
  DINFER_RETURN_IF_ERROR(
      Gemm(normed_, h, mtp_->e_proj.data(), h, h, mtp_e_, h, n, DType::kF32, stream));
  // streams_i += e for every stream: HcPost with post 1 and comb the identity.
  kc::HcPostParams add;
  add.streams = streams_b_;
  add.y = mtp_e_;
  add.post = ones_.as<float>();
  add.comb = eye_.as<float>();
  add.num_tokens = n;
  add.hc = hc;
  add.dim = h;
  add.out = streams_a_;
  DINFER_RETURN_IF_ERROR(Check(kc::HcPost(add, stream), "MTP streams"));
  DINFER_RETURN_IF_ERROR(
      RunLayer(mtp_->block, static_cast<int64_t>(layers_.size()), step, kv, stream));
  return Head(mtp_->head, mtp_->norm, step, logits, stream);
}

Status GpuDeepseekV4::Head(const HcWeights& hc_head, const DeviceTensor& norm, const GpuStep& step,
                           float* logits, void* stream) {
  const ModelConfig& c = config_;
  const DeepseekV4Config& v = *c.deepseek_v4;
  const int64_t h = c.hidden_size;
  if (step.num_logits == 0) return OkStatus();
  kc::HcHeadParams head;
  head.streams = streams_a_;
  head.rows_index = step.logits_rows;
  head.fn = hc_head.fn.as<float>();
  head.base = hc_head.base.as<float>();
  head.scale = hc_head.scale.as<float>();
  head.rows = step.num_logits;
  head.hc = v.hc_mult;
  head.dim = h;
  head.hc_eps = static_cast<float>(v.hc_eps);
  head.norm_eps = static_cast<float>(c.rms_norm_eps);
  head.norm_weight = norm.as<float>();
  head.normed = head_rows_;
  head.normed_dtype = DType::kBF16;
  head.workspace = hc_ws_;
  // The last layer's HcPost (Forward's last layer, or the MTP block) wrote the partials of fn.
  head.partials_ready =
      kc::HcWorkspacePath(step.num_tokens, h) && (&hc_head != &hc_head_ || !layers_.empty());
  DINFER_RETURN_IF_ERROR(Check(kc::HcHead(head, stream), "hyper-connection head"));
  return Gemm(head_rows_, h, lm_head_.data(), c.vocab_size, h, logits, c.vocab_size,
              step.num_logits, DType::kF32, stream);
}

Status GpuDeepseekV4::RunLayer(const Layer& l, int64_t layer, const GpuStep& step,
                               const GpuKvCache& kv, void* stream) {
  const ModelConfig& c = config_;
  const DeepseekV4Config& v = *c.deepseek_v4;
  const int64_t n = step.num_tokens, h = c.hidden_size, hc = v.hc_mult, d = c.head_dim;
  const int64_t heads = c.num_heads, q_rank = v.q_lora_rank, q_dim = heads * d;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float* inv_freq =
      (l.kind == V4Attention::kSliding ? inv_freq_main_ : inv_freq_compress_).as<float>();
  const std::vector<void*>& planes = kv.planes[static_cast<size_t>(layer)];
  const std::vector<KvPlane> layout =
      layers::DeepseekV4LayerPlanes(config_, l.kind, kv.block_size, DType::kBF16);

  // Attention sublayer input.
  kc::HcPreParams pre;
  pre.streams = streams_a_;
  pre.fn = l.hc_attn.fn.as<float>();
  pre.base = l.hc_attn.base.as<float>();
  pre.scale = l.hc_attn.scale.as<float>();
  pre.num_tokens = n;
  pre.hc = hc;
  pre.dim = h;
  pre.iters = v.hc_sinkhorn_iters;
  pre.hc_eps = static_cast<float>(v.hc_eps);
  pre.norm_eps = eps;
  pre.post = post_;
  pre.comb = comb_;
  pre.norm_weight = l.attn_norm.as<float>();
  pre.normed = normed_;
  pre.normed_dtype = DType::kBF16;
  pre.workspace = hc_ws_;
  // At decode each HcPost also computes the partials of the next HcPre / HcHead (its first
  // kernel); the HcPost before a main layer after the first is the last layer's (the MTP block's
  // input is written by ForwardDraft's own HcPost, which does not).
  const bool fused = kc::HcWorkspacePath(n, h);
  const int64_t num_layers = static_cast<int64_t>(layers_.size());
  pre.partials_ready = fused && layer > 0 && layer < num_layers;
  DINFER_RETURN_IF_ERROR(Check(kc::HcPre(pre, stream), "hyper-connection (attention)"));
  DINFER_RETURN_IF_ERROR(
      Gemm(normed_, h, l.x_proj.data(), l.x_cols, h, x_out_, l.x_cols, n, DType::kF32, stream));
  // q: low-rank, normed, projected (with the indexer's queries), each head normed and rotated;
  // the key (one head) normed and rotated in place. One launch for the q norm and the key, one
  // for the q heads and the indexer's queries (rotated, not normed).
  kc::NormRopeParams qn;
  qn.x = x_out_;
  qn.x_stride = l.x_cols;
  qn.out = qr_;
  qn.out_stride = q_rank;
  qn.out_dtype = DType::kBF16;
  qn.num_tokens = n;
  qn.num_heads = 1;
  qn.head_dim = q_rank;
  qn.norm = true;
  qn.norm_weight = l.q_norm.as<float>();
  qn.eps = eps;
  kc::NormRopeParams kn;
  kn.x = x_out_ + q_rank;
  kn.x_stride = l.x_cols;
  kn.out = x_out_ + q_rank;
  kn.out_stride = l.x_cols;
  kn.out_dtype = DType::kF32;
  kn.num_tokens = n;
  kn.num_heads = 1;
  kn.head_dim = d;
  kn.norm = true;
  kn.norm_weight = l.kv_norm.as<float>();
  kn.eps = eps;
  kn.rotary_dim = c.rotary_dim;
  kn.inv_freq = inv_freq;
  kn.positions = step.positions;
  const kc::NormRopeParams q_kv[] = {qn, kn};
  DINFER_RETURN_IF_ERROR(Check(kc::NormRopeBatch(q_kv, 2, stream), "q and kv norm"));
  DINFER_RETURN_IF_ERROR(Gemm(qr_, q_rank, l.q_proj.data(), l.q_cols, q_rank, q_out_, l.q_cols, n,
                              DType::kF32, stream));
  kc::NormRopeParams q_jobs[2];
  kc::NormRopeParams& qh = q_jobs[0];
  qh.x = q_out_;
  qh.x_stride = l.q_cols;
  qh.out = q_out_;
  qh.out_stride = l.q_cols;
  qh.out_dtype = DType::kF32;
  qh.num_tokens = n;
  qh.num_heads = heads;
  qh.head_dim = d;
  qh.norm = true;
  qh.eps = eps;
  qh.rotary_dim = c.rotary_dim;
  qh.inv_freq = inv_freq;
  qh.positions = step.positions;
  if (l.index_comp) {
    kc::NormRopeParams& iq = q_jobs[1];
    iq = qh;
    iq.x = q_out_ + q_dim;
    iq.out = q_out_ + q_dim;
    iq.num_heads = v.index_heads;
    iq.head_dim = v.index_head_dim;
    iq.norm = false;
    iq.inv_freq = inv_freq_compress_.as<float>();
  }
  DINFER_RETURN_IF_ERROR(
      Check(kc::NormRopeBatch(q_jobs, l.index_comp ? 2 : 1, stream), "q heads (and indexer q)"));

  // Compressors: plane 1 (state) and 2 (entries); the indexer's 3 and 4.
  auto compress = [&](const Compressor& comp, size_t state_plane, size_t entry_plane) -> Status {
    const int32_t group = layout[entry_plane].group;
    kc::V4CompressParams p;
    p.kv = x_out_ + comp.col;
    p.kv_stride = l.x_cols;
    p.gate = x_out_ + comp.col + comp.width;
    p.gate_stride = l.x_cols;
    p.bias = comp.ape.as<float>();
    p.num_tokens = n;
    p.num_seqs = step.num_seqs;
    p.dim = comp.dim;
    p.rate = comp.rate;
    p.overlap = comp.overlap;
    p.token_seq = step.token_seq;
    p.positions = step.positions;
    p.seq_token_end = step.seq_token_end;
    p.block_tables = step.block_tables;
    p.max_blocks_per_seq = step.max_blocks_per_seq;
    p.block_size = kv.block_size;
    p.state = static_cast<float*>(planes[state_plane]);
    p.norm_weight = comp.norm.as<float>();
    p.eps = eps;
    p.inv_freq = inv_freq_compress_.as<float>();
    p.rotary_dim = c.rotary_dim;
    p.entries = planes[entry_plane];
    p.entries_dtype = DType::kBF16;
    p.entry_tables = step.group_tables[group];
    p.entry_max_blocks_per_seq = step.group_width[group];
    p.entry_block_size = step.group_block_tokens[group];
    p.rows_per_block = layout[entry_plane].rows_per_block;
    p.replay_end = step.replay_end;
    return Check(kc::V4Compress(p, stream), "compressor");
  };
  if (l.comp) DINFER_RETURN_IF_ERROR(compress(*l.comp, 1, 2));
  const int32_t* selected = nullptr;
  if (l.index_comp) {
    DINFER_RETURN_IF_ERROR(compress(*l.index_comp, 3, 4));
    const int64_t ih = v.index_heads, id = v.index_head_dim;
    const int32_t group = layout[4].group;
    kc::V4IndexerParams p;
    p.q = q_out_ + q_dim;
    p.q_stride = l.q_cols;
    p.weights = x_out_ + l.index_weights_col;
    p.weights_stride = l.x_cols;
    p.weights_scale = InvSqrt(ih);
    p.scale = InvSqrt(id);
    p.num_tokens = n;
    p.num_heads = ih;
    p.head_dim = id;
    p.keys = planes[4];
    p.keys_dtype = DType::kBF16;
    p.rate = l.index_comp->rate;
    p.rows_per_block = layout[4].rows_per_block;
    p.token_seq = step.token_seq;
    p.positions = step.positions;
    p.block_tables = step.group_tables[group];
    p.max_blocks_per_seq = step.group_width[group];
    p.block_size = step.group_block_tokens[group];
    p.topk = v.index_topk;
    p.max_entries = max_entries_;
    p.workspace = index_ws_;
    p.selected = selected_;
    DINFER_RETURN_IF_ERROR(Check(kc::V4IndexerTopK(p, stream), "indexer"));
    selected = selected_;
  }

  kc::V4SparseAttentionParams a;
  a.q = q_out_;
  a.q_dtype = DType::kF32;
  a.q_stride = l.q_cols;
  a.kv = x_out_ + q_rank;
  a.kv_stride = l.x_cols;
  a.out = attn_;
  a.out_dtype = DType::kBF16;
  a.out_stride = q_dim;
  a.num_tokens = n;
  a.num_seqs = step.num_seqs;
  a.num_heads = heads;
  a.head_dim = d;
  a.scale = InvSqrt(d);
  a.sinks = l.sinks.as<float>();
  a.token_seq = step.token_seq;
  a.positions = step.positions;
  a.block_tables = step.block_tables;
  a.max_blocks_per_seq = step.max_blocks_per_seq;
  a.block_size = kv.block_size;
  a.window_kv = planes[0];
  a.window_dtype = DType::kBF16;
  a.window = c.sliding_window;
  if (l.comp) {
    const int32_t group = layout[2].group;
    a.compressed = planes[2];
    a.compressed_dtype = DType::kBF16;
    a.rate = l.comp->rate;
    a.rows_per_block = layout[2].rows_per_block;
    a.compressed_tables = step.group_tables[group];
    a.compressed_max_blocks_per_seq = step.group_width[group];
    a.compressed_block_size = step.group_block_tokens[group];
    a.selected = selected;
    a.num_selected = selected != nullptr ? v.index_topk : 0;
  }
  a.inv_freq = inv_freq;
  a.rotary_dim = c.rotary_dim;
  // Steps of a few tokens split their keys over CTAs (decode); longer ones have CTAs enough.
  a.workspace = n <= kSplitTokens ? attn_ws_ : nullptr;
  a.max_splits = n <= kSplitTokens ? kAttnSplits : 1;
  DINFER_RETURN_IF_ERROR(Check(kc::V4SparseAttention(a, stream), "sparse attention"));
  // Grouped low-rank output projection: group g's heads through its own wo_a rows.
  const int64_t groups = v.o_groups, rank = v.o_lora_rank, per_group = q_dim / groups;
  kc::GemmParams wo_a;
  wo_a.x = attn_;
  wo_a.ldx = q_dim;
  wo_a.w = l.wo_a.data();
  wo_a.ldw = per_group;
  wo_a.y = grouped_;
  wo_a.ldy = groups * rank;
  wo_a.m = n;
  wo_a.n = groups * rank;
  wo_a.k = per_group;
  wo_a.group_n = rank;
  DINFER_RETURN_IF_ERROR(gemm_->Run(wo_a, stream));
  DINFER_RETURN_IF_ERROR(Gemm(grouped_, groups * rank, l.wo_b.data(), h, groups * rank, branch_, h,
                              n, DType::kF32, stream));
  kc::HcPostParams post;
  post.streams = streams_a_;
  post.y = branch_;
  post.post = post_;
  post.comb = comb_;
  post.num_tokens = n;
  post.hc = hc;
  post.dim = h;
  post.out = streams_b_;
  post.next_fn = fused ? l.hc_ffn.fn.as<float>() : nullptr;
  post.next_workspace = fused ? hc_ws_ : nullptr;
  DINFER_RETURN_IF_ERROR(Check(kc::HcPost(post, stream), "hyper-connection post (attention)"));

  // MoE sublayer.
  pre.streams = streams_b_;
  pre.fn = l.hc_ffn.fn.as<float>();
  pre.base = l.hc_ffn.base.as<float>();
  pre.scale = l.hc_ffn.scale.as<float>();
  pre.norm_weight = l.ffn_norm.as<float>();
  pre.partials_ready = fused;
  DINFER_RETURN_IF_ERROR(Check(kc::HcPre(pre, stream), "hyper-connection (MoE)"));
  DINFER_RETURN_IF_ERROR(RunMoe(l, step, stream));
  post.streams = streams_b_;
  post.out = streams_a_;
  // Next: the next layer's attention HcPre, or the head (Forward's after the last layer, the MTP
  // head after the MTP block).
  post.next_fn = nullptr;
  post.next_head = layer + 1 >= num_layers;
  if (fused && layer + 1 < num_layers) {
    post.next_fn = layers_[static_cast<size_t>(layer + 1)].hc_attn.fn.as<float>();
  } else if (fused && layer + 1 == num_layers) {
    post.next_fn = hc_head_.fn.as<float>();
  } else if (fused && mtp_) {
    post.next_fn = mtp_->head.fn.as<float>();
  }
  return Check(kc::HcPost(post, stream), "hyper-connection post (MoE)");
}

Status GpuDeepseekV4::RunMoe(const Layer& l, const GpuStep& step, void* stream) {
  const ModelConfig& c = config_;
  const DeepseekV4Config& v = *c.deepseek_v4;
  const int64_t n = step.num_tokens, h = c.hidden_size, ne = v.num_experts;
  const int64_t k = v.experts_per_token, inter = c.intermediate_size;
  DINFER_RETURN_IF_ERROR(
      Gemm(normed_, h, l.gate.data(), ne, h, router_, ne, n, DType::kF32, stream));
  kc::RouteParams r;
  r.logits = router_;
  r.ld = ne;
  r.num_tokens = n;
  r.num_experts = ne;
  r.top_k = k;
  r.scoring = Scoring(v.scoring);
  r.bias = l.gate_bias ? l.gate_bias->as<float>() : nullptr;
  if (!l.tid2eid.empty()) {
    r.tid2eid = static_cast<const int32_t*>(l.tid2eid.data());
    r.token_ids = step.tokens;
    r.vocab = c.vocab_size;
  }
  r.normalize = v.norm_topk_prob;
  r.scaling = static_cast<float>(v.routed_scaling);
  r.experts = experts_;
  r.weights = expert_weights_;
  DINFER_RETURN_IF_ERROR(Check(kc::Route(r, stream), "routing"));
  kc::MoePlanParams plan;
  plan.experts = experts_;
  plan.num_tokens = n;
  plan.top_k = k;
  plan.num_experts = ne;
  plan.expert_offsets = offsets_;
  plan.row_token = row_token_;
  plan.pair_row = pair_row_;
  plan.workspace = plan_ws_;
  plan.active_experts = active_;
  DINFER_RETURN_IF_ERROR(Check(kc::MoePlan(plan, stream), "MoE plan"));
  kc::GroupedGemmParams up;
  up.x = normed_;
  up.ldx = h;
  up.row_token = row_token_;
  up.w = l.w13.data();
  up.expert_offsets = offsets_;
  up.active_experts = active_;
  up.num_experts = ne;
  up.n = 2 * inter;
  up.k = h;
  up.max_rows = n * k;
  up.y = gate_up_;
  up.ldy = 2 * inter;
  up.out_dtype = DType::kF32;
  // A shared expert of the routed experts' width rides in the grouped launches: its rows follow
  // the routed ones from row n * k on (gate/up, act and expert out alike).
  const bool fused_shared = l.shared_w13 && l.shared_w2->view().dim(1) == inter;
  if (fused_shared) {
    up.shared_w = l.shared_w13->data();
    up.shared_rows = n;
    up.shared_x_row0 = 0;
  }
  // At decode (the list path) the SwiGLU is the gate/up product's epilogue: act straight out.
  kc::GroupedGemmParams up_act = up;
  up_act.y = act_;
  up_act.ldy = inter;
  up_act.out_dtype = DType::kBF16;
  up_act.swiglu = true;
  up_act.swiglu_limit = static_cast<float>(v.swiglu_limit);
  const bool swiglu_epilogue = kc::GroupedGemmTakesListPath(up_act) && (2 * inter) % 32 == 0;
  DINFER_RETURN_IF_ERROR(
      Check(kc::GroupedGemm(swiglu_epilogue ? up_act : up, stream), "experts (gate/up)"));
  kc::SiluMulClampParams act;
  act.in = gate_up_;
  act.in_dtype = DType::kF32;
  act.ld_in = 2 * inter;
  act.out = act_;
  act.ld_out = inter;
  act.rows = n * k;
  act.inter = inter;
  act.limit = static_cast<float>(v.swiglu_limit);
  act.rows_on_device = offsets_ + ne;
  if (fused_shared) {
    act.rows = n * k + n;
    act.fixed_rows = n;
  }
  if (!swiglu_epilogue) {
    DINFER_RETURN_IF_ERROR(Check(kc::SiluMulClamp(act, stream), "experts (SwiGLU)"));
  }
  kc::GroupedGemmParams down = up;
  down.x = act_;
  down.ldx = inter;
  down.row_token = nullptr;
  down.w = l.w2.data();
  down.n = h;
  down.k = inter;
  down.y = expert_out_;
  down.ldy = h;
  if (fused_shared) {
    down.shared_w = l.shared_w2->data();
    down.shared_x_row0 = n * k;
  }
  DINFER_RETURN_IF_ERROR(Check(kc::GroupedGemm(down, stream), "experts (down)"));
  const float* shared = nullptr;
  if (l.shared_w13 && !fused_shared) {
    const int64_t si = l.shared_w2->view().dim(1);
    DINFER_RETURN_IF_ERROR(Gemm(normed_, h, l.shared_w13->data(), 2 * si, h, shared_gate_up_,
                                2 * si, n, DType::kF32, stream));
    kc::SiluMulClampParams sact = act;
    sact.in = shared_gate_up_;
    sact.ld_in = 2 * si;
    sact.out = shared_act_;
    sact.ld_out = si;
    sact.rows = n;
    sact.inter = si;
    sact.rows_on_device = nullptr;
    sact.fixed_rows = 0;
    DINFER_RETURN_IF_ERROR(Check(kc::SiluMulClamp(sact, stream), "shared expert (SwiGLU)"));
    DINFER_RETURN_IF_ERROR(
        Gemm(shared_act_, si, l.shared_w2->data(), h, si, shared_out_, h, n, DType::kF32, stream));
    shared = shared_out_;
  }
  kc::MoeCombineParams comb;
  comb.y = expert_out_;
  comb.y_dtype = DType::kF32;
  comb.ldy = h;
  comb.pair_row = pair_row_;
  comb.weights = expert_weights_;
  comb.num_tokens = n;
  comb.top_k = k;
  comb.hidden = h;
  comb.shared = shared;
  comb.shared_row0 = fused_shared ? n * k : -1;
  comb.out = branch_;
  return Check(kc::MoeCombine(comb, stream), "MoE combine");
}

}  // namespace dinfer
