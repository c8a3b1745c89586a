#include "model/layers/compressed_attention.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/logging.h"

namespace dinfer::layers {
namespace {

enum AttnSlot {
  kQa = 200,
  kQ,
  kKv,
  kIndexQ,
  kIndexWeights,
  kSelected,
  kAttn,
  kGrouped,
  kCompressor,  // 3 slots each: projected kv, gate, entries
  kIndexCompressor = kCompressor + 3,
};

std::vector<float> DefaultInvFreq(double theta, int64_t dim) {
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(exponent)));
  }
  return inv;
}

// transformers' _compute_yarn_parameters (truncated correction range), in float32.
std::vector<float> YarnInvFreq(double theta, int64_t dim, const RopeScaling& s) {
  const auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) *
           std::log(static_cast<double>(s.original_max_position) / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pos = static_cast<float>(std::pow(theta, static_cast<double>(exponent)));
    const float extrapolation = 1.0f / pos;
    const float interpolation = 1.0f / (static_cast<float>(s.factor) * pos);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float keep = 1.0f - ramp;
    inv[i] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return inv;
}

// A compressor's running state: always f32 (it accumulates across steps).
float* StatePlane(std::span<void* const> planes, std::span<const DType> dtypes, size_t j) {
  DINFER_CHECK(dtypes[j] == DType::kF32);
  return static_cast<float*>(planes[j]);
}

// n^-0.5 rounded to float once, as a Python float scale applied to float32 tensors is.
float InvSqrt(int64_t n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); }

}  // namespace

V4Rope DeepseekV4Rope(const ModelConfig& c) {
  const DeepseekV4Config& v = *c.deepseek_v4;
  V4Rope r;
  r.main = DefaultInvFreq(c.rope_theta, c.rotary_dim);
  r.compress = v.compress_rope.type == RopeScalingType::kYarn
                   ? YarnInvFreq(v.compress_rope_theta, c.rotary_dim, v.compress_rope)
                   : DefaultInvFreq(v.compress_rope_theta, c.rotary_dim);
  return r;
}

namespace {

// The compression rates of the model's layers (MTP included), ascending.
std::vector<int64_t> CompressionRates(const DeepseekV4Config& v) {
  std::vector<int64_t> rates;
  for (V4Attention kind : v.layer_attention) {
    if (kind != V4Attention::kSliding) rates.push_back(v.Rate(kind));
  }
  std::sort(rates.begin(), rates.end());
  rates.erase(std::unique(rates.begin(), rates.end()), rates.end());
  return rates;
}

}  // namespace

std::vector<KvGroup> DeepseekV4KvGroups(const ModelConfig& c, int64_t block_size) {
  std::vector<KvGroup> groups = {{"window", block_size, c.sliding_window, 1}};
  for (int64_t rate : CompressionRates(*c.deepseek_v4)) {
    groups.push_back({"compressed/" + std::to_string(rate),
                      ops::CompressedBlockTokens(block_size, rate), 0, rate});
  }
  return groups;
}

std::vector<KvPlane> DeepseekV4LayerPlanes(const ModelConfig& c, V4Attention kind,
                                           int64_t block_size, DType kv_dtype) {
  const DeepseekV4Config& v = *c.deepseek_v4;
  const int64_t d = c.head_dim;
  std::vector<KvPlane> planes = {{block_size, d, 0, kv_dtype}};
  if (kind == V4Attention::kSliding) return planes;
  const int64_t rate = v.Rate(kind);
  const std::vector<int64_t> rates = CompressionRates(v);
  const int32_t group =
      1 + static_cast<int32_t>(std::find(rates.begin(), rates.end(), rate) - rates.begin());
  const int64_t rows = ops::CompressedRowsPerBlock(block_size, rate);
  const bool sparse = kind == V4Attention::kCompressedSparse;
  planes.push_back({1, kernels::cpu::CompressorStateWidth(d, sparse), 0});
  planes.push_back({rows, d, group, kv_dtype});
  if (sparse) {
    planes.push_back({1, kernels::cpu::CompressorStateWidth(v.index_head_dim, true), 0});
    planes.push_back({rows, v.index_head_dim, group, kv_dtype});
  }
  return planes;
}

StatusOr<CompressorWeights> CompressedAttention::LoadCompressor(WeightSource& w,
                                                                const std::string& prefix,
                                                                const ModelConfig& c, int64_t dim,
                                                                int64_t rate, bool overlap) {
  const DeepseekV4Config& v = *c.deepseek_v4;
  CompressorWeights cw;
  cw.dim = dim;
  cw.rate = rate;
  cw.overlap = overlap;
  const int64_t width = dim * (overlap ? 2 : 1);
  DINFER_ASSIGN_OR_RETURN(cw.wkv, w.GetLinear(prefix + "wkv.weight", width, c.hidden_size,
                                              v.fp8_block_rows, v.fp8_block_cols));
  DINFER_ASSIGN_OR_RETURN(cw.wgate, w.GetLinear(prefix + "wgate.weight", width, c.hidden_size,
                                                v.fp8_block_rows, v.fp8_block_cols));
  DINFER_ASSIGN_OR_RETURN(cw.ape, w.GetF32(prefix + "ape", {rate, width}));
  DINFER_ASSIGN_OR_RETURN(cw.norm, w.GetF32(prefix + "norm.weight", {dim}));
  return cw;
}

StatusOr<CompressedAttention> CompressedAttention::Load(WeightSource& w, const std::string& prefix,
                                                        const ModelConfig& c, V4Attention kind) {
  const DeepseekV4Config& v = *c.deepseek_v4;
  CompressedAttention a;
  a.kind_ = kind;
  a.hidden_ = c.hidden_size;
  a.heads_ = c.num_heads;
  a.head_dim_ = c.head_dim;
  a.rotary_dim_ = c.rotary_dim;
  a.q_rank_ = v.q_lora_rank;
  a.groups_ = v.o_groups;
  a.o_rank_ = v.o_lora_rank;
  a.window_ = c.sliding_window;
  a.eps_ = static_cast<float>(c.rms_norm_eps);
  const int64_t br = v.fp8_block_rows, bc = v.fp8_block_cols;
  const int64_t q_dim = c.num_heads * c.head_dim;
  DINFER_ASSIGN_OR_RETURN(a.w_.wq_a,
                          w.GetLinear(prefix + "wq_a.weight", a.q_rank_, a.hidden_, br, bc));
  DINFER_ASSIGN_OR_RETURN(a.w_.q_norm, w.GetF32(prefix + "q_norm.weight", {a.q_rank_}));
  DINFER_ASSIGN_OR_RETURN(a.w_.wq_b, w.GetLinear(prefix + "wq_b.weight", q_dim, a.q_rank_, br, bc));
  DINFER_ASSIGN_OR_RETURN(a.w_.wkv,
                          w.GetLinear(prefix + "wkv.weight", c.head_dim, a.hidden_, br, bc));
  DINFER_ASSIGN_OR_RETURN(a.w_.kv_norm, w.GetF32(prefix + "kv_norm.weight", {c.head_dim}));
  DINFER_ASSIGN_OR_RETURN(a.w_.wo_a, w.GetLinear(prefix + "wo_a.weight", a.groups_ * a.o_rank_,
                                                 q_dim / a.groups_, br, bc));
  DINFER_ASSIGN_OR_RETURN(
      a.w_.wo_b, w.GetLinear(prefix + "wo_b.weight", a.hidden_, a.groups_ * a.o_rank_, br, bc));
  DINFER_ASSIGN_OR_RETURN(a.w_.sinks, w.GetF32(prefix + "attn_sink", {c.num_heads}));
  if (kind == V4Attention::kSliding) return a;
  const bool sparse = kind == V4Attention::kCompressedSparse;
  DINFER_ASSIGN_OR_RETURN(a.w_.compressor, LoadCompressor(w, prefix + "compressor.", c, c.head_dim,
                                                          v.Rate(kind), sparse));
  if (!sparse) return a;
  a.index_heads_ = v.index_heads;
  a.index_dim_ = v.index_head_dim;
  a.index_topk_ = v.index_topk;
  DINFER_ASSIGN_OR_RETURN(
      a.w_.index_compressor,
      LoadCompressor(w, prefix + "indexer.compressor.", c, v.index_head_dim, v.csa_rate, true));
  DINFER_ASSIGN_OR_RETURN(
      a.w_.index_wq_b,
      w.GetLinear(prefix + "indexer.wq_b.weight", v.index_heads * a.index_dim_, a.q_rank_, br, bc));
  DINFER_ASSIGN_OR_RETURN(a.w_.index_weights, w.GetLinear(prefix + "indexer.weights_proj.weight",
                                                          v.index_heads, a.hidden_, br, bc));
  return a;
}

Status CompressedAttention::Compress(const ops::OpContext& ctx, const CompressorWeights& cw,
                                     const TensorView& x, float* state_plane,
                                     const ops::CompressedPlane& entries_plane,
                                     const ops::AttentionMetadata& meta,
                                     std::span<const float> inv_freq, Workspace& ws,
                                     int slot) const {
  const int64_t n = x.rows(), width = cw.dim * (cw.overlap ? 2 : 1);
  TensorView kv = ws.Get(slot, n, width), gate = ws.Get(slot + 1, n, width);
  const TensorView weights[] = {cw.wkv, cw.wgate};
  const TensorView* const biases[] = {nullptr, nullptr};
  const TensorView outs[] = {kv, gate};
  DINFER_RETURN_IF_ERROR(ops::LinearShared(ctx, x, weights, biases, outs));
  std::vector<int32_t> entry_row(static_cast<size_t>(n), -1);
  std::vector<int32_t> entry_pos;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t pos = meta.positions[t];
    if ((pos + 1) % cw.rate != 0) continue;
    entry_row[t] = static_cast<int32_t>(entry_pos.size());
    // An entry's rotary position is the first token of its window.
    entry_pos.push_back(pos + 1 - static_cast<int32_t>(cw.rate));
  }
  const int64_t count = static_cast<int64_t>(entry_pos.size());
  TensorView entries = ws.Get(slot + 2, std::max<int64_t>(count, 1), cw.dim);
  ops::Compress(ctx, kv, gate, cw.ape, cw.rate, cw.overlap, state_plane, entry_row, meta, entries);
  if (count == 0) return OkStatus();
  entries = entries.Rows(0, count);
  ops::RmsNorm(ctx, entries, cw.norm, eps_, entries);
  ops::RopeTrailing(ctx, entries, 1, cw.dim, rotary_dim_, entry_pos, inv_freq, false);
  // A bounded replay completes only entries that are already cached (the hit's blocks, shared and
  // read-only, and exact); the pooling above just carries the running state on to the hit.
  if (!meta.replay_end.empty()) {
    for (int64_t t = 0; t < n; ++t) {
      if (meta.replaying(t)) entry_row[t] = -1;
    }
  }
  ops::StoreCompressed(ctx, entries, entry_row, entries_plane, meta);
  return OkStatus();
}

Status CompressedAttention::Forward(const ops::OpContext& ctx, const TensorView& x,
                                    std::span<void* const> planes,
                                    std::span<const DType> plane_dtypes,
                                    std::span<const int32_t> plane_groups,
                                    const ops::AttentionMetadata& meta, const V4Rope& rope,
                                    Workspace& ws, const TensorView& out) const {
  const int64_t n = x.rows(), d = head_dim_;
  const std::span<const float> inv_freq =
      kind_ == V4Attention::kSliding ? rope.main : rope.compress;
  TensorView qr = ws.Get(kQa, n, q_rank_);
  DINFER_RETURN_IF_ERROR(ops::Linear(ctx, x, w_.wq_a, nullptr, qr));
  ops::RmsNorm(ctx, qr, w_.q_norm, eps_, qr);
  TensorView q = ws.Get(kQ, n, heads_ * d);
  DINFER_RETURN_IF_ERROR(ops::Linear(ctx, qr, w_.wq_b, nullptr, q));
  ops::RmsNormPerHead(ctx, q, d, nullptr, eps_, q);
  ops::RopeTrailing(ctx, q, heads_, d, rotary_dim_, meta.positions, inv_freq, false);
  TensorView kv = ws.Get(kKv, n, d);
  DINFER_RETURN_IF_ERROR(ops::Linear(ctx, x, w_.wkv, nullptr, kv));
  ops::RmsNorm(ctx, kv, w_.kv_norm, eps_, kv);
  ops::RopeTrailing(ctx, kv, 1, d, rotary_dim_, meta.positions, inv_freq, false);

  std::optional<ops::CompressedPlane> compressed;
  std::optional<TensorView> selected;
  if (w_.compressor) {
    const int64_t rate = w_.compressor->rate;
    if (meta.block_size % rate != 0 && rate % meta.block_size != 0) {
      return InvalidArgument("DeepSeek-V4: blocks of {} tokens and compression rate {} do not nest",
                             meta.block_size, rate);
    }
    compressed = ops::CompressedPlane{planes[2], plane_dtypes[2], rate,
                                      ops::CompressedRowsPerBlock(meta.block_size, rate),
                                      meta.group(plane_groups[2])};
    DINFER_RETURN_IF_ERROR(Compress(ctx, *w_.compressor, x, StatePlane(planes, plane_dtypes, 1),
                                    *compressed, meta, rope.compress, ws, kCompressor));
  }
  if (w_.index_compressor) {
    const ops::CompressedPlane keys{
        planes[4], plane_dtypes[4], w_.index_compressor->rate,
        ops::CompressedRowsPerBlock(meta.block_size, w_.index_compressor->rate),
        meta.group(plane_groups[4])};
    DINFER_RETURN_IF_ERROR(Compress(ctx, *w_.index_compressor, x,
                                    StatePlane(planes, plane_dtypes, 3), keys, meta, rope.compress,
                                    ws, kIndexCompressor));
    TensorView iq = ws.Get(kIndexQ, n, index_heads_ * index_dim_);
    DINFER_RETURN_IF_ERROR(ops::Linear(ctx, qr, w_.index_wq_b, nullptr, iq));
    ops::RopeTrailing(ctx, iq, index_heads_, index_dim_, rotary_dim_, meta.positions, rope.compress,
                      false);
    TensorView iw = ws.Get(kIndexWeights, n, index_heads_);
    DINFER_RETURN_IF_ERROR(ops::Linear(ctx, x, w_.index_weights, nullptr, iw));
    const float weight_scale = InvSqrt(index_heads_);
    for (int64_t i = 0; i < n * index_heads_; ++i) iw.as<float>()[i] *= weight_scale;
    selected = ws.Get(kSelected, n, index_topk_, DType::kI32);
    ops::IndexerTopK(ctx, iq, iw, index_heads_, InvSqrt(index_dim_), keys, meta, *selected);
  }

  TensorView attn = ws.Get(kAttn, n, heads_ * d);
  ops::SparseAttentionOptions opt;
  opt.num_heads = heads_;
  opt.head_dim = d;
  opt.window = window_;
  opt.scale = InvSqrt(d);
  opt.sinks = w_.sinks.as<float>();
  ops::SparseAttention(ctx, q, kv, planes[0], plane_dtypes[0], compressed ? &*compressed : nullptr,
                       selected ? &*selected : nullptr, meta, opt, attn);
  // Keys are the values, so the outputs carry the keys' rotation: undo it at the query position.
  ops::RopeTrailing(ctx, attn, heads_, d, rotary_dim_, meta.positions, inv_freq, true);
  TensorView grouped = ws.Get(kGrouped, n, groups_ * o_rank_);
  DINFER_RETURN_IF_ERROR(ops::GroupedLinear(ctx, attn, w_.wo_a, groups_, grouped));
  return ops::Linear(ctx, grouped, w_.wo_b, nullptr, out);
}

}  // namespace dinfer::layers
