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

// ---- DeepSeek-V4's FP8 and FP4 weights, as the kernels read them ----
// Checkpoints store e4m3fn weights with UE8M0 (or f32) scales per block of rows x columns, and FP4
// experts as two e2m1 codes per byte with a UE8M0 scale per 32 inputs, each in a tensor of its own.
// Loading repacks them into these self-contained row blocks without changing a value.
struct BlockF8E4M3B32 {  // kF8E4M3B32: value = E4M3ToF32(qs[l]) * d
  float d;
  uint8_t qs[kQK];
};
struct BlockMxfp4 {  // kMxfp4: element 2j is the low nibble of qs[j], 2j + 1 the high nibble;
  uint8_t e;         // value = E2M1ToF32(code) * E8M0ToF32(e)
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockF8E4M3B32) == 36 && sizeof(BlockMxfp4) == 17);

float E4M3ToF32(uint8_t bits);  // float8 e4m3fn (NaN for 0x7f / 0xff)
float E8M0ToF32(uint8_t bits);  // 2^(bits - 127); NaN for 0xff
float E2M1ToF32(uint8_t code);  // the low 4 bits: sign, 2 exponent bits, 1 mantissa bit

// FP8 weight [rows, cols] of e4m3fn bytes, scales [ceil(rows / block_rows), ceil(cols /
// block_cols)] as f32 values -> rows of kF8E4M3B32 (cols / 32 blocks each). block_cols must be a
// multiple of 32.
void RepackF8E4M3(const uint8_t* w, const float* scales, int64_t rows, int64_t cols,
                  int64_t block_rows, int64_t block_cols, BlockF8E4M3B32* out);
// FP4 weight [rows, cols / 2] bytes, scales [rows, cols / 32] as f32 values -> rows of kMxfp4.
// Returns false (having written part of out) when a scale is not a power of two UE8M0 can hold.
bool RepackMxfp4(const uint8_t* w, const float* scales, int64_t rows, int64_t cols,
                 BlockMxfp4* out);

namespace internal {
// DequantizeRow and QuantizeRowReference for i8, f8_e4m3, f8_e8m0, f8_e4m3_b32 and mxfp4.
void DequantizeFp8Row(DType type, const void* src, float* dst, int64_t n);
void QuantizeFp8RowReference(DType type, const float* src, void* dst, int64_t n);
// Their AVX-512 versions (quant_fp8_avx512.cc), given the element tables: e2m1 [16] and e8m0
// [256] values, e4m3 [256] values of which the first 128 (the magnitudes) are read.
void DequantizeMxfp4Avx512(const BlockMxfp4* b, const float* e2m1, const float* e8m0, float* dst,
                           int64_t nb);
void DequantizeF8E4M3Avx512(const BlockF8E4M3B32* b, const float* e4m3, float* dst, int64_t nb);
}  // namespace internal

// Unpacks the 6-bit scales and mins of a Q4_K block.
void UnpackQ4KScales(const uint8_t packed[12], uint8_t sc[8], uint8_t mn[8]);

// dst[0, n) = the values of src, for every dtype except i32 and i64; n must be a multiple of
// BlockSize(type).
void DequantizeRow(DType type, const void* src, float* dst, int64_t n);

// Quantizes n floats into RowBytes(type, n) bytes, rounding as ggml's reference quantizers (and
// the gguf Python package) do. Supports f32, f16, bf16, q8_0, q4_0, q4_1, q4_k and q6_k; q4_k and
// q6_k use a simple max-abs scale search, not ggml's iterative one. f8_e4m3_b32 and mxfp4 blocks
// get the smallest power-of-two scale that fits the block (as DeepSeek's UE8M0 scales) and values
// rounded to nearest, ties to even.
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

// Whether the 8-bit activation kernels handle a quantized weight type (the GGUF block formats);
// matmuls with other quantized weights dequantize weight rows and multiply in f32.
bool HasActFormat(DType weight_type);
ActFormat ActFormatFor(DType weight_type);  // HasActFormat(weight_type) must hold
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
