// CUDA kernel for what happens between the fused q/k/v projection and attention, in one pass per
// token: bias add, per-head RMSNorm of q and k (Qwen3), rotary embedding of q and k (both pair
// layouts of kernels/cpu RopeParams), and the write of k and v into the paged KV cache. q is
// updated in place; k and v go to the cache only. Launcher conventions as in elementwise.h.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dinfer::kernels::cuda {

struct QkvParams {
  // [tokens, qkv_stride] of `dtype`: q (num_heads * head_dim) | k | v (num_kv_heads * head_dim).
  void* qkv = nullptr;
  int64_t qkv_stride = 0;
  DType dtype = DType::kBF16;
  int64_t num_tokens = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  const float* bias = nullptr;    // [q_dim + 2 * kv_dim], optional
  const float* q_norm = nullptr;  // [head_dim], optional (with k_norm)
  const float* k_norm = nullptr;
  float norm_eps = 1e-6f;
  // Rotary embedding of the first rotary_dim dims of each q and k head.
  const int32_t* positions = nullptr;  // [tokens]
  const float* inv_freq = nullptr;     // [rotary_dim / 2]
  int64_t rotary_dim = 0;
  bool interleaved = false;
  float attention_scaling = 1.0f;
  // Paged cache [num_blocks, block_size, num_kv_heads * head_dim] of `dtype`, or with kv_fp8 of
  // e4m3fn bytes holding k / k_scale and v / v_scale (saturated to ±448): per-tensor scales,
  // 1.0 by default (as vLLM's when a checkpoint has none).
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  bool kv_fp8 = false;
  float k_scale = 1.0f, v_scale = 1.0f;
  const int64_t* slot_mapping = nullptr;  // [tokens]
};
int QkvRopeKvWrite(const QkvParams& p, void* stream);

}  // namespace dinfer::kernels::cuda
