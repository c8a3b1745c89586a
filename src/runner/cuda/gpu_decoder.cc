#include "runner/cuda/gpu_decoder.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/device.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/qkv.h"
#include "model/layers/decoder.h"
#include "runner/cuda/weight_upload.h"

namespace dinfer {
namespace {

namespace kc = kernels::cuda;
using cuda::DeviceTensor;

int64_t ElemBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// The staged q/k/v GEMV's epilogue doing what QkvRopeKvWrite with `qp` does (less q/k norms).
kc::GemvQkvEpilogue EpilogueOf(const kc::QkvParams& qp) {
  kc::GemvQkvEpilogue e;
  e.num_heads = qp.num_heads;
  e.num_kv_heads = qp.num_kv_heads;
  e.head_dim = qp.head_dim;
  e.bias = qp.bias;
  e.positions = qp.positions;
  e.inv_freq = qp.inv_freq;
  e.rotary_dim = qp.rotary_dim;
  e.interleaved = qp.interleaved;
  e.attention_scaling = qp.attention_scaling;
  e.k_cache = qp.k_cache;
  e.v_cache = qp.v_cache;
  e.kv_fp8 = qp.kv_fp8;
  e.k_scale = qp.k_scale;
  e.v_scale = qp.v_scale;
  e.slot_mapping = qp.slot_mapping;
  return e;
}

using cuda::Bytes;

StatusOr<std::optional<DeviceTensor>> OptionalF32(const std::optional<TensorView>& v) {
  if (!v) return std::optional<DeviceTensor>();
  DINFER_ASSIGN_OR_RETURN(DeviceTensor t, DeviceTensor::Upload(*v, DType::kF32));
  return std::optional<DeviceTensor>(std::move(t));
}

}  // namespace

StatusOr<std::unique_ptr<GpuDecoder>> GpuDecoder::Upload(const layers::DecoderModel& model,
                                                         DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return Unimplemented("CUDA weights as {}: use f32 or bf16", DTypeName(dtype));
  }
  const ModelConfig& c = model.config();
  std::unique_ptr<GpuDecoder> g(new GpuDecoder(c, dtype));
  g->norm_weight_offset_ = model.options().norm_weight_offset;
  g->embed_scale_ =
      model.options().scale_embeddings ? std::sqrt(static_cast<float>(c.hidden_size)) : 1.0f;
  DINFER_ASSIGN_OR_RETURN(g->embed_, cuda::UploadRows({&model.embed()}, dtype));
  g->weight_bytes_ += Bytes(g->embed_);
  if (model.lm_head().data != model.embed().data) {
    DINFER_ASSIGN_OR_RETURN(DeviceTensor head, cuda::UploadRows({&model.lm_head()}, dtype));
    g->lm_head_ = std::move(head);
  }
  DINFER_ASSIGN_OR_RETURN(g->final_norm_, DeviceTensor::Upload(model.final_norm(), DType::kF32));
  DINFER_ASSIGN_OR_RETURN(g->inv_freq_, cuda::UploadF32(model.inv_freq()));
  const int64_t q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  for (const auto& src : model.layers()) {
    const layers::AttentionWeights& a = src.attn.weights();
    Layer l;
    DINFER_ASSIGN_OR_RETURN(l.input_norm, DeviceTensor::Upload(src.input_norm, DType::kF32));
    DINFER_ASSIGN_OR_RETURN(l.post_norm, DeviceTensor::Upload(src.post_norm, DType::kF32));
    DINFER_ASSIGN_OR_RETURN(l.qkv, cuda::UploadRows({&a.q, &a.k, &a.v}, dtype));
    DINFER_ASSIGN_OR_RETURN(l.o, cuda::UploadRows({&a.o}, dtype));
    DINFER_ASSIGN_OR_RETURN(l.gate_up, cuda::UploadRows({&src.mlp.gate(), &src.mlp.up()}, dtype));
    DINFER_ASSIGN_OR_RETURN(l.down, cuda::UploadRows({&src.mlp.down()}, dtype));
    if (a.q_bias || a.k_bias || a.v_bias) {
      std::vector<float> bias(static_cast<size_t>(q_dim + 2 * kv_dim), 0.0f);
      auto put = [&](const std::optional<TensorView>& b, int64_t at) {
        if (b) std::copy_n(b->as<float>(), b->numel(), bias.begin() + at);
      };
      put(a.q_bias, 0);
      put(a.k_bias, q_dim);
      put(a.v_bias, q_dim + kv_dim);
      DINFER_ASSIGN_OR_RETURN(DeviceTensor b, cuda::UploadF32(bias));
      l.qkv_bias = std::move(b);
    }
    DINFER_ASSIGN_OR_RETURN(l.o_bias, OptionalF32(a.o_bias));
    DINFER_ASSIGN_OR_RETURN(l.q_norm, OptionalF32(a.q_norm));
    DINFER_ASSIGN_OR_RETURN(l.k_norm, OptionalF32(a.k_norm));
    l.sliding_window = src.attn.options().sliding_window;
    l.k_scale = a.k_scale.value_or(0.0f);
    l.v_scale = a.v_scale.value_or(0.0f);
    g->attn_scale_ = src.attn.options().scale;
    g->softcap_ = src.attn.options().softcap;
    g->weight_bytes_ += Bytes(l.qkv) + Bytes(l.o) + Bytes(l.gate_up) + Bytes(l.down);
    g->layers_.push_back(std::move(l));
  }
  if (g->lm_head_) g->weight_bytes_ += Bytes(*g->lm_head_);
  DINFER_ASSIGN_OR_RETURN(g->gemm_, kc::GemmRunner::Create());
  return g;
}

StatusOr<std::unique_ptr<GpuDecoder>> GpuDecoder::Random(const ModelConfig& c, uint64_t seed) {
  DINFER_RETURN_IF_ERROR(c.Validate());
  std::unique_ptr<GpuDecoder> g(new GpuDecoder(c, DType::kBF16));
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  uint64_t stream_id = seed * 1000003;
  auto random = [&](std::vector<int64_t> shape, float scale) -> StatusOr<DeviceTensor> {
    DINFER_ASSIGN_OR_RETURN(DeviceTensor t, DeviceTensor::Empty(DType::kBF16, shape));
    DINFER_RETURN_IF_ERROR(cuda::CudaStatus(
        kc::FillRandom(t.data(), DType::kBF16, t.view().numel(), ++stream_id, scale, nullptr),
        "random weights"));
    g->weight_bytes_ += Bytes(t);
    return t;
  };
  const std::vector<float> ones(static_cast<size_t>(h), 1.0f);
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(h));
  DINFER_ASSIGN_OR_RETURN(g->embed_, random({c.vocab_size, h}, 1.0f));
  if (!c.tie_word_embeddings) {
    DINFER_ASSIGN_OR_RETURN(DeviceTensor head, random({c.vocab_size, h}, in_scale));
    g->lm_head_ = std::move(head);
  }
  DINFER_ASSIGN_OR_RETURN(g->final_norm_, cuda::UploadF32(ones));
  DINFER_ASSIGN_OR_RETURN(g->inv_freq_, cuda::UploadF32(layers::RopeInvFreq(c)));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer l;
    DINFER_ASSIGN_OR_RETURN(l.input_norm, cuda::UploadF32(ones));
    DINFER_ASSIGN_OR_RETURN(l.post_norm, cuda::UploadF32(ones));
    DINFER_ASSIGN_OR_RETURN(l.qkv, random({q_dim + 2 * kv_dim, h}, in_scale));
    DINFER_ASSIGN_OR_RETURN(l.o, random({h, q_dim}, 1.0f / std::sqrt(static_cast<float>(q_dim))));
    DINFER_ASSIGN_OR_RETURN(l.gate_up, random({2 * inter, h}, in_scale));
    DINFER_ASSIGN_OR_RETURN(l.down,
                            random({h, inter}, 1.0f / std::sqrt(static_cast<float>(inter))));
    l.sliding_window = c.layer_sliding.empty() || !c.layer_sliding[i] ? 0 : c.sliding_window;
    g->layers_.push_back(std::move(l));
  }
  g->attn_scale_ = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  DINFER_RETURN_IF_ERROR(cuda::Synchronize());
  DINFER_ASSIGN_OR_RETURN(g->gemm_, kc::GemmRunner::Create());
  return g;
}

Status GpuDecoder::QuantizeWeightsFp8() {
  if (dtype_ != DType::kBF16) return InvalidArgument("FP8 weights are made from bf16 weights");
  if (max_tokens_ > 0) {
    return MakeError(StatusCode::kFailedPrecondition, "QuantizeWeightsFp8 comes before Reserve");
  }
  if (fp8_weights_) return OkStatus();
  auto quantize = [&](DeviceTensor& w, std::optional<DeviceTensor>& scale) -> Status {
    const int64_t n = w.view().dim(0), k = w.view().dim(1);
    if (k % 16 != 0) return Unimplemented("FP8 weights with rows of {} (not a multiple of 16)", k);
    DINFER_ASSIGN_OR_RETURN(DeviceTensor q, DeviceTensor::Empty(DType::kF8E4M3, {n, k}));
    DINFER_ASSIGN_OR_RETURN(DeviceTensor s, DeviceTensor::Empty(DType::kF32, {n}));
    kc::Fp8QuantizeParams p;
    p.x = w.data();
    p.ldx = k;
    p.m = n;
    p.k = k;
    p.dtype = DType::kBF16;
    p.out = q.data();
    p.scaling = kc::Fp8Scaling::kChannel;
    p.scale = s.as<float>();
    DINFER_RETURN_IF_ERROR(cuda::CudaStatus(kc::QuantizeFp8(p, nullptr), "quantize weights"));
    DINFER_RETURN_IF_ERROR(cuda::Synchronize());  // before the bf16 matrix is freed
    weight_bytes_ += Bytes(q) + Bytes(s) - Bytes(w);
    w = std::move(q);
    scale = std::move(s);
    return OkStatus();
  };
  for (Layer& l : layers_) {
    DINFER_RETURN_IF_ERROR(quantize(l.qkv, l.qkv_scale));
    DINFER_RETURN_IF_ERROR(quantize(l.o, l.o_scale));
    DINFER_RETURN_IF_ERROR(quantize(l.gate_up, l.gate_up_scale));
    DINFER_RETURN_IF_ERROR(quantize(l.down, l.down_scale));
  }
  fp8_weights_ = true;
  return OkStatus();
}

Status GpuDecoder::Reserve(int64_t max_tokens, int64_t max_logits, int64_t max_split_cells,
                           int64_t /*max_seq_len*/) {
  if (max_tokens <= max_tokens_ && max_logits <= max_logits_ &&
      max_split_cells <= max_split_cells_) {
    return OkStatus();
  }
  max_tokens = std::max(max_tokens, max_tokens_);
  max_logits = std::max(max_logits, max_logits_);
  max_split_cells = std::max(max_split_cells, max_split_cells_);
  const ModelConfig& c = config_;
  const int64_t e = ElemBytes(dtype_), h = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = c.num_heads * c.head_dim, kv = kv_dim();
  const int64_t sizes[] = {max_tokens * h * 4,
                           max_tokens * h * e,
                           max_tokens * (q_dim + 2 * kv) * e,
                           max_tokens * q_dim * e,
                           max_tokens * h * e,
                           max_tokens * 2 * inter * e,
                           max_tokens * inter * e,
                           max_logits * h * e,
                           max_split_cells * c.head_dim * 4,
                           max_split_cells * 2 * 4,
                           kc::kGemvFusedMaxRows * h * 4,
                           fp8_weights_ ? max_tokens * std::max({h, inter, q_dim}) : 0,
                           fp8_weights_ ? max_tokens * 4 : 0};
  size_t total = 0;
  for (int64_t s : sizes) total += static_cast<size_t>(s) + cuda::DeviceArena::kAlignment;
  DINFER_ASSIGN_OR_RETURN(arena_, cuda::DeviceArena::Create(total));
  void* ptrs[std::size(sizes)];
  for (size_t i = 0; i < std::size(sizes); ++i) {
    ptrs[i] = arena_.Allocate(static_cast<size_t>(sizes[i]));
  }
  hidden_ = static_cast<float*>(ptrs[0]);
  normed_ = ptrs[1];
  qkv_buf_ = ptrs[2];
  attn_ = ptrs[3];
  branch_ = ptrs[4];
  gate_up_ = ptrs[5];
  act_ = ptrs[6];
  last_ = ptrs[7];
  split_out_ = static_cast<float*>(ptrs[8]);
  split_stats_ = static_cast<float*>(ptrs[9]);
  hidden_alt_ = static_cast<float*>(ptrs[10]);
  act8_ = ptrs[11];
  act_scale_ = static_cast<float*>(ptrs[12]);
  max_tokens_ = max_tokens;
  max_logits_ = max_logits;
  max_split_cells_ = max_split_cells;
  return OkStatus();
}

Status GpuDecoder::Gemm(const void* x, const DeviceTensor& w, void* y, int64_t m, DType out,
                        void* stream, const std::optional<DeviceTensor>& w_scale) {
  if (w.view().dtype == DType::kF8E4M3) {
    if (!w_scale) return Internal("FP8 weights without scales");
    const int64_t n = w.view().dim(0), k = w.view().dim(1);
    kc::Fp8QuantizeParams q;
    q.x = x;
    q.ldx = k;
    q.m = m;
    q.k = k;
    q.dtype = dtype_;
    q.out = act8_;
    q.scaling = kc::Fp8Scaling::kChannel;
    q.scale = act_scale_;
    DINFER_RETURN_IF_ERROR(cuda::CudaStatus(kc::QuantizeFp8(q, stream), "quantize activations"));
    kc::Fp8GemmParams p;
    p.x = act8_;
    p.w = w.data();
    p.y = y;
    p.ldx = p.ldw = k;
    p.ldy = n;
    p.m = m;
    p.n = n;
    p.k = k;
    p.out_dtype = out;
    p.scaling = kc::Fp8Scaling::kChannel;
    p.x_scale = act_scale_;
    p.w_scale = w_scale->as<float>();
    return gemm_->RunFp8(p, stream);
  }
  kc::GemmParams p;
  p.x = x;
  p.w = w.data();
  p.y = y;
  p.m = m;
  p.n = w.view().dim(0);
  p.k = w.view().dim(1);
  p.ldx = p.k;
  p.ldw = p.k;
  p.ldy = p.n;
  p.in_dtype = dtype_;
  p.out_dtype = out;
  return gemm_->Run(p, stream);
}

Status GpuDecoder::StagedGemv(kc::GemvFusedParams f, const DeviceTensor& w, void* y, int64_t m,
                              DType out, void* stream, const std::optional<DeviceTensor>& w_scale) {
  if (w.view().dtype == DType::kF8E4M3) {
    if (!w_scale) return Internal("FP8 weights without scales");
    f.w_dtype = DType::kF8E4M3;
    f.w_scale = w_scale->as<float>();
  }
  f.gemm.w = w.data();
  f.gemm.y = y;
  f.gemm.m = m;
  f.gemm.n = w.view().dim(0);
  f.gemm.k = w.view().dim(1);
  f.gemm.ldw = f.gemm.k;
  f.gemm.ldy = f.silu_pairs ? f.gemm.n / 2 : f.gemm.n;
  f.gemm.in_dtype = dtype_;
  f.gemm.out_dtype = out;
  return cuda::CudaStatus(kc::GemvFused(f, stream), "staged GEMV");
}

Status GpuDecoder::NormGemv(float*& residual, const void* add, const float* add_bias,
                            const DeviceTensor& norm_weight, const DeviceTensor& w, void* y,
                            int64_t m, DType out, const int32_t* rows_index, void* stream,
                            const kc::GemvQkvEpilogue* qkv,
                            const std::optional<DeviceTensor>& w_scale, bool silu_pairs) {
  kc::GemvFusedParams f;
  f.qkv = qkv;
  f.silu_pairs = silu_pairs;
  f.input = kc::GemvInput::kRmsNorm;
  f.residual = residual;
  f.add = add;
  f.add_bias = add_bias;
  f.rows_index = rows_index;
  // The sums go to the other residual buffer: the kernel's CTAs all read the old one.
  float* other = residual == hidden_ ? hidden_alt_ : hidden_;
  f.residual_out = add != nullptr && rows_index == nullptr ? other : nullptr;
  f.norm_weight = norm_weight.as<float>();
  f.eps = static_cast<float>(config_.rms_norm_eps);
  f.weight_offset = norm_weight_offset_;
  DINFER_RETURN_IF_ERROR(StagedGemv(f, w, y, m, out, stream, w_scale));
  if (f.residual_out != nullptr) residual = other;
  return OkStatus();
}

bool GpuDecoder::FusedDecode(int64_t n) const {
  const ModelConfig& c = config_;
  const int64_t q_dim = c.num_heads * c.head_dim;
  // The staged GEMV's shapes: every product of the layer reads rows of whole 2,048-element chunks
  // (bf16 or e4m3 weights).
  return dtype_ == DType::kBF16 && n <= kc::kGemvFusedMaxRows && c.hidden_size % 2048 == 0 &&
         c.intermediate_size % 2048 == 0 && q_dim % 2048 == 0;
}

Status GpuDecoder::Forward(const GpuStep& step, const GpuKvCache& kv, float* logits, void* stream) {
  const ModelConfig& c = config_;
  const int64_t n = step.num_tokens;
  if (n == 0) return OkStatus();
  if (n > max_tokens_ || step.num_logits > max_logits_ ||
      (step.num_splits > 1 && step.num_rows * c.num_heads * step.num_splits > max_split_cells_)) {
    return InvalidArgument("step of {} tokens, {} logits rows exceeds the reserved {} / {}", n,
                           step.num_logits, max_tokens_, max_logits_);
  }
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = c.num_heads * c.head_dim, kvd = kv_dim();
  auto check = [](int e, const char* what) { return cuda::CudaStatus(e, what); };

  kc::EmbeddingParams emb;
  emb.table = embed_.data();
  emb.dtype = dtype_;
  emb.ids = step.tokens;
  emb.out = hidden_;
  emb.num_tokens = n;
  emb.dim = h;
  emb.scale = embed_scale_;
  DINFER_RETURN_IF_ERROR(check(kc::Embedding(emb, stream), "embedding"));

  kc::RmsNormParams norm;
  norm.residual = hidden_;
  norm.dtype = dtype_;
  norm.rows = n;
  norm.dim = h;
  norm.eps = static_cast<float>(c.rms_norm_eps);
  norm.weight_offset = norm_weight_offset_;
  norm.out = normed_;

  kc::QkvParams qp;
  qp.qkv = qkv_buf_;
  qp.qkv_stride = q_dim + 2 * kvd;
  qp.dtype = dtype_;
  qp.num_tokens = n;
  qp.num_heads = c.num_heads;
  qp.num_kv_heads = c.num_kv_heads;
  qp.head_dim = c.head_dim;
  qp.norm_eps = static_cast<float>(c.rms_norm_eps);
  qp.positions = step.positions;
  qp.inv_freq = inv_freq_.as<float>();
  qp.rotary_dim = c.rotary_dim;
  qp.interleaved = c.rope_interleaved;
  qp.slot_mapping = step.slots;
  qp.kv_fp8 = kv.fp8;

  kc::AttentionParams at;
  at.q = qkv_buf_;
  at.q_stride = q_dim + 2 * kvd;
  at.out = attn_;
  at.out_stride = q_dim;
  at.dtype = dtype_;
  at.block_size = kv.block_size;
  at.num_heads = c.num_heads;
  at.num_kv_heads = c.num_kv_heads;
  at.head_dim = c.head_dim;
  at.token_seq = step.token_seq;
  at.positions = step.positions;
  at.block_tables = step.block_tables;
  at.max_blocks_per_seq = step.max_blocks_per_seq;
  at.scale = attn_scale_;
  at.softcap = softcap_;
  at.kv_fp8 = kv.fp8;
  at.row_tokens = step.row_tokens;
  at.num_rows = step.num_rows;
  at.num_splits = step.num_splits;
  at.split_out = split_out_;
  at.split_stats = split_stats_;
  at.tile_seq = step.tile_seq;
  at.tile_token = step.tile_token;
  at.seq_token_end = step.seq_token_end;
  at.num_tiles = step.num_tiles;

  kc::SiluMulParams act;
  act.gate = gate_up_;
  act.up = static_cast<char*>(gate_up_) + inter * ElemBytes(dtype_);
  act.out = act_;
  act.dtype = dtype_;
  act.rows = n;
  act.dim = inter;
  act.in_stride = 2 * inter;

  const bool fused = FusedDecode(n);
  const bool rope_shapes_fit =
      c.head_dim % 2 == 0 && c.rotary_dim % 2 == 0 && c.rotary_dim <= c.head_dim;
  float* residual = hidden_;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    qp.bias = l.qkv_bias ? l.qkv_bias->as<float>() : nullptr;
    qp.q_norm = l.q_norm ? l.q_norm->as<float>() : nullptr;
    qp.k_norm = l.k_norm ? l.k_norm->as<float>() : nullptr;
    qp.k_cache = kv.k[i];
    qp.v_cache = kv.v[i];
    // An FP8 cache's scales: the checkpoint's for this layer where it has them.
    qp.k_scale = at.k_scale = l.k_scale > 0.0f ? l.k_scale : kv.k_scale;
    qp.v_scale = at.v_scale = l.v_scale > 0.0f ? l.v_scale : kv.v_scale;
    // The q/k/v GEMV's epilogue does QkvRopeKvWrite's work in fused decode steps, except with
    // per-head q/k norms (Qwen3), which it does not do.
    const bool qkv_epilogue = fused && rope_shapes_fit && !l.q_norm && !l.k_norm;
    if (fused) {
      const kc::GemvQkvEpilogue qe = EpilogueOf(qp);
      DINFER_RETURN_IF_ERROR(NormGemv(residual, i == 0 ? nullptr : branch_, nullptr, l.input_norm,
                                      l.qkv, qkv_buf_, n, dtype_, nullptr, stream,
                                      qkv_epilogue ? &qe : nullptr, l.qkv_scale));
    } else {
      norm.add = i == 0 ? nullptr : branch_;
      norm.add_bias = nullptr;  // the add is the previous MLP's output, which has no bias
      norm.weight = l.input_norm.as<float>();
      DINFER_RETURN_IF_ERROR(check(kc::RmsNorm(norm, stream), "input norm"));
      DINFER_RETURN_IF_ERROR(Gemm(normed_, l.qkv, qkv_buf_, n, dtype_, stream, l.qkv_scale));
    }
    if (!qkv_epilogue) {
      DINFER_RETURN_IF_ERROR(check(kc::QkvRopeKvWrite(qp, stream), "qkv rope kv-write"));
    }
    at.k_cache = kv.k[i];
    at.v_cache = kv.v[i];
    at.sliding_window = l.sliding_window;
    DINFER_RETURN_IF_ERROR(check(kc::AttentionRows(at, stream), "attention rows"));
    DINFER_RETURN_IF_ERROR(check(kc::AttentionPrefill(at, stream), "attention prefill"));
    const float* o_bias = l.o_bias ? l.o_bias->as<float>() : nullptr;
    if (fused) {
      kc::GemvFusedParams o;
      o.gemm.x = attn_;
      o.gemm.ldx = q_dim;
      DINFER_RETURN_IF_ERROR(StagedGemv(o, l.o, branch_, n, dtype_, stream, l.o_scale));
      // The gate/up GEMV's epilogue leaves SiLU(gate) · up in act_, as SiluMul would.
      DINFER_RETURN_IF_ERROR(NormGemv(residual, branch_, o_bias, l.post_norm, l.gate_up, act_, n,
                                      dtype_, nullptr, stream, nullptr, l.gate_up_scale,
                                      /*silu_pairs=*/true));
      kc::GemvFusedParams down;
      down.gemm.x = act_;
      down.gemm.ldx = inter;
      DINFER_RETURN_IF_ERROR(StagedGemv(down, l.down, branch_, n, dtype_, stream, l.down_scale));
      continue;
    }
    DINFER_RETURN_IF_ERROR(Gemm(attn_, l.o, branch_, n, dtype_, stream, l.o_scale));
    norm.add = branch_;
    norm.add_bias = o_bias;
    norm.weight = l.post_norm.as<float>();
    DINFER_RETURN_IF_ERROR(check(kc::RmsNorm(norm, stream), "post-attention norm"));
    DINFER_RETURN_IF_ERROR(Gemm(normed_, l.gate_up, gate_up_, n, dtype_, stream, l.gate_up_scale));
    DINFER_RETURN_IF_ERROR(check(kc::SiluMul(act, stream), "silu mul"));
    DINFER_RETURN_IF_ERROR(Gemm(act_, l.down, branch_, n, dtype_, stream, l.down_scale));
  }
  if (fused) {
    return NormGemv(residual, branch_, nullptr, final_norm_, lm_head_ ? *lm_head_ : embed_, logits,
                    step.num_logits, DType::kF32, step.logits_rows, stream);
  }
  kc::RmsNormParams final_norm = norm;
  final_norm.add = branch_;
  final_norm.add_bias = nullptr;
  final_norm.rows_index = step.logits_rows;
  final_norm.write_back = false;
  final_norm.rows = step.num_logits;
  final_norm.weight = final_norm_.as<float>();
  final_norm.out = last_;
  DINFER_RETURN_IF_ERROR(check(kc::RmsNorm(final_norm, stream), "final norm"));
  return Gemm(last_, lm_head_ ? *lm_head_ : embed_, logits, step.num_logits, DType::kF32, stream);
}

}  // namespace dinfer
