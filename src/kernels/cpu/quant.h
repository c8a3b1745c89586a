// GGUF block formats (the on-disk layouts of ggml) and the 8-bit activation formats that the
// quantized matmul kernels use. Conversion functions are pure and thread-safe.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace dinfer::kernels::cpu {

// ---- Weight blocks, byte for byte as stored in GGUF files. Scales are IEEE f16 bits. ----
inline constexpr int kQK = 32;    // elements per Q8_0 / Q4_0 / Q4_1 block
inline constexpr int kQKK = 256;  // elements per K-quant super-block

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];  // value = qs * d
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];  // element i < 16: low nibble of qs[i]; i >= 16: high nibble of qs[i-16]
};                      // value = (nibble - 8) * d
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];  // nibbles as in Q4_0; value = nibble * d + m
};
// 8 sub-blocks of 32. scales holds 6-bit scale sc[j] and min mn[j] (j < 8): for j < 4,
// sc = scales[j] & 63, mn = scales[j+4] & 63; for j >= 4, sc = (scales[j+4] & 15) |
// (scales[j-4] >> 6) << 4 and mn = (scales[j+4] >> 4) | (scales[j] >> 6) << 4.
// qs[32c + l] holds element 64c + l (low nibble) and 64c + 32 + l (high nibble).
// value = d * sc[j] * nibble - dmin * mn[j].
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
// Two halves of 128 elements; in half h, element 32g + l (g < 4, l < 32) has low 4 bits
// ql[64h + 32(g&1) + l] >> 4(g>>1) and high 2 bits qh[32h + l] >> 2g.
// value = d * scales[element / 16] * (q6 - 32).
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210);

// Unpacks the 6-bit scales and mins of a Q4_K block.
void UnpackQ4KScales(const uint8_t packed[12], uint8_t sc[8], uint8_t mn[8]);

// dst[0, n) = the values of src, for every dtype except the integer ones; n must be a multiple
// of BlockSize(type).
void DequantizeRow(DType type, const void* src, float* dst, int64_t n);

// Quantizes n floats into RowBytes(type, n) bytes, rounding as ggml's reference quantizers (and
// the gguf Python package) do. Supports f32, f16, bf16, q8_0, q4_0, q4_1, q4_k and q6_k; q4_k and
// q6_k use a simple max-abs scale search, not ggml's iterative one.
void QuantizeRowReference(DType type, const float* src, void* dst, int64_t n);

// ---- Activation formats of the quantized matmul ----
// A row of k activations is quantized once per call and then dotted with every weight row in
// integer arithmetic. Values are q = round_to_nearest_even(x * 127 / amax) in [-127, 127] with
// scale amax / 127 per block; every ISA produces the same bytes, so integer sums agree exactly.
enum class ActFormat : uint8_t {
  // Blocks of 32 for Q8_0 weights. Row: qs[nbp * 32] (natural order), d[nbp] f32,
  // s[nbp] f32 (= d * sum of the block's q), nbp = k/32 rounded up to 16 (padding is zero).
  kQ8x32,
  // As kQ8x32 for Q4_0 / Q4_1 weights, but qs is stored in groups of 4 blocks (128 bytes):
  // elements 0..15 of the 4 blocks, then elements 16..31 of the 4 blocks, which is the order in
  // which a SIMD register unpacks the low and high nibbles of 4 weight blocks.
  kQ8x32Grouped,
  // Super-blocks of 256 for Q4_K / Q6_K weights. Row: qs[k] (natural), d[k/256] f32,
  // bsums[k/16] i16 (sum of q over each 16 elements), each section starting 64-byte aligned.
  kQ8x256,
};

ActFormat ActFormatFor(DType weight_type);  // weight_type must be quantized
int64_t ActRowBytes(ActFormat format, int64_t k);

// Pointers into one quantized activation row.
struct ActRow {
  const int8_t* qs = nullptr;
  const float* d = nullptr;
  const float* s = nullptr;        // kQ8x32*: d * sum(q) per block
  const int16_t* bsums = nullptr;  // kQ8x256: per 16 elements
};
ActRow ViewActRow(ActFormat format, const void* row, int64_t k);
// Byte offset of element e (of block e / 32) inside qs.
inline int64_t ActQsOffset(ActFormat format, int64_t e) {
  if (format != ActFormat::kQ8x32Grouped) return e;
  const int64_t b = e / kQK, i = e % kQK;
  return (b / 4) * 128 + (i / 16) * 64 + (b % 4) * 16 + i % 16;
}

// Activation blocks whose largest magnitude is below this quantize to zero (127 / amax would
// overflow).
inline constexpr float kActTinyAmax = 1e-30f;

// The portable quantizer that defines the activation formats (the ISA versions match it).
void QuantizeActRowReference(ActFormat format, const float* x, void* dst, int64_t k);

}  // namespace dinfer::kernels::cpu
