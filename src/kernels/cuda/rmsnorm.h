// CUDA RMSNorm (+ optional fused residual add): the same semantics as kernels/cpu RmsNorm.
// Launchers take plain params and a stream; they do not synchronise.
#pragma once

#include <cstdint>

namespace dinfer::kernels::cuda {

struct RmsNormParams {
  const float* x = nullptr;       // [rows, dim] device
  const float* weight = nullptr;  // [dim] device
  float* out = nullptr;           // [rows, dim] device; may alias x
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
  float weight_offset = 0.0f;
};

// Returns a cudaError_t value as int (0 on success) so callers need no CUDA headers.
int RmsNorm(const RmsNormParams& p, void* stream);

}  // namespace dinfer::kernels::cuda
