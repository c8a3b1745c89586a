// CUDA kernels of DeepSeek-V4's KV compressors and of the lightning indexer's top-k. Semantics are
// those of kernels/cpu/deepseek_v4.h (Compressor, IndexerTopK) and of the compressed-attention
// layer's use of them; the compressor state rows have the CPU's layout (CompressorStateWidth:
// running max, sum and weighted sum of the window in progress, then, with overlap, of the next
// window), so states written by either side continue on the other.
//
// V4Compress: gated softmax pooling of each window of `rate` tokens of a sequence into one entry
// (with overlap, entry w pools the first halves of window w - 1's tokens and the second halves of
// window w's), then RMSNorm(entry) * norm_weight, then the rotary of the last rotary_dim dims
// (interleaved pairs) at the window's first position pos + 1 - rate, stored (f32 or bf16) at its
// CompressedSlot of the entries plane, except for tokens at positions below replay_end[seq]. The
// pooling state after the last token of each window-group block and after the last token of the
// sequence in the batch is written to that block's state row, so a later call (decode, chunked
// prefill, a prefix hit starting at a block boundary) continues from it. One CTA pools one window
// of a sequence (all its dims, 4 a thread), so windows and sequences are pooled in parallel (grid:
// num_seqs + ceil(num_tokens / rate) CTAs); the first windows of a sequence in the batch (up to
// the end of the block it starts in, when it starts inside one) are pooled by one CTA, which
// reads the state before writing that block's row again. Limits: dim % 4 == 0, dim <= 512; kv /
// gate / bias / norm_weight / state 16-byte aligned, strides multiples of 4; rotary_dim even and
// dim - rotary_dim even; the block size and the rate nest (one divides the other).
//
// V4IndexerTopK: scores every valid entry of each token into the workspace, then selects the
// topk best per token by a 4-pass radix select (8 bits a pass) in shared memory. bf16 keys of 128
// dims: tensor cores (mma.sync bf16 with f32 accumulators, q split exactly into three bf16 parts,
// so the result has f32 accuracy), 64 heads x 64 entries a CTA pass, key tiles double-buffered by
// cp.async; any head count up to 1024. Otherwise f32 CUDA-core tiles of the same shape, which need
// head_dim % 8 == 0 and round_up(num_heads, 64) * round_up(head_dim, 32) <= 8192. A CTA covers up
// to 16 tiles of one token.
//
// Launcher conventions as in elementwise.h: plain params, a cudaStream_t as void*, no
// synchronisation, grid shapes from the params' sizes only (device counts are read on the
// device), a cudaError_t as int (0 ok; cudaErrorInvalidValue for params out of these limits).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dinfer::kernels::cuda {

// Tokens of a sequence are consecutive in the batch and at consecutive positions; sequence s owns
// batch tokens [s ? seq_token_end[s-1] : 0, seq_token_end[s]) and token_seq[t] == s for them.
struct V4CompressParams {
  const float* kv = nullptr;  // [tokens, width], width = dim * (overlap ? 2 : 1)
  int64_t kv_stride = 0;
  const float* gate = nullptr;  // [tokens, width]
  int64_t gate_stride = 0;
  const float* bias = nullptr;  // [rate, width] (the checkpoint's ape)
  int64_t num_tokens = 0, num_seqs = 0, dim = 0, rate = 0;
  bool overlap = false;
  const int32_t *token_seq = nullptr, *positions = nullptr, *seq_token_end = nullptr;
  const int32_t* block_tables = nullptr;  // window group: [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0, block_size = 0;
  float* state = nullptr;  // [window blocks, CompressorStateWidth(dim, overlap)] f32
  // Each completed entry: RMSNorm(entry) * norm_weight (eps), rotary (interleaved pairs of the
  // last rotary_dim dims, angle (pos + 1 - rate) * inv_freq[i]), stored as entries_dtype (f32 or
  // bf16) at its CompressedSlot of `entries` ([blocks, rows_per_block, dim]) through entry_tables.
  const float* norm_weight = nullptr;
  float eps = 1e-6f;
  const float* inv_freq = nullptr;
  int64_t rotary_dim = 0;
  void* entries = nullptr;
  DType entries_dtype = DType::kBF16;
  const int32_t* entry_tables = nullptr;
  int64_t entry_max_blocks_per_seq = 0, entry_block_size = 0, rows_per_block = 0;
  const int32_t* replay_end = nullptr;  // [num_seqs], optional: no entry is stored below it
};
int V4Compress(const V4CompressParams& p, void* stream);

// The lightning indexer: score(w) = Σ_h relu(q[t,h]·k_w) * scale * weights[t,h] * weights_scale
// over the entries w < (positions[t] + 1) / rate of the token's sequence (and w < max_entries);
// the topk best ids into selected[t] (all when fewer; the rest -1; any order). Keys are the
// entries plane of the indexer's compressor: entry w of the token's sequence is row
// CompressedSlot(block_tables + token_seq[t] * max_blocks_per_seq, block_size, rate,
// rows_per_block, w), as in kernels/cpu IndexerParams.
struct V4IndexerParams {
  const float* q = nullptr;  // [tokens, heads * head_dim] (rotated already)
  int64_t q_stride = 0;
  const float* weights = nullptr;  // [tokens, heads]
  int64_t weights_stride = 0;
  float weights_scale = 1.0f, scale = 1.0f;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;
  const void* keys = nullptr;  // [blocks, rows_per_block, head_dim] of keys_dtype (f32 or bf16)
  DType keys_dtype = DType::kBF16;
  int64_t rate = 0, rows_per_block = 0;
  const int32_t *token_seq = nullptr, *positions = nullptr;
  const int32_t* block_tables = nullptr;           // the keys' group tables
  int64_t max_blocks_per_seq = 0, block_size = 0;  // block_size: tokens per block of that group
  int64_t topk = 0;
  int64_t max_entries = 0;      // bound on entries per token (sizes the workspace)
  float* workspace = nullptr;   // V4IndexerWorkspaceFloats(num_tokens, max_entries) floats
  int32_t* selected = nullptr;  // [tokens, topk]
};
int64_t V4IndexerWorkspaceFloats(int64_t num_tokens, int64_t max_entries);
int V4IndexerTopK(const V4IndexerParams& p, void* stream);

}  // namespace dinfer::kernels::cuda
