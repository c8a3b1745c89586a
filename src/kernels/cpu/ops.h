// CPU kernels for the element-wise and attention ops of transformer models. Each op takes a plain
// params struct (no engine types). Activations are f32; the KV cache is paged: block b of a layer
// holds block_size tokens × num_kv_heads × head_dim floats for K and again for V.
// Stateless; thread-safe when callers pass disjoint outputs. `pool` may be null (single thread).
#pragma once

#include <cstdint>

#include "base/thread_pool.h"
#include "tensor/dtype.h"

namespace dinfer::kernels::cpu {

// out[r] = x[r] / rms(x[r]) * (weight + weight_offset). Gemma-style norms use weight_offset 1.
// A null weight means none (out = x / rms(x)).
struct RmsNormParams {
  const float* x = nullptr;
  const float* weight = nullptr;
  float* out = nullptr;  // may alias x
  int64_t rows = 0, dim = 0;
  int64_t x_stride = 0, out_stride = 0;  // elements; 0 means dim
  float eps = 1e-6f;
  float weight_offset = 0.0f;
};
void RmsNorm(const RmsNormParams& p);

// Rotary embedding in place on x[rows, num_heads, head_dim], rotary_dim dims of each head from
// rotary_offset on (the first ones by default; DeepSeek-V4 rotates the last ones). inv_freq has
// rotary_dim/2 entries. interleaved: pairs (2i, 2i+1) (GPT-J / GGUF llama / DeepSeek-V4);
// otherwise pairs (i, i + rotary_dim/2) (GPT-NeoX / HF "rotate_half"). inverse rotates by -angle.
struct RopeParams {
  float* x = nullptr;
  int64_t rows = 0, num_heads = 0, head_dim = 0, rotary_dim = 0;
  int64_t rotary_offset = 0;
  int64_t row_stride = 0;  // elements between rows; 0 means num_heads*head_dim
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float attention_scaling = 1.0f;  // multiplies cos/sin (YaRN-style rope variants)
  bool interleaved = false;
  bool inverse = false;
};
void Rope(const RopeParams& p);

// out[r, i] = silu(gate[r, i]) * up[r, i]. gate and up are the two halves of a row when fused.
// With limit > 0 (DeepSeek-V4's SwiGLU clamp), gate is first capped at limit and up clamped to
// [-limit, limit].
struct SiluMulParams {
  const float* gate = nullptr;
  const float* up = nullptr;
  float* out = nullptr;
  int64_t rows = 0, dim = 0;
  int64_t gate_stride = 0, up_stride = 0, out_stride = 0;  // 0 means dim
  float limit = 0.0f;
};
void SiluMul(const SiluMulParams& p);

// y[i] += x[i] over n elements.
void AddInPlace(float* y, const float* x, int64_t n);

// Copies embedding rows (any weight dtype, dequantised) for each token id: out[t] = table[ids[t]] *
// scale.
struct EmbeddingParams {
  const void* table = nullptr;
  DType dtype = DType::kF32;
  int64_t row_bytes = 0, dim = 0, vocab = 0;
  const int32_t* ids = nullptr;
  int64_t num_tokens = 0;
  float* out = nullptr;
  float scale = 1.0f;
};
void Embedding(const EmbeddingParams& p);

// Writes new K/V rows into the paged cache: token t goes to slot slot_mapping[t]
// (block = slot / block_size, offset = slot % block_size).
struct KvWriteParams {
  const float* k = nullptr;  // [tokens, kv_dim] with row strides below
  const float* v = nullptr;
  int64_t k_stride = 0, v_stride = 0;
  float* k_cache = nullptr;  // [num_blocks, block_size, kv_dim]
  float* v_cache = nullptr;
  const int64_t* slot_mapping = nullptr;
  int64_t num_tokens = 0, kv_dim = 0;
};
void KvWrite(const KvWriteParams& p);

// Causal attention for a batch of sequences over a paged KV cache (which already holds the new
// tokens' K/V). Query token t of sequence s sits at position q_pos[t] and sees keys at positions
// j <= q_pos[t], and with a sliding window W > 0 only j > q_pos[t] - W.
struct AttentionParams {
  const float* q = nullptr;  // [tokens, num_heads, head_dim]
  int64_t q_stride = 0;      // elements between tokens; 0 means num_heads*head_dim
  float* out = nullptr;      // [tokens, num_heads, head_dim]
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
  int64_t block_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  // Per token: which sequence it belongs to and its position.
  const int32_t* token_seq = nullptr;
  const int32_t* q_pos = nullptr;
  int64_t num_tokens = 0;
  // Per sequence: its block table (block ids), `max_blocks_per_seq` entries each.
  const int32_t* block_tables = nullptr;
  int64_t max_blocks_per_seq = 0;
  float scale = 1.0f;
  int64_t sliding_window = 0;  // 0: full attention
  float softcap = 0.0f;        // 0: none; else logits = softcap * tanh(logits / softcap)
  ThreadPool* pool = nullptr;
};
void Attention(const AttentionParams& p);

// Plain reference versions for conformance tests (straightforward loops, double accumulation).
void AttentionReference(const AttentionParams& p);
void RmsNormReference(const RmsNormParams& p);
void RopeReference(const RopeParams& p);

}  // namespace dinfer::kernels::cpu
