// DType: element types of tensors, including block-quantized GGUF formats.
// For a quantized type, one "block" packs BlockSize() consecutive elements of a row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dinfer {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI32,
  kI64,
  kQ8_0,  // 32 elements: f16 scale + 32 x int8
  kQ4_0,  // 32 elements: f16 scale + 16 bytes of 4-bit values (offset 8)
  kQ4_1,  // 32 elements: f16 scale, f16 min + 16 bytes of 4-bit values
  kQ4_K,  // 256 elements: super-block with 8 sub-blocks, 6-bit scales and mins
  kQ6_K,  // 256 elements: 6-bit values, 16 sub-blocks with int8 scales
  // Single bytes as safetensors checkpoints store them (DeepSeek-V4's FP8 and FP4 weights).
  kI8,      // int8 (FP4 weights: two e2m1 codes per byte)
  kF8E4M3,  // float8 e4m3fn
  kF8E8M0,  // float8 e8m0fnu: 2^(byte - 127), the UE8M0 block scales
  // Block formats that the CPU kernels read (kernels/cpu/quant.h), repacked at load time from a
  // checkpoint's weight and scale tensors without changing a value.
  kF8E4M3B32,  // 32 elements: f32 scale + 32 e4m3fn bytes
  kMxfp4,      // 32 elements: e8m0 scale + 16 bytes of e2m1 codes (OCP MX FP4)
};

std::string_view DTypeName(DType t);
std::optional<DType> DTypeFromName(std::string_view name);  // "f32", "bf16", "q4_k", ...

// Elements per block (1 for plain types) and bytes per block.
int64_t BlockSize(DType t);
int64_t BlockBytes(DType t);
bool IsQuantized(DType t);

// Bytes of a row of n elements; n must be a multiple of BlockSize(t).
inline int64_t RowBytes(DType t, int64_t n) { return n / BlockSize(t) * BlockBytes(t); }

}  // namespace dinfer
