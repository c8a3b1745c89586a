#include "ops/deepseek_ops.h"

#include "base/logging.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace dinfer::ops {

namespace kc = kernels::cpu;

namespace {

kc::KvDType KvDTypeOf(DType t) {
  DINFER_CHECK(t == DType::kF32 || t == DType::kBF16 || t == DType::kF8E4M3B32);
  return t == DType::kBF16        ? kc::KvDType::kBF16
         : t == DType::kF8E4M3B32 ? kc::KvDType::kFp8
                                  : kc::KvDType::kF32;
}

}  // namespace

void RmsNormPerHead(const OpContext& ctx, const TensorView& x, int64_t head_dim,
                    const TensorView* weight, float eps, const TensorView& out) {
  DINFER_CHECK(x.cols() % head_dim == 0 && out.numel() == x.numel());
  DINFER_CHECK(weight == nullptr || (weight->dtype == DType::kF32 && weight->numel() == head_dim));
  kc::RmsNormParams p;
  p.x = x.as<float>();
  p.weight = weight != nullptr ? weight->as<float>() : nullptr;
  p.out = out.as<float>();
  p.rows = x.rows() * (x.cols() / head_dim);
  p.dim = head_dim;
  p.eps = eps;
  kc::RmsNorm(p);
}

void RopeTrailing(const OpContext& ctx, const TensorView& x, int64_t num_heads, int64_t head_dim,
                  int64_t rotary_dim, std::span<const int32_t> positions,
                  std::span<const float> inv_freq, bool inverse) {
  DINFER_CHECK(static_cast<int64_t>(positions.size()) == x.rows());
  DINFER_CHECK(static_cast<int64_t>(inv_freq.size()) == rotary_dim / 2);
  kc::RopeParams p;
  p.x = x.as<float>();
  p.rows = x.rows();
  p.num_heads = num_heads;
  p.head_dim = head_dim;
  p.rotary_dim = rotary_dim;
  p.rotary_offset = head_dim - rotary_dim;
  p.row_stride = x.cols();
  p.positions = positions.data();
  p.inv_freq = inv_freq.data();
  p.interleaved = true;
  p.inverse = inverse;
  kc::Rope(p);
}

Status GroupedLinear(const OpContext& ctx, const TensorView& x, const TensorView& w, int64_t groups,
                     const TensorView& y) {
  const int64_t n = x.rows(), k = w.cols(), r = w.rows() / groups;
  if (x.cols() != groups * k || w.rows() != groups * r || y.rows() != n || y.cols() != groups * r) {
    return InvalidArgument("grouped linear: x {}, w {}, y {} do not fit {} groups", x.ShapeString(),
                           w.ShapeString(), y.ShapeString(), groups);
  }
  if (!kc::MatmulSupports(w.dtype) || k % BlockSize(w.dtype) != 0) {
    return Unimplemented("grouped linear: weight dtype {} with {} inputs", DTypeName(w.dtype), k);
  }
  for (int64_t g = 0; g < groups; ++g) {
    kc::MatmulParams p;
    p.x = x.as<float>() + g * k;
    p.x_stride = x.cols();
    p.w = static_cast<const uint8_t*>(w.data) + g * r * RowBytes(w.dtype, k);
    p.w_dtype = w.dtype;
    p.w_row_bytes = RowBytes(w.dtype, k);
    p.y = y.as<float>() + g * r;
    p.y_stride = y.cols();
    p.m = n;
    p.n = r;
    p.k = k;
    p.pool = ctx.pool;
    p.f32_activations = ctx.f32_activations;
    kc::Matmul(p);
  }
  return OkStatus();
}

void SiluMulClamp(const OpContext& ctx, const TensorView& gate, const TensorView& up, float limit,
                  const TensorView& out) {
  kc::SiluMulParams p;
  p.gate = gate.as<float>();
  p.up = up.as<float>();
  p.out = out.as<float>();
  p.rows = gate.rows();
  p.dim = gate.cols();
  p.gate_stride = gate.cols();
  p.up_stride = up.cols();
  p.out_stride = out.cols();
  p.limit = limit;
  kc::SiluMul(p);
}

void SparseAttention(const OpContext& ctx, const TensorView& q, const TensorView& kv,
                     void* window_plane, DType window_dtype, const CompressedPlane* compressed,
                     const TensorView* selected, const AttentionMetadata& meta,
                     const SparseAttentionOptions& opt, const TensorView& out) {
  const int64_t tokens = q.rows(), d = opt.head_dim;
  DINFER_CHECK(kv.rows() == tokens && kv.cols() == d && q.cols() == opt.num_heads * d);
  const kc::KvDType window_kv = KvDTypeOf(window_dtype);
  for (int64_t t = 0; t < tokens; ++t) {
    kc::StoreKvRow(window_plane, window_kv, meta.slot_mapping[t], d, kv.as<float>() + t * d);
  }
  kc::SparseAttentionParams p;
  p.q = q.as<float>();
  p.q_stride = q.cols();
  p.out = out.as<float>();
  p.out_stride = out.cols();
  p.num_tokens = tokens;
  p.num_heads = opt.num_heads;
  p.head_dim = d;
  p.scale = opt.scale;
  p.sinks = opt.sinks;
  p.token_seq = meta.token_seq.data();
  p.q_pos = meta.positions.data();
  p.block_tables = meta.block_tables.data();
  p.max_blocks_per_seq = meta.max_blocks_per_seq;
  p.block_size = meta.block_size;
  p.window_kv = window_plane;
  p.window_dtype = window_kv;
  p.window = opt.window;
  if (compressed != nullptr) {
    p.compressed = compressed->data;
    p.compressed_dtype = KvDTypeOf(compressed->dtype);
    p.rate = compressed->rate;
    p.rows_per_block = compressed->rows_per_block;
    p.compressed_block_tables = compressed->tables.tables.data();
    p.compressed_max_blocks_per_seq = compressed->tables.max_blocks_per_seq;
    p.compressed_block_size = compressed->tables.block_size;
  }
  if (selected != nullptr) {
    DINFER_CHECK(selected->dtype == DType::kI32 && selected->rows() == tokens);
    p.selected = selected->as<int32_t>();
    p.num_selected = selected->cols();
  }
  p.pool = ctx.pool;
  kc::SparseAttention(p);
}

void Compress(const OpContext& ctx, const TensorView& kv, const TensorView& gate,
              const TensorView& bias, int64_t rate, bool overlap, float* state_plane,
              std::span<const int32_t> entry_row, const AttentionMetadata& meta,
              const TensorView& entries) {
  const int64_t width = kv.cols(), dim = overlap ? width / 2 : width;
  DINFER_CHECK(gate.cols() == width && bias.rows() == rate && bias.cols() == width);
  DINFER_CHECK(static_cast<int64_t>(entry_row.size()) == kv.rows() && entries.cols() == dim);
  kc::CompressorParams p;
  p.kv = kv.as<float>();
  p.gate = gate.as<float>();
  p.kv_stride = width;
  p.gate_stride = width;
  p.bias = bias.as<float>();
  p.num_tokens = kv.rows();
  p.dim = dim;
  p.rate = rate;
  p.overlap = overlap;
  p.token_seq = meta.token_seq.data();
  p.positions = meta.positions.data();
  p.block_tables = meta.block_tables.data();
  p.max_blocks_per_seq = meta.max_blocks_per_seq;
  p.block_size = meta.block_size;
  p.state = state_plane;
  p.entry_row = entry_row.data();
  p.entries = entries.as<float>();
  p.pool = ctx.pool;
  kc::Compressor(p);
}

void StoreCompressed(const OpContext& ctx, const TensorView& entries,
                     std::span<const int32_t> entry_row, const CompressedPlane& plane,
                     const AttentionMetadata& meta) {
  const int64_t dim = entries.cols();
  for (size_t t = 0; t < entry_row.size(); ++t) {
    if (entry_row[t] < 0) continue;
    const GroupBlockTables& g = plane.tables;
    const int32_t* table = g.tables.data() + meta.token_seq[t] * g.max_blocks_per_seq;
    const int64_t w = (meta.positions[t] + 1) / plane.rate - 1;
    const int64_t slot =
        kc::CompressedSlot(table, g.block_size, plane.rate, plane.rows_per_block, w);
    kc::StoreKvRow(plane.data, KvDTypeOf(plane.dtype), slot, dim,
                   entries.as<float>() + entry_row[t] * dim);
  }
}

void IndexerTopK(const OpContext& ctx, const TensorView& q, const TensorView& weights,
                 int64_t num_heads, float scale, const CompressedPlane& keys,
                 const AttentionMetadata& meta, const TensorView& selected) {
  DINFER_CHECK(selected.dtype == DType::kI32 && selected.rows() == q.rows());
  DINFER_CHECK(weights.rows() == q.rows() && weights.cols() == num_heads);
  kc::IndexerParams p;
  p.q = q.as<float>();
  p.q_stride = q.cols();
  p.weights = weights.as<float>();
  p.weights_stride = weights.cols();
  p.num_tokens = q.rows();
  p.num_heads = num_heads;
  p.head_dim = q.cols() / num_heads;
  p.scale = scale;
  p.keys = keys.data;
  p.keys_dtype = KvDTypeOf(keys.dtype);
  p.rate = keys.rate;
  p.rows_per_block = keys.rows_per_block;
  p.token_seq = meta.token_seq.data();
  p.q_pos = meta.positions.data();
  p.block_tables = keys.tables.tables.data();
  p.max_blocks_per_seq = keys.tables.max_blocks_per_seq;
  p.block_size = keys.tables.block_size;
  p.topk = selected.cols();
  p.selected = selected.as<int32_t>();
  p.pool = ctx.pool;
  kc::IndexerTopK(p);
}

void HcPre(const OpContext& ctx, const kc::HcPreParams& p) { kc::HcPre(p); }
void HcPost(const OpContext& ctx, const kc::HcPostParams& p) { kc::HcPost(p); }
void HcHead(const OpContext& ctx, const kc::HcHeadParams& p) { kc::HcHead(p); }
void Route(const OpContext& ctx, const kc::RouterParams& p) { kc::Route(p); }

}  // namespace dinfer::ops
