// Internal interface between matmul.cc (dispatch, threading, scratch) and the per-ISA kernel
// files (matmul_scalar.cc, matmul_avx2.cc, matmul_avx512.cc). Kernels are pure functions.
// The ISA files must not call inline functions of shared headers (they would be compiled with
// wider instruction sets and could be picked by the linker for portable callers).
#pragma once

#include <cstdint>

#include "kernels/cpu/quant.h"

namespace dinfer::kernels::cpu::internal {

// A block of outputs: activation rows [0, rows) × weight rows [0, cols).
struct Tile {
  const uint8_t* x = nullptr;  // first activation row: f32, or a quantized row (ActFormat)
  int64_t x_stride = 0;        // bytes between activation rows
  const uint8_t* w = nullptr;  // first weight row
  int64_t w_stride = 0;        // bytes between weight rows
  float* y = nullptr;          // output (r, j) at y[r * y_stride + j]
  int64_t y_stride = 0;        // elements
  int64_t rows = 0, cols = 0, k = 0;
  bool accumulate = false;
};

using TileFn = void (*)(const Tile& t);
// Quantizes one row of k activations into ActRowBytes(format, k) bytes, exactly as
// QuantizeActRowReference does.
using QuantizeActsFn = void (*)(ActFormat format, const float* x, void* dst, int64_t k);

inline constexpr int kNumDTypes = 15;

struct KernelSet {
  TileFn tile[kNumDTypes] = {};  // indexed by DType; null where unsupported
  QuantizeActsFn quantize_acts = nullptr;
};

const KernelSet& ScalarKernels();
const KernelSet& Avx2Kernels();
const KernelSet& Avx512Kernels(bool vnni);

}  // namespace dinfer::kernels::cpu::internal
