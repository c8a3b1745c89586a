// DeepSeek-V4: the model of archs/deepseek_v4.h, loaded from checkpoints in DeepSeek's published
// layout (embed, layers.N.{attn,ffn,hc_*}, mtp.N.*, head; FP8 / FP4 weights with their scales) or
// as transformers' save_pretrained writes them (model.* names, no MTP layer).
#include "model/archs/deepseek_v4.h"

#include <algorithm>
#include <cstring>
#include <regex>

#include "model/registry.h"

namespace dinfer {
namespace {

enum ModelSlot {
  kEmbedding = 300,
  kStreamsA,
  kStreamsB,
  kCollapsed,
  kNormed,
  kBranch,
  kHeadRows,
  kHeadOut,
  kMtpHidden,
  kMtpNormed,
};

layers::HcSettings HcFor(const ModelConfig& c) {
  const DeepseekV4Config& v = *c.deepseek_v4;
  layers::HcSettings s;
  s.hc = v.hc_mult;
  s.hidden = c.hidden_size;
  s.sinkhorn_iters = v.hc_sinkhorn_iters;
  s.hc_eps = static_cast<float>(v.hc_eps);
  s.norm_eps = static_cast<float>(c.rms_norm_eps);
  return s;
}

// The names transformers' save_pretrained gives DeepSeek's tensors: a "model." prefix, its own
// names for the embedding, final norm and HC head, and "attn.norm" for the key/value norm.
std::string SavedByTransformers(const std::string& name) {
  static const std::regex kv_norm(R"(^layers\.(\d+)\.attn\.kv_norm\.weight$)");
  if (name == "embed.weight") return "model.embed_tokens.weight";
  if (name == "norm.weight") return "model.norm.weight";
  if (name.rfind("hc_head_", 0) == 0) return "model.hc_head.hc_" + name.substr(8);
  if (std::regex_match(name, kv_norm))
    return "model." + std::regex_replace(name, kv_norm, "layers.$1.attn.norm.weight");
  if (name.rfind("layers.", 0) == 0) return "model." + name;
  return name;
}

}  // namespace

StatusOr<DeepseekV4Model::Block> DeepseekV4Model::LoadBlock(WeightSource& w,
                                                            const std::string& prefix,
                                                            const ModelConfig& c, int64_t layer) {
  const DeepseekV4Config& v = *c.deepseek_v4;
  const layers::HcSettings hc = HcFor(c);
  DINFER_ASSIGN_OR_RETURN(TensorView attn_norm,
                          w.GetF32(prefix + "attn_norm.weight", {c.hidden_size}));
  DINFER_ASSIGN_OR_RETURN(TensorView ffn_norm,
                          w.GetF32(prefix + "ffn_norm.weight", {c.hidden_size}));
  DINFER_ASSIGN_OR_RETURN(auto attn_hc, layers::HyperConnection::Load(w, prefix + "hc_attn_", hc));
  DINFER_ASSIGN_OR_RETURN(auto ffn_hc, layers::HyperConnection::Load(w, prefix + "hc_ffn_", hc));
  DINFER_ASSIGN_OR_RETURN(auto attn, layers::CompressedAttention::Load(w, prefix + "attn.", c,
                                                                       v.layer_attention[layer]));
  DINFER_ASSIGN_OR_RETURN(auto moe,
                          layers::MoeLayer::Load(w, prefix + "ffn.", c, v.layer_hash_moe[layer]));
  return Block{attn_norm,         ffn_norm,        std::move(attn_hc),
               std::move(ffn_hc), std::move(attn), std::move(moe)};
}

StatusOr<std::unique_ptr<DeepseekV4Model>> DeepseekV4Model::Build(const ModelConfig& c,
                                                                  WeightSource& w) {
  if (!c.deepseek_v4) return InvalidArgument("deepseek_v4: the config has no DeepSeek-V4 fields");
  const DeepseekV4Config& v = *c.deepseek_v4;
  std::unique_ptr<DeepseekV4Model> m(new DeepseekV4Model(c));
  w.SetFallbackName(SavedByTransformers);
  DINFER_ASSIGN_OR_RETURN(m->embed_, w.Get("embed.weight", {c.vocab_size, c.hidden_size}));
  DINFER_ASSIGN_OR_RETURN(m->lm_head_, w.GetLinear("head.weight", c.vocab_size, c.hidden_size,
                                                   v.fp8_block_rows, v.fp8_block_cols));
  DINFER_ASSIGN_OR_RETURN(m->norm_, w.GetF32("norm.weight", {c.hidden_size}));
  DINFER_ASSIGN_OR_RETURN(m->hc_head_, layers::HyperHead::Load(w, "hc_head_", HcFor(c)));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    DINFER_ASSIGN_OR_RETURN(Block b, LoadBlock(w, "layers." + std::to_string(i) + ".", c, i));
    m->layers_.push_back(std::move(b));
  }
  // MTP layers are optional: checkpoints converted for serving without drafts may drop them.
  for (int64_t k = 0; k < v.num_mtp_layers && w.Has("mtp." + std::to_string(k) + ".e_proj.weight");
       ++k) {
    const std::string p = "mtp." + std::to_string(k) + ".";
    const int64_t h = c.hidden_size;
    DINFER_ASSIGN_OR_RETURN(Block block, LoadBlock(w, p, c, c.num_layers + k));
    Mtp mtp;
    mtp.block = std::move(block);
    DINFER_ASSIGN_OR_RETURN(
        mtp.e_proj, w.GetLinear(p + "e_proj.weight", h, h, v.fp8_block_rows, v.fp8_block_cols));
    DINFER_ASSIGN_OR_RETURN(
        mtp.h_proj, w.GetLinear(p + "h_proj.weight", h, h, v.fp8_block_rows, v.fp8_block_cols));
    DINFER_ASSIGN_OR_RETURN(mtp.enorm, w.GetF32(p + "enorm.weight", {h}));
    DINFER_ASSIGN_OR_RETURN(mtp.hnorm, w.GetF32(p + "hnorm.weight", {h}));
    DINFER_ASSIGN_OR_RETURN(mtp.norm, w.GetF32(p + "norm.weight", {h}));
    DINFER_ASSIGN_OR_RETURN(mtp.head, layers::HyperHead::Load(w, p + "hc_head_", HcFor(c)));
    m->mtp_.push_back(std::move(mtp));
  }
  m->rope_ = layers::DeepseekV4Rope(c);
  return m;
}

KvLayout DeepseekV4Model::KvLayoutFor(int64_t block_size) const {
  const DeepseekV4Config& v = *config_.deepseek_v4;
  KvLayout layout;
  for (int64_t i = 0; i < config_.num_layers + static_cast<int64_t>(mtp_.size()); ++i) {
    layout.push_back(layers::DeepseekV4LayerPlanes(config_, v.layer_attention[i], block_size));
  }
  return layout;
}

std::vector<KvGroup> DeepseekV4Model::KvGroupsFor(int64_t block_size) const {
  return layers::DeepseekV4KvGroups(config_, block_size);
}

// Why replaying [S, T) rebuilds the window exactly, given the cached compressed entries and indexer
// keys of every entry completed before T (they are exact, and the replay reads them instead of
// writing its own). Number the KV layers l = 0 .. L - 1 (the MTP layer last: its input is the
// final hidden state) and let W be the window. Everything but attention is per token
// (hyper-connections, norms, MoE, hash routing), and a layer's attention at position j reads its
// window keys at (j - W, j] plus compressed entries. So if a layer's input is exact at positions
// >= E, its window keys are too and its output is exact at positions >= E + W - 1. The inputs of
// layer 0 (embeddings) are exact from S on, so layer l's inputs and window keys are exact from
// S + l(W - 1) on (what the replay computed before that, from the empty window blocks behind S,
// never reaches further). Positions from T on read the window keys at positions >= T - W + 1, so
//   S <= T - L(W - 1).
// A compressor of rate r at layer l also leaves a running state at T for the entry in progress:
// it pools the layer's inputs from the window start B = (floor(T / r) - o) r on (o = 1 for the
// overlapping compressors of compressed sparse attention, whose state also holds the next
// entry's half of the previous window), and it was reset when position B - 1 completed an entry.
// Both are inside the replay's exact zone when B - 1 >= S + l(W - 1), which holds for every T when
//   S <= T - (1 + o) r - l(W - 1)
// (B >= T - (1 + o) r + 1). What the replay reads from the state before S (an empty block) is gone
// after that reset. R is the largest of these bounds.
int64_t DeepseekV4Model::WindowReplayTokens() const {
  const DeepseekV4Config& v = *config_.deepseek_v4;
  const int64_t w = config_.sliding_window;
  if (w <= 0) return 0;
  const int64_t num_layers = config_.num_layers + static_cast<int64_t>(mtp_.size());
  int64_t r = num_layers * (w - 1);
  for (int64_t l = 0; l < num_layers; ++l) {
    const V4Attention kind = v.layer_attention[static_cast<size_t>(l)];
    if (kind == V4Attention::kSliding) continue;
    const int64_t overlap = kind == V4Attention::kCompressedSparse ? 1 : 0;
    r = std::max(r, (1 + overlap) * v.Rate(kind) + l * (w - 1));
  }
  return r;
}

StatusOr<TensorView> DeepseekV4Model::RunBlock(const ops::OpContext& ctx, const Block& block,
                                               int64_t layer, const TensorView& streams,
                                               std::span<const int32_t> tokens,
                                               const ops::AttentionMetadata& meta,
                                               const KvStorage& kv) {
  const int64_t n = streams.rows(), h = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const V4Attention kind = config_.deepseek_v4->layer_attention[layer];
  const int64_t num_planes = kind == V4Attention::kSliding             ? 1
                             : kind == V4Attention::kHeavilyCompressed ? 3
                                                                       : 5;
  const std::vector<KvPlane> layout = layers::DeepseekV4LayerPlanes(config_, kind, kv.block_size());
  std::vector<void*> planes;
  std::vector<DType> dtypes;
  std::vector<int32_t> groups;
  for (int64_t j = 0; j < num_planes; ++j) {
    planes.push_back(kv.plane(layer, j));
    dtypes.push_back(kv.plane_dtype(layer, j));
    groups.push_back(layout[static_cast<size_t>(j)].group);
  }
  TensorView collapsed = ws_.Get(kCollapsed, n, h), normed = ws_.Get(kNormed, n, h);
  TensorView branch = ws_.Get(kBranch, n, h);
  // After attention the streams live in a second buffer; after the MoE they return to `streams`.
  TensorView mid = ws_.Get(kStreamsB, n, streams.cols());
  DINFER_RETURN_IF_ERROR(block.attn_hc.Pre(ctx, streams, ws_, collapsed));
  ops::RmsNorm(ctx, collapsed, block.attn_norm, eps, normed);
  DINFER_RETURN_IF_ERROR(
      block.attn.Forward(ctx, normed, planes, dtypes, groups, meta, rope_, ws_, branch));
  block.attn_hc.Post(ctx, streams, branch, ws_, mid);
  DINFER_RETURN_IF_ERROR(block.ffn_hc.Pre(ctx, mid, ws_, collapsed));
  ops::RmsNorm(ctx, collapsed, block.ffn_norm, eps, normed);
  DINFER_RETURN_IF_ERROR(block.moe.Forward(ctx, normed, tokens, ws_, branch));
  block.ffn_hc.Post(ctx, mid, branch, ws_, streams);
  return streams;
}

Status DeepseekV4Model::Head(const ops::OpContext& ctx, const TensorView& streams,
                             std::span<const int32_t> rows, const layers::HyperHead& hc_head,
                             const TensorView& norm, const TensorView& logits) {
  const int64_t n = streams.rows(), nl = static_cast<int64_t>(rows.size()), width = streams.cols(),
                h = config_.hidden_size;
  if (logits.rows() != nl || logits.cols() != config_.vocab_size) {
    return InvalidArgument("forward: logits buffer {} does not fit {} rows of {}",
                           logits.ShapeString(), nl, config_.vocab_size);
  }
  if (nl == 0) return OkStatus();
  TensorView picked = ws_.Get(kHeadRows, nl, width), out = ws_.Get(kHeadOut, nl, h);
  for (int64_t r = 0; r < nl; ++r) {
    if (rows[r] < 0 || rows[r] >= n)
      return InvalidArgument("forward: logits row {} out of range", rows[r]);
    std::memcpy(picked.as<float>() + r * width, streams.as<float>() + rows[r] * width,
                sizeof(float) * static_cast<size_t>(width));
  }
  DINFER_RETURN_IF_ERROR(hc_head.Forward(ctx, picked, ws_, out));
  ops::RmsNorm(ctx, out, norm, static_cast<float>(config_.rms_norm_eps), out);
  return ops::Linear(ctx, out, lm_head_, nullptr, logits);
}

Status DeepseekV4Model::Forward(const ops::OpContext& ctx, const ForwardInput& in,
                                const KvStorage& kv, const TensorView& logits) {
  const int64_t n = static_cast<int64_t>(in.tokens.size()), h = config_.hidden_size;
  const int64_t hc = config_.deepseek_v4->hc_mult;
  if (n == 0) return OkStatus();
  TensorView emb = ws_.Get(kEmbedding, n, h);
  DINFER_RETURN_IF_ERROR(ops::Embedding(ctx, embed_, in.tokens, emb));
  TensorView streams = ws_.Get(kStreamsA, n, hc * h);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < hc; ++i) {
      std::memcpy(streams.as<float>() + (t * hc + i) * h, emb.as<float>() + t * h,
                  sizeof(float) * static_cast<size_t>(h));
    }
  }
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    DINFER_ASSIGN_OR_RETURN(streams, RunBlock(ctx, layers_[i], i, streams, in.tokens, in.meta, kv));
  }
  if (has_draft_layer()) {
    if (last_streams_.empty() || last_streams_.view().rows() < n) {
      last_streams_ = Tensor::Empty(DType::kF32, {n, hc * h});
    }
    std::memcpy(last_streams_.data<float>(), streams.data, static_cast<size_t>(streams.nbytes()));
    last_rows_ = n;
  }
  return Head(ctx, streams, in.logits_rows, hc_head_, norm_, logits);
}

Status DeepseekV4Model::ForwardDraft(const ops::OpContext& ctx, const ForwardInput& in,
                                     const KvStorage& kv, const TensorView& logits) {
  const int64_t n = static_cast<int64_t>(in.tokens.size()), h = config_.hidden_size;
  const int64_t hc = config_.deepseek_v4->hc_mult;
  if (!has_draft_layer()) {
    return MakeError(StatusCode::kFailedPrecondition, "the checkpoint has no MTP layer");
  }
  if (n != last_rows_) {
    return InvalidArgument("MTP forward over {} rows, but the previous forward had {}", n,
                           last_rows_);
  }
  const Mtp& mtp = mtp_[0];
  const float eps = static_cast<float>(config_.rms_norm_eps);
  TensorView emb = ws_.Get(kEmbedding, n, h);
  DINFER_RETURN_IF_ERROR(ops::Embedding(ctx, embed_, in.tokens, emb));
  ops::RmsNorm(ctx, emb, mtp.enorm, eps, emb);
  TensorView projected = ws_.Get(kMtpHidden, n, h);
  DINFER_RETURN_IF_ERROR(ops::Linear(ctx, emb, mtp.e_proj, nullptr, projected));
  // Each stream is normalized and projected on its own: [n * hc, hidden] rows.
  const TensorView last = TensorView::Make(last_streams_.view().data, DType::kF32, {n * hc, h});
  TensorView normed = ws_.Get(kMtpNormed, n * hc, h);
  ops::RmsNorm(ctx, last, mtp.hnorm, eps, normed);
  TensorView streams = ws_.Get(kStreamsA, n, hc * h);
  DINFER_RETURN_IF_ERROR(ops::Linear(ctx, normed, mtp.h_proj, nullptr,
                                     TensorView::Make(streams.data, DType::kF32, {n * hc, h})));
  for (int64_t t = 0; t < n; ++t) {
    const TensorView e = projected.Rows(t, t + 1);
    for (int64_t i = 0; i < hc; ++i) {
      ops::Add(ctx, TensorView::Make(streams.as<float>() + (t * hc + i) * h, DType::kF32, {1, h}),
               e);
    }
  }
  DINFER_ASSIGN_OR_RETURN(
      streams, RunBlock(ctx, mtp.block, config_.num_layers, streams, in.tokens, in.meta, kv));
  return Head(ctx, streams, in.logits_rows, mtp.head, mtp.norm, logits);
}

StatusOr<std::unique_ptr<Model>> BuildDeepseekV4(const ModelConfig& c, WeightSource& w) {
  DINFER_ASSIGN_OR_RETURN(std::unique_ptr<DeepseekV4Model> m, DeepseekV4Model::Build(c, w));
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace dinfer
