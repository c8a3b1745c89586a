#include "ops/ops.h"

#include "base/logging.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace dinfer::ops {

namespace kc = kernels::cpu;

bool LinearSupports(DType w_dtype) { return kc::MatmulSupports(w_dtype); }

namespace {

StatusOr<kc::MatmulParams> LinearParams(const OpContext& ctx, const TensorView& x,
                                        const TensorView& w, const TensorView& y) {
  const int64_t m = x.rows(), k = x.cols(), n = w.dim(0);
  if (w.ndim != 2 || w.dim(1) != k) {
    return InvalidArgument("linear: weight {} does not match input {}", w.ShapeString(),
                           x.ShapeString());
  }
  if (y.rows() != m || y.cols() != n) {
    return InvalidArgument("linear: output {} should be [{}, {}]", y.ShapeString(), m, n);
  }
  if (!kc::MatmulSupports(w.dtype)) {
    return Unimplemented("linear: weight dtype {} is not supported on the CPU", DTypeName(w.dtype));
  }
  if (k % BlockSize(w.dtype) != 0) {
    return InvalidArgument("linear: {} rows of {} elements are not whole {}-element blocks",
                           DTypeName(w.dtype), k, BlockSize(w.dtype));
  }
  kc::MatmulParams p;
  p.x = x.as<float>();
  p.x_stride = k;
  p.w = w.data;
  p.w_dtype = w.dtype;
  p.w_row_bytes = RowBytes(w.dtype, k);
  p.y = y.as<float>();
  p.y_stride = n;
  p.m = m;
  p.n = n;
  p.k = k;
  p.pool = ctx.pool;
  p.f32_activations = ctx.f32_activations;
  return p;
}

void AddBias(const TensorView& y, const TensorView& bias) {
  const int64_t n = y.cols();
  for (int64_t r = 0; r < y.rows(); ++r) kc::AddInPlace(y.as<float>() + r * n, bias.as<float>(), n);
}

}  // namespace

Status Linear(const OpContext& ctx, const TensorView& x, const TensorView& w,
              const TensorView* bias, const TensorView& y) {
  DINFER_ASSIGN_OR_RETURN(kc::MatmulParams p, LinearParams(ctx, x, w, y));
  kc::Matmul(p);
  if (bias != nullptr) AddBias(y, *bias);
  return OkStatus();
}

Status LinearShared(const OpContext& ctx, const TensorView& x, std::span<const TensorView> ws,
                    std::span<const TensorView* const> biases, std::span<const TensorView> ys) {
  constexpr size_t kMax = 4;
  if (ws.size() != ys.size() || ws.size() != biases.size() || ws.size() > kMax) {
    return InvalidArgument("linear: {} weights, {} biases, {} outputs", ws.size(), biases.size(),
                           ys.size());
  }
  kc::MatmulParams ps[kMax];
  for (size_t i = 0; i < ws.size(); ++i) {
    DINFER_ASSIGN_OR_RETURN(ps[i], LinearParams(ctx, x, ws[i], ys[i]));
  }
  kc::MatmulShared(std::span<const kc::MatmulParams>(ps, ws.size()));
  for (size_t i = 0; i < ws.size(); ++i) {
    if (biases[i] != nullptr) AddBias(ys[i], *biases[i]);
  }
  return OkStatus();
}

void RmsNorm(const OpContext& ctx, const TensorView& x, const TensorView& weight, float eps,
             const TensorView& out, float weight_offset) {
  DINFER_CHECK(weight.dtype == DType::kF32 && weight.numel() == x.cols());
  kc::RmsNormParams p;
  p.x = x.as<float>();
  p.weight = weight.as<float>();
  p.out = out.as<float>();
  p.rows = x.rows();
  p.dim = x.cols();
  p.eps = eps;
  p.weight_offset = weight_offset;
  kc::RmsNorm(p);
}

void HeadRmsNorm(const OpContext& ctx, const TensorView& x, int64_t num_heads,
                 const TensorView& weight, float eps) {
  kc::RmsNormParams p;
  p.x = x.as<float>();
  p.weight = weight.as<float>();
  p.out = x.as<float>();
  p.dim = weight.numel();
  p.rows = x.rows() * num_heads;
  p.eps = eps;
  DINFER_CHECK(x.cols() == num_heads * p.dim);
  kc::RmsNorm(p);
}

void SiluMul(const OpContext& ctx, const TensorView& gate, const TensorView& up,
             const TensorView& out) {
  kc::SiluMulParams p;
  p.gate = gate.as<float>();
  p.up = up.as<float>();
  p.out = out.as<float>();
  p.rows = gate.rows();
  p.dim = gate.cols();
  kc::SiluMul(p);
}

void Add(const OpContext& ctx, const TensorView& y, const TensorView& x) {
  DINFER_CHECK(y.numel() == x.numel());
  kc::AddInPlace(y.as<float>(), x.as<float>(), y.numel());
}

Status Embedding(const OpContext& ctx, const TensorView& table, std::span<const int32_t> ids,
                 const TensorView& out, float scale) {
  const int64_t vocab = table.dim(0);
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      return InvalidArgument("token id {} is outside the vocabulary [0, {})", id, vocab);
    }
  }
  kc::EmbeddingParams p;
  p.table = table.data;
  p.dtype = table.dtype;
  p.dim = table.dim(1);
  p.row_bytes = RowBytes(table.dtype, p.dim);
  p.vocab = vocab;
  p.ids = ids.data();
  p.num_tokens = static_cast<int64_t>(ids.size());
  p.out = out.as<float>();
  p.scale = scale;
  kc::Embedding(p);
  return OkStatus();
}

}  // namespace dinfer::ops

namespace dinfer::ops {

void PagedAttention(const OpContext& ctx, const TensorView& q, const TensorView& k,
                    const TensorView& v, const KvLayerView& kv, const AttentionMetadata& meta,
                    const AttentionOptions& opt, const TensorView& out) {
  const int64_t tokens = q.rows();
  const int64_t kv_dim = opt.num_kv_heads * opt.head_dim;
  kc::KvWriteParams w;
  w.k = k.as<float>();
  w.v = v.as<float>();
  w.k_stride = k.cols();
  w.v_stride = v.cols();
  w.k_cache = kv.k;
  w.v_cache = kv.v;
  w.slot_mapping = meta.slot_mapping.data();
  w.num_tokens = tokens;
  w.kv_dim = kv_dim;
  kc::KvWrite(w);

  kc::AttentionParams a;
  a.q = q.as<float>();
  a.q_stride = q.cols();
  a.out = out.as<float>();
  a.k_cache = kv.k;
  a.v_cache = kv.v;
  a.block_size = meta.block_size;
  a.num_heads = opt.num_heads;
  a.num_kv_heads = opt.num_kv_heads;
  a.head_dim = opt.head_dim;
  a.token_seq = meta.token_seq.data();
  a.q_pos = meta.positions.data();
  a.num_tokens = tokens;
  a.block_tables = meta.block_tables.data();
  a.max_blocks_per_seq = meta.max_blocks_per_seq;
  a.scale = opt.scale;
  a.sliding_window = opt.sliding_window;
  a.softcap = opt.softcap;
  a.pool = ctx.pool;
  kc::Attention(a);
}

void Rope(const OpContext& ctx, const TensorView& x, int64_t num_heads, int64_t head_dim,
          int64_t rotary_dim, std::span<const int32_t> positions, std::span<const float> inv_freq,
          bool interleaved) {
  kc::RopeParams p;
  p.x = x.as<float>();
  p.rows = x.rows();
  p.num_heads = num_heads;
  p.head_dim = head_dim;
  p.rotary_dim = rotary_dim;
  p.row_stride = x.cols();
  p.positions = positions.data();
  p.inv_freq = inv_freq.data();
  p.interleaved = interleaved;
  kc::Rope(p);
}

}  // namespace dinfer::ops
