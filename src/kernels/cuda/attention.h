// CUDA paged attention (causal, GQA, sliding window, softcap) over a KV cache that already holds
// the step's new keys and values (written by QkvRopeKvWrite). Same semantics as
// kernels/cpu AttentionReference. Two kernels share one params struct:
//  - AttentionRows: one query token per CTA row of work, all heads of a KV-head group together
//    (bf16 with head_dim 64 or 128: up to 4 KV heads a CTA, one per warp, so that each key's
//    cache row is read in long contiguous runs), keys split across CTAs (flash-decoding) and
//    merged in a thread-block cluster (bf16, up to kMaxAttentionClusterSplits) or by a second
//    kernel. The bf16 kernel reads the metadata and the cache rows of positions before each
//    row's chunk of its sequence (seq_token_end, when given) before it waits for the kernel
//    before it: those must not be written by the kernels it follows in the stream. Any head_dim up
//    to 256, f32 or bf16; used for decode tokens and for every token of f32 models.
//  - AttentionPrefill: tiles of kPrefillTileTokens query tokens of one sequence against tiles of
//    64 keys on the tensor cores (mma.sync bf16, f32 accumulation, online softmax), the query
//    heads of a KV head together (num_heads CTAs a tile); bf16, head_dim 64 or 128, scale > 0.
// With kv_fp8 the cache holds e4m3fn bytes (QkvParams::kv_fp8), staged in shared memory as they
// come; the prefill kernel widens each tile to f16 there, the decode kernel in registers into f16
// mma fragments (both exact, their Q and softmax weights then f16 too); k_scale is folded into
// the softmax scale and v_scale into the output. bf16 queries, head_dim 64 or 128 only.
// The per-step metadata (which tokens, tiles, splits) is built once per step on the host (the
// plan) and read by every layer (the run); sizes are fixed per graph bucket, so replay is safe.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dinfer::kernels::cuda {

struct AttentionParams {
  const void* q = nullptr;  // [tokens, q_stride]: head h at column h * head_dim
  int64_t q_stride = 0;
  void* out = nullptr;  // [tokens, out_stride]
  int64_t out_stride = 0;
  DType dtype = DType::kBF16;
  const void* k_cache = nullptr;  // [num_blocks, block_size, num_kv_heads * head_dim]
  const void* v_cache = nullptr;
  bool kv_fp8 = false;  // the caches hold e4m3fn of k / k_scale and v / v_scale
  float k_scale = 1.0f, v_scale = 1.0f;
  int64_t block_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  const int32_t* token_seq = nullptr;     // [tokens]: sequence of each token
  const int32_t* positions = nullptr;     // [tokens]
  const int32_t* block_tables = nullptr;  // [seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  float scale = 1.0f;
  int64_t sliding_window = 0;
  float softcap = 0.0f;

  // AttentionRows: the tokens to compute (indices into the token arrays) and the key splits.
  const int32_t* row_tokens = nullptr;
  int64_t num_rows = 0;
  int64_t num_splits = 1;
  // Workspace for num_splits > 1: [num_rows, num_heads, num_splits, head_dim] and [..., 2] f32.
  float* split_out = nullptr;
  float* split_stats = nullptr;

  // AttentionPrefill: tile t covers tokens [tile_token[t], min(+kPrefillTileTokens,
  // seq_token_end[tile_seq[t]])) of sequence tile_seq[t], whose positions are consecutive.
  const int32_t* tile_seq = nullptr;
  const int32_t* tile_token = nullptr;
  const int32_t* seq_token_end = nullptr;  // [seqs]
  int64_t num_tiles = 0;
};

inline constexpr int kPrefillTileTokens = 128;

int AttentionRows(const AttentionParams& p, void* stream);
// How AttentionRows spreads over the device: CTAs per (row, split), how many fit an SM, and up to
// how many splits its kernel merges inside a thread-block cluster (0: none; more splits take the
// merge kernel).
struct AttentionRowsShape {
  int64_t ctas_per_row = 1;
  int64_t ctas_per_sm = 1;
  int64_t cluster_splits = 0;
};
inline constexpr int64_t kMaxAttentionClusterSplits = 8;
AttentionRowsShape AttentionRowsCtas(int64_t num_rows, DType dtype, int64_t head_dim, bool kv_fp8,
                                     int64_t num_heads, int64_t num_kv_heads);
// Key splits for AttentionRows: about as many CTAs as fit the device at once, at most
// kMaxAttentionSplits, and at least 512 keys a split, or, where the shape's kernel merges them
// in a cluster (no merge kernel to pay for), at least 64 keys a split up to cluster_splits.
inline constexpr int64_t kMaxAttentionSplits = 64;
int64_t ChooseAttentionSplits(int64_t num_rows, const AttentionRowsShape& shape, int64_t max_keys,
                              int multiprocessors);
int AttentionPrefill(const AttentionParams& p, void* stream);
// Whether AttentionPrefill handles this dtype and head_dim.
bool PrefillSupports(DType dtype, int64_t head_dim);

}  // namespace dinfer::kernels::cuda
