// DeepSeek-V4 mixing kernels (hyper-connection pre/post/head, MoE routing, per-head norm + rotary)
// against the CPU kernels of kernels/cpu/deepseek_v4.h and kernels/cpu/ops.h, with the
// hyper-connection mixes computed as model/layers/hyper_connection.cc does (the CPU RmsNorm over
// all hc * dim values of a token, then · fnᵀ). Skipped without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>

#include "gpu_test_util.h"
#include "kernels/cpu/deepseek_v4.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/v4_mix.h"

namespace dinfer {
namespace {

using namespace gpu_test;
namespace kc = kernels::cuda;
namespace kcpu = kernels::cpu;

constexpr int64_t kHc = 4;
constexpr float kHcEps = 1e-6f, kNormEps = 1e-6f;

template <typename T>
T* Ptr(const cuda::DeviceBuffer& b) {
  return static_cast<T*>(b.data());
}

// Streams [rows, hc * dim] whose rows have different magnitudes (the RMS matters).
std::vector<float> RandomStreams(int64_t rows, int64_t dim, std::mt19937& rng) {
  auto s = Random(rows * kHc * dim, rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float f = std::exp(nd(rng));
    for (int64_t i = 0; i < kHc * dim; ++i) s[r * kHc * dim + i] *= f;
  }
  return s;
}

// mixes [rows, num_mix] = RmsNorm(streams row) · fnᵀ as the layer computes them: the CPU RmsNorm
// kernel (no weight), then the dot products (here in double, rounded once).
std::vector<float> LayerMixes(const std::vector<float>& streams, int64_t rows, int64_t dim,
                              const std::vector<float>& fn, int64_t num_mix) {
  const int64_t width = kHc * dim;
  std::vector<float> normed(rows * width);
  kcpu::RmsNormParams n;
  n.x = streams.data();
  n.out = normed.data();
  n.rows = rows;
  n.dim = width;
  n.eps = kNormEps;
  kcpu::RmsNorm(n);
  std::vector<float> mixes(rows * num_mix);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t m = 0; m < num_mix; ++m) {
      double s = 0;
      for (int64_t k = 0; k < width; ++k) s += double{normed[r * width + k]} * fn[m * width + k];
      mixes[r * num_mix + m] = static_cast<float>(s);
    }
  }
  return mixes;
}

std::vector<float> RmsNormRows(const std::vector<float>& x, int64_t rows, int64_t dim,
                               const std::vector<float>& weight) {
  std::vector<float> out(rows * dim);
  kcpu::RmsNormParams n;
  n.x = x.data();
  n.weight = weight.data();
  n.out = out.data();
  n.rows = rows;
  n.dim = dim;
  n.eps = kNormEps;
  kcpu::RmsNorm(n);
  return out;
}

struct HcHeadless {
  std::vector<float> fn, base, scale, weight;
};

HcHeadless RandomHcWeights(int64_t num_mix, int64_t dim, std::mt19937& rng) {
  HcHeadless w;
  w.fn = Random(num_mix * kHc * dim, rng, 1.0f / std::sqrt(static_cast<float>(kHc * dim)));
  w.base = Random(num_mix, rng, 0.5f);
  w.scale = {0.8f, 1.3f, 1.7f};
  w.weight = Random(dim, rng, 0.2f);
  for (auto& x : w.weight) x += 1.0f;
  return w;
}

// The hc weights on the device.
struct DeviceHcWeights {
  cuda::DeviceBuffer fn, base, scale, weight;
};

DeviceHcWeights UploadHcWeights(const HcHeadless& w) {
  return {Upload(w.fn, DType::kF32), Upload(w.base, DType::kF32), Upload(w.scale, DType::kF32),
          Upload(w.weight, DType::kF32)};
}

// HcPre's params over `tokens` streams with w's fn (its first copy), base, scale and norm weight,
// the test's hc, 20 Sinkhorn iterations and eps; the other outputs and options are the caller's.
kc::HcPreParams PreParams(const float* streams, const DeviceHcWeights& w, int64_t tokens,
                          int64_t dim, float* post, float* comb) {
  kc::HcPreParams p;
  p.streams = streams;
  p.fn = Ptr<float>(w.fn);
  p.base = Ptr<float>(w.base);
  p.scale = Ptr<float>(w.scale);
  p.num_tokens = tokens;
  p.hc = kHc;
  p.dim = dim;
  p.iters = 20;
  p.hc_eps = kHcEps;
  p.norm_eps = kNormEps;
  p.post = post;
  p.comb = comb;
  p.norm_weight = Ptr<float>(w.weight);
  return p;
}

// HcHead's params over `rows` stream rows (fn: the first hc rows of w's), normed to `dtype`.
kc::HcHeadParams HeadParams(const float* streams, const DeviceHcWeights& w, int64_t rows,
                            int64_t dim, void* normed, DType dtype) {
  kc::HcHeadParams h;
  h.streams = streams;
  h.fn = Ptr<float>(w.fn);
  h.base = Ptr<float>(w.base);
  h.scale = Ptr<float>(w.scale);
  h.rows = rows;
  h.hc = kHc;
  h.dim = dim;
  h.hc_eps = kHcEps;
  h.norm_eps = kNormEps;
  h.norm_weight = Ptr<float>(w.weight);
  h.normed = normed;
  h.normed_dtype = dtype;
  return h;
}

kc::HcPostParams PostParams(const float* streams, const float* y, const float* post,
                            const float* comb, int64_t tokens, int64_t dim, float* out) {
  kc::HcPostParams p;
  p.streams = streams;
  p.y = y;
  p.post = post;
  p.comb = comb;
  p.num_tokens = tokens;
  p.hc = kHc;
  p.dim = dim;
  p.out = out;
  return p;
}

// The CPU's HcPost: new streams [tokens, hc * dim].
std::vector<float> CpuHcPost(const std::vector<float>& streams, const std::vector<float>& y,
                             const std::vector<float>& post, const std::vector<float>& comb,
                             int64_t tokens, int64_t dim) {
  std::vector<float> out(tokens * kHc * dim);
  kcpu::HcPostParams ref;
  ref.streams = streams.data();
  ref.y = y.data();
  ref.post = post.data();
  ref.comb = comb.data();
  ref.num_tokens = tokens;
  ref.hc = kHc;
  ref.dim = dim;
  ref.out = out.data();
  kcpu::HcPost(ref);
  return out;
}

// A NaN-filled workspace (it needs no initialisation) of HcWorkspaceFloats floats.
cuda::DeviceBuffer PoisonedWorkspace(int64_t tokens, int64_t dim) {
  const int64_t floats = kc::HcWorkspaceFloats(tokens, kHc, dim);
  EXPECT_GT(floats, 0);
  return Poisoned(static_cast<size_t>(floats), DType::kF32);
}

// The decode path wrote the workspace (token 0's first partial is finite) exactly when it should.
void ExpectWorkspaceUsed(const cuda::DeviceBuffer& ws, int64_t tokens) {
  const float first = Download(ws, 1, DType::kF32)[0];
  EXPECT_EQ(std::isfinite(first), tokens <= kc::kHcWorkspaceMaxTokens) << tokens << " tokens";
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ------------------------------------------------------------------------------------------
struct PreCase {
  int64_t tokens, dim;
  DType dtype;
  bool collapsed, normed;
  bool workspace = false;  // the decode path (two kernels) up to kHcWorkspaceMaxTokens tokens
};

std::ostream& operator<<(std::ostream& os, const PreCase& c) {
  return os << c.tokens << " tokens, dim " << c.dim << " " << DTypeName(c.dtype)
            << (c.collapsed ? " collapsed" : "") << (c.normed ? " normed" : "")
            << (c.workspace ? " workspace" : "");
}

class V4MixHcPreTest : public ::testing::TestWithParam<PreCase> {};

TEST_P(V4MixHcPreTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const PreCase c = GetParam();
  const int64_t n = c.tokens, dim = c.dim, mix = (2 + kHc) * kHc, iters = 20;
  std::mt19937 rng(static_cast<uint32_t>(n * 131 + dim));
  const auto streams = RandomStreams(n, dim, rng);
  const auto w = RandomHcWeights(mix, dim, rng);

  const auto mixes = LayerMixes(streams, n, dim, w.fn, mix);
  std::vector<float> want_collapsed(n * dim), want_post(n * kHc), want_comb(n * kHc * kHc);
  kcpu::HcPreParams ref;
  ref.streams = streams.data();
  ref.mixes = mixes.data();
  ref.base = w.base.data();
  ref.scale = w.scale.data();
  ref.num_tokens = n;
  ref.hc = kHc;
  ref.dim = dim;
  ref.iters = iters;
  ref.eps = kHcEps;
  ref.collapsed = want_collapsed.data();
  ref.post = want_post.data();
  ref.comb = want_comb.data();
  kcpu::HcPre(ref);
  const auto want_normed = RmsNormRows(want_collapsed, n, dim, w.weight);

  auto d_streams = Upload(streams, DType::kF32);
  const auto dw = UploadHcWeights(w);
  auto d_post = Poisoned(n * kHc, DType::kF32);
  auto d_comb = Poisoned(n * kHc * kHc, DType::kF32);
  auto d_collapsed = Poisoned(n * dim, DType::kF32);
  auto d_normed = Poisoned(n * dim, c.dtype);
  kc::HcPreParams p =
      PreParams(Ptr<float>(d_streams), dw, n, dim, Ptr<float>(d_post), Ptr<float>(d_comb));
  p.iters = iters;
  p.collapsed = c.collapsed ? Ptr<float>(d_collapsed) : nullptr;
  p.normed = c.normed ? d_normed.data() : nullptr;
  p.normed_dtype = c.dtype;
  auto d_ws = PoisonedWorkspace(c.workspace ? n : 1, dim);
  p.workspace = c.workspace ? Ptr<float>(d_ws) : nullptr;
  ASSERT_CUDA_OK(kc::HcPre(p, nullptr));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  if (c.workspace) ExpectWorkspaceUsed(d_ws, n);

  // f32 against the CPU's f32: the mixes differ only in summation order (~1e-6 relative over
  // 16384 terms), which the sigmoid/softmax/Sinkhorn do not amplify.
  const double post_err = RelError(Download(d_post, n * kHc, DType::kF32), want_post);
  const double comb_err = RelError(Download(d_comb, n * kHc * kHc, DType::kF32), want_comb);
  EXPECT_LT(post_err, 2e-5) << c;
  EXPECT_LT(comb_err, 2e-5) << c;
  if (c.collapsed) {
    const double err = RelError(Download(d_collapsed, n * dim, DType::kF32), want_collapsed);
    EXPECT_LT(err, 2e-5) << c;
  }
  if (c.normed) {
    const double err = RelError(Download(d_normed, n * dim, c.dtype), want_normed);
    EXPECT_LT(err, Tolerance(c.dtype)) << c;
  }
  // A second run gives the same bits (fixed reduction orders).
  const auto post1 = Download(d_post, n * kHc, DType::kF32);
  const auto comb1 = Download(d_comb, n * kHc * kHc, DType::kF32);
  const auto normed1 = Download(d_normed, n * dim, c.dtype);
  ASSERT_CUDA_OK(kc::HcPre(p, nullptr));
  EXPECT_TRUE(SameBits(Download(d_post, n * kHc, DType::kF32), post1)) << c;
  EXPECT_TRUE(SameBits(Download(d_comb, n * kHc * kHc, DType::kF32), comb1)) << c;
  if (c.normed) {
    EXPECT_TRUE(SameBits(Download(d_normed, n * dim, c.dtype), normed1)) << c;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, V4MixHcPreTest,
    ::testing::Values(PreCase{1, 64, DType::kBF16, true, true},
                      PreCase{5, 96, DType::kF32, true, true},
                      PreCase{16, 4, DType::kF32, true, true},  // fewer columns than CTAs
                      PreCase{37, 64, DType::kBF16, false, true},
                      PreCase{600, 96, DType::kF32, true, true},  // 32 per cluster, a tail
                      PreCase{3, 4096, DType::kBF16, true, true},
                      PreCase{64, 4096, DType::kF32, true, false},
                      PreCase{530, 4096, DType::kBF16, false, true}));

// The decode path: 1-64 tokens at V4-Flash's dim and small or odd dims (hc * dim not a multiple
// of the 128-value slices: 100, 4), and 65 / 600 tokens where the workspace is ignored.
INSTANTIATE_TEST_SUITE_P(V4MixWorkspace, V4MixHcPreTest,
                         ::testing::Values(PreCase{1, 4096, DType::kBF16, true, true, true},
                                           PreCase{1, 4096, DType::kF32, false, true, true},
                                           PreCase{3, 4096, DType::kBF16, true, true, true},
                                           PreCase{16, 4096, DType::kF32, true, true, true},
                                           PreCase{64, 4096, DType::kBF16, true, true, true},
                                           PreCase{64, 4096, DType::kF32, true, false, true},
                                           PreCase{1, 64, DType::kF32, true, true, true},
                                           PreCase{3, 96, DType::kBF16, true, true, true},
                                           PreCase{5, 100, DType::kF32, true, true, true},
                                           PreCase{16, 4, DType::kF32, true, true, true},
                                           PreCase{17, 64, DType::kF32, true, true, true},
                                           PreCase{37, 1000, DType::kF32, true, true, true},
                                           PreCase{65, 96, DType::kF32, true, true, true},
                                           PreCase{600, 64, DType::kBF16, true, true, true}));

// ------------------------------------------------------------------------------------------
class V4MixHcPostTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(V4MixHcPostTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [n, dim] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(n * 7 + dim));
  const auto streams = RandomStreams(n, dim, rng);
  const auto y = Random(n * dim, rng);
  const auto post = Random(n * kHc, rng);
  const auto comb = Random(n * kHc * kHc, rng, 0.5f);
  const auto want = CpuHcPost(streams, y, post, comb, n, dim);

  auto d_streams = Upload(streams, DType::kF32);
  auto d_y = Upload(y, DType::kF32);
  auto d_post = Upload(post, DType::kF32);
  auto d_comb = Upload(comb, DType::kF32);
  auto d_out = Poisoned(n * kHc * dim, DType::kF32);
  ASSERT_CUDA_OK(kc::HcPost(PostParams(Ptr<float>(d_streams), Ptr<float>(d_y), Ptr<float>(d_post),
                                       Ptr<float>(d_comb), n, dim, Ptr<float>(d_out)),
                            nullptr));
  // Same f32 operations up to fused multiply-adds: a few ulp.
  EXPECT_LT(RelError(Download(d_out, n * kHc * dim, DType::kF32), want), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Shapes, V4MixHcPostTest,
                         ::testing::Values(std::make_tuple(int64_t{1}, int64_t{64}),
                                           std::make_tuple(int64_t{7}, int64_t{96}),
                                           std::make_tuple(int64_t{33}, int64_t{4}),
                                           std::make_tuple(int64_t{300}, int64_t{4096})));

// ------------------------------------------------------------------------------------------
struct HeadCase {
  int64_t stream_rows, dim;
  DType dtype;
  bool gather;
  bool workspace = false;
};

std::ostream& operator<<(std::ostream& os, const HeadCase& c) {
  return os << c.stream_rows << " rows, dim " << c.dim << " " << DTypeName(c.dtype)
            << (c.gather ? " gathered" : "") << (c.workspace ? " workspace" : "");
}

class V4MixHcHeadTest : public ::testing::TestWithParam<HeadCase> {};

TEST_P(V4MixHcHeadTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const HeadCase c = GetParam();
  const int64_t dim = c.dim, width = kHc * dim;
  std::mt19937 rng(static_cast<uint32_t>(c.stream_rows * 17 + dim));
  const auto streams = RandomStreams(c.stream_rows, dim, rng);
  auto w = RandomHcWeights(kHc, dim, rng);
  const float scale = 1.3f;
  w.scale = {scale};  // HcHead's one scale
  // Gathered rows: every other row, last first (the logits rows of a batch).
  std::vector<int32_t> index;
  if (c.gather) {
    for (int64_t r = c.stream_rows - 1; r >= 0; r -= 2) index.push_back(static_cast<int32_t>(r));
  } else {
    index.resize(c.stream_rows);
    std::iota(index.begin(), index.end(), 0);
  }
  const int64_t rows = static_cast<int64_t>(index.size());
  std::vector<float> gathered(rows * width);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(streams.begin() + index[r] * width, width, gathered.begin() + r * width);
  }
  const auto mixes = LayerMixes(gathered, rows, dim, w.fn, kHc);
  std::vector<float> x(rows * dim);
  kcpu::HcHeadParams ref;
  ref.streams = gathered.data();
  ref.mixes = mixes.data();
  ref.base = w.base.data();
  ref.scale = scale;
  ref.num_tokens = rows;
  ref.hc = kHc;
  ref.dim = dim;
  ref.eps = kHcEps;
  ref.out = x.data();
  kcpu::HcHead(ref);
  const auto want = RmsNormRows(x, rows, dim, w.weight);

  auto d_streams = Upload(streams, DType::kF32);
  auto d_index = UploadRaw(index);
  const auto dw = UploadHcWeights(w);
  auto d_out = Poisoned(rows * dim, c.dtype);
  kc::HcHeadParams p = HeadParams(Ptr<float>(d_streams), dw, rows, dim, d_out.data(), c.dtype);
  p.rows_index = c.gather ? Ptr<int32_t>(d_index) : nullptr;
  auto d_ws = PoisonedWorkspace(c.workspace ? rows : 1, dim);
  p.workspace = c.workspace ? Ptr<float>(d_ws) : nullptr;
  ASSERT_CUDA_OK(kc::HcHead(p, nullptr));
  const auto got = Download(d_out, rows * dim, c.dtype);
  EXPECT_LT(RelError(got, want), Tolerance(c.dtype)) << c;
  if (c.workspace) ExpectWorkspaceUsed(d_ws, rows);
  ASSERT_CUDA_OK(kc::HcHead(p, nullptr));
  EXPECT_TRUE(SameBits(Download(d_out, rows * dim, c.dtype), got)) << c;
}

INSTANTIATE_TEST_SUITE_P(Shapes, V4MixHcHeadTest,
                         ::testing::Values(HeadCase{1, 64, DType::kF32, false},
                                           HeadCase{17, 96, DType::kBF16, true},
                                           HeadCase{80, 4096, DType::kF32, true},
                                           HeadCase{600, 64, DType::kF32, false},
                                           HeadCase{1100, 96, DType::kBF16, true}));

// The decode path (rows: every other stream row when gathered), and 65 rows (workspace ignored).
INSTANTIATE_TEST_SUITE_P(V4MixWorkspace, V4MixHcHeadTest,
                         ::testing::Values(HeadCase{1, 4096, DType::kF32, false, true},
                                           HeadCase{1, 4096, DType::kBF16, false, true},
                                           HeadCase{16, 4096, DType::kBF16, false, true},
                                           HeadCase{17, 96, DType::kBF16, true, true},
                                           HeadCase{80, 4096, DType::kF32, true, true},
                                           HeadCase{64, 100, DType::kF32, false, true},
                                           HeadCase{130, 64, DType::kF32, true, true}));

// The decode path captured in a CUDA graph (HcPre then HcHead sharing one workspace) replays
// to the bits of the eager launches, twice.
TEST(V4MixHcGraphTest, WorkspacePathReplaysEagerBits) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 3, dim = 4096, mix = (2 + kHc) * kHc;
  std::mt19937 rng(99);
  auto d_streams = Upload(RandomStreams(n, dim, rng), DType::kF32);
  const auto dw = UploadHcWeights(RandomHcWeights(mix, dim, rng));
  auto d_post = Poisoned(n * kHc, DType::kF32), d_comb = Poisoned(n * kHc * kHc, DType::kF32);
  auto d_normed = Poisoned(n * dim, DType::kBF16), d_head = Poisoned(n * dim, DType::kF32);
  auto d_ws = PoisonedWorkspace(n, dim);
  kc::HcPreParams p =
      PreParams(Ptr<float>(d_streams), dw, n, dim, Ptr<float>(d_post), Ptr<float>(d_comb));
  p.normed = d_normed.data();
  p.normed_dtype = DType::kBF16;
  p.workspace = Ptr<float>(d_ws);
  // fn: its first hc rows
  kc::HcHeadParams h = HeadParams(Ptr<float>(d_streams), dw, n, dim, d_head.data(), DType::kF32);
  h.workspace = Ptr<float>(d_ws);

  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_CUDA_OK(kc::HcPre(p, stream));
  ASSERT_CUDA_OK(kc::HcHead(h, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  auto outputs = [&] {
    std::vector<std::vector<float>> o;
    o.push_back(Download(d_post, n * kHc, DType::kF32));
    o.push_back(Download(d_comb, n * kHc * kHc, DType::kF32));
    o.push_back(Download(d_normed, n * dim, DType::kBF16));
    o.push_back(Download(d_head, n * dim, DType::kF32));
    return o;
  };
  const auto eager = outputs();
  for (const auto& v : eager) {
    for (float x : v) ASSERT_TRUE(std::isfinite(x));
  }

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ASSERT_CUDA_OK(kc::HcPre(p, stream));
  ASSERT_CUDA_OK(kc::HcHead(h, stream));
  ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    for (auto* b : {&d_post, &d_comb, &d_normed, &d_head, &d_ws}) {
      ASSERT_CUDA_OK(cudaMemsetAsync(b->data(), 0xff, b->bytes(), stream));
    }
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    const auto got = outputs();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(SameBits(got[i], eager[i])) << i;
  }
  ASSERT_CUDA_OK(cudaGraphExecDestroy(exec));
  ASSERT_CUDA_OK(cudaGraphDestroy(graph));
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

// ------------------------------------------------------------------------------------------
// HcPost given the next op's fn and workspace (its partials computed with the new streams), then
// the op with partials_ready, against HcPost then the op's own two kernels: the same bits. The
// chain is the model's: HcPost -> HcPre -> HcPost -> HcHead (gathered rows: every other token,
// last first), one workspace. Above kHcWorkspaceMaxTokens the options are ignored.
class V4MixHcFusedTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(V4MixHcFusedTest, PostWithPartialsMatchesSeparateBits) {
  SKIP_WITHOUT_GPU();
  const auto [n, dim] = GetParam();
  const int64_t mix = (2 + kHc) * kHc, width = kHc * dim;
  std::mt19937 rng(static_cast<uint32_t>(n * 31 + dim));
  const auto streams = RandomStreams(n, dim, rng);
  const auto y = Random(n * dim, rng), y2 = Random(n * dim, rng);
  const auto post = Random(n * kHc, rng);
  const auto comb = Random(n * kHc * kHc, rng, 0.5f);
  const auto w = RandomHcWeights(mix, dim, rng);
  auto hw = RandomHcWeights(kHc, dim, rng);
  hw.scale = {1.3f};  // HcHead's one scale
  std::vector<int32_t> index;
  for (int64_t r = n - 1; r >= 0; r -= 2) index.push_back(static_cast<int32_t>(r));
  const int64_t rows = static_cast<int64_t>(index.size());

  auto d_streams = Upload(streams, DType::kF32);
  auto d_y = Upload(y, DType::kF32), d_y2 = Upload(y2, DType::kF32);
  auto d_post_in = Upload(post, DType::kF32), d_comb_in = Upload(comb, DType::kF32);
  const auto dw = UploadHcWeights(w), dhw = UploadHcWeights(hw);
  auto d_index = UploadRaw(index);

  // outputs: new streams, post, comb, collapsed, normed (bf16), second streams, head rows (f32)
  auto run = [&](bool fused) {
    auto d_out = Poisoned(n * width, DType::kF32), d_out2 = Poisoned(n * width, DType::kF32);
    auto d_post = Poisoned(n * kHc, DType::kF32), d_comb = Poisoned(n * kHc * kHc, DType::kF32);
    auto d_collapsed = Poisoned(n * dim, DType::kF32), d_normed = Poisoned(n * dim, DType::kBF16);
    auto d_head = Poisoned(rows * dim, DType::kF32);
    auto d_ws = PoisonedWorkspace(n, dim);
    kc::HcPostParams pp = PostParams(Ptr<float>(d_streams), Ptr<float>(d_y), Ptr<float>(d_post_in),
                                     Ptr<float>(d_comb_in), n, dim, Ptr<float>(d_out));
    pp.next_fn = fused ? Ptr<float>(dw.fn) : nullptr;
    pp.next_workspace = fused ? Ptr<float>(d_ws) : nullptr;
    kc::HcPreParams pre =
        PreParams(Ptr<float>(d_out), dw, n, dim, Ptr<float>(d_post), Ptr<float>(d_comb));
    pre.collapsed = Ptr<float>(d_collapsed);
    pre.normed = d_normed.data();
    pre.normed_dtype = DType::kBF16;
    pre.workspace = Ptr<float>(d_ws);
    pre.partials_ready = fused;
    kc::HcPostParams pp2 = pp;
    pp2.streams = Ptr<float>(d_out);
    pp2.y = Ptr<float>(d_y2);
    pp2.post = Ptr<float>(d_post);
    pp2.comb = Ptr<float>(d_comb);
    pp2.out = Ptr<float>(d_out2);
    pp2.next_fn = fused ? Ptr<float>(dhw.fn) : nullptr;
    pp2.next_head = true;
    kc::HcHeadParams h = HeadParams(Ptr<float>(d_out2), dhw, rows, dim, d_head.data(), DType::kF32);
    h.rows_index = Ptr<int32_t>(d_index);
    h.workspace = Ptr<float>(d_ws);
    h.partials_ready = fused && kc::HcWorkspacePath(n, dim);  // as the runner sets it
    EXPECT_EQ(kc::HcPost(pp, nullptr), 0);
    EXPECT_EQ(kc::HcPre(pre, nullptr), 0);
    EXPECT_EQ(kc::HcPost(pp2, nullptr), 0);
    EXPECT_EQ(kc::HcHead(h, nullptr), 0);
    EXPECT_EQ(cudaDeviceSynchronize(), 0);
    std::vector<std::vector<float>> o;
    o.push_back(Download(d_out, n * width, DType::kF32));
    o.push_back(Download(d_post, n * kHc, DType::kF32));
    o.push_back(Download(d_comb, n * kHc * kHc, DType::kF32));
    o.push_back(Download(d_collapsed, n * dim, DType::kF32));
    o.push_back(Download(d_normed, n * dim, DType::kBF16));
    o.push_back(Download(d_out2, n * width, DType::kF32));
    o.push_back(Download(d_head, rows * dim, DType::kF32));
    return o;
  };
  const auto separate = run(false);
  const auto fused = run(true);
  const char* names[] = {"streams", "post", "comb", "collapsed", "normed", "streams 2", "head"};
  for (size_t i = 0; i < fused.size(); ++i) {
    for (float x : fused[i]) ASSERT_TRUE(std::isfinite(x)) << names[i] << ", " << n << " x " << dim;
    EXPECT_TRUE(SameBits(fused[i], separate[i])) << names[i] << ", " << n << " x " << dim;
  }
  // The new streams are HcPost's (a few ulp from the CPU's: fused multiply-adds).
  EXPECT_LT(RelError(fused[0], CpuHcPost(streams, y, post, comb, n, dim)), 1e-6);
}

// V4-Flash's dim, hc * dim a multiple of the 128-value slices with a stream per 8 slices (64), or
// not, with slices across two streams (100: 25 float4 a stream, 32 a slice) and a short last one;
// 65 tokens: the options ignored.
INSTANTIATE_TEST_SUITE_P(
    V4MixWorkspace, V4MixHcFusedTest,
    ::testing::Combine(::testing::Values(int64_t{1}, int64_t{3}, int64_t{16}, int64_t{64}),
                       ::testing::Values(int64_t{4096}, int64_t{64}, int64_t{100})));
INSTANTIATE_TEST_SUITE_P(AboveWorkspace, V4MixHcFusedTest,
                         ::testing::Values(std::make_tuple(int64_t{65}, int64_t{96})));

// partials_ready takes the partials from the workspace (a NaN workspace gives NaN mixes) where
// the workspace path applies, and is ignored above it.
TEST(V4MixHcPartialsReady, ReadsWorkspace) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{3}, int64_t{65}}) {
    const int64_t dim = 64, mix = (2 + kHc) * kHc;
    std::mt19937 rng(5);
    auto d_streams = Upload(RandomStreams(n, dim, rng), DType::kF32);
    const auto dw = UploadHcWeights(RandomHcWeights(mix, dim, rng));
    auto d_post = Poisoned(n * kHc, DType::kF32), d_comb = Poisoned(n * kHc * kHc, DType::kF32);
    auto d_ws = PoisonedWorkspace(n, dim);
    kc::HcPreParams p =
        PreParams(Ptr<float>(d_streams), dw, n, dim, Ptr<float>(d_post), Ptr<float>(d_comb));
    p.workspace = Ptr<float>(d_ws);
    p.partials_ready = true;
    ASSERT_CUDA_OK(kc::HcPre(p, nullptr));
    const auto got = Download(d_post, n * kHc, DType::kF32);
    for (float x : got) EXPECT_EQ(std::isfinite(x), n > kc::kHcWorkspaceMaxTokens) << n;
  }
}

// ------------------------------------------------------------------------------------------
struct RouteCase {
  int64_t tokens, experts, top_k;
  kc::RouterScoring scoring;
  bool bias, normalize;
  bool ties = false;  // logits (and bias) on a coarse grid: many exact ties
};

std::ostream& operator<<(std::ostream& os, const RouteCase& c) {
  return os << c.tokens << " tokens, " << c.experts << " experts top " << c.top_k << " scoring "
            << static_cast<int>(c.scoring) << (c.bias ? " bias" : "")
            << (c.normalize ? " normalized" : "") << (c.ties ? " ties" : "");
}

class V4MixRouteTest : public ::testing::TestWithParam<RouteCase> {};

TEST_P(V4MixRouteTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const RouteCase c = GetParam();
  const int64_t n = c.tokens, e = c.experts, k = c.top_k, ld = e + 3;
  std::mt19937 rng(static_cast<uint32_t>(n * 31 + e * 7 + k + static_cast<int>(c.scoring)));
  auto logits = Random(n * ld, rng, 2.0f);
  auto bias = Random(e, rng, 0.3f);
  if (c.ties) {
    for (auto& x : logits) x = std::round(x * 2.0f) / 2.0f;
    for (auto& x : bias) x = std::round(x * 4.0f) / 4.0f;
  }
  std::vector<float> dense(n * e);
  for (int64_t t = 0; t < n; ++t) std::copy_n(logits.begin() + t * ld, e, dense.begin() + t * e);
  const float scaling = 2.5f;
  std::vector<int32_t> want_experts(n * k);
  std::vector<float> want_weights(n * k);
  kcpu::RouterParams ref;
  ref.logits = dense.data();
  ref.num_tokens = n;
  ref.num_experts = e;
  ref.top_k = k;
  ref.scoring = static_cast<kcpu::RouterScoring>(static_cast<int>(c.scoring));
  ref.bias = c.bias ? bias.data() : nullptr;
  ref.normalize = c.normalize;
  ref.scaling = scaling;
  ref.experts = want_experts.data();
  ref.weights = want_weights.data();
  kcpu::Route(ref);

  auto d_logits = Upload(logits, DType::kF32);
  auto d_bias = Upload(bias, DType::kF32);
  auto d_experts = Poisoned(n * k, DType::kF32);
  auto d_weights = Poisoned(n * k, DType::kF32);
  kc::RouteParams p;
  p.logits = Ptr<float>(d_logits);
  p.ld = ld;
  p.num_tokens = n;
  p.num_experts = e;
  p.top_k = k;
  p.scoring = c.scoring;
  p.bias = c.bias ? Ptr<float>(d_bias) : nullptr;
  p.normalize = c.normalize;
  p.scaling = scaling;
  p.experts = Ptr<int32_t>(d_experts);
  p.weights = Ptr<float>(d_weights);
  ASSERT_CUDA_OK(kc::Route(p, nullptr));
  const auto got_experts = DownloadRaw<int32_t>(d_experts, n * k);
  const auto got_weights = Download(d_weights, n * k, DType::kF32);

  // The scores' last bit may differ (device expf/log1pf vs libm, softmax summation order), so
  // a near-tie (scores + bias within 1e-5) may resolve the other way; exact ties may not. Count
  // such tokens; the weights are compared on the tokens whose choice matches.
  std::vector<float> scores(n * e);
  {
    kcpu::RouterParams s = ref;  // the scores: top_k = experts, no normalisation
    std::vector<int32_t> ex(n * e);
    s.top_k = e;
    s.bias = nullptr;
    s.normalize = false;
    s.scaling = 1.0f;
    s.experts = ex.data();
    std::vector<float> wts(n * e);
    s.weights = wts.data();
    kcpu::Route(s);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < e; ++i) scores[t * e + ex[t * e + i]] = wts[t * e + i];
    }
  }
  int64_t near_ties = 0;
  std::vector<float> got_w, want_w;
  for (int64_t t = 0; t < n; ++t) {
    bool same = true;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t g = got_experts[t * k + i], wnt = want_experts[t * k + i];
      if (g == wnt) continue;
      same = false;
      ASSERT_TRUE(g >= 0 && g < e) << c << " token " << t;
      auto biased = [&](int32_t x) { return scores[t * e + x] + (c.bias ? bias[x] : 0.0f); };
      EXPECT_FALSE(c.ties) << c << " token " << t << " slot " << i << ": " << g << " vs " << wnt;
      EXPECT_NEAR(biased(g), biased(wnt), 1e-5) << c << " token " << t << " slot " << i;
    }
    if (!same) {
      ++near_ties;
      continue;
    }
    for (int64_t i = 0; i < k; ++i) {
      got_w.push_back(got_weights[t * k + i]);
      want_w.push_back(want_weights[t * k + i]);
    }
  }
  EXPECT_LE(near_ties, std::max<int64_t>(1, n / 500)) << c;
  EXPECT_LT(RelError(got_w, want_w), 1e-5) << c;
}

INSTANTIATE_TEST_SUITE_P(
    Scorings, V4MixRouteTest,
    ::testing::Values(RouteCase{1, 256, 6, kc::RouterScoring::kSqrtSoftplus, true, true},
                      RouteCase{777, 256, 6, kc::RouterScoring::kSqrtSoftplus, true, true},
                      RouteCase{300, 256, 6, kc::RouterScoring::kSqrtSoftplus, false, false},
                      RouteCase{300, 256, 8, kc::RouterScoring::kSoftmax, false, true},
                      RouteCase{300, 64, 4, kc::RouterScoring::kSoftmax, true, false},
                      RouteCase{300, 256, 8, kc::RouterScoring::kSigmoid, true, true},
                      RouteCase{100, 1000, 16, kc::RouterScoring::kSigmoid, false, true},
                      RouteCase{100, 37, 3, kc::RouterScoring::kSqrtSoftplus, true, true},
                      RouteCase{200, 256, 6, kc::RouterScoring::kSqrtSoftplus, true, true, true},
                      RouteCase{200, 256, 6, kc::RouterScoring::kSqrtSoftplus, false, true, true},
                      RouteCase{200, 256, 8, kc::RouterScoring::kSoftmax, false, true, true},
                      RouteCase{200, 1000, 16, kc::RouterScoring::kSigmoid, true, false, true}));

TEST(V4MixRouteHashTest, MatchesCpuAndMasksUnknownTokens) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 97, e = 256, k = 6, vocab = 50;
  std::mt19937 rng(5);
  auto logits = Random(n * e, rng, 2.0f);
  std::vector<int32_t> tid2eid(vocab * k);
  for (auto& x : tid2eid) x = static_cast<int32_t>(rng() % e);
  std::vector<int32_t> ids(n);
  for (int64_t t = 0; t < n; ++t) ids[t] = static_cast<int32_t>(rng() % vocab);
  ids[3] = -1;
  ids[10] = static_cast<int32_t>(vocab);
  ids[50] = 100000;
  std::vector<int32_t> hash(n * k);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = ids[t] >= 0 && ids[t] < vocab ? ids[t] : 0;
    std::copy_n(tid2eid.begin() + id * k, k, hash.begin() + t * k);
  }
  std::vector<int32_t> want_experts(n * k);
  std::vector<float> want_weights(n * k);
  kcpu::RouterParams ref;
  ref.logits = logits.data();
  ref.num_tokens = n;
  ref.num_experts = e;
  ref.top_k = k;
  ref.scoring = kcpu::RouterScoring::kSqrtSoftplus;
  ref.hash_experts = hash.data();
  ref.normalize = true;
  ref.scaling = 1.5f;
  ref.experts = want_experts.data();
  ref.weights = want_weights.data();
  kcpu::Route(ref);
  for (int64_t t : {3, 10, 50}) {
    std::fill_n(want_experts.begin() + t * k, k, -1);
    std::fill_n(want_weights.begin() + t * k, k, 0.0f);
  }

  auto d_logits = Upload(logits, DType::kF32);
  auto d_tid2eid = UploadRaw(tid2eid);
  auto d_ids = UploadRaw(ids);
  auto d_experts = Poisoned(n * k, DType::kF32);
  auto d_weights = Poisoned(n * k, DType::kF32);
  kc::RouteParams p;
  p.logits = Ptr<float>(d_logits);
  p.ld = e;
  p.num_tokens = n;
  p.num_experts = e;
  p.top_k = k;
  p.scoring = kc::RouterScoring::kSqrtSoftplus;
  p.tid2eid = Ptr<int32_t>(d_tid2eid);
  p.token_ids = Ptr<int32_t>(d_ids);
  p.vocab = vocab;
  p.normalize = true;
  p.scaling = 1.5f;
  p.experts = Ptr<int32_t>(d_experts);
  p.weights = Ptr<float>(d_weights);
  ASSERT_CUDA_OK(kc::Route(p, nullptr));
  EXPECT_EQ(DownloadRaw<int32_t>(d_experts, n * k), want_experts);
  EXPECT_LT(RelError(Download(d_weights, n * k, DType::kF32), want_weights), 1e-5);
}

// ------------------------------------------------------------------------------------------
struct RopeJob {
  int64_t heads, head_dim, rotary_dim;
  bool norm, weight, inverse;
  int32_t offset;
  DType dtype;
  bool in_place;
};

// The CPU reference of one job on rows [n, heads * head_dim] (RmsNorm, then interleaved Rope).
std::vector<float> CpuNormRope(std::vector<float> rows, int64_t n, const RopeJob& j,
                               const std::vector<float>& weight, const std::vector<float>& freq,
                               const std::vector<int32_t>& positions) {
  if (j.norm) {
    kcpu::RmsNormParams r;
    r.x = rows.data();
    r.weight = j.weight ? weight.data() : nullptr;
    r.out = rows.data();
    r.rows = n * j.heads;
    r.dim = j.head_dim;
    r.eps = kNormEps;
    kcpu::RmsNorm(r);
  }
  if (j.rotary_dim > 0) {
    std::vector<int32_t> shifted(n);
    for (int64_t t = 0; t < n; ++t) shifted[t] = positions[t] + j.offset;
    kcpu::RopeParams r;
    r.x = rows.data();
    r.rows = n;
    r.num_heads = j.heads;
    r.head_dim = j.head_dim;
    r.rotary_dim = j.rotary_dim;
    r.rotary_offset = j.head_dim - j.rotary_dim;
    r.positions = shifted.data();
    r.inv_freq = freq.data();
    r.interleaved = true;
    r.inverse = j.inverse;
    kcpu::Rope(r);
  }
  return rows;
}

// interleaved-rotary inverse frequencies 10000^(-2i / rotary_dim), i < rotary_dim / 2.
std::vector<float> InvFreq(int64_t rotary_dim) {
  std::vector<float> f(rotary_dim / 2);
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    f[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
  }
  return f;
}

// Columns [col, col + width) of n rows `stride` apart, packed [n, width].
std::vector<float> PackRows(const std::vector<float>& v, int64_t n, int64_t stride, int64_t col,
                            int64_t width) {
  std::vector<float> out(n * width);
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(v.begin() + t * stride + col, width, out.begin() + t * width);
  }
  return out;
}

// NormRope's params for job j over n tokens (the weight and frequencies passed only where j uses
// them).
kc::NormRopeParams RopeParams(const RopeJob& j, int64_t n, const float* x, int64_t x_stride,
                              void* out, int64_t out_stride, const float* weight,
                              const float* inv_freq, const int32_t* positions) {
  kc::NormRopeParams p;
  p.x = x;
  p.x_stride = x_stride;
  p.out = out;
  p.out_stride = out_stride;
  p.out_dtype = j.dtype;
  p.num_tokens = n;
  p.num_heads = j.heads;
  p.head_dim = j.head_dim;
  p.norm = j.norm;
  p.norm_weight = j.weight ? weight : nullptr;
  p.eps = kNormEps;
  p.rotary_dim = j.rotary_dim;
  p.inv_freq = j.rotary_dim > 0 ? inv_freq : nullptr;
  p.positions = positions;
  p.position_offset = j.offset;
  p.inverse = j.inverse;
  return p;
}

struct RopeCase {
  int64_t tokens, heads, head_dim, rotary_dim;
  bool norm, weight, inverse;
  int32_t offset;
  DType dtype;
  bool in_place;
  RopeJob job() const {
    return {heads, head_dim, rotary_dim, norm, weight, inverse, offset, dtype, in_place};
  }
};

std::ostream& operator<<(std::ostream& os, const RopeCase& c) {
  return os << c.tokens << "x" << c.heads << " d" << c.head_dim << " rotary " << c.rotary_dim
            << (c.norm ? " norm" : "") << (c.weight ? " weight" : "")
            << (c.inverse ? " inverse" : "") << " offset " << c.offset << " " << DTypeName(c.dtype)
            << (c.in_place ? " in place" : "");
}

class V4MixNormRopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(V4MixNormRopeTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const RopeCase c = GetParam();
  const int64_t n = c.tokens, h = c.heads, hd = c.head_dim, rd = c.rotary_dim, width = h * hd;
  const int64_t x_stride = width + 6, out_stride = c.in_place ? x_stride : width + 2;
  std::mt19937 rng(static_cast<uint32_t>(n * 3 + hd + rd));
  const auto x = Random(n * x_stride, rng, 3.0f);
  auto weight = Random(hd, rng, 0.2f);
  for (auto& v : weight) v += 1.0f;
  const auto inv_freq = InvFreq(rd);
  std::vector<int32_t> positions(n);
  for (int64_t t = 0; t < n; ++t) {
    positions[t] = t % 3 == 0 ? static_cast<int32_t>(t) : static_cast<int32_t>(rng() % 200000);
  }
  const auto want =
      CpuNormRope(PackRows(x, n, x_stride, 0, width), n, c.job(), weight, inv_freq, positions);

  auto d_x = Upload(x, DType::kF32);
  auto d_out = Poisoned(n * out_stride, c.dtype);
  auto d_weight = Upload(weight, DType::kF32);
  auto d_freq = Upload(inv_freq, DType::kF32);
  auto d_pos = UploadRaw(positions);
  ASSERT_CUDA_OK(kc::NormRope(
      RopeParams(c.job(), n, Ptr<float>(d_x), x_stride, c.in_place ? d_x.data() : d_out.data(),
                 out_stride, Ptr<float>(d_weight), Ptr<float>(d_freq), Ptr<int32_t>(d_pos)),
      nullptr));
  const auto all = Download(c.in_place ? d_x : d_out, n * out_stride, c.dtype);
  const auto got = PackRows(all, n, out_stride, 0, width);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = width; i < out_stride; ++i) {
      // Columns past the heads are left alone (the input's there when in place, else poison).
      if (c.in_place) {
        ASSERT_EQ(all[t * out_stride + i], x[t * x_stride + i]) << c;
      } else {
        ASSERT_TRUE(std::isnan(all[t * out_stride + i])) << c;
      }
    }
  }
  EXPECT_LT(RelError(got, want), Tolerance(c.dtype)) << c;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, V4MixNormRopeTest,
    ::testing::Values(RopeCase{7, 3, 64, 64, true, true, false, 0, DType::kF32, true},
                      RopeCase{17, 4, 512, 64, true, true, false, 5, DType::kBF16, false},
                      RopeCase{5, 2, 128, 0, true, false, false, 0, DType::kF32, false},
                      RopeCase{9, 3, 96, 32, false, false, true, -3, DType::kF32, true},
                      RopeCase{33, 8, 512, 64, true, false, true, 0, DType::kBF16, false},
                      RopeCase{3, 1, 62, 30, true, true, false, 7, DType::kF32, false},
                      RopeCase{40, 2, 512, 64, false, false, false, 1000, DType::kF32, false}));

// ------------------------------------------------------------------------------------------
// NormRopeBatch: jobs of every kind (the layer's q norm to bf16, the key in place, q heads and
// indexer queries in place, an odd shape, a row longer than the register-held 1024 dims, a job
// with no heads) over one input buffer with a stride, in two launches, against the CPU and
// against one NormRope launch per job (the same bits).
class V4MixNormRopeBatchTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(V4MixNormRopeBatchTest, MatchesCpuAndSingleJobs) {
  SKIP_WITHOUT_GPU();
  const int64_t n = GetParam();
  // Launch 0: the q norm (1 x 1024 -> bf16), the key (1 x 512 in place), a job with no heads.
  // Launch 1: q heads (16 x 512 in place), indexer queries (8 x 128 in place, inverse, no norm),
  // an odd shape to bf16, a row of 1100 dims (streamed, not register-held) to f32.
  const std::vector<std::vector<RopeJob>> launches = {
      {{1, 1024, 0, true, true, false, 0, DType::kBF16, false},
       {1, 512, 64, true, true, false, 0, DType::kF32, true},
       {0, 64, 64, true, false, false, 0, DType::kF32, true}},
      {{16, 512, 64, true, false, false, 0, DType::kF32, true},
       {8, 128, 64, false, false, true, 3, DType::kF32, true},
       {3, 62, 30, true, true, false, -2, DType::kBF16, false},
       {1, 1100, 64, true, true, false, 7, DType::kF32, false}}};
  std::vector<RopeJob> all;
  for (const auto& l : launches) all.insert(all.end(), l.begin(), l.end());
  const size_t num_jobs = all.size();
  std::vector<int64_t> col(num_jobs);
  int64_t x_stride = 0;
  for (size_t i = 0; i < num_jobs; ++i) {
    col[i] = x_stride;
    x_stride += all[i].heads * all[i].head_dim;
  }
  x_stride += 6;  // columns past the jobs, left alone
  std::mt19937 rng(static_cast<uint32_t>(n * 7 + 1));
  const auto x = Random(n * x_stride, rng, 3.0f);
  std::vector<int32_t> positions(n);
  for (int64_t t = 0; t < n; ++t) {
    positions[t] = t % 3 == 0 ? static_cast<int32_t>(t) : static_cast<int32_t>(rng() % 200000);
  }
  std::vector<std::vector<float>> weights(num_jobs), freqs(num_jobs);
  std::vector<cuda::DeviceBuffer> d_weights, d_freqs;
  for (size_t i = 0; i < num_jobs; ++i) {
    const RopeJob& j = all[i];
    weights[i] = Random(j.head_dim, rng, 0.2f);
    for (auto& v : weights[i]) v += 1.0f;
    freqs[i] = InvFreq(j.rotary_dim);
    freqs[i].resize(std::max<int64_t>(j.rotary_dim / 2, 1));
    d_weights.push_back(Upload(weights[i], DType::kF32));
    d_freqs.push_back(Upload(freqs[i], DType::kF32));
  }
  auto d_pos = UploadRaw(positions);
  auto out_stride = [&](size_t i) {
    return all[i].in_place ? x_stride : all[i].heads * all[i].head_dim + 2 + 2 * (i % 2);
  };
  // Two copies of everything: the batched launches and one NormRope per job.
  struct Buffers {
    cuda::DeviceBuffer x;
    std::vector<cuda::DeviceBuffer> out;
  };
  auto make = [&] {
    Buffers b{Upload(x, DType::kF32), {}};
    for (size_t i = 0; i < num_jobs; ++i) {
      b.out.push_back(Poisoned(all[i].in_place ? 1 : n * out_stride(i), all[i].dtype));
    }
    return b;
  };
  Buffers batched = make(), single = make();
  auto params = [&](Buffers& b, size_t i) {
    const RopeJob& j = all[i];
    float* x_col = Ptr<float>(b.x) + col[i];
    return RopeParams(j, n, x_col, x_stride,
                      j.in_place ? static_cast<void*>(x_col) : b.out[i].data(), out_stride(i),
                      Ptr<float>(d_weights[i]), Ptr<float>(d_freqs[i]), Ptr<int32_t>(d_pos));
  };
  size_t first = 0;
  for (const auto& l : launches) {
    std::vector<kc::NormRopeParams> jobs;
    for (size_t i = first; i < first + l.size(); ++i) jobs.push_back(params(batched, i));
    ASSERT_CUDA_OK(kc::NormRopeBatch(jobs.data(), static_cast<int>(jobs.size()), nullptr));
    first += l.size();
  }
  for (size_t i = 0; i < num_jobs; ++i) ASSERT_CUDA_OK(kc::NormRope(params(single, i), nullptr));

  const auto got_x = Download(batched.x, n * x_stride, DType::kF32);
  EXPECT_TRUE(SameBits(got_x, Download(single.x, n * x_stride, DType::kF32))) << n;
  for (size_t i = 0; i < num_jobs; ++i) {
    const RopeJob& j = all[i];
    const int64_t width = j.heads * j.head_dim, os = out_stride(i);
    if (width == 0) continue;
    const auto want =
        CpuNormRope(PackRows(x, n, x_stride, col[i], width), n, j, weights[i], freqs[i], positions);
    std::vector<float> all_out = j.in_place ? got_x : Download(batched.out[i], n * os, j.dtype);
    if (!j.in_place) {
      EXPECT_TRUE(SameBits(all_out, Download(single.out[i], n * os, j.dtype))) << n << " job " << i;
    }
    const auto got = PackRows(all_out, n, os, j.in_place ? col[i] : 0, width);
    if (!j.in_place) {
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t k = width; k < os; ++k) ASSERT_TRUE(std::isnan(all_out[t * os + k])) << i;
      }
    }
    EXPECT_LT(RelError(got, want), Tolerance(j.dtype)) << n << " tokens, job " << i;
  }
  // Columns of no job: untouched.
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = x_stride - 6; k < x_stride; ++k) {
      ASSERT_EQ(got_x[t * x_stride + k], x[t * x_stride + k]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, V4MixNormRopeBatchTest,
                         ::testing::Values(int64_t{1}, int64_t{3}, int64_t{64}, int64_t{300}));

TEST(V4MixNormRopeBatchLimits, RejectsBadBatches) {
  SKIP_WITHOUT_GPU();
  auto d_x = Upload(std::vector<float>(64, 1.0f), DType::kF32);
  kc::NormRopeParams p;
  p.x = Ptr<float>(d_x);
  p.x_stride = 64;
  p.out = d_x.data();
  p.out_stride = 64;
  p.num_tokens = 1;
  p.num_heads = 1;
  p.head_dim = 64;
  p.norm = true;
  const kc::NormRopeParams five[] = {p, p, p, p, p};
  EXPECT_EQ(kc::NormRopeBatch(five, 5, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kc::NormRopeBatch(nullptr, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kc::NormRopeBatch(nullptr, 0, nullptr), 0);
  kc::NormRopeParams odd = p;
  odd.head_dim = 63;
  const kc::NormRopeParams bad[] = {p, odd};
  EXPECT_EQ(kc::NormRopeBatch(bad, 2, nullptr), cudaErrorInvalidValue);
  kc::NormRopeParams rot = p;
  rot.rotary_dim = 16;  // no inv_freq / positions
  const kc::NormRopeParams bad2[] = {rot};
  EXPECT_EQ(kc::NormRopeBatch(bad2, 1, nullptr), cudaErrorInvalidValue);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  // Nothing ran: the buffer is still all ones.
  for (float v : Download(d_x, 64, DType::kF32)) ASSERT_EQ(v, 1.0f);
}

// ------------------------------------------------------------------------------------------
// Timings at V4-Flash's width. Buffers of uninitialised (or FillRandom) device memory.
constexpr int64_t kFlashDim = 4096;
constexpr int kFnCopies = 48;

cuda::DeviceBuffer Alloc(size_t bytes) {
  auto b = cuda::DeviceBuffer::Allocate(bytes);
  EXPECT_TRUE(b.ok());
  return std::move(*b);
}

// V4-Flash's HcPre weights for the timings: kFnCopies copies of a random fn (72 MB, so that fn
// comes from HBM as it does across the layers; FnCopy picks one), random base, unit norm weight.
void MakeFlashHcWeights(DeviceHcWeights* w) {
  const int64_t mix = (2 + kHc) * kHc, width = kHc * kFlashDim;
  w->fn = Alloc(static_cast<size_t>(kFnCopies) * mix * width * 4);
  ASSERT_CUDA_OK(
      kc::FillRandom(w->fn.data(), DType::kF32, kFnCopies * mix * width, 3, 0.01f, nullptr));
  std::mt19937 rng(1);
  w->base = Upload(Random(mix, rng, 0.5f), DType::kF32);
  w->scale = Upload({0.8f, 1.3f, 1.7f}, DType::kF32);
  w->weight = Upload(std::vector<float>(kFlashDim, 1.0f), DType::kF32);
}

const float* FnCopy(const DeviceHcWeights& w, int i) {
  const int64_t fn_floats = (2 + kHc) * kHc * kHc * kFlashDim;
  return Ptr<float>(w.fn) + static_cast<int64_t>(i % kFnCopies) * fn_floats;
}

// µs per rep of body(i) (i < reps) captured once in a CUDA graph on `stream` and replayed.
double TimeGraph(cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop, int reps,
                 const std::function<int(int)>& body) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), 0);
  int err = 0;
  for (int i = 0; i < reps && err == 0; ++i) err = body(i);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), 0);
  EXPECT_EQ(err, 0);
  if (err != 0) return -1.0;
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), 0);
  for (int w = 0; w < 3; ++w) EXPECT_EQ(cudaGraphLaunch(exec, stream), 0);
  const int launches = 20;
  EXPECT_EQ(cudaEventRecord(start, stream), 0);
  for (int w = 0; w < launches; ++w) EXPECT_EQ(cudaGraphLaunch(exec, stream), 0);
  EXPECT_EQ(cudaEventRecord(stop, stream), 0);
  EXPECT_EQ(cudaEventSynchronize(stop), 0);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), 0);
  EXPECT_EQ(cudaGraphExecDestroy(exec), 0);
  EXPECT_EQ(cudaGraphDestroy(graph), 0);
  return 1000.0 * ms / (launches * reps);
}

// ------------------------------------------------------------------------------------------
// Times HcPre (normed bf16 output, the sublayer's input) + HcPost and HcHead at V4-Flash's width,
// with and without a workspace (the decode path up to 64 tokens), cycling through 48 copies of
// fn (72 MB) so that fn comes from HBM as it does across the layers.
TEST(V4MixPerf, HcPrePostTimes) {
  SKIP_WITHOUT_GPU();
  const int64_t dim = kFlashDim, width = kHc * dim, max_tokens = 4096;
  DeviceHcWeights w;
  ASSERT_NO_FATAL_FAILURE(MakeFlashHcWeights(&w));
  auto streams = Alloc(max_tokens * width * 4), out = Alloc(max_tokens * width * 4);
  auto y = Alloc(max_tokens * dim * 4), normed = Alloc(max_tokens * dim * 2);
  auto post = Alloc(max_tokens * kHc * 4), comb = Alloc(max_tokens * kHc * kHc * 4);
  auto ws = Alloc(kc::HcWorkspaceFloats(max_tokens, kHc, dim) * 4);
  ASSERT_CUDA_OK(kc::FillRandom(streams.data(), DType::kF32, max_tokens * width, 1, 1.0f, nullptr));
  ASSERT_CUDA_OK(kc::FillRandom(y.data(), DType::kF32, max_tokens * dim, 2, 1.0f, nullptr));
  cudaEvent_t start, stop;
  ASSERT_CUDA_OK(cudaEventCreate(&start));
  ASSERT_CUDA_OK(cudaEventCreate(&stop));
  for (int64_t tokens : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{4096}}) {
    kc::HcPreParams pre =
        PreParams(Ptr<float>(streams), w, tokens, dim, Ptr<float>(post), Ptr<float>(comb));
    pre.normed = normed.data();
    pre.normed_dtype = DType::kBF16;
    const kc::HcPostParams pp = PostParams(Ptr<float>(streams), Ptr<float>(y), Ptr<float>(post),
                                           Ptr<float>(comb), tokens, dim, Ptr<float>(out));
    kc::HcHeadParams head =
        HeadParams(Ptr<float>(streams), w, tokens, dim, normed.data(), DType::kBF16);
    const int iters = tokens >= 1024 ? 20 : 200;
    // 0: pre, 1: post, 2: both, 3: pre with workspace, 4: both with workspace, 5: head,
    // 6: head with workspace.
    float ms[7] = {};
    for (int which = 0; which < 7; ++which) {
      const bool with_ws = which == 3 || which == 4 || which == 6;
      pre.workspace = with_ws ? Ptr<float>(ws) : nullptr;
      head.workspace = with_ws ? Ptr<float>(ws) : nullptr;
      for (int i = 0; i < iters + 5; ++i) {
        if (i == 5) {
          ASSERT_CUDA_OK(cudaEventRecord(start, nullptr));
        }
        pre.fn = FnCopy(w, i);
        head.fn = FnCopy(w, i);  // its first hc rows
        if (which == 5 || which == 6) {
          ASSERT_CUDA_OK(kc::HcHead(head, nullptr));
          continue;
        }
        if (which != 1) {
          ASSERT_CUDA_OK(kc::HcPre(pre, nullptr));
        }
        if (which == 1 || which == 2 || which == 4) {
          ASSERT_CUDA_OK(kc::HcPost(pp, nullptr));
        }
      }
      ASSERT_CUDA_OK(cudaEventRecord(stop, nullptr));
      ASSERT_CUDA_OK(cudaEventSynchronize(stop));
      ASSERT_CUDA_OK(cudaEventElapsedTime(&ms[which], start, stop));
      ms[which] *= 1000.0f / iters;
    }
    std::printf(
        "[V4MixPerf] hc 4 dim 4096, %5lld tokens: HcPre %8.2f us, HcPost %8.2f us, "
        "HcPre+HcPost %8.2f us\n",
        static_cast<long long>(tokens), ms[0], ms[1], ms[2]);
    std::printf(
        "[V4MixPerf] hc 4 dim 4096, %5lld tokens, workspace: HcPre %8.2f us, HcPre+HcPost %8.2f "
        "us\n",
        static_cast<long long>(tokens), ms[3], ms[4]);
    std::printf(
        "[V4MixPerf] hc 4 dim 4096, %5lld tokens: HcHead %8.2f us, with workspace %8.2f us\n",
        static_cast<long long>(tokens), ms[5], ms[6]);
  }
  // The router at V4-Flash's 256 experts, top 6.
  for (int64_t tokens : {int64_t{1}, int64_t{64}, int64_t{8192}}) {
    auto logits = Alloc(tokens * 256 * 4), ex = Alloc(tokens * 6 * 4), wt = Alloc(tokens * 6 * 4);
    ASSERT_CUDA_OK(kc::FillRandom(logits.data(), DType::kF32, tokens * 256, 4, 3.0f, nullptr));
    kc::RouteParams r;
    r.logits = Ptr<float>(logits);
    r.ld = 256;
    r.num_tokens = tokens;
    r.num_experts = 256;
    r.top_k = 6;
    r.bias = Ptr<float>(logits);  // any 256 floats
    r.experts = Ptr<int32_t>(ex);
    r.weights = Ptr<float>(wt);
    const int iters = 100;
    for (int i = 0; i < iters + 5; ++i) {
      if (i == 5) {
        ASSERT_CUDA_OK(cudaEventRecord(start, nullptr));
      }
      ASSERT_CUDA_OK(kc::Route(r, nullptr));
    }
    ASSERT_CUDA_OK(cudaEventRecord(stop, nullptr));
    ASSERT_CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    ASSERT_CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("[V4MixPerf] Route 256 experts top 6, %5lld tokens: %8.2f us\n",
                static_cast<long long>(tokens), ms * 1000.0f / iters);
  }
  ASSERT_CUDA_OK(cudaEventDestroy(start));
  ASSERT_CUDA_OK(cudaEventDestroy(stop));
}

// Decode-sized launches as decode steps run them: `reps` launches of one op captured in a CUDA
// graph (each a programmatic dependent of the one before), replayed; the time per op. HcPre (bf16
// sublayer input) and HcHead take the workspace path, fn cycling through copies (from HBM as
// across layers). NormRope at V4-Flash's widths: the layer's four jobs (q norm 1 x 1024 to bf16,
// key 1 x 512, q heads 64 x 512, indexer queries 64 x 128) as four NormRope launches and as the
// two NormRopeBatch launches RunLayer makes; at 4,096 tokens also the bandwidth they reach.
TEST(V4MixPerf, DecodeGraphTimes) {
  SKIP_WITHOUT_GPU();
  const int64_t dim = kFlashDim, width = kHc * dim, max_tokens = 4096;
  const int64_t q_rank = 1024, hd = 512, heads = 64, ih = 64, id = 128, rd = 64;
  const int64_t x_cols = q_rank + hd + 64, q_cols = heads * hd + ih * id;
  const int reps = 48;
  DeviceHcWeights w;
  ASSERT_NO_FATAL_FAILURE(MakeFlashHcWeights(&w));
  auto streams = Alloc(64 * width * 4), normed = Alloc(64 * dim * 2);
  auto post = Alloc(64 * kHc * 4), comb = Alloc(64 * kHc * kHc * 4);
  auto ws = Alloc(kc::HcWorkspaceFloats(64, kHc, dim) * 4);
  auto x = Alloc(max_tokens * x_cols * 4), q = Alloc(max_tokens * q_cols * 4);
  auto qr = Alloc(max_tokens * q_rank * 2);
  ASSERT_CUDA_OK(kc::FillRandom(streams.data(), DType::kF32, 64 * width, 1, 1.0f, nullptr));
  ASSERT_CUDA_OK(kc::FillRandom(x.data(), DType::kF32, max_tokens * x_cols, 4, 1.0f, nullptr));
  ASSERT_CUDA_OK(kc::FillRandom(q.data(), DType::kF32, max_tokens * q_cols, 5, 1.0f, nullptr));
  const float* weight = Ptr<float>(w.weight);
  std::vector<float> inv_freq(rd / 2);
  for (int64_t i = 0; i < rd / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / rd);
  auto d_freq = Upload(inv_freq, DType::kF32);
  std::vector<int32_t> pos(max_tokens);
  for (int64_t t = 0; t < max_tokens; ++t) pos[t] = static_cast<int32_t>(1000 + t);
  auto d_pos = UploadRaw(pos);
  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  ASSERT_CUDA_OK(cudaEventCreate(&start));
  ASSERT_CUDA_OK(cudaEventCreate(&stop));
  auto time_graph = [&](const std::function<int(int)>& body) {
    return TimeGraph(stream, start, stop, reps, body);
  };
  for (int64_t tokens : {int64_t{1}, int64_t{16}, int64_t{64}}) {
    kc::HcPreParams pre =
        PreParams(Ptr<float>(streams), w, tokens, dim, Ptr<float>(post), Ptr<float>(comb));
    pre.normed = normed.data();
    pre.normed_dtype = DType::kBF16;
    pre.workspace = Ptr<float>(ws);
    kc::HcHeadParams head =
        HeadParams(Ptr<float>(streams), w, tokens, dim, normed.data(), DType::kBF16);
    head.workspace = Ptr<float>(ws);
    const double pre_us = time_graph([&](int i) {
      pre.fn = FnCopy(w, i);
      return kc::HcPre(pre, stream);
    });
    const double head_us = time_graph([&](int i) {
      head.fn = FnCopy(w, i);
      return kc::HcHead(head, stream);
    });
    std::printf("[V4MixPerf] graph, hc 4 dim 4096, %2lld tokens: HcPre %6.2f us, HcHead %6.2f us\n",
                static_cast<long long>(tokens), pre_us, head_us);
  }
  for (int64_t tokens : {int64_t{1}, int64_t{16}, int64_t{64}, max_tokens}) {
    kc::NormRopeParams qn;
    qn.x = Ptr<float>(x);
    qn.x_stride = x_cols;
    qn.out = qr.data();
    qn.out_stride = q_rank;
    qn.out_dtype = DType::kBF16;
    qn.num_tokens = tokens;
    qn.num_heads = 1;
    qn.head_dim = q_rank;
    qn.norm = true;
    qn.norm_weight = weight;
    kc::NormRopeParams kn;
    kn.x = Ptr<float>(x) + q_rank;
    kn.x_stride = x_cols;
    kn.out = Ptr<float>(x) + q_rank;
    kn.out_stride = x_cols;
    kn.num_tokens = tokens;
    kn.num_heads = 1;
    kn.head_dim = hd;
    kn.norm = true;
    kn.norm_weight = weight;
    kn.rotary_dim = rd;
    kn.inv_freq = Ptr<float>(d_freq);
    kn.positions = Ptr<int32_t>(d_pos);
    kc::NormRopeParams qh = kn;
    qh.x = Ptr<float>(q);
    qh.x_stride = q_cols;
    qh.out = Ptr<float>(q);
    qh.out_stride = q_cols;
    qh.num_heads = heads;
    qh.norm_weight = nullptr;
    kc::NormRopeParams iq = qh;
    iq.x = Ptr<float>(q) + heads * hd;
    iq.out = Ptr<float>(q) + heads * hd;
    iq.num_heads = ih;
    iq.head_dim = id;
    iq.norm = false;
    const kc::NormRopeParams first[] = {qn, kn}, second[] = {qh, iq};
    const double single_us = time_graph([&](int) {
      int e = kc::NormRope(qn, stream);
      if (e == 0) e = kc::NormRope(kn, stream);
      if (e == 0) e = kc::NormRope(qh, stream);
      return e == 0 ? kc::NormRope(iq, stream) : e;
    });
    const double b1_us = time_graph([&](int) { return kc::NormRopeBatch(first, 2, stream); });
    const double b2_us = time_graph([&](int) { return kc::NormRopeBatch(second, 2, stream); });
    // Bytes a layer's four jobs move: f32 in, f32 or bf16 out.
    const double bytes =
        static_cast<double>(tokens) * (q_rank * 6 + hd * 8 + heads * hd * 8 + ih * id * 8);
    std::printf(
        "[V4MixPerf] graph, NormRope %4lld tokens: 4 single launches %8.2f us; batches %8.2f us "
        "(q+kv %7.2f us, q heads+indexer %7.2f us), %6.0f GB/s\n",
        static_cast<long long>(tokens), single_us, b1_us + b2_us, b1_us, b2_us,
        bytes / ((b1_us + b2_us) * 1e3));
  }
  ASSERT_CUDA_OK(cudaEventDestroy(start));
  ASSERT_CUDA_OK(cudaEventDestroy(stop));
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

// HcPost -> HcPre (bf16 sublayer input) and HcPost -> HcHead at V4-Flash's width as decode steps
// run them: pairs captured in a CUDA graph with programmatic dependent launches, fn cycling
// through 48 copies (from HBM); separate (HcPost, then the op's partial and finishing kernels)
// against fused (HcPost writing the partials, then the finishing kernel). µs per pair.
TEST(V4MixPerf, HcPostFusedGraphTimes) {
  SKIP_WITHOUT_GPU();
  const int64_t dim = kFlashDim, width = kHc * dim;
  const int reps = 48;
  DeviceHcWeights w;
  ASSERT_NO_FATAL_FAILURE(MakeFlashHcWeights(&w));
  auto streams = Alloc(64 * width * 4), out = Alloc(64 * width * 4), y = Alloc(64 * dim * 4);
  auto normed = Alloc(64 * dim * 2);
  auto post = Alloc(64 * kHc * 4), comb = Alloc(64 * kHc * kHc * 4);
  auto post2 = Alloc(64 * kHc * 4), comb2 = Alloc(64 * kHc * kHc * 4);
  auto ws = Alloc(kc::HcWorkspaceFloats(64, kHc, dim) * 4);
  ASSERT_CUDA_OK(kc::FillRandom(streams.data(), DType::kF32, 64 * width, 1, 1.0f, nullptr));
  ASSERT_CUDA_OK(kc::FillRandom(y.data(), DType::kF32, 64 * dim, 2, 1.0f, nullptr));
  ASSERT_CUDA_OK(kc::FillRandom(post.data(), DType::kF32, 64 * kHc, 6, 1.0f, nullptr));
  ASSERT_CUDA_OK(kc::FillRandom(comb.data(), DType::kF32, 64 * kHc * kHc, 7, 0.5f, nullptr));
  cudaStream_t stream;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  ASSERT_CUDA_OK(cudaEventCreate(&start));
  ASSERT_CUDA_OK(cudaEventCreate(&stop));
  for (int64_t tokens : {int64_t{1}, int64_t{16}, int64_t{64}}) {
    const kc::HcPostParams pp = PostParams(Ptr<float>(streams), Ptr<float>(y), Ptr<float>(post),
                                           Ptr<float>(comb), tokens, dim, Ptr<float>(out));
    kc::HcPreParams pre =
        PreParams(Ptr<float>(out), w, tokens, dim, Ptr<float>(post2), Ptr<float>(comb2));
    pre.normed = normed.data();
    pre.normed_dtype = DType::kBF16;
    pre.workspace = Ptr<float>(ws);
    kc::HcHeadParams head =
        HeadParams(Ptr<float>(out), w, tokens, dim, normed.data(), DType::kBF16);
    head.workspace = Ptr<float>(ws);
    double us[4];
    for (int which = 0; which < 4; ++which) {
      const bool fused = which % 2 == 1, to_head = which >= 2;
      us[which] = TimeGraph(stream, start, stop, reps, [&](int i) {
        kc::HcPostParams p = pp;
        p.next_fn = fused ? FnCopy(w, i) : nullptr;
        p.next_workspace = fused ? Ptr<float>(ws) : nullptr;
        p.next_head = to_head;
        const int e = kc::HcPost(p, stream);
        if (e != 0) return e;
        if (to_head) {
          head.fn = FnCopy(w, i);
          head.partials_ready = fused;
          return kc::HcHead(head, stream);
        }
        pre.fn = FnCopy(w, i);
        pre.partials_ready = fused;
        return kc::HcPre(pre, stream);
      });
    }
    std::printf(
        "[V4MixPerf] graph, hc 4 dim 4096, %2lld tokens: HcPost->HcPre separate %6.2f us, fused "
        "%6.2f us; HcPost->HcHead separate %6.2f us, fused %6.2f us\n",
        static_cast<long long>(tokens), us[0], us[1], us[2], us[3]);
  }
  ASSERT_CUDA_OK(cudaEventDestroy(start));
  ASSERT_CUDA_OK(cudaEventDestroy(stop));
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace dinfer
