// Portable kernels: the fallback on CPUs without AVX2 and the template the SIMD files follow.
#include <cmath>
#include <cstring>

#include "base/half.h"
#include "kernels/cpu/matmul_internal.h"

namespace dinfer::kernels::cpu::internal {
namespace {

template <DType T>
float WeightAt(const uint8_t* w, int64_t i) {
  if constexpr (T == DType::kF32) {
    float v;
    std::memcpy(&v, w + 4 * i, 4);
    return v;
  } else {
    uint16_t h;
    std::memcpy(&h, w + 2 * i, 2);
    return T == DType::kF16 ? F16ToF32(h) : Bf16ToF32(h);
  }
}

template <DType T>
float DotFloat(const float* x, const uint8_t* w, int64_t k) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += x[i + l] * WeightAt<T>(w, i + l);
  }
  for (; i < k; ++i) acc[i % 8] += x[i] * WeightAt<T>(w, i);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

float DotQ8_0(const uint8_t* wp, const ActRow& a, int64_t k) {
  const auto* w = reinterpret_cast<const BlockQ8_0*>(wp);
  float acc = 0.0f;
  for (int64_t b = 0; b < k / kQK; ++b) {
    const int8_t* q = a.qs + b * kQK;
    int sum = 0;
    for (int l = 0; l < kQK; ++l) sum += w[b].qs[l] * q[l];
    acc += F16ToF32(w[b].d) * a.d[b] * static_cast<float>(sum);
  }
  return acc;
}

// Grouped activation layout: elements 0..15 of block b at lo, 16..31 at lo + 64.
template <bool kQ4_1>
float DotQ4(const uint8_t* wp, const ActRow& a, int64_t k) {
  float acc = 0.0f;
  for (int64_t b = 0; b < k / kQK; ++b) {
    const uint8_t* blk = wp + b * (kQ4_1 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0));
    const uint8_t* qs = blk + (kQ4_1 ? 4 : 2);
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const int8_t* lo = a.qs + ActQsOffset(ActFormat::kQ8x32Grouped, b * kQK);
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += (qs[l] & 0xf) * lo[l] + (qs[l] >> 4) * lo[l + 64];
    if constexpr (kQ4_1) {
      uint16_t mh;
      std::memcpy(&mh, blk + 2, 2);
      acc += F16ToF32(dh) * a.d[b] * static_cast<float>(sum) + F16ToF32(mh) * a.s[b];
    } else {
      acc += F16ToF32(dh) * (a.d[b] * static_cast<float>(sum) - 8.0f * a.s[b]);
    }
  }
  return acc;
}

float DotQ4_K(const uint8_t* wp, const ActRow& a, int64_t k) {
  const auto* w = reinterpret_cast<const BlockQ4_K*>(wp);
  float acc = 0.0f;
  for (int64_t i = 0; i < k / kQKK; ++i) {
    uint8_t sc[8], mn[8];
    UnpackQ4KScales(w[i].scales, sc, mn);
    const int8_t* q = a.qs + i * kQKK;
    const int16_t* bs = a.bsums + i * 16;
    int sum = 0, msum = 0;
    for (int c = 0; c < 4; ++c) {
      int s0 = 0, s1 = 0;
      for (int l = 0; l < 32; ++l) {
        s0 += (w[i].qs[32 * c + l] & 0xf) * q[64 * c + l];
        s1 += (w[i].qs[32 * c + l] >> 4) * q[64 * c + 32 + l];
      }
      sum += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
    }
    for (int j = 0; j < 8; ++j) msum += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
    acc += a.d[i] * (F16ToF32(w[i].d) * static_cast<float>(sum) -
                     F16ToF32(w[i].dmin) * static_cast<float>(msum));
  }
  return acc;
}

float DotQ6_K(const uint8_t* wp, const ActRow& a, int64_t k) {
  const auto* w = reinterpret_cast<const BlockQ6_K*>(wp);
  float acc = 0.0f;
  for (int64_t i = 0; i < k / kQKK; ++i) {
    const int8_t* q = a.qs + i * kQKK;
    int sum = 0;
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 4; ++g) {
        int s[2] = {0, 0};
        for (int l = 0; l < 32; ++l) {
          const int lo = (w[i].ql[64 * h + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 0xf;
          const int hi = (w[i].qh[32 * h + l] >> (2 * g)) & 3;
          s[l / 16] += ((lo | (hi << 4)) - 32) * q[128 * h + 32 * g + l];
        }
        sum += w[i].scales[8 * h + 2 * g] * s[0] + w[i].scales[8 * h + 2 * g + 1] * s[1];
      }
    }
    acc += a.d[i] * F16ToF32(w[i].d) * static_cast<float>(sum);
  }
  return acc;
}

inline void Store(const Tile& t, int64_t r, int64_t j, float v) {
  float& out = t.y[r * t.y_stride + j];
  out = t.accumulate ? out + v : v;
}

template <DType T>
void FloatTile(const Tile& t) {
  for (int64_t j = 0; j < t.cols; ++j) {
    for (int64_t r = 0; r < t.rows; ++r) {
      const auto* x = reinterpret_cast<const float*>(t.x + r * t.x_stride);
      Store(t, r, j, DotFloat<T>(x, t.w + j * t.w_stride, t.k));
    }
  }
}

template <float (*Dot)(const uint8_t*, const ActRow&, int64_t), ActFormat kFormat>
void QuantTile(const Tile& t) {
  for (int64_t j = 0; j < t.cols; ++j) {
    for (int64_t r = 0; r < t.rows; ++r) {
      const ActRow a = ViewActRow(kFormat, t.x + r * t.x_stride, t.k);
      Store(t, r, j, Dot(t.w + j * t.w_stride, a, t.k));
    }
  }
}

KernelSet MakeScalarKernels() {
  KernelSet s;
  s.tile[static_cast<int>(DType::kF32)] = FloatTile<DType::kF32>;
  s.tile[static_cast<int>(DType::kF16)] = FloatTile<DType::kF16>;
  s.tile[static_cast<int>(DType::kBF16)] = FloatTile<DType::kBF16>;
  s.tile[static_cast<int>(DType::kQ8_0)] = QuantTile<DotQ8_0, ActFormat::kQ8x32>;
  s.tile[static_cast<int>(DType::kQ4_0)] = QuantTile<DotQ4<false>, ActFormat::kQ8x32Grouped>;
  s.tile[static_cast<int>(DType::kQ4_1)] = QuantTile<DotQ4<true>, ActFormat::kQ8x32Grouped>;
  s.tile[static_cast<int>(DType::kQ4_K)] = QuantTile<DotQ4_K, ActFormat::kQ8x256>;
  s.tile[static_cast<int>(DType::kQ6_K)] = QuantTile<DotQ6_K, ActFormat::kQ8x256>;
  s.quantize_acts = QuantizeActRowReference;
  return s;
}

}  // namespace

const KernelSet& ScalarKernels() {
  static const KernelSet kernels = MakeScalarKernels();
  return kernels;
}

}  // namespace dinfer::kernels::cpu::internal
