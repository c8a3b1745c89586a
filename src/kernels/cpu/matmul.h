// Matmul: y[m, n] = x[m, k] · W[n, k]^T on the CPU for f32 activations and f32 / f16 / bf16 /
// GGUF-quantized weights, with run-time ISA dispatch (scalar, AVX2, AVX-512).
// Thread-safety: calls are independent (each thread has its own scratch buffer); a call may
// use `pool`, and since one ThreadPool runs one loop at a time, calls sharing a pool serialise.
// Results do not depend on m, on the thread count or on the tiling (batch invariant) for a
// given ISA; different ISAs may differ in the last bits (float summation order).
#pragma once

#include <cstdint>
#include <span>

#include "base/thread_pool.h"
#include "tensor/dtype.h"

namespace dinfer::kernels::cpu {

// Strides left at 0 mean packed rows (k, RowBytes(w_dtype, k) and n).
struct MatmulParams {
  const float* x = nullptr;     // activations, f32
  int64_t x_stride = 0;         // elements between rows of x
  const void* w = nullptr;      // n weight rows of k elements each (an HF Linear weight, or a
  DType w_dtype = DType::kF32;  // GGUF tensor with ne0 = k)
  int64_t w_row_bytes = 0;      // bytes between weight rows: RowBytes(w_dtype, k) normally
  float* y = nullptr;
  int64_t y_stride = 0;  // elements between rows of y
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;  // y += x·Wᵀ instead of y = x·Wᵀ
  // Quantized weights only: keep the activations in f32 and dequantize weight rows on the fly
  // (the numerics of reference implementations that dequantize GGUF files), instead of the
  // faster 8-bit activation path.
  bool f32_activations = false;
  ThreadPool* pool = nullptr;  // null: run on the calling thread
};

// Weight types Matmul handles: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k, f8_e4m3_b32, mxfp4.
bool MatmulSupports(DType w_dtype);

// Fast path. Callers validate shapes and dtypes: for an unsupported w_dtype, or a k that is not a
// multiple of BlockSize(w_dtype), Matmul writes nothing. f32/f16/bf16 weights are converted on
// the fly and accumulated in f32. For GGUF-quantized weights the rows of x are first quantized to
// 8 bits (ActFormatFor(w_dtype), see quant.h) and dotted in integer arithmetic; x must be finite.
// FP8 and FP4 weights (f8_e4m3_b32, mxfp4) are dequantized a few rows at a time and multiplied
// with f32 activations, as quantized weights are when f32_activations is set.
void Matmul(const MatmulParams& p);

// Several products of the same activations (q/k/v, or gate/up): x is quantized once and every
// output is computed in one parallel loop. Products must share x, x_stride, m, k, pool and
// f32_activations, and quantized weights the same activation format (ActFormatFor); otherwise
// they run one by one. Results equal those of separate Matmul calls.
void MatmulShared(std::span<const MatmulParams> ps);

// The oracle: dequantizes each weight row to f32 and accumulates x·w in double.
void MatmulReference(const MatmulParams& p);

// What Matmul computes for quantized weights, exactly: x quantized as Matmul does, integer dot
// products per block, scales applied and summed in double. Equals MatmulReference for weights
// without an 8-bit activation path (f32 / f16 / bf16, f8_e4m3_b32, mxfp4).
void MatmulQuantizedActivationsReference(const MatmulParams& p);

}  // namespace dinfer::kernels::cpu
