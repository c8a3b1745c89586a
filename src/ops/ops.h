// The typed op API that model code calls. Each op validates shapes and dtypes (errors as values)
// and dispatches to the kernels of the device the tensors live on (CPU today).
// Thread-safety: ops are stateless; an OpContext (thread pool) is used by one forward at a time.
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "base/thread_pool.h"
#include "tensor/tensor.h"

namespace dinfer::ops {

struct OpContext {
  ThreadPool* pool = nullptr;
  // Quantized weights: multiply with f32 activations (reference numerics) instead of 8-bit ones.
  bool f32_activations = false;
};

// y[m, n] = x[m, k] · wᵀ (+ bias). w is [n, k] of any supported weight dtype; x, y, bias f32.
Status Linear(const OpContext& ctx, const TensorView& x, const TensorView& w,
              const TensorView* bias, const TensorView& y);
bool LinearSupports(DType w_dtype);

// Several linears of the same input (q/k/v, gate/up) in one pass: ys[i] = x · ws[i]ᵀ (+ biases[i]).
// biases[i] may be null.
Status LinearShared(const OpContext& ctx, const TensorView& x, std::span<const TensorView> ws,
                    std::span<const TensorView* const> biases, std::span<const TensorView> ys);

// out = rmsnorm(x) * (weight + offset) over the last dim; out may alias x.
void RmsNorm(const OpContext& ctx, const TensorView& x, const TensorView& weight, float eps,
             const TensorView& out, float weight_offset = 0.0f);

// Per-head rmsnorm: x is [tokens, heads*head_dim], weight [head_dim].
void HeadRmsNorm(const OpContext& ctx, const TensorView& x, int64_t num_heads,
                 const TensorView& weight, float eps);

void SiluMul(const OpContext& ctx, const TensorView& gate, const TensorView& up,
             const TensorView& out);

void Add(const OpContext& ctx, const TensorView& y, const TensorView& x);  // y += x

// out[t] = table[ids[t]] * scale (dequantised to f32).
Status Embedding(const OpContext& ctx, const TensorView& table, std::span<const int32_t> ids,
                 const TensorView& out, float scale = 1.0f);

}  // namespace dinfer::ops

namespace dinfer::ops {

// Where each token of a forward pass sits in the paged KV cache. Built once per step (the "plan"),
// shared by every attention layer (the "run").
// One KV group's block tables for the batch.
struct GroupBlockTables {
  std::span<const int32_t> tables;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t block_size = 0;  // tokens per block
};

struct AttentionMetadata {
  std::span<const int32_t> token_seq;     // per token: sequence index in the batch
  std::span<const int32_t> positions;     // per token: absolute position
  std::span<const int64_t> slot_mapping;  // per token: KV slot (block * block_size + offset)
  std::span<const int32_t> block_tables;  // [num_seqs, max_blocks_per_seq] of KV group 0
  int64_t max_blocks_per_seq = 0;
  int64_t block_size = 0;
  // Every KV group's tables, group 0's first (the same as above); empty for one-group models.
  std::span<const GroupBlockTables> groups;
  // Per sequence: positions below it are a bounded replay (rebuild window KV; write nothing in
  // other groups). Empty: no sequence replays.
  std::span<const int32_t> replay_end;

  bool replaying(int64_t t) const {
    return !replay_end.empty() && positions[t] < replay_end[token_seq[t]];
  }

  GroupBlockTables group(int64_t g) const {
    if (g == 0 || groups.empty()) return {block_tables, max_blocks_per_seq, block_size};
    return groups[static_cast<size_t>(g)];
  }
};

// One layer's paged KV storage: [num_blocks, block_size, kv_heads * head_dim] f32 for K and V.
struct KvLayerView {
  float* k = nullptr;
  float* v = nullptr;
};

struct AttentionOptions {
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  int64_t sliding_window = 0;
  float softcap = 0.0f;
};

// Writes k/v ([tokens, kv_heads*head_dim]) into the cache, then attends q ([tokens,
// heads*head_dim]) over each token's sequence; writes out [tokens, heads*head_dim].
void PagedAttention(const OpContext& ctx, const TensorView& q, const TensorView& k,
                    const TensorView& v, const KvLayerView& kv, const AttentionMetadata& meta,
                    const AttentionOptions& opt, const TensorView& out);

// Rotary embedding in place on x [tokens, heads*head_dim].
void Rope(const OpContext& ctx, const TensorView& x, int64_t num_heads, int64_t head_dim,
          int64_t rotary_dim, std::span<const int32_t> positions, std::span<const float> inv_freq,
          bool interleaved);

}  // namespace dinfer::ops
