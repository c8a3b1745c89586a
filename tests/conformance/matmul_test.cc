// Matmul on every available ISA (scalar, AVX2, AVX-512 with and without VNNI) against the plain
// references: tightly against MatmulQuantizedActivationsReference (same activation
// quantization, so only float summation order differs) and within the activation quantization
// error bound against MatmulReference (exact f32 activations).
// DINFER_CONFORMANCE_PERF=1 adds a benchmark (weight GB/s and GFLOP/s; nothing asserted).
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/half.h"
#include "base/thread_pool.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/quant.h"

namespace dinfer::kernels::cpu {
namespace {

struct IsaConfig {
  Isa isa;
  bool vnni;
  std::string name;
};

std::vector<IsaConfig> AvailableIsas() {
  std::vector<IsaConfig> out = {{Isa::kScalar, false, "scalar"}};
  if (IsaSupported(Isa::kAvx2)) out.push_back({Isa::kAvx2, false, "avx2"});
  if (IsaSupported(Isa::kAvx512)) {
    out.push_back({Isa::kAvx512, false, "avx512bw"});
    if (GetCpuFeatures().avx512vnni) out.push_back({Isa::kAvx512, true, "avx512vnni"});
  }
  return out;
}

// Selects an ISA for the lifetime of the guard.
class IsaGuard {
 public:
  explicit IsaGuard(const IsaConfig& c) : isa_(ActiveIsa()), vnni_(UseAvx512Vnni()) {
    SetIsaForTesting(c.isa);
    SetAvx512VnniForTesting(c.vnni);
  }
  ~IsaGuard() {
    SetIsaForTesting(isa_);
    SetAvx512VnniForTesting(vnni_);
  }

 private:
  Isa isa_;
  bool vnni_;
};

ThreadPool& TwoThreads() {
  static ThreadPool pool(2);
  return pool;
}

uint16_t RandomHalf(std::mt19937& rng, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  return F32ToF16(normal(rng));
}

// A weight row of random bytes with sane f16 scales: hits code paths a quantizer never
// produces (q8 -128, 6-bit scales and mins at 63, negative Q6_K scales).
void RandomRow(DType t, int64_t k, std::mt19937& rng, uint8_t* row) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t i = 0; i < RowBytes(t, k); ++i) row[i] = static_cast<uint8_t>(byte(rng));
  const int64_t nb = k / BlockSize(t), bytes = BlockBytes(t);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = row + b * bytes;
    uint16_t d = 0, m = 0;
    switch (t) {
      case DType::kQ8_0:
      case DType::kQ4_0:
        d = RandomHalf(rng, 0.01f);
        std::memcpy(blk, &d, 2);
        break;
      case DType::kQ4_1:
      case DType::kQ4_K:
        d = RandomHalf(rng, t == DType::kQ4_K ? 0.001f : 0.01f);
        m = RandomHalf(rng, t == DType::kQ4_K ? 0.001f : 0.05f);
        if (t == DType::kQ4_K) {
          d &= 0x7fff;
          m &= 0x7fff;
        }
        std::memcpy(blk, &d, 2);
        std::memcpy(blk + 2, &m, 2);
        break;
      case DType::kQ6_K:
        d = RandomHalf(rng, 0.0005f);
        std::memcpy(blk + 208, &d, 2);
        break;
      case DType::kF8E4M3B32: {
        const float scale = std::ldexp(1.0f, -12 + static_cast<int>(rng() % 4));
        std::memcpy(blk, &scale, 4);
        // e4m3fn has NaN at 0x7f and 0xff only.
        for (int i = 4; i < 36; ++i) blk[i] = (blk[i] & 0x7f) == 0x7f ? 0x7e : blk[i];
        break;
      }
      case DType::kMxfp4:
        blk[0] = static_cast<uint8_t>(118 + rng() % 4);  // 2^-9 .. 2^-6, not the NaN code
        break;
      default:
        break;
    }
  }
}

struct Problem {
  int64_t m, n, k, x_stride, y_stride, w_row_bytes;
  DType type;
  std::vector<float> x;
  std::vector<uint8_t> w;
  std::vector<float> w_deq;  // n x k

  MatmulParams Params(float* y, bool accumulate, ThreadPool* pool) const {
    MatmulParams p;
    p.x = x.data();
    p.x_stride = x_stride;
    p.w = w.data();
    p.w_dtype = type;
    p.w_row_bytes = w_row_bytes;
    p.y = y;
    p.y_stride = y_stride;
    p.m = m;
    p.n = n;
    p.k = k;
    p.accumulate = accumulate;
    p.pool = pool;
    return p;
  }
};

Problem MakeProblem(DType t, int64_t m, int64_t n, int64_t k, uint32_t seed, bool padded) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p{
      m,  n,  k, padded ? k + 5 : k, padded ? n + 3 : n, RowBytes(t, k) + (padded ? 64 : 0), t,
      {}, {}, {}};
  p.x.assign(m * p.x_stride, 0.0f);
  for (int64_t r = 0; r < m; ++r) {
    const float row_scale = std::exp(normal(rng));  // rows of different magnitudes
    for (int64_t i = 0; i < k; ++i) p.x[r * p.x_stride + i] = normal(rng) * row_scale;
    if (k >= 64) p.x[r * p.x_stride + (r * 37) % k] *= 30.0f;  // an outlier per row
    if (r == 2) std::fill_n(p.x.begin() + r * p.x_stride, std::min<int64_t>(k, 32), 0.0f);
  }
  p.w.assign(n * p.w_row_bytes, 0);
  std::vector<float> row(k);
  for (int64_t j = 0; j < n; ++j) {
    uint8_t* dst = p.w.data() + j * p.w_row_bytes;
    if (IsQuantized(t) && j % 3 == 1) {
      RandomRow(t, k, rng, dst);
    } else {
      const float row_scale = 0.05f * std::exp(0.5f * normal(rng));
      for (auto& v : row) v = normal(rng) * row_scale;
      QuantizeRowReference(t, row.data(), dst, k);
    }
  }
  p.w_deq.resize(n * k);
  for (int64_t j = 0; j < n; ++j) {
    DequantizeRow(t, p.w.data() + j * p.w_row_bytes, p.w_deq.data() + j * k, k);
  }
  return p;
}

// Outputs and per-output tolerances of one problem (accumulate off).
struct Expected {
  std::vector<float> exact;      // MatmulReference
  std::vector<float> quantized;  // MatmulQuantizedActivationsReference
  std::vector<double> tight;     // 1e-5 * sum |x||w|
  std::vector<double> loose;     // activation quantization error bound + tight
};

Expected MakeExpected(const Problem& p) {
  Expected e;
  e.exact.assign(p.m * p.y_stride, 0.0f);
  e.quantized.assign(p.m * p.y_stride, 0.0f);
  MatmulReference(p.Params(e.exact.data(), false, nullptr));
  MatmulQuantizedActivationsReference(p.Params(e.quantized.data(), false, nullptr));
  e.tight.assign(p.m * p.n, 0.0);
  e.loose.assign(p.m * p.n, 0.0);
  const int64_t block = IsQuantized(p.type) && HasActFormat(p.type)
                            ? (ActFormatFor(p.type) == ActFormat::kQ8x256 ? 256 : 32)
                            : 1;
  for (int64_t r = 0; r < p.m; ++r) {
    const float* x = p.x.data() + r * p.x_stride;
    for (int64_t j = 0; j < p.n; ++j) {
      const float* w = p.w_deq.data() + j * p.k;
      double mag = 0.0, qerr = 0.0;
      for (int64_t b = 0; b < p.k; b += block) {
        double amax = 0.0, wsum = 0.0;
        for (int64_t i = b; i < b + block; ++i) {
          mag += std::fabs(static_cast<double>(x[i]) * w[i]);
          amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
          wsum += std::fabs(w[i]);
        }
        if (block > 1) qerr += wsum * amax / 127.0 * 0.5;
      }
      e.tight[r * p.n + j] = 1e-5 * mag + 1e-30;
      e.loose[r * p.n + j] = qerr * 1.001 + 1e-5 * mag + 1e-30;
    }
  }
  return e;
}

constexpr DType kTypes[] = {DType::kF32,       DType::kF16,  DType::kBF16, DType::kQ8_0,
                            DType::kQ4_0,      DType::kQ4_1, DType::kQ4_K, DType::kQ6_K,
                            DType::kF8E4M3B32, DType::kMxfp4};

class MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTest, MatchesReferencesOnEveryIsa) {
  const DType type = GetParam();
  ASSERT_TRUE(MatmulSupports(type));
  const std::vector<IsaConfig> isas = AvailableIsas();
  uint32_t seed = 1;
  for (int64_t k : {32, 256, 576, 1536}) {
    if (k % BlockSize(type) != 0) continue;
    for (int64_t m : {1, 2, 3, 7, 16, 33}) {
      for (int64_t n : {1, 5, 64, 257}) {
        const bool padded = (seed % 2) == 0;
        const Problem p = MakeProblem(type, m, n, k, seed++, padded);
        const Expected e = MakeExpected(p);
        std::vector<float> y0(p.m * p.y_stride);
        std::mt19937 rng(seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (auto& v : y0) v = normal(rng);
        for (const IsaConfig& isa : isas) {
          IsaGuard guard(isa);
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &TwoThreads()}) {
            for (bool accumulate : {false, true}) {
              SCOPED_TRACE(isa.name + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                           " k=" + std::to_string(k) + (pool ? " pool" : "") +
                           (accumulate ? " accumulate" : "") + (padded ? " padded" : ""));
              std::vector<float> y = y0;
              Matmul(p.Params(y.data(), accumulate, pool));
              int failures = 0;
              for (int64_t r = 0; r < m && failures < 5; ++r) {
                for (int64_t j = 0; j < n && failures < 5; ++j) {
                  const int64_t o = r * p.y_stride + j;
                  const double base = accumulate ? y0[o] : 0.0;
                  const double slack = accumulate ? 1e-6 * std::fabs(y0[o]) : 0.0;
                  const double got = y[o] - base;
                  const double tq = e.tight[r * n + j] + slack;
                  const double tl = e.loose[r * n + j] + slack;
                  if (std::fabs(got - e.quantized[o]) > tq || std::fabs(got - e.exact[o]) > tl) {
                    ++failures;
                    ADD_FAILURE() << "y[" << r << "," << j << "] = " << got << ", quantized ref "
                                  << e.quantized[o] << " (tol " << tq << "), exact ref "
                                  << e.exact[o] << " (tol " << tl << ")";
                  }
                }
              }
              // Padding between rows of y is never written.
              for (int64_t r = 0; r < m; ++r) {
                for (int64_t j = n; j < p.y_stride; ++j) {
                  ASSERT_EQ(y[r * p.y_stride + j], y0[r * p.y_stride + j]);
                }
              }
              ASSERT_EQ(failures, 0);
            }
          }
        }
      }
    }
  }
}

// Each output is computed the same way whatever the batch, tiling and thread count.
TEST_P(MatmulTest, BatchInvariant) {
  const DType type = GetParam();
  const int64_t k = type == DType::kQ4_K || type == DType::kQ6_K ? 512 : 576;
  const Problem p = MakeProblem(type, 11, 70, k, 99, false);
  for (const IsaConfig& isa : AvailableIsas()) {
    IsaGuard guard(isa);
    SCOPED_TRACE(isa.name);
    std::vector<float> all(p.m * p.n), threaded(p.m * p.n), single(p.n);
    Matmul(p.Params(all.data(), false, nullptr));
    Matmul(p.Params(threaded.data(), false, &TwoThreads()));
    ASSERT_EQ(std::memcmp(all.data(), threaded.data(), all.size() * 4), 0);
    for (int64_t r = 0; r < p.m; ++r) {
      Problem one = p;
      one.m = 1;
      one.x.assign(p.x.begin() + r * p.x_stride, p.x.begin() + (r + 1) * p.x_stride);
      Matmul(one.Params(single.data(), false, nullptr));
      ASSERT_EQ(std::memcmp(single.data(), all.data() + r * p.n, p.n * 4), 0) << "row " << r;
    }
  }
}

// f32 / f16 / bf16 weights take any k (vector tails) and stay within 1e-5 of the double
// reference for long rows.
TEST(MatmulFloat, OddAndLongK) {
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t k : {1, 7, 100, 1000, 4096, 4099}) {
      for (int64_t m : {1, 5}) {
        const Problem p = MakeProblem(type, m, 9, k, static_cast<uint32_t>(k + m), k % 2 == 1);
        const Expected e = MakeExpected(p);
        for (const IsaConfig& isa : AvailableIsas()) {
          IsaGuard guard(isa);
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &TwoThreads()}) {
            SCOPED_TRACE(std::string(DTypeName(type)) + " " + isa.name + " m=" + std::to_string(m) +
                         " k=" + std::to_string(k));
            std::vector<float> y(p.m * p.y_stride, 0.0f);
            Matmul(p.Params(y.data(), false, pool));
            for (int64_t r = 0; r < m; ++r) {
              for (int64_t j = 0; j < p.n; ++j) {
                const int64_t o = r * p.y_stride + j;
                ASSERT_NEAR(y[o], e.exact[o], e.tight[r * p.n + j]) << r << "," << j;
              }
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest, ::testing::ValuesIn(kTypes),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(MatmulMisc, UnsupportedTypesWriteNothing) {
  EXPECT_FALSE(MatmulSupports(DType::kI32));
  EXPECT_FALSE(MatmulSupports(DType::kI64));
  std::vector<float> x(64, 1.0f), y(4, 7.0f);
  std::vector<int32_t> w(128, 1);
  MatmulParams p;
  p.x = x.data();
  p.w = w.data();
  p.w_dtype = DType::kI32;
  p.y = y.data();
  p.m = 1;
  p.n = 2;
  p.k = 64;
  Matmul(p);
  MatmulReference(p);
  for (float v : y) EXPECT_EQ(v, 7.0f);
  // A k that is not a multiple of the block size is rejected as well.
  p.w_dtype = DType::kQ8_0;
  p.k = 48;
  Matmul(p);
  for (float v : y) EXPECT_EQ(v, 7.0f);
}

TEST(MatmulMisc, ZeroK) {
  std::vector<float> y(6, 3.0f);
  MatmulParams p;
  p.y = y.data();
  p.m = 2;
  p.n = 3;
  p.k = 0;
  p.w_dtype = DType::kQ4_1;
  p.accumulate = true;
  Matmul(p);
  for (float v : y) EXPECT_EQ(v, 3.0f);
  p.accumulate = false;
  Matmul(p);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(MatmulMisc, IsaSelection) {
  const Isa before = ActiveIsa();
  SetIsaForTesting(Isa::kAvx512);
  EXPECT_TRUE(IsaSupported(ActiveIsa()));
  SetIsaForTesting(Isa::kScalar);
  EXPECT_EQ(ActiveIsa(), Isa::kScalar);
  SetIsaForTesting(before);
  EXPECT_EQ(IsaName(Isa::kAvx2), "avx2");
}

// ---- Perf mode ----

double Seconds(const std::function<void()>& fn, int min_iters, double min_seconds) {
  fn();  // warm up
  int iters = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0.0;
  while (iters < min_iters || elapsed < min_seconds) {
    fn();
    ++iters;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return elapsed / iters;
}

TEST(MatmulPerf, Throughput) {
  const char* env = std::getenv("DINFER_CONFORMANCE_PERF");
  if (env == nullptr || std::string(env) != "1") GTEST_SKIP() << "set DINFER_CONFORMANCE_PERF=1";
  const char* type_filter = std::getenv("DINFER_PERF_TYPES");  // e.g. "q4_1,q8_0"
  std::printf("%-11s %-5s %6s %5s %4s %3s %10s %8s %9s\n", "isa", "type", "n", "k", "m", "thr",
              "us/call", "GB/s", "GFLOP/s");
  std::unique_ptr<ThreadPool> pool2 = std::make_unique<ThreadPool>(2);
  for (const DType type : kTypes) {
    if (type_filter != nullptr &&
        std::string(type_filter).find(std::string(DTypeName(type))) == std::string::npos) {
      continue;
    }
    for (const int64_t n : {1536, 49152}) {
      const int64_t k = 576 % BlockSize(type) == 0 ? 576 : 512;
      std::mt19937 rng(5);
      std::vector<uint8_t> w(n * RowBytes(type, k));
      if (IsQuantized(type)) {
        for (int64_t j = 0; j < n; ++j) RandomRow(type, k, rng, w.data() + j * RowBytes(type, k));
      } else {
        std::vector<float> row(k);
        std::normal_distribution<float> normal(0.0f, 0.05f);
        for (int64_t j = 0; j < n; ++j) {
          for (auto& v : row) v = normal(rng);
          QuantizeRowReference(type, row.data(), w.data() + j * RowBytes(type, k), k);
        }
      }
      for (const int64_t m : {1, 128}) {
        std::vector<float> x(m * k), y(m * n);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (auto& v : x) v = normal(rng);
        for (const IsaConfig& isa : AvailableIsas()) {
          IsaGuard guard(isa);
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), pool2.get()}) {
            MatmulParams p;
            p.x = x.data();
            p.w = w.data();
            p.w_dtype = type;
            p.y = y.data();
            p.m = m;
            p.n = n;
            p.k = k;
            p.pool = pool;
            const double work = 2.0 * m * n * k;
            if (isa.isa == Isa::kScalar && work > 2e9) continue;  // too slow to matter
            const double s = Seconds([&] { Matmul(p); }, 3, 0.2);
            std::printf("%-11s %-5s %6lld %5lld %4lld %3d %10.1f %8.2f %9.1f\n", isa.name.c_str(),
                        std::string(DTypeName(type)).c_str(), static_cast<long long>(n),
                        static_cast<long long>(k), static_cast<long long>(m),
                        pool ? pool->num_threads() : 1, s * 1e6, w.size() / s / 1e9,
                        work / s / 1e9);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dinfer::kernels::cpu
