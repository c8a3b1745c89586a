#include "kernels/cpu/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/half.h"

namespace dinfer::kernels::cpu {
namespace {

inline int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

void DequantizeQ8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = F16ToF32(b[i].d);
    for (int l = 0; l < kQK; ++l) y[l] = d * static_cast<float>(b[i].qs[l]);
  }
}

void DequantizeQ4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = F16ToF32(b[i].d);
    for (int l = 0; l < kQK / 2; ++l) {
      y[l] = d * static_cast<float>((b[i].qs[l] & 0xf) - 8);
      y[l + 16] = d * static_cast<float>((b[i].qs[l] >> 4) - 8);
    }
  }
}

void DequantizeQ4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = F16ToF32(b[i].d);
    const float m = F16ToF32(b[i].m);
    for (int l = 0; l < kQK / 2; ++l) {
      y[l] = d * static_cast<float>(b[i].qs[l] & 0xf) + m;
      y[l + 16] = d * static_cast<float>(b[i].qs[l] >> 4) + m;
    }
  }
}

void DequantizeQ4_K(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    const float dmin = F16ToF32(b[i].dmin);
    uint8_t sc[8], mn[8];
    UnpackQ4KScales(b[i].scales, sc, mn);
    for (int c = 0; c < 4; ++c, y += 64) {
      const float d0 = d * sc[2 * c], m0 = dmin * mn[2 * c];
      const float d1 = d * sc[2 * c + 1], m1 = dmin * mn[2 * c + 1];
      const uint8_t* q = b[i].qs + 32 * c;
      for (int l = 0; l < 32; ++l) {
        y[l] = d0 * static_cast<float>(q[l] & 0xf) - m0;
        y[l + 32] = d1 * static_cast<float>(q[l] >> 4) - m1;
      }
    }
  }
}

void DequantizeQ6_K(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = F16ToF32(b[i].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      const int8_t* sc = b[i].scales + 8 * h;
      for (int g = 0; g < 4; ++g) {
        for (int l = 0; l < 32; ++l) {
          const int lo = (ql[32 * (g & 1) + l] >> (4 * (g >> 1))) & 0xf;
          const int hi = (qh[l] >> (2 * g)) & 3;
          const float ds = d * static_cast<float>(sc[2 * g + l / 16]);
          y[32 * g + l] = ds * static_cast<float>((lo | (hi << 4)) - 32);
        }
      }
    }
  }
}

// ggml rounds to nearest with ties away from zero here (roundf).
void QuantizeQ8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int l = 0; l < kQK; ++l) amax = std::max(amax, std::fabs(x[l]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = F32ToF16(d);
    for (int l = 0; l < kQK; ++l) b[i].qs[l] = static_cast<int8_t>(std::roundf(x[l] * id));
  }
}

void QuantizeQ4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f, max = 0.0f;
    for (int l = 0; l < kQK; ++l) {
      if (std::fabs(x[l]) > amax) {
        amax = std::fabs(x[l]);
        max = x[l];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = F32ToF16(d);
    for (int l = 0; l < kQK / 2; ++l) {
      const int q0 = std::min(15, static_cast<int>(x[l] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(x[l + 16] * id + 8.5f));
      b[i].qs[l] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeQ4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = x[0], max = x[0];
    for (int l = 1; l < kQK; ++l) {
      min = std::min(min, x[l]);
      max = std::max(max, x[l]);
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = F32ToF16(d);
    b[i].m = F32ToF16(min);
    for (int l = 0; l < kQK / 2; ++l) {
      const int q0 = std::min(15, static_cast<int>((x[l] - min) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((x[l + 16] - min) * id + 0.5f));
      b[i].qs[l] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Per sub-block of 32: scale = (max - min) / 15 and offset = -min (min clamped to <= 0), then
// both quantized to 6 bits against the super-block maxima.
void QuantizeQ4_K(const float* x, BlockQ4_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    float scale[8], offset[8], max_scale = 0.0f, max_offset = 0.0f;
    for (int j = 0; j < 8; ++j) {
      float lo = 0.0f, hi = x[32 * j];
      for (int l = 0; l < 32; ++l) {
        lo = std::min(lo, x[32 * j + l]);
        hi = std::max(hi, x[32 * j + l]);
      }
      scale[j] = (hi - lo) / 15.0f;
      offset[j] = -lo;
      max_scale = std::max(max_scale, scale[j]);
      max_offset = std::max(max_offset, offset[j]);
    }
    const float d = max_scale / 63.0f, dmin = max_offset / 63.0f;
    b[i].d = F32ToF16(d);
    b[i].dmin = F32ToF16(dmin);
    const float dq = F16ToF32(b[i].d), dminq = F16ToF32(b[i].dmin);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(d > 0 ? std::min(63.0f, std::nearbyint(scale[j] / d)) : 0);
      mn[j] =
          static_cast<uint8_t>(dmin > 0 ? std::min(63.0f, std::nearbyint(offset[j] / dmin)) : 0);
    }
    for (int j = 0; j < 4; ++j) {
      b[i].scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      b[i].scales[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
      b[i].scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    uint8_t q[kQKK];
    for (int j = 0; j < 8; ++j) {
      const float ds = dq * sc[j], dm = dminq * mn[j];
      for (int l = 0; l < 32; ++l) {
        const float v = ds > 0 ? std::nearbyint((x[32 * j + l] + dm) / ds) : 0.0f;
        q[32 * j + l] = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
      }
    }
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        b[i].qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
      }
    }
  }
}

// Per sub-block of 16: scale = -max_signed / 32 quantized to int8 against the super-block max.
void QuantizeQ6_K(const float* x, BlockQ6_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    float scale[16], max_abs_scale = 0.0f;
    for (int g = 0; g < 16; ++g) {
      float amax = 0.0f, max = 0.0f;
      for (int l = 0; l < 16; ++l) {
        if (std::fabs(x[16 * g + l]) > amax) {
          amax = std::fabs(x[16 * g + l]);
          max = x[16 * g + l];
        }
      }
      scale[g] = max / -32.0f;
      max_abs_scale = std::max(max_abs_scale, std::fabs(scale[g]));
    }
    const float d = max_abs_scale / 127.0f;
    b[i].d = F32ToF16(d);
    const float dq = F16ToF32(b[i].d);
    uint8_t q[kQKK];
    for (int g = 0; g < 16; ++g) {
      const int s =
          d > 0 ? static_cast<int>(std::clamp(std::nearbyint(scale[g] / d), -127.f, 127.f)) : 0;
      b[i].scales[g] = static_cast<int8_t>(s);
      const float ds = dq * static_cast<float>(s);
      for (int l = 0; l < 16; ++l) {
        const float v = ds != 0 ? std::nearbyint(x[16 * g + l] / ds) : 0.0f;
        q[16 * g + l] = static_cast<uint8_t>(std::clamp(v, -32.0f, 31.0f) + 32.0f);
      }
    }
    std::memset(b[i].ql, 0, sizeof(b[i].ql));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 4; ++g) {
        for (int l = 0; l < 32; ++l) {
          const int v = q[128 * h + 32 * g + l];
          b[i].ql[64 * h + 32 * (g & 1) + l] |= static_cast<uint8_t>((v & 0xf) << (4 * (g >> 1)));
          b[i].qh[32 * h + l] |= static_cast<uint8_t>((v >> 4) << (2 * g));
        }
      }
    }
  }
}

}  // namespace

void UnpackQ4KScales(const uint8_t p[12], uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = p[j] & 63;
    mn[j] = p[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((p[j + 8] & 15) | ((p[j] >> 6) << 4));
    mn[j + 4] = static_cast<uint8_t>((p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4));
  }
}

void DequantizeRow(DType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(h[i]);
      return;
    }
    case DType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(h[i]);
      return;
    }
    case DType::kQ8_0:
      return DequantizeQ8_0(static_cast<const BlockQ8_0*>(src), dst, n / kQK);
    case DType::kQ4_0:
      return DequantizeQ4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK);
    case DType::kQ4_1:
      return DequantizeQ4_1(static_cast<const BlockQ4_1*>(src), dst, n / kQK);
    case DType::kQ4_K:
      return DequantizeQ4_K(static_cast<const BlockQ4_K*>(src), dst, n / kQKK);
    case DType::kQ6_K:
      return DequantizeQ6_K(static_cast<const BlockQ6_K*>(src), dst, n / kQKK);
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kF8E8M0:
    case DType::kF8E4M3B32:
    case DType::kMxfp4:
      return internal::DequantizeFp8Row(type, src, dst, n);
    case DType::kI32:
    case DType::kI64:
      break;
  }
  std::fill(dst, dst + n, std::nanf(""));
}

void QuantizeRowReference(DType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kQ8_0:
      return QuantizeQ8_0(src, static_cast<BlockQ8_0*>(dst), n / kQK);
    case DType::kQ4_0:
      return QuantizeQ4_0(src, static_cast<BlockQ4_0*>(dst), n / kQK);
    case DType::kQ4_1:
      return QuantizeQ4_1(src, static_cast<BlockQ4_1*>(dst), n / kQK);
    case DType::kQ4_K:
      return QuantizeQ4_K(src, static_cast<BlockQ4_K*>(dst), n / kQKK);
    case DType::kQ6_K:
      return QuantizeQ6_K(src, static_cast<BlockQ6_K*>(dst), n / kQKK);
    case DType::kF8E4M3B32:
    case DType::kMxfp4:
      return internal::QuantizeFp8RowReference(type, src, dst, n);
    default:
      break;
  }
}

bool HasActFormat(DType weight_type) {
  switch (weight_type) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
      return true;
    default:
      return false;
  }
}

ActFormat ActFormatFor(DType weight_type) {
  switch (weight_type) {
    case DType::kQ4_0:
    case DType::kQ4_1:
      return ActFormat::kQ8x32Grouped;
    case DType::kQ4_K:
    case DType::kQ6_K:
      return ActFormat::kQ8x256;
    default:
      return ActFormat::kQ8x32;
  }
}

int64_t ActRowBytes(ActFormat format, int64_t k) {
  if (format == ActFormat::kQ8x256) {
    return RoundUp(k, 64) + RoundUp(k / kQKK * 4, 64) + RoundUp(k / 16 * 2, 64);
  }
  return RoundUp(k / kQK, 16) * (kQK + 8);
}

ActRow ViewActRow(ActFormat format, const void* row, int64_t k) {
  const auto* base = static_cast<const uint8_t*>(row);
  ActRow r;
  r.qs = reinterpret_cast<const int8_t*>(base);
  if (format == ActFormat::kQ8x256) {
    const int64_t d_off = RoundUp(k, 64);
    r.d = reinterpret_cast<const float*>(base + d_off);
    r.bsums = reinterpret_cast<const int16_t*>(base + d_off + RoundUp(k / kQKK * 4, 64));
  } else {
    const int64_t nbp = RoundUp(k / kQK, 16);
    r.d = reinterpret_cast<const float*>(base + nbp * kQK);
    r.s = r.d + nbp;
  }
  return r;
}

void QuantizeActRowReference(ActFormat format, const float* x, void* dst, int64_t k) {
  std::memset(dst, 0, static_cast<size_t>(ActRowBytes(format, k)));
  const ActRow view = ViewActRow(format, dst, k);
  auto* qs = const_cast<int8_t*>(view.qs);
  auto* d = const_cast<float*>(view.d);
  const int64_t block = format == ActFormat::kQ8x256 ? kQKK : kQK;
  for (int64_t b = 0; b < k / block; ++b) {
    const float* xb = x + b * block;
    float amax = 0.0f;
    for (int64_t l = 0; l < block; ++l) amax = std::max(amax, std::fabs(xb[l]));
    if (!(amax >= kActTinyAmax)) amax = 0.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    int sum = 0, sum16 = 0;
    for (int64_t l = 0; l < block; ++l) {
      const int q = static_cast<int>(std::lrint(xb[l] * id));
      qs[ActQsOffset(format, b * block + l)] = static_cast<int8_t>(q);
      sum += q;
      sum16 += q;
      if (format == ActFormat::kQ8x256 && l % 16 == 15) {
        const_cast<int16_t*>(view.bsums)[(b * block + l) / 16] = static_cast<int16_t>(sum16);
        sum16 = 0;
      }
    }
    if (format != ActFormat::kQ8x256)
      const_cast<float*>(view.s)[b] = d[b] * static_cast<float>(sum);
  }
}

}  // namespace dinfer::kernels::cpu
