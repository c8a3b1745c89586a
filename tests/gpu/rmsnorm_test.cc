// GPU conformance: CUDA kernels against the CPU reference kernels. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/rmsnorm.h"

namespace dinfer {
namespace {

TEST(CudaConformance, RmsNormMatchesCpuReference) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 37, dim = 4096;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(rows * dim), w(dim), want(rows * dim), got(rows * dim);
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = 1.0f + 0.1f * nd(rng);
  kernels::cpu::RmsNormParams ref;
  ref.x = x.data();
  ref.weight = w.data();
  ref.out = want.data();
  ref.rows = rows;
  ref.dim = dim;
  ref.eps = 1e-5f;
  kernels::cpu::RmsNormReference(ref);

  auto dx = cuda::DeviceBuffer::Allocate(x.size() * 4);
  auto dw = cuda::DeviceBuffer::Allocate(w.size() * 4);
  auto dout = cuda::DeviceBuffer::Allocate(x.size() * 4);
  ASSERT_TRUE(dx.ok() && dw.ok() && dout.ok());
  ASSERT_TRUE(dx->CopyFromHost(x.data(), x.size() * 4).ok());
  ASSERT_TRUE(dw->CopyFromHost(w.data(), w.size() * 4).ok());
  kernels::cuda::RmsNormParams p;
  p.x = static_cast<const float*>(dx->data());
  p.weight = static_cast<const float*>(dw->data());
  p.out = static_cast<float*>(dout->data());
  p.rows = rows;
  p.dim = dim;
  p.eps = 1e-5f;
  ASSERT_EQ(kernels::cuda::RmsNorm(p, nullptr), 0);
  ASSERT_TRUE(cuda::Synchronize().ok());
  ASSERT_TRUE(dout->CopyToHost(got.data(), got.size() * 4).ok());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << "at " << i;
  }
}

}  // namespace
}  // namespace dinfer
