// CPU kernels of DeepSeek-V4's layers: sparse attention over a sliding window plus compressed
// entries (with a per-head attention sink), the KV compressors' gated pooling, the lightning
// indexer's top-k, manifold-constrained hyper-connections (Sinkhorn), and MoE routing. Each takes
// a plain params struct (no engine types) and has a plain reference version for conformance tests.
//
// Paged layout (the model's KV planes): a sequence's tokens live in blocks of block_size tokens
// (its block table); window keys are one row per token; compressed entries of a compressor of rate
// r are rows_per_block = block_size / r rows per block (in their own tables, whose blocks cover
// max(block_size, r) tokens), entry w in the block of its last token (CompressedSlot), so a
// block's content depends only on the tokens up to its end and prefix caching can share it.
// Compressor state is one row per block of the window keys' tables (CompressorStateWidth).
// Window keys, compressed entries and indexer keys are f32, bf16 or FP8 rows (KvDType; bf16 and
// FP8 rows are widened to f32 when read); compressor state is f32.
// Stateless; thread-safe when callers pass disjoint outputs. `pool` may be null (single thread).
#pragma once

#include <cstdint>
#include <cstring>

#include "base/half.h"
#include "base/thread_pool.h"
#include "kernels/cpu/quant.h"
#include "tensor/dtype.h"

namespace dinfer::kernels::cpu {

// Element type of a paged KV row. kFp8: DType::kF8E4M3B32 rows — e4m3 values with a
// power-of-two (UE8M0) scale per 32 (width a multiple of 32), as DeepSeek scales its FP8 cache.
enum class KvDType : uint8_t { kF32, kBF16, kFp8 };

// Row `row` of a paged plane of `width`-element rows, as f32: the row itself when f32, else
// widened into `scratch` (width floats).
inline const float* KvRow(const void* plane, KvDType dtype, int64_t row, int64_t width,
                          float* scratch) {
  if (dtype == KvDType::kF32) return static_cast<const float*>(plane) + row * width;
  if (dtype == KvDType::kFp8) {
    DequantizeRow(DType::kF8E4M3B32,
                  static_cast<const char*>(plane) + row * RowBytes(DType::kF8E4M3B32, width),
                  scratch, width);
    return scratch;
  }
  const uint16_t* h = static_cast<const uint16_t*>(plane) + row * width;
  for (int64_t i = 0; i < width; ++i) scratch[i] = Bf16ToF32(h[i]);
  return scratch;
}

// Stores `width` floats as row `row` of a paged plane (bf16: rounded to nearest even; FP8: each
// block of 32 scaled by the smallest power of two that fits it, values rounded to nearest even).
inline void StoreKvRow(void* plane, KvDType dtype, int64_t row, int64_t width, const float* src) {
  if (dtype == KvDType::kF32) {
    std::memcpy(static_cast<float*>(plane) + row * width, src,
                static_cast<size_t>(width) * sizeof(float));
    return;
  }
  if (dtype == KvDType::kFp8) {
    QuantizeRowReference(DType::kF8E4M3B32, src,
                         static_cast<char*>(plane) + row * RowBytes(DType::kF8E4M3B32, width),
                         width);
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(plane) + row * width;
  for (int64_t i = 0; i < width; ++i) h[i] = F32ToBf16(src[i]);
}

// Row of compressed entry w (its last token is (w + 1) * rate - 1) in a paged plane.
inline int64_t CompressedSlot(const int32_t* table, int64_t block_size, int64_t rate,
                              int64_t rows_per_block, int64_t w) {
  const int64_t last = (w + 1) * rate - 1;
  return static_cast<int64_t>(table[last / block_size]) * rows_per_block +
         (last % block_size) / rate;
}

// Attention of each query token over (a) the window keys at positions (pos - window, pos] and
// (b) compressed entries: the `num_selected` ids in selected[t] (-1 entries skipped), or, with
// selected null, every entry w < (pos + 1) / rate. Keys are also the values (multi-query, one
// head shared by all query heads). The softmax includes a per-head sink logit whose weight is
// dropped: out = Σ_j e^{s_j} k_j / (Σ_j e^{s_j} + e^{sink}), s_j = scale * q·k_j.
struct SparseAttentionParams {
  const float* q = nullptr;  // [tokens, num_heads, head_dim], q_stride elements between tokens
  int64_t q_stride = 0;
  float* out = nullptr;  // [tokens, num_heads, head_dim], out_stride elements between tokens
  int64_t out_stride = 0;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;
  float scale = 1.0f;
  const float* sinks = nullptr;  // [num_heads]; null: no sink
  const int32_t* token_seq = nullptr;
  const int32_t* q_pos = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0, block_size = 0;
  const void* window_kv = nullptr;  // [num_blocks, block_size, head_dim]
  KvDType window_dtype = KvDType::kF32;
  int64_t window = 0;
  const void* compressed = nullptr;  // [num_blocks, rows_per_block, head_dim]; null: none
  KvDType compressed_dtype = KvDType::kF32;
  int64_t rate = 0, rows_per_block = 0;
  // The compressed entries' own block tables (their KV group); null: block_tables above.
  const int32_t* compressed_block_tables = nullptr;
  int64_t compressed_max_blocks_per_seq = 0, compressed_block_size = 0;
  const int32_t* selected = nullptr;  // [tokens, num_selected]
  int64_t num_selected = 0;
  ThreadPool* pool = nullptr;
};
void SparseAttention(const SparseAttentionParams& p);
void SparseAttentionReference(const SparseAttentionParams& p);

// Gated pooling of a KV compressor of rate r: each window of r consecutive tokens of a sequence
// becomes one entry, entry w = Σ_j softmax_j(gate_j + bias[j % r]) ⊙ kv_j over the window's tokens,
// per dimension. With overlap (compressed sparse attention), kv and gate rows are 2 * dim wide:
// entry w pools the first halves of window w - 1's tokens together with the second halves of
// window w's tokens (2r slots; window 0 has no predecessor). The softmax is accumulated online
// (running max, sum and weighted sum per dimension); the state after the last computed token of
// each block is kept in that block, so a sequence continues from any token (decode, chunked
// prefill) or block boundary (prefix caching). A sequence's tokens must be consecutive positions,
// in order, within the batch.
struct CompressorParams {
  const float* kv = nullptr;    // [tokens, width], width = dim * (overlap ? 2 : 1)
  const float* gate = nullptr;  // [tokens, width]
  int64_t kv_stride = 0, gate_stride = 0;
  const float* bias = nullptr;  // [rate, width]
  int64_t num_tokens = 0, dim = 0, rate = 0;
  bool overlap = false;
  const int32_t* token_seq = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks_per_seq = 0, block_size = 0;
  float* state = nullptr;  // [num_blocks, CompressorStateWidth(dim, overlap)]
  // Per token: the row of `entries` that receives the entry its window completes (for the tokens
  // at positions p with (p + 1) % rate == 0), else -1.
  const int32_t* entry_row = nullptr;
  float* entries = nullptr;  // [num_entries, dim]: pooled entries, before their norm and rotary
  ThreadPool* pool = nullptr;
};
int64_t CompressorStateWidth(int64_t dim, bool overlap);
void Compressor(const CompressorParams& p);
// Recomputes every entry from all tokens of the batch with a two-pass softmax (the batch must
// hold each sequence from position 0; the state is neither read nor written).
void CompressorReference(const CompressorParams& p);

// The lightning indexer: for each query token, score(w) = Σ_h weights[t, h] * relu(q[t, h]·k_w) *
// scale over the entries w < (pos + 1) / rate of its sequence, and select the `topk` best (all of
// them when fewer; the rest of the row is -1). Selected ids are in no particular order.
struct IndexerParams {
  const float* q = nullptr;  // [tokens, num_heads, head_dim]
  int64_t q_stride = 0;
  const float* weights = nullptr;  // [tokens, num_heads]
  int64_t weights_stride = 0;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;
  float scale = 1.0f;
  const void* keys = nullptr;  // [num_blocks, rows_per_block, head_dim]
  KvDType keys_dtype = KvDType::kF32;
  int64_t rate = 0, rows_per_block = 0;
  const int32_t* token_seq = nullptr;
  const int32_t* q_pos = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks_per_seq = 0, block_size = 0;
  int64_t topk = 0;
  int32_t* selected = nullptr;  // [tokens, topk]
  ThreadPool* pool = nullptr;
};
void IndexerTopK(const IndexerParams& p);
// Scores in double and a full sort (ties: the lower entry id first).
void IndexerTopKReference(const IndexerParams& p);

// Manifold-constrained hyper-connections: the residual is hc parallel streams per token. Before a
// sublayer, `mixes` ((2 + hc) * hc per token: the RMS-normalized flattened streams times the
// learned fn) give pre = sigmoid(mix * scale[0] + base) + eps (weights that collapse the streams
// into the sublayer's input), post = 2 sigmoid(mix * scale[1] + base) and comb: a row softmax of
// mix * scale[2] + base, plus eps, projected towards doubly stochastic by Sinkhorn (columns, then
// iters - 1 times rows and columns, each divided by its sum + eps).
struct HcPreParams {
  const float* streams = nullptr;  // [tokens, hc, dim]
  const float* mixes = nullptr;    // [tokens, (2 + hc) * hc]
  const float* base = nullptr;     // [(2 + hc) * hc]
  const float* scale = nullptr;    // [3]
  int64_t num_tokens = 0, hc = 0, dim = 0, iters = 0;
  float eps = 0.0f;
  float* collapsed = nullptr;  // [tokens, dim] = Σ_i pre_i streams_i
  float* post = nullptr;       // [tokens, hc]
  float* comb = nullptr;       // [tokens, hc, hc]
};
void HcPre(const HcPreParams& p);
// After the sublayer: out_k = post_k * y + Σ_j comb[j][k] * streams_j (out may not alias streams).
struct HcPostParams {
  const float* streams = nullptr;  // [tokens, hc, dim]
  const float* y = nullptr;        // [tokens, dim]
  const float* post = nullptr;
  const float* comb = nullptr;
  int64_t num_tokens = 0, hc = 0, dim = 0;
  float* out = nullptr;  // [tokens, hc, dim]
};
void HcPost(const HcPostParams& p);
// The final collapse: out = Σ_i (sigmoid(mixes_i * scale + base_i) + eps) streams_i, mixes [tokens,
// hc].
struct HcHeadParams {
  const float* streams = nullptr;
  const float* mixes = nullptr;
  const float* base = nullptr;
  float scale = 1.0f;
  int64_t num_tokens = 0, hc = 0, dim = 0;
  float eps = 0.0f;
  float* out = nullptr;  // [tokens, dim]
};
void HcHead(const HcHeadParams& p);

// MoE routing from router logits [tokens, experts]: scores = score(logits) (sqrt(softplus),
// softmax or sigmoid); the experts are the top_k of scores + bias (bias may be null), or, for
// hash-routed layers, hash_experts[t] (tid2eid of the token); weights = the chosen scores,
// divided by their sum + 1e-20 when normalize, times scaling.
enum class RouterScoring { kSqrtSoftplus, kSoftmax, kSigmoid };
struct RouterParams {
  const float* logits = nullptr;
  int64_t num_tokens = 0, num_experts = 0, top_k = 0;
  RouterScoring scoring = RouterScoring::kSqrtSoftplus;
  const float* bias = nullptr;
  const int32_t* hash_experts = nullptr;  // [tokens, top_k]
  bool normalize = true;
  float scaling = 1.0f;
  int32_t* experts = nullptr;  // [tokens, top_k]
  float* weights = nullptr;    // [tokens, top_k]
};
void Route(const RouterParams& p);

}  // namespace dinfer::kernels::cpu
