// The staged GEMV's q/k/v epilogue (GemvFusedParams::qkv: rotary embedding, bias, paged KV-cache
// write done on the GEMV's sums), on bf16 and on e4m3 weights, against the unfused path on the
// device: the same GemvFused without the epilogue into a q|k|v buffer, then QkvRopeKvWrite. The
// unfused path rounds the GEMV's sums to bf16 before the bias and the rotation, the epilogue does
// not: outputs may differ by about one bf16 ulp (one e4m3 step in FP8 caches), far below what a
// wrong row permutation, pair, angle or slot gives.
#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/qkv.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;

struct QkvGemvCase {
  int64_t heads, kv_heads, head_dim, rotary_dim;
  bool interleaved, bias;
  int64_t m, k;
  float fp8_scale = 0.0f;    // > 0: e4m3 caches holding K / scale and V / scale
  bool fp8_weights = false;  // e4m3 weights with a scale per row (RandomFp8)
};

std::ostream& operator<<(std::ostream& os, const QkvGemvCase& c) {
  return os << c.heads << "/" << c.kv_heads << " heads of " << c.head_dim << " rotary "
            << c.rotary_dim << (c.interleaved ? " interleaved" : " halves")
            << (c.bias ? " bias" : "") << " m" << c.m << " k" << c.k
            << (c.fp8_scale > 0 ? " fp8 scale " + std::to_string(c.fp8_scale) : "")
            << (c.fp8_weights ? " e4m3 weights" : "");
}

// The spacing of e4m3 values around |v| (subnormals below 2^-6).
float E4M3Step(float v) {
  const float a = std::fabs(v);
  return a < 0.015625f ? 0.001953125f : std::ldexp(1.0f, std::ilogb(a) - 3);
}

class GemvQkvTest : public ::testing::TestWithParam<QkvGemvCase> {};

TEST_P(GemvQkvTest, MatchesGemvThenQkvRopeKvWrite) {
  SKIP_WITHOUT_GPU();
  const QkvGemvCase tc = GetParam();
  const int64_t d = tc.head_dim, q_dim = tc.heads * d, kv_dim = tc.kv_heads * d;
  const int64_t n = q_dim + 2 * kv_dim, k = tc.k, m = tc.m;
  const int64_t block_size = 16, num_blocks = 6, cache_rows = num_blocks * block_size;
  const int64_t cache_elems = cache_rows * kv_dim;
  const bool fp8 = tc.fp8_scale > 0.0f;
  std::mt19937 rng(static_cast<uint32_t>(n * 13 + k + m * 7 + d));
  std::vector<float> w;
  Fp8Weights w8;
  if (tc.fp8_weights) {
    w8 = RandomFp8(n, k, rng);
  } else {
    w = RoundTo(DType::kBF16, Random(n * k, rng, 1.0f / std::sqrt(static_cast<float>(k))));
  }
  auto residual = Random(m * k, rng, 3.0f);
  auto norm_w = Random(k, rng, 0.2f);
  for (auto& v : norm_w) v += 1.0f;
  auto bias = Random(n, rng, 0.3f);
  std::vector<float> inv_freq(std::max<int64_t>(tc.rotary_dim / 2, 1));
  for (int64_t i = 0; i < tc.rotary_dim / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(500000.0f, 2.0f * i / tc.rotary_dim);
  }
  // Two tokens of different sequences: different positions, slots in different blocks.
  const std::vector<int32_t> positions = {4093, 17};
  const std::vector<int64_t> slots = {3 * block_size + 5, 1 * block_size + 14};

  auto d_w = tc.fp8_weights ? UploadRaw(w8.bytes) : Upload(w, DType::kBF16);
  auto d_scale = Upload(tc.fp8_weights ? w8.scale : std::vector<float>{1.0f}, DType::kF32);
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
  if (tc.fp8_weights) {
    p.w_dtype = DType::kF8E4M3;
    p.w_scale = static_cast<const float*>(d_scale.data());
  }
  p.input = kc::GemvInput::kRmsNorm;
  p.residual = static_cast<const float*>(d_res.data());
  p.norm_weight = static_cast<const float*>(d_norm.data());
  p.eps = 1e-5f;

  // The unfused reference: GEMV into the q|k|v buffer, then the separate kernel.
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

  // Every number of CTAs per multiprocessor (rows per CTA odd before rounding for some of them).
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

    // q: the rows' first q_dim columns; the k and v columns of y stay poisoned.
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

    // Caches: the tokens' slots hold the reference's rows (within rounding), all others poison.
    const auto got_k = DownloadRaw<uint8_t>(d_k, cache_bytes);
    const auto got_v = DownloadRaw<uint8_t>(d_v, cache_bytes);
    // The unfused path's k and v columns of its q|k|v buffer: the GEMV's sums rounded to bf16.
    auto raw = [&](int64_t r, int64_t col) { return want_q[r * n + col]; };
    auto check_cache = [&](const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                           bool is_v) {
      SCOPED_TRACE(is_v ? "v cache" : "k cache");
      const size_t row_bytes = static_cast<size_t>(kv_dim) * (fp8 ? 1 : 2);
      for (int64_t s = 0; s < cache_rows; ++s) {
        const int64_t r = std::find(slots.begin(), slots.begin() + m, s) - slots.begin();
        const bool written = r < m;
        const uint8_t* g = got.data() + s * row_bytes;
        const uint8_t* wv = want.data() + s * row_bytes;
        if (!written) {
          for (size_t b = 0; b < row_bytes; ++b) ASSERT_EQ(g[b], 0xff) << "slot " << s;
          continue;
        }
        std::vector<float> gf(kv_dim), wf(kv_dim);
        for (int64_t j = 0; j < kv_dim; ++j) {
          if (fp8) {
            gf[j] = kernels::cpu::E4M3ToF32(g[j]) * tc.fp8_scale;
            wf[j] = kernels::cpu::E4M3ToF32(wv[j]) * tc.fp8_scale;
            // Before quantization the two differ by the unfused path's bf16 rounding of the
            // element's sum and its rotary partner's (half an ulp each, 2^-8 relative at most,
            // times |cos|, |sin| <= 1); each quantization adds half a step: so at most one step
            // plus that, which stays a fraction of a step except where a rotation or the bias
            // cancels the sums (values near 0, where steps are small). 1% more for the f32
            // arithmetic's own rounding.
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
                << "slot " << s << " element " << j << ": codes " << int{g[j]} << " vs "
                << int{wv[j]};
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
        // a row norm is a poor measure of that, as a single large element on the other code
        // moves it by several percent.
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

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvQkvTest,
    ::testing::Values(
        // Llama-3.1-8B's q/k/v.
        QkvGemvCase{32, 8, 128, 128, false, false, 1, 4096},
        QkvGemvCase{32, 8, 128, 128, false, true, 2, 4096},
        QkvGemvCase{32, 8, 128, 128, false, false, 2, 4096, 0.25f},
        // Partial rotary, both pair layouts.
        QkvGemvCase{16, 4, 64, 32, true, true, 2, 2048},
        QkvGemvCase{16, 4, 64, 32, false, false, 1, 2048, 1.0f},
        QkvGemvCase{16, 4, 64, 64, true, false, 1, 6144},
        // n = 1,120 rows: an odd number of rows per CTA before rounding at 3 and 1 CTA per
        // multiprocessor of 132; head_dim 80, 2 q heads per kv head.
        QkvGemvCase{10, 2, 80, 80, false, true, 2, 2048},
        QkvGemvCase{10, 2, 80, 48, true, true, 1, 2048, 0.5f},
        // No rotary at all: bias and the cache write only.
        QkvGemvCase{4, 2, 64, 0, false, true, 2, 2048},
        // e4m3 weights (a scale per row; rows of 2,048 are half a chunk, of 14,336 end in one).
        QkvGemvCase{32, 8, 128, 128, false, false, 1, 4096, 0.0f, true},
        QkvGemvCase{32, 8, 128, 128, false, true, 2, 4096, 0.25f, true},
        QkvGemvCase{16, 4, 64, 32, true, true, 2, 2048, 0.0f, true},
        QkvGemvCase{16, 4, 64, 64, false, false, 1, 6144, 1.0f, true},
        QkvGemvCase{10, 2, 80, 48, true, true, 1, 14336, 0.0f, true},
        QkvGemvCase{10, 2, 80, 80, false, true, 2, 2048, 0.5f, true}));

TEST(GemvQkvSupportsTest, RejectsWhatTheEpilogueCannotDo) {
  SKIP_WITHOUT_GPU();
  // Only the pointers' presence and alignment are looked at: no memory is touched.
  alignas(16) static float dummy[16];
  static int64_t slots[2];
  static int32_t positions[2];
  kc::GemvQkvEpilogue e;
  e.num_heads = 4;
  e.num_kv_heads = 2;
  e.head_dim = 64;
  e.rotary_dim = 64;
  e.positions = positions;
  e.inv_freq = dummy;
  e.k_cache = dummy;
  e.v_cache = dummy;
  e.slot_mapping = slots;
  kc::GemvFusedParams p;
  p.gemm.w = dummy;
  p.gemm.y = dummy;
  p.gemm.ldw = 2048;
  p.gemm.ldy = 512;
  p.gemm.m = 1;
  p.gemm.n = 512;
  p.gemm.k = 2048;
  p.input = kc::GemvInput::kRmsNorm;
  p.residual = dummy;
  p.norm_weight = dummy;
  p.qkv = &e;
  ASSERT_TRUE(kc::GemvFusedSupports(p));
  auto rejects = [&](auto change) {
    kc::GemvFusedParams q = p;
    kc::GemvQkvEpilogue eq = e;
    q.qkv = &eq;
    change(q, eq);
    return !kc::GemvFusedSupports(q);
  };
  EXPECT_TRUE(rejects([](auto& q, auto&) { q.gemm.out_dtype = DType::kF32; }));
  EXPECT_TRUE(rejects([](auto& q, auto&) { q.gemm.n = 510; }));
  EXPECT_TRUE(rejects([](auto&, auto& eq) { eq.rotary_dim = 31; }));
  EXPECT_TRUE(rejects([](auto&, auto& eq) { eq.rotary_dim = 66; }));
  EXPECT_TRUE(rejects([](auto& q, auto& eq) {
    eq.head_dim = 63;
    eq.rotary_dim = 62;
    q.gemm.n = 8 * 63;
  }));
  EXPECT_TRUE(rejects([](auto&, auto& eq) { eq.slot_mapping = nullptr; }));
  EXPECT_TRUE(rejects([](auto&, auto& eq) { eq.v_cache = nullptr; }));
  EXPECT_TRUE(rejects([](auto&, auto& eq) {
    eq.kv_fp8 = true;
    eq.k_scale = 0.0f;
  }));
  EXPECT_TRUE(rejects([](auto& q, auto&) {
    q.input = kc::GemvInput::kPlain;  // grouped products are plain ones
    q.gemm.x = dummy;
    q.gemm.ldx = 2 * 2048;
    q.gemm.group_n = 256;
  }));
  EXPECT_FALSE(rejects([](auto&, auto& eq) { eq.interleaved = true; }));
  EXPECT_FALSE(rejects([](auto& q, auto&) { q.gemm.m = 2; }));
}

}  // namespace
}  // namespace dinfer
