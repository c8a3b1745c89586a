// CUDA kernels for the element-wise ops of the decoder: embedding, RMSNorm fused with the residual
// add and the gather of logits rows, SiLU-and-multiply, and a random fill for benchmarks.
// Semantics follow kernels/cpu/ops.h. Activations are f32 or bf16 (`dtype`); the residual stream
// and the norm weights are f32. Launchers take plain params and a stream (cudaStream_t as void*),
// do not synchronise, and return a cudaError_t value as int (0 on success). Row widths must be
// multiples of 8 elements and pointers 16-byte aligned (16-byte accesses).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dinfer::kernels::cuda {

// out[t] = f32(table[ids[t]]) * scale; table [vocab, dim] of `dtype`, out [tokens, dim] f32
// (out_stride elements between rows; 0: dim). copies > 1 writes the row that many times side by
// side (out + t * out_stride + c * dim): the residual streams of hyper-connections.
struct EmbeddingParams {
  const void* table = nullptr;
  DType dtype = DType::kBF16;
  const int32_t* ids = nullptr;
  float* out = nullptr;
  int64_t num_tokens = 0, dim = 0, out_stride = 0, copies = 1;
  float scale = 1.0f;
};
int Embedding(const EmbeddingParams& p, void* stream);

// Residual add and RMSNorm in one pass over the rows of the residual stream. Output row r reads
// residual row i = rows_index ? rows_index[r] : r:
//   x = residual[i] (+ add[i] + add_bias when add is set; then written back to residual[i] if
//   write_back); out[r] = x / rms(x) * (weight + weight_offset), as `dtype`.
struct RmsNormParams {
  float* residual = nullptr;            // [*, dim] f32
  const void* add = nullptr;            // [*, dim] of `dtype`, optional
  const float* add_bias = nullptr;      // [dim], optional (with add): the bias of the add's linear
  const int32_t* rows_index = nullptr;  // [rows], optional
  bool write_back = true;
  const float* weight = nullptr;  // [dim]
  void* out = nullptr;            // [rows, dim] of `dtype`
  DType dtype = DType::kBF16;
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
  float weight_offset = 0.0f;
};
int RmsNorm(const RmsNormParams& p, void* stream);

// out[r, i] = silu(gate[r, i]) * up[r, i]; gate and up are usually the two halves of one row of
// the fused gate/up projection (row stride 2 * dim).
struct SiluMulParams {
  const void* gate = nullptr;
  const void* up = nullptr;
  void* out = nullptr;
  DType dtype = DType::kBF16;
  int64_t rows = 0, dim = 0;
  int64_t in_stride = 0, out_stride = 0;  // elements; 0 means dim
};
int SiluMul(const SiluMulParams& p, void* stream);

// Fills n elements of `dtype` with values uniform in [-scale, scale), a hash of (seed, index):
// random weights for benchmarks, without a host copy.
int FillRandom(void* data, DType dtype, int64_t n, uint64_t seed, float scale, void* stream);

}  // namespace dinfer::kernels::cuda
