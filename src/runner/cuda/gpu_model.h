// GpuModel: a model's forward pass on one CUDA device, as GpuRunner drives it. The runner owns the
// paged KV memory (the model says its planes: KvLayoutFor), builds each step's plan in device
// memory (GpuStep) and calls Forward; the model owns its weights and activation buffers.
// Implementations: GpuDecoder (Llama-family decoders) and GpuDeepseekV4.
// Thread-safety: Forward enqueues on one stream; one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/model.h"
#include "tensor/dtype.h"

namespace dinfer {

// The most KV groups a GPU model may have (DeepSeek-V4: the window and two compression rates).
inline constexpr int kMaxGpuKvGroups = 4;

// Device pointers into one step's plan.
struct GpuStep {
  int64_t num_tokens = 0, num_seqs = 0;
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* token_seq = nullptr;
  const int64_t* slots = nullptr;
  const int32_t* seq_token_end = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  // Every KV group's tables ([num_seqs, group_width[g]] of group g's block ids; group 0's are
  // block_tables) and tokens per block.
  const int32_t* group_tables[kMaxGpuKvGroups] = {};
  int64_t group_width[kMaxGpuKvGroups] = {};
  int64_t group_block_tokens[kMaxGpuKvGroups] = {};
  // [num_seqs]: positions below it rebuild window KV only (SeqChunk::replay_end); null: none.
  const int32_t* replay_end = nullptr;
  const int32_t* logits_rows = nullptr;  // token index of each logits row
  int64_t num_logits = 0;
  // Dense attention work: tokens for the one-token kernel (and its key splits), tiles for the
  // prefill one.
  const int32_t* row_tokens = nullptr;
  int64_t num_rows = 0, num_splits = 1;
  const int32_t* tile_seq = nullptr;
  const int32_t* tile_token = nullptr;
  int64_t num_tiles = 0;
};

// The paged KV memory of a step. planes[layer][j] is plane j of KvLayoutFor (group g's blocks,
// one past the caller's last block being the runner's sink). Dense models: planes 0 and 1 are K
// and V ([num_blocks, block_size, kv_dim] of the model's dtype, or with fp8 of e4m3fn bytes
// holding k / k_scale and v / v_scale), also in k and v.
struct GpuKvCache {
  std::vector<std::vector<void*>> planes;
  std::vector<void*> k, v;
  int64_t block_size = 0;
  bool fp8 = false;
  float k_scale = 1.0f, v_scale = 1.0f;
};

class GpuModel {
 public:
  virtual ~GpuModel() = default;

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }  // the weights' and activations' dtype
  // Bytes of weights one forward pass reads (each matrix once).
  int64_t weight_bytes() const { return weight_bytes_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t max_logits() const { return max_logits_; }

  // The planes of each layer's KV memory for blocks of block_size tokens, K and V stored as
  // kv_dtype (the model's dtype or e4m3), and the groups they belong to. By default, dense
  // attention: K and V of block_size rows of num_kv_heads * head_dim, one group.
  virtual KvLayout KvLayoutFor(int64_t block_size, DType kv_dtype) const;
  virtual std::vector<KvGroup> KvGroupsFor(int64_t block_size) const;
  // Whether Forward reads the dense attention work of GpuStep (row tokens, splits, tiles).
  virtual bool dense_attention() const { return true; }

  // Activation buffers for steps of up to max_tokens tokens, max_logits logits rows and
  // max_split_cells cells of split-K attention workspace (rows × heads × splits), sequences of
  // up to max_seq_len tokens.
  virtual Status Reserve(int64_t max_tokens, int64_t max_logits, int64_t max_split_cells,
                         int64_t max_seq_len) = 0;
  // Enqueues one forward pass on `stream`: logits [step.num_logits, vocab] f32.
  virtual Status Forward(const GpuStep& step, const GpuKvCache& kv, float* logits,
                         void* stream) = 0;
  // The draft (MTP) layer over the rows of the last Forward (the same chunks, each token replaced
  // by the one after it: Model::ForwardDraft); its KV planes are the layer after the last.
  virtual bool has_draft_layer() const { return false; }
  virtual Status ForwardDraft(const GpuStep& /*step*/, const GpuKvCache& /*kv*/, float* /*logits*/,
                              void* /*stream*/) {
    return Unimplemented("this model has no draft layer");
  }

 protected:
  GpuModel(ModelConfig config, DType dtype) : config_(std::move(config)), dtype_(dtype) {}

  ModelConfig config_;
  DType dtype_;
  int64_t weight_bytes_ = 0;
  int64_t max_tokens_ = 0, max_logits_ = 0;
};

}  // namespace dinfer
