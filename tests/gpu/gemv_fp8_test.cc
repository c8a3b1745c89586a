// The staged decode GEMV (GemvFused) with e4m3 weights and one f32 scale per output row, against
// a double-precision product of its input as staged (the CPU reference ops' output rounded to
// bf16) with the values the weight bytes stand for, times the row's scale: each input kind (plain,
// RMSNorm with the residual add, SiLU·mul), one and two rows, Llama-3.1-8B's shapes (rows of
// 4,096 and of 14,336 = 3.5 × 4,096 weights, which end in a half chunk) and odd ones; every
// number of CTAs per multiprocessor gives the same bits; the q/k/v epilogue on e4m3 weights
// against the same GEMV without it followed by QkvRopeKvWrite.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpu_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/qkv.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;
using In = kc::GemvInput;

// Random e4m3 weights: codes of every exponent (subnormals and zero included) and sign, NaN codes
// replaced by ±448; and per-row scales spread over 2^-12 .. 2^-7, so that a scale applied to the
// wrong row shows.
struct Fp8Weights {
  std::vector<uint8_t> bytes;  // [n, k]
  std::vector<float> scale;    // [n]
  std::vector<float> values;   // [n, k]: what the bytes stand for, without the scale
};

Fp8Weights RandomFp8(int64_t n, int64_t k, std::mt19937& rng) {
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

struct Fp8Case {
  int64_t m, n, k;
  In input;
  DType out;
  bool gather = false;  // RMSNorm rows picked by rows_index, no residual written
};

std::ostream& operator<<(std::ostream& os, const Fp8Case& c) {
  return os << c.m << "x" << c.n << "x" << c.k << " input " << static_cast<int>(c.input) << " -> "
            << DTypeName(c.out) << (c.gather ? " gather" : "");
}

class GemvFp8Test : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(GemvFp8Test, MatchesDequantizedProduct) {
  SKIP_WITHOUT_GPU();
  const Fp8Case tc = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(tc.m * 7 + tc.n * 3 + tc.k + static_cast<int>(tc.input)));
  const int64_t res_rows = 3;
  const Fp8Weights w = RandomFp8(tc.n, tc.k, rng);
  auto in = RoundTo(DType::kBF16, Random(tc.m * 2 * tc.k, rng, 2.0f));  // plain / gate|up rows
  auto residual = Random(res_rows * tc.k, rng);
  auto add = RoundTo(DType::kBF16, Random(res_rows * tc.k, rng, 0.5f));
  auto bias = Random(tc.k, rng, 0.1f);
  auto norm_w = Random(tc.k, rng, 0.2f);
  for (auto& v : norm_w) v += 1.0f;
  const std::vector<int32_t> index = {2, 0};
  const bool with_bias = !tc.gather;

  // The input rows as the unfused ops would leave them in bf16 (what the kernel stages).
  std::vector<float> x(tc.m * tc.k), sums(res_rows * tc.k);
  for (int64_t i = 0; i < res_rows * tc.k; ++i) {
    sums[i] = residual[i] + add[i] + (with_bias ? bias[i % tc.k] : 0.0f);
  }
  if (tc.input == In::kPlain) {
    for (int64_t r = 0; r < tc.m; ++r) std::copy_n(&in[r * 2 * tc.k], tc.k, &x[r * tc.k]);
  } else if (tc.input == In::kSiluMul) {
    kernels::cpu::SiluMulParams ref;
    ref.gate = in.data();
    ref.up = in.data() + tc.k;
    ref.out = x.data();
    ref.rows = tc.m;
    ref.dim = tc.k;
    ref.gate_stride = ref.up_stride = 2 * tc.k;
    kernels::cpu::SiluMul(ref);
  } else {
    std::vector<float> rows(tc.m * tc.k);
    for (int64_t r = 0; r < tc.m; ++r) {
      std::copy_n(&sums[(tc.gather ? index[r] : r) * tc.k], tc.k, &rows[r * tc.k]);
    }
    kernels::cpu::RmsNormParams ref;
    ref.x = rows.data();
    ref.weight = norm_w.data();
    ref.out = x.data();
    ref.rows = tc.m;
    ref.dim = tc.k;
    ref.eps = 1e-5f;
    ref.weight_offset = 0.25f;
    kernels::cpu::RmsNormReference(ref);
  }
  x = RoundTo(DType::kBF16, x);
  std::vector<float> want(tc.m * tc.n);
  for (int64_t i = 0; i < tc.m; ++i) {
    for (int64_t j = 0; j < tc.n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < tc.k; ++l) s += double{x[i * tc.k + l]} * w.values[j * tc.k + l];
      want[i * tc.n + j] = static_cast<float>(s * w.scale[j]);
    }
  }

  auto d_w = UploadRaw(w.bytes), d_scale = Upload(w.scale, DType::kF32);
  auto d_in = Upload(in, DType::kBF16);
  auto d_res = Upload(residual, DType::kF32), d_add = Upload(add, DType::kBF16);
  auto d_bias = Upload(bias, DType::kF32), d_norm = Upload(norm_w, DType::kF32);
  auto d_index = UploadRaw(index);
  auto d_res_out = Poisoned(res_rows * tc.k, DType::kF32);
  auto d_y = Poisoned(tc.m * tc.n, tc.out);
  kc::GemvFusedParams p;
  p.gemm.x = d_in.data();
  p.gemm.ldx = 2 * tc.k;
  p.gemm.w = d_w.data();
  p.gemm.ldw = tc.k;
  p.gemm.y = d_y.data();
  p.gemm.ldy = tc.n;
  p.gemm.m = tc.m;
  p.gemm.n = tc.n;
  p.gemm.k = tc.k;
  p.gemm.out_dtype = tc.out;
  p.w_dtype = DType::kF8E4M3;
  p.w_scale = static_cast<const float*>(d_scale.data());
  p.input = tc.input;
  p.residual = static_cast<const float*>(d_res.data());
  p.add = d_add.data();
  p.add_bias = with_bias ? static_cast<const float*>(d_bias.data()) : nullptr;
  p.rows_index = tc.gather ? static_cast<const int32_t*>(d_index.data()) : nullptr;
  const bool writes = tc.input == In::kRmsNorm && !tc.gather;
  p.residual_out = writes ? static_cast<float*>(d_res_out.data()) : nullptr;
  p.norm_weight = static_cast<const float*>(d_norm.data());
  p.eps = 1e-5f;
  p.weight_offset = 0.25f;
  ASSERT_TRUE(kc::GemvFusedSupports(p));
  ASSERT_CUDA_OK(kc::GemvFused(p, nullptr));
  // f32 output of the plain input: the products are exact in f32 (8 x 4 significant bits), only
  // the f32 sums round (k <= 14,336 terms: ~1e-6). The fused inputs may stage a few elements on
  // the other bf16 neighbour than the CPU ops (their f32 sums in another order): 1e-3 as the bf16
  // test. bf16 output: the rounded reference, each element at most one ulp (2^-8) off.
  const double tol = tc.out == DType::kBF16 ? 1.0 / 256 : tc.input == In::kPlain ? 1e-5 : 1e-3;
  const double err = RelError(Download(d_y, tc.m * tc.n, tc.out), RoundTo(tc.out, want));
  EXPECT_LE(err, tol);
  std::printf("%lldx%lldx%lld input %d -> %s: relative error %.3g\n", static_cast<long long>(tc.m),
              static_cast<long long>(tc.n), static_cast<long long>(tc.k),
              static_cast<int>(tc.input), std::string(DTypeName(tc.out)).c_str(), err);
  if (writes) {
    const auto got = Download(d_res_out, res_rows * tc.k, DType::kF32);
    for (int64_t i = 0; i < tc.m * tc.k; ++i) ASSERT_EQ(got[i], sums[i]) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvFp8Test,
    ::testing::Values(
        // Llama-3.1-8B: q/k/v and gate/up after the RMSNorms, o, down after SiLU·mul.
        Fp8Case{1, 6144, 4096, In::kRmsNorm, DType::kBF16},
        Fp8Case{2, 6144, 4096, In::kRmsNorm, DType::kF32},
        Fp8Case{1, 28672, 4096, In::kRmsNorm, DType::kBF16},
        Fp8Case{2, 28672, 4096, In::kRmsNorm, DType::kBF16},
        Fp8Case{1, 4096, 4096, In::kPlain, DType::kBF16},
        Fp8Case{2, 4096, 4096, In::kPlain, DType::kF32},
        Fp8Case{1, 4096, 14336, In::kSiluMul, DType::kBF16},
        Fp8Case{2, 4096, 14336, In::kSiluMul, DType::kF32},
        Fp8Case{1, 4096, 14336, In::kPlain, DType::kF32},
        // Odd: few rows, rows of one half chunk, rows of 1.5 chunks, the gathered final norm.
        Fp8Case{1, 300, 2048, In::kPlain, DType::kF32},
        Fp8Case{2, 300, 2048, In::kRmsNorm, DType::kBF16},
        Fp8Case{2, 300, 2048, In::kSiluMul, DType::kF32},
        Fp8Case{1, 777, 6144, In::kSiluMul, DType::kBF16},
        Fp8Case{2, 5, 6144, In::kPlain, DType::kF32},
        Fp8Case{2, 2001, 2048, In::kRmsNorm, DType::kF32, true}));

// CTAs per multiprocessor move rows between CTAs, not the order of any row's sum: every choice
// gives the bits of the default, which matches the double product.
TEST(GemvFp8LaunchTest, EveryChoiceGivesTheSameBits) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t m, n, k, group_n;
    DType out;
  };
  const Case cases[] = {{1, 3000, 4096, 0, DType::kF32},   {2, 777, 14336, 0, DType::kF32},
                        {1, 1001, 14336, 0, DType::kBF16}, {1, 5, 2048, 0, DType::kF32},
                        {2, 257, 6144, 0, DType::kF32},    {1, 8 * 130, 4096, 130, DType::kBF16},
                        {2, 4 * 96, 2048, 96, DType::kF32}};
  for (const Case& tc : cases) {
    SCOPED_TRACE(testing::Message()
                 << tc.m << "x" << tc.n << "x" << tc.k << " group " << tc.group_n);
    const int64_t groups = tc.group_n > 0 ? tc.n / tc.group_n : 1, ldx = groups * tc.k;
    std::mt19937 rng(static_cast<uint32_t>(tc.m * 5 + tc.n + tc.k));
    auto x = RoundTo(DType::kBF16, Random(tc.m * ldx, rng));
    const Fp8Weights w = RandomFp8(tc.n, tc.k, rng);
    std::vector<float> want(tc.m * tc.n);
    for (int64_t i = 0; i < tc.m; ++i) {
      for (int64_t j = 0; j < tc.n; ++j) {
        const int64_t g = tc.group_n > 0 ? j / tc.group_n : 0;
        double s = 0;
        for (int64_t l = 0; l < tc.k; ++l) {
          s += double{x[i * ldx + g * tc.k + l]} * w.values[j * tc.k + l];
        }
        want[i * tc.n + j] = static_cast<float>(s * w.scale[j]);
      }
    }
    auto d_x = Upload(x, DType::kBF16), d_w = UploadRaw(w.bytes);
    auto d_scale = Upload(w.scale, DType::kF32);
    kc::GemvFusedParams p;
    p.gemm.x = d_x.data();
    p.gemm.ldx = ldx;
    p.gemm.w = d_w.data();
    p.gemm.ldw = tc.k;
    p.gemm.ldy = tc.n;
    p.gemm.m = tc.m;
    p.gemm.n = tc.n;
    p.gemm.k = tc.k;
    p.gemm.out_dtype = tc.out;
    p.gemm.group_n = tc.group_n;
    p.w_dtype = DType::kF8E4M3;
    p.w_scale = static_cast<const float*>(d_scale.data());
    auto run = [&](int per_sm) {
      auto d_y = Poisoned(tc.m * tc.n, tc.out);
      kc::GemvFusedParams q = p;
      q.gemm.y = d_y.data();
      q.blocks_per_sm = per_sm;
      EXPECT_TRUE(kc::GemvFusedSupports(q));
      EXPECT_EQ(kc::GemvFused(q, nullptr), 0);
      return Download(d_y, tc.m * tc.n, tc.out);
    };
    const std::vector<float> base = run(0);
    EXPECT_LE(RelError(base, RoundTo(tc.out, want)), tc.out == DType::kF32 ? 1e-5 : 1.0 / 256);
    for (int per_sm : {1, 2, 3, 4}) {
      const std::vector<float> got = run(per_sm);
      ASSERT_EQ(got.size(), base.size());
      EXPECT_EQ(std::memcmp(got.data(), base.data(), got.size() * sizeof(float)), 0)
          << per_sm << " CTAs per multiprocessor";
    }
  }
}

TEST(GemvFp8SupportsTest, NeedsScalesAndAKnownWeightType) {
  SKIP_WITHOUT_GPU();
  alignas(16) static float dummy[16];
  kc::GemvFusedParams p;
  p.gemm.x = dummy;
  p.gemm.ldx = 2048;
  p.gemm.w = dummy;
  p.gemm.y = dummy;
  p.gemm.ldw = 2048;
  p.gemm.ldy = 64;
  p.gemm.m = 1;
  p.gemm.n = 64;
  p.gemm.k = 2048;
  p.w_dtype = DType::kF8E4M3;
  p.w_scale = dummy;
  EXPECT_TRUE(kc::GemvFusedSupports(p));
  kc::GemvFusedParams q = p;
  q.w_scale = nullptr;
  EXPECT_FALSE(kc::GemvFusedSupports(q));
  q = p;
  q.w_dtype = DType::kF32;
  EXPECT_FALSE(kc::GemvFusedSupports(q));
  q = p;
  q.gemm.k = q.gemm.ldw = 3072;  // not a multiple of 2,048
  EXPECT_FALSE(kc::GemvFusedSupports(q));
  q = p;
  q.gemm.w = reinterpret_cast<const char*>(dummy) + 8;
  EXPECT_FALSE(kc::GemvFusedSupports(q));
}

// The q/k/v epilogue on e4m3 weights against the same GEMV without it, then QkvRopeKvWrite. The
// unfused path rounds the (scaled) sums to bf16 before the bias and the rotation, the epilogue
// does not: outputs may differ by about one bf16 ulp (one e4m3 step in FP8 caches).
struct QkvCase {
  int64_t heads, kv_heads, head_dim, rotary_dim;
  bool interleaved, bias;
  int64_t m, k;
  float fp8_scale = 0.0f;  // > 0: e4m3 caches holding K / scale and V / scale
};

std::ostream& operator<<(std::ostream& os, const QkvCase& c) {
  return os << c.heads << "/" << c.kv_heads << " heads of " << c.head_dim << " rotary "
            << c.rotary_dim << (c.interleaved ? " interleaved" : " halves")
            << (c.bias ? " bias" : "") << " m" << c.m << " k" << c.k
            << (c.fp8_scale > 0 ? " fp8 cache" : "");
}

// The spacing of e4m3 values around |v| (subnormals below 2^-6).
float E4M3Step(float v) {
  const float a = std::fabs(v);
  return a < 0.015625f ? 0.001953125f : std::ldexp(1.0f, std::ilogb(a) - 3);
}

class GemvFp8QkvTest : public ::testing::TestWithParam<QkvCase> {};

TEST_P(GemvFp8QkvTest, MatchesGemvThenQkvRopeKvWrite) {
  SKIP_WITHOUT_GPU();
  const QkvCase tc = GetParam();
  const int64_t d = tc.head_dim, q_dim = tc.heads * d, kv_dim = tc.kv_heads * d;
  const int64_t n = q_dim + 2 * kv_dim, k = tc.k, m = tc.m;
  const int64_t block_size = 16, num_blocks = 6, cache_rows = num_blocks * block_size;
  const int64_t cache_elems = cache_rows * kv_dim;
  const bool fp8 = tc.fp8_scale > 0.0f;
  std::mt19937 rng(static_cast<uint32_t>(n * 13 + k + m * 7 + d));
  const Fp8Weights w = RandomFp8(n, k, rng);
  auto residual = Random(m * k, rng, 3.0f);
  auto norm_w = Random(k, rng, 0.2f);
  for (auto& v : norm_w) v += 1.0f;
  auto bias = Random(n, rng, 0.3f);
  std::vector<float> inv_freq(std::max<int64_t>(tc.rotary_dim / 2, 1));
  for (int64_t i = 0; i < tc.rotary_dim / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(500000.0f, 2.0f * i / tc.rotary_dim);
  }
  const std::vector<int32_t> positions = {4093, 17};
  const std::vector<int64_t> slots = {3 * block_size + 5, 1 * block_size + 14};

  auto d_w = UploadRaw(w.bytes), d_scale = Upload(w.scale, DType::kF32);
  auto d_res = Upload(residual, DType::kF32);
  auto d_norm = Upload(norm_w, DType::kF32), d_bias = Upload(bias, DType::kF32);
  auto d_freq = Upload(inv_freq, DType::kF32);
  auto d_pos = UploadRaw(positions);
  auto d_slots = UploadRaw(slots);
  auto cache = [&] {
    return fp8 ? UploadRaw(std::vector<uint8_t>(cache_elems, 0xff))
               : Poisoned(cache_elems, DType::kBF16);
  };
  const size_t cache_bytes = static_cast<size_t>(cache_elems) * (fp8 ? 1 : 2);

  kc::GemvFusedParams p;
  p.gemm.w = d_w.data();
  p.gemm.ldw = k;
  p.gemm.ldy = n;
  p.gemm.m = m;
  p.gemm.n = n;
  p.gemm.k = k;
  p.gemm.out_dtype = DType::kBF16;
  p.w_dtype = DType::kF8E4M3;
  p.w_scale = static_cast<const float*>(d_scale.data());
  p.input = In::kRmsNorm;
  p.residual = static_cast<const float*>(d_res.data());
  p.norm_weight = static_cast<const float*>(d_norm.data());
  p.eps = 1e-5f;

  auto ref_qkv = Poisoned(m * n, DType::kBF16);
  auto ref_k = cache(), ref_v = cache();
  {
    kc::GemvFusedParams r = p;
    r.gemm.y = ref_qkv.data();
    ASSERT_TRUE(kc::GemvFusedSupports(r));
    ASSERT_CUDA_OK(kc::GemvFused(r, nullptr));
    kc::QkvParams q;
    q.qkv = ref_qkv.data();
    q.qkv_stride = n;
    q.dtype = DType::kBF16;
    q.num_tokens = m;
    q.num_heads = tc.heads;
    q.num_kv_heads = tc.kv_heads;
    q.head_dim = d;
    q.bias = tc.bias ? static_cast<const float*>(d_bias.data()) : nullptr;
    q.positions = static_cast<const int32_t*>(d_pos.data());
    q.inv_freq = static_cast<const float*>(d_freq.data());
    q.rotary_dim = tc.rotary_dim;
    q.interleaved = tc.interleaved;
    q.k_cache = ref_k.data();
    q.v_cache = ref_v.data();
    q.kv_fp8 = fp8;
    q.k_scale = q.v_scale = fp8 ? tc.fp8_scale : 1.0f;
    q.slot_mapping = static_cast<const int64_t*>(d_slots.data());
    ASSERT_CUDA_OK(kc::QkvRopeKvWrite(q, nullptr));
  }
  const auto want_q = Download(ref_qkv, m * n, DType::kBF16);
  const auto want_k = DownloadRaw<uint8_t>(ref_k, cache_bytes);
  const auto want_v = DownloadRaw<uint8_t>(ref_v, cache_bytes);

  kc::GemvQkvEpilogue e;
  e.num_heads = tc.heads;
  e.num_kv_heads = tc.kv_heads;
  e.head_dim = d;
  e.bias = tc.bias ? static_cast<const float*>(d_bias.data()) : nullptr;
  e.positions = static_cast<const int32_t*>(d_pos.data());
  e.inv_freq = static_cast<const float*>(d_freq.data());
  e.rotary_dim = tc.rotary_dim;
  e.interleaved = tc.interleaved;
  e.kv_fp8 = fp8;
  e.k_scale = e.v_scale = fp8 ? tc.fp8_scale : 1.0f;
  e.slot_mapping = static_cast<const int64_t*>(d_slots.data());

  for (int per_sm : {0, 1, 2, 4}) {
    SCOPED_TRACE(testing::Message() << per_sm << " CTAs per multiprocessor");
    auto d_y = Poisoned(m * n, DType::kBF16);
    auto d_k = cache(), d_v = cache();
    kc::GemvQkvEpilogue ep = e;
    ep.k_cache = d_k.data();
    ep.v_cache = d_v.data();
    kc::GemvFusedParams f = p;
    f.gemm.y = d_y.data();
    f.blocks_per_sm = per_sm;
    f.qkv = &ep;
    ASSERT_TRUE(kc::GemvFusedSupports(f));
    ASSERT_CUDA_OK(kc::GemvFused(f, nullptr));
    ASSERT_STATUS_OK(cuda::Synchronize());

    const auto y_raw = DownloadRaw<uint16_t>(d_y, m * n);
    const auto y = Download(d_y, m * n, DType::kBF16);
    for (int64_t r = 0; r < m; ++r) {
      SCOPED_TRACE(testing::Message() << "token " << r);
      std::vector<float> got(y.begin() + r * n, y.begin() + r * n + q_dim);
      std::vector<float> want(want_q.begin() + r * n, want_q.begin() + r * n + q_dim);
      EXPECT_LE(RelError(got, want), Tolerance(DType::kBF16));
      for (int64_t j = q_dim; j < n; ++j) {
        ASSERT_EQ(y_raw[r * n + j], 0xffff) << "y column " << j << " written";
      }
    }

    const auto got_k = DownloadRaw<uint8_t>(d_k, cache_bytes);
    const auto got_v = DownloadRaw<uint8_t>(d_v, cache_bytes);
    auto raw = [&](int64_t r, int64_t col) { return want_q[r * n + col]; };
    auto check_cache = [&](const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                           bool is_v) {
      SCOPED_TRACE(is_v ? "v cache" : "k cache");
      const size_t row_bytes = static_cast<size_t>(kv_dim) * (fp8 ? 1 : 2);
      for (int64_t s = 0; s < cache_rows; ++s) {
        const int64_t r = std::find(slots.begin(), slots.begin() + m, s) - slots.begin();
        const uint8_t* g = got.data() + s * row_bytes;
        const uint8_t* wv = want.data() + s * row_bytes;
        if (r >= m) {
          for (size_t b = 0; b < row_bytes; ++b) ASSERT_EQ(g[b], 0xff) << "slot " << s;
          continue;
        }
        std::vector<float> gf(kv_dim), wf(kv_dim);
        for (int64_t j = 0; j < kv_dim; ++j) {
          if (fp8) {
            gf[j] = kernels::cpu::E4M3ToF32(g[j]) * tc.fp8_scale;
            wf[j] = kernels::cpu::E4M3ToF32(wv[j]) * tc.fp8_scale;
            // One e4m3 step, plus the unfused path's bf16 rounding of the element's sum and its
            // rotary partner's (2^-8 relative each at most), 1% more for f32 arithmetic.
            const int64_t col = (is_v ? q_dim + kv_dim : q_dim) + j, i = j % d;
            float pre = std::fabs(raw(r, col));
            if (!is_v && i < tc.rotary_dim) {
              const int64_t half = tc.rotary_dim / 2;
              const int64_t partner = tc.interleaved ? (i % 2 == 0 ? col + 1 : col - 1)
                                                     : (i < half ? col + half : col - half);
              pre += std::fabs(raw(r, partner));
            }
            const float step =
                E4M3Step(std::max(std::fabs(gf[j]), std::fabs(wf[j])) / tc.fp8_scale) *
                tc.fp8_scale;
            ASSERT_LE(std::fabs(gf[j] - wf[j]), step + std::ldexp(pre, -8) * 1.01f + 1e-7f)
                << "slot " << s << " element " << j;
          } else {
            uint16_t gb, wb;
            std::memcpy(&gb, g + 2 * j, 2);
            std::memcpy(&wb, wv + 2 * j, 2);
            gf[j] = Bf16ToF32(gb);
            wf[j] = Bf16ToF32(wb);
          }
        }
        // bf16: about an ulp on some elements. e4m3: beyond the element bound above, the two
        // quantizations agree except where the unrounded value lies within the bf16 rounding
        // of a midpoint between codes (a few percent of elements, 4% in the worst case seen);
        // a row norm is no measure here, as one of the few large elements of a row of
        // heavy-tailed e4m3 products on the other code moves it by 5%.
        if (fp8) {
          int64_t differ = 0;
          for (int64_t j = 0; j < kv_dim; ++j) differ += g[j] != wv[j];
          EXPECT_LE(differ, kv_dim / 8) << "slot " << s << ": codes unlike the unfused path's";
        } else {
          EXPECT_LE(RelError(gf, wf), Tolerance(DType::kBF16)) << "slot " << s;
        }
      }
    };
    check_cache(got_k, want_k, false);
    check_cache(got_v, want_v, true);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvFp8QkvTest,
                         ::testing::Values(
                             // Llama-3.1-8B's q/k/v, bf16 and e4m3 caches.
                             QkvCase{32, 8, 128, 128, false, false, 1, 4096},
                             QkvCase{32, 8, 128, 128, false, true, 2, 4096, 0.25f},
                             // Partial rotary, both pair layouts; rows ending in a half chunk.
                             QkvCase{16, 4, 64, 32, true, true, 2, 2048},
                             QkvCase{16, 4, 64, 64, false, false, 1, 6144, 1.0f},
                             // 1,120 rows: odd rows per CTA before rounding; head_dim 80.
                             QkvCase{10, 2, 80, 48, true, true, 1, 14336},
                             QkvCase{10, 2, 80, 80, false, true, 2, 2048, 0.5f}));

// Bandwidth of the staged GEMV on Llama-3.1-8B's decode shapes, e4m3 against bf16 weights
// (DINFER_GEMV_PERF=1): 20 programmatic dependent launches in a row, weights rotating over
// copies of 256 MB or more (cold in the L2); GB/s of weight bytes and microseconds a launch.
TEST(GemvFp8Perf, DecodeShapes) {
  SKIP_WITHOUT_GPU();
  if (std::getenv("DINFER_GEMV_PERF") == nullptr) GTEST_SKIP() << "DINFER_GEMV_PERF=1 times it";
  struct Shape {
    const char* name;
    int64_t n, k;
    In input;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096, In::kRmsNorm},
                          {"o", 4096, 4096, In::kPlain},
                          {"gate_up", 28672, 4096, In::kRmsNorm},
                          {"down", 4096, 14336, In::kSiluMul}};
  cudaStream_t st = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ASSERT_CUDA_OK(cudaEventCreate(&e0));
  ASSERT_CUDA_OK(cudaEventCreate(&e1));
  for (const Shape& sh : shapes) {
    for (int64_t m : {1, 2}) {
      std::printf("%-8s m %lld", sh.name, static_cast<long long>(m));
      for (DType wt : {DType::kBF16, DType::kF8E4M3}) {
        for (int per_sm : {0, 2}) {
          const int64_t elem = wt == DType::kBF16 ? 2 : 1, w_bytes = sh.n * sh.k * elem;
          const int64_t copies =
              std::max<int64_t>(2, ((int64_t{256} << 20) + w_bytes - 1) / w_bytes);
          void *w = nullptr, *x = nullptr, *y = nullptr, *res = nullptr, *scale = nullptr;
          ASSERT_CUDA_OK(cudaMalloc(&w, copies * w_bytes));
          ASSERT_CUDA_OK(cudaMalloc(&x, 2 * 2 * sh.k * 2));
          ASSERT_CUDA_OK(cudaMalloc(&res, 2 * sh.k * 4 + 4 * sh.k));
          ASSERT_CUDA_OK(cudaMalloc(&y, 2 * sh.n * 2));
          ASSERT_CUDA_OK(cudaMalloc(&scale, sh.n * 4));
          ASSERT_CUDA_OK(cudaMemset(w, 0x3c, copies * w_bytes));
          ASSERT_CUDA_OK(cudaMemset(x, 0x3c, 2 * 2 * sh.k * 2));
          ASSERT_CUDA_OK(cudaMemset(res, 0x3c, 2 * sh.k * 4 + 4 * sh.k));
          ASSERT_CUDA_OK(cudaMemset(scale, 0x3c, sh.n * 4));
          kc::GemvFusedParams f;
          f.gemm.x = x;
          f.gemm.ldx = 2 * sh.k;
          f.gemm.ldw = sh.k;
          f.gemm.y = y;
          f.gemm.ldy = sh.n;
          f.gemm.m = m;
          f.gemm.n = sh.n;
          f.gemm.k = sh.k;
          f.gemm.out_dtype = DType::kBF16;
          f.input = sh.input;
          f.residual = static_cast<const float*>(res);
          f.norm_weight = static_cast<const float*>(res) + 2 * sh.k;
          f.blocks_per_sm = per_sm;
          f.w_dtype = wt;
          f.w_scale = static_cast<const float*>(scale);
          f.gemm.w = w;
          ASSERT_TRUE(kc::GemvFusedSupports(f));
          int64_t i = 0;
          auto launch = [&] {
            f.gemm.w = static_cast<char*>(w) + (i++ % copies) * w_bytes;
            return kc::GemvFused(f, st);
          };
          for (int r = 0; r < 3; ++r) ASSERT_CUDA_OK(launch());
          constexpr int kChain = 20;
          std::vector<float> times;
          for (int r = 0; r < 6; ++r) {
            ASSERT_CUDA_OK(cudaEventRecord(e0, st));
            for (int c = 0; c < kChain; ++c) ASSERT_CUDA_OK(launch());
            ASSERT_CUDA_OK(cudaEventRecord(e1, st));
            ASSERT_CUDA_OK(cudaEventSynchronize(e1));
            float ms = 0;
            ASSERT_CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
            if (r > 0) times.push_back(ms / kChain);
          }
          std::sort(times.begin(), times.end());
          const double ms = times[times.size() / 2];
          std::printf("  %s/%d %5.0f GB/s %6.1f us", wt == DType::kBF16 ? "bf16" : "e4m3", per_sm,
                      w_bytes / ms / 1e6, ms * 1e3);
          ASSERT_CUDA_OK(cudaFree(w));
          ASSERT_CUDA_OK(cudaFree(x));
          ASSERT_CUDA_OK(cudaFree(res));
          ASSERT_CUDA_OK(cudaFree(y));
          ASSERT_CUDA_OK(cudaFree(scale));
        }
      }
      std::printf("\n");
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
}

}  // namespace
}  // namespace dinfer
