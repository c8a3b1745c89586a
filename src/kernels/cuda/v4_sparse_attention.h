// CUDA DeepSeek-V4 sparse attention: the semantics of kernels/cpu SparseAttention (deepseek_v4.h)
// as ops::SparseAttention runs it, followed by the inverse rotary of the output.
//  1. The step's keys kv [tokens, head_dim] (f32) are written as the tokens' window keys: row
//     table[pos / block_size] * block_size + pos % block_size of window_kv (the token's sequence's
//     block table), rounded to the plane's dtype (bf16: nearest even).
//  2. Each query token t (position pos, sequence s) attends, multi-query (ONE key head shared by
//     all query heads; the keys are also the values), over its key list: the window keys at
//     positions max(0, pos - window + 1) .. pos, then the compressed entries: the num_selected ids
//     selected[t, :] (-1 skipped, duplicates counted as often as they appear), or with selected
//     null every entry w < (pos + 1) / rate. Entry w is row CompressedSlot(table, block_size, rate,
//     rows_per_block, w) of `compressed` (its own tables: compressed_tables; null: block_tables
//     with block_size). out = Σ_j e^{s_j} k_j / (Σ_j e^{s_j} + e^{sink_h}), s_j = scale * q·k_j
//     (sinks null: no sink term).
//  3. With rotary_dim > 0, the interleaved pairs (2i, 2i + 1) of the last rotary_dim dims of every
//     head of out are rotated by -(positions[t] * inv_freq[i]) (f32 angle, as kernels/cpu Rope).
// Three attention kernels, chosen by dtype and shape:
//  - wgmma (bf16 planes, head_dim 512: V4; kernel 0): a CTA of two warpgroups takes one token,
//    64 query heads and one split of its key list, tiles of 64 keys (cp.async, 2 stages) read
//    by the tensor cores straight from shared memory: each warpgroup computes S for all 64 heads
//    (wgmma m64n64k16 over Q staged once as bf16), the softmax in registers (f32, online), and
//    O += P·V for its 256 dims (P bf16 in registers, V the same tile read transposed). Splits
//    are merged as the mma.sync kernel's are. Errors as below (bf16 q and P).
//  - Tensor cores, mma.sync (bf16 planes, head_dim 64, 128, 256 or 512): a CTA
//    of 16 warps takes one token, 64 query heads (more heads: more CTAs) and one split of its key
//    list; warp (m, d) owns heads 16m..16m+15 and dims [d·D/4, (d+1)·D/4). The rows of up to 512
//    keys at a time are looked up into shared memory, then tiles of 32 rows are gathered with
//    cp.async (3 stages) and each row is read once for all 64 heads. S = Q·Kᵀ
//    (mma.sync m16n8k16 bf16, f32 accumulation) is summed over the 4 dim quarters through shared
//    memory, the softmax is f32 (online), O += P·V with P rounded to bf16. Queries are rounded to
//    bf16 (f32 q too), so results carry bf16-class error (~1e-2 relative at worst).
//  - Otherwise (any f32 plane, other head_dim up to 1024): one CTA per (token, head, split), f32
//    throughout (errors ~1e-6 relative).
// With workspace and max_splits > 1 each token's key list is split across CTAs (the count depends
// only on num_tokens, max_splits, the SM count and the largest possible key list; at least 64 keys
// a split, CTAs within one wave). The tensor-core kernel takes at most 16 splits (fewer where
// clusters that large do not fit) and launches each (token, head group)'s splits as one
// thread-block cluster: the splits leave their partial outputs in shared memory and merge them
// through distributed shared memory (fixed order: deterministic), adding the sink and applying the
// rotary (the workspace is then not touched; should the cluster launch fail, the workspace and a
// merge kernel as below). The f32 kernel's splits go through the workspace and a merge kernel;
// without splits the attention kernel finishes in place.
// When num_tokens == num_seqs, every sequence must have exactly one token in the step (decode;
// the GPU runner's padding tokens may share a slot): the tensor-core kernel then writes the keys
// to the window plane itself and reads each token's own key from kv, so that no other kernel runs
// before it. The plane ends up exactly as with the separate write.
// Layouts: q [tokens, q_stride] f32|bf16 (head h at column h * head_dim); out [tokens, out_stride]
// f32|bf16; window_kv [blocks, block_size, head_dim]; compressed [blocks, rows_per_block,
// head_dim]; planes f32|bf16 (16-byte aligned bases for the tensor-core path).
// Limits: head_dim ≤ 1024; rotary_dim even, ≤ head_dim, with head_dim - rotary_dim even.
// No host synchronisation, no allocation; grid shapes depend only on the params' sizes.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dinfer::kernels::cuda {

struct V4SparseAttentionParams {
  const void* q = nullptr;  // [tokens, heads * head_dim] f32 | bf16
  DType q_dtype = DType::kF32;
  int64_t q_stride = 0;
  const float* kv = nullptr;  // [tokens, head_dim]: the step's keys (written first)
  int64_t kv_stride = 0;
  void* out = nullptr;  // [tokens, heads * head_dim] f32 | bf16
  DType out_dtype = DType::kBF16;
  int64_t out_stride = 0;
  int64_t num_tokens = 0, num_seqs = 0, num_heads = 0, head_dim = 0;
  float scale = 1.0f;
  const float* sinks = nullptr;  // [heads]; null: no sink
  const int32_t* token_seq = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* block_tables = nullptr;  // [seqs, max_blocks_per_seq]: the window's group
  int64_t max_blocks_per_seq = 0, block_size = 0;
  void* window_kv = nullptr;  // [blocks, block_size, head_dim] f32 | bf16
  DType window_dtype = DType::kBF16;
  int64_t window = 0;                // keys at positions (pos - window, pos]
  const void* compressed = nullptr;  // [blocks, rows_per_block, head_dim]; null: window only
  DType compressed_dtype = DType::kBF16;
  int64_t rate = 0, rows_per_block = 0;
  const int32_t* compressed_tables = nullptr;  // null: block_tables / block_size
  int64_t compressed_max_blocks_per_seq = 0, compressed_block_size = 0;
  const int32_t* selected = nullptr;  // [tokens, num_selected]; null: every entry w < (pos+1)/rate
  int64_t num_selected = 0;
  // Inverse rotary of the output (undo the keys' rotation): interleaved pairs of the last
  // rotary_dim dims rotated by -(positions[t] * inv_freq[i]); rotary_dim 0: none.
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  int64_t rotary_dim = 0;
  // Split-K scratch for long key lists: V4SparseAttentionWorkspaceFloats(...) floats, or null
  // (no splits).
  float* workspace = nullptr;
  int64_t max_splits = 0;
  // Kernel choice (tests and benchmarks): 0 the fastest that applies; 1 never the wgmma kernel
  // (head_dim 512 then runs on the mma.sync tensor-core kernel).
  int kernel = 0;
};

// Floats of workspace for up to max_splits splits: [tokens, heads, splits] rows of head_dim
// partial outputs plus 2 stats each, where tokens × splits never exceeds 4 × the SM count (the
// launcher splits only that far), so the size is bounded whatever num_tokens and max_splits.
int64_t V4SparseAttentionWorkspaceFloats(int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                                         int64_t max_splits);
int V4SparseAttention(const V4SparseAttentionParams& p, void* stream);

}  // namespace dinfer::kernels::cuda
