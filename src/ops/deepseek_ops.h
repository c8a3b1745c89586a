// Ops of DeepSeek-V4-style models (typed wrappers over kernels/cpu/deepseek_v4.h): sparse attention
// over a window plus compressed entries, KV compressors, the lightning indexer, hyper-connections,
// MoE routing, grouped linear projections, unweighted RMSNorm and trailing interleaved rotary.
// Paged planes are the model's KvStorage planes (see kernels/cpu/deepseek_v4.h for their layout).
// Thread-safety: ops are stateless; an OpContext is used by one forward at a time.
#pragma once

#include <span>

#include "kernels/cpu/deepseek_v4.h"
#include "ops/ops.h"

namespace dinfer::ops {

// A paged plane of compressed entries of a compressor of rate `rate`, in its KV group's tables.
struct CompressedPlane {
  void* data = nullptr;  // [num_blocks, rows_per_block, width] of dtype (f32 or bf16)
  DType dtype = DType::kF32;
  int64_t rate = 0, rows_per_block = 0;
  GroupBlockTables tables;
};

// Tokens per block of a compressed group of rate `rate` when window keys come in blocks of
// block_size tokens: CompressedRowsPerBlock entries, max(block_size, rate) when the two nest.
inline int64_t CompressedBlockTokens(int64_t block_size, int64_t rate) {
  return rate * std::max<int64_t>(1, block_size / rate);
}
// Rows per block of a compressed plane for blocks of block_size tokens.
inline int64_t CompressedRowsPerBlock(int64_t block_size, int64_t rate) {
  return std::max<int64_t>(1, block_size / rate);
}

// out[t, h] = x[t, h] / rms(x[t, h]) * weight (weight may be null) for each of the x.cols() /
// head_dim heads of every row; out may alias x.
void RmsNormPerHead(const OpContext& ctx, const TensorView& x, int64_t head_dim,
                    const TensorView* weight, float eps, const TensorView& out);

// DeepSeek-V4's rotary in place: interleaved pairs over the last rotary_dim dims of each head;
// inverse rotates by -angle (undoing it on attention outputs).
void RopeTrailing(const OpContext& ctx, const TensorView& x, int64_t num_heads, int64_t head_dim,
                  int64_t rotary_dim, std::span<const int32_t> positions,
                  std::span<const float> inv_freq, bool inverse);

// Block-diagonal projection: y[:, g*R:(g+1)*R] = x[:, g*K:(g+1)*K] · w[g*R:(g+1)*R, :]ᵀ for each of
// `groups` groups; x [n, groups*K], w [groups*R, K], y [n, groups*R].
Status GroupedLinear(const OpContext& ctx, const TensorView& x, const TensorView& w, int64_t groups,
                     const TensorView& y);

// out = silu(min(gate, limit)) * clamp(up, -limit, limit) (limit 0: no clamp).
void SiluMulClamp(const OpContext& ctx, const TensorView& gate, const TensorView& up, float limit,
                  const TensorView& out);

struct SparseAttentionOptions {
  int64_t num_heads = 0, head_dim = 0, window = 0;
  float scale = 1.0f;
  const float* sinks = nullptr;  // [num_heads]
};
// Writes kv ([tokens, head_dim]) as the tokens' window keys (window_plane's rows are f32 or bf16,
// rounded), then attends q [tokens, heads *
// head_dim] over each token's window and compressed entries: `selected` [tokens, k] ids (null:
// every complete entry). out [tokens, heads * head_dim].
void SparseAttention(const OpContext& ctx, const TensorView& q, const TensorView& kv,
                     void* window_plane, DType window_dtype, const CompressedPlane* compressed,
                     const TensorView* selected, const AttentionMetadata& meta,
                     const SparseAttentionOptions& opt, const TensorView& out);

// Pools kv / gate ([tokens, dim * (overlap ? 2 : 1)]) with the position bias [rate, same width]
// into entries [num_entries, dim]: entry_row[t] is the row of the entry token t completes, or -1.
void Compress(const OpContext& ctx, const TensorView& kv, const TensorView& gate,
              const TensorView& bias, int64_t rate, bool overlap, float* state_plane,
              std::span<const int32_t> entry_row, const AttentionMetadata& meta,
              const TensorView& entries);

// Writes compressed entries (rows of `entries`, completed by the tokens with entry_row >= 0) into
// their slots of `plane` (rounded to bf16 when the plane is bf16).
void StoreCompressed(const OpContext& ctx, const TensorView& entries,
                     std::span<const int32_t> entry_row, const CompressedPlane& plane,
                     const AttentionMetadata& meta);

// The lightning indexer's top-k: q [tokens, heads * head_dim], weights [tokens, heads] ->
// selected [tokens, topk].
void IndexerTopK(const OpContext& ctx, const TensorView& q, const TensorView& weights,
                 int64_t num_heads, float scale, const CompressedPlane& keys,
                 const AttentionMetadata& meta, const TensorView& selected);

void HcPre(const OpContext& ctx, const kernels::cpu::HcPreParams& p);
void HcPost(const OpContext& ctx, const kernels::cpu::HcPostParams& p);
void HcHead(const OpContext& ctx, const kernels::cpu::HcHeadParams& p);
void Route(const OpContext& ctx, const kernels::cpu::RouterParams& p);

}  // namespace dinfer::ops
