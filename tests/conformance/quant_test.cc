// GGUF block formats against the gguf Python package (fixtures from
// scripts/fixtures/make_quant_fixtures.py), quantizer round trips, f16/bf16 conversions, and the
// activation quantizers of every ISA against the portable one.
#include "kernels/cpu/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul_internal.h"

namespace dinfer::kernels::cpu {
namespace {

std::vector<uint8_t> ReadFixture(const std::string& name) {
  const std::string path = std::string(DINFER_SOURCE_DIR) + "/tests/data/quant/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> AsFloats(const std::vector<uint8_t>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

struct FixtureType {
  const char* name;
  DType type;
};
constexpr FixtureType kBlockTypes[] = {{"q8_0", DType::kQ8_0},
                                       {"q4_0", DType::kQ4_0},
                                       {"q4_1", DType::kQ4_1},
                                       {"q4_k", DType::kQ4_K},
                                       {"q6_k", DType::kQ6_K}};

TEST(QuantTest, DequantizeMatchesGgufPackage) {
  for (const auto& [name, type] : kBlockTypes) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> blocks = ReadFixture(std::string(name) + ".bin");
    const std::vector<float> expected = AsFloats(ReadFixture(std::string(name) + ".f32"));
    ASSERT_FALSE(expected.empty());
    const int64_t n = static_cast<int64_t>(expected.size());
    ASSERT_EQ(RowBytes(type, n), static_cast<int64_t>(blocks.size()));
    std::vector<float> got(n);
    DequantizeRow(type, blocks.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bits(got[i]), Bits(expected[i]))
          << "element " << i << ": " << got[i] << " vs " << expected[i];
    }
  }
}

TEST(QuantTest, QuantizeMatchesGgufPackage) {
  const std::vector<float> input = AsFloats(ReadFixture("input.f32"));
  ASSERT_EQ(input.size(), 8u * 64u);
  const struct {
    const char* name;
    DType type;
    int64_t n;  // block quantizers are compared on the finite rows 0..5
  } cases[] = {{"q8_0", DType::kQ8_0, 6 * 64},
               {"q4_0", DType::kQ4_0, 6 * 64},
               {"q4_1", DType::kQ4_1, 6 * 64},
               {"f16", DType::kF16, 8 * 64},
               {"bf16", DType::kBF16, 8 * 64}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> expected = ReadFixture(std::string(c.name) + "_quantized.bin");
    ASSERT_EQ(static_cast<int64_t>(expected.size()), RowBytes(c.type, c.n));
    std::vector<uint8_t> got(expected.size());
    QuantizeRowReference(c.type, input.data(), got.data(), c.n);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expected[i]) << "byte " << i;
  }
}

TEST(QuantTest, RoundTripError) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 4096;
  std::vector<float> x(n), back(n);
  for (auto& v : x) v = normal(rng) * 0.1f;
  x[5] = 3.0f;  // an outlier
  // Relative RMS error each format must stay under (generous against its resolution).
  const struct {
    DType type;
    double rel_rms;
  } cases[] = {{DType::kF32, 0.0},   {DType::kF16, 1e-3},  {DType::kBF16, 4e-3},
               {DType::kQ8_0, 0.01}, {DType::kQ4_0, 0.12}, {DType::kQ4_1, 0.1},
               {DType::kQ4_K, 0.12}, {DType::kQ6_K, 0.04}, {DType::kF8E4M3B32, 0.04},
               {DType::kMxfp4, 0.2}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(DTypeName(c.type)));
    std::vector<uint8_t> q(RowBytes(c.type, n));
    QuantizeRowReference(c.type, x.data(), q.data(), n);
    DequantizeRow(c.type, q.data(), back.data(), n);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (back[i] - x[i]) * (back[i] - x[i]);
      ref += x[i] * x[i];
    }
    EXPECT_LE(std::sqrt(err / ref), c.rel_rms);
    if (c.rel_rms == 0.0) {
      EXPECT_EQ(err, 0.0);
    }
  }
}

TEST(QuantTest, QuantizedZerosStayZero) {
  const int64_t n = 512;
  std::vector<float> x(n, 0.0f), back(n, 1.0f);
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ4_K, DType::kQ6_K,
                  DType::kF8E4M3B32, DType::kMxfp4}) {
    std::vector<uint8_t> q(RowBytes(t, n));
    QuantizeRowReference(t, x.data(), q.data(), n);
    DequantizeRow(t, q.data(), back.data(), n);
    for (float v : back) ASSERT_EQ(v, 0.0f) << DTypeName(t);
  }
}

// FP8 / FP4 blocks: every value goes to the nearest code of its block's scale, ties to the even
// code — checked against a scan over all codes, on values that include the midpoints between
// neighbouring codes (the ties) and the codes themselves.
TEST(QuantTest, Fp8AndFp4RoundToNearestEvenCode) {
  for (DType t : {DType::kF8E4M3B32, DType::kMxfp4}) {
    const bool fp8 = t == DType::kF8E4M3B32;
    const int codes = fp8 ? 127 : 8;  // non-negative finite codes, increasing magnitudes
    auto decode = [&](int c) { return fp8 ? E4M3ToF32(static_cast<uint8_t>(c)) : E2M1ToF32(c); };
    std::vector<float> mags;
    for (int c = 0; c < codes; ++c) {
      mags.push_back(decode(c));
      if (c + 1 < codes) mags.push_back((decode(c) + decode(c + 1)) / 2);
    }
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(0.0f, decode(codes - 1));
    for (int i = 0; i < 500; ++i) mags.push_back(u(rng));
    // Blocks of 32 whose largest magnitude is the largest code, so the scale is 1.
    std::vector<float> x;
    for (size_t i = 0; i < mags.size(); i += 31) {
      x.push_back(decode(codes - 1));
      for (size_t j = i; j < std::min(mags.size(), i + 31); ++j) {
        x.push_back(j % 2 ? -mags[j] : mags[j]);
      }
      while (x.size() % 32) x.push_back(0.0f);
    }
    std::vector<uint8_t> q(RowBytes(t, static_cast<int64_t>(x.size())));
    std::vector<float> back(x.size());
    QuantizeRowReference(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
    DequantizeRow(t, q.data(), back.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float mag = std::fabs(x[i]);
      int best = 0;
      for (int c = 1; c < codes; ++c) {
        const float err = std::fabs(mag - decode(c)), best_err = std::fabs(mag - decode(best));
        if (err < best_err || (err == best_err && c % 2 == 0)) best = c;
      }
      const float want = x[i] < 0 ? -decode(best) : decode(best);
      ASSERT_EQ(back[i], want) << DTypeName(t) << " value " << x[i];
    }
  }
}

TEST(QuantTest, HalfConversions) {
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)) && F16ToF32(0x7c00) > 0);
  EXPECT_TRUE(std::isinf(F16ToF32(0xfc00)) && F16ToF32(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7c01)));
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // halfway to zero: ties to even
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp ties to even (2)
  EXPECT_EQ(F32ToF16(1e-40f), 0x0000);
  EXPECT_EQ(F32ToF16(-1e-40f), 0x8000);
  EXPECT_EQ(F32ToF16(std::nanf("")) & 0x7c00, 0x7c00);
  EXPECT_NE(F32ToF16(std::nanf("")) & 0x03ff, 0);
  // Every f16 survives f16 -> f32 -> f16 (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    const uint16_t back = F32ToF16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(F16ToF32(back))) << h;
    } else {
      ASSERT_EQ(back, h) << h;
    }
  }
}

TEST(QuantTest, Bf16Conversions) {
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0x0001), std::ldexp(1.0f, -133));  // subnormal
  EXPECT_TRUE(std::isinf(Bf16ToF32(0x7f80)));
  EXPECT_TRUE(std::isnan(Bf16ToF32(0x7fc0)));
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);        // tie to even (down)
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);    // tie to even (up)
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  const uint16_t nan = F32ToBf16(std::nanf(""));
  EXPECT_TRUE(std::isnan(Bf16ToF32(nan)));
  // A signalling NaN whose payload sits in the low half must not turn into inf.
  uint32_t snan_bits = 0x7f800001;
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(snan))));
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Bf16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(f)))) << h;
    } else {
      ASSERT_EQ(F32ToBf16(f), h) << h;
    }
  }
}

TEST(QuantTest, Q4KScaleUnpacking) {
  // Scales 0..7 = 1..8 and mins 0..7 = 60..53, packed by hand per the layout in quant.h.
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(j + 1 + (j >= 4 ? 40 : 0));
    mn[j] = static_cast<uint8_t>(60 - j);
  }
  uint8_t packed[12];
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  uint8_t sc2[8], mn2[8];
  UnpackQ4KScales(packed, sc2, mn2);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(sc2[j], sc[j]) << j;
    EXPECT_EQ(mn2[j], mn[j]) << j;
  }
}

// ---- Activation formats ----

std::vector<float> ActivationRow(int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(k);
  for (auto& v : x) v = normal(rng);
  for (int64_t i = 0; i < k && i < 32; ++i) x[i] = 0.0f;  // an all-zero block
  for (int64_t i = 32; i < k && i < 64; ++i) x[i] = 1e-35f * static_cast<float>(i);  // tiny
  for (int64_t i = 96; i < k && i < 128; ++i) {
    x[i] = static_cast<float>(static_cast<int>(i % 9) - 4) + 0.5f;  // exact ties when scaled by 1
  }
  if (k > 128) x[99] = 127.0f;  // makes that block's scale exactly 1
  if (k > 128) x[130] = 1e4f;   // outlier
  return x;
}

TEST(QuantTest, ActivationQuantizationDefinition) {
  const int64_t k = 512;
  const std::vector<float> x = ActivationRow(k, 3);
  for (ActFormat format : {ActFormat::kQ8x32, ActFormat::kQ8x32Grouped, ActFormat::kQ8x256}) {
    std::vector<uint8_t> row(ActRowBytes(format, k));
    QuantizeActRowReference(format, x.data(), row.data(), k);
    const ActRow a = ViewActRow(format, row.data(), k);
    const int64_t block = format == ActFormat::kQ8x256 ? kQKK : kQK;
    for (int64_t b = 0; b < k / block; ++b) {
      float amax = 0.0f;
      int sum = 0;
      for (int64_t l = 0; l < block; ++l) amax = std::max(amax, std::fabs(x[b * block + l]));
      if (amax < kActTinyAmax) amax = 0.0f;
      ASSERT_EQ(a.d[b], amax / 127.0f);
      for (int64_t l = 0; l < block; ++l) {
        const int64_t e = b * block + l;
        const int q = a.qs[ActQsOffset(format, e)];
        sum += q;
        ASSERT_LE(std::abs(q), 127);
        // Within half a step of the input (round to nearest).
        ASSERT_LE(std::fabs(q * a.d[b] - x[e]), 0.5001f * a.d[b] + 1e-30f) << e;
        if (b * block == 96 && block == kQK) {
          ASSERT_EQ(amax, 127.0f);
          ASSERT_EQ(q, static_cast<int>(std::nearbyint(x[e])));  // ties to even
        }
      }
      if (format != ActFormat::kQ8x256) {
        ASSERT_EQ(a.s[b], a.d[b] * static_cast<float>(sum));
      } else {
        for (int g = 0; g < 16; ++g) {
          int s16 = 0;
          for (int l = 0; l < 16; ++l) s16 += a.qs[b * block + 16 * g + l];
          ASSERT_EQ(a.bsums[b * 16 + g], s16);
        }
      }
    }
  }
}

TEST(QuantTest, ActivationQuantizationIdenticalAcrossIsas) {
  std::vector<const internal::KernelSet*> sets = {&internal::ScalarKernels()};
  if (IsaSupported(Isa::kAvx2)) sets.push_back(&internal::Avx2Kernels());
  if (IsaSupported(Isa::kAvx512)) sets.push_back(&internal::Avx512Kernels(false));
  for (int64_t k : {256, 512, 576, 1536, 4096}) {
    for (uint32_t seed = 0; seed < 4; ++seed) {
      std::vector<float> x = ActivationRow(k, seed);
      if (seed == 1) {
        for (auto& v : x) v *= 1e-3f;
      }
      if (seed == 2) {
        for (auto& v : x) v = std::fabs(v);
      }
      for (ActFormat format : {ActFormat::kQ8x32, ActFormat::kQ8x32Grouped, ActFormat::kQ8x256}) {
        if (format == ActFormat::kQ8x256 && k % kQKK != 0) continue;
        const int64_t bytes = ActRowBytes(format, k);
        std::vector<uint8_t> expected(bytes);
        QuantizeActRowReference(format, x.data(), expected.data(), k);
        for (size_t s = 0; s < sets.size(); ++s) {
          std::vector<uint8_t> got(bytes, 0xcd);  // garbage: padding must be written too
          sets[s]->quantize_acts(format, x.data(), got.data(), k);
          ASSERT_EQ(std::memcmp(got.data(), expected.data(), bytes), 0)
              << "isa set " << s << " format " << static_cast<int>(format) << " k " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dinfer::kernels::cpu
