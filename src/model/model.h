// Model: a causal language model's forward pass over a batch of tokens from several sequences,
// reading and writing a paged KV cache. KvStorage owns that cache's memory.
// A Model is immutable after construction; Forward may be called by one thread at a time
// (it uses internal scratch buffers).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace dinfer {

// One plane of a layer's paged KV memory: every block holds rows_per_block rows of `width` f32.
// A dense layer has two planes of block_size rows (K and V); other attention kinds keep other
// per-token or per-block state (DeepSeek-V4: window keys, compressor state, compressed entries).
struct KvPlane {
  int64_t rows_per_block = 0;
  int64_t width = 0;
};
using KvLayout = std::vector<std::vector<KvPlane>>;  // per layer, its planes

// Paged KV memory for every layer: plane j of layer i is [num_blocks, rows_per_block, width] f32.
class KvStorage {
 public:
  KvStorage(const KvLayout& layout, int64_t num_blocks, int64_t block_size);
  // Planes 0 and 1 (K and V) of a dense layer.
  ops::KvLayerView layer(int64_t i) const;
  float* plane(int64_t layer, int64_t j) const { return planes_[layer][j].data<float>(); }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  static int64_t BytesPerBlock(const KvLayout& layout);

 private:
  int64_t num_blocks_, block_size_;
  std::vector<std::vector<Tensor>> planes_;
};

struct ForwardInput {
  std::span<const int32_t> tokens;
  ops::AttentionMetadata meta;
  // Indices into `tokens` whose next-token logits are wanted (e.g. each sequence's last token).
  std::span<const int32_t> logits_rows;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  int64_t kv_dim() const { return config_.num_kv_heads * config_.head_dim; }
  // The planes of each layer's KV memory for blocks of `block_size` tokens. By default K and V of
  // block_size rows of kv_dim per layer.
  virtual KvLayout KvLayoutFor(int64_t block_size) const;

  // logits: [logits_rows.size(), vocab_size] f32, allocated by the caller.
  virtual Status Forward(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                         const TensorView& logits) = 0;

  // Models with a next-token-prediction draft layer (DeepSeek's MTP): runs it over the rows of
  // the previous Forward. Row t combines that forward's final hidden state of token t with the
  // embedding of in.tokens[t] (the token that follows it) and predicts the token after that;
  // in.meta must place the rows as the previous Forward did (same positions and slots).
  virtual bool has_draft_layer() const { return false; }
  virtual Status ForwardDraft(const ops::OpContext& ctx, const ForwardInput& in,
                              const KvStorage& kv, const TensorView& logits);

 protected:
  explicit Model(ModelConfig config) : config_(std::move(config)) {}
  ModelConfig config_;
};

}  // namespace dinfer
