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

// Paged KV memory for every layer: K and V of [num_blocks, block_size, kv_dim] f32.
class KvStorage {
 public:
  KvStorage(int64_t num_layers, int64_t num_blocks, int64_t block_size, int64_t kv_dim);
  ops::KvLayerView layer(int64_t i) const;
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }

 private:
  int64_t num_blocks_, block_size_, kv_dim_;
  std::vector<Tensor> k_, v_;
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

  // logits: [logits_rows.size(), vocab_size] f32, allocated by the caller.
  virtual Status Forward(const ops::OpContext& ctx, const ForwardInput& in, const KvStorage& kv,
                         const TensorView& logits) = 0;

 protected:
  explicit Model(ModelConfig config) : config_(std::move(config)) {}
  ModelConfig config_;
};

}  // namespace dinfer
