// Helpers for the GPU conformance tests: random host data (and random e4m3 weights with row
// scales), bf16 rounding, device buffers filled from host vectors (and poisoned with NaN before a
// kernel writes them), e4m3 rounding, error norms, and the launch timing of the perf-mode tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/memory.h"
#include "base/half.h"
#include "kernels/cpu/quant.h"
#include "tensor/dtype.h"

namespace dinfer::gpu_test {

#define SKIP_WITHOUT_GPU() \
  if (::dinfer::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device"

#define ASSERT_CUDA_OK(expr) ASSERT_EQ(static_cast<int>(expr), 0) << #expr
#define ASSERT_STATUS_OK(expr)                              \
  do {                                                      \
    const ::dinfer::Status s_ = (expr);                     \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)

inline std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Values as the device sees them in `dtype` (bf16 rounds to nearest even).
inline std::vector<float> RoundTo(DType dtype, std::vector<float> v) {
  if (dtype == DType::kBF16) {
    for (auto& x : v) x = Bf16ToF32(F32ToBf16(x));
  }
  return v;
}

// The float8 e4m3fn byte nearest to x (ties to the even code), saturated to ±448: what the
// device's cvt.rn.satfinite gives.
inline uint8_t ToE4M3(float x) {
  static const std::vector<float> mags = [] {
    std::vector<float> m(127);  // magnitudes of codes 0..126, increasing (127 is NaN)
    for (int c = 0; c < 127; ++c) m[c] = kernels::cpu::E4M3ToF32(static_cast<uint8_t>(c));
    return m;
  }();
  const float a = std::fabs(x);
  int c = static_cast<int>(std::lower_bound(mags.begin(), mags.end(), a) - mags.begin());
  if (c == 127) {
    c = 126;
  } else if (c > 0) {
    const float below = a - mags[c - 1], above = mags[c] - a;
    if (below < above || (below == above && (c - 1) % 2 == 0)) --c;
  }
  return static_cast<uint8_t>(c | (std::signbit(x) ? 0x80 : 0));
}

// e4m3 bytes of x / scale, and the values they stand for (byte * scale).
inline std::vector<uint8_t> QuantizeE4M3(const std::vector<float>& x, float scale) {
  std::vector<uint8_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = ToE4M3(x[i] / scale);
  return out;
}
inline std::vector<float> DequantizeE4M3(const std::vector<uint8_t>& b, float scale) {
  std::vector<float> out(b.size());
  for (size_t i = 0; i < b.size(); ++i) out[i] = kernels::cpu::E4M3ToF32(b[i]) * scale;
  return out;
}

inline size_t ElemSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// A device buffer holding `v` as `dtype`.
inline cuda::DeviceBuffer Upload(const std::vector<float>& v, DType dtype) {
  auto b = cuda::DeviceBuffer::Allocate(std::max<size_t>(v.size(), 1) * ElemSize(dtype));
  EXPECT_TRUE(b.ok());
  if (dtype == DType::kF32) {
    EXPECT_TRUE(b->CopyFromHost(v.data(), v.size() * 4).ok());
  } else {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = F32ToBf16(v[i]);
    EXPECT_TRUE(b->CopyFromHost(h.data(), h.size() * 2).ok());
  }
  return std::move(*b);
}

template <typename T>
cuda::DeviceBuffer UploadRaw(const std::vector<T>& v) {
  auto b = cuda::DeviceBuffer::Allocate(std::max<size_t>(v.size(), 1) * sizeof(T));
  EXPECT_TRUE(b.ok());
  EXPECT_TRUE(b->CopyFromHost(v.data(), v.size() * sizeof(T)).ok());
  return std::move(*b);
}

// n elements of `dtype` filled with NaN, so that unwritten outputs fail the comparison.
inline cuda::DeviceBuffer Poisoned(size_t n, DType dtype) {
  std::vector<uint8_t> bytes(std::max<size_t>(n, 1) * ElemSize(dtype), 0xff);
  return UploadRaw(bytes);
}

inline std::vector<float> Download(const cuda::DeviceBuffer& b, size_t n, DType dtype) {
  std::vector<float> out(n);
  EXPECT_TRUE(cuda::Synchronize().ok());
  if (dtype == DType::kF32) {
    EXPECT_TRUE(b.CopyToHost(out.data(), n * 4).ok());
  } else {
    std::vector<uint16_t> h(n);
    EXPECT_TRUE(b.CopyToHost(h.data(), n * 2).ok());
    for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(h[i]);
  }
  return out;
}

template <typename T>
std::vector<T> DownloadRaw(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> out(n);
  EXPECT_TRUE(cuda::Synchronize().ok());
  EXPECT_TRUE(b.CopyToHost(out.data(), n * sizeof(T)).ok());
  return out;
}

// ‖got − want‖ / ‖want‖ over all elements; infinity when any element is not finite.
inline double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    ref += double{want[i]} * want[i];
  }
  return std::sqrt(diff / std::max(ref, 1e-300));
}

// Random e4m3 weights: codes of every exponent (subnormals and zero included) and sign, NaN codes
// replaced by ±448; and per-row scales spread over 2^-12 .. 2^-7, so that a scale applied to the
// wrong row shows.
struct Fp8Weights {
  std::vector<uint8_t> bytes;  // [n, k]
  std::vector<float> scale;    // [n]
  std::vector<float> values;   // [n, k]: what the bytes stand for, without the scale
};

inline Fp8Weights RandomFp8(int64_t n, int64_t k, std::mt19937& rng) {
  Fp8Weights w;
  w.bytes.resize(static_cast<size_t>(n * k));
  w.values.resize(w.bytes.size());
  float lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = kernels::cpu::E4M3ToF32(static_cast<uint8_t>(c));
  for (size_t i = 0; i < w.bytes.size(); ++i) {
    uint8_t b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b ^= 1;  // NaN → 448
    w.bytes[i] = b;
    w.values[i] = lut[b];
  }
  std::uniform_real_distribution<float> u(-12.0f, -7.0f);
  w.scale.resize(static_cast<size_t>(n));
  for (auto& s : w.scale) s = std::exp2(u(rng));
  return w;
}

// Median milliseconds of one launch (launch() returns a cudaError_t): alone, with events around
// each of 15 launches, and chained, over rounds of 20 back-to-back launches (programmatic
// dependents overlap there), after 3 warm-up launches. Negative on a CUDA error.
struct LaunchTimes {
  double alone_ms = -1, chained_ms = -1;
};
template <typename Launch>
LaunchTimes TimeLaunches(cudaStream_t st, Launch&& launch) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  LaunchTimes out;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) return out;
  auto median = [](std::vector<float> t) {
    std::sort(t.begin(), t.end());
    return static_cast<double>(t[t.size() / 2]);
  };
  // Events around `count` launches: their time, or a negative value on an error.
  auto timed = [&](int count) -> float {
    if (cudaEventRecord(e0, st) != cudaSuccess) return -1;
    for (int c = 0; c < count; ++c) {
      if (launch() != cudaSuccess) return -1;
    }
    float ms = 0;
    if (cudaEventRecord(e1, st) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
      return -1;
    }
    return ms;
  };
  std::vector<float> alone, chained;
  bool ok = timed(3) >= 0;
  for (int r = 0; ok && r < 15; ++r) {
    const float ms = timed(1);
    ok = ms >= 0;
    alone.push_back(ms);
  }
  constexpr int kChain = 20;
  for (int r = 0; ok && r < 6; ++r) {
    const float ms = timed(kChain);
    ok = ms >= 0;
    if (r > 0) chained.push_back(ms / kChain);
  }
  if (ok) out = {median(alone), median(chained)};
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return out;
}

// Tolerances: f32 arithmetic against double references; bf16 outputs (8-bit mantissa).
inline double Tolerance(DType out) { return out == DType::kF32 ? 2e-5 : 1e-2; }

}  // namespace dinfer::gpu_test
