// CUDA mixture-of-experts kernels (plan, grouped expert product, clamped SwiGLU, combine) against
// plain host references (double sums of the bf16-rounded inputs) and the CPU SiluMul kernel, and
// the timings of the grouped product at DeepSeek-V4-Flash shapes. Skipped without a GPU.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <set>
#include <string>

#include "backend/cuda/stream.h"
#include "gpu_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/moe.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;

constexpr int kInvalidValue = 1;  // cudaErrorInvalidValue

// How the pairs are routed: kRandom picks top_k distinct experts a token among those not listed
// in `empty`, and drops about one pair in ten (-1); kOne sends every pair to expert `one`.
enum class Routing { kRandom, kOne };

std::vector<int32_t> Route(int64_t tokens, int64_t top_k, int64_t num_e, Routing mode,
                           std::mt19937& rng, const std::set<int32_t>& empty = {},
                           int32_t one = 0) {
  std::vector<int32_t> out(static_cast<size_t>(tokens * top_k));
  std::vector<int32_t> allowed;
  for (int32_t e = 0; e < num_e; ++e) {
    if (!empty.count(e)) allowed.push_back(e);
  }
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(allowed.begin(), allowed.end(), rng);
    for (int64_t j = 0; j < top_k; ++j) {
      int32_t e = mode == Routing::kOne ? one : allowed[j % allowed.size()];
      if (mode == Routing::kRandom && u(rng) < 0.1f) e = -1;
      out[t * top_k + j] = e;
    }
  }
  return out;
}

// The plan on the host: a stable counting sort of the pairs by expert.
struct HostPlan {
  std::vector<int32_t> offsets, row_token, pair_row;
  int32_t rows() const { return offsets.back(); }
};
HostPlan PlanOnHost(const std::vector<int32_t>& experts, int64_t top_k, int64_t num_e) {
  HostPlan h;
  h.offsets.assign(num_e + 1, 0);
  for (int32_t e : experts) {
    if (e >= 0 && e < num_e) ++h.offsets[e + 1];
  }
  for (int64_t e = 0; e < num_e; ++e) h.offsets[e + 1] += h.offsets[e];
  std::vector<int32_t> fill(h.offsets.begin(), h.offsets.end() - 1);
  h.row_token.assign(experts.size(), -7);
  h.pair_row.assign(experts.size(), -1);
  for (size_t i = 0; i < experts.size(); ++i) {
    const int32_t e = experts[i];
    if (e < 0 || e >= num_e) continue;
    h.pair_row[i] = fill[e]++;
    h.row_token[h.pair_row[i]] = static_cast<int32_t>(i / top_k);
  }
  return h;
}

// MoePlan's list of active experts: the experts with rows in order, -1 up to num_e, the count.
std::vector<int32_t> ActiveOnHost(const HostPlan& h, int64_t num_e) {
  std::vector<int32_t> list;
  for (int32_t e = 0; e < num_e; ++e) {
    if (h.offsets[e + 1] > h.offsets[e]) list.push_back(e);
  }
  const auto count = static_cast<int32_t>(list.size());
  list.resize(num_e, -1);
  list.push_back(count);
  return list;
}

// MoePlan's params over device buffers: experts [tokens, top_k] in, the offsets, row_token,
// pair_row and (where given) the list of active experts out.
kc::MoePlanParams PlanParams(const cuda::DeviceBuffer& experts, int64_t tokens, int64_t top_k,
                             int64_t num_e, const cuda::DeviceBuffer& offsets,
                             const cuda::DeviceBuffer& row_token,
                             const cuda::DeviceBuffer& pair_row,
                             const cuda::DeviceBuffer* active = nullptr) {
  kc::MoePlanParams p;
  p.experts = static_cast<const int32_t*>(experts.data());
  p.num_tokens = tokens;
  p.top_k = top_k;
  p.num_experts = num_e;
  p.expert_offsets = static_cast<int32_t*>(offsets.data());
  p.row_token = static_cast<int32_t*>(row_token.data());
  p.pair_row = static_cast<int32_t*>(pair_row.data());
  if (active != nullptr) p.active_experts = static_cast<int32_t*>(active->data());
  return p;
}

// The routing on the device and MoePlan's outputs poisoned with NaN (so that unwritten entries
// show); `params` plans into them, with the list of active experts where asked.
struct DevicePlan {
  cuda::DeviceBuffer experts, offsets, row_token, pair_row, active;
  kc::MoePlanParams params;
};
DevicePlan PoisonedPlan(const std::vector<int32_t>& experts, int64_t tokens, int64_t top_k,
                        int64_t num_e, bool with_active) {
  DevicePlan d;
  d.experts = UploadRaw(experts);
  d.offsets = Poisoned(num_e + 1, DType::kF32);
  d.row_token = Poisoned(tokens * top_k, DType::kF32);
  d.pair_row = Poisoned(tokens * top_k, DType::kF32);
  d.active = Poisoned(num_e + 1, DType::kF32);
  d.params = PlanParams(d.experts, tokens, top_k, num_e, d.offsets, d.row_token, d.pair_row,
                        with_active ? &d.active : nullptr);
  return d;
}

// GroupedGemm's params: y[r] = x[r] · w[e]ᵀ over the rows r of each expert e (expert_offsets),
// x [*, ldx] and w [num_e, n, k] bf16; the gather, list and shared expert are the caller's.
kc::GroupedGemmParams GemmParams(const void* x, int64_t ldx, const void* w,
                                 const int32_t* expert_offsets, int64_t num_e, int64_t n, int64_t k,
                                 int64_t max_rows, void* y, int64_t ldy, DType out_dtype) {
  kc::GroupedGemmParams p;
  p.x = x;
  p.ldx = ldx;
  p.w = w;
  p.expert_offsets = expert_offsets;
  p.num_experts = num_e;
  p.n = n;
  p.k = k;
  p.max_rows = max_rows;
  p.y = y;
  p.ldy = ldy;
  p.out_dtype = out_dtype;
  return p;
}

// The w2 product after w13's `g1` (same plan, list and out dtype): the activation [rows, inter]
// times w2 [num_e, hidden, inter] into y [rows, hidden], no gather.
kc::GroupedGemmParams W2Params(kc::GroupedGemmParams g1, const void* act, const void* w2,
                               int64_t hidden, int64_t inter, void* y) {
  g1.x = act;
  g1.ldx = inter;
  g1.row_token = nullptr;
  g1.w = w2;
  g1.n = hidden;
  g1.k = inter;
  g1.y = y;
  g1.ldy = hidden;
  return g1;
}

// The clamped SwiGLU of f32 gate/up rows [rows, 2 * inter] into bf16 act [rows, inter].
kc::SiluMulClampParams SwiGluParams(const void* gate_up, void* act, int64_t rows, int64_t inter,
                                    float limit, const int32_t* rows_on_device) {
  kc::SiluMulClampParams s;
  s.in = gate_up;
  s.in_dtype = DType::kF32;
  s.ld_in = 2 * inter;
  s.out = act;
  s.ld_out = inter;
  s.rows = rows;
  s.inter = inter;
  s.limit = limit;
  s.rows_on_device = rows_on_device;
  return s;
}

// MoeCombine's params: out[t] = Σ_j weights[t, j] · y[pair_row[t, j]]; the shared term is the
// caller's.
kc::MoeCombineParams CombineParams(const void* y, DType y_dtype, int64_t ldy,
                                   const int32_t* pair_row, const float* weights, int64_t tokens,
                                   int64_t top_k, int64_t hidden, float* out) {
  kc::MoeCombineParams p;
  p.y = y;
  p.y_dtype = y_dtype;
  p.ldy = ldy;
  p.pair_row = pair_row;
  p.weights = weights;
  p.num_tokens = tokens;
  p.top_k = top_k;
  p.hidden = hidden;
  p.out = out;
  return p;
}

// A grouped product y [max_rows, ldy] against the host: `got` and `want` (double sums of the
// bf16 inputs) over the rows the plan fills and columns < n, and how many elements outside them
// (rows past the total, padding columns) were written (not NaN).
struct GemmCheck {
  std::vector<float> got, want;
  int64_t touched = 0;
};
GemmCheck CheckGroupedGemm(const std::vector<float>& x, int64_t ldx, const std::vector<float>& w,
                           const HostPlan& plan, bool gather, int64_t n, int64_t k,
                           const std::vector<float>& y, int64_t max_rows, int64_t ldy) {
  GemmCheck c;
  const int64_t num_e = static_cast<int64_t>(plan.offsets.size()) - 1;
  for (int64_t e = 0; e < num_e; ++e) {
    for (int64_t r = plan.offsets[e]; r < plan.offsets[e + 1]; ++r) {
      const float* xr = x.data() + (gather ? plan.row_token[r] : r) * ldx;
      for (int64_t col = 0; col < n; ++col) {
        const float* wr = w.data() + (e * n + col) * k;
        double s = 0;
        for (int64_t i = 0; i < k; ++i) s += double{xr[i]} * wr[i];
        c.want.push_back(static_cast<float>(s));
        c.got.push_back(y[r * ldy + col]);
      }
    }
  }
  for (int64_t r = 0; r < max_rows; ++r) {
    for (int64_t col = r < plan.rows() ? n : 0; col < ldy; ++col)
      c.touched += !std::isnan(y[r * ldy + col]);
  }
  return c;
}

// ---------------------------------------------------------------------------------------------

struct PlanCase {
  int64_t tokens, top_k, num_e;
  Routing mode;
};

// One MoePlan case: the routing (rng seeded with `seed`; experts `empty` get no pairs where
// num_e > 4; kOne's expert `one`) planned on the device into sentinel-filled buffers, against the
// host's stable sort; with the workspace, or with the list of active experts (`list`, checked
// too).
void ExpectPlanMatchesHost(const PlanCase& c, uint32_t seed, const std::set<int32_t>& empty,
                           int32_t one, bool list) {
  SCOPED_TRACE(::testing::Message()
               << "tokens " << c.tokens << " top_k " << c.top_k << " experts " << c.num_e);
  std::mt19937 rng(seed);
  const auto experts = Route(c.tokens, c.top_k, c.num_e, c.mode, rng,
                             c.num_e > 4 ? empty : std::set<int32_t>{}, one);
  const HostPlan want = PlanOnHost(experts, c.top_k, c.num_e);
  const size_t pairs = experts.size();
  auto d_experts = UploadRaw(experts);
  auto d_offsets = UploadRaw(std::vector<int32_t>(c.num_e + 1, -5));
  auto d_row_token = UploadRaw(std::vector<int32_t>(std::max<size_t>(pairs, 1), -7));
  auto d_pair_row = UploadRaw(std::vector<int32_t>(std::max<size_t>(pairs, 1), -9));
  cuda::DeviceBuffer d_ws, d_active;
  if (list) {
    d_active = UploadRaw(std::vector<int32_t>(c.num_e + 1, -5));
  } else {
    const int64_t ws_ints = kc::MoePlanWorkspaceInts(c.tokens, c.top_k, c.num_e);
    d_ws = UploadRaw(std::vector<int32_t>(std::max<int64_t>(ws_ints, 1), 0));
  }
  kc::MoePlanParams p = PlanParams(d_experts, c.tokens, c.top_k, c.num_e, d_offsets, d_row_token,
                                   d_pair_row, list ? &d_active : nullptr);
  if (!list) p.workspace = static_cast<int32_t*>(d_ws.data());
  ASSERT_CUDA_OK(kc::MoePlan(p, nullptr));
  EXPECT_EQ(DownloadRaw<int32_t>(d_offsets, c.num_e + 1), want.offsets);
  if (list) {
    EXPECT_EQ(DownloadRaw<int32_t>(d_active, c.num_e + 1), ActiveOnHost(want, c.num_e));
  }
  if (pairs > 0) {
    EXPECT_EQ(DownloadRaw<int32_t>(d_pair_row, pairs), want.pair_row);
    // Rows past the total are not written.
    EXPECT_EQ(DownloadRaw<int32_t>(d_row_token, pairs), want.row_token);
  }
}

TEST(MoePlanTest, MatchesStableHostSort) {
  SKIP_WITHOUT_GPU();
  const PlanCase cases[] = {
      {1, 6, 256, Routing::kRandom},     {5, 6, 256, Routing::kRandom},
      {64, 6, 256, Routing::kRandom},    {1000, 6, 256, Routing::kRandom},
      {8192, 6, 256, Routing::kRandom},  {4096, 6, 256, Routing::kOne},
      {3001, 8, 1024, Routing::kRandom}, {77, 2, 8, Routing::kRandom},
      {33, 3, 1, Routing::kOne},         {0, 6, 256, Routing::kRandom},
  };
  for (const PlanCase& c : cases) {
    ASSERT_NO_FATAL_FAILURE(ExpectPlanMatchesHost(c, static_cast<uint32_t>(c.tokens * 31 + c.num_e),
                                                  {1, static_cast<int32_t>(c.num_e) - 2},
                                                  static_cast<int32_t>(c.num_e / 2), false));
  }
}

TEST(MoePlanTest, WritesActiveExpertList) {
  SKIP_WITHOUT_GPU();
  const PlanCase cases[] = {
      {1, 6, 256, Routing::kRandom},     {64, 6, 256, Routing::kRandom},
      {8192, 6, 256, Routing::kRandom},  {4096, 6, 256, Routing::kOne},
      {3001, 8, 1024, Routing::kRandom}, {77, 2, 8, Routing::kRandom},
      {200, 8, 40, Routing::kRandom},    {33, 3, 1, Routing::kOne},
      {0, 6, 256, Routing::kRandom},     {5, 1, 1000, Routing::kRandom},
  };
  for (const PlanCase& c : cases) {
    ASSERT_NO_FATAL_FAILURE(ExpectPlanMatchesHost(c, static_cast<uint32_t>(c.tokens * 17 + c.num_e),
                                                  {0, static_cast<int32_t>(c.num_e) - 1},
                                                  static_cast<int32_t>(c.num_e / 3), true));
  }
}

TEST(MoePlanTest, RejectsInvalidParams) {
  SKIP_WITHOUT_GPU();
  kc::MoePlanParams p;
  p.num_tokens = 1;
  p.top_k = 1;
  p.num_experts = kc::kMoeMaxExperts + 1;
  EXPECT_EQ(kc::MoePlan(p, nullptr), kInvalidValue);
}

// ---------------------------------------------------------------------------------------------

struct GemmCase {
  int64_t num_e, n, k, tokens, top_k;
  Routing mode;
  int64_t max_rows;  // 0: tokens * top_k; larger bounds force the tiled path on a few rows
  const char* what;
};

class MoeGroupedGemmTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(MoeGroupedGemmTest, MatchesHostReference) {
  SKIP_WITHOUT_GPU();
  const auto [out_dtype, gather] = GetParam();
  const GemmCase cases[] = {
      {8, 136, 200, 13, 2, Routing::kRandom, 0, "skinny, random"},
      {8, 64, 264, 60, 1, Routing::kOne, 0, "skinny, one expert takes all (4 row tiles)"},
      {16, 64, 4096, 5, 6, Routing::kRandom, 0, "skinny, V4 k"},
      {8, 136, 200, 150, 2, Routing::kRandom, 0, "tiled, random, empty experts"},
      {4, 264, 520, 300, 1, Routing::kOne, 0, "tiled, one expert takes all (3 row tiles)"},
      {8, 72, 136, 9, 2, Routing::kRandom, 1000, "tiled, few rows"},
      {64, 1024, 256, 40, 6, Routing::kRandom, 0, "skinny, many experts"},
  };
  for (const GemmCase& c : cases) {
    SCOPED_TRACE(c.what);
    std::mt19937 rng(static_cast<uint32_t>(c.n * 7 + c.k + c.tokens));
    const auto experts =
        Route(c.tokens, c.top_k, c.num_e, c.mode, rng, {2, 5}, static_cast<int32_t>(c.num_e / 2));
    const HostPlan plan = PlanOnHost(experts, c.top_k, c.num_e);
    const int64_t max_rows = c.max_rows > 0 ? c.max_rows : c.tokens * c.top_k;
    const int64_t ldx = c.k + 8, ldy = c.n + 8;
    const int64_t x_rows = gather ? c.tokens : max_rows;
    const auto x = RoundTo(DType::kBF16, Random(x_rows * ldx, rng));
    const auto w = RoundTo(DType::kBF16, Random(c.num_e * c.n * c.k, rng, 0.1f));
    auto d_x = Upload(x, DType::kBF16);
    auto d_w = Upload(w, DType::kBF16);
    auto d_offsets = UploadRaw(plan.offsets);
    auto d_row_token = UploadRaw(plan.row_token);
    auto d_y = Poisoned(max_rows * ldy, out_dtype);
    kc::GroupedGemmParams p =
        GemmParams(d_x.data(), ldx, d_w.data(), static_cast<const int32_t*>(d_offsets.data()),
                   c.num_e, c.n, c.k, max_rows, d_y.data(), ldy, out_dtype);
    p.row_token = gather ? static_cast<const int32_t*>(d_row_token.data()) : nullptr;
    ASSERT_CUDA_OK(kc::GroupedGemm(p, nullptr));
    const auto y = Download(d_y, max_rows * ldy, out_dtype);

    const GemmCheck check = CheckGroupedGemm(x, ldx, w, plan, gather, c.n, c.k, y, max_rows, ldy);
    EXPECT_LT(RelError(check.got, check.want), Tolerance(out_dtype));
    // Rows past the total and the padding columns stay untouched.
    EXPECT_EQ(check.touched, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(MoeOutAndGather, MoeGroupedGemmTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool()));

TEST(MoeGroupedGemmEdgeTest, NoRowsWritesNothing) {
  SKIP_WITHOUT_GPU();
  // Every pair skipped: all tile slots are idle, on both paths.
  for (const int64_t max_rows : {12, 4000}) {
    const int64_t num_e = 8, n = 64, k = 64;
    auto d_x = Upload(std::vector<float>(max_rows * k, 1.0f), DType::kBF16);
    auto d_w = Upload(std::vector<float>(num_e * n * k, 1.0f), DType::kBF16);
    auto d_offsets = UploadRaw(std::vector<int32_t>(num_e + 1, 0));
    auto d_y = Poisoned(max_rows * n, DType::kF32);
    kc::GroupedGemmParams p =
        GemmParams(d_x.data(), k, d_w.data(), static_cast<const int32_t*>(d_offsets.data()), num_e,
                   n, k, max_rows, d_y.data(), n, DType::kF32);
    ASSERT_CUDA_OK(kc::GroupedGemm(p, nullptr));
    const auto y = Download(d_y, max_rows * n, DType::kF32);
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return std::isnan(v); }));
    p.k = 60;  // not a multiple of 8
    EXPECT_EQ(kc::GroupedGemm(p, nullptr), kInvalidValue);
  }
}

// The decode path with MoePlan's list of active experts: the plan runs on the device (its
// offsets checked against the host's), then the product against the host reference; rows past the
// total and padding columns stay untouched.

struct ListCase {
  int64_t num_e, n, k, tokens, top_k;
  Routing mode;
  std::set<int32_t> empty;  // experts that get no pairs
  const char* what;
};

class MoeGroupedGemmListTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(MoeGroupedGemmListTest, MatchesHostReference) {
  SKIP_WITHOUT_GPU();
  const auto [out_dtype, gather] = GetParam();
  std::set<int32_t> all_but_4;
  for (int32_t e = 4; e < 64; ++e) all_but_4.insert(e);
  const ListCase cases[] = {
      {256, 200, 264, 1, 6, Routing::kRandom, {}, "1 token of 6 experts, odd n and k"},
      {16, 64, 4096, 1, 6, Routing::kRandom, {}, "1 token, V4 k"},
      {256, 40, 1032, 64, 6, Routing::kRandom, {7, 100}, "64 tokens over 256 experts"},
      {8, 136, 200, 40, 2, Routing::kRandom, {}, "all experts active"},
      {8, 64, 264, 60, 1, Routing::kOne, {}, "one expert only, 60 rows (two passes)"},
      {64, 48, 136, 400, 1, Routing::kOne, {}, "one expert only, 400 rows (13 passes)"},
      {64, 72, 136, 100, 2, Routing::kRandom, all_but_4, "4 experts of ~45 rows (2 passes)"},
      {16, 72, 136, 60, 2, Routing::kRandom, {3}, "16 experts, 5-15 rows"},
      {8, 136, 200, 300, 1, Routing::kRandom, {}, "tiled path (the list is ignored)"},
  };
  for (const ListCase& c : cases) {
    SCOPED_TRACE(c.what);
    std::mt19937 rng(static_cast<uint32_t>(c.n * 5 + c.k + c.tokens + c.num_e));
    const auto experts =
        Route(c.tokens, c.top_k, c.num_e, c.mode, rng, c.empty, static_cast<int32_t>(c.num_e / 2));
    const HostPlan plan = PlanOnHost(experts, c.top_k, c.num_e);
    if (std::string(c.what) == "all experts active") {
      ASSERT_EQ(ActiveOnHost(plan, c.num_e).back(), c.num_e);
    }
    const int64_t max_rows = c.tokens * c.top_k;
    const int64_t ldx = c.k + 8, ldy = c.n + 8;
    const int64_t x_rows = gather ? c.tokens : max_rows;
    const auto x = RoundTo(DType::kBF16, Random(x_rows * ldx, rng));
    const auto w = RoundTo(DType::kBF16, Random(c.num_e * c.n * c.k, rng, 0.1f));
    auto d_x = Upload(x, DType::kBF16);
    auto d_w = Upload(w, DType::kBF16);
    DevicePlan d = PoisonedPlan(experts, c.tokens, c.top_k, c.num_e, true);
    auto d_y = Poisoned(max_rows * ldy, out_dtype);
    const kc::MoePlanParams& mp = d.params;
    ASSERT_CUDA_OK(kc::MoePlan(mp, nullptr));
    ASSERT_EQ(DownloadRaw<int32_t>(d.offsets, c.num_e + 1), plan.offsets);
    kc::GroupedGemmParams p = GemmParams(d_x.data(), ldx, d_w.data(), mp.expert_offsets, c.num_e,
                                         c.n, c.k, max_rows, d_y.data(), ldy, out_dtype);
    p.row_token = gather ? mp.row_token : nullptr;
    p.active_experts = mp.active_experts;
    ASSERT_CUDA_OK(kc::GroupedGemm(p, nullptr));
    const auto y = Download(d_y, max_rows * ldy, out_dtype);

    const GemmCheck check = CheckGroupedGemm(x, ldx, w, plan, gather, c.n, c.k, y, max_rows, ldy);
    ASSERT_FALSE(check.want.empty());
    EXPECT_LT(RelError(check.got, check.want), Tolerance(out_dtype));
    EXPECT_EQ(check.touched, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(MoeOutAndGather, MoeGroupedGemmListTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool()));

TEST(MoeGroupedGemmEdgeTest, ListWithNoRowsWritesNothing) {
  SKIP_WITHOUT_GPU();
  // Every pair skipped: the list is all -1 (count 0) and every CTA exits.
  const int64_t num_e = 8, n = 64, k = 64, max_rows = 12;
  auto d_x = Upload(std::vector<float>(max_rows * k, 1.0f), DType::kBF16);
  auto d_w = Upload(std::vector<float>(num_e * n * k, 1.0f), DType::kBF16);
  auto d_offsets = UploadRaw(std::vector<int32_t>(num_e + 1, 0));
  std::vector<int32_t> list(num_e, -1);
  list.push_back(0);
  auto d_active = UploadRaw(list);
  auto d_y = Poisoned(max_rows * n, DType::kF32);
  kc::GroupedGemmParams p =
      GemmParams(d_x.data(), k, d_w.data(), static_cast<const int32_t*>(d_offsets.data()), num_e, n,
                 k, max_rows, d_y.data(), n, DType::kF32);
  p.active_experts = static_cast<const int32_t*>(d_active.data());
  ASSERT_CUDA_OK(kc::GroupedGemm(p, nullptr));
  const auto y = Download(d_y, max_rows * n, DType::kF32);
  EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return std::isnan(v); }));
}

// ---------------------------------------------------------------------------------------------

class MoeSiluMulClampTest : public ::testing::TestWithParam<std::tuple<DType, float>> {};

TEST_P(MoeSiluMulClampTest, MatchesCpuKernel) {
  SKIP_WITHOUT_GPU();
  const auto [in_dtype, limit] = GetParam();
  std::mt19937 rng(11);
  const int64_t rows = 37, inter = 136, ld_in = 2 * inter + 8, ld_out = inter + 8;
  const int32_t live_rows = 29;  // the count on the device; rows past it stay untouched
  const auto in = RoundTo(in_dtype, Random(rows * ld_in, rng, 6.0f));
  auto d_in = Upload(in, in_dtype);
  auto d_out = Poisoned(rows * ld_out, DType::kBF16);
  auto d_count = UploadRaw(std::vector<int32_t>{live_rows});
  kc::SiluMulClampParams p;
  p.in = d_in.data();
  p.in_dtype = in_dtype;
  p.ld_in = ld_in;
  p.out = d_out.data();
  p.ld_out = ld_out;
  p.rows = rows;
  p.inter = inter;
  p.limit = limit;
  p.rows_on_device = static_cast<const int32_t*>(d_count.data());
  ASSERT_CUDA_OK(kc::SiluMulClamp(p, nullptr));
  const auto out = Download(d_out, rows * ld_out, DType::kBF16);

  std::vector<float> want(live_rows * inter);
  kernels::cpu::SiluMulParams ref;
  ref.gate = in.data();
  ref.up = in.data() + inter;
  ref.out = want.data();
  ref.rows = live_rows;
  ref.dim = inter;
  ref.gate_stride = ld_in;
  ref.up_stride = ld_in;
  ref.out_stride = inter;
  ref.limit = limit;
  kernels::cpu::SiluMul(ref);
  std::vector<float> got(live_rows * inter);
  for (int64_t r = 0; r < live_rows; ++r) {
    std::copy_n(out.begin() + r * ld_out, inter, got.begin() + r * inter);
  }
  // bf16 output: each element within half an ulp (2^-9 relative) of the f32 result.
  EXPECT_LT(RelError(got, want), 3e-3);
  int64_t touched = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = r < live_rows ? inter : 0; c < ld_out; ++c) {
      touched += !std::isnan(out[r * ld_out + c]);
    }
  }
  EXPECT_EQ(touched, 0);
  if (limit > 0) {
    // The clamp matters at this input scale: without it the result differs.
    std::vector<float> unclamped(live_rows * inter);
    ref.out = unclamped.data();
    ref.limit = 0.0f;
    kernels::cpu::SiluMul(ref);
    EXPECT_GT(RelError(got, unclamped), 1e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(MoeInAndLimit, MoeSiluMulClampTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(0.0f, 7.0f)));

// ---------------------------------------------------------------------------------------------

// out[t] = start[t] + Σ_j weights[t, j] · y[pair_row[t, j]] (double sums of the stored values;
// pairs with row -1 skipped), start rows `start_ld` apart (nullptr: 0).
std::vector<float> HostCombine(const std::vector<float>& y, int64_t ldy,
                               const std::vector<int32_t>& pair_row,
                               const std::vector<float>& weights, int64_t tokens, int64_t top_k,
                               int64_t hidden, const float* start, int64_t start_ld) {
  std::vector<float> want(tokens * hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t d = 0; d < hidden; ++d) {
      double s = start != nullptr ? start[t * start_ld + d] : 0.0;
      for (int64_t j = 0; j < top_k; ++j) {
        const int32_t r = pair_row[t * top_k + j];
        if (r >= 0) s += double{weights[t * top_k + j]} * y[r * ldy + d];
      }
      want[t * hidden + d] = static_cast<float>(s);
    }
  }
  return want;
}

class MoeCombineTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(MoeCombineTest, MatchesHostReference) {
  SKIP_WITHOUT_GPU();
  const auto [y_dtype, with_shared] = GetParam();
  std::mt19937 rng(5);
  const int64_t tokens = 50, top_k = 6, num_e = 16, hidden = 136, ldy = hidden + 8;
  const auto experts = Route(tokens, top_k, num_e, Routing::kRandom, rng, {3});
  const HostPlan plan = PlanOnHost(experts, top_k, num_e);
  const int64_t rows = plan.rows();
  const auto y = RoundTo(y_dtype, Random(rows * ldy, rng));
  const auto weights = Random(tokens * top_k, rng, 0.3f);
  const auto shared = Random(tokens * hidden, rng);
  auto d_y = Upload(y, y_dtype);
  auto d_pair_row = UploadRaw(plan.pair_row);
  auto d_weights = Upload(weights, DType::kF32);
  auto d_shared = Upload(shared, DType::kF32);
  auto d_out = Poisoned(tokens * hidden, DType::kF32);
  kc::MoeCombineParams p =
      CombineParams(d_y.data(), y_dtype, ldy, static_cast<const int32_t*>(d_pair_row.data()),
                    static_cast<const float*>(d_weights.data()), tokens, top_k, hidden,
                    static_cast<float*>(d_out.data()));
  p.shared = with_shared ? static_cast<const float*>(d_shared.data()) : nullptr;
  ASSERT_CUDA_OK(kc::MoeCombine(p, nullptr));
  const auto out = Download(d_out, tokens * hidden, DType::kF32);
  auto want = HostCombine(y, ldy, plan.pair_row, weights, tokens, top_k, hidden,
                          with_shared ? shared.data() : nullptr, hidden);
  // The inputs are exact on both sides; f32 sums of 7 terms.
  EXPECT_LT(RelError(out, want), 1e-6);
  if (!with_shared) return;

  // The shared expert's rows in y after max_rows (the fused layer): same sums with the shared
  // term rounded as y stores it.
  const int64_t max_rows = tokens * top_k;
  auto y2 = RoundTo(y_dtype, Random((max_rows + tokens) * ldy, rng));
  std::copy(y.begin(), y.end(), y2.begin());
  want = HostCombine(y, ldy, plan.pair_row, weights, tokens, top_k, hidden,
                     y2.data() + max_rows * ldy, ldy);
  auto d_y2 = Upload(y2, y_dtype);
  auto d_out2 = Poisoned(tokens * hidden, DType::kF32);
  p.y = d_y2.data();
  p.shared = nullptr;
  p.shared_row0 = max_rows;
  p.out = static_cast<float*>(d_out2.data());
  ASSERT_CUDA_OK(kc::MoeCombine(p, nullptr));
  EXPECT_LT(RelError(Download(d_out2, tokens * hidden, DType::kF32), want), 1e-6);
}

TEST(MoeCombineEdgeTest, WideHiddenAndManyPairs) {
  SKIP_WITHOUT_GPU();
  // hidden over several CTAs (4096 + 520: a partial one), top_k 9 (three batches of pairs).
  std::mt19937 rng(9);
  const int64_t tokens = 3, top_k = 9, num_e = 32, hidden = 4616, ldy = hidden;
  const auto experts = Route(tokens, top_k, num_e, Routing::kRandom, rng);
  const HostPlan plan = PlanOnHost(experts, top_k, num_e);
  const int64_t max_rows = tokens * top_k;
  const auto y = Random((max_rows + tokens) * ldy, rng);
  const auto weights = Random(tokens * top_k, rng, 0.3f);
  auto d_y = Upload(y, DType::kF32);
  auto d_pair_row = UploadRaw(plan.pair_row);
  auto d_weights = Upload(weights, DType::kF32);
  auto d_out = Poisoned(tokens * hidden, DType::kF32);
  kc::MoeCombineParams p =
      CombineParams(d_y.data(), DType::kF32, ldy, static_cast<const int32_t*>(d_pair_row.data()),
                    static_cast<const float*>(d_weights.data()), tokens, top_k, hidden,
                    static_cast<float*>(d_out.data()));
  p.shared_row0 = max_rows;
  ASSERT_CUDA_OK(kc::MoeCombine(p, nullptr));
  const auto want = HostCombine(y, ldy, plan.pair_row, weights, tokens, top_k, hidden,
                                y.data() + max_rows * ldy, ldy);
  EXPECT_LT(RelError(Download(d_out, tokens * hidden, DType::kF32), want), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(MoeYAndShared, MoeCombineTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Bool()));

struct HostLayerRef {
  std::vector<float> out;             // [tokens, hidden]
  std::vector<float> shared_gate_up;  // [tokens, 2 * inter], the shared expert's (if any)
};

// out[t] = shared_out[t] + Σ_j w[t, j] · expert_j(x[t]) + shared(x[t]); expert(x) =
// act(x · w13ᵀ) · w2ᵀ with the activation rounded to bf16 as the device stores it; the shared
// expert's term only where sw13 and sw2 are given, shared_out's only where it is (double sums
// starting from it).
HostLayerRef HostLayer(const std::vector<float>& x, const std::vector<int32_t>& experts,
                       const std::vector<float>& weights, const std::vector<float>& w13,
                       const std::vector<float>& w2, const std::vector<float>& sw13,
                       const std::vector<float>& sw2, int64_t tokens, int64_t top_k, int64_t hidden,
                       int64_t inter, float limit, const std::vector<float>& shared_out = {}) {
  HostLayerRef ref;
  ref.out.assign(tokens * hidden, 0.0f);
  ref.shared_gate_up.assign(tokens * 2 * inter, 0.0f);
  std::vector<float> gate(inter), up(inter), act(inter);
  std::vector<double> acc_out(hidden);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t d = 0; d < hidden; ++d) {
      acc_out[d] = shared_out.empty() ? 0.0 : double{shared_out[t * hidden + d]};
    }
    for (int64_t j = 0; j <= top_k; ++j) {  // j == top_k: the shared expert
      const bool sh = j == top_k;
      if (sh && sw13.empty()) continue;
      const int32_t e = sh ? 0 : experts[t * top_k + j];
      if (e < 0) continue;
      const float* a = sh ? sw13.data() : w13.data() + e * 2 * inter * hidden;
      const float* b = sh ? sw2.data() : w2.data() + e * hidden * inter;
      const double wt = sh ? 1.0 : weights[t * top_k + j];
      for (int64_t i = 0; i < 2 * inter; ++i) {
        double s = 0;
        for (int64_t d = 0; d < hidden; ++d) s += double{x[t * hidden + d]} * a[i * hidden + d];
        (i < inter ? gate[i] : up[i - inter]) = static_cast<float>(s);
        if (sh) ref.shared_gate_up[t * 2 * inter + i] = static_cast<float>(s);
      }
      kernels::cpu::SiluMulParams sm;
      sm.gate = gate.data();
      sm.up = up.data();
      sm.out = act.data();
      sm.rows = 1;
      sm.dim = inter;
      sm.limit = limit;
      kernels::cpu::SiluMul(sm);
      const auto act_bf16 = RoundTo(DType::kBF16, act);
      for (int64_t d = 0; d < hidden; ++d) {
        double s = 0;
        for (int64_t i = 0; i < inter; ++i) s += double{act_bf16[i]} * b[d * inter + i];
        acc_out[d] += wt * s;
      }
    }
    for (int64_t d = 0; d < hidden; ++d) ref.out[t * hidden + d] = static_cast<float>(acc_out[d]);
  }
  return ref;
}

// ---------------------------------------------------------------------------------------------
// The whole layer after routing: plan, w13 with the gather (f32 out), clamped SwiGLU (bf16),
// w2 (f32 out), combine with a shared-expert output; against the host (double products, the CPU
// SiluMul, the activation rounded to bf16 as the device stores it).

TEST(MoePipelineTest, MatchesHostLayer) {
  SKIP_WITHOUT_GPU();
  const int64_t num_e = 8, hidden = 136, inter = 72, top_k = 3;
  const float limit = 7.0f;
  for (const int64_t tokens : {40, 100}) {  // 120 rows: skinny; 300 rows: tiled
    SCOPED_TRACE(::testing::Message() << tokens << " tokens");
    std::mt19937 rng(static_cast<uint32_t>(tokens));
    const auto experts = Route(tokens, top_k, num_e, Routing::kRandom, rng, {6});
    const auto weights = Random(tokens * top_k, rng, 0.3f);
    const auto x = RoundTo(DType::kBF16, Random(tokens * hidden, rng));
    const auto w13 = RoundTo(DType::kBF16, Random(num_e * 2 * inter * hidden, rng, 0.35f));
    const auto w2 = RoundTo(DType::kBF16, Random(num_e * hidden * inter, rng, 0.1f));
    const auto shared = Random(tokens * hidden, rng);
    const int64_t max_rows = tokens * top_k;

    DevicePlan d = PoisonedPlan(experts, tokens, top_k, num_e, false);
    auto d_weights = Upload(weights, DType::kF32);
    auto d_x = Upload(x, DType::kBF16);
    auto d_w13 = Upload(w13, DType::kBF16);
    auto d_w2 = Upload(w2, DType::kBF16);
    auto d_shared = Upload(shared, DType::kF32);
    auto d_gate_up = Poisoned(max_rows * 2 * inter, DType::kF32);
    auto d_act = Poisoned(max_rows * inter, DType::kBF16);
    auto d_y = Poisoned(max_rows * hidden, DType::kF32);
    auto d_out = Poisoned(tokens * hidden, DType::kF32);
    const auto* offsets = static_cast<const int32_t*>(d.offsets.data());

    const kc::MoePlanParams& plan = d.params;
    ASSERT_CUDA_OK(kc::MoePlan(plan, nullptr));
    kc::GroupedGemmParams g1 =
        GemmParams(d_x.data(), hidden, d_w13.data(), offsets, num_e, 2 * inter, hidden, max_rows,
                   d_gate_up.data(), 2 * inter, DType::kF32);
    g1.row_token = plan.row_token;
    ASSERT_CUDA_OK(kc::GroupedGemm(g1, nullptr));
    kc::SiluMulClampParams s =
        SwiGluParams(d_gate_up.data(), d_act.data(), max_rows, inter, limit, offsets + num_e);
    ASSERT_CUDA_OK(kc::SiluMulClamp(s, nullptr));
    kc::GroupedGemmParams g2 = W2Params(g1, d_act.data(), d_w2.data(), hidden, inter, d_y.data());
    ASSERT_CUDA_OK(kc::GroupedGemm(g2, nullptr));
    kc::MoeCombineParams cp = CombineParams(d_y.data(), DType::kF32, hidden, plan.pair_row,
                                            static_cast<const float*>(d_weights.data()), tokens,
                                            top_k, hidden, static_cast<float*>(d_out.data()));
    cp.shared = static_cast<const float*>(d_shared.data());
    ASSERT_CUDA_OK(kc::MoeCombine(cp, nullptr));
    const auto out = Download(d_out, tokens * hidden, DType::kF32);

    const HostLayerRef want = HostLayer(x, experts, weights, w13, w2, {}, {}, tokens, top_k, hidden,
                                        inter, limit, shared);
    // The activation rounds to bf16 on both sides; an f32 gate a last bit off can round it the
    // other way (2^-8 relative, rarely), which stays far below this bound.
    EXPECT_LT(RelError(out, want.out), 1e-3);
  }
}

// ---------------------------------------------------------------------------------------------
// The layer with the shared expert fused in: plan; w13 with the gather plus the shared expert's
// rows at max_rows; one SwiGLU over the routed rows (count on the device) and the shared rows;
// w2 plus the shared rows; combine reading the shared rows from y. Decode (skinny, with and
// without the list of active experts) and prefill (tiled) against the host layer. Rows of the
// activation between the routed count and max_rows must stay untouched.

class MoeSharedExpertTest : public ::testing::TestWithParam<bool> {};

TEST_P(MoeSharedExpertTest, FusedLayerMatchesHost) {
  SKIP_WITHOUT_GPU();
  const bool list = GetParam();
  const int64_t num_e = 64, hidden = 136, inter = 80, top_k = 6;
  const float limit = 7.0f;
  // 6 / 18 / 96 rows: skinny (with or without the list); 1,800 rows: tiled.
  for (const int64_t tokens : {1, 3, 16, 300}) {
    SCOPED_TRACE(::testing::Message() << tokens << " tokens");
    std::mt19937 rng(static_cast<uint32_t>(tokens * 7 + list));
    const auto experts = Route(tokens, top_k, num_e, Routing::kRandom, rng, {5});
    const HostPlan host = PlanOnHost(experts, top_k, num_e);
    const auto weights = Random(tokens * top_k, rng, 0.3f);
    const auto x = RoundTo(DType::kBF16, Random(tokens * hidden, rng));
    const auto w13 = RoundTo(DType::kBF16, Random(num_e * 2 * inter * hidden, rng, 0.35f));
    const auto w2 = RoundTo(DType::kBF16, Random(num_e * hidden * inter, rng, 0.1f));
    const auto sw13 = RoundTo(DType::kBF16, Random(2 * inter * hidden, rng, 0.35f));
    const auto sw2 = RoundTo(DType::kBF16, Random(hidden * inter, rng, 0.1f));
    const int64_t max_rows = tokens * top_k, all_rows = max_rows + tokens;

    DevicePlan d = PoisonedPlan(experts, tokens, top_k, num_e, true);
    auto d_weights = Upload(weights, DType::kF32);
    auto d_x = Upload(x, DType::kBF16);
    auto d_w13 = Upload(w13, DType::kBF16);
    auto d_w2 = Upload(w2, DType::kBF16);
    auto d_sw13 = Upload(sw13, DType::kBF16);
    auto d_sw2 = Upload(sw2, DType::kBF16);
    auto d_gate_up = Poisoned(all_rows * 2 * inter, DType::kF32);
    auto d_act = Poisoned(all_rows * inter, DType::kBF16);
    auto d_y = Poisoned(all_rows * hidden, DType::kF32);
    auto d_out = Poisoned(tokens * hidden, DType::kF32);

    const kc::MoePlanParams& plan = d.params;
    ASSERT_CUDA_OK(kc::MoePlan(plan, nullptr));
    kc::GroupedGemmParams g1 =
        GemmParams(d_x.data(), hidden, d_w13.data(), plan.expert_offsets, num_e, 2 * inter, hidden,
                   max_rows, d_gate_up.data(), 2 * inter, DType::kF32);
    g1.row_token = plan.row_token;
    g1.active_experts = list ? plan.active_experts : nullptr;
    g1.shared_w = d_sw13.data();
    g1.shared_rows = tokens;
    g1.shared_x_row0 = 0;
    ASSERT_CUDA_OK(kc::GroupedGemm(g1, nullptr));
    kc::SiluMulClampParams s = SwiGluParams(d_gate_up.data(), d_act.data(), all_rows, inter, limit,
                                            plan.expert_offsets + num_e);
    s.fixed_rows = tokens;
    ASSERT_CUDA_OK(kc::SiluMulClamp(s, nullptr));
    kc::GroupedGemmParams g2 = W2Params(g1, d_act.data(), d_w2.data(), hidden, inter, d_y.data());
    g2.shared_w = d_sw2.data();
    g2.shared_x_row0 = max_rows;
    ASSERT_CUDA_OK(kc::GroupedGemm(g2, nullptr));
    kc::MoeCombineParams cp = CombineParams(d_y.data(), DType::kF32, hidden, plan.pair_row,
                                            static_cast<const float*>(d_weights.data()), tokens,
                                            top_k, hidden, static_cast<float*>(d_out.data()));
    cp.shared_row0 = max_rows;
    ASSERT_CUDA_OK(kc::MoeCombine(cp, nullptr));
    const auto out = Download(d_out, tokens * hidden, DType::kF32);
    const auto gate_up = Download(d_gate_up, all_rows * 2 * inter, DType::kF32);
    const auto act = Download(d_act, all_rows * inter, DType::kBF16);

    const HostLayerRef ref =
        HostLayer(x, experts, weights, w13, w2, sw13, sw2, tokens, top_k, hidden, inter, limit);
    // The shared expert's gate/up rows: f32 sums of bf16 products.
    EXPECT_LT(RelError(std::vector<float>(gate_up.begin() + max_rows * 2 * inter, gate_up.end()),
                       ref.shared_gate_up),
              Tolerance(DType::kF32));
    // As MoePipelineTest: the activation rounds to bf16 on both sides.
    EXPECT_LT(RelError(out, ref.out), 1e-3);
    int64_t touched = 0;
    for (int64_t r = host.rows(); r < max_rows; ++r) {
      for (int64_t i = 0; i < inter; ++i) touched += !std::isnan(act[r * inter + i]);
    }
    EXPECT_EQ(touched, 0) << "rows past the routed count were written";

    // The SwiGLU as the gate/up product's epilogue (list path): the same act, routed and shared
    // rows alike (the same f32 sums and the same arithmetic).
    kc::GroupedGemmParams ge = g1;
    auto d_act2 = Poisoned(all_rows * inter, DType::kBF16);
    ge.y = d_act2.data();
    ge.ldy = inter;
    ge.out_dtype = DType::kBF16;
    ge.swiglu = true;
    ge.swiglu_limit = limit;
    if (!kc::GroupedGemmTakesListPath(ge) || ge.n % 32 != 0) {  // no epilogue there
      EXPECT_EQ(kc::GroupedGemm(ge, nullptr), kInvalidValue);
      continue;
    }
    ASSERT_CUDA_OK(kc::GroupedGemm(ge, nullptr));
    const auto act2 = Download(d_act2, all_rows * inter, DType::kBF16);
    std::vector<float> got, want;
    for (int64_t r = 0; r < all_rows; ++r) {
      const bool unused = r >= host.rows() && r < max_rows;
      for (int64_t i = 0; i < inter; ++i) {
        if (unused) {
          touched += !std::isnan(act2[r * inter + i]);
        } else {
          got.push_back(act2[r * inter + i]);
          want.push_back(act[r * inter + i]);
        }
      }
    }
    EXPECT_EQ(touched, 0) << "the epilogue wrote rows past the routed count";
    EXPECT_LT(RelError(got, want), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(MoeList, MoeSharedExpertTest, ::testing::Bool());

TEST(MoeSwiGluEpilogueTest, MatchesSeparateLaunch) {
  SKIP_WITHOUT_GPU();
  // Expert 3 with ~35-45 rows (two passes of 32 rows through the epilogue's shared memory), the
  // others a few rows, odd k, no clamp and a clamp; the epilogue's act against GroupedGemm (f32
  // out) + SiluMulClamp, and against the host.
  const int64_t num_e = 8, n = 96, k = 264, tokens = 40, top_k = 2;
  for (const float limit : {0.0f, 1.5f}) {
    SCOPED_TRACE(::testing::Message() << "limit " << limit);
    std::mt19937 rng(static_cast<uint32_t>(limit * 10 + 3));
    auto experts = Route(tokens, top_k, num_e, Routing::kRandom, rng);
    for (int64_t t = 0; t < 35; ++t) {
      experts[t * top_k] = 3;
      if (experts[t * top_k + 1] == 3) experts[t * top_k + 1] = -1;
    }
    const HostPlan host = PlanOnHost(experts, top_k, num_e);
    const int64_t max_rows = tokens * top_k, rows = host.rows();
    const auto x = RoundTo(DType::kBF16, Random(tokens * k, rng));
    const auto w = RoundTo(DType::kBF16, Random(num_e * n * k, rng, 0.15f));
    auto d_x = Upload(x, DType::kBF16);
    auto d_w = Upload(w, DType::kBF16);
    DevicePlan d = PoisonedPlan(experts, tokens, top_k, num_e, true);
    auto d_gate_up = Poisoned(max_rows * n, DType::kF32);
    auto d_act = Poisoned(max_rows * n / 2, DType::kBF16);
    auto d_act2 = Poisoned(max_rows * n / 2, DType::kBF16);
    const kc::MoePlanParams& plan = d.params;
    ASSERT_CUDA_OK(kc::MoePlan(plan, nullptr));
    kc::GroupedGemmParams g = GemmParams(d_x.data(), k, d_w.data(), plan.expert_offsets, num_e, n,
                                         k, max_rows, d_gate_up.data(), n, DType::kF32);
    g.row_token = plan.row_token;
    g.active_experts = plan.active_experts;
    ASSERT_TRUE(kc::GroupedGemmTakesListPath(g));
    ASSERT_CUDA_OK(kc::GroupedGemm(g, nullptr));
    kc::SiluMulClampParams sp;
    sp.in = d_gate_up.data();
    sp.in_dtype = DType::kF32;
    sp.ld_in = n;
    sp.out = d_act.data();
    sp.ld_out = n / 2;
    sp.rows = max_rows;
    sp.inter = n / 2;
    sp.limit = limit;
    sp.rows_on_device = plan.expert_offsets + num_e;
    ASSERT_CUDA_OK(kc::SiluMulClamp(sp, nullptr));
    kc::GroupedGemmParams ge = g;
    ge.y = d_act2.data();
    ge.ldy = n / 2;
    ge.out_dtype = DType::kBF16;
    ge.swiglu = true;
    ge.swiglu_limit = limit;
    ASSERT_CUDA_OK(kc::GroupedGemm(ge, nullptr));
    const auto act = Download(d_act, max_rows * n / 2, DType::kBF16);
    const auto act2 = Download(d_act2, max_rows * n / 2, DType::kBF16);
    ASSERT_GT(host.offsets[4] - host.offsets[3], 32);
    const std::vector<float> a1(act.begin(), act.begin() + rows * n / 2),
        a2(act2.begin(), act2.begin() + rows * n / 2);
    EXPECT_LT(RelError(a2, a1), 1e-6);
    int64_t touched = 0;
    for (int64_t i = rows * n / 2; i < max_rows * n / 2; ++i) touched += !std::isnan(act2[i]);
    EXPECT_EQ(touched, 0);
    // Against the host: double gate/up, the CPU SiluMul, bf16 rounding.
    std::vector<float> want;
    std::vector<float> gate(n / 2), up(n / 2), o(n / 2);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t e =
          std::upper_bound(host.offsets.begin(), host.offsets.end(), r) - host.offsets.begin() - 1;
      const float* xr = x.data() + host.row_token[r] * k;
      for (int64_t c = 0; c < n; ++c) {
        double acc = 0;
        for (int64_t i = 0; i < k; ++i) acc += double{xr[i]} * w[(e * n + c) * k + i];
        (c < n / 2 ? gate[c] : up[c - n / 2]) = static_cast<float>(acc);
      }
      kernels::cpu::SiluMulParams ref;
      ref.gate = gate.data();
      ref.up = up.data();
      ref.out = o.data();
      ref.rows = 1;
      ref.dim = n / 2;
      ref.limit = limit;
      kernels::cpu::SiluMul(ref);
      const auto ob = RoundTo(DType::kBF16, o);
      want.insert(want.end(), ob.begin(), ob.end());
    }
    EXPECT_LT(RelError(a2, want), Tolerance(DType::kBF16));
  }
  // Invalid: n not a multiple of 32, f32 out, or a path other than the list's.
  kc::GroupedGemmParams bad;
  bad.x = bad.w = bad.y = reinterpret_cast<void*>(256);
  bad.expert_offsets = reinterpret_cast<const int32_t*>(256);
  bad.active_experts = bad.expert_offsets;
  bad.num_experts = 8;
  bad.n = 48;
  bad.k = 64;
  bad.ldx = 64;
  bad.ldy = 48;
  bad.max_rows = 4;
  bad.out_dtype = DType::kBF16;
  bad.swiglu = true;
  EXPECT_EQ(kc::GroupedGemm(bad, nullptr), kInvalidValue);
  bad.n = 64;
  bad.out_dtype = DType::kF32;
  EXPECT_EQ(kc::GroupedGemm(bad, nullptr), kInvalidValue);
  bad.out_dtype = DType::kBF16;
  bad.active_experts = nullptr;
  EXPECT_EQ(kc::GroupedGemm(bad, nullptr), kInvalidValue);
}

TEST(MoeSharedExpertEdgeTest, RejectsInvalidShared) {
  SKIP_WITHOUT_GPU();
  auto d = cuda::DeviceBuffer::Allocate(4096);
  ASSERT_TRUE(d.ok());
  std::vector<int32_t> offsets(9, 0);
  auto d_offsets = UploadRaw(offsets);
  kc::GroupedGemmParams p;
  p.x = d->data();
  p.ldx = 8;
  p.w = d->data();
  p.expert_offsets = static_cast<const int32_t*>(d_offsets.data());
  p.num_experts = 8;
  p.n = 8;
  p.k = 8;
  p.max_rows = 4;
  p.y = d->data();
  p.ldy = 8;
  p.shared_w = d->data();
  p.shared_rows = 0;  // a shared expert without rows
  EXPECT_EQ(kc::GroupedGemm(p, nullptr), kInvalidValue);
  p.shared_rows = 2;
  p.shared_w = static_cast<const uint8_t*>(d->data()) + 2;  // misaligned
  EXPECT_EQ(kc::GroupedGemm(p, nullptr), kInvalidValue);
  kc::SiluMulClampParams s;
  s.in = d->data();
  s.out = d->data();
  s.ld_in = 16;
  s.ld_out = 8;
  s.rows = 2;
  s.inter = 8;
  s.fixed_rows = 3;  // more than the rows
  EXPECT_EQ(kc::SiluMulClamp(s, nullptr), kInvalidValue);
}

// ---------------------------------------------------------------------------------------------
// Timings at DeepSeek-V4-Flash shapes: 256 experts, hidden 4096, expert intermediate 2048 (w13
// [256, 4096, 4096], w2 [256, 4096, 2048]), top-6 of random routing; a few entries of each
// product checked against the host.

// Random routing of the timings: top_k distinct experts a token, none dropped.
std::vector<int32_t> DistinctTopK(int64_t tokens, int64_t top_k, int64_t num_e, std::mt19937& rng) {
  std::vector<int32_t> experts(tokens * top_k);
  std::vector<int32_t> all(num_e);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    std::copy_n(all.begin(), top_k, experts.begin() + t * top_k);
  }
  return experts;
}

int64_t ActiveCount(const HostPlan& h) {
  int64_t active = 0;
  for (size_t e = 0; e + 1 < h.offsets.size(); ++e) active += h.offsets[e + 1] > h.offsets[e];
  return active;
}

// A device buffer of `bytes`; with `seed`, n = bytes / 2 bf16 values FillRandom(seed, scale).
void AllocDevice(cuda::DeviceBuffer* b, size_t bytes) {
  auto a = cuda::DeviceBuffer::Allocate(bytes);
  ASSERT_TRUE(a.ok());
  *b = std::move(*a);
}
void AllocRandomBf16(cuda::DeviceBuffer* b, int64_t n, uint64_t seed, float scale) {
  ASSERT_NO_FATAL_FAILURE(AllocDevice(b, n * 2));
  ASSERT_CUDA_OK(kc::FillRandom(b->data(), DType::kBF16, n, seed, scale, nullptr));
}

// ms per launch: launch() twice to warm up, then `iters` times between two events on `stream`.
double TimeMs(const cuda::Stream& stream, const cuda::Event& start, const cuda::Event& end,
              int iters, const std::function<int()>& launch) {
  for (int i = 0; i < 2; ++i) EXPECT_EQ(launch(), 0);
  EXPECT_TRUE(start.Record(stream).ok());
  for (int i = 0; i < iters; ++i) EXPECT_EQ(launch(), 0);
  EXPECT_TRUE(end.Record(stream).ok());
  EXPECT_TRUE(end.Synchronize().ok());
  const auto ms = cuda::Event::ElapsedMs(start, end);
  EXPECT_TRUE(ms.ok());
  return ms.ok() ? *ms / iters : 0.0;
}

// Σ_i x[i] · w[i] over k bf16 values read from the device at element offsets x_at and w_at
// (a double sum), for the timings' spot checks.
void DeviceBf16Dot(const cuda::DeviceBuffer& x, int64_t x_at, const cuda::DeviceBuffer& w,
                   int64_t w_at, int64_t k, double* dot) {
  std::vector<uint16_t> xr(k), wr(k);
  ASSERT_STATUS_OK(x.CopyToHost(xr.data(), k * 2, x_at * 2));
  ASSERT_STATUS_OK(w.CopyToHost(wr.data(), k * 2, w_at * 2));
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) acc += double{Bf16ToF32(xr[i])} * Bf16ToF32(wr[i]);
  *dot = acc;
}

TEST(MoeTiming, V4FlashGroupedGemm) {
  SKIP_WITHOUT_GPU();
  const int64_t num_e = 256, hidden = 4096, inter = 2048, top_k = 6;
  cuda::DeviceBuffer d_w13, d_w2;
  ASSERT_NO_FATAL_FAILURE(AllocRandomBf16(&d_w13, num_e * 2 * inter * hidden, 1, 0.03f));
  ASSERT_NO_FATAL_FAILURE(AllocRandomBf16(&d_w2, num_e * hidden * inter, 2, 0.03f));
  auto stream = cuda::Stream::Create();
  ASSERT_TRUE(stream.ok());
  auto start = cuda::Event::Create(true), end = cuda::Event::Create(true);
  ASSERT_TRUE(start.ok() && end.ok());

  for (const int64_t tokens : {1, 64, 4096}) {
    SCOPED_TRACE(::testing::Message() << tokens << " tokens");
    std::mt19937 rng(static_cast<uint32_t>(tokens));
    const auto experts = DistinctTopK(tokens, top_k, num_e, rng);
    const HostPlan host = PlanOnHost(experts, top_k, num_e);
    const int64_t active = ActiveCount(host);
    const int64_t rows = tokens * top_k;
    DevicePlan d = PoisonedPlan(experts, tokens, top_k, num_e, true);
    cuda::DeviceBuffer d_x, d_act, d_gate_up, d_y;
    ASSERT_NO_FATAL_FAILURE(AllocRandomBf16(&d_x, tokens * hidden, 3, 1.0f));
    ASSERT_NO_FATAL_FAILURE(AllocRandomBf16(&d_act, rows * inter, 4, 1.0f));
    ASSERT_NO_FATAL_FAILURE(AllocDevice(&d_gate_up, rows * 2 * inter * 2));
    ASSERT_NO_FATAL_FAILURE(AllocDevice(&d_y, rows * hidden * 4));
    ASSERT_STATUS_OK(cuda::Synchronize());

    const kc::MoePlanParams& plan = d.params;
    kc::GroupedGemmParams g1 =
        GemmParams(d_x.data(), hidden, d_w13.data(), plan.expert_offsets, num_e, 2 * inter, hidden,
                   rows, d_gate_up.data(), 2 * inter, DType::kBF16);
    g1.row_token = plan.row_token;
    kc::GroupedGemmParams g2 = W2Params(g1, d_act.data(), d_w2.data(), hidden, inter, d_y.data());
    g2.out_dtype = DType::kF32;
    void* s = stream->get();

    auto time_ms = [&](const std::function<int()>& launch) {
      return TimeMs(*stream, *start, *end, tokens >= 1024 ? 5 : 20, launch);
    };
    const double plan_ms = time_ms([&] { return kc::MoePlan(plan, s); });
    const double g1_ms = time_ms([&] { return kc::GroupedGemm(g1, s); });
    const double g2_ms = time_ms([&] { return kc::GroupedGemm(g2, s); });
    ASSERT_STATUS_OK(stream->Synchronize());
    EXPECT_EQ(DownloadRaw<int32_t>(d.offsets, num_e + 1), host.offsets);
    auto report = [&](const char* name, const kc::GroupedGemmParams& g, double ms, int64_t in_b,
                      int64_t out_b) {
      const double bytes = double(active) * g.n * g.k * 2 + double(in_b) + double(out_b);
      const double flops = 2.0 * rows * g.n * g.k;
      std::printf(
          "[ MoE V4 ] %5lld tokens x top-%lld (%lld rows, %lld active experts) %s [%lld x %lld]: "
          "%9.1f us, %7.0f GB/s, %6.1f TFLOP/s\n",
          static_cast<long long>(tokens), static_cast<long long>(top_k),
          static_cast<long long>(rows), static_cast<long long>(active), name,
          static_cast<long long>(g.n), static_cast<long long>(g.k), ms * 1e3,
          bytes / (ms * 1e-3) / 1e9, flops / (ms * 1e-3) / 1e12);
    };
    std::printf("[ MoE V4 ] %5lld tokens: plan %.1f us\n", static_cast<long long>(tokens),
                plan_ms * 1e3);
    report("w13 (gather, bf16 out)", g1, g1_ms, tokens * hidden * 2, rows * 2 * inter * 2);
    report("w2 (f32 out)", g2, g2_ms, rows * inter * 2, rows * hidden * 4);

    // Spot checks: 24 random (row, column) entries of each product against the host.
    auto check = [&](const kc::GroupedGemmParams& g, const cuda::DeviceBuffer& x,
                     const cuda::DeviceBuffer& w, const cuda::DeviceBuffer& y, DType out) {
      ASSERT_STATUS_OK(cuda::Synchronize());
      std::vector<float> got, want;
      std::uniform_int_distribution<int64_t> pick_row(0, rows - 1), pick_col(0, g.n - 1);
      const size_t elem = out == DType::kF32 ? 4 : 2;
      for (int i = 0; i < 24; ++i) {
        const int64_t r = pick_row(rng), col = pick_col(rng);
        const int64_t e = std::upper_bound(host.offsets.begin(), host.offsets.end(), r) -
                          host.offsets.begin() - 1;
        const int64_t src = g.row_token ? host.row_token[r] : r;
        double acc = 0;
        ASSERT_NO_FATAL_FAILURE(DeviceBf16Dot(x, src * g.ldx, w, (e * g.n + col) * g.k, g.k, &acc));
        want.push_back(static_cast<float>(acc));
        uint32_t v = 0;
        ASSERT_STATUS_OK(y.CopyToHost(&v, elem, (r * g.ldy + col) * elem));
        float f;
        if (out == DType::kF32) {
          std::memcpy(&f, &v, 4);
        } else {
          f = Bf16ToF32(static_cast<uint16_t>(v));
        }
        got.push_back(f);
      }
      EXPECT_LT(RelError(got, want), Tolerance(out));
    };
    check(g1, d_x, d_w13, d_gate_up, DType::kBF16);
    check(g2, d_act, d_w2, d_y, DType::kF32);
    if (rows > kc::GroupedGemmSkinnyMaxRows(num_e)) continue;

    // The decode path with the plan's list of active experts: same results as without it (up to
    // the order of the f32 sums), timed the same way.
    EXPECT_EQ(DownloadRaw<int32_t>(d.active, num_e + 1), ActiveOnHost(host, num_e));
    const auto gate_up_old = Download(d_gate_up, rows * 2 * inter, DType::kBF16);
    const auto y_old = Download(d_y, rows * hidden, DType::kF32);
    kc::GroupedGemmParams g1l = g1, g2l = g2;
    g1l.active_experts = plan.active_experts;
    g2l.active_experts = plan.active_experts;
    const double g1l_ms = time_ms([&] { return kc::GroupedGemm(g1l, s); });
    const double g2l_ms = time_ms([&] { return kc::GroupedGemm(g2l, s); });
    ASSERT_STATUS_OK(stream->Synchronize());
    report("w13 list (gather, bf16 out)", g1l, g1l_ms, tokens * hidden * 2, rows * 2 * inter * 2);
    report("w2 list (f32 out)", g2l, g2l_ms, rows * inter * 2, rows * hidden * 4);
    std::printf("[ MoE V4 ] %5lld tokens: list path w13 %.2fx, w2 %.2fx the speed without it\n",
                static_cast<long long>(tokens), g1_ms / g1l_ms, g2_ms / g2l_ms);
    EXPECT_LT(RelError(Download(d_gate_up, rows * 2 * inter, DType::kBF16), gate_up_old),
              Tolerance(DType::kBF16));
    EXPECT_LT(RelError(Download(d_y, rows * hidden, DType::kF32), y_old), Tolerance(DType::kF32));
    check(g1l, d_x, d_w13, d_gate_up, DType::kBF16);
    check(g2l, d_act, d_w2, d_y, DType::kF32);
  }
}

// The whole V4-Flash MoE sublayer after routing at decode sizes: plan, w13 (+ shared), SwiGLU,
// w2 (+ shared), combine, each timed alone and the five back to back; GB/s over the weights the
// step reads ((active experts + 1) x 50.3 MB) plus activations. A few entries of the shared
// expert's gate/up rows are checked against the host.
TEST(MoeTiming, V4FlashSublayer) {
  SKIP_WITHOUT_GPU();
  const int64_t num_e = 256, hidden = 4096, inter = 2048, top_k = 6;
  const float limit = 10.0f;
  cuda::DeviceBuffer d_w13, d_w2, d_sw13, d_sw2;
  ASSERT_NO_FATAL_FAILURE(AllocRandomBf16(&d_w13, num_e * 2 * inter * hidden, 1, 0.03f));
  ASSERT_NO_FATAL_FAILURE(AllocRandomBf16(&d_w2, num_e * hidden * inter, 2, 0.03f));
  ASSERT_NO_FATAL_FAILURE(AllocRandomBf16(&d_sw13, 2 * inter * hidden, 5, 0.03f));
  ASSERT_NO_FATAL_FAILURE(AllocRandomBf16(&d_sw2, hidden * inter, 6, 0.03f));
  auto stream = cuda::Stream::Create();
  ASSERT_TRUE(stream.ok());
  auto start = cuda::Event::Create(true), end = cuda::Event::Create(true);
  ASSERT_TRUE(start.ok() && end.ok());

  for (const int64_t tokens : {1, 16, 64}) {
    SCOPED_TRACE(::testing::Message() << tokens << " tokens");
    std::mt19937 rng(static_cast<uint32_t>(tokens + 100));
    const auto experts = DistinctTopK(tokens, top_k, num_e, rng);
    const HostPlan host = PlanOnHost(experts, top_k, num_e);
    const int64_t active = ActiveCount(host);
    const int64_t rows = tokens * top_k, all_rows = rows + tokens;
    const auto weights = Random(tokens * top_k, rng, 0.3f);
    DevicePlan d = PoisonedPlan(experts, tokens, top_k, num_e, true);
    auto d_weights = Upload(weights, DType::kF32);
    cuda::DeviceBuffer d_x, d_gate_up, d_act, d_y, d_out;
    ASSERT_NO_FATAL_FAILURE(AllocRandomBf16(&d_x, tokens * hidden, 3, 1.0f));
    ASSERT_NO_FATAL_FAILURE(AllocDevice(&d_gate_up, all_rows * 2 * inter * 4));
    ASSERT_NO_FATAL_FAILURE(AllocDevice(&d_act, all_rows * inter * 2));
    ASSERT_NO_FATAL_FAILURE(AllocDevice(&d_y, all_rows * hidden * 4));
    ASSERT_NO_FATAL_FAILURE(AllocDevice(&d_out, tokens * hidden * 4));
    ASSERT_STATUS_OK(cuda::Synchronize());

    const kc::MoePlanParams& plan = d.params;
    kc::GroupedGemmParams g1 =
        GemmParams(d_x.data(), hidden, d_w13.data(), plan.expert_offsets, num_e, 2 * inter, hidden,
                   rows, d_gate_up.data(), 2 * inter, DType::kF32);
    g1.row_token = plan.row_token;
    g1.active_experts = plan.active_experts;
    g1.shared_w = d_sw13.data();
    g1.shared_rows = tokens;
    kc::SiluMulClampParams sp = SwiGluParams(d_gate_up.data(), d_act.data(), all_rows, inter, limit,
                                             plan.expert_offsets + num_e);
    sp.fixed_rows = tokens;
    kc::GroupedGemmParams g2 = W2Params(g1, d_act.data(), d_w2.data(), hidden, inter, d_y.data());
    g2.shared_w = d_sw2.data();
    g2.shared_x_row0 = rows;
    kc::MoeCombineParams cp = CombineParams(d_y.data(), DType::kF32, hidden, plan.pair_row,
                                            static_cast<const float*>(d_weights.data()), tokens,
                                            top_k, hidden, static_cast<float*>(d_out.data()));
    cp.shared_row0 = rows;
    void* s = stream->get();
    auto layer = [&] {
      int rc = kc::MoePlan(plan, s);
      if (rc == 0) rc = kc::GroupedGemm(g1, s);
      if (rc == 0) rc = kc::SiluMulClamp(sp, s);
      if (rc == 0) rc = kc::GroupedGemm(g2, s);
      if (rc == 0) rc = kc::MoeCombine(cp, s);
      return rc;
    };
    auto time_us = [&](const std::function<int()>& launch) {
      return TimeMs(*stream, *start, *end, 20, launch) * 1e3;
    };
    ASSERT_EQ(layer(), 0);  // the plan and every buffer in place before the kernels run alone
    const double plan_us = time_us([&] { return kc::MoePlan(plan, s); });
    const double g1_us = time_us([&] { return kc::GroupedGemm(g1, s); });
    const double act_us = time_us([&] { return kc::SiluMulClamp(sp, s); });
    const double g2_us = time_us([&] { return kc::GroupedGemm(g2, s); });
    const double comb_us = time_us([&] { return kc::MoeCombine(cp, s); });
    const double layer_us = time_us(layer);
    // The decode sequence of the runner: the SwiGLU as w13's epilogue, 4 launches.
    kc::GroupedGemmParams g1e = g1;
    g1e.y = d_act.data();
    g1e.ldy = inter;
    g1e.out_dtype = DType::kBF16;
    g1e.swiglu = true;
    g1e.swiglu_limit = limit;
    const double g1e_us = time_us([&] { return kc::GroupedGemm(g1e, s); });
    auto layer4 = [&] {
      int rc = kc::MoePlan(plan, s);
      if (rc == 0) rc = kc::GroupedGemm(g1e, s);
      if (rc == 0) rc = kc::GroupedGemm(g2, s);
      if (rc == 0) rc = kc::MoeCombine(cp, s);
      return rc;
    };
    const double layer4_us = time_us(layer4);
    ASSERT_STATUS_OK(stream->Synchronize());
    EXPECT_EQ(DownloadRaw<int32_t>(d.offsets, num_e + 1), host.offsets);
    const double experts_read = double(active + 1);
    const double w13_b = experts_read * 2 * inter * hidden * 2,
                 w2_b = experts_read * hidden * inter * 2;
    const double g1_b = w13_b + tokens * hidden * 2.0 + all_rows * 2 * inter * 4.0;
    const double g2_b = w2_b + all_rows * inter * 2.0 + all_rows * hidden * 4.0;
    std::printf(
        "[ MoE V4 sublayer ] %2lld tokens (%lld active experts + shared): plan %.1f us, "
        "w13+shared %.1f us (%.0f GB/s), SwiGLU %.1f us, w2+shared %.1f us (%.0f GB/s), "
        "combine %.1f us; all five back to back %.1f us = %.0f GB/s of weights "
        "(%.2f of 4.5 TB/s)\n",
        static_cast<long long>(tokens), static_cast<long long>(active), plan_us, g1_us,
        g1_b / (g1_us * 1e-6) / 1e9, act_us, g2_us, g2_b / (g2_us * 1e-6) / 1e9, comb_us, layer_us,
        (w13_b + w2_b) / (layer_us * 1e-6) / 1e9, (w13_b + w2_b) / (layer_us * 1e-6) / 4.5e12);
    std::printf(
        "[ MoE V4 sublayer ] %2lld tokens, SwiGLU as w13's epilogue: w13+shared+SwiGLU %.1f us "
        "(%.0f GB/s of weights); plan, w13, w2, combine back to back %.1f us = %.0f GB/s of "
        "weights (%.2f of 4.5 TB/s)\n",
        static_cast<long long>(tokens), g1e_us, w13_b / (g1e_us * 1e-6) / 1e9, layer4_us,
        (w13_b + w2_b) / (layer4_us * 1e-6) / 1e9, (w13_b + w2_b) / (layer4_us * 1e-6) / 4.5e12);

    // Spot checks of the shared expert's gate/up rows (f32) against the host.
    std::vector<float> got, want;
    std::uniform_int_distribution<int64_t> pick_t(0, tokens - 1), pick_c(0, 2 * inter - 1);
    for (int i = 0; i < 16; ++i) {
      const int64_t t = pick_t(rng), col = pick_c(rng);
      double acc = 0;
      ASSERT_NO_FATAL_FAILURE(DeviceBf16Dot(d_x, t * hidden, d_sw13, col * hidden, hidden, &acc));
      want.push_back(static_cast<float>(acc));
      float v = 0;
      ASSERT_STATUS_OK(d_gate_up.CopyToHost(&v, 4, ((rows + t) * 2 * inter + col) * 4));
      got.push_back(v);
    }
    EXPECT_LT(RelError(got, want), Tolerance(DType::kF32));
  }
}

}  // namespace
}  // namespace dinfer
