// FP8 (e4m3fn), UE8M0 and FP4 (e2m1) element formats, the kF8E4M3B32 / kMxfp4 row blocks, and the
// repacking of DeepSeek-V4 checkpoint tensors into them (declared in quant.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/quant.h"

namespace dinfer::kernels::cpu {
namespace {

constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

std::array<float, 256> MakeE4M3Table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const int exp = (b >> 3) & 15, mant = b & 7;
    float v;
    if (exp == 15 && mant == 7) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      v = std::ldexp(static_cast<float>(mant) / 8.0f, -6);
    } else {
      v = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
    }
    t[b] = (b & 0x80) ? -v : v;
  }
  return t;
}

const std::array<float, 256>& E4M3Table() {
  static const std::array<float, 256> table = MakeE4M3Table();
  return table;
}

const std::array<float, 256>& E8M0Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 255; ++b) t[b] = std::ldexp(1.0f, b - 127);
    t[255] = std::numeric_limits<float>::quiet_NaN();
    return t;
  }();
  return table;
}

// Nearest code among the first `n` non-negative codes of a format whose magnitudes increase with
// the code, ties to the even code; values beyond the largest saturate. A binary search for the
// two codes around the magnitude (rows of the FP8 KV cache are quantized as they are written).
// NaN gives code 0; infinity, equally far from every code, the largest even one.
template <typename Decode>
uint8_t NearestCode(float mag, int n, Decode decode) {
  if (std::isnan(mag)) return 0;
  if (std::isinf(mag)) return static_cast<uint8_t>((n - 1) & ~1);
  int lo = 0, hi = n;  // hi: the first code whose magnitude is >= mag (n: none)
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (decode(mid) >= mag) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (hi == n) return static_cast<uint8_t>(n - 1);
  if (hi == 0) return 0;
  const float below = mag - decode(hi - 1), above = decode(hi) - mag;
  if (above != below) return static_cast<uint8_t>(above < below ? hi : hi - 1);
  return static_cast<uint8_t>(hi % 2 == 0 ? hi : hi - 1);
}

// Hot row loops get one clone per instruction set; the loader picks the best at run time.
#define DINFER_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))

DINFER_MULTIVERSION void DecodeE4M3Block(const uint8_t* q, float scale, const float* table,
                                         float* out) {
  for (int l = 0; l < kQK; ++l) out[l] = table[q[l]] * scale;
}

DINFER_MULTIVERSION void DecodeE2M1Block(const uint8_t* q, float scale, float* out) {
  float lut[16];
  for (int c = 0; c < 16; ++c) lut[c] = kE2M1[c] * scale;
  for (int j = 0; j < kQK / 2; ++j) {
    out[2 * j] = lut[q[j] & 0xf];
    out[2 * j + 1] = lut[q[j] >> 4];
  }
}

// The smallest power of two s with amax / s <= top, as an e8m0 byte.
uint8_t E8M0For(float amax, float top) {
  if (!(amax > 0.0f)) return 127;
  const int e = static_cast<int>(std::ceil(std::log2(amax / top)));
  return static_cast<uint8_t>(std::clamp(e + 127, 0, 254));
}

}  // namespace

float E4M3ToF32(uint8_t bits) { return E4M3Table()[bits]; }

float E8M0ToF32(uint8_t bits) { return E8M0Table()[bits]; }

float E2M1ToF32(uint8_t code) { return kE2M1[code & 15]; }

void RepackF8E4M3(const uint8_t* w, const float* scales, int64_t rows, int64_t cols,
                  int64_t block_rows, int64_t block_cols, BlockF8E4M3B32* out) {
  const int64_t scale_cols = (cols + block_cols - 1) / block_cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = scales + (r / block_rows) * scale_cols;
    for (int64_t b = 0; b < cols / kQK; ++b) {
      BlockF8E4M3B32& blk = out[r * (cols / kQK) + b];
      blk.d = srow[b * kQK / block_cols];
      std::memcpy(blk.qs, w + r * cols + b * kQK, kQK);
    }
  }
}

bool RepackMxfp4(const uint8_t* w, const float* scales, int64_t rows, int64_t cols,
                 BlockMxfp4* out) {
  const int64_t nb = cols / kQK;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float s = scales[r * nb + b];
      int exp = 0;
      // A power of two 2^k has frexp mantissa 0.5 and exponent k + 1.
      if (!(s > 0.0f) || std::frexp(s, &exp) != 0.5f || exp - 1 + 127 < 0 || exp - 1 + 127 > 254) {
        return false;
      }
      BlockMxfp4& blk = out[r * nb + b];
      blk.e = static_cast<uint8_t>(exp - 1 + 127);
      std::memcpy(blk.qs, w + r * (cols / 2) + b * (kQK / 2), kQK / 2);
    }
  }
  return true;
}

namespace internal {

void DequantizeFp8Row(DType type, const void* src, float* dst, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (type) {
    case DType::kI8:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(bytes[i]));
      return;
    case DType::kF8E4M3:
      for (int64_t i = 0; i < n; ++i) dst[i] = E4M3ToF32(bytes[i]);
      return;
    case DType::kF8E8M0:
      for (int64_t i = 0; i < n; ++i) dst[i] = E8M0ToF32(bytes[i]);
      return;
    case DType::kF8E4M3B32: {
      const auto* b = static_cast<const BlockF8E4M3B32*>(src);
      if (ActiveIsa() == Isa::kAvx512) {
        return DequantizeF8E4M3Avx512(b, E4M3Table().data(), dst, n / kQK);
      }
      const float* table = E4M3Table().data();
      for (int64_t i = 0; i < n / kQK; ++i) DecodeE4M3Block(b[i].qs, b[i].d, table, dst + i * kQK);
      return;
    }
    case DType::kMxfp4: {
      const auto* b = static_cast<const BlockMxfp4*>(src);
      const auto& scales = E8M0Table();
      if (ActiveIsa() == Isa::kAvx512) {
        return DequantizeMxfp4Avx512(b, kE2M1, scales.data(), dst, n / kQK);
      }
      for (int64_t i = 0; i < n / kQK; ++i) DecodeE2M1Block(b[i].qs, scales[b[i].e], dst + i * kQK);
      return;
    }
    default:
      break;
  }
}

void QuantizeFp8RowReference(DType type, const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float amax = 0.0f;
    for (int l = 0; l < kQK; ++l) amax = std::max(amax, std::fabs(x[l]));
    if (type == DType::kF8E4M3B32) {
      auto& b = static_cast<BlockF8E4M3B32*>(dst)[i];
      b.d = E8M0ToF32(E8M0For(amax, 448.0f));
      for (int l = 0; l < kQK; ++l) {
        const float v = x[l] / b.d;
        const uint8_t code = NearestCode(std::fabs(v), 127, [](int c) { return E4M3ToF32(c); });
        b.qs[l] = static_cast<uint8_t>(code | (v < 0 ? 0x80 : 0));
      }
    } else {
      auto& b = static_cast<BlockMxfp4*>(dst)[i];
      b.e = E8M0For(amax, 6.0f);
      const float d = E8M0ToF32(b.e);
      for (int j = 0; j < kQK / 2; ++j) {
        uint8_t codes[2];
        for (int h = 0; h < 2; ++h) {
          const float v = x[2 * j + h] / d;
          codes[h] = static_cast<uint8_t>(
              NearestCode(std::fabs(v), 8, [](int c) { return kE2M1[c]; }) | (v < 0 ? 8 : 0));
        }
        b.qs[j] = static_cast<uint8_t>(codes[0] | (codes[1] << 4));
      }
    }
  }
}

}  // namespace internal
}  // namespace dinfer::kernels::cpu
