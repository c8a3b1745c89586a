// The fused q/k/v post-processing kernel (bias, per-head RMSNorm, rotary embedding in both pair
// layouts, partial rotary, paged KV write, into a bf16/f32 or an e4m3 cache) against the CPU
// reference ops applied one by one.
#include <algorithm>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/qkv.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;

struct QkvCase {
  DType dtype;
  int64_t head_dim, rotary_dim;
  bool interleaved, bias, norm;
  float fp8_scale = 0.0f;  // > 0: an e4m3 cache holding K / scale and V / scale
};

std::ostream& operator<<(std::ostream& os, const QkvCase& c) {
  return os << DTypeName(c.dtype) << " d" << c.head_dim << " rotary " << c.rotary_dim
            << (c.interleaved ? " interleaved" : " halves") << (c.bias ? " bias" : "")
            << (c.norm ? " qk-norm" : "")
            << (c.fp8_scale > 0 ? " fp8 scale " + std::to_string(c.fp8_scale) : "");
}

class QkvTest : public ::testing::TestWithParam<QkvCase> {};

TEST_P(QkvTest, MatchesCpuOps) {
  SKIP_WITHOUT_GPU();
  const QkvCase tc = GetParam();
  const int64_t tokens = 23, heads = 8, kv_heads = 2, d = tc.head_dim;
  const int64_t q_dim = heads * d, kv_dim = kv_heads * d, width = q_dim + 2 * kv_dim;
  const int64_t block_size = 16, num_blocks = 8;
  std::mt19937 rng(static_cast<uint32_t>(d * 31 + tc.rotary_dim));
  auto qkv = RoundTo(tc.dtype, Random(tokens * width, rng));
  auto bias = Random(width, rng, 0.3f);
  auto q_norm = Random(d, rng, 0.1f), k_norm = Random(d, rng, 0.1f);
  for (auto& w : q_norm) w += 1.0f;
  for (auto& w : k_norm) w += 1.0f;
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(100 + 37 * t);
  std::vector<float> inv_freq(tc.rotary_dim / 2);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    inv_freq[i] = 1.0f / std::pow(10000.0f, 2.0f * i / tc.rotary_dim);
  }
  std::vector<int64_t> slots(num_blocks * block_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(tokens);

  // Reference: bias, head norms, rope on separate q and k arrays; v with its bias.
  std::vector<float> q(tokens * q_dim), k(tokens * kv_dim), v(tokens * kv_dim);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < width; ++i) {
      const float x = qkv[t * width + i] + (tc.bias ? bias[i] : 0.0f);
      if (i < q_dim) {
        q[t * q_dim + i] = x;
      } else if (i < q_dim + kv_dim) {
        k[t * kv_dim + i - q_dim] = x;
      } else {
        v[t * kv_dim + i - q_dim - kv_dim] = x;
      }
    }
  }
  auto head_norm = [&](std::vector<float>& x, int64_t n_heads, const std::vector<float>& w) {
    kernels::cpu::RmsNormParams p;
    p.x = x.data();
    p.out = x.data();
    p.weight = w.data();
    p.rows = tokens * n_heads;
    p.dim = d;
    p.eps = 1e-6f;
    kernels::cpu::RmsNormReference(p);
  };
  if (tc.norm) {
    head_norm(q, heads, q_norm);
    head_norm(k, kv_heads, k_norm);
  }
  auto rope = [&](std::vector<float>& x, int64_t n_heads) {
    kernels::cpu::RopeParams p;
    p.x = x.data();
    p.rows = tokens;
    p.num_heads = n_heads;
    p.head_dim = d;
    p.rotary_dim = tc.rotary_dim;
    p.positions = positions.data();
    p.inv_freq = inv_freq.data();
    p.interleaved = tc.interleaved;
    kernels::cpu::RopeReference(p);
  };
  rope(q, heads);
  rope(k, kv_heads);

  auto d_qkv = Upload(qkv, tc.dtype);
  auto d_bias = Upload(bias, DType::kF32);
  auto d_qn = Upload(q_norm, DType::kF32), d_kn = Upload(k_norm, DType::kF32);
  auto d_pos = UploadRaw(positions);
  auto d_freq = Upload(inv_freq, DType::kF32);
  auto d_slots = UploadRaw(slots);
  const int64_t cache_elems = num_blocks * block_size * kv_dim;
  const bool fp8 = tc.fp8_scale > 0.0f;
  // 0xff poisons e4m3 too (NaN).
  auto d_k =
      fp8 ? UploadRaw(std::vector<uint8_t>(cache_elems, 0xff)) : Poisoned(cache_elems, tc.dtype);
  auto d_v =
      fp8 ? UploadRaw(std::vector<uint8_t>(cache_elems, 0xff)) : Poisoned(cache_elems, tc.dtype);
  kc::QkvParams p;
  p.qkv = d_qkv.data();
  p.qkv_stride = width;
  p.dtype = tc.dtype;
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = d;
  p.bias = tc.bias ? static_cast<const float*>(d_bias.data()) : nullptr;
  p.q_norm = tc.norm ? static_cast<const float*>(d_qn.data()) : nullptr;
  p.k_norm = tc.norm ? static_cast<const float*>(d_kn.data()) : nullptr;
  p.norm_eps = 1e-6f;
  p.positions = static_cast<const int32_t*>(d_pos.data());
  p.inv_freq = static_cast<const float*>(d_freq.data());
  p.rotary_dim = tc.rotary_dim;
  p.interleaved = tc.interleaved;
  p.k_cache = d_k.data();
  p.v_cache = d_v.data();
  p.slot_mapping = static_cast<const int64_t*>(d_slots.data());
  p.kv_fp8 = fp8;
  p.k_scale = p.v_scale = fp8 ? tc.fp8_scale : 1.0f;
  ASSERT_CUDA_OK(kc::QkvRopeKvWrite(p, nullptr));

  const auto got_qkv = Download(d_qkv, tokens * width, tc.dtype);
  const auto got_k = fp8 ? DequantizeE4M3(DownloadRaw<uint8_t>(d_k, cache_elems), tc.fp8_scale)
                         : Download(d_k, cache_elems, tc.dtype);
  const auto got_v = fp8 ? DequantizeE4M3(DownloadRaw<uint8_t>(d_v, cache_elems), tc.fp8_scale)
                         : Download(d_v, cache_elems, tc.dtype);
  std::vector<float> gq(tokens * q_dim), gk(tokens * kv_dim), gv(tokens * kv_dim);
  for (int64_t t = 0; t < tokens; ++t) {
    std::copy_n(got_qkv.begin() + t * width, q_dim, gq.begin() + t * q_dim);
    std::copy_n(got_k.begin() + slots[t] * kv_dim, kv_dim, gk.begin() + t * kv_dim);
    std::copy_n(got_v.begin() + slots[t] * kv_dim, kv_dim, gv.begin() + t * kv_dim);
  }
  // Angles reach 100 + 37 * 22 radians: f32 sin/cos of large arguments cost a few ulps.
  const double tol = tc.dtype == DType::kF32 ? 1e-5 : Tolerance(tc.dtype);
  EXPECT_LE(RelError(gq, RoundTo(tc.dtype, q)), tol);
  if (fp8) {
    // The device quantizes its f32 values; a value within an ulp of f32 of a rounding midpoint
    // may round the other way, so a few elements may differ by one e4m3 step.
    EXPECT_LE(RelError(gk, DequantizeE4M3(QuantizeE4M3(k, tc.fp8_scale), tc.fp8_scale)), tol);
    EXPECT_LE(RelError(gv, DequantizeE4M3(QuantizeE4M3(v, tc.fp8_scale), tc.fp8_scale)), tol);
  } else {
    EXPECT_LE(RelError(gk, RoundTo(tc.dtype, k)), tol);
    EXPECT_LE(RelError(gv, RoundTo(tc.dtype, v)), tol);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, QkvTest,
    ::testing::Values(QkvCase{DType::kF32, 16, 16, false, true, false},
                      QkvCase{DType::kF32, 24, 24, true, false, true},
                      QkvCase{DType::kF32, 128, 64, false, true, true},
                      QkvCase{DType::kBF16, 128, 128, false, false, true},
                      QkvCase{DType::kBF16, 64, 32, true, true, false},
                      QkvCase{DType::kBF16, 256, 256, false, true, false},
                      QkvCase{DType::kBF16, 128, 128, false, true, true, 1.0f},
                      QkvCase{DType::kBF16, 64, 32, true, false, false, 0.125f},
                      QkvCase{DType::kF32, 128, 64, false, true, false, 4.0f},
                      // Heads of other than a multiple of 8 bf16 elements: one element at a time.
                      QkvCase{DType::kBF16, 12, 12, false, true, true},
                      QkvCase{DType::kBF16, 20, 10, true, false, false, 0.5f}));

}  // namespace
}  // namespace dinfer
