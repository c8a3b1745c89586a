// DeepSeek-V4 attention layer builder: low-rank queries (wq_a -> q_norm -> wq_b, per-head RMSNorm),
// one shared key/value head (wkv -> kv_norm), rotary on the last rotary_dim dims of each head,
// attention over a sliding window plus, for compressed layers, compressed KV entries (every entry
// of heavily compressed attention; the lightning indexer's top-k for compressed sparse attention),
// a per-head attention sink, the inverse rotary on the output, and the grouped low-rank output
// projection (wo_a per group of heads, then wo_b). Weights are views into the checkpoint or
// repacked FP8 copies owned by the WeightSource; immutable after Load.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layers/workspace.h"
#include "model/model.h"
#include "model/weights.h"
#include "ops/deepseek_ops.h"

namespace dinfer::layers {

// Rotary inverse frequencies of DeepSeek-V4: the main ones (sliding-window layers) and the
// compressed layers' ones (compress_rope_theta, YaRN when configured, as transformers computes
// them in float32).
struct V4Rope {
  std::vector<float> main, compress;
};
V4Rope DeepseekV4Rope(const ModelConfig& c);

// The KV groups of a DeepSeek-V4 model whose window keys come in blocks of block_size tokens:
// group 0 "window" (the window keys and the compressor states of every layer: sliding window,
// blocks released behind it), then "compressed/r" for each compression rate r of its layers,
// ascending (the entries of rate r, with the indexer keys for the sparse rate; blocks of
// max(block_size, r) tokens, every one kept and prefix-cacheable).
std::vector<KvGroup> DeepseekV4KvGroups(const ModelConfig& c, int64_t block_size);

// The KV planes of one layer for blocks of block_size tokens, in the order the layer reads them:
// window keys, then for compressed layers the compressor state and entries, then for compressed
// sparse attention the indexer's compressor state and keys; each in its DeepseekV4KvGroups group.
// Keys and entries are stored as `kv_dtype` (f32 or bf16); compressor states, which accumulate
// across steps, stay f32.
std::vector<KvPlane> DeepseekV4LayerPlanes(const ModelConfig& c, V4Attention kind,
                                           int64_t block_size, DType kv_dtype = DType::kBF16);

// The weights of one attention layer (views into the checkpoint or repacked FP8 copies).
struct CompressorWeights {
  TensorView wkv, wgate, ape, norm;  // ape [rate, width]; norm [dim]
  int64_t dim = 0, rate = 0;
  bool overlap = false;  // width = dim * (overlap ? 2 : 1)
};
struct CompressedAttentionWeights {
  TensorView wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, sinks;
  std::optional<CompressorWeights> compressor, index_compressor;
  TensorView index_wq_b, index_weights;
};

class CompressedAttention {
 public:
  // DeepSeek's names under `prefix` ("layers.3.attn."): wq_a, q_norm, wq_b, wkv, kv_norm, wo_a,
  // wo_b, attn_sink, compressor.{wkv, wgate, ape, norm}, indexer.{wq_b, weights_proj,
  // compressor.*}.
  static StatusOr<CompressedAttention> Load(WeightSource& w, const std::string& prefix,
                                            const ModelConfig& c, V4Attention kind);

  // x [n, hidden] (normed) -> out [n, hidden]. `planes` are this layer's KV planes
  // (DeepseekV4LayerPlanes order), `plane_dtypes` and `plane_groups` their dtypes and KV groups.
  Status Forward(const ops::OpContext& ctx, const TensorView& x, std::span<void* const> planes,
                 std::span<const DType> plane_dtypes, std::span<const int32_t> plane_groups,
                 const ops::AttentionMetadata& meta, const V4Rope& rope, Workspace& ws,
                 const TensorView& out) const;

  V4Attention kind() const { return kind_; }
  const CompressedAttentionWeights& weights() const { return w_; }

 private:
  static StatusOr<CompressorWeights> LoadCompressor(WeightSource& w, const std::string& prefix,
                                                    const ModelConfig& c, int64_t dim, int64_t rate,
                                                    bool overlap);
  // Pools this step's tokens into the compressor's entries, normalizes and rotates them and stores
  // them in `entries_plane`.
  Status Compress(const ops::OpContext& ctx, const CompressorWeights& cw, const TensorView& x,
                  float* state_plane, const ops::CompressedPlane& entries_plane,
                  const ops::AttentionMetadata& meta, std::span<const float> inv_freq,
                  Workspace& ws, int slot) const;

  V4Attention kind_ = V4Attention::kSliding;
  CompressedAttentionWeights w_;
  int64_t hidden_ = 0, heads_ = 0, head_dim_ = 0, rotary_dim_ = 0, q_rank_ = 0, groups_ = 0,
          o_rank_ = 0, window_ = 0;
  int64_t index_heads_ = 0, index_dim_ = 0, index_topk_ = 0;
  float eps_ = 1e-6f;
};

}  // namespace dinfer::layers
